//! The all-gather of `kolo._kolo.Communicator`: from a send buffer, or in place (MPI's
//! `IN_PLACE`) where no send buffer is given or where the send buffer is this rank's own block of
//! the receive buffer (torch's `all_gather_into_tensor(out, out.chunk(n)[rank])`, FSDP's idiom):
//! then nothing of the rank's own is copied (a send buffer overlapping the receive buffer is
//! otherwise read from a copy).

use pyo3::prelude::*;

use crate::args::typed;
use crate::buffer::{Held, Region, Source, Target};
use crate::comm::PyCommunicator;
use kolo::CollectiveBuffer;

impl PyCommunicator {
    /// The all-gather of `hs` (`None`: in place) into `hr`; with `counts`, one count per rank.
    pub(crate) fn all_gather_held(
        &self,
        py: Python<'_>,
        hs: Option<Held>,
        hr: Held,
        counts: Option<Vec<usize>>,
        done: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let queued = counts.clone();
        match hs {
            Some(hs) if !self.own_block(&hs.region, &hr.region, counts.as_deref()) => {
                let dt = hs.region.dtype;
                typed!(dt, T => {
                    let bufs = (Source::<T>::new(hs, &hr.region)?, Target::<T>::new(hr)?);
                    self.collective(
                        py,
                        done,
                        bufs,
                        |c, (s, r)| match &counts {
                            None => c.all_gather(s.elements(), r.elements_mut()),
                            Some(n) => c.all_gather_v(s.elements(), r.elements_mut(), n),
                        },
                        |c, (s, r)| c.all_gather_into_async(s, r, queued),
                    )
                })
            }
            _ => {
                let dt = hr.region.dtype;
                typed!(dt, T => self.collective(
                    py,
                    done,
                    Target::<T>::new(hr)?,
                    |c, b| match &counts {
                        None => c.all_gather_in_place(b.elements_mut()),
                        Some(n) => c.all_gather_v_in_place(b.elements_mut(), n),
                    },
                    |c, b| c.all_gather_in_place_async(b, queued),
                ))
            }
        }
    }

    /// Whether `send` is exactly this rank's block of `recv` (equal blocks, or `counts`' blocks
    /// in rank order), a whole block per rank.
    fn own_block(&self, send: &Region, recv: &Region, counts: Option<&[usize]>) -> bool {
        let (rank, n) = (self.comm.rank(), self.comm.size());
        let at = match counts {
            None if send.count * n == recv.count => rank * send.count,
            Some(c)
                if c.len() == n
                    && c[rank] == send.count
                    && c.iter().sum::<usize>() == recv.count =>
            {
                c[..rank].iter().sum()
            }
            _ => return false,
        };
        send.count > 0 && send.is_part_of(recv, at)
    }
}
