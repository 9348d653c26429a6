//! `kolo run`: start and supervise local workers.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Args;
use kolo_launch::{launch, LaunchConfig};

use super::launch_args::LaunchArgs;

/// Long help for `kolo run --help`.
pub const LONG_ABOUT: &str = "\
Start N local worker processes running PROGRAM [ARGS...] and supervise them \
(like torchrun on a single node).

The launcher hosts the rendezvous store on MASTER_ADDR:MASTER_PORT for the \
lifetime of the job. Each worker's stdout and stderr are forwarded line by \
line, prefixed with `[rank R] `.

Every worker gets these environment variables:
  RANK, LOCAL_RANK               the worker's rank, 0..N
  WORLD_SIZE, LOCAL_WORLD_SIZE   N
  GROUP_RANK, NODE_RANK          0
  MASTER_ADDR, MASTER_PORT       where the rendezvous store listens
  KOLO_AGENT_STORE               1: the launcher hosts the store (rank 0 must not start one)
  KOLO_JOB_ID                    a random hex id shared by all workers of this launch

If a worker exits with a non-zero code or is killed by a signal, the others \
get SIGTERM, then SIGKILL after the grace period, and `kolo run` exits with \
that worker's exit code (128 + signal if it was killed by a signal). The \
worker blamed is the one that failed first, not those that exited in its wake \
after losing a peer: `kolo run` waits 100 ms after the first failure before \
stopping the others, and within that time prefers a worker killed by a \
signal. Once the job has stopped it names that worker, then the other ranks \
that failed on their own (`also failed: ...`). \
SIGINT, SIGTERM and SIGHUP sent to `kolo run` are forwarded to the workers \
the same way; it then exits with 128 + signal (130 for Ctrl-C). Workers never \
outlive the launcher.";

/// Arguments of `kolo run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Number of worker processes to start
    #[arg(
        short = 'n',
        long = "nproc",
        visible_alias = "nproc-per-node",
        value_name = "N",
        value_parser = parse_nproc
    )]
    nproc: usize,

    #[command(flatten)]
    launch: LaunchArgs,

    /// Forward worker output as is, without the `[rank R] ` prefix
    #[arg(long)]
    no_prefix: bool,

    /// Start the job on these hosts over ssh, N workers in all: `a:4,b:4` (the same number on
    /// each; the first host's launcher hosts the store, on --master-addr if given)
    #[arg(long, value_name = "HOST:SLOTS,...", conflicts_with = "hostfile")]
    hosts: Option<String>,

    /// Like --hosts, from a file: one `host`, `host:N` or `host slots=N` per line
    #[arg(long, value_name = "FILE")]
    hostfile: Option<std::path::PathBuf>,

    /// Stop the workers when standard input ends (set on the launchers --hosts starts)
    #[arg(long, hide = true)]
    watch_stdin: bool,

    /// The program every worker runs, and its arguments (put them after `--`)
    #[arg(
        value_name = "PROGRAM",
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<OsString>,
}

fn parse_nproc(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(err) => Err(err.to_string()),
    }
}

impl RunArgs {
    fn into_config(self) -> LaunchConfig {
        let mut command = self.command.into_iter();
        // clap guarantees at least one value (`required = true`).
        let program = command.next().unwrap_or_default();
        let mut cfg = LaunchConfig::new(self.nproc, program, command);
        cfg.prefix_output = !self.no_prefix;
        cfg.stop_on_stdin_eof = self.watch_stdin;
        cfg
    }
}

/// Runs `kolo run` and returns the exit code: the job's, or 1 if it could not
/// be launched.
/// `kolo run --hosts`: one `kolo run --nnodes H --node-rank i` per host, over ssh.
fn execute_hosts(args: &RunArgs) -> ExitCode {
    use kolo_launch::remote;
    let hosts = match (&args.hosts, &args.hostfile) {
        (Some(list), _) => remote::parse_hosts(list),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))
            .and_then(|t| remote::parse_hostfile(&t)),
        (None, None) => Err("no hosts".into()),
    };
    let hosts = match hosts {
        Ok(h) => h,
        Err(e) => {
            eprintln!("kolo run: --hosts/--hostfile: {e}");
            return ExitCode::from(2);
        }
    };
    let per = hosts[0].slots;
    let total: usize = hosts.iter().map(|h| h.slots).sum();
    if hosts.iter().any(|h| h.slots != per) || total != args.nproc {
        eprintln!(
            "kolo run: -n {} must equal the slots of the hosts ({total}), with the same number on \
             every host (got {})",
            args.nproc,
            hosts
                .iter()
                .map(|h| format!("{}:{}", h.host, h.slots))
                .collect::<Vec<_>>()
                .join(",")
        );
        return ExitCode::from(2);
    }
    if args.launch.nnodes != (1, 1) || args.launch.node_rank.is_some() {
        eprintln!(
            "kolo run: --hosts chooses --nnodes and --node-rank itself; give one or the other"
        );
        return ExitCode::from(2);
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("kolo run: cannot find the kolo executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let master = if args.launch.master_addr == kolo_launch::DEFAULT_MASTER_ADDR {
        hosts[0].host.clone()
    } else {
        args.launch.master_addr.clone()
    };
    let port = args.launch.master_port.unwrap_or(29500);
    let secret = match std::env::var("KOLO_JOB_SECRET") {
        Ok(s) if !s.is_empty() => s,
        _ => match kolo::store::JobSecret::generate_hex() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("kolo run: cannot generate the job secret: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let l = &args.launch;
    let node_command = |i: usize| -> Vec<OsString> {
        let mut c: Vec<OsString> = vec![exe.clone().into(), "run".into()];
        for (k, v) in [
            ("-n", per.to_string()),
            ("--nnodes", hosts.len().to_string()),
            ("--node-rank", i.to_string()),
            ("--master-addr", master.clone()),
            ("--master-port", port.to_string()),
            ("--max-restarts", l.max_restarts.to_string()),
            ("--grace-period", l.grace_period.as_secs_f64().to_string()),
            ("--rdzv-timeout", l.rdzv_timeout.as_secs_f64().to_string()),
        ] {
            c.push(k.into());
            c.push(v.into());
        }
        if let Some(b) = l.bind_to {
            c.push("--bind-to".into());
            c.push(b.to_string().into());
        }
        if let Some(iface) = &l.iface {
            c.push("--iface".into());
            c.push(iface.into());
        }
        if args.no_prefix {
            c.push("--no-prefix".into());
        }
        c.push("--watch-stdin".into());
        c.push("--".into());
        c.extend(args.command.iter().cloned());
        c
    };
    match remote::run_hosts(&hosts, &node_command, &secret, l.grace_period) {
        Ok(code) => super::exit_code(code),
        Err(e) => {
            super::report_error("run", &e);
            ExitCode::FAILURE
        }
    }
}

pub fn execute(args: RunArgs) -> ExitCode {
    if args.hosts.is_some() || args.hostfile.is_some() {
        return execute_hosts(&args);
    }
    let launch_args = args.launch.clone();
    let mut cfg = args.into_config();
    if let Err(code) = launch_args.apply("run", &mut cfg) {
        return code;
    }
    match launch(&cfg) {
        Ok(outcome) => super::exit_code(outcome.exit_code()),
        Err(err) => {
            super::report_error("run", &err);
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nproc() {
        assert_eq!(parse_nproc("4"), Ok(4));
        assert!(parse_nproc("0").is_err());
        assert!(parse_nproc("-1").is_err());
    }
}
