//! Unix process plumbing: worker process groups, parent-death signals,
//! signalling worker groups, and catching the launcher's own signals.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    /// SIGUSR1: forwarded to the workers, which write their flight records (`kolo diagnose`).
    usr1: Arc<AtomicBool>,
    ids: Vec<SigId>,
}

impl SignalFlags {
    pub(crate) fn register() -> io::Result<Self> {
        let mut flags = SignalFlags {
            received: Arc::new(AtomicUsize::new(0)),
            usr1: Arc::new(AtomicBool::new(false)),
            ids: Vec::with_capacity(FORWARDED_SIGNALS.len() + 1),
        };
        let id = signal_hook::flag::register(libc::SIGUSR1, Arc::clone(&flags.usr1))?;
        flags.ids.push(id);
        for sig in FORWARDED_SIGNALS {
            // Signal numbers are small and positive.
            let value = usize::try_from(sig).unwrap_or(usize::MAX);
            let id = signal_hook::flag::register_usize(sig, Arc::clone(&flags.received), value)?;
            flags.ids.push(id);
        }
        Ok(flags)
    }

    /// Whether SIGUSR1 came since the previous call.
    pub(crate) fn take_usr1(&self) -> bool {
        self.usr1.swap(false, Ordering::SeqCst)
    }

    /// Whether a forwarded signal came that [`SignalFlags::take`] has not taken yet.
    pub(crate) fn pending(&self) -> bool {
        self.received.load(Ordering::SeqCst) != 0
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

/// Sends `sig` to process `pid` alone (not its group).
pub(crate) fn signal_process(pid: u32, sig: libc::c_int) -> io::Result<()> {
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let (Some(pid), Some(sig)) = (Pid::from_raw(pid), Signal::from_named_raw(sig)) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    rustix::process::kill_process(pid, sig).map_err(io::Error::from)
}

/// Whether process `pid` catches `sig` (its `SigCgt` mask in `/proc/PID/status`): a kolo worker
/// catches SIGUSR1, a program without kolo would die of it.
pub(crate) fn catches(pid: u32, sig: libc::c_int) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|mask| sig > 0 && mask & (1u64 << (sig - 1)) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_signal_is_seen() {
        let me = std::process::id();
        assert!(!catches(me, libc::SIGUSR2));
        let flag = Arc::new(AtomicBool::new(false));
        let id = signal_hook::flag::register(libc::SIGUSR2, flag).expect("a SIGUSR2 handler");
        assert!(catches(me, libc::SIGUSR2));
        signal_hook::low_level::unregister(id);
        assert!(!catches(u32::MAX, libc::SIGUSR2), "no such process");
    }

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
