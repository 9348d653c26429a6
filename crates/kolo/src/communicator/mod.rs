//! The [`Communicator`]: a group of ranks over a transport, with rank/size/topology queries and the
//! failure state that makes errors stick. The sequencing that gives every collective its own tag,
//! and the running of one collective, are in `run.rs`.
//!
//! The operations themselves live in `collectives/`, `p2p.rs`, `object.rs` and `group.rs`; what
//! runs the collectives is the communicator's backend (`backend/`), its waiting primitives are in
//! `wait.rs`.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use kolo_core::{Engine, Error, Result, Transport};
use kolo_store::TcpStoreServer;

use crate::backend::{self, Backend, Members};
use crate::config::Config;
use crate::flight::FlightRecorder as Recorder;
pub(crate) use crate::topology::Topology;
use crate::wait::{Pending, Turn};
use crate::work::WorkQueue;

mod flight;
mod run;
pub(crate) use run::panic_message;

pub(crate) use crate::backend::ARENA_GROUP;

pub(crate) struct Inner {
    pub transport: Arc<dyn Transport>,
    /// What runs the collectives: kolo's algorithms over `transport`, or a collective engine (MPI).
    pub backend: Box<dyn Backend>,
    /// Group rank → transport rank.
    pub members: Vec<usize>,
    /// This process's group rank.
    pub rank: usize,
    /// Group id, part of every tag.
    pub group: u64,
    pub topology: Arc<Topology>,
    pub config: Config,
    seq: AtomicU64,
    failed: Mutex<Option<Arc<Error>>>,
    /// Set (after `failed`) once this communicator has failed: lets calls skip the lock.
    has_failed: AtomicBool,
    /// Serializes issuing (sequence numbers) and waits for queued async work.
    issue: Mutex<()>,
    pending: Arc<Pending>,
    queue: Mutex<Option<WorkQueue>>,
    /// Whether this group owns the transport's arena (the world communicator of a shared-memory
    /// world does): then every collective starts with a fingerprint step in shared memory.
    uses_arena: bool,
    /// With an arena: the sequence number whose turn it is (arena steps must follow issue order even
    /// when several threads call blocking collectives).
    turn: Turn,
    /// The record of this communicator's last operations (see `crate::flight`).
    pub recorder: Arc<Recorder>,
    /// The rendezvous server, when this rank hosts it (kept alive with the world communicator).
    _store_server: Option<Arc<TcpStoreServer>>,
}

/// A group of ranks that communicate: point-to-point messages and collectives.
///
/// Cheap to clone (a handle). Collectives on one communicator must be called in the same order on
/// every rank of its group; each gets the next sequence number, which tags its messages, and carries
/// a fingerprint (operation, element type, count, root, reduce operator, algorithm) that every receiver
/// checks. An error in a collective poisons the communicator: the peers are told, and every later call
/// on any rank returns [`Error::Failed`] with the first error.
#[derive(Clone)]
pub struct Communicator {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .field("transport", &self.inner.transport.kind())
            .field("group", &format_args!("{:x}", self.inner.group))
            .finish()
    }
}

impl Communicator {
    pub(crate) fn from_parts(
        transport: Arc<dyn Transport>,
        members: Vec<usize>,
        rank: usize,
        group: u64,
        topology: Arc<Topology>,
        config: Config,
        store_server: Option<Arc<TcpStoreServer>>,
    ) -> Communicator {
        Communicator::assemble(
            transport,
            None,
            members,
            rank,
            group,
            topology,
            config,
            store_server,
        )
    }

    /// [`Communicator::from_parts`] with a collective engine.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn assemble(
        transport: Arc<dyn Transport>,
        engine: Option<Arc<dyn Engine>>,
        members: Vec<usize>,
        rank: usize,
        group: u64,
        topology: Arc<Topology>,
        config: Config,
        store_server: Option<Arc<TcpStoreServer>>,
    ) -> Communicator {
        // A longer timeout than the longest kept (set through the public field) means the same.
        let timeout = config.timeout;
        let config = config.with_timeout(timeout);
        let uses_arena = group == ARENA_GROUP
            && transport.arena().is_some()
            && members.iter().copied().eq(0..transport.size());
        let backend = backend::choose(
            engine,
            &Members {
                members: &members,
                rank,
                group,
                topology: &topology,
                arena: uses_arena,
            },
        );
        let recorder = Recorder::new(
            group,
            members.clone(),
            (rank, transport.rank()),
            Arc::as_ptr(&transport).cast::<()>() as usize,
            config
                .flight_records
                .unwrap_or_else(crate::flight::capacity),
        );
        let comm = Communicator {
            inner: Arc::new(Inner {
                recorder,
                uses_arena,
                backend,
                turn: Turn::default(),
                transport,
                members,
                rank,
                group,
                topology,
                config,
                seq: AtomicU64::new(0),
                failed: Mutex::new(None),
                has_failed: AtomicBool::new(false),
                issue: Mutex::new(()),
                pending: Arc::new(Pending::default()),
                queue: Mutex::new(None),
                _store_server: store_server,
            }),
        };
        if group == ARENA_GROUP {
            let world: Arc<dyn crate::stop_report::StopReport> = comm.inner.clone();
            crate::stop_report::watch(Arc::downgrade(&world));
        }
        comm
    }

    /// A world communicator over any [`Transport`] (all ranks taken to share one node). Used to bring
    /// a custom transport, and by the test suites to run every transport through the same tests.
    pub fn with_transport(transport: Arc<dyn Transport>, config: Config) -> Communicator {
        let size = transport.size();
        let rank = transport.rank();
        Communicator::from_parts(
            transport,
            (0..size).collect(),
            rank,
            1,
            Arc::new(Topology::single_node(size)),
            config,
            None,
        )
    }

    /// This process's rank in the group, `0..size()`.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of ranks in the group.
    pub fn size(&self) -> usize {
        self.inner.members.len()
    }

    /// Rank among the group's members on this node.
    pub fn local_rank(&self) -> usize {
        let me = self.node_of(self.rank());
        (0..self.rank()).filter(|&r| self.node_of(r) == me).count()
    }

    /// Number of the group's members on this node.
    pub fn local_size(&self) -> usize {
        let me = self.node_of(self.rank());
        (0..self.size()).filter(|&r| self.node_of(r) == me).count()
    }

    /// Index of this node among the group's nodes (numbered by their lowest rank).
    pub fn node_rank(&self) -> usize {
        let me = self.node_of(self.rank());
        let mut seen = Vec::new();
        for r in 0..self.size() {
            let n = self.node_of(r);
            if !seen.contains(&n) {
                seen.push(n);
            }
        }
        seen.iter().position(|&n| n == me).unwrap_or(0)
    }

    /// Number of nodes the group spans.
    pub fn num_nodes(&self) -> usize {
        let mut nodes: Vec<usize> = (0..self.size()).map(|r| self.node_of(r)).collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes.len()
    }

    fn node_of(&self, group_rank: usize) -> usize {
        let t = self.inner.members[group_rank];
        self.inner.topology.node_of.get(t).copied().unwrap_or(0)
    }

    /// Name of the transport (`local`, `shm`, `tcp`, `shm+tcp`, `mpi`).
    pub fn transport_kind(&self) -> &'static str {
        self.inner.transport.kind()
    }

    /// Who runs the collectives: `kolo` (kolo's own algorithms over the transport) or the name of
    /// the collective engine (`mpi`).
    pub fn backend(&self) -> &'static str {
        self.inner.backend.name()
    }

    /// The settings this communicator runs with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The first error that poisoned this communicator, if any.
    pub fn failure(&self) -> Option<Arc<Error>> {
        self.inner.failure()
    }

    /// Fails this communicator and every peer's (their pending and later calls return an
    /// [`Error::Aborted`] naming this rank and `reason`). Like `ncclCommAbort` or `MPI_Abort` without
    /// the exit.
    pub fn abort(&self, reason: &str) {
        self.inner.poison(Error::Aborted {
            op: "abort",
            rank: self.rank(),
            by: self.rank(),
            kind: kolo_core::ErrorKind::Other,
            reason: reason.to_string(),
        });
    }
}

impl Inner {
    pub fn size(&self) -> usize {
        self.members.len()
    }

    pub fn failure(&self) -> Option<Arc<Error>> {
        self.lock_failed().clone()
    }

    fn lock_failed(&self) -> MutexGuard<'_, Option<Arc<Error>>> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When an operation issued now times out: the communicator's timeout from now on the
    /// coarse clock (at most a tick early; see the recorder's clock).
    #[inline]
    pub(crate) fn deadline(&self) -> std::time::Instant {
        self.recorder.coarse_instant() + self.config.timeout
    }

    /// Returns the sticky failure, if any, as an error.
    #[inline]
    pub fn check(&self) -> Result<()> {
        if !self.has_failed.load(Ordering::Acquire) {
            return Ok(());
        }
        match self.failure() {
            Some(first) => Err(Error::Failed {
                rank: self.rank,
                first,
            }),
            None => Ok(()),
        }
    }

    /// When torchrun stops this worker (see `stop_report`): records the transport's failure, if it
    /// has one, as this communicator's; returns whether the communicator has failed.
    pub fn report_on_stop(&self) -> bool {
        if let Some(first) = self.failure() {
            // Its own thread may be about to write it: the first writer wins, the file is whole.
            crate::error_file::record_error(&first.to_string());
            return true;
        }
        match self.transport.failure() {
            Some(f) => {
                self.poison(
                    f.into_error("the call in progress when torchrun stopped it", self.rank),
                );
                true
            }
            None => false,
        }
    }

    /// Records `e` as this communicator's failure (if it is the first) and tells the peers, then
    /// returns it.
    pub fn poison(&self, e: Error) -> Error {
        let mut f = self.lock_failed();
        if f.is_some() {
            return e;
        }
        *f = Some(Arc::new(e.clone()));
        self.has_failed.store(true, Ordering::Release);
        drop(f);
        self.recorder.note_error(&e.to_string());
        crate::flight::on_failure(&self.recorder, &e.to_string());
        // Under torchrun, the first failure is what its summary shows as the root cause.
        crate::error_file::record_error(&e.to_string());
        // A peer's abort already reached everyone; echoing it would only add noise.
        if !matches!(e, Error::Aborted { by, .. } if by != self.rank) {
            // The kind travels with the text: a peer's error is then of the same kind. This
            // rank's own abort sends its reason alone: the peers' error names this rank already.
            let text = match &e {
                Error::Aborted { by, reason, .. } if *by == self.rank => reason.clone(),
                other => other.to_string(),
            };
            self.transport
                .abort(&kolo_core::error_kind::encode_abort(e.kind(), &text));
        }
        e
    }
}
