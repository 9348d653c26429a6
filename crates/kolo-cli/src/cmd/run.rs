//! `kolo run`: start and supervise local workers.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use kolo_launch::{launch, LaunchConfig, DEFAULT_MASTER_ADDR};

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

    /// Address the rendezvous store binds to, passed to workers as MASTER_ADDR
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_MASTER_ADDR)]
    master_addr: String,

    /// Port of the rendezvous store, passed to workers as MASTER_PORT [default: a free port]
    #[arg(long, value_name = "PORT")]
    master_port: Option<u16>,

    /// Seconds workers get between SIGTERM and SIGKILL when the job is stopped
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = parse_seconds)]
    grace_period: Duration,

    /// Forward worker output as is, without the `[rank R] ` prefix
    #[arg(long)]
    no_prefix: bool,

    /// CPU binding: `cores` gives each worker its own block of the CPUs kolo run may use (when
    /// there are 2 or more workers and no more workers than CPUs; like mpirun's default), `none`
    /// leaves placement to the scheduler. The worker's CPUs are in KOLO_CPUS [default: KOLO_BIND,
    /// else cores]
    #[arg(long, value_name = "POLICY")]
    bind_to: Option<kolo_launch::CpuBind>,

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

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.parse().map_err(|err| format!("{err}"))?;
    Duration::try_from_secs_f64(secs)
        .map_err(|_| "must be a non-negative number of seconds".to_owned())
}

impl RunArgs {
    fn into_config(self) -> LaunchConfig {
        let mut command = self.command.into_iter();
        // clap guarantees at least one value (`required = true`).
        let program = command.next().unwrap_or_default();
        let mut cfg = LaunchConfig::new(self.nproc, program, command);
        cfg.master_addr = self.master_addr;
        cfg.master_port = self.master_port;
        cfg.grace_period = self.grace_period;
        cfg.prefix_output = !self.no_prefix;
        if let Some(bind) = self.bind_to {
            cfg.cpu_bind = bind;
        }
        cfg
    }
}

/// Runs `kolo run` and returns the exit code: the job's, or 1 if it could not
/// be launched.
pub fn execute(args: RunArgs) -> ExitCode {
    let mut cfg = args.into_config();
    if let Err(code) = super::bind_from_env("run", &mut cfg) {
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
    fn seconds() {
        assert_eq!(parse_seconds("1"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_seconds("0.5"), Ok(Duration::from_millis(500)));
        assert!(parse_seconds("-1").is_err());
        assert!(parse_seconds("nan").is_err());
        assert!(parse_seconds("x").is_err());
    }

    #[test]
    fn nproc() {
        assert_eq!(parse_nproc("4"), Ok(4));
        assert!(parse_nproc("0").is_err());
        assert!(parse_nproc("-1").is_err());
    }
}
