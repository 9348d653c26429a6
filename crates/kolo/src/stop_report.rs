//! The last word of a worker that torchrun stops: when torchrun sees one worker die it sends
//! SIGTERM to the others at its next poll (every 0.1 s), often before they have noticed the loss
//! themselves. Under torchrun (`TORCHELASTIC_ERROR_FILE` set) and only while SIGTERM has its default
//! action, kolo handles SIGTERM: a thread checks every live world communicator's transport for a
//! failure (a lost peer, an abort), records it in the error file as the communicator would have a
//! moment later, then ends the process by SIGTERM as before. torchrun's summary then shows kolo's
//! message naming the lost rank instead of only "Signal 15".
//!
//! A program that installs its own SIGTERM handler keeps it: kolo only takes SIGTERM when its action
//! is still the default.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, Once, Weak};
use std::time::{Duration, Instant};

use crate::communicator::Inner;

/// The write end of the pipe the handler wakes the reporting thread through.
static WAKE: AtomicI32 = AtomicI32::new(-1);
static INSTALL: Once = Once::new();
static WORLDS: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());

/// How long a stopped worker waits for its transports to notice a dead peer (a socket's reader
/// thread may not have run yet) before it gives up and exits without a report.
const GRACE: Duration = Duration::from_millis(300);

/// Registers a world communicator to be checked when torchrun stops this worker; installs the
/// SIGTERM handler on first use. Does nothing outside torchrun.
pub(crate) fn watch(world: Weak<Inner>) {
    if crate::error_file::error_file().is_none() {
        return;
    }
    {
        let mut worlds = WORLDS.lock().unwrap_or_else(|p| p.into_inner());
        worlds.retain(|w| w.strong_count() > 0);
        worlds.push(world);
    }
    INSTALL.call_once(install);
}

extern "C" fn on_sigterm(_: libc::c_int) {
    let fd = WAKE.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: write(2) is async-signal-safe; one byte from a static buffer.
        unsafe { libc::write(fd, b"t".as_ptr().cast(), 1) };
    }
}

fn install() {
    // SAFETY: sigaction with a null new action only reads the current one into `old`.
    let default = unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGTERM, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_DFL
    };
    if !default {
        return;
    }
    let mut fds = [0i32; 2];
    // SAFETY: a two-element array for pipe2's descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return;
    }
    let [read_fd, write_fd] = fds;
    let spawned = std::thread::Builder::new()
        .name("kolo-sigterm".into())
        .spawn(move || report_and_exit(read_fd));
    if spawned.is_err() {
        // SAFETY: our descriptors, unused elsewhere.
        unsafe {
            libc::close(read_fd);
            libc::close(write_fd);
        }
        return;
    }
    WAKE.store(write_fd, Ordering::Relaxed);
    // SAFETY: installs a handler that only calls write(2); the mask is emptied first.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_sigterm as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut act.sa_mask);
        act.sa_flags = libc::SA_RESTART;
        libc::sigaction(libc::SIGTERM, &act, std::ptr::null_mut());
    }
}

/// Waits for SIGTERM, records the first transport failure of any live world, then dies of SIGTERM.
fn report_and_exit(read_fd: i32) {
    let mut b = [0u8; 1];
    loop {
        // SAFETY: reads one byte into a local buffer from our pipe.
        let n = unsafe { libc::read(read_fd, b.as_mut_ptr().cast(), 1) };
        if n == 1 {
            break;
        }
        if n == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
    }
    let worlds: Vec<_> = WORLDS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    let start = Instant::now();
    loop {
        if worlds.iter().any(|w| w.report_on_stop()) || start.elapsed() >= GRACE {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(worlds);
    // SAFETY: restores the default action and re-raises: the process ends by SIGTERM, as it would
    // have without kolo's handler (torchrun reads the signal from the exit status).
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
        libc::raise(libc::SIGTERM);
    }
}
