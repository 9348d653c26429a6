//! Sends in place: the receiver copies a large payload once, straight out of the sender's memory
//! (Linux's `process_vm_readv`, what Open MPI's shared-memory transport calls CMA), instead of the
//! sender copying it into the ring and the receiver copying it out.
//!
//! The sender writes the prefix (its length marked [`IN_PLACE`](super::prefix::IN_PLACE)) and the
//! payload's address into the ring as one small message and leaves the payload alone until the
//! receiver has copied it. The receiver meets the message in the ring's order — into a posted
//! buffer or into the mailbox — copies the bytes and counts it in the ring's `copied` word; the
//! sender's n-th message in place to that peer is done once `copied >= n` (one ring is read in
//! order, so one counter serves every message of it).
//!
//! Whether a rank may read its peer's memory (ptrace rules, seccomp, a container) is tried once, at
//! connect: each rank reads the segment's first word through the peer's own mapping, whose address
//! the peer published, and writes what it found into the ring's control line; a sender sends in
//! place only where the receiver could read. Elsewhere a send in place is an ordinary send.
//!
//! The copy is checked, never trusted: a sender that aborted or was lost while the receiver copied
//! (its memory may have changed under the copy) makes the message a failure, not a delivery; a
//! transport that closes first waits for its messages in place to be copied, and aborts, naming
//! them, if they are not.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kolo_core::{Header, LinkFailure, RecvError};

use super::health::STATE_ALIVE;
use super::layout::{LINE, MAGIC};
use super::postings::Claim;
use super::prefix::{encode_in_place_prefix, IN_PLACE_BYTES};
use super::ring::next_message;
use super::{lock, ShmTransport};

/// The ring's `readable` word (0 until tried): the receiver reads the sender's memory, or cannot.
const READABLE: u32 = 1;
const UNREADABLE: u32 = 2;

/// The most bytes one `process_vm_readv` call is asked for (and a mailbox payload grows by).
pub(super) const READ_CHUNK: usize = 8 << 20;
/// The most messages in place one `process_vm_readv` reads.
const BATCH_MAX: usize = 64;

/// Messages in place bound for postings, read together: a `process_vm_readv` has a fixed cost —
/// the kernel's check that this process may read the other, about 2 µs a call on a virtual
/// machine, a third of a 64 KiB copy — paid once for the lot. Their postings are claimed, in the
/// ring's order; nothing else in place from the same peer is copied before they are (the `copied`
/// count the sender waits on is a count).
#[derive(Debug, Default)]
pub(super) struct Batch {
    items: Vec<(Claim, Header, u64, usize)>,
    bytes: usize,
}

/// How long a closing transport waits for its messages in place to be copied.
const CLOSE_WAIT: Duration = Duration::from_secs(30);

impl Batch {
    /// Whether it holds no message.
    pub(super) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl ShmTransport {
    /// Messages in place of the ring `src → dst` that `dst` has copied (in the consumer's line).
    fn copied(&self, src: usize, dst: usize) -> &AtomicU64 {
        self.u64_at(self.layout.ring(src, dst) + LINE + 8)
    }

    /// Whether `dst` can read `src`'s memory ([`READABLE`] ...), written by `dst` at connect.
    fn readable(&self, src: usize, dst: usize) -> &AtomicU32 {
        self.u32_at(self.layout.ring(src, dst) + LINE + 16)
    }

    /// Where rank `r`'s process mapped the segment (in its doorbell line, after the futex words).
    fn base(&self, r: usize) -> &AtomicU64 {
        self.u64_at(self.layout.ctrl(r) + 64)
    }

    /// Publishes this rank's mapping address for the peers' read test (before it counts as
    /// attached).
    pub(super) fn publish_base(&self) {
        self.base(self.rank)
            .store(self.seg.ptr() as u64, Ordering::Release);
    }

    /// Tries, for every peer, to read the segment's magic word through that peer's mapping, and
    /// writes the outcome where the peer's sends look for it. Called once every rank has attached.
    pub(super) fn try_reading_peers(&self) {
        for peer in (0..self.layout.n).filter(|&p| p != self.rank) {
            let verdict = if self.opts.single_copy_bytes == 0 {
                UNREADABLE
            } else {
                let addr = self.base(peer).load(Ordering::Acquire);
                let mut word = [0u8; 8];
                match self.read_remote(peer, addr, word.as_mut_ptr(), 8) {
                    Ok(()) if u64::from_le_bytes(word) == MAGIC => READABLE,
                    _ => UNREADABLE,
                }
            };
            self.readable(peer, self.rank)
                .store(verdict, Ordering::Release);
        }
    }

    /// Whether a send of `len` bytes to `peer` goes in place.
    pub(super) fn goes_in_place(&self, peer: usize, len: usize) -> bool {
        self.opts.single_copy_bytes > 0
            && len >= self.opts.single_copy_bytes
            && self.readable(self.rank, peer).load(Ordering::Acquire) == READABLE
    }

    /// Sends `payload` to `peer` (another rank) in place: its address goes into the ring. Returns
    /// the message's ticket for [`Self::wait_copied`].
    ///
    /// # Safety
    ///
    /// `payload` stays alive and unchanged until [`Self::in_place_copied`] says the ticket is done
    /// or the peer has failed.
    pub(super) unsafe fn push_in_place(
        &self,
        peer: usize,
        header: &Header,
        payload: &[u8],
    ) -> Result<u64, LinkFailure> {
        let prefix = encode_in_place_prefix(header, payload.len());
        let addr = (payload.as_ptr() as u64).to_le_bytes();
        let mut producer = lock(&self.producers[peer]);
        let ring = self.ring(self.rank, peer);
        let tail = producer.tail;
        let next = next_message(tail + (prefix.len() + IN_PLACE_BYTES) as u64);
        let need = (next - tail) as usize;
        if ring.free_before(tail, producer.known_head) < need {
            producer.known_head = ring.released();
            if ring.free_before(tail, producer.known_head) < need {
                self.wait_for_space(peer, tail, need)?;
                producer.known_head = ring.released();
            }
        }
        // SAFETY: this thread holds the ring's producer lock and the free space covers both and the
        // padding; prefix and address are published together.
        producer.tail = unsafe { ring.push2(tail, &prefix.bytes()[..prefix.len()], &addr, next) };
        producer.in_place += 1;
        self.bell(peer).ring();
        Ok(producer.in_place)
    }

    /// Whether `peer` has copied the message in place with `ticket`; a failure of the link (the
    /// peer died, aborted or closed without receiving it) is an error.
    pub(super) fn in_place_copied(&self, peer: usize, ticket: u64) -> Result<bool, LinkFailure> {
        if self.copied(self.rank, peer).load(Ordering::Acquire) >= ticket {
            return Ok(true);
        }
        if let Some(f) = self.mailbox.failure() {
            return Err(f);
        }
        if self.state_word(peer, 0).load(Ordering::Acquire) != STATE_ALIVE {
            // It may have copied the message just before closing.
            if self.copied(self.rank, peer).load(Ordering::Acquire) >= ticket {
                return Ok(true);
            }
            self.check_peer(peer);
            return Err(self
                .mailbox
                .failure()
                .unwrap_or(LinkFailure::PeerClosed { peer }));
        }
        Ok(false)
    }

    /// Waits until `peer` has copied the message in place with `ticket`, keeping this rank's
    /// incoming rings moving (the peer may be waiting for this rank's messages in place).
    pub(super) fn wait_copied(
        &self,
        peer: usize,
        ticket: u64,
        deadline: Option<Instant>,
    ) -> Result<(), RecvError> {
        if self
            .in_place_copied(peer, ticket)
            .map_err(RecvError::Link)?
        {
            return Ok(());
        }
        self.wait_for(deadline, || match self.in_place_copied(peer, ticket) {
            Ok(true) => Some(Ok(())),
            Ok(false) => {
                self.progress();
                None
            }
            Err(f) => Some(Err(f)),
        })?
        .map_err(RecvError::Link)
    }

    /// Copies the payload of a message in place from `src` (at `addr` in its memory) into `dst`
    /// and counts it copied. The copy counts only if `src` is still alive after it.
    pub(super) fn copy_in_place(
        &self,
        src: usize,
        addr: u64,
        dst: &mut [u8],
    ) -> Result<(), LinkFailure> {
        let read = self.read_remote(src, addr, dst.as_mut_ptr(), dst.len());
        self.count_copied(src, read)
    }

    /// [`Self::copy_in_place`] of a `len`-byte payload into a new buffer (for the mailbox), which
    /// grows as it is read (the peer's length is not trusted for one allocation).
    pub(super) fn copy_in_place_vec(
        &self,
        src: usize,
        addr: u64,
        len: usize,
    ) -> Result<Vec<u8>, LinkFailure> {
        let mut buf = self.pool.take(len);
        buf.clear();
        let mut read = Ok(());
        while buf.len() < len && read.is_ok() {
            let n = (len - buf.len()).min(READ_CHUNK);
            buf.reserve(n);
            let at = buf.spare_capacity_mut().as_mut_ptr() as *mut u8;
            read = self.read_remote(src, addr + buf.len() as u64, at, n);
            if read.is_ok() {
                // SAFETY: `read_remote` wrote all `n` bytes of the reserved capacity.
                unsafe { buf.set_len(buf.len() + n) };
            }
        }
        self.count_copied(src, read).map(|()| buf)
    }

    /// After a copy from `src`: fails if the copy failed or `src` is no longer alive (its memory
    /// may have changed under the copy), else counts the message copied and wakes the sender.
    fn count_copied(&self, src: usize, read: Result<(), String>) -> Result<(), LinkFailure> {
        self.count_copied_n(src, read, 1)
    }

    /// [`Self::count_copied`] of `n` messages read together.
    fn count_copied_n(
        &self,
        src: usize,
        read: Result<(), String>,
        n: u64,
    ) -> Result<(), LinkFailure> {
        let alive = self.state_word(src, 0).load(Ordering::SeqCst) == STATE_ALIVE;
        if read.is_ok() && alive {
            self.copied(src, self.rank).fetch_add(n, Ordering::Release);
            self.bell(src).ring();
            return Ok(());
        }
        self.check_peer(src);
        let failure = self.mailbox.failure().unwrap_or_else(|| match read {
            Err(e) => LinkFailure::Protocol {
                peer: src,
                reason: format!("its message sent in place could not be read: {e}"),
            },
            Ok(()) => LinkFailure::PeerLost {
                peer: src,
                reason: "it closed before its message sent in place was copied".into(),
            },
        });
        self.mailbox.fail(failure.clone());
        Err(failure)
    }

    /// Adds the message in place `header` from `src` (`len` bytes at `addr` in its memory) for
    /// the posting `claim`, which it fits, to `batch`, and copies the batch once it is full;
    /// false if a copy failed (the mailbox holds the failure).
    pub(super) fn batch_in_place(
        &self,
        src: usize,
        batch: &mut Batch,
        (claim, header): (Claim, Header),
        (addr, len): (u64, usize),
    ) -> bool {
        batch.items.push((claim, header, addr, len));
        batch.bytes += len;
        if batch.items.len() < BATCH_MAX && batch.bytes < READ_CHUNK {
            return true;
        }
        self.flush_in_place(src, batch)
    }

    /// Copies the messages of `batch` from `src` into their postings with one system call, counts
    /// them copied and completes the postings; false if the copy failed (the mailbox holds the
    /// failure, each posting too). The caller holds `src`'s consumer lock.
    pub(super) fn flush_in_place(&self, src: usize, batch: &mut Batch) -> bool {
        if batch.items.is_empty() {
            return true;
        }
        let read = self.read_remote_batch(src, &batch.items);
        let counted = self.count_copied_n(src, read, batch.items.len() as u64);
        for (claim, header, _, len) in batch.items.drain(..) {
            if counted.is_ok() {
                self.screen_direct(src, &header);
            }
            self.postings
                .finish(claim.id, counted.clone().map(|()| (header, len)));
        }
        batch.bytes = 0;
        counted.is_ok()
    }

    /// Reads the payloads of `items` (claim, header, address in `src`, length) into their
    /// postings: one `process_vm_readv` for all, then one per message for what it left.
    fn read_remote_batch(
        &self,
        src: usize,
        items: &[(Claim, Header, u64, usize)],
    ) -> Result<(), String> {
        let pid = self.state_word(src, 1).load(Ordering::Acquire) as libc::pid_t;
        let local: Vec<libc::iovec> = items
            .iter()
            .map(|(c, _, _, len)| libc::iovec {
                iov_base: c.addr as *mut libc::c_void,
                iov_len: *len,
            })
            .collect();
        let remote: Vec<libc::iovec> = items
            .iter()
            .map(|(_, _, addr, len)| libc::iovec {
                iov_base: *addr as usize as *mut libc::c_void,
                iov_len: *len,
            })
            .collect();
        // SAFETY: each local iovec is the first `len` bytes of a claimed posting, which holds at
        // least that many (the caller's claims; `post_recv`'s contract); the kernel checks the
        // remote ones against the other process's mappings.
        let got = unsafe {
            libc::process_vm_readv(
                pid,
                local.as_ptr(),
                local.len() as libc::c_ulong,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        };
        // Whatever a partial (or failed) read left, message by message.
        let mut before = got.max(0) as usize;
        for (c, _, addr, len) in items {
            let done = before.min(*len);
            before -= done;
            if done < *len {
                let dst = (c.addr + done) as *mut u8;
                self.read_remote(src, addr + done as u64, dst, len - done)?;
            }
        }
        Ok(())
    }

    /// Reads `len` bytes at `addr` in `src`'s process into `dst`.
    fn read_remote(&self, src: usize, addr: u64, dst: *mut u8, len: usize) -> Result<(), String> {
        let pid = self.state_word(src, 1).load(Ordering::Acquire) as libc::pid_t;
        let mut done = 0;
        while done < len {
            let n = (len - done).min(READ_CHUNK);
            let local = libc::iovec {
                // SAFETY: `done + n <= len`: inside the caller's buffer.
                iov_base: unsafe { dst.add(done) }.cast(),
                iov_len: n,
            };
            let remote = libc::iovec {
                iov_base: (addr as usize + done) as *mut libc::c_void,
                iov_len: n,
            };
            // SAFETY: the local iovec is `n` writable bytes of the caller's buffer; the kernel
            // checks the remote one against the other process's mappings.
            let got = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
            match got {
                g if g > 0 => done += g as usize,
                0 => {
                    return Err(format!(
                        "no bytes at {:#x} in pid {pid}",
                        addr as usize + done
                    ))
                }
                _ => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(format!("process_vm_readv from pid {pid}: {e}"));
                    }
                }
            }
        }
        Ok(())
    }

    /// Before closing: waits (up to [`CLOSE_WAIT`]) for the peers to copy this rank's messages in
    /// place; a message not copied by then, with its peer alive, is named in the abort that follows
    /// (the caller's memory may go away, so the peer must not copy it).
    pub(super) fn finish_in_place(&self) -> Option<String> {
        let until = Instant::now() + CLOSE_WAIT;
        for peer in (0..self.layout.n).filter(|&p| p != self.rank) {
            let sent = lock(&self.producers[peer]).in_place;
            if sent == 0 {
                continue;
            }
            match self.wait_copied(peer, sent, Some(until)) {
                Ok(()) | Err(RecvError::Link(_)) => {}
                Err(RecvError::Timeout) => {
                    let left = sent - self.copied(self.rank, peer).load(Ordering::Acquire);
                    return Some(format!(
                        "it closed with {left} message(s) sent in place to rank {peer} that rank \
                         {peer} had not received after {}s",
                        CLOSE_WAIT.as_secs()
                    ));
                }
            }
        }
        None
    }
}
