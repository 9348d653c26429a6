//! The point-to-point methods of `kolo._kolo.Communicator`: sends (buffered, or in place for
//! kolo.MPI's large ones: [`crate::in_place`]) and receives into a buffer or as bytes, from one
//! rank or any, with one tag or any (MPI's `ANY_SOURCE` and `ANY_TAG`), waiting or not, posted
//! or not ([`crate::posted`]); kolo.MPI's common `Send`/`Recv` in one call: [`crate::mpi_p2p`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use kolo::{CollectiveBuffer, DType, Source, Status, TagMatch};
use pyo3::exceptions::PyBaseException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCFunction, PyDict, PyList, PyTuple};

use crate::args::typed;
use crate::buffer::{self, hold, Held, Target};
use crate::comm::PyCommunicator;
use crate::names::parse_opt_dtype;
use crate::run::Direction;

fn source(src: Option<usize>) -> Source {
    src.map_or(Source::Any, Source::Rank)
}

fn tag_match(tag: Option<u64>) -> TagMatch {
    tag.map_or(TagMatch::Any, TagMatch::Value)
}

impl PyCommunicator {
    /// Receives the first message from `src` with `tag` (`None`: any) into the start of `buf`
    /// (MPI's receive: a shorter message leaves the rest as it was); with `wait=false`, `None` at
    /// once when none has arrived. One source and one tag take the posted path (the payload
    /// straight into `buf` where the transport can).
    pub(crate) fn recv_into(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        src: Option<usize>,
        tag: Option<u64>,
        dtype: Option<&str>,
        wait: bool,
    ) -> PyResult<Option<Status>> {
        let h = hold(buf, parse_opt_dtype(dtype)?, "buf", true)?;
        self.recv_held(py, h, src, tag, wait)
    }

    /// [`Self::recv_into`] of a buffer already held.
    pub(crate) fn recv_held(
        &self,
        py: Python<'_>,
        h: Held,
        src: Option<usize>,
        tag: Option<u64>,
        wait: bool,
    ) -> PyResult<Option<Status>> {
        let dt = h.region.dtype;
        typed!(dt, T => {
            let mut target = Target::<T>::new(h)?;
            let into = &mut target;
            let got = self.blocking_after(py, Some(Direction::Recv), move |c| {
                let buf = into.elements_mut();
                let status = |count| Status { source: src.unwrap_or(0), tag: tag.unwrap_or(0), count };
                match (src, tag, wait) {
                    (Some(s), Some(t), true) => c.recv_upto(buf, s, t).map(|n| Some(status(n))),
                    (Some(s), Some(t), false) => {
                        c.try_recv_upto(buf, s, t).map(|n| n.map(status))
                    }
                    (_, _, true) => c.recv_matching(buf, source(src), tag_match(tag)).map(Some),
                    (_, _, false) => c.try_recv_matching(buf, source(src), tag_match(tag)),
                }
            });
            // Released here, with the GIL (not in the closure, which runs without it).
            drop(target);
            got
        })
    }

    /// The first message of bytes from `src` with `tag` (`None`: any), whatever its length, and
    /// what it matched; with `wait=false`, `None` at once when none has arrived.
    pub(crate) fn recv_message<'py>(
        &self,
        py: Python<'py>,
        src: Option<usize>,
        tag: Option<u64>,
        wait: bool,
    ) -> PyResult<Option<(Status, Bound<'py, PyBytes>)>> {
        let got = self.blocking_after(py, Some(Direction::Recv), move |c| {
            let (Some(s), Some(t)) = (src, tag) else {
                return match wait {
                    true => c
                        .recv_vec_matching::<u8>(source(src), tag_match(tag))
                        .map(Some),
                    false => c.try_recv_vec_matching::<u8>(source(src), tag_match(tag)),
                };
            };
            let status = |v: Vec<u8>| {
                let st = Status {
                    source: s,
                    tag: t,
                    count: v.len(),
                };
                (st, v)
            };
            if wait {
                return c.recv_vec::<u8>(s, t).map(|v| Some(status(v)));
            }
            let mut r = c.irecv::<u8>(s, t, None);
            if r.test() {
                r.wait().map(|v| Some(status(v)))
            } else {
                Ok(None)
            }
        })?;
        Ok(got.map(|(s, v)| (s, PyBytes::new(py, &v))))
    }

    /// The first message with `tag` from any rank into `buf`: its sender (blocking), or, with
    /// `done`, `None` at once and `done(None, sender)` or `done(exception, None)` later.
    pub(crate) fn recv_any_into(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        tag: u64,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Option<usize>> {
        let h = hold(buf, parse_opt_dtype(dtype)?, "buf", true)?;
        let dt = h.region.dtype;
        let sender = Arc::new(AtomicUsize::new(usize::MAX));
        let blocking = done.is_none();
        let done = done
            .map(|d| with_sender(py, d, sender.clone()))
            .transpose()?;
        let s = sender.clone();
        typed!(dt, T => self.p2p(py, done, Target::<T>::new(h)?, Direction::Recv, move |c, b| {
            let src = c.recv_any(b.elements_mut(), tag)?;
            s.store(src, Ordering::SeqCst);
            Ok(())
        }))?;
        Ok(blocking.then(|| sender.load(Ordering::SeqCst)))
    }
}

/// `done` as a completion of one argument (the error or `None`) that calls `done(error, sender)`
/// with the sender stored in `sender` (`None` where the receive failed).
fn with_sender(py: Python<'_>, done: Py<PyAny>, sender: Arc<AtomicUsize>) -> PyResult<Py<PyAny>> {
    let f = PyCFunction::new_closure(
        py,
        Some(c"recv_any_done"),
        None,
        move |args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>| {
            let error = args.get_item(0)?;
            let src = sender.load(Ordering::SeqCst);
            let src = (error.is_none() && src != usize::MAX).then_some(src);
            done.call1(args.py(), (error, src))
        },
    )?;
    Ok(f.into_any().unbind())
}

/// The point-to-point methods of `kolo._kolo.Communicator`.
#[pymethods]
impl PyCommunicator {
    #[pyo3(signature = (buf, dest, tag=0, dtype=None, done=None))]
    fn send(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::args::dest)] dest: usize,
        tag: u64,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let h = hold(buf, parse_opt_dtype(dtype)?, "buf", false)?;
        let dt = h.region.dtype;
        typed!(dt, T => self.p2p(py, done, buffer::Source::<T>::alone(h)?, Direction::Send, move |c, s| {
            c.send(s.elements(), dest, tag)
        }))
    }

    /// The fewest bytes `send_in_place` may send in place (`None`: never, on this transport).
    #[getter]
    fn in_place_min(&self) -> Option<usize> {
        self.comm.in_place_min()
    }

    /// kolo.MPI's send of the bytes of `buf`: in place where the transport can (its pending
    /// request, which holds `buf`), else buffered (`None`: done).
    fn send_in_place<'py>(
        &self,
        py: Python<'py>,
        buf: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = crate::args::dest)] dest: usize,
        tag: u64,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.send_bytes_in_place(py, buf, dest, tag)?
            .map(|live| crate::request::PyRequest::issue(py, live, dest, tag))
            .transpose()
    }

    /// kolo.MPI's `Irecv` into the bytes of `buf`: posted where the transport can (its pending
    /// request, which holds `buf`), else `None` (nothing posted).
    fn post_recv<'py>(
        &self,
        py: Python<'py>,
        buf: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = crate::args::src)] src: usize,
        tag: u64,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.post_bytes(py, buf, src, tag)
    }

    #[pyo3(signature = (buf, src, tag=0, dtype=None, done=None))]
    fn recv(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::args::src)] src: usize,
        tag: u64,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let h = hold(buf, parse_opt_dtype(dtype)?, "buf", true)?;
        let dt = h.region.dtype;
        typed!(dt, T => self.p2p(py, done, Target::<T>::new(h)?, Direction::Recv, move |c, b| {
            c.recv(b.elements_mut(), src, tag)
        }))
    }

    /// Receives the next message from `src` with `tag` into `buf` as MPI does: a message shorter
    /// than the buffer fills its start and leaves the rest as it was, a longer one raises
    /// (`ArgumentError`, MPI's `ERR_TRUNCATE`; the message is consumed). Returns the number of
    /// elements received. With `wait=False` it returns `None` at once when no message has arrived.
    #[pyo3(signature = (buf, src, tag=0, dtype=None, wait=true))]
    fn recv_upto(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::args::src)] src: usize,
        tag: u64,
        dtype: Option<&str>,
        wait: bool,
    ) -> PyResult<Option<usize>> {
        let got = self.recv_into(py, buf, Some(src), Some(tag), dtype, wait)?;
        Ok(got.map(|s| s.count))
    }

    /// `recv_upto` of bytes (waiting) into each of `bufs` in turn, from `src` with `tag`: one
    /// call for a window of receives (kolo.MPI's `Waitall`), the buffers held first and received
    /// in one release of the GIL. Returns the byte counts of those received and, if one failed
    /// (its buffer refused, or its receive), its exception (not raised: the ones before it were
    /// received; the ones after it are not).
    fn recv_upto_each(
        &self,
        py: Python<'_>,
        bufs: &Bound<'_, PyList>,
        from: (usize, u64),
    ) -> (Vec<usize>, Option<Py<PyBaseException>>) {
        let (src, tag) = from;
        let mut targets = Vec::with_capacity(bufs.len());
        let mut failed = None;
        for buf in bufs.iter() {
            match hold(&buf, Some(DType::U8), "buf", true).and_then(Target::<u8>::new) {
                Ok(t) => targets.push(t),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let mut counts = Vec::with_capacity(targets.len());
        if !targets.is_empty() {
            let (into, got) = (&mut targets, &mut counts);
            let r = self.blocking_after(py, Some(Direction::Recv), move |c| {
                for t in into.iter_mut() {
                    got.push(c.recv_upto(t.elements_mut(), src, tag)?);
                }
                Ok(())
            });
            if let Err(e) = r {
                failed = Some(e); // the receive's own: a buffer refused later is not reached
            }
        }
        drop(targets); // released with the GIL
        (counts, failed.map(|e| e.into_value(py)))
    }

    /// Receives the first message from `src` (`None`: any rank) with `tag` (`None`: any tag)
    /// into `buf`, as `recv_upto` does: `(source, tag, elements)`, or `None` at once with
    /// `wait=False` when no such message has arrived (MPI's `ANY_SOURCE` and `ANY_TAG`).
    #[pyo3(signature = (buf, src=None, tag=None, dtype=None, wait=true))]
    fn recv_match(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        src: Option<usize>,
        tag: Option<u64>,
        dtype: Option<&str>,
        wait: bool,
    ) -> PyResult<Option<(usize, u64, usize)>> {
        let got = self.recv_into(py, buf, src, tag, dtype, wait)?;
        Ok(got.map(|s| (s.source, s.tag, s.count)))
    }

    /// The first message with `tag` to arrive from any rank (this one included) into `buf`: the
    /// sender's rank. With `done`, returns `None` at once and calls `done(None, sender)` or
    /// `done(exception, None)` when the receive completes (it is ordered with the other receives).
    #[pyo3(signature = (buf, tag=0, dtype=None, done=None))]
    fn recv_any(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        tag: u64,
        dtype: Option<&str>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<Option<usize>> {
        self.recv_any_into(py, buf, tag, dtype, done)
    }

    /// The next message of bytes from `src` with `tag`, whatever its length; with `wait=False`,
    /// `None` at once when none has arrived.
    #[pyo3(signature = (src, tag=0, wait=true))]
    fn recv_bytes<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = crate::args::src)] src: usize,
        tag: u64,
        wait: bool,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let got = self.recv_message(py, Some(src), Some(tag), wait)?;
        Ok(got.map(|(_, data)| data))
    }

    /// The first message of bytes from `src` (`None`: any rank) with `tag` (`None`: any tag),
    /// whatever its length: `(source, tag, bytes)`; with `wait=False`, `None` at once when none
    /// has arrived.
    #[pyo3(signature = (src=None, tag=None, wait=true))]
    fn recv_bytes_match<'py>(
        &self,
        py: Python<'py>,
        src: Option<usize>,
        tag: Option<u64>,
        wait: bool,
    ) -> PyResult<Option<(usize, u64, Bound<'py, PyBytes>)>> {
        let got = self.recv_message(py, src, tag, wait)?;
        Ok(got.map(|(s, data)| (s.source, s.tag, data)))
    }
}
