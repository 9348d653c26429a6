//! kolo.MPI's `Send`, `Isend` and `Recv` of the common case in one native call: a message
//! `[buf, count, datatype]` or `[buf, datatype]` (a list or a tuple) or a buffer alone, one rank
//! and one tag (no wildcard, no `PROC_NULL`); for `Isend`, a message below the size that goes in
//! place (`Send` sends that in place and waits for it, as kolo.MPI's method would). The
//! checks kolo.MPI's Python methods make on that form are made here, on the same rules (the same
//! buffer checks and errors: [`hold_bytes`] is what their native calls do), without the Python
//! code's cost per call — about half of a small message's time. Any other form is left to those
//! methods (`mpi_send` answers `False`, `mpi_recv` `None`), which read it and name what is wrong
//! with it.

use kolo::{CollectiveBuffer, Status};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyFloat, PyInt, PyList, PyTuple, PyType};

use crate::buffer::{hold_bytes, Held, Source};
use crate::comm::PyCommunicator;
use crate::request::PyRequest;
use crate::run::Direction;

/// kolo.MPI's `Datatype` class, registered when kolo.MPI is imported.
static DATATYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// Registers kolo.MPI's `Datatype` class: the datatype of the messages `mpi_send` and `mpi_recv`
/// read (a later class, from a reloaded module, is not registered: its messages take the
/// Python path).
#[pyfunction]
pub(crate) fn register_mpi_datatype(cls: &Bound<'_, PyType>) {
    let _ = DATATYPE.set(cls.py(), cls.clone().unbind());
}

/// `v` as a rank or a tag of the common case: an `int` (not a `bool`) or a whole `float` (as
/// kolo.MPI takes them: mpi4py's `osu_multi_lat.py` computes its partner as `rank + size / 2`),
/// 0 or more.
fn plain(v: &Bound<'_, PyAny>) -> Option<u64> {
    if v.is_exact_instance_of::<PyInt>() {
        return v.extract::<u64>().ok();
    }
    if !v.is_exact_instance_of::<PyFloat>() {
        return None;
    }
    let f = v.extract::<f64>().ok()?;
    // Below 2^53 every whole float is exact; a larger one takes the Python path.
    (f >= 0.0 && f.fract() == 0.0 && f < 9_007_199_254_740_992.0).then_some(f as u64)
}

/// The buffer of the message `msg` and its length in bytes (`None`: the whole buffer) where it is
/// `[buf, count, datatype]` with an `int` count of 0 or more and a registered `Datatype`,
/// `[buf, datatype]` (the whole buffer), or a buffer alone (neither a list, a tuple nor `None`);
/// `None` for any other form.
fn simple<'py>(msg: &Bound<'py, PyAny>) -> PyResult<Option<(Bound<'py, PyAny>, Option<usize>)>> {
    let (buf, count, datatype) = if let Ok(l) = msg.cast_exact::<PyList>() {
        match l.len() {
            2 => (l.get_item(0)?, None, l.get_item(1)?),
            3 => (l.get_item(0)?, Some(l.get_item(1)?), l.get_item(2)?),
            _ => return Ok(None),
        }
    } else if let Ok(t) = msg.cast_exact::<PyTuple>() {
        match t.len() {
            2 => (t.get_item(0)?, None, t.get_item(1)?),
            3 => (t.get_item(0)?, Some(t.get_item(1)?), t.get_item(2)?),
            _ => return Ok(None),
        }
    } else if msg.is_none() || msg.is_instance_of::<PyList>() || msg.is_instance_of::<PyTuple>() {
        return Ok(None);
    } else {
        return Ok(Some((msg.clone(), None)));
    };
    let Some(class) = DATATYPE.get(msg.py()) else {
        return Ok(None);
    };
    if buf.is_none() || !datatype.get_type().is(class.bind(msg.py())) {
        return Ok(None);
    }
    let Some(count) = count else {
        return Ok(Some((buf, None)));
    };
    // The count is an int, as kolo.MPI reads it (not a float, unlike a rank or a tag).
    let count = match count.is_exact_instance_of::<PyInt>() {
        true => count.extract::<u64>().ok(),
        false => None,
    };
    let (Some(count), Ok(size)) = (
        count,
        datatype
            .getattr(intern!(msg.py(), "size"))?
            .extract::<u64>(),
    ) else {
        return Ok(None);
    };
    let bytes = count
        .checked_mul(size)
        .and_then(|b| usize::try_from(b).ok());
    Ok(bytes.map(|b| (buf, Some(b))))
}

/// The message `msg` held (writable for a receive: `write`), the rank and the tag, where the call
/// is the common case and the message is shorter than `limit` bytes (where given); `None` where
/// it is not (a message whose length the form gives is not held for nothing).
fn common(
    msg: &Bound<'_, PyAny>,
    rank: &Bound<'_, PyAny>,
    tag: &Bound<'_, PyAny>,
    write: bool,
    limit: Option<usize>,
) -> PyResult<Option<(Held, usize, u64)>> {
    let (Some(rank), Some(tag)) = (
        plain(rank).and_then(|r| usize::try_from(r).ok()),
        plain(tag),
    ) else {
        return Ok(None);
    };
    let Some((obj, count)) = simple(msg)? else {
        return Ok(None);
    };
    let fits = |bytes: usize| limit.is_none_or(|l| bytes < l);
    if !count.is_none_or(fits) {
        return Ok(None);
    }
    let h = hold_bytes(&obj, count, "buf", write)?;
    Ok(fits(h.region.count).then_some((h, rank, tag)))
}

impl PyCommunicator {
    /// Whether a message of the held bytes goes in place (the transport's in-place size or more).
    fn goes_in_place(&self, h: &Held) -> bool {
        self.comm
            .in_place_min()
            .is_some_and(|min| h.region.count >= min)
    }

    /// Sends the held bytes to `dest` with `tag`, buffered (done when this returns).
    fn send_buffered(&self, py: Python<'_>, h: Held, dest: usize, tag: u64) -> PyResult<()> {
        let source = Source::<u8>::alone(h)?;
        self.p2p(py, None, source, Direction::Send, move |c, s| {
            c.send(s.elements(), dest, tag)
        })
    }
}

#[pymethods]
impl PyCommunicator {
    /// kolo.MPI's `Send(buf, dest, tag)` where it is the common case (see the module): sent,
    /// `True`; `False` for any other case, which kolo.MPI's method sends. A message below the
    /// in-place size is sent buffered (done); one of that size or more goes in place, MPI's
    /// rendezvous, and is waited for here: `Send` returns once the receiver has copied it.
    fn mpi_send(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        dest: &Bound<'_, PyAny>,
        tag: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let Some((h, dest, tag)) = common(buf, dest, tag, false, None)? else {
            return Ok(false);
        };
        if !self.goes_in_place(&h) {
            self.send_buffered(py, h, dest, tag)?;
        } else if let Some(sent) = self.send_held_in_place(py, h, dest, tag)? {
            PyRequest::finish(py, sent)?;
        }
        Ok(true)
    }

    /// kolo.MPI's `Isend(buf, dest, tag)` where it is the common case: `True` where it was sent
    /// buffered (its request complete); its pending request where it went in place (a message of
    /// the in-place size); `False` for any other case, which kolo.MPI's method sends.
    fn mpi_isend<'py>(
        &self,
        py: Python<'py>,
        buf: &Bound<'py, PyAny>,
        dest: &Bound<'py, PyAny>,
        tag: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let Some((h, dest, tag)) = common(buf, dest, tag, false, None)? else {
            return Ok(PyBool::new(py, false).to_owned().into_any());
        };
        if !self.goes_in_place(&h) {
            self.send_buffered(py, h, dest, tag)?;
        } else if let Some(sent) = self.send_held_in_place(py, h, dest, tag)? {
            return PyRequest::issue(py, sent, dest, tag);
        }
        Ok(PyBool::new(py, true).to_owned().into_any())
    }

    /// kolo.MPI's `Recv(buf, source, tag)` where it is the common case (see the module): the
    /// bytes received into the start of `buf` (MPI's receive: a longer message raises); `None`
    /// for any other case, which kolo.MPI's method receives.
    fn mpi_recv(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        source: &Bound<'_, PyAny>,
        tag: &Bound<'_, PyAny>,
    ) -> PyResult<Option<usize>> {
        let Some((h, src, tag)) = common(buf, source, tag, true, None)? else {
            return Ok(None);
        };
        let got: Option<Status> = self.recv_held(py, h, Some(src), Some(tag), true)?;
        Ok(got.map(|s| s.count))
    }

    /// kolo.MPI's `Irecv(buf, source, tag)` where it is the common case and the transport posts
    /// the receive (the caller knows no receive pending that must match first): its pending
    /// request. `None` for any other case, which kolo.MPI's method receives.
    fn mpi_irecv<'py>(
        &self,
        py: Python<'py>,
        buf: &Bound<'py, PyAny>,
        source: &Bound<'py, PyAny>,
        tag: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some((h, src, tag)) = common(buf, source, tag, true, None)? else {
            return Ok(None);
        };
        self.post_held(py, h, src, tag)
    }
}
