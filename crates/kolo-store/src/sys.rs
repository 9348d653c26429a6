//! Thin safe wrappers over the few libc calls the crate needs.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

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
        LockKind::Shared => libc::LOCK_SH,
        LockKind::Exclusive => libc::LOCK_EX,
    } | libc::LOCK_NB;
    loop {
        // SAFETY: `file` owns a valid open descriptor for the duration of the call;
        // flock has no memory-safety preconditions.
        let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
        if rc == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(code) if code == libc::EWOULDBLOCK || code == libc::EAGAIN => return Ok(false),
            _ => return Err(err),
        }
    }
}

/// Releases a `flock` lock.
pub(crate) fn unlock(file: &File) -> io::Result<()> {
    loop {
        // SAFETY: as in `try_flock`.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// Waits up to `timeout` for `fd` to become readable (for a listening socket:
/// a connection is ready to accept). Returns whether it is readable.
/// An interrupted wait returns `Ok(false)`; the caller loops anyway.
pub(crate) fn poll_readable(fd: &impl AsRawFd, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `pfd` is a valid, initialised pollfd that lives across the call,
    // and we pass a count of exactly one.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EINTR) {
            return Ok(false);
        }
        return Err(err);
    }
    Ok(rc > 0)
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
