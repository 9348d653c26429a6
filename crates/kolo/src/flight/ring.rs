//! The recorder's ring of slots: fixed size, written with relaxed atomic stores by the thread that
//! runs an operation (nothing allocated, nothing locked on the way), read by a dump from any thread.
//!
//! A slot's `id` (the operation's number + 1; 0 for a slot never written) is stored last with
//! Release when a slot is (re)claimed; a reader takes a slot only when `id` reads the same before and
//! after its fields, so a dump racing a writer sees the old operation, the new one, or skips the slot
//! — never a mix of two. Fields written later (start, state, end) are single atomics and may be seen
//! a moment late; a dump is a snapshot of a running process.

use std::panic::Location;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use kolo_core::Call;

/// The state of a recorded operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Issued (queued behind earlier asynchronous operations, or not yet started).
    Queued = 0,
    /// Running: this rank entered it and waits for its peers.
    Started = 1,
    /// Finished on this rank.
    Completed = 2,
    /// Failed on this rank.
    Failed = 3,
}

impl State {
    fn from_code(c: u8) -> State {
        match c {
            1 => State::Started,
            2 => State::Completed,
            3 => State::Failed,
            _ => State::Queued,
        }
    }

    /// Its name in a dump.
    pub(crate) fn name(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Started => "started",
            State::Completed => "completed",
            State::Failed => "failed",
        }
    }
}

/// What a slot holds, read back.
#[derive(Clone, Debug)]
pub(crate) struct Snapshot {
    pub id: u64,
    pub state: State,
    pub op: u8,
    pub dtype: u8,
    pub reduce: u8,
    pub algo: u8,
    /// Root (collectives) or peer (point-to-point); `u32::MAX` for none.
    pub rank: u32,
    pub count: u64,
    pub tag: u64,
    /// Nanoseconds on the recorder's clock (see `super::clock`); 0 for not known.
    pub queued: u64,
    pub started: u64,
    /// `started` is a coarse reading ([`Ring::stamp_running`]), not the exact start.
    pub start_coarse: bool,
    pub ended: u64,
    pub location: Option<&'static Location<'static>>,
}

/// A start time's mark for a coarse reading (the watcher's, for an operation found running
/// without one): such a start tells how long a rank waited, not when exactly it arrived.
const COARSE: u64 = 1 << 63;

/// The rank field's "none" (24 bits: ranks up to 16,777,214).
const NO_RANK: u64 = 0xFF_FFFF;

/// The state's bits of a slot's `meta`.
const STATE: u64 = 0b11;
/// A bit of `meta`: `queued` holds this operation's time of issue (else it is stale). Likewise
/// `ended` counts only for a failed operation and `tag` only in a ring of point-to-point
/// operations: a blocking collective's claim writes five words, not eight.
const QUEUED: u64 = 0b100;

/// The call and state of a slot in one word: state, op, dtype, reduce, algo (8 bits each) and
/// rank (24 bits), so that starting and ending an operation are one store each.
#[inline]
fn meta(state: State, op: u8, dtype: u8, reduce: u8, algo: u8, rank: Option<u32>) -> u64 {
    let rank = rank.map_or(NO_RANK, |r| u64::from(r).min(NO_RANK - 1));
    state as u64
        | u64::from(op) << 8
        | u64::from(dtype) << 16
        | u64::from(reduce) << 24
        | u64::from(algo) << 32
        | rank << 40
}

/// One operation: eight words, one cache line (a slot written costs one line, not two).
#[derive(Default)]
#[repr(align(64))]
struct Slot {
    id: AtomicU64,
    meta: AtomicU64,
    count: AtomicU64,
    tag: AtomicU64,
    queued: AtomicU64,
    started: AtomicU64,
    ended: AtomicU64,
    location: AtomicPtr<Location<'static>>,
}

/// A ring of slots (a power of two: finding a slot is a mask, not a division); operation `id`
/// lives in slot `id & mask`.
pub(crate) struct Ring {
    slots: Box<[Slot]>,
    mask: u64,
    /// Whether its operations have tags (point-to-point).
    tags: bool,
}

/// What a slot is claimed with.
pub(crate) struct Claim {
    pub id: u64,
    pub location: Option<&'static Location<'static>>,
    pub queued: u64,
}

/// An operation's call, as a slot keeps it.
pub(crate) struct Op {
    pub op: u8,
    pub dtype: u8,
    pub reduce: u8,
    pub algo: u8,
    pub rank: Option<u32>,
    pub count: u64,
    pub tag: u64,
}

impl Op {
    #[inline]
    pub(crate) fn of(call: &Call) -> Op {
        Op {
            op: call.op as u8,
            dtype: call.dtype.map_or(0, |d| d as u8),
            reduce: call.reduce.map_or(0, |r| r as u8),
            algo: call.algo as u8,
            rank: call.root,
            count: call.count,
            tag: 0,
        }
    }
}

impl Ring {
    /// A ring of at least `capacity` slots (the next power of two), of operations with tags
    /// (point-to-point) or without (collectives).
    pub(crate) fn new(capacity: usize, tags: bool) -> Ring {
        let n = capacity.max(1).next_power_of_two();
        Ring {
            slots: (0..n).map(|_| Slot::default()).collect(),
            mask: n as u64 - 1,
            tags,
        }
    }

    #[inline]
    fn slot(&self, id: u64) -> &Slot {
        // In bounds: the mask is the length minus one.
        &self.slots[(id & self.mask) as usize]
    }

    /// Claims the slot of operation `c.id`: queued, its call not known yet. The fields a start
    /// writes (count, tag, start time) keep the previous operation's values until then: a reader
    /// takes them only from a started slot.
    #[inline]
    pub(crate) fn claim(&self, c: Claim) {
        let s = self.slot(c.id);
        s.id.store(0, Ordering::Relaxed);
        s.meta.store(
            meta(State::Queued, 0, 0, 0, 0, None) | QUEUED,
            Ordering::Relaxed,
        );
        s.queued.store(c.queued, Ordering::Relaxed);
        let loc = c
            .location
            .map_or(ptr::null_mut(), |l| ptr::from_ref(l).cast_mut());
        s.location.store(loc, Ordering::Relaxed);
        s.id.store(c.id + 1, Ordering::Release);
    }

    /// Claims the slot of operation `id` and starts it at `at` in one pass (a blocking call).
    #[inline]
    pub(crate) fn claim_started(
        &self,
        id: u64,
        location: &'static Location<'static>,
        op: &Op,
        at: u64,
    ) {
        let s = self.slot(id);
        s.id.store(0, Ordering::Relaxed);
        s.meta.store(
            meta(State::Started, op.op, op.dtype, op.reduce, op.algo, op.rank),
            Ordering::Relaxed,
        );
        s.count.store(op.count, Ordering::Relaxed);
        if self.tags {
            s.tag.store(op.tag, Ordering::Relaxed);
        }
        s.started.store(at, Ordering::Relaxed);
        s.location
            .store(ptr::from_ref(location).cast_mut(), Ordering::Relaxed);
        s.id.store(id + 1, Ordering::Release);
    }

    /// Operation `id` (claimed) started at `at` (0: not timed).
    #[inline]
    pub(crate) fn start(&self, id: u64, op: &Op, at: u64) {
        let s = self.slot(id);
        s.count.store(op.count, Ordering::Relaxed);
        if self.tags {
            s.tag.store(op.tag, Ordering::Relaxed);
        }
        s.started.store(at, Ordering::Relaxed);
        s.meta.store(
            meta(State::Started, op.op, op.dtype, op.reduce, op.algo, op.rank) | QUEUED,
            Ordering::Release,
        );
    }

    /// Operation `id` ended (`at`: when, where known, else 0).
    #[inline]
    pub(crate) fn end(&self, id: u64, ok: bool, at: u64) {
        let s = self.slot(id);
        if s.id.load(Ordering::Relaxed) != id + 1 {
            return; // overwritten meanwhile: a ring far smaller than the operations in flight
        }
        if at != 0 {
            s.ended.store(at, Ordering::Relaxed);
        }
        let state = if ok { State::Completed } else { State::Failed };
        let m = s.meta.load(Ordering::Relaxed);
        s.meta.store(m & !STATE | state as u64, Ordering::Release);
    }

    /// Operation `id`'s exact start, `at` (known again where it failed).
    pub(crate) fn set_start(&self, id: u64, at: u64) {
        let s = self.slot(id);
        if s.id.load(Ordering::Relaxed) == id + 1 {
            s.started.store(at, Ordering::Relaxed);
        }
    }

    /// Gives every running operation without a start time the coarse reading `now`: how long a
    /// rank has waited in an operation that was not timed. A slot reclaimed at that moment may
    /// get it too, marked coarse all the same.
    pub(crate) fn stamp_running(&self, now: u64) {
        for s in self.slots.iter() {
            if s.id.load(Ordering::Acquire) == 0 {
                continue;
            }
            let state = State::from_code((s.meta.load(Ordering::Acquire) & STATE) as u8);
            if state == State::Started {
                let _ = s.started.compare_exchange(
                    0,
                    now | COARSE,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
        }
    }

    /// The operations held, oldest first.
    pub(crate) fn snapshot(&self) -> Vec<Snapshot> {
        let mut out = Vec::with_capacity(self.slots.len());
        for s in self.slots.iter() {
            let id = s.id.load(Ordering::Acquire);
            if id == 0 {
                continue;
            }
            let m = s.meta.load(Ordering::Acquire);
            let started = s.started.load(Ordering::Relaxed);
            let rank = m >> 40;
            let snap = Snapshot {
                id: id - 1,
                state: State::from_code((m & STATE) as u8),
                op: (m >> 8) as u8,
                dtype: (m >> 16) as u8,
                reduce: (m >> 24) as u8,
                algo: (m >> 32) as u8,
                rank: if rank == NO_RANK {
                    u32::MAX
                } else {
                    rank as u32
                },
                count: s.count.load(Ordering::Relaxed),
                tag: s.tag.load(Ordering::Relaxed),
                queued: if m & QUEUED != 0 {
                    s.queued.load(Ordering::Relaxed)
                } else {
                    0
                },
                started: started & !COARSE,
                start_coarse: started & COARSE != 0,
                ended: if m & STATE == State::Failed as u64 {
                    s.ended.load(Ordering::Relaxed)
                } else {
                    0
                },
                // SAFETY: only `&'static Location`s (or null) are ever stored.
                location: unsafe { s.location.load(Ordering::Relaxed).as_ref() },
            };
            if s.id.load(Ordering::Acquire) == id {
                out.push(match snap.state {
                    // Not started: what a start writes is still the previous operation's.
                    State::Queued => Snapshot {
                        count: 0,
                        tag: 0,
                        started: 0,
                        start_coarse: false,
                        ended: 0,
                        ..snap
                    },
                    _ => snap,
                });
            }
        }
        out.sort_by_key(|s| s.id);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_core::{Algorithm, DType, OpKind, ReduceOp};

    /// An all-reduce of 7 f32 values (sum, ring).
    fn all_reduce() -> Call {
        Call {
            op: OpKind::AllReduce,
            dtype: Some(DType::F32),
            reduce: Some(ReduceOp::Sum),
            count: 7,
            root: None,
            algo: Algorithm::Ring,
        }
    }

    #[test]
    fn keeps_the_last_operations_in_order() {
        let r = Ring::new(4, false);
        let call = all_reduce();
        for id in 0..6 {
            r.claim(Claim {
                id,
                location: Some(Location::caller()),
                queued: 0,
            });
            r.start(id, &Op::of(&call), 100 + id);
            if id < 5 {
                r.end(id, id != 3, 0);
            }
        }
        let s = r.snapshot();
        let ids: Vec<u64> = s.iter().map(|s| s.id).collect();
        assert_eq!(ids, [2, 3, 4, 5], "the last four, oldest first");
        let states: Vec<State> = s.iter().map(|s| s.state).collect();
        assert_eq!(
            states,
            [
                State::Completed,
                State::Failed,
                State::Completed,
                State::Started
            ]
        );
        assert_eq!(
            (s[3].count, s[3].started, s[3].op),
            (7, 105, OpKind::AllReduce as u8)
        );
        assert!(s[0].location.is_some_and(|l| l.file().ends_with("ring.rs")));
        assert_eq!(
            (s[3].rank, s[3].dtype, s[3].reduce),
            (u32::MAX, DType::F32 as u8, ReduceOp::Sum as u8)
        );
        // Claimed and started at once, with a root.
        let rooted = Op {
            rank: Some(5),
            ..Op::of(&call)
        };
        r.claim_started(6, Location::caller(), &rooted, 7);
        let s6 = r
            .snapshot()
            .pop()
            .map(|s| (s.id, s.rank, s.state, s.started));
        assert_eq!(s6, Some((6, 5, State::Started, 7)));
        // Ending an operation whose slot was taken over changes nothing.
        r.end(1, true, 9);
        assert_eq!(
            (r.snapshot()[3].state, r.snapshot()[3].ended),
            (State::Started, 0)
        );
    }

    #[test]
    fn running_operations_without_a_start_get_a_coarse_one_and_stale_fields_are_not_read() {
        let r = Ring::new(4, false);
        let call = all_reduce();
        let op = Op::of(&call);
        // 0: queued, then started untimed, failed with an end time.
        r.claim(Claim {
            id: 0,
            location: None,
            queued: 40,
        });
        r.start(0, &op, 0);
        r.end(0, false, 90);
        // 4 reuses 0's slot: blocking, untimed, running.
        r.claim_started(4, Location::caller(), &op, 0);
        // 1: timed, running; 2: untimed, completed.
        r.claim_started(1, Location::caller(), &op, 55);
        r.claim_started(2, Location::caller(), &op, 0);
        r.end(2, true, 0);
        r.stamp_running(500);
        let s = r.snapshot();
        let by_id = |id: u64| s.iter().find(|x| x.id == id).expect("held");
        let four = by_id(4);
        // The slot's queued and ended times were 0's: not 4's.
        assert_eq!((four.queued, four.ended), (0, 0));
        assert_eq!((four.started, four.start_coarse), (500, true));
        assert_eq!((by_id(1).started, by_id(1).start_coarse), (55, false));
        assert_eq!((by_id(2).started, by_id(2).start_coarse), (0, false));
        // A failed operation keeps its end time and, set again, its exact start.
        r.end(4, false, 700);
        r.set_start(4, 450);
        let four = r.snapshot().into_iter().find(|x| x.id == 4).expect("held");
        assert_eq!(
            (four.state, four.started, four.start_coarse, four.ended),
            (State::Failed, 450, false, 700)
        );
    }
}
