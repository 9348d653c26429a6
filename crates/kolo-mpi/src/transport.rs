//! [`MpiTransport`]: kolo's point-to-point messages as MPI messages, buffered like every kolo
//! transport: a send is an `MPI_Isend` of the payload followed by kolo's header, completed in the
//! background; receives drain whatever has arrived (matched probe + `MPI_Mrecv`) into a mailbox.

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use kolo_core::{
    Header, LinkFailure, Mailbox, Message, RecvError, Result, Tag, Transport, HEADER_LEN,
};
use mpi::ffi;

use crate::runtime::{self, Comm, Watch};

/// MPI tag of kolo messages.
const DATA: c_int = 1;
/// MPI tag of an abort notice (the payload is the reason).
const ABORT: c_int = 2;
/// MPI tag of the notice a rank sends every peer when it exits normally.
const CLOSE: c_int = 3;

/// A send MPI has not completed yet, with the bytes it reads.
struct PendingSend {
    req: ffi::MPI_Request,
    _buf: Vec<u8>,
}

// SAFETY: the request handle is an opaque value; MPI_THREAD_MULTIPLE lets any thread test it.
unsafe impl Send for PendingSend {}

/// The state of one endpoint, shared with the at-exit drain.
pub(crate) struct Shared {
    comm: Comm,
    rank: usize,
    size: usize,
    mailbox: Mailbox,
    pending: Mutex<Vec<PendingSend>>,
    /// Held while moving messages into the mailbox: two threads pumping at once (a collective and
    /// the flight recorder's watcher asking for failures) could each take one of two messages of
    /// one tag from MPI and deliver them in the opposite order.
    pumping: Mutex<()>,
    aborted: AtomicBool,
    closed: AtomicBool,
    watch: Arc<Watch>,
}

impl Shared {
    /// Completes the sends MPI has finished with.
    fn progress(&self) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        runtime::while_live(|| {
            p.retain_mut(|s| {
                let mut done: c_int = 0;
                // SAFETY: `req` is an active request of this process; MPI is not finalized.
                let rc = unsafe { ffi::MPI_Test(&mut s.req, &mut done, ffi::RSMPI_STATUS_IGNORE) };
                rc == 0 && done == 0
            })
        });
    }

    /// Moves every message that has arrived into the mailbox, in MPI's order; returns whether there
    /// was one.
    fn pump(&self) -> bool {
        let _one_at_a_time = self.pumping.lock().unwrap_or_else(|e| e.into_inner());
        self.pump_locked()
    }

    /// [`Shared::pump`] unless another thread is pumping (then that thread delivers what came).
    fn try_pump(&self) {
        match self.pumping.try_lock() {
            Ok(_one_at_a_time) => {
                self.pump_locked();
            }
            Err(std::sync::TryLockError::Poisoned(e)) => {
                let _one_at_a_time = e.into_inner();
                self.pump_locked();
            }
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
    }

    fn pump_locked(&self) -> bool {
        let mut any = false;
        loop {
            let mut flag: c_int = 0;
            // SAFETY: placeholders for out-parameters.
            let mut msg: ffi::MPI_Message = unsafe { ffi::RSMPI_MESSAGE_NULL };
            // SAFETY: MPI_Status is a plain C struct; zero is a valid value.
            let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
            // SAFETY: valid communicator and out-parameters; MPI is not finalized.
            let Some(rc) = runtime::while_live(|| unsafe {
                ffi::MPI_Improbe(
                    ffi::RSMPI_ANY_SOURCE,
                    ffi::RSMPI_ANY_TAG,
                    self.comm.0,
                    &mut flag,
                    &mut msg,
                    &mut status,
                )
            }) else {
                return any;
            };
            if rc != 0 {
                self.mailbox.fail(LinkFailure::LocalClosed {
                    reason: format!("MPI_Improbe failed with code {rc}"),
                });
                return any;
            }
            if flag == 0 {
                return any;
            }
            any = true;
            let mut buf = Vec::new();
            // A matched message is received in the same turn: MPI is not finalized in between.
            let Some(rc) = runtime::while_live(|| {
                let mut count: c_int = 0;
                // SAFETY: `status` describes the probed message.
                unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count) };
                buf = vec![0u8; count.max(0) as usize];
                // SAFETY: `buf` holds the message's `count` bytes; `msg` is the matched message.
                unsafe {
                    ffi::MPI_Mrecv(
                        buf.as_mut_ptr() as *mut c_void,
                        count,
                        ffi::RSMPI_UINT8_T,
                        &mut msg,
                        ffi::RSMPI_STATUS_IGNORE,
                    )
                }
            }) else {
                return any;
            };
            let src = status.MPI_SOURCE.max(0) as usize;
            if rc != 0 {
                self.mailbox.fail(LinkFailure::PeerLost {
                    peer: src,
                    reason: format!("MPI_Mrecv failed with code {rc}"),
                });
                continue;
            }
            match status.MPI_TAG {
                ABORT => self.mailbox.fail(LinkFailure::Aborted {
                    by: src,
                    reason: String::from_utf8_lossy(&buf).into_owned(),
                }),
                CLOSE => {
                    self.watch.close(src);
                    self.mailbox.close_peer(src);
                }
                _ => self.deliver(src, buf),
            }
        }
    }

    /// A kolo message is its payload followed by the header (so the payload needs no copy).
    fn deliver(&self, src: usize, mut buf: Vec<u8>) {
        let Some(at) = buf.len().checked_sub(HEADER_LEN) else {
            self.mailbox.fail(LinkFailure::Protocol {
                peer: src,
                reason: format!("a message of {} bytes has no kolo header", buf.len()),
            });
            return;
        };
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&buf[at..]);
        match Header::decode(&h) {
            Ok(header) => {
                buf.truncate(at);
                self.mailbox.deliver(
                    src,
                    Message {
                        header,
                        payload: buf,
                    },
                );
            }
            Err(e) => self.mailbox.fail(LinkFailure::Protocol {
                peer: src,
                reason: format!("bad kolo header: {}", e.0),
            }),
        }
    }

    fn isend(&self, peer: usize, tag: c_int, buf: Vec<u8>) -> Result<(), LinkFailure> {
        let len = c_int::try_from(buf.len()).map_err(|_| LinkFailure::Protocol {
            peer,
            reason: format!(
                "a message of {} bytes is over the MPI transport's limit of {} bytes",
                buf.len(),
                c_int::MAX
            ),
        })?;
        // SAFETY: a null handle is only an out-parameter placeholder.
        let mut req: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: `buf` is kept alive (in `pending`) until MPI has completed the send; the heap
        // block does not move when the Vec does; MPI is not finalized.
        let rc = runtime::while_live(|| unsafe {
            ffi::MPI_Isend(
                buf.as_ptr() as *const c_void,
                len,
                ffi::RSMPI_UINT8_T,
                peer as c_int,
                tag,
                self.comm.0,
                &mut req,
            )
        })
        .ok_or_else(|| LinkFailure::LocalClosed {
            reason: "MPI is finalized: this process is exiting".into(),
        })?;
        if rc != 0 {
            return Err(LinkFailure::PeerLost {
                peer,
                reason: format!("MPI_Isend failed with code {rc}"),
            });
        }
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(PendingSend { req, _buf: buf });
        self.progress();
        Ok(())
    }

    /// Tells every peer this rank is done (once): their collectives still waiting for it fail with
    /// an error naming it instead of waiting out their timeout.
    pub(crate) fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        for peer in (0..self.size).filter(|&p| p != self.rank) {
            let _ = self.isend(peer, CLOSE, Vec::new());
        }
    }

    /// Waits (up to `limit`) for the buffered sends to complete, receiving meanwhile so that two
    /// ranks draining towards each other both finish.
    pub(crate) fn drain(&self, limit: Duration) {
        let until = Instant::now() + limit;
        loop {
            self.progress();
            if self
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
                || Instant::now() >= until
            {
                return;
            }
            self.pump();
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

impl runtime::AtExit for Shared {
    fn close(&self) {
        Shared::close(self);
    }

    fn drain(&self, limit: Duration) {
        Shared::drain(self, limit);
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if runtime::live() {
            let _closing = runtime::closing();
            // Like a closed TCP connection: a peer still waiting for this rank learns it left.
            self.close();
            self.drain(Duration::from_secs(10));
            // The communicator is not freed (see `MpiEngine`): MPI_Finalize does it.
        }
        let left = std::mem::take(self.pending.get_mut().unwrap_or_else(|e| e.into_inner()));
        if !left.is_empty() && runtime::live() {
            // MPI still reads the buffers of sends it has not completed: leaked, not freed.
            std::mem::forget(left);
        }
    }
}

/// Point-to-point messages over a duplicate of `MPI_COMM_WORLD`.
pub struct MpiTransport {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for MpiTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiTransport")
            .field("rank", &self.shared.rank)
            .field("size", &self.shared.size)
            .finish()
    }
}

impl MpiTransport {
    /// A transport over a new duplicate of `MPI_COMM_WORLD` (MPI must be started).
    pub(crate) fn world(watch: Arc<Watch>) -> Result<MpiTransport> {
        // SAFETY: reading the world handle rsmpi exports.
        let comm = runtime::dup(unsafe { ffi::RSMPI_COMM_WORLD }, "init", 0)?;
        let (rank, size) = runtime::rank_size(comm.0, "init")?;
        let shared = Arc::new(Shared {
            comm,
            rank,
            size,
            mailbox: Mailbox::new(size),
            pending: Mutex::new(Vec::new()),
            pumping: Mutex::new(()),
            aborted: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            watch,
        });
        let at_exit: Weak<Shared> = Arc::downgrade(&shared);
        runtime::register(at_exit);
        Ok(MpiTransport { shared })
    }
}

/// Waits a little longer each time nothing arrives: spin, then yield, then short sleeps.
fn back_off(idle: u32) {
    if idle < 64 {
        std::hint::spin_loop();
    } else if idle < 2048 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(50));
    }
}

impl Transport for MpiTransport {
    fn rank(&self) -> usize {
        self.shared.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn kind(&self) -> &'static str {
        "mpi"
    }

    fn send(&self, peer: usize, header: &Header, payload: &[u8]) -> Result<(), LinkFailure> {
        let s = &self.shared;
        if let Some(f) = s.mailbox.failure() {
            return Err(f);
        }
        if peer >= s.size {
            return Err(LinkFailure::Protocol {
                peer,
                reason: format!("no rank {peer} in a world of {}", s.size),
            });
        }
        if peer == s.rank {
            s.mailbox.deliver(
                peer,
                Message {
                    header: *header,
                    payload: payload.to_vec(),
                },
            );
            return Ok(());
        }
        let mut buf = Vec::with_capacity(payload.len() + HEADER_LEN);
        buf.extend_from_slice(payload);
        buf.extend_from_slice(&header.encode());
        s.isend(peer, DATA, buf)
    }

    fn recv(
        &self,
        peer: usize,
        tag: &Tag,
        deadline: Option<Instant>,
    ) -> Result<Message, RecvError> {
        let s = &self.shared;
        let mut idle = 0u32;
        loop {
            if let Some(m) = s.mailbox.try_recv(peer, tag).map_err(RecvError::Link)? {
                return Ok(m);
            }
            s.progress();
            if s.pump() {
                idle = 0;
                continue;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(RecvError::Timeout);
            }
            idle = idle.saturating_add(1);
            back_off(idle);
        }
    }

    fn try_recv(&self, peer: usize, tag: &Tag) -> Result<Option<Message>, LinkFailure> {
        self.shared.progress();
        self.shared.pump();
        self.shared.mailbox.try_recv(peer, tag)
    }

    fn abort(&self, reason: &str) {
        let s = &self.shared;
        if s.aborted.swap(true, Ordering::SeqCst) {
            return;
        }
        runtime::mark_failed();
        s.mailbox.fail(LinkFailure::LocalClosed {
            reason: reason.to_string(),
        });
        for peer in (0..s.size).filter(|&p| p != s.rank) {
            let _ = s.isend(peer, ABORT, reason.as_bytes().to_vec());
        }
    }

    fn failure(&self) -> Option<LinkFailure> {
        // Asked from other threads too (the flight recorder's watcher): never waits on a pump.
        self.shared.try_pump();
        self.shared.mailbox.failure()
    }

    fn expect(&self, header: &Header) {
        self.shared.mailbox.expect(header);
    }
}
