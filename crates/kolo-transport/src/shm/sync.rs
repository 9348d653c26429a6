//! Waiting across processes: a futex word per rank (its *doorbell*) that peers ring after publishing
//! something that rank may wait for, and a `pidfd` per peer to notice a process that is gone.
//!
//! The sleep/wake handshake (Dekker-style, so no wake-up is lost):
//!
//! - waiter: `sleepers += 1`; fence; read the doorbell value `v`; check the condition; if unmet,
//!   `futex_wait(doorbell, v)`; `sleepers -= 1`;
//! - waker: publish (release store); fence; if `sleepers > 0`: `doorbell += 1`; `futex_wake(doorbell)`.
//!
//! Either the waker sees the sleeper (and changes the doorbell, so a `futex_wait` on the old value
//! returns at once), or the waiter's check sees the published data. The handshake itself is
//! [`Doorbell`] (in `doorbell.rs`, which `tests/shm_model.rs` model-checks with `loom`).

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::process::{pidfd_open, test_kill_process, Pid, PidfdFlags};
use rustix::thread::futex;

pub use super::doorbell::Doorbell;

/// Sleeps while `*word == expected`, at most `timeout` (spurious returns are fine: callers loop).
#[inline]
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = Timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    // Shared (not PRIVATE) futexes work across processes mapping the same page. Every outcome
    // (woken, value changed, timed out, interrupted) means the same to the caller: check again.
    let _ = futex::wait(word, futex::Flags::empty(), expected, Some(&ts));
}

/// Wakes every thread sleeping on `word`.
#[inline]
pub fn futex_wake(word: &AtomicU32) {
    let _ = futex::wake(word, futex::Flags::empty(), i32::MAX as u32);
}

/// Watches a process for exit through a `pidfd` (or, where `pidfd_open` is missing, `kill(pid, 0)`).
#[derive(Debug)]
pub struct ProcessWatch {
    pid: Option<Pid>,
    fd: Option<OwnedFd>,
    /// When the system was last asked, in nanoseconds since `since` (`u64::MAX`: it said exited).
    asked: AtomicU64,
    since: Instant,
}

/// How long an answer of [`ProcessWatch::exited`] stands: asking is a system call (0.5 µs here),
/// and polling receives (`Test`, a non-blocking receive) ask on every call; a process that is
/// gone is still seen within a millisecond.
const EXIT_CHECK_EVERY: Duration = Duration::from_millis(1);

impl ProcessWatch {
    /// Starts watching `pid`.
    pub fn new(pid: i32) -> ProcessWatch {
        let pid = Pid::from_raw(pid);
        let fd = pid.and_then(|p| pidfd_open(p, PidfdFlags::empty()).ok());
        let since = Instant::now();
        ProcessWatch {
            pid,
            fd,
            // Asked "long ago": the first call asks.
            asked: AtomicU64::new(0),
            since: since.checked_sub(EXIT_CHECK_EVERY).unwrap_or(since),
        }
    }

    /// Whether the process has exited (without waiting), as the system said at most
    /// a millisecond ago.
    pub fn exited(&self) -> bool {
        let asked = self.asked.load(Ordering::Relaxed);
        if asked == u64::MAX {
            return true;
        }
        let now = u64::try_from(self.since.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
        if now.saturating_sub(asked) < EXIT_CHECK_EVERY.as_nanos() as u64 {
            return false;
        }
        let exited = self.ask();
        self.asked
            .store(if exited { u64::MAX } else { now }, Ordering::Relaxed);
        exited
    }

    /// Asks the system whether the process has exited.
    fn ask(&self) -> bool {
        match (&self.fd, self.pid) {
            (Some(fd), _) => {
                let mut p = [PollFd::new(fd, PollFlags::IN)];
                let zero = Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                matches!(poll(&mut p, Some(&zero)), Ok(n) if n > 0)
                    && p[0].revents().contains(PollFlags::IN)
            }
            (None, Some(pid)) => test_kill_process(pid) == Err(Errno::SRCH),
            // Not a valid process id (zero or negative): nothing to watch.
            (None, None) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The watch of a child process: not exited while it runs (asked at most once a
    /// millisecond), exited soon after it ends, and exited from then on. The margins are wide:
    /// other tests may hold the cores.
    #[test]
    fn a_watch_sees_its_process_run_and_exit() -> std::io::Result<()> {
        /// The child, ended however the test ends.
        struct Child(std::process::Child);
        impl Drop for Child {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let mut child = Child(std::process::Command::new("sleep").arg("30").spawn()?);
        let pid = i32::try_from(child.0.id()).map_err(std::io::Error::other)?;
        let watch = ProcessWatch::new(pid);
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(50) {
            assert!(!watch.exited(), "exited while it runs");
        }
        child.0.kill()?;
        child.0.wait()?; // reaped: the pidfd stays readable
        let ended = Instant::now();
        while !watch.exited() {
            assert!(
                ended.elapsed() < Duration::from_secs(2),
                "the exit is not seen 2 s after it"
            );
        }
        assert!(watch.exited() && watch.exited(), "exited stays exited");
        Ok(())
    }
}
