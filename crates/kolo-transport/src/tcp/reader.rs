//! The reader thread of a connection: drains incoming frames into the rank's mailbox.

use std::io::BufReader;
use std::net::Shutdown;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use kolo_core::{LinkFailure, Mailbox, Message};

use super::frame::{self, Frame, Kind, ReadError};
use super::live::{Liveness, Touch};

pub(super) fn read_loop(
    stream: Touch,
    peer: usize,
    mailbox: Arc<Mailbox>,
    max_message: u64,
    live: Arc<Liveness>,
) {
    let mut r = BufReader::with_capacity(256 * 1024, stream);
    let mut closed_cleanly = false;
    loop {
        match frame::read_frame(&mut r, max_message) {
            Ok(Frame {
                kind: Kind::Data,
                header,
                payload,
            }) => mailbox.deliver(peer, Message { header, payload }),
            Ok(Frame {
                kind: Kind::Heartbeat,
                ..
            }) => {}
            Ok(Frame {
                kind: Kind::Abort,
                payload,
                ..
            }) => mailbox.fail(LinkFailure::Aborted {
                by: peer,
                reason: String::from_utf8_lossy(&payload).into_owned(),
            }),
            Ok(Frame {
                kind: Kind::Goodbye,
                ..
            }) => {
                closed_cleanly = true;
                live.quiet[peer].store(true, Ordering::SeqCst);
                mailbox.close_peer(peer);
            }
            Err(ReadError::Eof) => {
                if !closed_cleanly {
                    mailbox.fail(LinkFailure::PeerLost {
                        peer,
                        reason:
                            "connection closed without goodbye (the process exited or was killed)"
                                .into(),
                    });
                }
                return;
            }
            Err(ReadError::Io(e)) => {
                if !closed_cleanly {
                    mailbox.fail(LinkFailure::PeerLost {
                        peer,
                        reason: e.to_string(),
                    });
                }
                return;
            }
            Err(ReadError::Invalid(reason)) => {
                mailbox.fail(LinkFailure::Protocol { peer, reason });
                let _ = r.get_ref().inner.shutdown(Shutdown::Both);
                return;
            }
        }
    }
}
