//! Unix process plumbing: worker process groups, parent-death signals,
//! signalling worker groups, and catching the launcher's own signals.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rustix::io::Errno;
use rustix::process::{Pid, Signal};
use signal_hook::SigId;

/// Makes the child started by `cmd` the leader of a new process group and,
/// on Linux, ask the kernel to SIGKILL it when the launcher dies.
pub(crate) fn isolate_child(cmd: &mut Command) {
    cmd.process_group(0);
    #[cfg(target_os = "linux")]
    {
        let launcher = rustix::process::getpid();
        // SAFETY: the hook runs in the forked child before exec and only makes async-signal-safe
        // system calls (prctl, getppid, _exit) without allocating (rustix's errors convert to
        // io::Error without allocating).
        unsafe {
            cmd.pre_exec(move || set_parent_death_signal(launcher));
        }
    }
}

#[cfg(target_os = "linux")]
fn set_parent_death_signal(launcher: Pid) -> io::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
    // The launcher may have died between fork and prctl; then no death signal
    // will ever come, so die now.
    if rustix::process::getppid() != Some(launcher) {
        // SAFETY: _exit is async-signal-safe and ends this forked child at once.
        unsafe { libc::_exit(128 + libc::SIGKILL) };
    }
    Ok(())
}

/// Sends `sig` to every process in the process group `pgid`. A group that no
/// longer exists is not an error.
pub(crate) fn signal_group(pgid: u32, sig: libc::c_int) -> io::Result<()> {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    if pgid <= 1 {
        // kill(0 or -1, ..) would hit the launcher's own group or everything.
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let Some(pgid) = Pid::from_raw(pgid) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    let sent = if sig == 0 {
        rustix::process::test_kill_process_group(pgid)
    } else {
        match Signal::from_named_raw(sig) {
            Some(sig) => rustix::process::kill_process_group(pgid, sig),
            None => Err(Errno::INVAL),
        }
    };
    match sent {
        Ok(()) | Err(Errno::SRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The conventional name of a signal, e.g. `SIGKILL` for 9.
pub(crate) fn signal_name(sig: i32) -> Option<&'static str> {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGCONT => "SIGCONT",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGTTIN => "SIGTTIN",
        libc::SIGTTOU => "SIGTTOU",
        libc::SIGURG => "SIGURG",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGPROF => "SIGPROF",
        libc::SIGSYS => "SIGSYS",
        _ => return None,
    };
    Some(name)
}

/// The signals the launcher catches and forwards to its workers.
pub(crate) const FORWARDED_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Records SIGINT, SIGTERM and SIGHUP delivered to the launcher while alive.
///
/// Dropping it removes the actions; signal-hook keeps its (now empty) handler
/// installed, so these signals stay caught-and-ignored afterwards.
#[derive(Debug)]
pub(crate) struct SignalFlags {
    received: Arc<AtomicUsize>,
    ids: Vec<SigId>,
}

impl SignalFlags {
    pub(crate) fn register() -> io::Result<Self> {
        let mut flags = SignalFlags {
            received: Arc::new(AtomicUsize::new(0)),
            ids: Vec::with_capacity(FORWARDED_SIGNALS.len()),
        };
        for sig in FORWARDED_SIGNALS {
            // Signal numbers are small and positive.
            let value = usize::try_from(sig).unwrap_or(usize::MAX);
            let id = signal_hook::flag::register_usize(sig, Arc::clone(&flags.received), value)?;
            flags.ids.push(id);
        }
        Ok(flags)
    }

    /// The last signal received since the previous call, if any.
    pub(crate) fn take(&self) -> Option<i32> {
        match self.received.swap(0, Ordering::SeqCst) {
            0 => None,
            sig => i32::try_from(sig).ok(),
        }
    }
}

impl Drop for SignalFlags {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(signal_name(libc::SIGKILL), Some("SIGKILL"));
        assert_eq!(signal_name(libc::SIGTERM), Some("SIGTERM"));
        assert_eq!(signal_name(libc::SIGSEGV), Some("SIGSEGV"));
        assert_eq!(signal_name(0), None);
        assert_eq!(signal_name(200), None);
    }

    #[test]
    fn refuses_dangerous_groups() {
        assert!(signal_group(0, 0).is_err());
        assert!(signal_group(1, 0).is_err());
        assert!(signal_group(u32::MAX, 0).is_err());
    }
}
