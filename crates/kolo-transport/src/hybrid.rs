//! Per-peer transport choice (NCCL's rule): shared memory to the ranks of this host, TCP to the
//! others.

use std::time::Instant;

use kolo_core::{
    Error, Header, LinkFailure, Message, Received, RecvError, Reducer, Tag, Transport,
};

use crate::shm::ShmTransport;

/// A world whose ranks on this host talk through shared memory and the rest through TCP.
#[derive(Debug)]
pub struct HybridTransport {
    rank: usize,
    size: usize,
    shm: ShmTransport,
    /// Shared-memory rank → world rank.
    local_ranks: Vec<usize>,
    /// World rank → shared-memory rank, for ranks of this host.
    local_of: Vec<Option<usize>>,
    remote: Box<dyn Transport>,
}

impl HybridTransport {
    /// Combines `shm` (a world of the ranks `local_ranks`, in order, this rank among them) and
    /// `remote` (a world of every rank, used for the others).
    pub fn new(shm: ShmTransport, local_ranks: Vec<usize>, remote: Box<dyn Transport>) -> Self {
        let size = remote.size();
        let mut local_of = vec![None; size];
        for (l, &g) in local_ranks.iter().enumerate() {
            if g < size {
                local_of[g] = Some(l);
            }
        }
        HybridTransport {
            rank: remote.rank(),
            size,
            shm,
            local_ranks,
            local_of,
            remote,
        }
    }

    /// Which transport reaches `peer`: `shm` or the remote transport's kind.
    pub fn route(&self, peer: usize) -> &'static str {
        match self.local_of.get(peer).copied().flatten() {
            Some(_) => "shm",
            None => self.remote.kind(),
        }
    }

    /// A failure seen by the shared-memory side, with its ranks translated to world ranks.
    /// [`Self::global`] of a failed wait's link failure.
    fn global_recv(&self, e: RecvError) -> RecvError {
        match e {
            RecvError::Link(f) => RecvError::Link(self.global(f)),
            e => e,
        }
    }

    fn global(&self, f: LinkFailure) -> LinkFailure {
        let g = |l: usize| self.local_ranks.get(l).copied().unwrap_or(l);
        match f {
            LinkFailure::PeerLost { peer, reason } => LinkFailure::PeerLost {
                peer: g(peer),
                reason,
            },
            LinkFailure::PeerClosed { peer } => LinkFailure::PeerClosed { peer: g(peer) },
            LinkFailure::Aborted { by, reason } => LinkFailure::Aborted { by: g(by), reason },
            LinkFailure::Protocol { peer, reason } => LinkFailure::Protocol {
                peer: g(peer),
                reason,
            },
            LinkFailure::Mismatch {
                peer,
                local,
                remote,
                tag,
            } => LinkFailure::Mismatch {
                peer: g(peer),
                local,
                remote,
                tag,
            },
            f @ LinkFailure::LocalClosed { .. } => f,
        }
    }
}

impl Transport for HybridTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn kind(&self) -> &'static str {
        "shm+tcp"
    }

    fn send(&self, peer: usize, header: &Header, payload: &[u8]) -> Result<(), LinkFailure> {
        match self.local_of.get(peer).copied().flatten() {
            Some(l) => self
                .shm
                .send(l, header, payload)
                .map_err(|f| self.global(f)),
            None => self.remote.send(peer, header, payload),
        }
    }

    fn recv(
        &self,
        peer: usize,
        tag: &Tag,
        deadline: Option<Instant>,
    ) -> Result<Message, RecvError> {
        match self.local_of.get(peer).copied().flatten() {
            Some(l) => self
                .shm
                .recv(l, tag, deadline)
                .map_err(|e| self.global_recv(e)),
            None => self.remote.recv(peer, tag, deadline),
        }
    }

    fn recv_posted(
        &self,
        peer: usize,
        tag: &Tag,
        buf: &mut [u8],
        segment: usize,
        reduce: Option<Reducer>,
        deadline: Option<Instant>,
        meanwhile: &mut dyn FnMut() -> kolo_core::Result<()>,
        each: &mut dyn FnMut(&mut [u8], Received) -> kolo_core::Result<()>,
        recv_error: &dyn Fn(RecvError) -> Error,
    ) -> kolo_core::Result<()> {
        match self.local_of.get(peer).copied().flatten() {
            Some(l) => self.shm.recv_posted(
                l,
                tag,
                buf,
                segment,
                reduce,
                deadline,
                meanwhile,
                each,
                &|e| recv_error(self.global_recv(e)),
            ),
            None => self.remote.recv_posted(
                peer, tag, buf, segment, reduce, deadline, meanwhile, each, recv_error,
            ),
        }
    }

    fn recycle(&self, payload: Vec<u8>) {
        self.remote.recycle(payload);
    }

    unsafe fn send_in_place(
        &self,
        peer: usize,
        header: &Header,
        payload: &[u8],
    ) -> Result<Option<u64>, LinkFailure> {
        match self.local_of.get(peer).copied().flatten() {
            // SAFETY: the caller's contract, passed on to the shared-memory world.
            Some(l) => {
                unsafe { self.shm.send_in_place(l, header, payload) }.map_err(|f| self.global(f))
            }
            None => self.remote.send(peer, header, payload).map(|()| None),
        }
    }

    fn in_place_min(&self) -> Option<usize> {
        self.shm.in_place_min()
    }

    fn in_place_done(&self, peer: usize, ticket: u64) -> Result<bool, LinkFailure> {
        match self.local_of.get(peer).copied().flatten() {
            Some(l) => self
                .shm
                .in_place_done(l, ticket)
                .map_err(|f| self.global(f)),
            None => Ok(true),
        }
    }

    fn wait_in_place(
        &self,
        peer: usize,
        ticket: u64,
        deadline: Option<Instant>,
    ) -> Result<(), RecvError> {
        match self.local_of.get(peer).copied().flatten() {
            Some(l) => self
                .shm
                .wait_in_place(l, ticket, deadline)
                .map_err(|e| self.global_recv(e)),
            None => Ok(()),
        }
    }

    unsafe fn post_recv(
        &self,
        peer: usize,
        tag: &Tag,
        buf: *mut u8,
        len: usize,
    ) -> Result<Option<u64>, LinkFailure> {
        match self.local_of.get(peer).copied().flatten() {
            // SAFETY: the caller's contract, passed on to the shared-memory world.
            Some(l) => unsafe { self.shm.post_recv(l, tag, buf, len) }.map_err(|f| self.global(f)),
            None => Ok(None),
        }
    }

    fn posted_recv(
        &self,
        posting: u64,
        block: bool,
        deadline: Option<Instant>,
    ) -> Result<Option<(Header, usize)>, RecvError> {
        self.shm
            .posted_recv(posting, block, deadline)
            .map_err(|e| self.global_recv(e))
    }

    fn unpost_recv(&self, posting: u64) {
        self.shm.unpost_recv(posting)
    }

    fn try_recv(&self, peer: usize, tag: &Tag) -> Result<Option<Message>, LinkFailure> {
        match self.local_of.get(peer).copied().flatten() {
            Some(l) => self.shm.try_recv(l, tag).map_err(|f| self.global(f)),
            None => self.remote.try_recv(peer, tag),
        }
    }

    /// Asks the shared-memory side for the peers of this host and the remote side for the others
    /// (a peer whose side has closed entirely is passed over while the other side may still send);
    /// `recv_any` polls this ([`Transport::recv_any`]'s default).
    fn try_recv_any(
        &self,
        peers: &[usize],
        tag: &Tag,
    ) -> Result<Option<(usize, Message)>, LinkFailure> {
        let (mut local, mut remote) = (Vec::new(), Vec::new());
        for &p in peers {
            match self.local_of.get(p).copied().flatten() {
                Some(l) => local.push(l),
                None => remote.push(p),
            }
        }
        let mut closed = None;
        let mut open = false;
        let mut note = |r: Result<Option<(usize, Message)>, LinkFailure>| match r {
            Ok(None) => {
                open = true;
                Ok(None)
            }
            Err(LinkFailure::PeerClosed { peer }) => {
                closed.get_or_insert(peer);
                Ok(None)
            }
            r => r,
        };
        if !local.is_empty() {
            let world = |l: usize| self.local_ranks.get(l).copied().unwrap_or(l);
            let r = self.shm.try_recv_any(&local, tag);
            let r = r.map(|m| m.map(|(l, m)| (world(l), m)));
            if let Some(m) = note(r.map_err(|f| self.global(f)))? {
                return Ok(Some(m));
            }
        }
        if !remote.is_empty() {
            if let Some(m) = note(self.remote.try_recv_any(&remote, tag))? {
                return Ok(Some(m));
            }
        }
        match closed {
            Some(peer) if !open => Err(LinkFailure::PeerClosed { peer }),
            _ => Ok(None),
        }
    }

    fn abort(&self, reason: &str) {
        self.shm.abort(reason);
        self.remote.abort(reason);
    }

    fn expect(&self, header: &Header) {
        self.shm.expect(header);
        self.remote.expect(header);
    }

    fn failure(&self) -> Option<LinkFailure> {
        self.remote
            .failure()
            .or_else(|| self.shm.failure().map(|f| self.global(f)))
    }
}
