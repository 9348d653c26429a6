//! Launch options shared by `kolo run`, `kolo train` and `kolo bench`.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use kolo_launch::{CpuBind, LaunchConfig, DEFAULT_MASTER_ADDR};

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

    /// CPU binding: `cores` gives each worker its own block of the CPUs the launcher may use (when
    /// there are 2 or more workers and no more workers than CPUs; like mpirun's default), `none`
    /// leaves placement to the scheduler. The worker's CPUs are in KOLO_CPUS [default: KOLO_BIND,
    /// else cores]
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
    /// `KOLO_BIND` is reported as `kolo COMMAND: ...` and returned as the exit code.
    pub fn apply(&self, command: &str, cfg: &mut LaunchConfig) -> Result<(), ExitCode> {
        cfg.master_addr = self.master_addr.clone();
        cfg.master_port = self.master_port;
        cfg.max_restarts = self.max_restarts;
        cfg.grace_period = self.grace_period;
        cfg.nnodes = self.nnodes;
        cfg.node_rank = self.node_rank;
        cfg.iface = self.iface.clone();
        cfg.rdzv_timeout = self.rdzv_timeout;
        match (self.bind_to, std::env::var("KOLO_BIND")) {
            (Some(bind), _) => cfg.cpu_bind = bind,
            (None, Ok(v)) => match v.parse() {
                Ok(bind) => cfg.cpu_bind = bind,
                Err(e) => {
                    eprintln!("kolo {command}: KOLO_BIND: {e}");
                    return Err(ExitCode::FAILURE);
                }
            },
            (None, Err(_)) => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
