//! MPI's life in this process: initialized once with `MPI_THREAD_MULTIPLE`, finalized at exit (or
//! aborted, when a communicator failed), and the error codes MPI returns turned into kolo errors.

use std::os::raw::{c_char, c_int};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use kolo_core::{Error, Result};
use mpi::environment::Universe;
use mpi::ffi;
use mpi::Threading;

/// An MPI communicator handle. MPI is initialized with `MPI_THREAD_MULTIPLE`, so handles may be used
/// from any thread.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Comm(pub ffi::MPI_Comm);

// SAFETY: with MPI_THREAD_MULTIPLE (checked in `start`) MPI calls on a communicator may come from any
// thread; the handle itself is an opaque value.
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

static UNIVERSE: Mutex<Option<Universe>> = Mutex::new(None);
static STARTED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
/// Set once any kolo communicator over MPI failed: the process then exits without finalizing.
static FAILED: AtomicBool = AtomicBool::new(false);
/// Set when MPI is finalized (nothing may call MPI after that).
static FINALIZED: AtomicBool = AtomicBool::new(false);
/// Held shared around each of the transports' MPI calls, which come from any thread (the flight
/// recorder's watcher asks for failures every 100 ms, and the last owner of a world, on whatever
/// thread, tells its peers it left); held exclusively while MPI is finalized at exit, so that no
/// call is in flight then and none starts after it.
static LIFE: RwLock<()> = RwLock::new(());
/// Transports being dropped on some thread (telling their peers they left): finalizing waits a
/// moment for them.
static CLOSING: AtomicUsize = AtomicUsize::new(0);
/// Live transports, whose buffered sends are completed before MPI is finalized.
static TRANSPORTS: Mutex<Vec<Weak<dyn AtExit>>> = Mutex::new(Vec::new());

/// What MPI's exit needs of a live transport.
pub(crate) trait AtExit: Send + Sync {
    /// Tells the peers this rank is done (once).
    fn close(&self);
    /// Waits (up to `limit`) for the buffered sends to complete.
    fn drain(&self, limit: Duration);
}

fn backend_error(op: &'static str, rank: usize, reason: String) -> Error {
    Error::Backend {
        op,
        rank,
        backend: "mpi",
        reason,
    }
}

/// Initializes MPI with `MPI_THREAD_MULTIPLE` the first time; later calls return the first result.
pub(crate) fn start() -> Result<()> {
    STARTED
        .get_or_init(|| {
            let Some((universe, level)) = mpi::initialize_with_threading(Threading::Multiple)
            else {
                return Err(
                    "MPI was initialized outside kolo; let kolo initialize it (or \
                            initialize it with MPI_THREAD_MULTIPLE and keep it alive)"
                        .into(),
                );
            };
            if level != Threading::Multiple {
                // Keep the universe so MPI is still finalized at exit.
                *UNIVERSE.lock().unwrap_or_else(|p| p.into_inner()) = Some(universe);
                // SAFETY: registering a plain extern "C" function.
                unsafe { libc::atexit(at_exit) };
                return Err(format!(
                    "this MPI library provides only {level:?} thread support; kolo needs \
                     MPI_THREAD_MULTIPLE (an OpenMPI or MPICH built with thread support)"
                ));
            }
            // Errors come back as return codes (turned into kolo errors) instead of killing the job.
            // SAFETY: MPI is initialized; COMM_WORLD is valid.
            unsafe {
                ffi::MPI_Comm_set_errhandler(ffi::RSMPI_COMM_WORLD, ffi::RSMPI_ERRORS_RETURN)
            };
            *UNIVERSE.lock().unwrap_or_else(|p| p.into_inner()) = Some(universe);
            // SAFETY: registering a plain extern "C" function.
            if unsafe { libc::atexit(at_exit) } != 0 {
                return Err("could not register MPI_Finalize to run at exit".into());
            }
            crate::types::create_ops()
        })
        .clone()
        .map_err(|reason| backend_error("init", 0, reason))
}

/// Finalizes MPI when the process exits, after the transports' buffered sends are delivered.
///
/// A process whose communicator failed does not finalize (which waits for every rank, and some may
/// be stuck inside MPI waiting for this one): it gives its abort notices a moment to leave, waits
/// [`FAILED_EXIT_GRACE`] more and exits with status 1 without finalizing, which mpirun (and srun
/// with `--kill-on-bad-exit`) treat as a failed job and end. Not `MPI_Abort`: in OpenMPI 4.1, ranks
/// aborting at the same moment (every rank of a mismatched call does) can crash or hang mpirun
/// itself.
/// How long a failed rank waits before it exits (and mpirun ends the job, killing the ranks still
/// running): the other ranks of a failed collective learn of the failure at about the same moment
/// and need the time to report it — on a loaded machine one of three ranks sharing two cores was
/// now and then killed before it had printed its error.
const FAILED_EXIT_GRACE: Duration = Duration::from_millis(300);

extern "C" fn at_exit() {
    let live: Vec<_> = TRANSPORTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    if FAILED.load(Ordering::SeqCst) {
        for t in &live {
            t.drain(Duration::from_millis(500));
        }
        std::thread::sleep(FAILED_EXIT_GRACE);
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // SAFETY: ends the process at once; nothing after this runs.
        unsafe { libc::_exit(1) };
    }
    for t in &live {
        t.close();
    }
    for t in live {
        t.drain(Duration::from_secs(2));
    }
    let until = Instant::now() + Duration::from_secs(2);
    while CLOSING.load(Ordering::SeqCst) > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    let _no_call_in_flight = LIFE.write().unwrap_or_else(|p| p.into_inner());
    FINALIZED.store(true, Ordering::SeqCst);
    // Dropping the universe calls MPI_Finalize.
    drop(UNIVERSE.lock().unwrap_or_else(|p| p.into_inner()).take());
}

/// Runs `call` (one or more MPI calls that do not block and do not call this again) unless MPI is
/// finalized (`None` then); MPI is not finalized while it runs.
pub(crate) fn while_live<R>(call: impl FnOnce() -> R) -> Option<R> {
    let _live = LIFE.read().unwrap_or_else(|p| p.into_inner());
    if FINALIZED.load(Ordering::SeqCst) {
        return None;
    }
    Some(call())
}

/// Counts a transport telling its peers it left, for as long as the guard lives: MPI's exit waits
/// (a moment) for it.
pub(crate) fn closing() -> Closing {
    CLOSING.fetch_add(1, Ordering::SeqCst);
    Closing(())
}

/// See [`closing`].
pub(crate) struct Closing(());

impl Drop for Closing {
    fn drop(&mut self) {
        CLOSING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// World ranks that have finished (sent their closing notice at exit): a collective still waiting
/// for one of them can never complete. Shared by a world's transport (which receives the notices)
/// and its engines (which wait).
#[derive(Debug, Default)]
pub(crate) struct Watch {
    closed: Mutex<Vec<usize>>,
}

impl Watch {
    pub(crate) fn close(&self, world_rank: usize) {
        let mut c = self.closed.lock().unwrap_or_else(|p| p.into_inner());
        if !c.contains(&world_rank) {
            c.push(world_rank);
        }
    }

    /// The first closed rank among `members` (world ranks), as an index into `members`.
    pub(crate) fn closed_among(&self, members: &[usize]) -> Option<usize> {
        let c = self.closed.lock().unwrap_or_else(|p| p.into_inner());
        c.iter().find_map(|w| members.iter().position(|m| m == w))
    }
}

/// Records that a communicator over MPI failed: at exit the process ends without finalizing.
pub(crate) fn mark_failed() {
    FAILED.store(true, Ordering::SeqCst);
}

/// Whether MPI may still be called (not finalized).
pub(crate) fn live() -> bool {
    !FINALIZED.load(Ordering::SeqCst)
}

/// Registers a transport whose sends are completed before MPI is finalized.
pub(crate) fn register(t: Weak<dyn AtExit>) {
    let mut list = TRANSPORTS.lock().unwrap_or_else(|p| p.into_inner());
    list.retain(|w| w.strong_count() > 0);
    list.push(t);
}

/// MPI's message for an error code.
fn error_string(code: c_int) -> String {
    let mut buf = vec![0 as c_char; 512];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING (256 in OpenMPI and MPICH) characters and more.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr(), &mut len) };
    if rc != 0 || len <= 0 {
        return format!("MPI error code {code}");
    }
    let bytes: Vec<u8> = buf[..len as usize].iter().map(|&c| c as u8).collect();
    format!(
        "{} (MPI error code {code})",
        String::from_utf8_lossy(&bytes)
    )
}

/// `Ok` for `MPI_SUCCESS`, else the error MPI describes.
pub(crate) fn check(rc: c_int, op: &'static str, rank: usize) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(backend_error(op, rank, error_string(rc)))
    }
}

/// Duplicates `comm` (collective over it) with errors returned as codes.
pub(crate) fn dup(comm: ffi::MPI_Comm, op: &'static str, rank: usize) -> Result<Comm> {
    // SAFETY: a null handle is only an out-parameter placeholder.
    let mut out: ffi::MPI_Comm = unsafe { ffi::RSMPI_COMM_NULL };
    // SAFETY: `comm` is a valid communicator of this process; `out` is written by MPI.
    check(unsafe { ffi::MPI_Comm_dup(comm, &mut out) }, op, rank)?;
    // SAFETY: `out` is the communicator just made.
    check(
        unsafe { ffi::MPI_Comm_set_errhandler(out, ffi::RSMPI_ERRORS_RETURN) },
        op,
        rank,
    )?;
    Ok(Comm(out))
}

/// Rank and size of `comm`.
pub(crate) fn rank_size(comm: ffi::MPI_Comm, op: &'static str) -> Result<(usize, usize)> {
    let (mut r, mut n): (c_int, c_int) = (0, 0);
    // SAFETY: valid communicator, plain out-parameters.
    check(unsafe { ffi::MPI_Comm_rank(comm, &mut r) }, op, 0)?;
    // SAFETY: as above.
    check(unsafe { ffi::MPI_Comm_size(comm, &mut n) }, op, 0)?;
    Ok((r as usize, n as usize))
}
