//! kolo.MPI's requests of the operations the transport carries on its own after the call that
//! issued them: a receive posted at `Irecv` (the transport writes the message straight into the
//! buffer; see `posted`) and a large send in place (the receiver copies the buffer; see
//! `in_place`). One native class, `kolo._kolo.Request`, holds either with the buffer it keeps, and
//! has MPI's request methods (`Wait`, `Test`, `wait`, `test`, `Get_status`, `Free`); kolo.MPI
//! subclasses it together with its own `Request` (``class Native(_kolo.Request, Request)``) and
//! registers the subclass ([`register_mpi_request`]), so that the requests made here are
//! `MPI.Request`s. [`wait_all`] completes a list of requests in one call (``Request.Waitall``
//! of a window of `Isend`s or `Irecv`s): the Python code per request that it saves cost as much as
//! the message.

use std::sync::{Arc, Mutex, MutexGuard};

use kolo::{Communicator, InPlaceSend, PostedRecv};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyType};

use crate::buffer::{Held, Target};
use crate::errors::to_py;

/// MPI's `ANY_SOURCE` and `ANY_TAG` (kolo.MPI's values): a send's status.
const ANY: i64 = -1;

/// The operation of a request still pending, with the buffer it holds.
pub(crate) enum Live {
    /// A receive posted with the transport, writing into `target`.
    Recv {
        comm: Arc<Communicator>,
        posted: PostedRecv<u8>,
        target: Target<u8>,
    },
    /// A send in place, which the receiver copies out of `held`.
    Send {
        comm: Arc<Communicator>,
        send: InPlaceSend,
        held: Held,
    },
}

/// A buffer an ended operation gives back, held only to be released once the lock is (with the
/// GIL).
#[allow(dead_code)]
enum Ended {
    Target(Target<u8>),
    Held(Held),
    Kept,
}

impl Live {
    /// One look: the bytes received (0 for a send) once complete, `None` while not.
    fn test(&self) -> kolo::Result<Option<usize>> {
        match self {
            Live::Recv { comm, posted, .. } => comm.test_posted(posted),
            Live::Send { comm, send, .. } => comm.in_place_done(send).map(|d| d.then_some(0)),
        }
    }

    /// Waits, up to the communicator's timeout: the bytes received (0 for a send).
    fn wait(&self) -> kolo::Result<usize> {
        match self {
            Live::Recv { comm, posted, .. } => comm.wait_posted(posted),
            Live::Send { comm, send, .. } => comm.wait_in_place(send).map(|()| 0),
        }
    }

    /// Ends the operation: a receive is withdrawn (nothing is written into its buffer after
    /// this); a send that `failed` keeps its buffer for good, since the receiver may still be
    /// copying it.
    fn end(self, failed: bool) -> Ended {
        match self {
            Live::Recv {
                comm,
                posted,
                target,
            } => {
                comm.unpost(posted);
                Ended::Target(target)
            }
            Live::Send { held, .. } if failed => {
                std::mem::forget(held);
                Ended::Kept
            }
            Live::Send { held, .. } => Ended::Held(held),
        }
    }
}

struct State {
    /// `None` once complete (or failed).
    live: Option<Live>,
    /// The status a completed request reports: the message's source, tag and bytes.
    source: i64,
    tag: i64,
    count: usize,
}

impl State {
    /// Records the outcome of a look or a wait that ended the operation (complete or failed).
    fn end(&mut self, got: &kolo::Result<usize>) -> Ended {
        match got {
            Ok(n) => self.count = *n,
            Err(_) => self.count = 0,
        }
        self.live
            .take()
            .map_or(Ended::Kept, |live| live.end(got.is_err()))
    }
}

/// A nonblocking operation's request (see the module): pending until its operation completes.
#[pyclass(frozen, subclass, module = "kolo._kolo", name = "Request")]
pub(crate) struct PyRequest {
    state: Mutex<State>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The class kolo.MPI registered for its requests (a subclass of `PyRequest`).
static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// Registers kolo.MPI's request class, a Python subclass of `kolo._kolo.Request` and of
/// kolo.MPI's `Request`: the requests made natively are of it (a later class, from a reloaded
/// module, is not registered).
#[pyfunction]
pub(crate) fn register_mpi_request(cls: &Bound<'_, PyType>) -> PyResult<()> {
    if !cls.is_subclass_of::<PyRequest>()? {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "register_mpi_request: expected a subclass of kolo._kolo.Request",
        ));
    }
    let _ = CLASS.set(cls.py(), cls.clone().unbind());
    Ok(())
}

impl PyRequest {
    /// The request of `live`, pending, of kolo.MPI's registered class (the native class where
    /// none is registered); a receive's status names `source` and `tag`.
    pub(crate) fn issue(
        py: Python<'_>,
        live: Live,
        source: usize,
        tag: u64,
    ) -> PyResult<Bound<'_, PyAny>> {
        let obj = match CLASS.get(py) {
            Some(cls) => cls.bind(py).call0()?,
            None => Bound::new(py, PyRequest::new())?.into_any(),
        };
        let recv = matches!(live, Live::Recv { .. });
        {
            let r = obj.cast::<PyRequest>()?.get();
            let mut s = lock(&r.state);
            (s.source, s.tag) = match recv {
                true => (source as i64, tag.min(i64::MAX as u64) as i64),
                false => (ANY, ANY),
            };
            s.live = Some(live);
        }
        Ok(obj)
    }

    /// Waits for the operation of `live` where no request is wanted (a blocking `Send` in
    /// place), releasing the GIL.
    pub(crate) fn finish(py: Python<'_>, live: Live) -> PyResult<()> {
        let (got, ended) = py.detach(move || {
            let got = live.wait();
            let ended = live.end(got.is_err());
            (got, ended)
        });
        drop(ended);
        got.map(drop).map_err(to_py)
    }

    /// Completes the operation if it has (waiting for it, up to the communicator's timeout, if
    /// `block`): whether it has. An error completes it too, and is raised.
    fn progress(&self, py: Python<'_>, block: bool) -> PyResult<bool> {
        let (got, ended) = {
            let mut s = lock(&self.state);
            let Some(live) = s.live.as_ref() else {
                return Ok(true);
            };
            match live.test() {
                Ok(None) => (Ok(None), Ended::Kept),
                got => {
                    let got = got.map(|n| n.unwrap_or(0));
                    let ended = s.end(&got);
                    (got.map(Some), ended)
                }
            }
        };
        drop(ended); // with the GIL, which releasing a buffer takes
        match got.map_err(to_py)? {
            Some(_) => return Ok(true),
            None if !block => return Ok(false),
            None => {}
        }
        let state = &self.state;
        let (got, ended) = py.detach(|| {
            let mut s = lock(state);
            let Some(live) = s.live.as_ref() else {
                return (Ok(0), Ended::Kept); // completed by another thread meanwhile
            };
            let got = live.wait();
            let ended = s.end(&got);
            (got, ended)
        });
        drop(ended);
        got.map(|_| true).map_err(to_py)
    }

    /// Fills `status` (where given) in for the completed operation.
    fn report(&self, status: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let Some(status) = status.filter(|s| !s.is_none()) else {
            return Ok(());
        };
        let (source, tag, count) = {
            let s = lock(&self.state);
            (s.source, s.tag, s.count)
        };
        status.call_method1(intern!(status.py(), "_set"), (source, tag, count))?;
        Ok(())
    }

    fn pending(&self) -> bool {
        lock(&self.state).live.is_some()
    }
}

#[pymethods]
impl PyRequest {
    /// A completed request (kolo.MPI makes pending ones natively).
    #[new]
    fn new() -> Self {
        PyRequest {
            state: Mutex::new(State {
                live: None,
                source: ANY,
                tag: ANY,
                count: 0,
            }),
        }
    }

    /// Whether the operation is still pending.
    #[getter]
    fn _pending(&self) -> bool {
        self.pending()
    }

    fn __bool__(&self) -> bool {
        self.pending()
    }

    /// Completes the operation if it can (waiting for it if `block`): whether it has.
    fn _progress(&self, py: Python<'_>, block: bool) -> PyResult<bool> {
        self.progress(py, block)
    }

    /// Fills `status` in for the completed operation.
    fn _report(&self, status: &Bound<'_, PyAny>) -> PyResult<()> {
        self.report(Some(status))
    }

    /// Waits for the operation to complete (MPI's `Wait`); `True`.
    #[pyo3(name = "Wait", signature = (status=None))]
    fn wait_(&self, py: Python<'_>, status: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        self.progress(py, true)?;
        self.report(status)?;
        Ok(true)
    }

    /// Whether the operation has completed (completing it if it has: MPI's `Test`).
    #[pyo3(name = "Test", signature = (status=None))]
    fn test_(&self, py: Python<'_>, status: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        if !self.progress(py, false)? {
            return Ok(false);
        }
        self.report(status)?;
        Ok(true)
    }

    /// `Wait`, returning the received object: `None` (a buffer's operation has none).
    #[pyo3(signature = (status=None))]
    fn wait(&self, py: Python<'_>, status: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        self.wait_(py, status).map(drop)
    }

    /// `Test`, as `(flag, None)`.
    #[pyo3(signature = (status=None))]
    fn test(
        &self,
        py: Python<'_>,
        status: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(bool, Option<()>)> {
        Ok((self.test_(py, status)?, None))
    }

    /// Whether the operation has completed, filling `status` in if it has.
    #[pyo3(name = "Get_status", signature = (status=None))]
    fn get_status(&self, py: Python<'_>, status: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        self.test_(py, status)
    }

    /// Lets the request go: waits for its operation (the buffer stays in use until then).
    #[pyo3(name = "Free")]
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        self.progress(py, true).map(drop)
    }
}

impl Drop for PyRequest {
    /// A request dropped while pending: a receive is withdrawn (nothing is written into its
    /// buffer once it is released); a send waits for the receiver's copy first (MPI's
    /// `Request.Free`: the buffer's memory must not go away under the copy).
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let Some(live) = s.live.take() else {
            return;
        };
        let failed = match &live {
            Live::Recv { .. } => false,
            Live::Send { comm, send, .. } => {
                let wait = || comm.wait_in_place(send);
                Python::try_attach(|py| py.detach(wait))
                    .unwrap_or_else(wait)
                    .is_err()
            }
        };
        drop(live.end(failed));
    }
}

/// Waits for every request of `requests` in turn, as their `Wait`s would (kolo.MPI's
/// `Request.Waitall` without statuses): native requests here, any other through its `Wait`. An
/// error is raised at the request that failed; those after it stay pending.
#[pyfunction]
pub(crate) fn wait_all(py: Python<'_>, requests: &Bound<'_, PyList>) -> PyResult<()> {
    let mut i = 0;
    // The list may change under a `Wait` called back into Python: read it item by item.
    while let Ok(r) = requests.get_item(i) {
        match r.cast::<PyRequest>() {
            Ok(native) => {
                native.get().progress(py, true)?;
            }
            Err(_) => {
                r.call_method0(intern!(py, "Wait"))?;
            }
        }
        i += 1;
    }
    Ok(())
}
