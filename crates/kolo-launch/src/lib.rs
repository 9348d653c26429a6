//! kolo's launcher: starts `nproc` local worker processes, hosts the
//! rendezvous store for them, forwards their output and supervises them —
//! torchrun's local mode.
//!
//! ```no_run
//! use kolo_launch::{launch, LaunchConfig};
//!
//! let cfg = LaunchConfig::new(4, "python3", ["train.py"]);
//! let outcome = launch(&cfg)?;
//! std::process::exit(outcome.exit_code());
//! # Ok::<(), kolo_launch::LaunchError>(())
//! ```
//!
//! Every worker gets the environment described in [`mod@env`]. Workers run in
//! their own process groups and (on Linux) die with the launcher, even when
//! it is SIGKILLed. A worker that fails makes the launcher SIGTERM the
//! others, wait [`LaunchConfig::grace_period`], then SIGKILL what is left.
//! The launcher notes when each worker exits, and blames the one that failed
//! first (the root cause, [`LaunchOutcome::first_failure`]) rather than the
//! workers that exited in its wake after losing a peer: it waits 100 ms after
//! the first failure before stopping the others, and within that window
//! prefers a worker killed by a signal to one that exited non-zero. The root
//! cause is reported on stderr once the job has stopped, followed by the
//! other ranks that failed on their own ([`LaunchOutcome::also_failed`]).
//! SIGINT, SIGTERM and SIGHUP sent to the launcher are forwarded to the
//! workers as SIGTERM in the same way.
#![warn(missing_docs)]

#[cfg(not(unix))]
compile_error!("kolo-launch supports Unix only");

pub mod bind;
mod config;
pub mod env;
mod error;
mod error_record;
mod group;
pub mod mpirun;
pub mod net;
pub mod node_args;
mod outcome;
mod output;
mod process;
mod records;
pub mod remote;
pub mod rendezvous;
mod spawn;
mod supervise;
pub mod watch;

use std::time::Duration;

use kolo_core::settings::{Env, ProcessEnv};

pub use bind::CpuBind;
pub use config::{LaunchConfig, DEFAULT_GRACE_PERIOD, DEFAULT_MASTER_ADDR};
pub use error::LaunchError;
pub use outcome::{LaunchOutcome, RankExit, Termination};

use process::SignalFlags;
use spawn::JobEnv;

/// A node whose heartbeat has stood still this long when this node's workers fail is taken as the
/// cause (workers notice a lost peer after their own heartbeat timeout, 6 s by default).
const SILENT: Duration = Duration::from_secs(3);

/// Runs the job described by `cfg` and returns once every worker is gone.
///
/// Hosts the rendezvous store on `master_addr:master_port` (kept alive until
/// all workers exit), starts ranks `0..nproc`, forwards their output, and
/// supervises them as described in the [crate documentation](crate).
/// Failures of workers are reported in the returned [`LaunchOutcome`] (and
/// on stderr); an `Err` means the job could not be run at all, in
/// which case any worker already started has been stopped.
///
/// While it runs, SIGINT, SIGTERM and SIGHUP are caught by the launcher.
/// After it returns they remain caught (and ignored): a program that calls
/// `launch` should exit soon after, with [`LaunchOutcome::exit_code`].
///
/// On Linux the workers' parent-death signal is tied to the calling thread,
/// so call `launch` from a thread that outlives it (such as `main`).
pub fn launch(cfg: &LaunchConfig) -> Result<LaunchOutcome, LaunchError> {
    cfg.validate()?;
    let signals = SignalFlags::register().map_err(|source| LaunchError::Signals { source })?;
    let addr = iface(cfg)?;
    if cfg.stop_on_stdin_eof {
        watch_stdin();
    }
    if cfg.nnodes.1 > 1 {
        return launch_nodes(cfg, &signals, addr);
    }
    let secret = job_secret()?;
    let store = host_store(cfg, &secret)?;
    let base_id = spawn::new_job_id();
    let mut job = JobEnv {
        secret,
        master_port: store.local_addr().port(),
        job_id: base_id.clone(),
        cpus: bind::plan(cfg.cpu_bind, cfg.nproc, &bind::allowed_cpus()),
        restart: 0,
        worker_restart: 0,
        node_rank: 0,
        nnodes: 1,
        addr,
    };
    loop {
        let exited = |job: &JobEnv, pid: u32| store.set(&exited_key(job, pid), b"1");
        let mut outcome = group::run_group(cfg, &job, &signals, &mut || None, &exited)?;
        outcome.restarts = job.restart;
        let failed = outcome.first_failure.is_some() && outcome.interrupted_by.is_none();
        if !failed || job.restart >= cfg.max_restarts {
            return Ok(outcome);
        }
        job.restart += 1;
        // A fresh rendezvous namespace (and shared-memory names) for the new group.
        job.job_id = format!("{base_id}-{}", job.restart);
        supervise::report(format_args!(
            "restarting all {} workers (restart {} of {})",
            cfg.nproc, job.restart, cfg.max_restarts
        ));
    }
}

/// The store key that says worker process `pid` of this node has exited (read by the
/// membership agreement of `kolo::elastic`, whose members register `NODE_RANK:pid`).
fn exited_key(job: &JobEnv, pid: u32) -> String {
    format!("kolo/{}/ft/exited/{}:{pid}", job.job_id, job.node_rank)
}

/// The job secret: the caller's `KOLO_JOB_SECRET` (every node of a job must share it), else a fresh
/// random one.
pub fn job_secret() -> Result<String, LaunchError> {
    match ProcessEnv.lookup(kolo_store::auth::SECRET_ENV) {
        Some(s) if !s.is_empty() => Ok(s),
        _ => kolo_store::JobSecret::generate_hex().map_err(|source| LaunchError::Secret { source }),
    }
}

/// Treats the end of standard input as SIGTERM (a launcher started over ssh by `kolo run --hosts`:
/// when the starting side goes away, this node stops its workers).
fn watch_stdin() {
    let _ = std::thread::Builder::new()
        .name("kolo-stdin".into())
        .spawn(|| {
            let mut sink = [0u8; 256];
            let mut stdin = std::io::stdin();
            while matches!(std::io::Read::read(&mut stdin, &mut sink), Ok(n) if n > 0) {}
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::TERM,
            );
        });
}

/// The address of `--iface`, reported once.
fn iface(cfg: &LaunchConfig) -> Result<Option<std::net::IpAddr>, LaunchError> {
    let Some(name) = &cfg.iface else {
        return Ok(None);
    };
    let ip = net::iface_addr(name).map_err(|reason| LaunchError::Config { reason })?;
    supervise::report(format_args!("workers use interface {name} ({ip})"));
    Ok(Some(ip))
}

/// One node of a job on several: joins the other launchers through the store (hosted by node 0),
/// runs this node's workers in each round, and restarts with the nodes that are left after a
/// failure while restarts remain.
fn launch_nodes(
    cfg: &LaunchConfig,
    signals: &SignalFlags,
    addr: Option<std::net::IpAddr>,
) -> Result<LaunchOutcome, LaunchError> {
    let secret = match ProcessEnv.lookup(kolo_store::auth::SECRET_ENV) {
        Some(s) if !s.is_empty() => s,
        _ => {
            supervise::report(format_args!(
                "KOLO_JOB_SECRET is not set: this job's connections prove an empty secret, so \
                 anyone who can reach its ports can join; set the same secret on every node"
            ));
            String::new()
        }
    };
    let port = cfg.master_port.unwrap_or(0);
    let hosting = cfg.node_rank == Some(0);
    let _server = if hosting {
        Some(host_store(cfg, &secret)?)
    } else {
        None
    };
    let endpoint = cfg.endpoint(port);
    let store: std::sync::Arc<dyn kolo_store::Store> =
        std::sync::Arc::new(watch::connect(&endpoint, cfg.rdzv_timeout, &secret)?);
    let store_at = format!("{endpoint} (node 0)");
    let job_id = rendezvous::job_id(&*store, &spawn::new_job_id())?;
    let host = net::hostname();
    if addr.is_none() {
        match net::route_to(&cfg.master_addr, port) {
            Some((ip, name)) => supervise::report(format_args!(
                "workers use {ip}{} (the route to {}; --iface chooses another)",
                name.map_or(String::new(), |n| format!(" on {n}")),
                cfg.master_addr
            )),
            None => supervise::report(format_args!(
                "cannot tell which address reaches {}; workers will choose (--iface sets it)",
                cfg.master_addr
            )),
        }
    }
    let cpus = bind::plan(cfg.cpu_bind, cfg.nproc, &bind::allowed_cpus());
    let mut restart = 0;
    loop {
        let joining = rendezvous::Joining {
            hint: cfg.node_rank,
            nproc: cfg.nproc,
            nnodes: cfg.nnodes,
            // After a failure the nodes that are left come back at once.
            timeout: if restart == 0 {
                cfg.rdzv_timeout
            } else {
                cfg.rdzv_timeout.min(Duration::from_secs(60))
            },
            host: &host,
        };
        let round = rendezvous::join(&*store, restart, &job_id, &joining)?;
        let first = round.node_rank * cfg.nproc;
        supervise::report(format_args!(
            "node {} of {} ({host}): ranks {}..{} of {}{}",
            round.node_rank,
            round.nnodes,
            first,
            first + cfg.nproc - 1,
            round.nnodes * cfg.nproc,
            if restart > 0 {
                format!(", restart {restart}")
            } else {
                String::new()
            }
        ));
        let job = JobEnv {
            secret: secret.clone(),
            master_port: port,
            job_id: if restart == 0 {
                job_id.clone()
            } else {
                format!("{job_id}-{restart}")
            },
            cpus: cpus.clone(),
            restart,
            worker_restart: 0,
            node_rank: round.node_rank,
            nnodes: round.nnodes,
            addr,
        };
        let watch = watch::Watch::start(store.clone(), &round, &store_at);
        let exited = |job: &JobEnv, pid: u32| {
            let _ = store.set(&exited_key(job, pid), b"1");
        };
        // Fault-tolerant workers go on without a lost node: its loss is reported, not acted on
        // (but without the store they cannot go on).
        let mut told = false;
        let mut external = || match watch.reason() {
            Some(why) if cfg.restart_workers && watch.store_lost().is_none() => {
                if !std::mem::replace(&mut told, true) {
                    supervise::report(format_args!(
                        "{why}; this node's fault-tolerant workers go on without it"
                    ));
                }
                None
            }
            other => other,
        };
        let mut outcome = group::run_group(cfg, &job, signals, &mut external, &exited)?;
        outcome.restarts = restart;
        // A node silent for a while when this node's workers failed is what they lost.
        let silent = watch.silent_nodes(SILENT);
        if let Some(lost) = watch.finish() {
            // Cut off from the store (and node 0 with it): nobody can be told, and there is no
            // round to restart in.
            if outcome.remote_failure.as_deref() != Some(lost.as_str()) {
                supervise::report(format_args!("{lost}"));
            }
            outcome.remote_failure = Some(lost);
            return Ok(outcome);
        }
        let local = outcome.root_cause().map(|r| match silent.first() {
            Some(&(node, still)) => watch::lost_node(&round, node, still),
            None => {
                let mut what = format!(
                    "node {} ({host}): rank {} (pid {}) failed: {}",
                    round.node_rank, r.rank, r.pid, r.termination
                );
                if let Some(e) = &outcome.root_cause_error {
                    what.push_str(&format!(" ({e})"));
                }
                what
            }
        });
        // Workers that exit with an error usually do so because a peer died (maybe on another
        // node): give a node whose worker was killed the chance to record the root cause first.
        if outcome
            .root_cause()
            .is_some_and(|r| matches!(r.termination, Termination::Exited(_)))
        {
            std::thread::sleep(Duration::from_millis(300));
        }
        let first_failure = match &local {
            Some(what) => rendezvous::fail(&*store, restart, what),
            // Fault-tolerant workers that finished here finished the job, whatever another
            // node's fate.
            None if cfg.restart_workers && outcome.success() => None,
            None => rendezvous::failure(&*store, restart).ok().flatten(),
        };
        match first_failure {
            None => {
                let _ = rendezvous::done(&*store, restart, round.node_rank);
                if hosting {
                    // Keep the store up until every node's workers are done with it (a node lost
                    // to fault-tolerant workers never says so: not long).
                    let wait = if cfg.restart_workers {
                        cfg.rdzv_timeout.min(Duration::from_secs(10))
                    } else {
                        cfg.rdzv_timeout
                    };
                    let stop = || signals.pending();
                    let waited = rendezvous::wait_all_done(
                        &*store,
                        restart,
                        round.nnodes,
                        wait,
                        watch::HEARTBEAT_TIMEOUT,
                        &stop,
                    );
                    if let rendezvous::Waited::Silent(nodes) = waited {
                        let names: Vec<String> =
                            nodes.iter().map(|&n| round.node_name(n)).collect();
                        supervise::report(format_args!(
                            "this node's workers finished, but {} stopped responding before \
                             saying so: closing the store without waiting for it",
                            names.join(", ")
                        ));
                    }
                }
                return Ok(outcome);
            }
            Some(first) => {
                supervise::report(format_args!("the job failed first at {first}"));
                outcome.remote_failure = Some(first);
                if outcome.interrupted_by.is_some() || restart >= cfg.max_restarts {
                    return Ok(outcome);
                }
                restart += 1;
                supervise::report(format_args!(
                    "restarting the workers of this node (restart {restart} of {})",
                    cfg.max_restarts
                ));
            }
        }
    }
}

/// Binds the rendezvous store the workers will connect to. It answers PyTorch's `TCPStore`
/// clients too (in their own key space), so that torch.distributed's `env://` rendezvous works in
/// workers told the launcher hosts the store (`TORCHELASTIC_USE_AGENT_STORE`).
fn host_store(cfg: &LaunchConfig, secret: &str) -> Result<kolo_store::TcpStoreServer, LaunchError> {
    let port = cfg.master_port.unwrap_or(0);
    let secret = kolo_store::JobSecret::new(secret.as_bytes());
    kolo_store::TcpStoreServer::bind_with_secret_and_torch((cfg.master_addr.as_str(), port), secret)
        .map_err(|source| LaunchError::Store {
            addr: cfg.endpoint(port),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    #[test]
    fn zero_workers() {
        let cfg = LaunchConfig::new(0, "true", Vec::<OsString>::new());
        assert!(matches!(launch(&cfg), Err(LaunchError::NoWorkers)));
    }

    #[test]
    fn missing_program_is_a_spawn_error() {
        let cfg = LaunchConfig::new(2, "/nonexistent/kolo-launch-test", Vec::<OsString>::new());
        match launch(&cfg) {
            Err(LaunchError::Spawn {
                rank,
                program,
                source,
            }) => {
                assert_eq!(rank, 0);
                assert_eq!(program, OsString::from("/nonexistent/kolo-launch-test"));
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("expected a spawn error, got {other:?}"),
        }
    }

    #[test]
    fn port_in_use_names_the_address() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("binds a free port");
        let port = taken.local_addr().expect("local addr").port();
        let mut cfg = LaunchConfig::new(1, "true", Vec::<OsString>::new());
        cfg.master_port = Some(port);
        match launch(&cfg) {
            Err(err @ LaunchError::Store { .. }) => {
                assert!(
                    err.to_string().contains(&format!("127.0.0.1:{port}")),
                    "{err}"
                );
            }
            other => panic!("expected a store error, got {other:?}"),
        }
    }

    /// Rank 1 fails until the group has been restarted `$1` times; every worker prints its job id
    /// and restart count.
    fn flaky(needed: usize) -> LaunchConfig {
        let script = format!(
            "echo \"$KOLO_JOB_ID $KOLO_RESTART_COUNT\"; \
             if [ \"$RANK\" = 1 ] && [ \"$KOLO_RESTART_COUNT\" -lt {needed} ]; then exit 3; fi"
        );
        let mut cfg = LaunchConfig::new(2, "sh", ["-c", script.as_str()]);
        cfg.prefix_output = false;
        cfg
    }

    #[test]
    fn max_restarts_restarts_the_group_until_it_succeeds() {
        let mut cfg = flaky(2);
        cfg.max_restarts = 2;
        let outcome = launch(&cfg).expect("launch");
        assert!(outcome.success(), "{outcome:?}");
        assert_eq!(outcome.restarts, 2);
    }

    #[test]
    fn restarts_run_out() {
        let mut cfg = flaky(5);
        cfg.max_restarts = 1;
        let outcome = launch(&cfg).expect("launch");
        assert_eq!(outcome.exit_code(), 3);
        assert_eq!(outcome.first_failure, Some(1));
        assert_eq!(outcome.restarts, 1);
        // No restarts by default.
        let outcome = launch(&flaky(1)).expect("launch");
        assert_eq!((outcome.exit_code(), outcome.restarts), (3, 0));
    }

    #[test]
    fn outcome_lists_every_rank() {
        let cfg = LaunchConfig::new(3, "sh", ["-c", "exit $((RANK == 1 ? 5 : 0))"]);
        let outcome = launch(&cfg).expect("launches");
        assert_eq!(outcome.ranks.len(), 3);
        assert!(outcome
            .ranks
            .iter()
            .enumerate()
            .all(|(i, r)| r.rank == i && r.pid > 0));
        assert_eq!(outcome.ranks[1].termination, Termination::Exited(5));
        assert_eq!(outcome.first_failure, Some(1));
        assert!(outcome.also_failed.is_empty());
        assert_eq!(outcome.interrupted_by, None);
        assert_eq!(outcome.exit_code(), 5);
    }

    #[test]
    fn workers_failing_in_the_wake_of_a_killed_one_are_not_blamed() {
        // Rank 1 is SIGKILLed; ranks 0 and 2 exit 1 once it is gone (reaped).
        let dir = std::env::temp_dir().join(format!(
            "kolo-launch-test-{}-{}",
            std::process::id(),
            spawn::new_job_id()
        ));
        std::fs::create_dir(&dir).expect("creates a temp dir");
        let script = r#"
            pidfile="$DIR/pid"
            if [ "$RANK" = 1 ]; then
                echo $$ > "$pidfile.tmp" && mv "$pidfile.tmp" "$pidfile"
                sleep 0.2
                kill -9 $$
            fi
            trap '' TERM
            while [ ! -s "$pidfile" ]; do sleep 0.005; done
            while kill -0 "$(cat "$pidfile")" 2>/dev/null; do sleep 0.001; done
            exit 1
        "#;
        let mut cfg = LaunchConfig::new(3, "sh", ["-c", script]);
        cfg.extra_env.push(("DIR".into(), dir.clone().into()));
        let outcome = launch(&cfg).expect("launches");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(outcome.first_failure, Some(1), "{outcome:?}");
        assert_eq!(outcome.also_failed, [0, 2], "{outcome:?}");
        assert_eq!(outcome.exit_code(), 137);
    }

    #[test]
    fn extra_env_reaches_workers() {
        let mut cfg = LaunchConfig::new(1, "sh", ["-c", r#"[ "$KOLO_TEST_VAR" = yes ]"#]);
        assert_eq!(launch(&cfg).expect("launches").exit_code(), 1);
        cfg.extra_env.push(("KOLO_TEST_VAR".into(), "yes".into()));
        assert_eq!(launch(&cfg).expect("launches").exit_code(), 0);
    }
}
