//! The reader thread of a connection: drains incoming frames, writing data payloads straight into a
//! posted receive buffer when one waits for them (see [`super::posted`]) and into pooled buffers
//! queued in the rank's mailbox otherwise.

use std::io::{self, BufReader, Read};
use std::net::Shutdown;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use kolo_core::{LinkFailure, Mailbox, Message};

use super::frame::{self, Kind, Prefix, ReadError};
use super::live::{Liveness, Touch};
use super::posted::{Pool, Posts};

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
    fn data(&self, r: &mut impl Read, p: Prefix) -> io::Result<()> {
        let peer = self.peer;
        if let Some(mut claim) = self.posts.claim(peer, &p.header, p.len) {
            let read = r.read_exact(claim.buf());
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
