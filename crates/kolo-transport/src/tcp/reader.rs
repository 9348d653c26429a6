//! The reader thread of a connection: drains incoming frames, writing data payloads straight into a
//! posted receive buffer when one waits for them (see [`super::posted`]) — or reducing them into it,
//! straight from the socket's read buffer, when the receive reduces — and into pooled buffers queued
//! in the rank's mailbox otherwise.

use std::io::{self, BufRead, BufReader};
use std::net::Shutdown;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use kolo_core::{LinkFailure, Mailbox, Message, Reducer};

use super::frame::{self, Kind, Prefix, ReadError};
use super::live::{Liveness, Touch};
use super::posted::Posts;
use crate::pool::Pool;

/// What one connection's reader works with.
pub(super) struct Reader {
    pub(super) peer: usize,
    pub(super) mailbox: Arc<Mailbox>,
    pub(super) posts: Arc<Posts>,
    pub(super) pool: Arc<Pool>,
    pub(super) max_message: u64,
    pub(super) live: Arc<Liveness>,
}

/// Bytes the reader buffers from its socket: prefixes and small frames come in few system calls,
/// while the rest of a large payload is read from the socket straight into its destination.
const READ_BUFFER: usize = 256 * 1024;

impl Reader {
    /// Reads the payload of a data frame and hands it on.
    fn data(&self, r: &mut impl BufRead, p: Prefix) -> io::Result<()> {
        let peer = self.peer;
        if let Some(mut claim) = self.posts.claim(peer, &p.header, p.len) {
            let read = match claim.reduce {
                None => r.read_exact(claim.buf()),
                Some(red) => read_reduce(r, claim.buf(), red),
            };
            if read.is_ok() {
                self.mailbox.screen(peer, &p.header);
            }
            self.posts.filled(peer, claim, p.header, read.is_ok());
            return read;
        }
        let mut payload = self.pool.take(p.len);
        let read = frame::read_payload(r, p.len, &mut payload);
        let msg = read.is_ok().then_some(Message {
            header: p.header,
            payload,
        });
        self.posts.delivered(&self.mailbox, peer, msg);
        read
    }

    /// Drains the connection until it ends or fails.
    pub(super) fn run(self, stream: Touch) {
        let (peer, mailbox) = (self.peer, &self.mailbox);
        let mut r = BufReader::with_capacity(READ_BUFFER, stream);
        let mut closed_cleanly = false;
        loop {
            let err = match frame::read_prefix(&mut r, self.max_message) {
                Ok(p) if p.kind == Kind::Data => match self.data(&mut r, p) {
                    Ok(()) => continue,
                    Err(e) => ReadError::Io(e),
                },
                Ok(p) => {
                    let mut payload = Vec::new();
                    match frame::read_payload(&mut r, p.len, &mut payload) {
                        Ok(()) => {
                            self.control(p, payload, &mut closed_cleanly);
                            continue;
                        }
                        Err(e) => ReadError::Io(e),
                    }
                }
                Err(e) => e,
            };
            match err {
                ReadError::Eof => {
                    if !closed_cleanly {
                        mailbox.fail(LinkFailure::PeerLost {
                            peer,
                            reason: "connection closed without goodbye (the process exited or was \
                                     killed)"
                                .into(),
                        });
                    }
                }
                ReadError::Io(e) => {
                    if !closed_cleanly {
                        mailbox.fail(LinkFailure::PeerLost {
                            peer,
                            reason: e.to_string(),
                        });
                    }
                }
                ReadError::Invalid(reason) => {
                    mailbox.fail(LinkFailure::Protocol { peer, reason });
                    let _ = r.get_ref().inner.shutdown(Shutdown::Both);
                }
            }
            return;
        }
    }

    /// A control frame: heartbeat, abort or goodbye.
    fn control(&self, p: Prefix, payload: Vec<u8>, closed_cleanly: &mut bool) {
        let (peer, mailbox) = (self.peer, &self.mailbox);
        match p.kind {
            Kind::Data | Kind::Heartbeat => {}
            Kind::Abort => mailbox.fail(LinkFailure::Aborted {
                by: peer,
                reason: String::from_utf8_lossy(&payload).into_owned(),
            }),
            Kind::Goodbye => {
                *closed_cleanly = true;
                self.live.quiet[peer].store(true, Ordering::SeqCst);
                mailbox.close_peer(peer);
            }
        }
    }
}

/// Reads `dst.len()` payload bytes from `r` and reduces them into `dst`, element by element, from the
/// read buffer as the bytes arrive: the payload never lands anywhere whole, so the reduction reads it
/// while it is still in cache. `dst` holds whole elements (its claim had the posting's segment length).
fn read_reduce(r: &mut impl BufRead, dst: &mut [u8], red: Reducer) -> io::Result<()> {
    let elem = red.dtype.size();
    let mut done = 0;
    while done < dst.len() {
        let avail = r.fill_buf()?;
        if avail.is_empty() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let take = avail.len().min(dst.len() - done) / elem * elem;
        if take > 0 {
            red.apply(&mut dst[done..done + take], &avail[..take]);
            r.consume(take);
            done += take;
        } else {
            // Fewer bytes than one element are buffered: complete it byte-wise.
            let mut one = [0u8; 16];
            r.read_exact(&mut one[..elem])?;
            red.apply(&mut dst[done..done + elem], &one[..elem]);
            done += elem;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_core::{DType, ReduceOp};

    /// A reader that hands out its bytes a few at a time, cutting elements apart.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(self.step).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn reduces_across_cut_elements() {
        let src: Vec<u8> = (0..1000u32)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect();
        for step in [1, 3, 5, 7, 4096] {
            let mut dst: Vec<u8> = (0..1000u32).flat_map(|_| 1f32.to_le_bytes()).collect();
            let mut r = BufReader::with_capacity(11, Trickle { data: &src, step });
            let red = Reducer::new(DType::F32, ReduceOp::Sum);
            assert!(read_reduce(&mut r, &mut dst, red).is_ok(), "step {step}");
            let got: Vec<f32> = dst
                .chunks(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            assert!(
                got.iter().enumerate().all(|(i, &v)| v == i as f32 + 1.0),
                "step {step}"
            );
        }
    }

    #[test]
    fn a_short_stream_is_an_error() {
        let src = [0u8; 10];
        let mut dst = [0u8; 16];
        let mut r = BufReader::new(Trickle {
            data: &src,
            step: 4,
        });
        let e = read_reduce(&mut r, &mut dst, Reducer::new(DType::F64, ReduceOp::Max));
        assert!(matches!(e, Err(e) if e.kind() == io::ErrorKind::UnexpectedEof));
    }
}
