//! One group of workers on this node: started, supervised (a failed one stops them all, or with
//! fault-tolerant workers is restarted alone), reaped, and its outcome.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::output::{self, Target};
use crate::process::SignalFlags;
use crate::spawn::{self, JobEnv, Worker};
use crate::supervise::{self, StopCause};
use crate::{
    error_record, records, LaunchConfig, LaunchError, LaunchOutcome, RankExit, Termination,
};

/// How long the launcher waits, after all workers have exited, for their
/// output to be forwarded completely.
const OUTPUT_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Starts one group of workers and supervises it until every worker is gone; `external` is polled
/// for a reason to stop them that comes from elsewhere (another node).
pub(crate) fn run_group(
    cfg: &LaunchConfig,
    job: &JobEnv,
    signals: &SignalFlags,
    external: &mut dyn FnMut() -> Option<String>,
    exited: &dyn Fn(&JobEnv, u32),
) -> Result<LaunchOutcome, LaunchError> {
    let started_at = std::time::SystemTime::now();
    let (done_tx, done_rx) = mpsc::channel();
    let (exit_tx, exit_rx) = mpsc::channel();
    let mut workers: Vec<Worker> = Vec::with_capacity(cfg.nproc);
    let mut streams = 0usize;
    for rank in 0..cfg.nproc {
        let started = spawn::spawn_worker(cfg, job, rank).and_then(|mut worker| {
            supervise::watch(&mut worker, &exit_tx);
            let attached = attach_output(&mut worker, cfg.prefix_output, &done_tx);
            workers.push(worker);
            attached
        });
        match started {
            Ok(n) => streams += n,
            Err(err) => {
                supervise::stop_all(&mut workers, cfg.grace_period);
                error_record::remove_all(job);
                return Err(err);
            }
        }
    }
    let mut restarted = 0usize;
    let mut respawn = |old: &Worker| -> supervise::Replace {
        if !cfg.restart_workers {
            return supervise::Replace::Stop;
        }
        // Its peers need not wait for its heartbeat to stop (kolo::elastic).
        exited(job, old.pid);
        if restarted >= cfg.max_restarts {
            supervise::report(format_args!(
                "worker rank {} failed ({}); no restarts left (--max-restarts {}), the others go on \
                 without it",
                old.rank,
                old.exit.map_or_else(|| "exited".to_string(), |t| t.to_string()),
                cfg.max_restarts
            ));
            return supervise::Replace::LeftOut;
        }
        restarted += 1;
        let local = old.rank - job.rank(cfg, 0);
        supervise::report(format_args!(
            "worker rank {} failed ({}); restarting it alone (restart {} of {}), the others go on",
            old.rank,
            old.exit
                .map_or_else(|| "exited".to_string(), |t| t.to_string()),
            restarted,
            cfg.max_restarts
        ));
        let mut again = job.clone();
        again.worker_restart = restarted;
        match spawn::spawn_worker(cfg, &again, local).and_then(|mut worker| {
            supervise::watch(&mut worker, &exit_tx);
            streams += attach_output(&mut worker, cfg.prefix_output, &done_tx)?;
            Ok(worker)
        }) {
            Ok(w) => supervise::Replace::Restarted(w),
            Err(e) => supervise::Replace::Failed(e),
        }
    };

    let stopped = match supervise::supervise(
        &mut workers,
        cfg.grace_period,
        signals,
        &exit_rx,
        external,
        &mut respawn,
    ) {
        Ok(stopped) => stopped,
        Err(err) => {
            supervise::stop_all(&mut workers, Duration::ZERO);
            error_record::remove_all(job);
            return Err(err);
        }
    };
    drop(done_tx);
    drop(exit_tx);
    supervise::kill_stragglers(&workers);
    // Workers remove their shared-memory segment's name once all have mapped it; one that died before
    // that leaves the name behind. Every worker is gone now, so anything left of this job is garbage.
    kolo_transport::shm::segment::remove_with_prefix(&kolo_transport::shm::name_prefix(
        &job.job_id,
    ));
    if matches!(stopped.cause, Some(StopCause::Failure(_))) {
        records::report(&job.job_id, workers.len(), started_at);
    }

    // Let the output threads finish; a stream still held open by a process
    // that escaped the workers' process groups must not hang the launcher.
    let deadline = Instant::now() + OUTPUT_DRAIN_TIMEOUT;
    for _ in 0..streams {
        let left = deadline.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            break;
        }
    }

    let left_out = workers
        .iter()
        .filter(|w| w.left_out)
        .map(|w| w.rank)
        .collect();
    let ranks = workers
        .iter()
        .map(|w| RankExit {
            rank: w.rank,
            pid: w.pid,
            // Every worker has been reaped when `supervise` returns.
            termination: w.exit.unwrap_or(Termination::Signaled(libc::SIGKILL)),
        })
        .collect();
    let (first_failure, interrupted_by, remote_failure) = match stopped.cause {
        Some(StopCause::Failure(rank)) => (Some(rank), None, None),
        Some(StopCause::Signal(sig)) => (None, Some(sig), None),
        Some(StopCause::Remote(why)) => (None, None, Some(why)),
        None => (None, None, None),
    };
    let root_cause_error = first_failure
        .and_then(|rank| workers.iter().find(|w| w.rank == rank))
        .and_then(error_record::message_of);
    error_record::remove_all(job);
    Ok(LaunchOutcome {
        ranks,
        first_failure,
        root_cause_error,
        also_failed: stopped.also_failed,
        interrupted_by,
        restarts: 0,
        remote_failure,
        left_out,
    })
}

/// Starts the threads forwarding `worker`'s stdout and stderr; returns how
/// many were started.
fn attach_output(
    worker: &mut Worker,
    prefix: bool,
    done: &mpsc::Sender<()>,
) -> Result<usize, LaunchError> {
    let rank = worker.rank;
    let mut started = 0;
    let thread_error = |source| LaunchError::OutputThread { rank, source };
    if let Some(stdout) = worker.child.stdout.take() {
        output::spawn_forwarder(
            rank,
            stdout,
            Target::Stdout,
            output::prefix(rank, prefix),
            done.clone(),
        )
        .map_err(thread_error)?;
        started += 1;
    }
    if let Some(stderr) = worker.child.stderr.take() {
        output::spawn_forwarder(
            rank,
            stderr,
            Target::Stderr,
            output::prefix(rank, prefix),
            done.clone(),
        )
        .map_err(thread_error)?;
        started += 1;
    }
    Ok(started)
}

#[cfg(test)]
mod tests {
    use crate::{launch, LaunchConfig};

    /// A fresh file path of this test process.
    fn log_file(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kolo-launch-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir.join("starts")
    }

    /// Every start of a worker appends `RANK restart` to `log`; rank 1 fails (exit 3) on its
    /// starts before worker restart `ok_from`, rank 0 outlives rank 1's first failure.
    fn fault_tolerant(log: &std::path::Path, ok_from: usize) -> LaunchConfig {
        let script = format!(
            "echo \"$RANK ${{KOLO_WORKER_RESTART:-0}}\" >> {log}; \
             if [ \"$RANK\" = 1 ] && [ \"${{KOLO_WORKER_RESTART:-0}}\" -lt {ok_from} ]; then exit 3; fi; \
             if [ \"$RANK\" = 0 ]; then sleep 1; fi",
            log = log.display()
        );
        let mut cfg = LaunchConfig::new(2, "sh", ["-c", script.as_str()]);
        cfg.prefix_output = false;
        cfg.restart_workers = true;
        cfg
    }

    fn starts(log: &std::path::Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_failed_worker_is_restarted_alone() {
        let log = log_file("restarted");
        let mut cfg = fault_tolerant(&log, 2);
        cfg.max_restarts = 3;
        let outcome = launch(&cfg).expect("launch");
        assert!(outcome.success(), "{outcome:?}");
        assert_eq!(outcome.restarts, 0, "the group was not restarted");
        // Rank 0 started once; rank 1 three times (restarts 1 and 2 after failing).
        assert_eq!(starts(&log), ["0 0", "1 0", "1 1", "1 2"]);
    }

    #[test]
    fn with_no_restarts_left_the_others_go_on_without_it() {
        let log = log_file("left_out");
        let mut cfg = fault_tolerant(&log, 99);
        cfg.max_restarts = 1;
        let outcome = launch(&cfg).expect("launch");
        assert_eq!(outcome.left_out, vec![1]);
        assert!(outcome.success(), "rank 0 finished: {outcome:?}");
        assert_eq!(starts(&log), ["0 0", "1 0", "1 1"]);
    }

    #[test]
    fn without_restart_workers_a_failure_stops_the_group() {
        let log = log_file("stops");
        let mut cfg = fault_tolerant(&log, 2);
        cfg.restart_workers = false;
        cfg.max_restarts = 0;
        let outcome = launch(&cfg).expect("launch");
        assert_eq!(outcome.exit_code(), 3);
        assert_eq!(outcome.first_failure, Some(1));
    }
}
