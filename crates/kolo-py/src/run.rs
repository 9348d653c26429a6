//! How a communicator's operations run: on kolo's own machinery. A collective with a `done`
//! callback goes to kolo's work queue (its `*_async`/`*_into_async` form, the Python buffers
//! owned by kolo as [`Target`](crate::buffer::Target)/[`Source`](crate::buffer::Source) until it
//! completes) and `Work::then` calls `done`; a blocking one calls kolo's blocking API with the
//! GIL released (kolo runs it after the collectives queued before it).
//!
//! What kolo-py adds is a [`Lane`] per communicator: it counts the asynchronous operations issued
//! and completed — so that a blocking call waits for the ones before it with the GIL released
//! and Ctrl-C still raising, `close()` and the exit ([`shutdown_all`]) can let them finish (their
//! completions run Python code), and a closed communicator refuses new ones — and orders the
//! asynchronous point-to-point operations, which kolo's queue (numbered collectives) does not
//! take: each runs after the collectives issued before it and after the earlier operations of
//! its direction (sends in order, receives in order), a receive on a thread of its own. Blocking
//! operations keep the same order. A send does not wait for an earlier receive (kolo's sends are
//! buffered: receives posted before the sends on both sides must not wait for each other), nor a
//! collective for an earlier send or receive (wait for its `Work` first where the collective uses
//! its buffer).

use std::cell::Cell;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use kolo::{Communicator, Work};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::comm::PyCommunicator;
use crate::errors::to_py;

/// How often a wait with the GIL released looks for Ctrl-C.
const TICK: Duration = Duration::from_millis(100);

thread_local! {
    /// The lane (its address) whose completion callback this thread is running; 0 if none.
    static COMPLETING: Cell<usize> = const { Cell::new(0) };
}

/// Asynchronous operations of one communicator, issued and finished.
#[derive(Debug, Default)]
struct State {
    /// Set by `close()` (and at exit): new operations raise.
    closed: bool,
    /// Collectives queued on kolo's work queue (they complete in issue order), and completed.
    issued: u64,
    finished: u64,
    /// Sends and receives (each runs after the one of its direction before it).
    p2p: [Chain; 2],
}

/// Point-to-point operations of one direction issued, and completed.
#[derive(Debug, Default, Clone, Copy)]
struct Chain {
    issued: u64,
    finished: u64,
}

/// A direction of point-to-point operations: its chain in [`State::p2p`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Direction {
    Send = 0,
    Recv = 1,
}

impl State {
    /// The asynchronous operations issued so far.
    fn mark(&self) -> Mark {
        Mark {
            issued: self.issued,
            p2p: self.p2p.map(|c| c.issued),
        }
    }

    /// The asynchronous operations issued so far that an operation of `direction` (a collective:
    /// `None`) runs after.
    fn mark_for(&self, direction: Option<Direction>) -> Mark {
        let mut m = Mark {
            issued: self.issued,
            p2p: [0; 2],
        };
        if let Some(d) = direction {
            m.p2p[d as usize] = self.p2p[d as usize].issued;
        }
        m
    }
}

/// The asynchronous operations issued before an operation.
#[derive(Debug, Clone, Copy)]
struct Mark {
    issued: u64,
    p2p: [u64; 2],
}

impl Mark {
    /// Whether all of them have completed.
    fn passed(self, s: &State) -> bool {
        s.finished >= self.issued && s.p2p.iter().zip(self.p2p).all(|(c, m)| c.finished >= m)
    }
}

/// The per-communicator state described in the module's documentation.
#[derive(Debug, Default)]
pub(crate) struct Lane {
    state: Mutex<State>,
    changed: Condvar,
}

fn closed() -> PyErr {
    PyRuntimeError::new_err("the communicator is closed (close() was called)")
}

impl Lane {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn id(&self) -> usize {
        self as *const Lane as usize
    }

    /// Whether this thread is running one of this lane's completion callbacks.
    pub(crate) fn completing_here(&self) -> bool {
        COMPLETING.with(Cell::get) == self.id()
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.lock());
        self.changed.notify_all();
    }

    /// Waits (the caller has released the GIL) until `ready`, at most until `deadline`; whether
    /// it is.
    fn wait_until(&self, deadline: Option<Instant>, ready: impl Fn(&State) -> bool) -> bool {
        let mut s = self.lock();
        loop {
            if ready(&s) {
                return true;
            }
            s = match deadline {
                None => self.changed.wait(s).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return false;
                    }
                    let t = self.changed.wait_timeout(s, d - now);
                    t.unwrap_or_else(|p| p.into_inner()).0
                }
            };
        }
    }

    /// Waits with the GIL released until `ready`, raising what a signal handler raises
    /// (`KeyboardInterrupt` for Ctrl-C) meanwhile.
    fn wait_interruptibly(
        &self,
        py: Python<'_>,
        ready: impl Fn(&State) -> bool + Sync,
    ) -> PyResult<()> {
        loop {
            if py.detach(|| self.wait_until(Some(Instant::now() + TICK), &ready)) {
                return Ok(());
            }
            py.check_signals()?;
        }
    }

    /// Before a blocking operation of `direction` (a collective: `None`): the communicator
    /// open, and the asynchronous operations it runs after complete.
    fn before_blocking(&self, py: Python<'_>, direction: Option<Direction>) -> PyResult<()> {
        let mark = {
            let s = self.lock();
            if s.closed {
                return Err(closed());
            }
            let mark = s.mark_for(direction);
            if mark.passed(&s) {
                // Nothing to wait for (the common case): no release of the GIL.
                return Ok(());
            }
            mark
        };
        if self.completing_here() {
            return Err(PyRuntimeError::new_err(
                "a blocking operation in a completion callback of the same communicator would \
                 wait for that operation itself: issue it asynchronously, or from another thread",
            ));
        }
        self.wait_interruptibly(py, move |s| mark.passed(s))
    }

    /// Counts an asynchronous collective issued.
    fn begin(&self) -> PyResult<()> {
        let mut s = self.lock();
        if s.closed {
            return Err(closed());
        }
        s.issued += 1;
        Ok(())
    }

    /// Counts an asynchronous point-to-point operation issued; when it may run: after the
    /// collectives issued before it and the operations of its direction before it.
    fn begin_p2p(&self, d: Direction) -> PyResult<impl Fn(&State) -> bool + Copy + Send> {
        let mut s = self.lock();
        if s.closed {
            return Err(closed());
        }
        let (collectives, turn) = (s.issued, s.p2p[d as usize].issued);
        s.p2p[d as usize].issued += 1;
        Ok(move |s: &State| s.finished >= collectives && s.p2p[d as usize].finished == turn)
    }

    /// Counts a point-to-point operation of direction `d` completed.
    fn end_p2p(&self, d: Direction) {
        self.update(|s| s.p2p[d as usize].finished += 1);
    }

    /// Completes an asynchronous operation: its buffers released and `done(None)` or
    /// `done(exception)` called with the GIL (after the interpreter has finalized — the exit's
    /// shutdown skipped — there is nobody to tell).
    fn complete<W>(&self, r: kolo::Result<W>, done: Py<PyAny>) {
        let _ = Python::try_attach(|py| {
            let arg = match r {
                Ok(buffers) => {
                    drop(buffers);
                    py.None()
                }
                Err(e) => to_py(e).into_value(py).into_any(),
            };
            let outer = COMPLETING.with(|c| c.replace(self.id()));
            if let Err(e) = done.call1(py, (arg,)) {
                e.write_unraisable(py, Some(done.bind(py)));
            }
            COMPLETING.with(|c| c.set(outer));
            drop(done);
        });
    }

    /// Refuses new operations.
    pub(crate) fn close(&self) {
        self.update(|s| s.closed = true);
    }

    /// Waits (the GIL released) until every asynchronous operation issued has completed, at
    /// most until `deadline`; whether they have.
    pub(crate) fn drain(&self, deadline: Option<Instant>) -> bool {
        self.wait_until(deadline, |s| s.mark().passed(s))
    }

    /// [`Lane::drain`] without a deadline, Ctrl-C raising.
    pub(crate) fn drain_interruptibly(&self, py: Python<'_>) -> PyResult<()> {
        self.wait_interruptibly(py, |s| s.mark().passed(s))
    }
}

/// Every communicator made in this process, for [`shutdown_all`].
static LIVE: Mutex<Vec<(Weak<Lane>, Weak<Communicator>)>> = Mutex::new(Vec::new());

/// Notes a new communicator for [`shutdown_all`].
pub(crate) fn register(lane: &Arc<Lane>, comm: &Arc<Communicator>) {
    if let Ok(mut live) = LIVE.lock() {
        live.retain(|(l, _)| l.strong_count() > 0);
        live.push((Arc::downgrade(lane), Arc::downgrade(comm)));
    }
}

/// Ends every communicator's work before the interpreter finalizes (the package registers it with
/// `atexit`): each is closed, its asynchronous operations get `grace` to finish (their completions
/// still run Python code; a thread that reaches for the GIL during finalization is ended by
/// CPython mid-call, which aborts the process); a communicator with operations still running then
/// is aborted (they fail at once) and they get `grace` more to complete.
pub(crate) fn shutdown_all(py: Python<'_>, grace: Duration) {
    let live: Vec<_> = LIVE
        .lock()
        .map(|mut l| std::mem::take(&mut *l))
        .unwrap_or_default();
    py.detach(|| {
        let deadline = Instant::now() + grace;
        for (lane, comm) in &live {
            if let Some(lane) = lane.upgrade() {
                end(&lane, comm, deadline, grace, "is exiting");
            }
        }
    });
}

/// Closes `lane` (later operations are refused) and lets its asynchronous operations finish until
/// `deadline`; if some are still running then, aborts the communicator (they fail at once, on every
/// rank, the error saying that this rank `doing` so) and gives them `grace` more to complete.
/// Whether every operation had finished by the deadline.
pub(crate) fn end(
    lane: &Lane,
    comm: &Weak<Communicator>,
    deadline: Instant,
    grace: Duration,
    doing: &str,
) -> bool {
    lane.close();
    if lane.drain(Some(deadline)) {
        return true;
    }
    if let Some(comm) = comm.upgrade() {
        comm.abort(&format!(
            "rank {} {doing} with operations still running",
            comm.rank()
        ));
    }
    lane.drain(Some(Instant::now() + grace));
    false
}

impl PyCommunicator {
    /// Runs `f` as a blocking collective: after the asynchronous collectives issued before it
    /// (waiting for them with Ctrl-C raising), with the GIL released.
    pub(crate) fn blocking<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Communicator) -> kolo::Result<R> + Send,
    ) -> PyResult<R> {
        self.blocking_after(py, None, f)
    }

    /// [`PyCommunicator::blocking`] for an operation of `direction`: also after the asynchronous
    /// ones of that direction.
    pub(crate) fn blocking_after<R: Send>(
        &self,
        py: Python<'_>,
        direction: Option<Direction>,
        f: impl FnOnce(&Communicator) -> kolo::Result<R> + Send,
    ) -> PyResult<R> {
        self.lane.before_blocking(py, direction)?;
        let comm = &*self.comm;
        py.detach(|| f(comm)).map_err(to_py)
    }

    /// A brief call of `direction` (one that never waits for a peer: posting a receive) after
    /// the asynchronous operations it runs after, keeping the GIL.
    pub(crate) fn brief<R>(
        &self,
        py: Python<'_>,
        direction: Direction,
        f: impl FnOnce(&Communicator) -> kolo::Result<R>,
    ) -> PyResult<R> {
        self.lane.before_blocking(py, Some(direction))?;
        f(&self.comm).map_err(to_py)
    }

    /// One collective on `buffers`: with `done`, `queued` issues kolo's asynchronous form (kolo
    /// owns the buffers until it completes; then `done` is called); without, `blocking` runs
    /// kolo's blocking form ([`PyCommunicator::blocking`]) and the buffers are released here.
    pub(crate) fn collective<B, W>(
        &self,
        py: Python<'_>,
        done: Option<Py<PyAny>>,
        mut buffers: B,
        blocking: impl FnOnce(&Communicator, &mut B) -> kolo::Result<()> + Send,
        queued: impl FnOnce(&Communicator, B) -> Work<W> + Send,
    ) -> PyResult<()>
    where
        B: Send + 'static,
        W: Send + 'static,
    {
        let Some(done) = done else {
            let r = self.blocking(py, |c| blocking(c, &mut buffers));
            drop(buffers);
            return r;
        };
        self.lane.begin()?;
        let (comm, lane) = (&*self.comm, self.lane.clone());
        // Issued without the GIL: issuing may wait for a blocking call of another thread to take
        // its turn, and that call may wait for a completion that needs the GIL.
        py.detach(move || {
            queued(comm, buffers).then(move |r| {
                lane.complete(r, done);
                lane.update(|s| s.finished += 1);
            })
        });
        Ok(())
    }

    /// A point-to-point operation `run` on `buffers`: blocking without `done`; with it, when
    /// it may run (see the module's documentation) — at once on this thread if it may already
    /// and is a send (kolo's sends are buffered), else on a thread of its own — and `done` is
    /// called when it completes.
    pub(crate) fn p2p<B: Send + 'static>(
        &self,
        py: Python<'_>,
        done: Option<Py<PyAny>>,
        mut buffers: B,
        direction: Direction,
        run: impl FnOnce(&Communicator, &mut B) -> kolo::Result<()> + Send + 'static,
    ) -> PyResult<()> {
        let Some(done) = done else {
            let r = self.blocking_after(py, Some(direction), |c| run(c, &mut buffers));
            drop(buffers);
            return r;
        };
        let ready = self.lane.begin_p2p(direction)?;
        let lane = self.lane.clone();
        if matches!(direction, Direction::Send) && ready(&lane.lock()) {
            let comm = &*self.comm;
            let r = py.detach(|| run(comm, &mut buffers));
            lane.complete(r.map(|()| buffers), done);
            lane.end_p2p(direction);
            return Ok(());
        }
        let comm = self.comm.clone();
        let job = {
            let lane = lane.clone();
            move || {
                lane.wait_until(None, ready);
                let r = run(&comm, &mut buffers);
                lane.complete(r.map(|()| buffers), done);
                lane.end_p2p(direction);
            }
        };
        let name = format!("kolo-p2p-{}", self.comm.rank());
        if let Err(e) = std::thread::Builder::new().name(name).spawn(job) {
            // The operation is lost; its turn must still pass to the ones after it.
            py.detach(|| lane.wait_until(None, ready));
            lane.end_p2p(direction);
            return Err(PyRuntimeError::new_err(format!(
                "could not start a thread for the operation: {e}"
            )));
        }
        Ok(())
    }
}
