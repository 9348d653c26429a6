//! What to launch: [`LaunchConfig`].

use std::ffi::OsString;
use std::time::Duration;

use crate::{CpuBind, LaunchError};

/// Default address the rendezvous store binds to and workers connect to.
pub const DEFAULT_MASTER_ADDR: &str = "127.0.0.1";

/// Default time workers get between SIGTERM and SIGKILL.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(5);

/// Everything [`launch`](crate::launch) needs to start and supervise a job.
///
/// Build it with [`LaunchConfig::new`] and adjust the public fields.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LaunchConfig {
    /// Number of worker processes to start (ranks `0..nproc`); must be at least 1.
    pub nproc: usize,
    /// Program every worker runs (looked up in `PATH` like a shell would).
    pub program: OsString,
    /// Arguments passed to every worker.
    pub args: Vec<OsString>,
    /// Address the rendezvous store binds to, exported to workers as `MASTER_ADDR`.
    pub master_addr: String,
    /// Port of the rendezvous store; `None` lets the operating system pick a free one.
    pub master_port: Option<u16>,
    /// How long workers get to exit after SIGTERM before they are SIGKILLed.
    pub grace_period: Duration,
    /// Prefix every output line with `[rank R] `.
    pub prefix_output: bool,
    /// Additional environment variables for every worker, applied last (they
    /// override the variables the launcher sets).
    pub extra_env: Vec<(OsString, OsString)>,
    /// A rank whose stdout and stderr go straight to the launcher's own (not piped, not
    /// prefixed), so that a progress bar it draws on a terminal works (`kolo train` uses rank 0).
    pub direct_output_rank: Option<usize>,
    /// How workers are bound to CPUs (default: each its own block of cores, see [`CpuBind`]).
    pub cpu_bind: CpuBind,
    /// How many times the whole worker group is restarted after a worker fails (torchrun's
    /// `--max-restarts`; default 0). Not after the launcher is interrupted by a signal.
    pub max_restarts: usize,
    /// Fault-tolerant workers (`--restart-workers`): a worker that fails is restarted alone (with
    /// the same rank, job id and store; `KOLO_WORKER_RESTART` counts its restarts) while the others
    /// go on, up to `max_restarts` restarts in all; the workers of a fault-tolerant world
    /// (`kolo::elastic`) take it back at their next step boundary.
    pub restart_workers: bool,
    /// Minimum and maximum number of nodes (launchers) of the job; `(1, 1)` for one host. With more,
    /// the launcher given `node_rank` 0 hosts the store on `master_addr:master_port` and every
    /// launcher joins through it; `min < max` makes the job elastic (see [`crate::rendezvous`]).
    pub nnodes: (usize, usize),
    /// This node's rank (required with a fixed number of nodes above 1; a hint when elastic).
    pub node_rank: Option<usize>,
    /// Network interface whose address workers listen on and advertise (`--iface`).
    pub iface: Option<String>,
    /// How long the launchers wait for each other when a job starts.
    pub rdzv_timeout: Duration,
    /// Stop the workers (as on SIGTERM) when standard input ends: set on the launchers that
    /// `kolo run --hosts` starts over ssh.
    pub stop_on_stdin_eof: bool,
}

impl LaunchConfig {
    /// A configuration running `program args...` in `nproc` workers, with the
    /// defaults: master address [`DEFAULT_MASTER_ADDR`], a free port, a grace
    /// period of [`DEFAULT_GRACE_PERIOD`], prefixed output and no extra
    /// environment.
    pub fn new<P, I, A>(nproc: usize, program: P, args: I) -> Self
    where
        P: Into<OsString>,
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        Self {
            nproc,
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            master_addr: DEFAULT_MASTER_ADDR.to_owned(),
            master_port: None,
            grace_period: DEFAULT_GRACE_PERIOD,
            prefix_output: true,
            direct_output_rank: None,
            extra_env: Vec::new(),
            cpu_bind: CpuBind::default(),
            max_restarts: 0,
            restart_workers: false,
            nnodes: (1, 1),
            node_rank: None,
            iface: None,
            rdzv_timeout: Duration::from_secs(300),
            stop_on_stdin_eof: false,
        }
    }

    /// Checks the configuration before anything is started.
    pub(crate) fn validate(&self) -> Result<(), LaunchError> {
        if self.nproc == 0 {
            return Err(LaunchError::NoWorkers);
        }
        let (min, max) = self.nnodes;
        let bad = |reason: String| Err(LaunchError::Config { reason });
        if min == 0 || min > max {
            return bad(format!("--nnodes {min}:{max}: need 1 <= MIN <= MAX"));
        }
        if max > 1 {
            if self.master_port.is_none() {
                return bad(
                    "a job on several nodes needs --master-port (the same on every node)".into(),
                );
            }
            match self.node_rank {
                Some(r) if min == max && r >= max => {
                    return bad(format!("--node-rank {r} with --nnodes {max}: must be below {max}"))
                }
                None if min == max => {
                    return bad(format!("--nnodes {max} needs --node-rank (0 on the node whose address is --master-addr)"))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// `master_addr:port`, with IPv6 literals in brackets.
    pub(crate) fn endpoint(&self, port: u16) -> String {
        if self.master_addr.contains(':') && !self.master_addr.starts_with('[') {
            format!("[{}]:{port}", self.master_addr)
        } else {
            format!("{}:{port}", self.master_addr)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let cfg = LaunchConfig::new(2, "prog", ["a", "b"]);
        assert_eq!(cfg.nproc, 2);
        assert_eq!(cfg.program, OsString::from("prog"));
        assert_eq!(cfg.args, vec![OsString::from("a"), OsString::from("b")]);
        assert_eq!(cfg.master_addr, "127.0.0.1");
        assert_eq!(cfg.master_port, None);
        assert_eq!(cfg.grace_period, Duration::from_secs(5));
        assert!(cfg.prefix_output);
        assert!(cfg.extra_env.is_empty());
    }

    #[test]
    fn zero_workers_is_an_error() {
        let cfg = LaunchConfig::new(0, "true", Vec::<OsString>::new());
        assert!(matches!(cfg.validate(), Err(LaunchError::NoWorkers)));
    }

    #[test]
    fn endpoint_brackets_ipv6() {
        let mut cfg = LaunchConfig::new(1, "true", Vec::<OsString>::new());
        assert_eq!(cfg.endpoint(29500), "127.0.0.1:29500");
        cfg.master_addr = "::1".to_owned();
        assert_eq!(cfg.endpoint(29500), "[::1]:29500");
        cfg.master_addr = "[::1]".to_owned();
        assert_eq!(cfg.endpoint(1), "[::1]:1");
    }
}
