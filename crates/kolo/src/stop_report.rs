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

use std::fs::File;
use std::io::Read;
use std::sync::{Mutex, Once, Weak};
use std::time::{Duration, Instant};

/// A world whose first failure can be written when the process is told to stop (implemented by
/// the communicator).
pub(crate) trait StopReport: Send + Sync {
    /// Writes the failure, if there is one; whether there was.
    fn report_on_stop(&self) -> bool;
}

static INSTALL: Once = Once::new();
static WORLDS: Mutex<Vec<Weak<dyn StopReport>>> = Mutex::new(Vec::new());

/// How long a stopped worker waits for its transports to notice a dead peer (a socket's reader
/// thread may not have run yet) before it gives up and exits without a report. 300 ms was too
/// short on a loaded 2-core machine (a debug build in mid all-reduce, once in a full test run);
/// torchrun waits 30 s after its SIGTERM, and a worker with a report to write ends at once.
const GRACE: Duration = Duration::from_secs(1);

/// Registers a world communicator to be checked when torchrun stops this worker; installs the
/// SIGTERM handler on first use. Does nothing outside torchrun.
pub(crate) fn watch(world: Weak<dyn StopReport>) {
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

/// Whether SIGTERM still has its default action.
fn sigterm_is_default() -> bool {
    // SAFETY: sigaction with a null new action only reads the current one into `old`, a zeroed
    // (valid) sigaction that lives across the call.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGTERM, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_DFL
    }
}

fn install() {
    if !sigterm_is_default() {
        return;
    }
    let Ok((read_end, write_end)) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
    else {
        return;
    };
    let read_end = File::from(read_end);
    let spawned = std::thread::Builder::new()
        .name("kolo-sigterm".into())
        .spawn(move || report_and_exit(read_end));
    if spawned.is_err() {
        // The thread's closure, and with it the read end, is dropped; so is the write end.
        return;
    }
    // The handler writes one byte to the pipe (async-signal-safe), waking the thread.
    let _ = signal_hook::low_level::pipe::register(libc::SIGTERM, write_end);
}

/// Waits for SIGTERM, records the first transport failure of any live world, then dies of SIGTERM.
fn report_and_exit(mut read_end: File) {
    let mut b = [0u8; 1];
    loop {
        match read_end.read(&mut b) {
            Ok(1) => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            _ => return,
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
    // Restores the default action and re-raises: the process ends by SIGTERM, as it would have
    // without kolo's handler (torchrun reads the signal from the exit status).
    let _ = signal_hook::low_level::emulate_default_handler(libc::SIGTERM);
}
