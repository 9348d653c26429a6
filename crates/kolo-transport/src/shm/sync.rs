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

use std::sync::atomic::AtomicU32;
use std::time::Duration;

pub use super::doorbell::Doorbell;

/// Sleeps while `*word == expected`, at most `timeout` (spurious returns are fine: callers loop).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a valid, aligned u32 in memory that stays mapped; the timeout is a valid
    // relative timespec. Shared (not PRIVATE) futexes work across processes mapping the same page.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every thread sleeping on `word`.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a valid, aligned u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Watches a process for exit through a `pidfd` (or, where `pidfd_open` is missing, `kill(pid, 0)`).
#[derive(Debug)]
pub struct ProcessWatch {
    pid: i32,
    fd: Option<i32>,
}

impl ProcessWatch {
    /// Starts watching `pid`.
    pub fn new(pid: i32) -> ProcessWatch {
        // SAFETY: pidfd_open takes a pid and flags; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        ProcessWatch {
            pid,
            fd: (fd >= 0).then_some(fd as i32),
        }
    }

    /// Whether the process has exited (without waiting).
    pub fn exited(&self) -> bool {
        match self.fd {
            Some(fd) => {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd, zero timeout.
                let r = unsafe { libc::poll(&mut p, 1, 0) };
                r > 0 && p.revents & libc::POLLIN != 0
            }
            None => {
                // SAFETY: signal 0 only checks for existence.
                let r = unsafe { libc::kill(self.pid, 0) };
                r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
            }
        }
    }
}

impl Drop for ProcessWatch {
    fn drop(&mut self) {
        if let Some(fd) = self.fd {
            // SAFETY: our descriptor.
            unsafe { libc::close(fd) };
        }
    }
}
