//! `kolo._kolo.Communicator`: a kolo communicator for Python. Every operation takes buffers
//! (see [`crate::buffer`]) and works on their memory in place; with `done=None` it blocks
//! (releasing the GIL) and raises on failure, with a callable `done` it returns at once and the
//! worker thread calls `done(None)` or `done(exception)` when it finishes.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use kolo::Communicator;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::args::{pair, parse_op, parse_opt_dtype, source, typed};
use crate::buffer::{hold, hold_opt, Held};
use crate::errors::{to_py, KoloError};
use crate::worker::Worker;

/// A kolo communicator and the worker thread its operations run on.
#[pyclass(name = "Communicator", module = "kolo._kolo", frozen)]
#[derive(Debug)]
pub(crate) struct PyCommunicator {
    comm: Arc<Communicator>,
    worker: Arc<Worker>,
}

/// Every communicator made in this process, for [`shutdown_all`].
static LIVE: Mutex<Vec<(Weak<Worker>, Weak<Communicator>)>> = Mutex::new(Vec::new());

/// Ends every communicator's work before the interpreter finalizes (the package registers it with
/// `atexit`): queued operations get `grace` to finish (their completions still run Python code;
/// a thread that reaches for the GIL during finalization is ended by CPython mid-call, which
/// aborts the process); those still waiting then are aborted (failing at once), and every worker
/// is joined.
pub(crate) fn shutdown_all(py: Python<'_>, grace: Duration) {
    let live: Vec<_> = LIVE
        .lock()
        .map(|mut l| std::mem::take(&mut *l))
        .unwrap_or_default();
    py.detach(|| {
        let deadline = Instant::now() + grace;
        for (worker, comm) in &live {
            let Some(worker) = worker.upgrade() else {
                continue;
            };
            if !worker.drain(deadline) {
                if let Some(comm) = comm.upgrade() {
                    comm.abort(&format!(
                        "rank {} is exiting with operations still running",
                        comm.rank()
                    ));
                }
            }
            worker.close();
        }
    });
}

impl PyCommunicator {
    /// Wraps `comm`, starting its worker thread.
    pub(crate) fn wrap(comm: Communicator) -> PyResult<Self> {
        let worker = Arc::new(Worker::start(format!("kolo-rank{}", comm.rank()))?);
        let comm = Arc::new(comm);
        if let Ok(mut live) = LIVE.lock() {
            live.retain(|(w, _)| w.strong_count() > 0);
            live.push((Arc::downgrade(&worker), Arc::downgrade(&comm)));
        }
        Ok(PyCommunicator { comm, worker })
    }

    /// Runs `f` on the worker and waits for it (the GIL released; Ctrl-C still raises), handing
    /// the held buffers back to drop here.
    fn blocking<R: Send + 'static>(
        &self,
        py: Python<'_>,
        held: Vec<Held>,
        f: impl FnOnce(&Communicator) -> kolo::Result<R> + Send + 'static,
    ) -> PyResult<R> {
        // Nothing queued: run it here, without the GIL.
        let worker = self.worker.clone();
        let comm = self.comm.clone();
        let mut f = Some(f);
        let inline = py.detach(|| {
            worker.run_inline(|| match f.take() {
                Some(f) => f(&comm),
                None => Err(kolo::Error::Unsupported {
                    what: "an operation run twice".into(),
                }),
            })
        });
        if let Some(r) = inline {
            drop(held);
            return r.map_err(to_py);
        }
        let Some(f) = f else {
            return Err(KoloError::new_err("internal: the operation was consumed"));
        };
        let (tx, rx) = mpsc::sync_channel::<(kolo::Result<R>, Vec<Held>)>(1);
        self.worker.submit(Box::new(move || {
            let r = f(&comm);
            // The caller may have stopped waiting (an interrupt): the buffers are then released
            // here.
            let _ = tx.send((r, held));
        }))?;
        let mut rx = rx;
        loop {
            // The receiver moves into the GIL-free closure and back (it is not `Sync`).
            let (got, back) = py.detach(move || (rx.recv_timeout(Duration::from_millis(100)), rx));
            rx = back;
            match got {
                Ok((r, held)) => {
                    drop(held);
                    return r.map_err(to_py);
                }
                Err(RecvTimeoutError::Timeout) => py.check_signals()?,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(KoloError::new_err(format!(
                        "rank {}: the operation ended without a result (its worker failed)",
                        self.comm.rank()
                    )))
                }
            }
        }
    }

    /// Queues `f`; the worker calls `done(None)` or `done(exception)` when it finishes.
    fn queue(
        &self,
        held: Vec<Held>,
        done: Py<PyAny>,
        f: impl FnOnce(&Communicator) -> kolo::Result<()> + Send + 'static,
    ) -> PyResult<()> {
        let comm = self.comm.clone();
        self.worker.submit(Box::new(move || {
            let r = f(&comm);
            // After the interpreter has finalized (shutdown was skipped) there is nobody to tell.
            let _ = Python::try_attach(|py| {
                drop(held);
                let arg = match r {
                    Ok(()) => py.None(),
                    Err(e) => to_py(e).into_value(py).into_any(),
                };
                if let Err(e) = done.call1(py, (arg,)) {
                    e.write_unraisable(py, Some(done.bind(py)));
                }
            });
        }))
    }

    /// [`Self::blocking`] or [`Self::queue`], as `done` asks.
    fn op(
        &self,
        py: Python<'_>,
        held: Vec<Held>,
        done: Option<Py<PyAny>>,
        f: impl FnOnce(&Communicator) -> kolo::Result<()> + Send + 'static,
    ) -> PyResult<()> {
        match done {
            None => self.blocking(py, held, f),
            Some(d) => self.queue(held, d, f),
        }
    }
}

impl Drop for PyCommunicator {
    fn drop(&mut self) {
        let worker = self.worker.clone();
        // Queued operations finish (their completions take the GIL, so wait without it).
        if Python::try_attach(|py| py.detach(|| worker.close())).is_none() {
            worker.close();
        }
    }
}

#[pymethods]
impl PyCommunicator {
    /// This process's rank in the communicator.
    #[getter]
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Number of ranks.
    #[getter]
    fn size(&self) -> usize {
        self.comm.size()
    }

    /// Rank among the ranks of this host.
    #[getter]
    fn local_rank(&self) -> usize {
        self.comm.local_rank()
    }

    /// Number of ranks on this host.
    #[getter]
    fn local_size(&self) -> usize {
        self.comm.local_size()
    }

    /// The transport: `local`, `shm`, `tcp` or `hybrid`.
    #[getter]
    fn transport(&self) -> &'static str {
        self.comm.transport_kind()
    }

    /// Where collectives run: `kolo` or an engine's name.
    #[getter]
    fn backend(&self) -> &'static str {
        self.comm.backend()
    }

    /// Why this communicator failed, if it has.
    fn failure(&self) -> Option<String> {
        self.comm.failure().map(|e| e.to_string())
    }

    /// Fails this communicator and every peer's pending and later operations with an error
    /// naming this rank and `reason`.
    fn abort(&self, reason: &str) {
        self.comm.abort(reason);
    }

    /// Lets queued operations finish and stops the worker; later operations raise.
    fn close(&self, py: Python<'_>) {
        let worker = self.worker.clone();
        py.detach(|| worker.close());
    }

    fn __repr__(&self) -> String {
        format!(
            "<kolo.Communicator rank {} of {} ({})>",
            self.comm.rank(),
            self.comm.size(),
            self.comm.transport_kind()
        )
    }

    #[pyo3(signature = (done=None))]
    fn barrier(&self, py: Python<'_>, done: Option<Py<PyAny>>) -> PyResult<()> {
        self.op(py, vec![], done, |c| c.barrier())
    }

    /// A barrier that names the ranks that did not arrive within `timeout` seconds.
    fn monitored_barrier(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        if !(timeout.is_finite() && timeout > 0.0) {
            return Err(PyValueError::new_err(format!(
                "timeout: expected a positive number of seconds, got {timeout}"
            )));
        }
        self.blocking(py, vec![], move |c| {
            c.monitored_barrier(Duration::from_secs_f64(timeout))
        })
    }

    #[pyo3(signature = (buf, root, dtype=None, done=None))]
    fn broadcast(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        root: usize,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let h = hold(buf, parse_opt_dtype(dtype)?, "buf", true)?;
        let r = h.region;
        self.op(py, vec![h], done, move |c| {
            // SAFETY: the buffer is held by this job and nothing else references it.
            typed!(r.dtype, T => c.broadcast(unsafe { r.slice_mut::<T>() }, root))
        })
    }

    #[pyo3(signature = (buf, op="sum", dtype=None, done=None))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        op: &str,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let op = parse_op(op)?;
        let h = hold(buf, parse_opt_dtype(dtype)?, "buf", true)?;
        let r = h.region;
        self.op(py, vec![h], done, move |c| {
            // SAFETY: the buffer is held by this job and nothing else references it.
            typed!(r.dtype, T => c.all_reduce(unsafe { r.slice_mut::<T>() }, op))
        })
    }

    #[pyo3(signature = (buf, root, op="sum", dtype=None, done=None))]
    fn reduce(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        root: usize,
        op: &str,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let op = parse_op(op)?;
        let h = hold(buf, parse_opt_dtype(dtype)?, "buf", true)?;
        let r = h.region;
        self.op(py, vec![h], done, move |c| {
            // SAFETY: the buffer is held by this job and nothing else references it.
            typed!(r.dtype, T => c.reduce(unsafe { r.slice_mut::<T>() }, op, root))
        })
    }

    #[pyo3(signature = (send, recv, dtype=None, done=None))]
    fn all_gather(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let (held, s, r) = pair(send, recv, dtype)?;
        self.op(py, held, done, move |c| {
            typed!(s.dtype, T => {
                // SAFETY: both buffers are held by this job; `source` copies overlapping input.
                let src = unsafe { source::<T>(s, r) };
                c.all_gather(&src, unsafe { r.slice_mut::<T>() })
            })
        })
    }

    #[pyo3(signature = (send, recv, counts, dtype=None, done=None))]
    fn all_gather_v(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        counts: Vec<usize>,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let (held, s, r) = pair(send, recv, dtype)?;
        self.op(py, held, done, move |c| {
            typed!(s.dtype, T => {
                // SAFETY: both buffers are held by this job; `source` copies overlapping input.
                let src = unsafe { source::<T>(s, r) };
                c.all_gather_v(&src, unsafe { r.slice_mut::<T>() }, &counts)
            })
        })
    }

    #[pyo3(signature = (send, recv, op="sum", dtype=None, done=None))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        op: &str,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let op = parse_op(op)?;
        let (held, s, r) = pair(send, recv, dtype)?;
        self.op(py, held, done, move |c| {
            typed!(s.dtype, T => {
                // SAFETY: both buffers are held by this job; `source` copies overlapping input.
                let src = unsafe { source::<T>(s, r) };
                c.reduce_scatter(&src, unsafe { r.slice_mut::<T>() }, op)
            })
        })
    }

    /// Every rank's `send` into `recv` on `root` (`recv` may be `None` elsewhere); with `counts`,
    /// one count per rank.
    #[pyo3(signature = (send, recv, root, counts=None, dtype=None, done=None))]
    #[allow(clippy::too_many_arguments)]
    fn gather(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: Option<&Bound<'_, PyAny>>,
        root: usize,
        counts: Option<Vec<usize>>,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let hs = hold(send, parse_opt_dtype(dtype)?, "send", false)?;
        let s = hs.region;
        let (hr, r) = hold_opt(recv, s.dtype, "recv", true)?;
        let held = [Some(hs), hr].into_iter().flatten().collect();
        self.op(py, held, done, move |c| {
            typed!(s.dtype, T => {
                // SAFETY: both buffers are held by this job; `source` copies overlapping input.
                let src = unsafe { source::<T>(s, r) };
                let dst = unsafe { r.slice_mut::<T>() };
                match &counts {
                    None => c.gather(&src, dst, root),
                    Some(counts) => c.gather_v(&src, dst, counts, root),
                }
            })
        })
    }

    /// `root`'s `send` in equal parts (or `counts` per rank) into every rank's `recv` (`send`
    /// may be `None` off the root).
    #[pyo3(signature = (send, recv, root, counts=None, dtype=None, done=None))]
    #[allow(clippy::too_many_arguments)]
    fn scatter(
        &self,
        py: Python<'_>,
        send: Option<&Bound<'_, PyAny>>,
        recv: &Bound<'_, PyAny>,
        root: usize,
        counts: Option<Vec<usize>>,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let hr = hold(recv, parse_opt_dtype(dtype)?, "recv", true)?;
        let r = hr.region;
        let (hs, s) = hold_opt(send, r.dtype, "send", false)?;
        let held = [Some(hr), hs].into_iter().flatten().collect();
        self.op(py, held, done, move |c| {
            typed!(s.dtype, T => {
                // SAFETY: both buffers are held by this job; `source` copies overlapping input.
                let src = unsafe { source::<T>(s, r) };
                let dst = unsafe { r.slice_mut::<T>() };
                match &counts {
                    None => c.scatter(&src, dst, root),
                    Some(counts) => c.scatter_v(&src, counts, dst, root),
                }
            })
        })
    }

    /// Part `j` of every rank's `send` to rank `j`; with counts, `send_counts[j]` elements to
    /// rank `j` and `recv_counts[i]` from rank `i`.
    #[pyo3(signature = (send, recv, send_counts=None, recv_counts=None, dtype=None, done=None))]
    #[allow(clippy::too_many_arguments)]
    fn all_to_all(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        send_counts: Option<Vec<usize>>,
        recv_counts: Option<Vec<usize>>,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let counts = match (send_counts, recv_counts) {
            (None, None) => None,
            (Some(s), Some(r)) => Some((s, r)),
            _ => {
                return Err(PyValueError::new_err(
                    "all_to_all: give both send_counts and recv_counts, or neither",
                ))
            }
        };
        let (held, s, r) = pair(send, recv, dtype)?;
        self.op(py, held, done, move |c| {
            typed!(s.dtype, T => {
                // SAFETY: both buffers are held by this job; `source` copies overlapping input.
                let src = unsafe { source::<T>(s, r) };
                let dst = unsafe { r.slice_mut::<T>() };
                match &counts {
                    None => c.all_to_all(&src, dst),
                    Some((sc, rc)) => c.all_to_all_v(&src, sc, dst, rc),
                }
            })
        })
    }

    #[pyo3(signature = (buf, dest, tag=0, dtype=None, done=None))]
    fn send(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        dest: usize,
        tag: u64,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let h = hold(buf, parse_opt_dtype(dtype)?, "buf", false)?;
        let r = h.region;
        self.op(py, vec![h], done, move |c| {
            // SAFETY: the buffer is held by this job and only read.
            typed!(r.dtype, T => c.send(unsafe { r.slice::<T>() }, dest, tag))
        })
    }

    #[pyo3(signature = (buf, src, tag=0, dtype=None, done=None))]
    fn recv(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        src: usize,
        tag: u64,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let h = hold(buf, parse_opt_dtype(dtype)?, "buf", true)?;
        let r = h.region;
        self.op(py, vec![h], done, move |c| {
            // SAFETY: the buffer is held by this job and nothing else references it.
            typed!(r.dtype, T => c.recv(unsafe { r.slice_mut::<T>() }, src, tag))
        })
    }

    /// The next message of bytes from `src` with `tag`, whatever its length.
    #[pyo3(signature = (src, tag=0))]
    fn recv_bytes<'py>(
        &self,
        py: Python<'py>,
        src: usize,
        tag: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let v = self.blocking(py, vec![], move |c| c.recv_vec::<u8>(src, tag))?;
        Ok(PyBytes::new(py, &v))
    }

    /// Ranks passing the same `color` form a new communicator ordered by `key`; `None` joins none.
    #[pyo3(signature = (color, key=0))]
    fn split(&self, py: Python<'_>, color: Option<u32>, key: i64) -> PyResult<Option<Self>> {
        let sub = self.blocking(py, vec![], move |c| c.split(color, key))?;
        sub.map(PyCommunicator::wrap).transpose()
    }

    /// A communicator of `ranks` (in that order); `None` on the ranks not listed.
    fn new_group(&self, py: Python<'_>, ranks: Vec<usize>) -> PyResult<Option<Self>> {
        let sub = self.blocking(py, vec![], move |c| c.new_group(&ranks))?;
        sub.map(PyCommunicator::wrap).transpose()
    }
}
