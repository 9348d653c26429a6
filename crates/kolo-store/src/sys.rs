//! The few system calls the crate needs, through rustix's safe wrappers.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fs::{flock, FlockOperation};

/// Kind of `flock` lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockKind {
    /// `LOCK_SH`: many readers.
    Shared,
    /// `LOCK_EX`: one writer.
    Exclusive,
}

/// Tries to take an advisory `flock` lock without blocking.
/// Returns `Ok(false)` if another open file description holds a conflicting lock.
pub(crate) fn try_flock(file: &File, kind: LockKind) -> io::Result<bool> {
    let op = match kind {
        LockKind::Shared => FlockOperation::NonBlockingLockShared,
        LockKind::Exclusive => FlockOperation::NonBlockingLockExclusive,
    };
    loop {
        match flock(file, op) {
            Ok(()) => return Ok(true),
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Releases a `flock` lock.
pub(crate) fn unlock(file: &File) -> io::Result<()> {
    loop {
        match flock(file, FlockOperation::Unlock) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Waits up to `timeout` for `fd` to become readable (for a listening socket:
/// a connection is ready to accept). Returns whether it is readable.
/// An interrupted wait returns `Ok(false)`; the caller loops anyway.
pub(crate) fn poll_readable(fd: &impl AsFd, timeout: Duration) -> io::Result<bool> {
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    let ts = Timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    match poll(&mut fds, Some(&ts)) {
        Ok(n) => Ok(n > 0),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Fills `out` from the kernel's random source (`getrandom(2)`).
pub(crate) fn random(out: &mut [u8]) -> io::Result<()> {
    getrandom::fill(out).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flock_conflicts_between_open_file_descriptions() -> io::Result<()> {
        let file = tempfile::NamedTempFile::new()?;
        let a = File::open(file.path())?;
        let b = File::open(file.path())?;
        assert!(try_flock(&a, LockKind::Exclusive)?);
        assert!(!try_flock(&b, LockKind::Shared)?);
        unlock(&a)?;
        assert!(try_flock(&b, LockKind::Shared)?);
        assert!(try_flock(&a, LockKind::Shared)?);
        // `b` holds a shared lock, so `a` cannot upgrade to exclusive.
        assert!(!try_flock(&a, LockKind::Exclusive)?);
        Ok(())
    }
}
