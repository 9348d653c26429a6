//! The agreement step before every collective: the ranks check, with one small all-reduce on the
//! agreement communicator, that they are all in the same call (same fingerprint), and name the
//! first rank that differs when they are not.

use std::os::raw::{c_int, c_void};
use std::time::{Duration, Instant};

use kolo_core::call::fnv1a;
use kolo_core::{Error, Header, Result, HEADER_LEN};
use mpi::ffi;

use crate::types::in_place;

use super::{at, at_mut, MpiEngine};

impl MpiEngine {
    /// Runs the agreement on `header` (see [`kolo_core::Engine::agree`]).
    pub(super) fn agree_on_call(
        &self,
        header: &Header,
        deadline: Instant,
        interrupted: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        let op = header.call.op.name();
        let mine = header.encode();
        let h = fnv1a(&[&mine]);
        // max(h) and max(!h) = !min(h): both equal this rank's values only if every rank has h.
        // Boxed and leaked if the wait is abandoned: MPI may still write it.
        let buf: Box<[u64; 2]> = Box::new([h, !h]);
        let buf = Box::into_raw(buf);
        // SAFETY: a null handle is only an out-parameter placeholder.
        let mut req: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: `buf` holds two u64 and lives until the request completes (or forever).
        let rc = unsafe {
            ffi::MPI_Iallreduce(
                in_place(),
                buf as *mut c_void,
                2,
                ffi::RSMPI_UINT64_T,
                ffi::RSMPI_MAX,
                self.agree.0,
                &mut req,
            )
        };
        if let Err(e) = self.check(op, rc) {
            // SAFETY: MPI did not take the buffer.
            drop(unsafe { Box::from_raw(buf) });
            return Err(e);
        }
        let started = Instant::now();
        let mut spins = 0u32;
        // When a member has exited, the call may still complete (it took part before leaving):
        // give it this long before naming the member.
        let mut closed_grace: Option<(usize, Instant)> = None;
        loop {
            let mut done: c_int = 0;
            // SAFETY: `req` is the request just started.
            let rc = unsafe { ffi::MPI_Test(&mut req, &mut done, ffi::RSMPI_STATUS_IGNORE) };
            self.check(op, rc)?;
            if done != 0 {
                break;
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                interrupted()?;
                if let Some(peer) = self.watch.closed_among(&self.members) {
                    let (peer, since) = *closed_grace.get_or_insert((peer, Instant::now()));
                    if since.elapsed() > Duration::from_secs(1) {
                        return Err(Error::PeerClosed {
                            op,
                            rank: self.rank,
                            peer,
                        });
                    }
                }
                if Instant::now() >= deadline {
                    return Err(Error::Stalled {
                        op,
                        rank: self.rank,
                        call: header.call,
                        waited: started.elapsed(),
                    });
                }
            }
            // Poll (MPI progresses the call in MPI_Test), yielding the core after a few hundred
            // polls; sleep only after a millisecond: a sleep lasts much longer than asked on a
            // busy or virtual machine, and every rank that sleeps here delays the whole call.
            if spins <= 256 {
                std::hint::spin_loop();
            } else if started.elapsed() < Duration::from_millis(1) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        // SAFETY: the request completed; the buffer is ours again.
        let got = *unsafe { Box::from_raw(buf) };
        if got == [h, !h] {
            return Ok(());
        }
        Err(self.explain(header, &mine))
    }

    /// The mismatch behind a failed agreement: every rank's header, first differing rank named.
    pub(super) fn explain(&self, header: &Header, mine: &[u8; HEADER_LEN]) -> Error {
        let mut all = vec![0u8; HEADER_LEN * self.size];
        // SAFETY: `mine` has HEADER_LEN bytes, `all` HEADER_LEN per rank of the communicator.
        let rc = unsafe {
            ffi::MPI_Allgather(
                at(mine),
                HEADER_LEN as c_int,
                ffi::RSMPI_UINT8_T,
                at_mut(&mut all),
                HEADER_LEN as c_int,
                ffi::RSMPI_UINT8_T,
                self.agree.0,
            )
        };
        if let Err(e) = self.check(header.call.op.name(), rc) {
            return e;
        }
        kolo_core::disagreement(header, self.rank, &all)
    }
}
