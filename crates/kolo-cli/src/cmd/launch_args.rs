//! Launch options shared by `kolo run`, `kolo train` and `kolo bench`.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use clap::ValueEnum;
use kolo_core::settings::{Env, ProcessEnv};
use kolo_launch::{mpirun, CpuBind, LaunchConfig, DEFAULT_MASTER_ADDR};

use super::error::CliError;

/// Who starts the workers and runs their collectives (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum LaunchBackend {
    /// kolo's launcher and transports (shared memory, TCP)
    #[default]
    Kolo,
    /// `mpirun -n N` starts the workers, which run on the installed MPI library
    Mpi,
}

/// How workers are started and supervised (everything but their number).
#[derive(Debug, Clone, Args)]
pub struct LaunchArgs {
    /// Address of the rendezvous store, passed to workers as MASTER_ADDR
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_MASTER_ADDR)]
    pub master_addr: String,

    /// Port of the rendezvous store, passed to workers as MASTER_PORT [default: a free port]
    #[arg(long, value_name = "PORT")]
    pub master_port: Option<u16>,

    /// Restart the whole worker group up to K times after a worker fails (workers see
    /// KOLO_RESTART_COUNT; `kolo train` then resumes from its newest checkpoint)
    #[arg(long, value_name = "K", default_value = "0")]
    pub max_restarts: usize,

    /// Restart only a worker that fails, with the same rank, while the others go on (up to
    /// --max-restarts restarts in all); for workers that survive a lost peer (`kolo::elastic`,
    /// `kolo train --fault-tolerant`)
    #[arg(long)]
    pub restart_workers: bool,

    /// CPU binding: `cores` gives each worker its own block of the CPUs the launcher may use (when
    /// there are 2 or more workers and no more workers than CPUs; like mpirun's default), `none`
    /// leaves placement to the scheduler. The worker's CPUs are in KOLO_CPUS. With several workers,
    /// RAYON_NUM_THREADS and OMP_NUM_THREADS (where not set already) size each worker's compute
    /// threads to its CPUs (unbound: an equal share, at least 1) [default: KOLO_BIND, else cores]
    #[arg(long, value_name = "POLICY")]
    pub bind_to: Option<CpuBind>,

    /// Seconds workers get between SIGTERM and SIGKILL when the job is stopped
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = parse_seconds)]
    pub grace_period: Duration,

    /// Number of nodes: N, or MIN:MAX for an elastic job that goes on with at least MIN nodes after
    /// losing some (run `kolo run` on every node; the one with --node-rank 0 hosts the store on
    /// --master-addr:--master-port)
    #[arg(long, value_name = "N|MIN:MAX", default_value = "1", value_parser = parse_nnodes)]
    pub nnodes: (usize, usize),

    /// This node's rank, 0..N (ranks of its workers: NODE_RANK * nproc-per-node + LOCAL_RANK)
    #[arg(long, value_name = "R")]
    pub node_rank: Option<usize>,

    /// Network interface whose address workers listen on and tell their peers (e.g. eth1)
    #[arg(long, value_name = "NAME")]
    pub iface: Option<String>,

    /// Seconds the nodes of a job wait for each other at start
    #[arg(long, value_name = "SECS", default_value = "300", value_parser = parse_seconds)]
    pub rdzv_timeout: Duration,

    /// Start the job on these hosts over ssh (KOLO_SSH replaces `ssh -o BatchMode=yes`), -n
    /// workers in all: `a:4,b:4` (the same number on each; the first host's launcher hosts the
    /// store, on --master-addr if given)
    #[arg(long, value_name = "HOST:SLOTS,...", conflicts_with = "hostfile")]
    pub hosts: Option<String>,

    /// Like --hosts, from a file: one `host`, `host:N` or `host slots=N` per line
    #[arg(long, value_name = "FILE")]
    pub hostfile: Option<std::path::PathBuf>,

    /// Who starts the workers and runs their collectives: `kolo`, or `mpi` (`mpirun -n N` starts
    /// them and they run on the installed MPI library; needs kolo built with `--features mpi`;
    /// KOLO_MPIRUN names the launcher, KOLO_MPIRUN_ARGS adds options to it)
    #[arg(long, value_name = "kolo|mpi", value_enum, default_value = "kolo")]
    pub backend: LaunchBackend,

    /// Stop the workers when standard input ends (set on the launchers --hosts starts)
    #[arg(long, hide = true)]
    pub watch_stdin: bool,
}

/// Parses `N` or `MIN:MAX`.
pub fn parse_nnodes(s: &str) -> Result<(usize, usize), String> {
    let num = |t: &str| {
        t.trim()
            .parse::<usize>()
            .map_err(|e| format!("{t:?}: {e}"))
            .and_then(|n| {
                if n == 0 {
                    Err("must be at least 1".to_owned())
                } else {
                    Ok(n)
                }
            })
    };
    let (min, max) = match s.split_once(':') {
        Some((a, b)) => (num(a)?, num(b)?),
        None => {
            let n = num(s)?;
            (n, n)
        }
    };
    if min > max {
        return Err(format!("MIN {min} is above MAX {max}"));
    }
    Ok((min, max))
}

/// Parses a non-negative number of seconds.
pub fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.parse().map_err(|err| format!("{err}"))?;
    Duration::try_from_secs_f64(secs)
        .map_err(|_| "must be a non-negative number of seconds".to_owned())
}

impl LaunchArgs {
    /// Applies these options (and `KOLO_BIND` where `--bind-to` is absent) to `cfg`; a bad
    /// `KOLO_BIND` is an error.
    pub fn apply(&self, cfg: &mut LaunchConfig) -> Result<(), CliError> {
        cfg.master_addr = self.master_addr.clone();
        cfg.master_port = self.master_port;
        cfg.max_restarts = self.max_restarts;
        cfg.restart_workers = self.restart_workers;
        cfg.grace_period = self.grace_period;
        cfg.nnodes = self.nnodes;
        cfg.node_rank = self.node_rank;
        cfg.iface = self.iface.clone();
        cfg.rdzv_timeout = self.rdzv_timeout;
        cfg.stop_on_stdin_eof = self.watch_stdin;
        if let Some(bind) = cpu_bind(self.bind_to, &ProcessEnv)? {
            cfg.cpu_bind = bind;
        }
        Ok(())
    }
}

impl LaunchArgs {
    /// Whether the job is to be started on other hosts (`--hosts`/`--hostfile`).
    pub fn on_hosts(&self) -> bool {
        self.hosts.is_some() || self.hostfile.is_some()
    }
}

/// `kolo COMMAND --hosts ...`: runs `kolo COMMAND --nnodes H --node-rank i ...` (with this command's
/// other arguments) on every host, over ssh; returns the job's exit code.
pub fn execute_hosts(command: &str, nproc: usize, l: &LaunchArgs) -> Result<ExitCode, CliError> {
    use kolo_launch::{node_args, remote};
    let hosts = remote::job_hosts(
        l.hosts.as_deref(),
        l.hostfile.as_deref(),
        nproc,
        l.nnodes,
        l.node_rank,
    )?;
    let per = hosts[0].slots;
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Failed(format!("cannot find the kolo executable: {e}")))?;
    let master = if l.master_addr == DEFAULT_MASTER_ADDR {
        hosts[0].host.clone()
    } else {
        l.master_addr.clone()
    };
    let port = l.master_port.unwrap_or(29500);
    let secret = kolo_launch::job_secret()?;
    let (rest, dashdash) = node_args::forwarded_args(std::env::args_os());
    let node = node_args::NodeCommand {
        exe,
        command: command.to_owned(),
        per_node: per,
        nodes: hosts.len(),
        master_addr: master,
        master_port: port,
        rest,
        dashdash,
    };
    let node_command = |i: usize| node.for_node(i);
    let code = remote::run_hosts(&hosts, &node_command, &secret, l.grace_period)?;
    Ok(super::exit_code(code))
}

/// `--backend mpi`: starts the job through mpirun (which places and supervises the workers) and
/// returns its exit code. `defaults` are set for the workers unless this process's environment
/// already has them.
pub fn launch_mpi(
    nproc: usize,
    launch: &LaunchArgs,
    program: OsString,
    args: &[OsString],
    defaults: &[(&str, String)],
) -> Result<ExitCode, CliError> {
    if !cfg!(feature = "mpi") {
        return Err(CliError::Usage(
            "--backend mpi: this kolo was built without the MPI backend; build it with `cargo \
             build --release --features mpi` (needs an MPI library, e.g. Debian's libopenmpi-dev \
             openmpi-bin libclang-dev)"
                .into(),
        ));
    }
    if launch.restart_workers {
        return Err(CliError::Usage(
            "--backend mpi: --restart-workers does not apply: an MPI world cannot change its \
             members (fault-tolerant workers connect kolo's own transports; use --backend kolo)"
                .into(),
        ));
    }
    if let Some(what) = mpirun::unsupported_option(
        launch.on_hosts(),
        launch.nnodes,
        launch.node_rank,
        launch.max_restarts,
    ) {
        return Err(CliError::Usage(format!(
            "--backend mpi: mpirun places and supervises the workers, so {what} does not apply"
        )));
    }
    match mpirun::run(nproc, program, args, defaults).map_err(CliError::Mpirun)? {
        Some(code) => Ok(super::exit_code(code)),
        None => Ok(ExitCode::FAILURE),
    }
}

/// The CPU binding: `--bind-to`, else `KOLO_BIND` from `env`, else `None` (the launcher's default).
fn cpu_bind(flag: Option<CpuBind>, env: &impl Env) -> Result<Option<CpuBind>, CliError> {
    match (flag, env.lookup("KOLO_BIND")) {
        (Some(bind), _) => Ok(Some(bind)),
        (None, Some(v)) => v
            .parse()
            .map(Some)
            .map_err(|e| CliError::Failed(format!("KOLO_BIND: {e}"))),
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_core::settings::MapEnv;

    #[test]
    fn cpu_binding_from_the_flag_then_kolo_bind() {
        let env: MapEnv = [("KOLO_BIND", "none")].into_iter().collect();
        let none = MapEnv::default();
        let bad: MapEnv = [("KOLO_BIND", "sockets")].into_iter().collect();
        assert!(matches!(
            cpu_bind(Some(CpuBind::Cores), &env),
            Ok(Some(CpuBind::Cores))
        ));
        assert!(matches!(cpu_bind(None, &env), Ok(Some(CpuBind::None))));
        assert!(matches!(cpu_bind(None, &none), Ok(None)));
        assert!(
            matches!(cpu_bind(None, &bad), Err(CliError::Failed(m)) if m.starts_with("KOLO_BIND: "))
        );
    }

    #[test]
    fn nnodes() {
        assert_eq!(parse_nnodes("2"), Ok((2, 2)));
        assert_eq!(parse_nnodes("1:3"), Ok((1, 3)));
        assert!(parse_nnodes("0").is_err());
        assert!(parse_nnodes("3:2").is_err());
        assert!(parse_nnodes("a:2").is_err());
    }

    #[test]
    fn seconds() {
        assert_eq!(parse_seconds("1"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_seconds("0.5"), Ok(Duration::from_millis(500)));
        assert!(parse_seconds("-1").is_err());
        assert!(parse_seconds("nan").is_err());
        assert!(parse_seconds("x").is_err());
    }
}
