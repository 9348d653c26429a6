//! A communicator's worker thread: every operation of a communicator runs there, one at a time in
//! the order Python issued them (the order collectives must have on every rank), so that an
//! asynchronous operation can return at once and complete later while a blocking one simply
//! waits for its turn. A blocking operation issued while nothing is queued runs on the calling
//! thread instead (no hand-over to the worker and back: a few microseconds per call).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use pyo3::exceptions::PyRuntimeError;
use pyo3::PyResult;

/// A unit of work.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// The thread and the queue feeding it.
#[derive(Debug)]
pub(crate) struct Worker {
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    /// Operations queued and not finished.
    pending: Arc<AtomicUsize>,
    /// Held by whoever runs an operation (the worker, or a caller running one inline).
    lane: Arc<Mutex<()>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    name: String,
}

impl Worker {
    /// Starts the thread `name`.
    pub(crate) fn start(name: String) -> PyResult<Worker> {
        let (tx, rx) = mpsc::channel::<Job>();
        let pending = Arc::new(AtomicUsize::new(0));
        let lane = Arc::new(Mutex::new(()));
        let (pending2, lane2) = (pending.clone(), lane.clone());
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                for job in rx {
                    let guard = lane2.lock().unwrap_or_else(|p| p.into_inner());
                    // A job reports its own errors; a panic (a bug) must not end the thread and
                    // leave later operations waiting forever.
                    if catch_unwind(AssertUnwindSafe(job)).is_err() {
                        eprintln!("kolo: an operation panicked on its worker thread");
                    }
                    drop(guard);
                    pending2.fetch_sub(1, Ordering::AcqRel);
                }
            })
            .map_err(|e| PyRuntimeError::new_err(format!("could not start {name}: {e}")))?;
        Ok(Worker {
            queue: Mutex::new(Some(tx)),
            pending,
            lane,
            thread: Mutex::new(Some(thread)),
            name,
        })
    }

    /// Queues `job` behind every operation issued before it.
    pub(crate) fn submit(&self, job: Job) -> PyResult<()> {
        let queue = self
            .queue
            .lock()
            .map_err(|_| PyRuntimeError::new_err(format!("{}: queue poisoned", self.name)))?;
        match queue.as_ref() {
            Some(tx) => {
                self.pending.fetch_add(1, Ordering::AcqRel);
                tx.send(job).map_err(|_| {
                    self.pending.fetch_sub(1, Ordering::AcqRel);
                    PyRuntimeError::new_err(format!("{} has stopped", self.name))
                })
            }
            None => Err(PyRuntimeError::new_err(
                "the communicator is closed (close() was called)",
            )),
        }
    }

    /// Runs `f` on this thread if no operation is queued or running (it then is the next in
    /// order; one queued meanwhile waits for it); `None` (without running `f`) otherwise, or when
    /// the worker is closed.
    pub(crate) fn run_inline<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        let _lane = self.lane.try_lock().ok()?;
        let open = self.queue.lock().map(|q| q.is_some()).unwrap_or(false);
        if !open || self.pending.load(Ordering::Acquire) != 0 {
            return None;
        }
        Some(f())
    }

    /// Stops taking work and waits until the queued operations are done, at most until
    /// `deadline`; whether they all finished.
    pub(crate) fn drain(&self, deadline: std::time::Instant) -> bool {
        if let Ok(mut q) = self.queue.lock() {
            q.take();
        }
        while self.pending.load(Ordering::Acquire) != 0 {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        true
    }

    /// Stops taking work, lets the queued operations finish and joins the thread. Call it with
    /// the GIL released: the operations' completions take it.
    pub(crate) fn close(&self) {
        if let Ok(mut q) = self.queue.lock() {
            q.take();
        }
        let handle = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(h) = handle {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}
