//! The flight recorder: what each rank was doing when a job failed or hung.
//!
//! Every communicator keeps a ring of its last operations (collectives and
//! point-to-point, `KOLO_FLIGHT_RECORDS` of each, 2,048 by default, rounded up to a power of two, 0 for none): the operation's
//! number (a collective's sequence number, the one its messages are tagged with), what it was
//! (operation, element type, count, root or peer, reduce operator, algorithm), its state (queued,
//! started, completed, failed), when it was issued and started, and the caller's source location.
//! Recording costs relaxed stores into a preallocated slot. Start times are the instant the
//! collective takes anyway for its deadline, turned into the recorder's clock for one collective in
//! [`TIMED_EVERY`] (by sequence number, so every rank times the same ones: the straggler report's
//! sample) and for every collective that fails; the watcher thread gives a running collective
//! without one a coarse reading, so that a hang still says how long each rank waited. End times are
//! taken (from the coarse clock) only for point-to-point operations and failures.
//!
//! Each rank writes its record as JSON ([`FlightDump`], one file per rank, `rank-R.json`) into
//! `KOLO_TRACE_DIR` (`kolo run` sets it; else `$TMPDIR/kolo-trace-<job>`) when its world first
//! fails (timeout, mismatch, lost peer — the rank that notices and, by the failure passed on, its
//! peers), on `SIGUSR1` (which `kolo run` forwards to its workers: `kolo diagnose --live`), and on
//! demand ([`crate::Communicator::dump_flight_record`]). `kolo diagnose DIR` merges the files:
//! [`analysis`].

pub mod analysis;
mod clock;
mod dump;
mod record;
mod ring;

use std::panic::Location;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

use kolo_core::{Call, DType, OpKind};

pub(crate) use dump::{collect, write_dump};
pub(crate) use dump::{on_failure, watch, Watched};
pub use dump::{signal_on_failure, trace_dir};
pub use record::{FlightDump, GroupRecord, OpRecord};
use ring::{Claim, Op, Ring};

/// Operations of each kind a recorder keeps unless `KOLO_FLIGHT_RECORDS` says otherwise.
pub const DEFAULT_RECORDS: usize = 2048;

/// Collectives whose sequence number is a multiple of this have their exact start time recorded
/// (besides every failed one). Timing every collective cost a 4-byte all-reduce 1.5 % more than
/// recording the rest of it did.
pub const TIMED_EVERY: u64 = 8;

/// `KOLO_FLIGHT_RECORDS`, read once.
pub(crate) fn capacity() -> usize {
    static CAP: OnceLock<usize> = OnceLock::new();
    *CAP.get_or_init(|| {
        std::env::var("KOLO_FLIGHT_RECORDS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_RECORDS)
    })
}

/// One communicator's record of its last operations: cache-line aligned, so that the fields every
/// collective reads and writes share no line with another thread's data.
#[repr(align(64))]
pub(crate) struct FlightRecorder {
    /// `None` with `KOLO_FLIGHT_RECORDS=0`.
    rings: Option<Box<(Ring, Ring)>>,
    /// The rings while recording (null when off or paused): one load tells both.
    active: AtomicPtr<(Ring, Ring)>,
    next_p2p: AtomicU64,
    /// The group's id (part of every tag), its members (transport ranks) and this rank in it.
    pub group: u64,
    pub members: Vec<usize>,
    pub rank: usize,
    /// This process's rank in the world (the transport's).
    pub world_rank: usize,
    /// Which world: the transport's address, shared by the world and its sub-groups.
    pub world: usize,
    /// The first failure, as text.
    error: Mutex<Option<String>>,
    /// Whether this world's record has been written for its failure.
    dumped: AtomicBool,
    /// Whether it has been written again once the failed operation's record was complete.
    redumped: AtomicBool,
    /// The caller of the blocking collective issued last and not started yet (null: none).
    /// Threads that issue blocking collectives on one communicator at once may see each other's;
    /// that only mislabels a line of the record.
    issued: AtomicPtr<Location<'static>>,
    /// The process-wide clock base, kept here so that reading it costs nothing.
    clock: clock::Clock,
}

/// A point-to-point operation being recorded; [`P2p::end`] marks it done.
pub(crate) struct P2p<'a> {
    rec: &'a FlightRecorder,
    id: u64,
}

impl P2p<'_> {
    /// Marks the operation completed (or failed, with the time).
    pub fn end<T, E>(self, r: &Result<T, E>) {
        if let Some((_, p2p)) = self.rec.rings() {
            match r {
                Ok(_) => p2p.end(self.id, true, 0),
                Err(_) => p2p.end(self.id, false, self.rec.clock.coarse_now()),
            }
        }
    }
}

impl FlightRecorder {
    pub(crate) fn new(
        group: u64,
        members: Vec<usize>,
        (rank, world_rank): (usize, usize),
        world: usize,
        cap: usize,
    ) -> Arc<FlightRecorder> {
        let rings = (cap > 0).then(|| Box::new((Ring::new(cap, false), Ring::new(cap, true))));
        let active = rings
            .as_deref()
            .map_or(std::ptr::null_mut(), |r| std::ptr::from_ref(r).cast_mut());
        let rec = Arc::new(FlightRecorder {
            rings,
            active: AtomicPtr::new(active),
            next_p2p: AtomicU64::new(0),
            group,
            members,
            rank,
            world_rank,
            world,
            error: Mutex::new(None),
            dumped: AtomicBool::new(false),
            redumped: AtomicBool::new(false),
            issued: AtomicPtr::new(std::ptr::null_mut()),
            clock: clock::Clock::get(),
        });
        registry::add(Arc::downgrade(&rec));
        rec
    }

    /// The rings, unless recording is off or paused.
    #[inline]
    fn rings(&self) -> Option<&(Ring, Ring)> {
        // SAFETY: `active` is null or points into `self.rings`, which lives as long as `self`.
        unsafe { self.active.load(Ordering::Relaxed).as_ref() }
    }

    /// Pauses (or resumes) recording (for measuring what it costs on one communicator).
    pub(crate) fn pause(&self, paused: bool) {
        let active = match (&self.rings, paused) {
            (Some(r), false) => std::ptr::from_ref(&**r).cast_mut(),
            _ => std::ptr::null_mut(),
        };
        self.active.store(active, Ordering::Relaxed);
    }

    /// Collective `seq` issued by the caller at `location` (`queued`: behind asynchronous work,
    /// with the time: it takes its slot now). A blocking call's issue is its start: the location
    /// waits here and the start writes the slot in one pass.
    // `inline(always)` here and in `start` and `end`, with what is rare kept out of line: a call
    // of each per collective was a fifth of the recording's cost.
    #[inline(always)]
    pub(crate) fn issue(&self, seq: u64, location: &'static Location<'static>, queued: bool) {
        if let Some((coll, _)) = self.rings() {
            if queued {
                self.claim_queued(coll, seq, location);
            } else {
                self.issued
                    .store(std::ptr::from_ref(location).cast_mut(), Ordering::Relaxed);
            }
        }
    }

    #[inline(never)]
    fn claim_queued(&self, coll: &Ring, seq: u64, location: &'static Location<'static>) {
        coll.claim(Claim {
            id: seq,
            location: Some(location),
            queued: self.clock.coarse_now(),
        });
    }

    /// Now, from the coarse clock (see [`clock::Clock::coarse_instant`]): where a deadline counts
    /// from.
    #[inline]
    pub(crate) fn coarse_instant(&self) -> Instant {
        self.clock.coarse_instant()
    }

    /// Collective `seq` starts now as `call`; returns the instant its deadline counts from. Its
    /// start time is recorded for one in [`TIMED_EVERY`], read from the exact clock; the others
    /// take the coarse clock's (`Instant::now()` costs ~25 ns in a virtual machine).
    #[inline(always)]
    pub(crate) fn start(&self, seq: u64, call: &Call) -> Instant {
        let timed = seq.is_multiple_of(TIMED_EVERY);
        let now = if timed {
            Instant::now()
        } else {
            self.clock.coarse_instant()
        };
        if let Some((coll, _)) = self.rings() {
            let op = Op::of(call);
            let at = if timed { self.clock.nanos(now) } else { 0 };
            // SAFETY: `issued` holds only `&'static Location`s (or null).
            match unsafe { self.issued.load(Ordering::Relaxed).as_ref() } {
                Some(location) => {
                    self.issued.store(std::ptr::null_mut(), Ordering::Relaxed);
                    coll.claim_started(seq, location, &op, at);
                }
                None => coll.start(seq, &op, at),
            }
        }
        now
    }

    /// Collective `seq`, started at `at`, ended.
    #[inline(always)]
    pub(crate) fn end<T>(&self, seq: u64, at: Instant, r: &kolo_core::Result<T>) {
        if let Some((coll, _)) = self.rings() {
            // A failed collective's error is noted when it poisons the communicator.
            if r.is_ok() {
                coll.end(seq, true, 0);
            } else {
                self.end_failed(coll, seq, at);
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn end_failed(&self, coll: &Ring, seq: u64, at: Instant) {
        coll.set_start(seq, self.clock.nanos(at));
        coll.end(seq, false, self.clock.coarse_now());
        // The record written at the failure saw this collective still running.
        dump::after_failed_op(self);
    }

    /// Gives the running collectives and point-to-point operations without a start time a
    /// coarse one (the watcher's tick).
    pub(crate) fn stamp_running(&self) {
        if let Some((coll, p2p)) = self.rings() {
            let now = self.clock.coarse_now();
            coll.stamp_running(now);
            p2p.stamp_running(now);
        }
    }

    /// A point-to-point operation starts: `send` or a receive, with `peer` (`None`: any source),
    /// element type, count and tag.
    #[inline]
    #[track_caller]
    pub(crate) fn p2p(
        &self,
        receive: bool,
        peer: Option<usize>,
        dtype: DType,
        count: usize,
        tag: u64,
    ) -> P2p<'_> {
        let id = self.next_p2p.fetch_add(1, Ordering::Relaxed);
        if let Some((_, p2p)) = self.rings() {
            let op = Op {
                op: if receive {
                    record::RECV
                } else {
                    OpKind::Send as u8
                },
                dtype: dtype as u8,
                reduce: 0,
                algo: 0,
                rank: Some(peer.map_or(record::ANY_PEER, |p| p as u32)),
                count: count as u64,
                tag,
            };
            // No clock read here (it cost a tenth of a small message): the watcher gives an
            // operation still running at its next tick a coarse start (`stamp_running`).
            p2p.claim_started(id, Location::caller(), &op, 0);
        }
        P2p { rec: self, id }
    }

    /// Remembers the first failure seen on this communicator.
    pub(crate) fn note_error(&self, e: &str) {
        let mut first = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some(e.to_string());
        }
    }

    /// This communicator's part of a dump.
    pub(crate) fn record(&self) -> GroupRecord {
        let (coll, p2p) = match self.rings.as_deref() {
            Some((c, p)) => (c.snapshot(), p.snapshot()),
            None => (Vec::new(), Vec::new()),
        };
        let error = self.error.lock().unwrap_or_else(|p| p.into_inner()).clone();
        GroupRecord {
            world: String::new(),
            group: format!("{:x}", self.group),
            rank: self.rank,
            size: self.members.len(),
            members: self.members.clone(),
            collectives: coll.iter().map(|s| record::op_record(s, false)).collect(),
            p2p: p2p.iter().map(|s| record::op_record(s, true)).collect(),
            error,
        }
    }

    /// Claims this world's one dump on failure: true the first time.
    pub(crate) fn claim_failure_dump(&self) -> bool {
        !self.dumped.swap(true, Ordering::AcqRel)
    }

    /// Claims the one rewrite of this world's failure dump: true the first time, and only after
    /// the dump.
    pub(crate) fn claim_redump(&self) -> bool {
        self.dumped.load(Ordering::Acquire) && !self.redumped.swap(true, Ordering::AcqRel)
    }

    /// The first failure noted.
    pub(crate) fn first_error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Every live recorder of the process, for the dumps.
pub(crate) mod registry {
    use super::*;

    static ALL: Mutex<Vec<Weak<FlightRecorder>>> = Mutex::new(Vec::new());

    pub(crate) fn add(rec: Weak<FlightRecorder>) {
        let mut all = ALL.lock().unwrap_or_else(|p| p.into_inner());
        if all.len() >= 64 && all.len().is_power_of_two() {
            all.retain(|w| w.strong_count() > 0);
        }
        all.push(rec);
    }

    /// The live recorders of world `world` (every world with `None`), in creation order.
    pub(crate) fn of(world: Option<usize>) -> Vec<Arc<FlightRecorder>> {
        let mut all = ALL.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.iter()
            .filter_map(Weak::upgrade)
            .filter(|r| world.is_none_or(|w| r.world == w))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receive_still_running_at_the_watchers_tick_gets_a_coarse_start() {
        let rec = FlightRecorder::new(1, vec![0, 1], (0, 0), 0, 8);
        let send = rec.p2p(false, Some(1), DType::F32, 4, 7);
        send.end::<(), ()>(&Ok(()));
        let _recv = rec.p2p(true, Some(1), DType::F32, 4, 7);
        let p2p = rec.record().p2p;
        assert!(p2p.iter().all(|o| o.started.is_none()), "{p2p:?}");
        rec.stamp_running();
        let p2p = rec.record().p2p;
        assert_eq!(p2p.len(), 2);
        assert_eq!((p2p[0].state.as_str(), p2p[0].started), ("completed", None));
        assert_eq!(p2p[1].state, "started");
        assert!(
            p2p[1].started.is_some() && p2p[1].start_coarse,
            "{:?}",
            p2p[1]
        );
    }
}

#[cfg(test)]
mod cost {
    use super::*;
    use kolo_core::{Algorithm, ReduceOp};

    #[test]
    #[ignore = "a measurement: cargo test -p kolo --release flight::cost -- --ignored --nocapture"]
    fn recording_a_blocking_collective() {
        let rec = FlightRecorder::new(1, vec![0, 1], (0, 0), 0, DEFAULT_RECORDS);
        let call = Call {
            op: OpKind::AllReduce,
            dtype: Some(DType::F32),
            reduce: Some(ReduceOp::Sum),
            count: 1,
            root: None,
            algo: Algorithm::Shm,
        };
        let n = 10_000_000u64;
        let at = Instant::now();
        let t = Instant::now();
        for seq in 0..n {
            rec.issue(seq, Location::caller(), false);
            let at = rec.start(seq, &call);
            rec.end::<()>(seq, at, &Ok(()));
        }
        let per = t.elapsed().as_nanos() as f64 / n as f64;
        println!("issue + start + end: {per:.1} ns per collective");
        let t = Instant::now();
        let mut x = 0;
        for _ in 0..n {
            x += rec.clock.nanos(std::hint::black_box(at));
        }
        println!(
            "nanos: {:.1} ns ({x})",
            t.elapsed().as_nanos() as f64 / n as f64
        );
        let (coll, _) = rec.rings.as_deref().expect("recording is on");
        let op = ring::Op::of(&call);
        let t = Instant::now();
        for seq in 0..n {
            coll.claim_started(seq, Location::caller(), &op, 5);
        }
        println!(
            "claim_started: {:.1} ns",
            t.elapsed().as_nanos() as f64 / n as f64
        );
        let t = Instant::now();
        for seq in 0..n {
            coll.end(seq, true, 0);
        }
        println!("end: {:.1} ns", t.elapsed().as_nanos() as f64 / n as f64);
    }
}
