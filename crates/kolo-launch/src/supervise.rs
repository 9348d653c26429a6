//! Watching workers: the first failure (or a signal to the launcher) stops
//! them all — SIGTERM, the grace period, then SIGKILL.
//!
//! Every worker has a watcher thread blocked in `waitid(.., WNOWAIT)` that
//! notes the moment the worker exits and tells the supervisor, which then
//! reaps it. These exit times name the right culprit: when one worker dies,
//! the others typically notice the lost peer and exit with an error within
//! milliseconds, so whichever the supervisor happens to look at first is not
//! necessarily the one that failed first.

use std::io::{self, Write};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::process::{waitid, Pid, WaitId, WaitIdOptions};

use crate::error_record;
use crate::process::{signal_group, signal_name, SignalFlags};
use crate::spawn::Worker;
use crate::{LaunchError, Termination};

/// How often the supervisor checks for signals to the launcher and polls
/// workers that have no watcher thread.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// How long after the first failure the supervisor waits for other failures
/// before it names the root cause and stops the job. Within this window a
/// worker killed by a signal is blamed rather than one that exited non-zero
/// on its own: workers that lose a peer exit right after the one that died,
/// and their exits may be noticed in either order.
pub(crate) const FAILURE_WINDOW: Duration = Duration::from_millis(100);

/// Stack size of the watcher threads, which only wait and send one message.
const WATCHER_STACK_SIZE: usize = 64 * 1024;

/// Writes `kolo run: <message>` to stderr as one line.
pub(crate) fn report(message: std::fmt::Arguments<'_>) {
    let line = format!("kolo run: {message}\n");
    let mut err = io::stderr().lock();
    // Nothing sensible to do if stderr is gone.
    let _ = err.write_all(line.as_bytes());
    let _ = err.flush();
}

/// Why the launcher stopped the workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StopCause {
    /// This rank failed first (the root cause).
    Failure(usize),
    /// The launcher received this signal.
    Signal(i32),
    /// Another node's launcher stopped the job (its reason).
    Remote(String),
}

/// How a supervised job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stopped {
    /// Why the launcher stopped the workers; `None` if they all exited 0.
    pub(crate) cause: Option<StopCause>,
    /// With [`StopCause::Failure`]: the other ranks that failed on their own
    /// (not those the launcher terminated), in rank order.
    pub(crate) also_failed: Vec<usize>,
}

/// A worker's exit, as seen by its watcher thread.
#[derive(Debug)]
pub(crate) struct ExitNotice {
    rank: usize,
    /// When the watcher saw the worker exit.
    at: Instant,
    /// `false` if waiting failed; the supervisor then polls the worker.
    waited: bool,
}

/// Starts a thread that waits for `worker` to exit without reaping it, and
/// then sends an [`ExitNotice`] with the time. If the thread cannot be
/// started, the supervisor polls the worker instead.
pub(crate) fn watch(worker: &mut Worker, notices: &Sender<ExitNotice>) {
    let rank = worker.rank;
    let pid = worker.pid as libc::id_t;
    let notices = notices.clone();
    let started = thread::Builder::new()
        .name(format!("kolo-wait-{rank}"))
        .stack_size(WATCHER_STACK_SIZE)
        .spawn(move || {
            let waited = wait_for_exit(pid).is_ok();
            // The supervisor is gone if this fails; nothing left to do.
            let _ = notices.send(ExitNotice {
                rank,
                at: Instant::now(),
                waited,
            });
        });
    worker.watched = started.is_ok();
}

/// Blocks until the child `pid` has exited, leaving it a zombie (so its pid
/// and process group id stay taken) for the supervisor to reap.
fn wait_for_exit(pid: libc::id_t) -> io::Result<()> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    loop {
        // WNOWAIT leaves the child waitable.
        match waitid(
            WaitId::Pid(pid),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
        ) {
            Ok(_) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
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

/// Waits for all workers, stopping them all when one fails (after
/// [`FAILURE_WINDOW`], to name the right root cause) or when the launcher
/// gets a signal. Reports the root cause and the other failures on stderr
/// once all are gone. On return every worker has been reaped.
///
/// `notices` receives the [`ExitNotice`]s of the workers' watcher threads;
/// the caller keeps a sender alive while this runs.
pub(crate) fn supervise(
    workers: &mut [Worker],
    grace: Duration,
    signals: &SignalFlags,
    notices: &Receiver<ExitNotice>,
    external: &mut dyn FnMut() -> Option<String>,
    respawn: &mut dyn FnMut(&Worker) -> Replace,
) -> Result<Stopped, LaunchError> {
    let mut cause = None;
    let mut phase = Phase::Running;
    // When the launcher started stopping the workers.
    let mut stopping_since = None;
    loop {
        while let Ok(notice) = notices.try_recv() {
            on_notice(workers, &notice)?;
        }
        poll_unwatched(workers)?;

        if signals.take_usr1() {
            report(format_args!(
                "forwarding SIGUSR1: each worker writes its flight record"
            ));
            for w in workers.iter().filter(|w| w.exit.is_none()) {
                let _ = crate::process::signal_process(w.pid, libc::SIGUSR1);
            }
        }

        if let Some(sig) = signals.take() {
            match phase {
                Phase::Running => {
                    let name = signal_name(sig).unwrap_or("a signal");
                    report(format_args!("received {name}, stopping workers"));
                    // A worker that failed before the signal came stays the cause.
                    cause = Some(match root_cause(&failures(workers)) {
                        Some(rank) => StopCause::Failure(rank),
                        None => StopCause::Signal(sig),
                    });
                    stopping_since = Some(Instant::now());
                    phase = terminate(workers, grace);
                }
                // A second signal while stopping: don't wait any longer.
                Phase::Terminating { .. } => phase = kill(workers, None),
                Phase::Killing => {}
            }
        }

        if let Phase::Running = phase {
            if failures(workers).is_empty() {
                if let Some(reason) = external() {
                    report(format_args!("stopping workers: {reason}"));
                    cause = Some(StopCause::Remote(reason));
                    stopping_since = Some(Instant::now());
                    phase = terminate(workers, grace);
                }
            }
        }

        let mut wait = POLL_INTERVAL;
        if let Phase::Running = phase {
            // Fault-tolerant workers: a failed one is replaced while the others go on.
            for w in workers.iter_mut() {
                if !w.left_out && w.exit.is_some_and(|t| !t.success()) {
                    match respawn(w) {
                        Replace::Restarted(new) => *w = new,
                        Replace::Failed(e) => return Err(e),
                        Replace::LeftOut => w.left_out = true,
                        Replace::Stop => {}
                    }
                }
            }
            let failed = failures(workers);
            if let Some(first) = failed.iter().map(|f| f.at).min() {
                let decide_at = first + FAILURE_WINDOW;
                let now = Instant::now();
                if now >= decide_at || all_exited(workers) {
                    cause = root_cause(&failed).map(StopCause::Failure);
                    ask_for_records(workers);
                    stopping_since = Some(Instant::now());
                    phase = terminate(workers, grace);
                } else {
                    wait = wait.min(decide_at - now);
                }
            }
        }

        if all_exited(workers) {
            let also_failed = match cause {
                Some(StopCause::Failure(first_by_exit)) => {
                    let root = error_record::first_to_fail(workers, first_by_exit);
                    cause = Some(StopCause::Failure(root));
                    let also = also_failed(workers, root, stopping_since);
                    report_failures(workers, root, &also);
                    also
                }
                _ => Vec::new(),
            };
            return Ok(Stopped { cause, also_failed });
        }

        if let Phase::Terminating { deadline } = phase {
            if Instant::now() >= deadline {
                phase = kill(workers, Some(grace));
            }
        }
        match notices.recv_timeout(wait) {
            Ok(notice) => on_notice(workers, &notice)?,
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => thread::sleep(wait),
        }
    }
}

fn all_exited(workers: &[Worker]) -> bool {
    workers.iter().all(|w| w.exit.is_some())
}

/// Reaps the worker a watcher saw exit, recording the watcher's exit time.
fn on_notice(workers: &mut [Worker], notice: &ExitNotice) -> Result<(), LaunchError> {
    let Some(w) = workers.iter_mut().find(|w| w.rank == notice.rank) else {
        return Ok(());
    };
    if w.exit.is_some() {
        return Ok(());
    }
    if !notice.waited {
        w.watched = false;
        return Ok(());
    }
    match reap(w)? {
        Some(t) => {
            w.exit = Some(t);
            w.exited_at = Some(notice.at);
        }
        // Cannot happen after a successful waitid; poll it to be safe.
        None => w.watched = false,
    }
    Ok(())
}

/// Reaps workers without a watcher thread that have exited.
fn poll_unwatched(workers: &mut [Worker]) -> Result<(), LaunchError> {
    for w in workers
        .iter_mut()
        .filter(|w| !w.watched && w.exit.is_none())
    {
        if let Some(t) = reap(w)? {
            w.exit = Some(t);
            w.exited_at = Some(Instant::now());
        }
    }
    Ok(())
}

/// Reaps `w` if it has exited.
fn reap(w: &mut Worker) -> Result<Option<Termination>, LaunchError> {
    let status = w.child.try_wait().map_err(|source| LaunchError::Wait {
        rank: w.rank,
        pid: w.pid,
        source,
    })?;
    Ok(status.map(Termination::from))
}

/// A worker that failed, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Failure {
    rank: usize,
    termination: Termination,
    at: Instant,
}

/// What becomes of a worker that failed.
pub(crate) enum Replace {
    /// The job stops (every worker is stopped).
    Stop,
    /// A new worker of the same rank took its place.
    Restarted(Worker),
    /// Starting its replacement failed.
    Failed(LaunchError),
    /// The others go on without it (fault-tolerant workers, no restarts left).
    LeftOut,
}

/// The workers that have failed so far (but not those left out).
fn failures(workers: &[Worker]) -> Vec<Failure> {
    workers
        .iter()
        .filter(|w| !w.left_out)
        .filter_map(|w| match (w.exit, w.exited_at) {
            (Some(termination), Some(at)) if !termination.success() => Some(Failure {
                rank: w.rank,
                termination,
                at,
            }),
            _ => None,
        })
        .collect()
}

/// The root cause among `failures`: the earliest, except that within
/// [`FAILURE_WINDOW`] of the earliest one killed by a signal is preferred.
fn root_cause(failures: &[Failure]) -> Option<usize> {
    let first = failures.iter().map(|f| f.at).min()?;
    failures
        .iter()
        .filter(|f| f.at <= first + FAILURE_WINDOW)
        .min_by_key(|f| {
            let signaled = matches!(f.termination, Termination::Signaled(_));
            (!signaled, f.at, f.rank)
        })
        .map(|f| f.rank)
}

/// The ranks other than `root` that failed on their own, in rank order.
/// Workers that died of SIGTERM or SIGKILL after the launcher began stopping
/// them (at `stopping_since`) were terminated by it and did not fail.
fn also_failed(workers: &[Worker], root: usize, stopping_since: Option<Instant>) -> Vec<usize> {
    let mut ranks: Vec<usize> = failures(workers)
        .into_iter()
        .filter(|f| f.rank != root)
        .filter(|f| {
            let launcher_signal = matches!(
                f.termination,
                Termination::Signaled(libc::SIGTERM | libc::SIGKILL)
            );
            !(launcher_signal && stopping_since.is_some_and(|since| f.at >= since))
        })
        .map(|f| f.rank)
        .collect();
    ranks.sort_unstable();
    ranks
}

/// Reports the root cause and then, if any, the other failed ranks.
fn report_failures(workers: &[Worker], root: usize, also_failed: &[usize]) {
    let find = |rank: usize| workers.iter().find(|w| w.rank == rank);
    if let Some(w) = find(root) {
        if let Some(t) = w.exit {
            report(format_args!("rank {} (pid {}) failed: {t}", w.rank, w.pid));
            if let Some(message) = error_record::message_of(w) {
                report(format_args!(
                    "rank {}'s error: {}",
                    w.rank,
                    indent(&message)
                ));
            }
        }
    }
    let others: Vec<String> = also_failed
        .iter()
        .filter_map(|&rank| find(rank))
        .filter_map(|w| w.exit.map(|t| format!("rank {} ({t})", w.rank)))
        .collect();
    if !others.is_empty() {
        report(format_args!("also failed: {}", others.join(", ")));
    }
}

/// `text` with its lines after the first indented under `kolo run: `.
fn indent(text: &str) -> String {
    text.lines().collect::<Vec<_>>().join("\n    ")
}

/// Before stopping the workers after a failure: has every live worker that catches SIGUSR1 (kolo's
/// flight recorder does) write its flight record, and gives them a moment to — the record of a
/// rank stuck in its own code tells where it was.
fn ask_for_records(workers: &[Worker]) {
    let mut asked = false;
    for w in workers.iter().filter(|w| w.exit.is_none()) {
        if crate::process::catches(w.pid, libc::SIGUSR1) {
            asked |= crate::process::signal_process(w.pid, libc::SIGUSR1).is_ok();
        }
    }
    if asked {
        // The recorder's thread looks every 100 ms and writes a few hundred KiB.
        thread::sleep(RECORD_WAIT);
    }
}

/// How long the launcher waits for the flight records of the workers it is about to stop.
const RECORD_WAIT: Duration = Duration::from_millis(400);

/// Sends SIGTERM to every live worker's process group ([`sigterm_live`]).
fn terminate(workers: &[Worker], grace: Duration) -> Phase {
    sigterm_live(workers);
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

/// SIGTERM to every live worker's process group, then SIGCONT: a stopped worker (SIGSTOP, a
/// shell's ^Z) would otherwise hold the SIGTERM pending through the whole grace period.
fn sigterm_live(workers: &[Worker]) {
    signal_live(workers, libc::SIGTERM);
    signal_live(workers, libc::SIGCONT);
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
    sigterm_live(workers);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(rank: usize, termination: Termination, at: Instant) -> Failure {
        Failure {
            rank,
            termination,
            at,
        }
    }

    #[test]
    fn root_cause_is_the_earliest_failure() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(root_cause(&[]), None);
        let failed = [
            failure(0, Termination::Exited(1), t0 + ms(5)),
            failure(1, Termination::Exited(3), t0),
            failure(2, Termination::Exited(1), t0 + ms(6)),
        ];
        assert_eq!(root_cause(&failed), Some(1));
    }

    #[test]
    fn root_cause_prefers_a_signal_within_the_window() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let failed = [
            failure(0, Termination::Exited(1), t0),
            failure(1, Termination::Exited(1), t0 + ms(1)),
            failure(2, Termination::Signaled(libc::SIGKILL), t0 + ms(3)),
            failure(3, Termination::Signaled(libc::SIGSEGV), t0 + ms(50)),
        ];
        assert_eq!(root_cause(&failed), Some(2));
        // A signal after the window does not take the blame.
        let failed = [
            failure(0, Termination::Exited(1), t0),
            failure(1, Termination::Signaled(libc::SIGKILL), t0 + ms(150)),
        ];
        assert_eq!(root_cause(&failed), Some(0));
        // Equal times: the lower rank.
        let failed = [
            failure(4, Termination::Exited(1), t0),
            failure(3, Termination::Exited(2), t0),
        ];
        assert_eq!(root_cause(&failed), Some(3));
    }
}
