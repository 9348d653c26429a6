//! Asynchronous collectives: a worker thread per communicator runs queued collectives in the order
//! they were issued, and a [`Work`] handle gives the result back.

use std::fmt;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use kolo_core::{Error, Result};

type Task = Box<dyn FnOnce() + Send>;

/// The worker thread of one communicator.
#[derive(Debug)]
pub(crate) struct WorkQueue {
    tx: mpsc::Sender<Task>,
}

impl WorkQueue {
    pub fn start(rank: usize) -> Result<WorkQueue> {
        let (tx, rx) = mpsc::channel::<Task>();
        thread::Builder::new()
            .name(format!("kolo-work-{rank}"))
            .spawn(move || {
                // Ends when the communicator (the only sender) is dropped.
                // A panicking task completes its handle with an error (see `Completer`'s drop) and
                // must not take later tasks down with it.
                while let Ok(task) = rx.recv() {
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(task));
                }
            })
            .map_err(|e| Error::io(format!("rank {rank}: start the async work thread"), e))?;
        Ok(WorkQueue { tx })
    }

    pub fn push(&self, task: Task) -> Result<()> {
        self.tx.send(task).map_err(|_| Error::Unsupported {
            what: "queueing work on a communicator whose worker thread has stopped".into(),
        })
    }
}

/// What runs when a collective completes, instead of storing its result ([`Work::then`]).
type Callback<R> = Box<dyn FnOnce(Result<R>) + Send>;

struct Slot<R> {
    result: Mutex<Option<Result<R>>>,
    /// Set by [`Work::then`] (under `result`'s lock) while the collective runs.
    callback: Mutex<Option<Callback<R>>>,
    done: Condvar,
    times: Mutex<WorkTimes>,
}

/// When an asynchronous collective started running on the worker thread and when it finished
/// (`None`: not yet, or it never ran, e.g. an error found when issuing it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkTimes {
    /// The worker thread took it up (the end of its time in the queue).
    pub started: Option<Instant>,
    /// It completed, successfully or not.
    pub completed: Option<Instant>,
}

/// The handle of an asynchronous collective: its result once it has completed.
///
/// Collectives issued asynchronously on one communicator complete in the order they were issued.
/// Dropping a `Work` does not cancel the collective (its peers are counting on it); the result is
/// discarded.
#[must_use = "an asynchronous collective reports its result and errors only through wait"]
pub struct Work<R> {
    slot: Arc<Slot<R>>,
    op: &'static str,
}

impl<R> fmt::Debug for Work<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Work")
            .field("op", &self.op)
            .field("completed", &self.is_completed())
            .finish()
    }
}

/// Fills a [`Work`]'s slot from the worker thread.
pub(crate) struct Completer<R> {
    slot: Arc<Slot<R>>,
    done: bool,
}

impl<R> Completer<R> {
    /// Notes that the worker thread has taken the collective up.
    pub fn start(&self) {
        self.slot
            .times
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .started = Some(Instant::now());
    }

    pub fn complete(mut self, r: Result<R>) {
        self.set(r);
    }

    fn set(&mut self, r: Result<R>) {
        self.done = true;
        self.slot
            .times
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .completed = Some(Instant::now());
        let mut result = self.slot.result.lock().unwrap_or_else(|p| p.into_inner());
        let callback = self
            .slot
            .callback
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match callback {
            Some(f) => {
                drop(result);
                f(r);
            }
            None => {
                *result = Some(r);
                self.slot.done.notify_all();
            }
        }
    }
}

impl<R> Drop for Completer<R> {
    fn drop(&mut self) {
        if !self.done {
            self.set(Err(Error::Unsupported {
                what: "an asynchronous collective whose task panicked".into(),
            }));
        }
    }
}

impl<R> Work<R> {
    pub(crate) fn new(op: &'static str) -> (Work<R>, Completer<R>) {
        let slot = Arc::new(Slot {
            result: Mutex::new(None),
            callback: Mutex::new(None),
            done: Condvar::new(),
            times: Mutex::new(WorkTimes::default()),
        });
        (
            Work {
                slot: slot.clone(),
                op,
            },
            Completer { slot, done: false },
        )
    }

    /// A handle that is already complete (for errors found when issuing).
    pub(crate) fn ready(op: &'static str, r: Result<R>) -> Work<R> {
        let (w, c) = Work::new(op);
        c.complete(r);
        w
    }

    /// The operation this handle belongs to.
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// Whether the collective has finished (successfully or not).
    pub fn is_completed(&self) -> bool {
        self.slot.result.lock().map(|r| r.is_some()).unwrap_or(true)
    }

    /// Waits up to `timeout` for completion; returns whether it completed.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut r = self.slot.result.lock().unwrap_or_else(|p| p.into_inner());
        while r.is_none() {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            r = self
                .slot
                .done
                .wait_timeout(r, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// When the collective started running and when it completed, as far as it has got.
    pub fn times(&self) -> WorkTimes {
        *self.slot.times.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`Work::wait`], also returning when the collective started running and completed.
    pub fn wait_timed(self) -> (Result<R>, WorkTimes) {
        let slot = self.slot.clone();
        let r = self.wait();
        let times = *slot.times.lock().unwrap_or_else(|p| p.into_inner());
        (r, times)
    }

    /// Runs `f` with the result once the collective completes instead of waiting for it: on the
    /// communicator's worker thread, or at once on this thread if it has completed already
    /// (torch's `Future.then`). `f` runs before the next queued collective starts, so it must be
    /// short and must not wait for later collectives of the same communicator.
    ///
    /// ```
    /// # use kolo::{Config, ReduceOp};
    /// let out = kolo::run_local(2, Config::default(), |comm| {
    ///     let (tx, rx) = std::sync::mpsc::channel();
    ///     comm.all_reduce_async(vec![1.0f32; 4], ReduceOp::Sum)
    ///         .then(move |r| tx.send(r.map(|v| v[0])).unwrap_or(()));
    ///     rx.recv().map_err(|_| "no result")
    /// });
    /// assert!(out.iter().all(|r| matches!(r, Ok(Ok(Ok(x))) if *x == 2.0)));
    /// ```
    pub fn then(self, f: impl FnOnce(Result<R>) + Send + 'static) {
        let mut result = self.slot.result.lock().unwrap_or_else(|p| p.into_inner());
        match result.take() {
            Some(r) => {
                drop(result);
                f(r);
            }
            None => {
                *self.slot.callback.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(f));
            }
        }
    }

    /// Waits for completion and returns the result (the buffer, for collectives that produce one).
    ///
    /// A collective that cannot finish fails after the communicator's timeout, so this never waits
    /// forever.
    pub fn wait(self) -> Result<R> {
        let mut r = self.slot.result.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(res) = r.take() {
                return res;
            }
            r = self.slot.done.wait(r).unwrap_or_else(|p| p.into_inner());
        }
    }
}
