//! A communicator's worker thread: every operation of a communicator runs there, one at a time in
//! the order Python issued them (the order collectives must have on every rank), so that an
//! asynchronous operation can return at once and complete later while a blocking one simply
//! waits for its turn.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::Mutex;
use std::thread::JoinHandle;

use pyo3::exceptions::PyRuntimeError;
use pyo3::PyResult;

/// A unit of work.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// The thread and the queue feeding it.
#[derive(Debug)]
pub(crate) struct Worker {
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    name: String,
}

impl Worker {
    /// Starts the thread `name`.
    pub(crate) fn start(name: String) -> PyResult<Worker> {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                for job in rx {
                    // A job reports its own errors; a panic (a bug) must not end the thread and
                    // leave later operations waiting forever.
                    if catch_unwind(AssertUnwindSafe(job)).is_err() {
                        eprintln!("kolo: an operation panicked on its worker thread");
                    }
                }
            })
            .map_err(|e| PyRuntimeError::new_err(format!("could not start {name}: {e}")))?;
        Ok(Worker {
            queue: Mutex::new(Some(tx)),
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
            Some(tx) => tx
                .send(job)
                .map_err(|_| PyRuntimeError::new_err(format!("{} has stopped", self.name))),
            None => Err(PyRuntimeError::new_err(
                "the communicator is closed (close() was called)",
            )),
        }
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
