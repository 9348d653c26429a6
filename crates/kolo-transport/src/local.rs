//! Local transport: the ranks are threads of one process.
//!
//! Each rank owns a [`Mailbox`]; `send` copies the payload into the destination's mailbox. Dropping an
//! endpoint tells the others that the rank closed (or, if its thread is panicking, that it was lost), so a
//! rank that dies never leaves its peers waiting.

use std::sync::Arc;
use std::time::Instant;

use kolo_core::{Header, LinkFailure, Mailbox, Message, RecvError, Tag, Transport};

#[derive(Debug)]
struct Shared {
    mailboxes: Vec<Mailbox>,
}

/// One rank's endpoint of a local world. Create a world with [`local_world`].
#[derive(Debug)]
pub struct LocalTransport {
    rank: usize,
    shared: Arc<Shared>,
}

/// Creates the endpoints of a world of `size` ranks living in this process (one per thread).
pub fn local_world(size: usize) -> Vec<LocalTransport> {
    let shared = Arc::new(Shared {
        mailboxes: (0..size).map(|_| Mailbox::new(size)).collect(),
    });
    (0..size)
        .map(|rank| LocalTransport {
            rank,
            shared: shared.clone(),
        })
        .collect()
}

impl LocalTransport {
    fn own(&self) -> &Mailbox {
        &self.shared.mailboxes[self.rank]
    }
}

impl Transport for LocalTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.mailboxes.len()
    }

    fn kind(&self) -> &'static str {
        "local"
    }

    fn send(&self, peer: usize, header: &Header, payload: &[u8]) -> Result<(), LinkFailure> {
        if let Some(f) = self.own().failure() {
            return Err(f);
        }
        let mb = self
            .shared
            .mailboxes
            .get(peer)
            .ok_or_else(|| LinkFailure::PeerLost {
                peer,
                reason: format!("no rank {peer} in a world of {}", self.size()),
            })?;
        mb.deliver(
            self.rank,
            Message {
                header: *header,
                payload: payload.to_vec(),
            },
        );
        Ok(())
    }

    fn recv(
        &self,
        peer: usize,
        tag: &Tag,
        deadline: Option<Instant>,
    ) -> Result<Message, RecvError> {
        self.own().recv(peer, tag, deadline)
    }

    fn try_recv(&self, peer: usize, tag: &Tag) -> Result<Option<Message>, LinkFailure> {
        self.own().try_recv(peer, tag)
    }

    fn recv_any(
        &self,
        peers: &[usize],
        tag: &Tag,
        deadline: Option<Instant>,
    ) -> Result<(usize, Message), RecvError> {
        self.own().recv_any(peers, tag, deadline)
    }

    fn try_recv_any(
        &self,
        peers: &[usize],
        tag: &Tag,
    ) -> Result<Option<(usize, Message)>, LinkFailure> {
        self.own().try_recv_any(peers, tag)
    }

    fn abort(&self, reason: &str) {
        for (r, mb) in self.shared.mailboxes.iter().enumerate() {
            if r == self.rank {
                mb.fail(LinkFailure::LocalClosed {
                    reason: reason.to_string(),
                });
            } else {
                mb.fail(LinkFailure::Aborted {
                    by: self.rank,
                    reason: reason.to_string(),
                });
            }
        }
    }

    fn expect(&self, header: &Header) {
        self.own().expect(header);
    }

    fn failure(&self) -> Option<LinkFailure> {
        self.own().failure()
    }
}

impl Drop for LocalTransport {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        // A rank that leaves with a failed endpoint passes the failure on (see the TCP transport).
        let failed = self
            .own()
            .failure()
            .filter(|f| !matches!(f, LinkFailure::LocalClosed { .. }))
            .map(|f| f.forwarded("shutdown", self.rank));
        for (r, mb) in self.shared.mailboxes.iter().enumerate() {
            if r == self.rank {
                continue;
            }
            if let Some(reason) = &failed {
                mb.fail(LinkFailure::Aborted {
                    by: self.rank,
                    reason: reason.clone(),
                });
            } else if panicking {
                mb.fail(LinkFailure::PeerLost {
                    peer: self.rank,
                    reason: "its thread panicked".into(),
                });
            } else {
                mb.close_peer(self.rank);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_core::{Algorithm, Call, OpKind, TagSpace};

    fn header() -> Header {
        Header {
            ack: false,
            tag: Tag {
                group: 0,
                space: TagSpace::P2p,
                value: 5,
            },
            call: Call::new(OpKind::Send, Algorithm::Direct),
        }
    }

    #[test]
    fn send_recv_between_threads() {
        let mut w = local_world(2);
        let t1 = w.pop();
        let t0 = w.pop();
        let (Some(t0), Some(t1)) = (t0, t1) else {
            panic!("world of 2 has 2 endpoints");
        };
        let h =
            std::thread::spawn(move || t1.send(0, &header(), b"hi").map_err(|e| format!("{e:?}")));
        let m = t0.recv(1, &header().tag, None);
        assert_eq!(m.map(|m| m.payload), Ok(b"hi".to_vec()));
        assert!(matches!(h.join(), Ok(Ok(()))));
        // t1 was dropped cleanly: receiving from it now fails instead of waiting.
        assert!(matches!(
            t0.recv(1, &header().tag, None),
            Err(RecvError::Link(LinkFailure::PeerClosed { peer: 1 }))
        ));
    }

    #[test]
    fn abort_reaches_peers() {
        let w = local_world(3);
        w[2].abort("boom");
        for t in &w[..2] {
            assert!(matches!(
                t.recv(2, &header().tag, None),
                Err(RecvError::Link(LinkFailure::Aborted { by: 2, .. }))
            ));
        }
    }
}
