//! `kolo._kolo.Communicator`: a kolo communicator for Python. Every operation takes buffers
//! (see [`crate::buffer`]) and works on their memory in place; with `done=None` it blocks
//! (releasing the GIL) and raises on failure, with a callable `done` it returns at once and
//! `done(None)` or `done(exception)` is called when it completes (how, in [`crate::run`]).

use std::sync::Arc;
use std::time::Instant;

use kolo::{CollectiveBuffer, Communicator};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::args::{pair, typed};
use crate::buffer::{hold, hold_opt, reduced, Held, Reduced, Source, Target};
use crate::names::{parse_op, parse_opt_dtype};
use crate::objects::Pickled;
use crate::run::{register, Lane};

/// A kolo communicator and the state of its asynchronous operations.
#[pyclass(name = "Communicator", module = "kolo._kolo", frozen)]
#[derive(Debug)]
pub(crate) struct PyCommunicator {
    pub(crate) comm: Arc<Communicator>,
    pub(crate) lane: Arc<Lane>,
}

impl PyCommunicator {
    /// Wraps `comm`.
    pub(crate) fn wrap(comm: Communicator) -> PyResult<Self> {
        let comm = Arc::new(comm);
        let lane = Arc::new(Lane::default());
        register(&lane, &comm);
        Ok(PyCommunicator { comm, lane })
    }

    /// Gather (`scatter`: scatter) of the held `(send, recv)` at `root`, with `counts` per rank
    /// or equal parts.
    fn rooted(
        &self,
        py: Python<'_>,
        (hs, hr): (Held, Held),
        (root, counts): (usize, Option<Vec<usize>>),
        done: Option<Py<PyAny>>,
        scatter: bool,
    ) -> PyResult<()> {
        let dt = hr.region.dtype;
        typed!(dt, T => {
            let bufs = (Source::<T>::new(hs, &hr.region)?, Target::<T>::new(hr)?);
            let queued_counts = counts.clone();
            self.collective(
                py,
                done,
                bufs,
                |c, (s, r)| {
                    let (s, r) = (s.elements(), r.elements_mut());
                    match (&counts, scatter) {
                        (None, false) => c.gather(s, r, root),
                        (Some(n), false) => c.gather_v(s, r, n, root),
                        (None, true) => c.scatter(s, r, root),
                        (Some(n), true) => c.scatter_v(s, n, r, root),
                    }
                },
                |c, (s, r)| match scatter {
                    false => c.gather_into_async(s, r, queued_counts, root),
                    true => c.scatter_into_async(s, r, queued_counts, root),
                },
            )
        })
    }
}

impl Drop for PyCommunicator {
    fn drop(&mut self) {
        // Its asynchronous operations complete first (their completions take the GIL, so wait
        // without it), unless this is one of their completions.
        if self.lane.completing_here() {
            return;
        }
        let lane = self.lane.clone();
        if Python::try_attach(|py| py.detach(|| lane.drain(None))).is_none() {
            lane.drain(None);
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

    /// Writes this rank's flight record (its world's last operations) as `rank-R.json` in the
    /// trace directory; returns the file's path.
    fn dump_flight_record(&self, reason: &str) -> PyResult<String> {
        self.comm
            .dump_flight_record(reason)
            .map(|p| p.display().to_string())
            .map_err(|e| {
                pyo3::exceptions::PyOSError::new_err(format!("cannot write the flight record: {e}"))
            })
    }

    /// Where flight records go (`KOLO_TRACE_DIR`, else the job's directory in the temporary one).
    /// Asking means a Python handler writes the stacks on SIGUSR1: from now on a record written
    /// for a failure raises SIGUSR1 too.
    #[getter]
    fn flight_record_dir(&self) -> String {
        kolo::flight::signal_on_failure(true);
        kolo::flight::trace_dir().display().to_string()
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

    /// Refuses later operations and waits until the asynchronous ones issued have completed
    /// (Ctrl-C raises meanwhile; from one of their completion callbacks it does not wait).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.lane.close();
        if self.lane.completing_here() {
            return Ok(());
        }
        self.lane.drain_interruptibly(py)
    }

    /// Ends this communicator without failing its peers (torch's `destroy_process_group`): later
    /// operations are refused and the asynchronous ones issued get `grace` seconds to finish; only
    /// if some are still running then does it abort (they fail at once, on every rank). Whether
    /// they had all finished.
    #[pyo3(signature = (grace=5.0))]
    fn shutdown(&self, py: Python<'_>, grace: f64) -> PyResult<bool> {
        let grace = crate::grace_arg(grace)?;
        let (lane, comm) = (&*self.lane, Arc::downgrade(&self.comm));
        Ok(py.detach(|| {
            crate::run::end(
                lane,
                &comm,
                Instant::now() + grace,
                grace,
                "shut its process group down",
            )
        }))
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
        self.collective(py, done, (), |c, _| c.barrier(), |c, _| c.barrier_async())
    }

    /// A barrier that names the ranks that did not arrive within `timeout` seconds (0: only the
    /// ranks already there pass, as with Gloo's).
    fn monitored_barrier(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        if timeout.is_nan() || timeout < 0.0 {
            return Err(PyValueError::new_err(format!(
                "timeout: expected a number of seconds, 0 or more, got {timeout}"
            )));
        }
        let timeout = crate::seconds(timeout);
        self.blocking(py, move |c| c.monitored_barrier(timeout))
    }

    #[pyo3(signature = (buf, root, dtype=None, done=None))]
    fn broadcast(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::args::root)] root: usize,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let h = hold(buf, parse_opt_dtype(dtype)?, "buf", true)?;
        let dt = h.region.dtype;
        typed!(dt, T => self.collective(
            py,
            done,
            Target::<T>::new(h)?,
            |c, b| c.broadcast(b.elements_mut(), root),
            |c, b| c.broadcast_async(b, root),
        ))
    }

    /// Reduces `buf` in place over every rank; with `send`, `send`'s elements are copied into
    /// `buf` first (MPI's separate send and receive buffers).
    #[pyo3(signature = (buf, op="sum", dtype=None, done=None, send=None))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        op: &str,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
        send: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let op = parse_op(op)?;
        let (h, hs, dt) = reduced(Some(buf), send, parse_opt_dtype(dtype)?)?;
        typed!(dt, T => self.collective(
            py,
            done,
            Reduced::<T>::new(h, hs)?,
            |c, b| c.all_reduce(b.elements_mut(), op),
            |c, b| c.all_reduce_async(b, op),
        ))
    }

    /// Reduces, blocking, `count` elements of `dtype` at memory address `address` in place
    /// (private: the torch backend's path for a dense CPU tensor, whose `data_ptr()` it passes;
    /// the memory must stay valid and untouched by other threads until the call returns).
    fn _all_reduce_address(
        &self,
        py: Python<'_>,
        address: usize,
        count: usize,
        dtype: &str,
        op: &str,
    ) -> PyResult<()> {
        self.all_reduce_address(py, address, count, dtype, op)
    }

    /// Reduces `buf` in place to `root`; with `send`, `send`'s elements are copied into `buf`
    /// first, or, without `buf` (off the root), into memory of kolo's (`send` stays as it was).
    #[pyo3(signature = (buf, root, op="sum", dtype=None, done=None, send=None))]
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        py: Python<'_>,
        buf: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = crate::args::root)] root: usize,
        op: &str,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
        send: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let op = parse_op(op)?;
        let (h, hs, dt) = reduced(buf, send, parse_opt_dtype(dtype)?)?;
        typed!(dt, T => self.collective(
            py,
            done,
            Reduced::<T>::new(h, hs)?,
            |c, b| c.reduce(b.elements_mut(), op, root),
            |c, b| c.reduce_async(b, op, root),
        ))
    }

    /// Every rank's `send` into `recv`; with `counts`, one count per rank. With `send` `None`,
    /// or `send` this rank's own block of `recv`, in place (MPI's `IN_PLACE`; see
    /// [`crate::gather`]).
    #[pyo3(signature = (send, recv, counts=None, dtype=None, done=None))]
    fn all_gather(
        &self,
        py: Python<'_>,
        send: Option<&Bound<'_, PyAny>>,
        recv: &Bound<'_, PyAny>,
        counts: Option<Vec<usize>>,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let (hs, hr) = match send {
            Some(send) => pair(send, recv, dtype).map(|(hs, hr)| (Some(hs), hr))?,
            None => (None, hold(recv, parse_opt_dtype(dtype)?, "recv", true)?),
        };
        self.all_gather_held(py, hs, hr, counts, done)
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
        let (hs, hr) = pair(send, recv, dtype)?;
        let dt = hs.region.dtype;
        typed!(dt, T => {
            let bufs = (Source::<T>::new(hs, &hr.region)?, Target::<T>::new(hr)?);
            self.collective(
                py,
                done,
                bufs,
                |c, (s, r)| c.reduce_scatter(s.elements(), r.elements_mut(), op),
                |c, (s, r)| c.reduce_scatter_into_async(s, r, op),
            )
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
        #[pyo3(from_py_with = crate::args::root)] root: usize,
        counts: Option<Vec<usize>>,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let hs = hold(send, parse_opt_dtype(dtype)?, "send", false)?;
        let hr = hold_opt(recv, hs.region.dtype, "recv", true)?;
        self.rooted(py, (hs, hr), (root, counts), done, false)
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
        #[pyo3(from_py_with = crate::args::root)] root: usize,
        counts: Option<Vec<usize>>,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let hr = hold(recv, parse_opt_dtype(dtype)?, "recv", true)?;
        let hs = hold_opt(send, hr.region.dtype, "send", false)?;
        self.rooted(py, (hs, hr), (root, counts), done, true)
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
        let (hs, hr) = pair(send, recv, dtype)?;
        let dt = hs.region.dtype;
        typed!(dt, T => {
            let bufs = (Source::<T>::new(hs, &hr.region)?, Target::<T>::new(hr)?);
            let queued_counts = counts.clone();
            self.collective(
                py,
                done,
                bufs,
                |c, (s, r)| match &counts {
                    None => c.all_to_all(s.elements(), r.elements_mut()),
                    Some((sc, rc)) => c.all_to_all_v(s.elements(), sc, r.elements_mut(), rc),
                },
                |c, (s, r)| c.all_to_all_into_async(s, r, queued_counts),
            )
        })
    }

    /// `data` (bytes, on `root`; `None` elsewhere) on every rank: kolo's `broadcast_object` on
    /// the bytes of a pickled object.
    #[pyo3(signature = (data, root))]
    fn broadcast_bytes<'py>(
        &self,
        py: Python<'py>,
        data: Option<Vec<u8>>,
        #[pyo3(from_py_with = crate::args::root)] root: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let v = self.blocking(py, move |c| c.broadcast_object(data.map(Pickled), root))?;
        Ok(PyBytes::new(py, &v.0))
    }

    /// Every rank's `data` in rank order: kolo's `all_gather_object` on pickled bytes.
    fn all_gather_bytes<'py>(
        &self,
        py: Python<'py>,
        data: Vec<u8>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let all = self.blocking(py, move |c| c.all_gather_object(&Pickled(data)))?;
        Ok(all.iter().map(|p| PyBytes::new(py, &p.0)).collect())
    }

    /// Every rank's `data` in rank order on `root`, `None` elsewhere: kolo's `gather_object` on
    /// pickled bytes.
    fn gather_bytes<'py>(
        &self,
        py: Python<'py>,
        data: Vec<u8>,
        #[pyo3(from_py_with = crate::args::root)] root: usize,
    ) -> PyResult<Option<Vec<Bound<'py, PyBytes>>>> {
        let all = self.blocking(py, move |c| c.gather_object(&Pickled(data), root))?;
        Ok(all.map(|all| all.iter().map(|p| PyBytes::new(py, &p.0)).collect()))
    }

    /// Ranks passing the same `color` form a new communicator ordered by `key`; `None` joins none.
    #[pyo3(signature = (color, key=0))]
    fn split(&self, py: Python<'_>, color: Option<u32>, key: i64) -> PyResult<Option<Self>> {
        let sub = self.blocking(py, move |c| c.split(color, key))?;
        sub.map(PyCommunicator::wrap).transpose()
    }

    /// A communicator of `ranks` (in that order); `None` on the ranks not listed.
    fn new_group(&self, py: Python<'_>, ranks: Vec<usize>) -> PyResult<Option<Self>> {
        let sub = self.blocking(py, move |c| c.new_group(&ranks))?;
        sub.map(PyCommunicator::wrap).transpose()
    }
}
