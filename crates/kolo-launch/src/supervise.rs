//! Watching workers: the first failure (or a signal to the launcher) stops
//! them all — SIGTERM, the grace period, then SIGKILL.

use std::io::{self, Write};
use std::thread;
use std::time::{Duration, Instant};

use crate::process::{signal_group, signal_name, SignalFlags};
use crate::spawn::Worker;
use crate::{LaunchError, Termination};

/// How often workers are polled.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Writes `kolo run: <message>` to stderr as one line.
pub(crate) fn report(message: std::fmt::Arguments<'_>) {
    let line = format!("kolo run: {message}\n");
    let mut err = io::stderr().lock();
    // Nothing sensible to do if stderr is gone.
    let _ = err.write_all(line.as_bytes());
    let _ = err.flush();
}

/// Why the launcher stopped the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopCause {
    Failure(usize),
    Signal(i32),
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Running,
    /// SIGTERM sent; SIGKILL at `deadline`.
    Terminating {
        deadline: Instant,
    },
    /// SIGKILL sent; waiting for the kernel to finish them.
    Killing,
}

/// Waits for all workers, stopping them all on the first failure or on a
/// signal to the launcher. On return every worker has been reaped.
pub(crate) fn supervise(
    workers: &mut [Worker],
    grace: Duration,
    signals: &SignalFlags,
) -> Result<Option<StopCause>, LaunchError> {
    let mut cause = None;
    let mut phase = Phase::Running;
    loop {
        let newly_failed = poll(workers)?;

        if let Some(sig) = signals.take() {
            match phase {
                Phase::Running => {
                    let name = signal_name(sig).unwrap_or("a signal");
                    report(format_args!("received {name}, stopping workers"));
                    cause = Some(StopCause::Signal(sig));
                    phase = terminate(workers, grace);
                }
                // A second signal while stopping: don't wait any longer.
                Phase::Terminating { .. } => phase = kill(workers, None),
                Phase::Killing => {}
            }
        }

        if let (Phase::Running, Some(idx)) = (phase, newly_failed) {
            let w = &workers[idx];
            if let Some(t) = w.exit {
                report(format_args!("rank {} (pid {}) failed: {t}", w.rank, w.pid));
            }
            cause = Some(StopCause::Failure(w.rank));
            phase = terminate(workers, grace);
        }

        if workers.iter().all(|w| w.exit.is_some()) {
            return Ok(cause);
        }

        if let Phase::Terminating { deadline } = phase {
            if Instant::now() >= deadline {
                phase = kill(workers, Some(grace));
            }
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// Reaps workers that have exited; returns the index of the first one (in
/// rank order) that failed in this round.
fn poll(workers: &mut [Worker]) -> Result<Option<usize>, LaunchError> {
    let mut failed = None;
    for (idx, w) in workers.iter_mut().enumerate() {
        if w.exit.is_some() {
            continue;
        }
        let status = w.child.try_wait().map_err(|source| LaunchError::Wait {
            rank: w.rank,
            pid: w.pid,
            source,
        })?;
        if let Some(status) = status {
            let t = Termination::from(status);
            w.exit = Some(t);
            if !t.success() && failed.is_none() {
                failed = Some(idx);
            }
        }
    }
    Ok(failed)
}

/// Sends SIGTERM to every live worker's process group.
fn terminate(workers: &[Worker], grace: Duration) -> Phase {
    signal_live(workers, libc::SIGTERM);
    Phase::Terminating {
        deadline: Instant::now() + grace,
    }
}

/// Sends SIGKILL to every live worker's process group. `grace` is `Some` when
/// the grace period ran out (and the workers are named).
fn kill(workers: &[Worker], grace: Option<Duration>) -> Phase {
    if let Some(grace) = grace {
        for w in workers.iter().filter(|w| w.exit.is_none()) {
            report(format_args!(
                "rank {} (pid {}) did not exit within {:.1}s of SIGTERM; sending SIGKILL",
                w.rank,
                w.pid,
                grace.as_secs_f64()
            ));
        }
    }
    signal_live(workers, libc::SIGKILL);
    Phase::Killing
}

fn signal_live(workers: &[Worker], sig: libc::c_int) {
    for w in workers.iter().filter(|w| w.exit.is_none()) {
        if let Err(err) = signal_group(w.pid, sig) {
            report(format_args!(
                "cannot signal rank {} (pid {}): {err}",
                w.rank, w.pid
            ));
        }
    }
}

/// Stops all workers (SIGTERM, grace period, SIGKILL) and reaps them, after
/// the launch itself failed.
pub(crate) fn stop_all(workers: &mut [Worker], grace: Duration) {
    signal_live(workers, libc::SIGTERM);
    let deadline = Instant::now() + grace;
    let mut killed = false;
    loop {
        for w in workers.iter_mut().filter(|w| w.exit.is_none()) {
            match w.child.try_wait() {
                Ok(Some(status)) => w.exit = Some(Termination::from(status)),
                Ok(None) => {}
                // Cannot be waited for: nothing more we can do than SIGKILL.
                Err(_) => {
                    let _ = signal_group(w.pid, libc::SIGKILL);
                    w.exit = Some(Termination::Signaled(libc::SIGKILL));
                }
            }
        }
        if workers.iter().all(|w| w.exit.is_some()) {
            break;
        }
        if !killed && Instant::now() >= deadline {
            signal_live(workers, libc::SIGKILL);
            killed = true;
        }
        thread::sleep(POLL_INTERVAL);
    }
    kill_stragglers(workers);
}

/// SIGKILLs whatever is left in the workers' process groups (processes the
/// workers started and left behind), so nothing outlives the launch.
pub(crate) fn kill_stragglers(workers: &[Worker]) {
    for w in workers {
        let _ = signal_group(w.pid, libc::SIGKILL);
    }
}
