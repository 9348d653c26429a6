//! `kolo run`: start and supervise local workers.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Args;
use kolo_launch::{launch, LaunchConfig};

use super::error::CliError;
use super::launch_args::{LaunchArgs, LaunchBackend};

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
  TORCHELASTIC_ERROR_FILE        where the worker records its first error

If a worker exits with a non-zero code or is killed by a signal, the others \
get SIGTERM, then SIGKILL after the grace period, and `kolo run` exits with \
that worker's exit code (128 + signal if it was killed by a signal). The \
worker blamed is the one that failed first, not those that exited in its wake \
after losing a peer: `kolo run` waits 100 ms after the first failure before \
stopping the others, and within that time prefers a worker killed by a \
signal. Once the job has stopped it names that worker, then the other ranks \
that failed on their own (`also failed: ...`). Each worker gets an error file \
(TORCHELASTIC_ERROR_FILE, as under torchrun) where kolo writes its first \
failure; `kolo run` shows the blamed worker's (`rank R's error: ...`), and \
blames instead a rank that recorded its error before the blamed one failed. \
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
        cfg
    }
}

/// Runs `kolo run` and returns the exit code: the job's, or 1 if it could not
/// be launched.
pub fn execute(args: RunArgs) -> ExitCode {
    super::finish("run", run(args))
}

fn run(args: RunArgs) -> Result<ExitCode, CliError> {
    if args.launch.on_hosts() {
        return super::launch_args::execute_hosts("run", args.nproc, &args.launch);
    }
    if args.launch.backend == LaunchBackend::Mpi {
        let mut command = args.command.into_iter();
        let program = command.next().unwrap_or_default();
        let rest: Vec<OsString> = command.collect();
        return super::launch_args::launch_mpi(args.nproc, &args.launch, program, &rest, &[]);
    }
    let launch_args = args.launch.clone();
    let mut cfg = args.into_config();
    launch_args.apply(&mut cfg)?;
    let outcome = launch(&cfg)?;
    Ok(super::exit_code(outcome.exit_code()))
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
