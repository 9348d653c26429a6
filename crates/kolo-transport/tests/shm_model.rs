//! Model check (with `loom`: every interleaving and memory-order outcome) of the shared-memory
//! transport's lock-free protocols, on the shipping code: this test compiles `src/shm/doorbell.rs`,
//! `src/shm/spsc.rs` and `src/shm/steps.rs` themselves (`#[path]` modules) against the `atomics`
//! module below, a `loom` version of `src/shm/atomics.rs`, the only module through which those
//! files reach atomics, the futex and shared bytes. It checks:
//!
//! - the single-producer single-consumer ring (`Spsc`: `tail` released by the producer after
//!   writing data, `head` released by the consumer after reading it), including wrap-around and a
//!   full ring;
//! - the doorbell sleep/wake handshake (`Doorbell`), with the futex modelled as "sleep while the
//!   word equals the value read, until a wake": a lost wake-up shows as a deadlock, which loom
//!   reports. (The real waits also time out to poll liveness, which would hide such a bug, so the
//!   model ignores the timeout.)
//! - the arena's rounds (`Steps` and `kolo_core::arena`): step posts with their slots, two buffers
//!   per rank alternating by round, no synchronization besides the posts.
//!
//! Data bytes are loom `UnsafeCell`s, so a read that could race with a write fails the check. Two
//! deliberately broken variants (a `Relaxed` tail store, a sleeper that registers after reading the
//! doorbell) must be caught, which shows the checks can fail.
//!
//! It needs no flag or feature: `cargo nextest run -p kolo-transport` (and the workspace run of
//! `scripts/test.sh`) runs it like any other test; loom is a dev-dependency.

// Not every function of the shipping files is exercised here.
#[allow(dead_code)]
#[path = "../src/shm/doorbell.rs"]
mod doorbell;
#[allow(dead_code)]
#[path = "../src/shm/spsc.rs"]
mod spsc;
#[allow(dead_code)]
#[path = "../src/shm/steps.rs"]
mod steps;

/// `src/shm/atomics.rs` on loom.
#[allow(dead_code)]
mod atomics {
    use std::time::Duration;

    use loom::cell::UnsafeCell;
    use loom::sync::{Condvar, Mutex};

    pub(super) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

    loom::lazy_static! {
        /// The kernel's futex queue: waiters compare the word and sleep under this lock, wakers
        /// take it to wake them, so no wake-up falls between a waiter's compare and its sleep.
        static ref FUTEX: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
    }

    /// `futex_wait`: sleeps while `*word == expected`, until a wake. The timeout is ignored, so a
    /// lost wake-up deadlocks.
    pub(super) fn futex_wait(word: &AtomicU32, expected: u32, _timeout: Duration) {
        let (lock, cond) = &*FUTEX;
        let mut g = lock.lock().expect("model futex lock");
        while word.load(Ordering::SeqCst) == expected {
            g = cond.wait(g).expect("model futex wait");
        }
    }

    /// `futex_wake`: wakes every sleeper (each re-checks its own word).
    pub(super) fn futex_wake(_word: &AtomicU32) {
        let (lock, cond) = &*FUTEX;
        let _g = lock.lock().expect("model futex lock");
        cond.notify_all();
    }

    /// Shared bytes as loom cells: every access is checked for races.
    #[derive(Clone, Copy, Debug)]
    pub(super) struct SharedBytes<'a> {
        cells: &'a [UnsafeCell<u8>],
    }

    impl<'a> SharedBytes<'a> {
        pub(super) fn new(cells: &'a [UnsafeCell<u8>]) -> SharedBytes<'a> {
            SharedBytes { cells }
        }

        pub(super) fn len(&self) -> usize {
            self.cells.len()
        }

        /// # Safety
        ///
        /// As `src/shm/atomics.rs` (loom checks it).
        pub(super) unsafe fn write(&self, at: usize, src: &[u8]) {
            for (cell, &b) in self.cells[at..at + src.len()].iter().zip(src) {
                // SAFETY (model): loom reports a write that races with another access.
                cell.with_mut(|p| unsafe { *p = b });
            }
        }

        /// # Safety
        ///
        /// As `src/shm/atomics.rs` (loom checks it).
        pub(super) unsafe fn write_u64(&self, at: usize, v: u64) {
            // SAFETY (model): as `write`.
            unsafe { self.write(at, &v.to_le_bytes()) }
        }

        /// # Safety
        ///
        /// As `src/shm/atomics.rs` (loom checks it).
        pub(super) unsafe fn read_u64(&self, at: usize) -> u64 {
            let mut b = [0u8; 8];
            // SAFETY (model): as `read`.
            unsafe { self.read(at, &mut b) };
            u64::from_le_bytes(b)
        }

        /// A hint in the real one; nothing here.
        pub(super) fn prefetch(&self, _at: usize) {}

        /// # Safety
        ///
        /// As `src/shm/atomics.rs` (loom checks it).
        pub(super) unsafe fn read(&self, at: usize, dst: &mut [u8]) {
            for (cell, b) in self.cells[at..at + dst.len()].iter().zip(dst) {
                // SAFETY (model): loom reports a read that races with a write.
                *b = cell.with(|p| unsafe { *p });
            }
        }
    }
}

use std::time::Duration;

use atomics::{AtomicU32, AtomicU64, Ordering, SharedBytes};
use doorbell::Doorbell;
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use spsc::Spsc;
use steps::{Steps, FP_SLOT};

const CAP: usize = 2;

/// Explores every interleaving with up to three preemptions (loom's usual bound; exhaustive
/// exploration of these loops does not finish in CI time).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

fn cells(n: usize) -> Vec<UnsafeCell<u8>> {
    (0..n).map(|_| UnsafeCell::new(0)).collect()
}

/// A rank's doorbell words.
struct Bell {
    word: AtomicU32,
    sleepers: AtomicU32,
}

impl Bell {
    fn new() -> Bell {
        Bell {
            word: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
        }
    }

    fn doorbell(&self) -> Doorbell<'_> {
        Doorbell {
            word: &self.word,
            sleepers: &self.sleepers,
        }
    }
}

/// The transport's wait (`ShmTransport::wait_for` once it sleeps): `sleep_unless` until `ready`.
fn wait_until(bell: &Doorbell<'_>, mut ready: impl FnMut() -> bool) {
    while !ready() {
        if bell.sleep_unless(Duration::MAX, &mut ready) {
            return;
        }
    }
}

struct Ring {
    tail: AtomicU64,
    head: AtomicU64,
    data: Vec<UnsafeCell<u8>>,
    producer_bell: Bell,
    consumer_bell: Bell,
}

impl Ring {
    fn new() -> Ring {
        Ring::with(CAP)
    }

    fn with(cap: usize) -> Ring {
        Ring {
            tail: AtomicU64::new(0),
            head: AtomicU64::new(0),
            data: cells(cap),
            producer_bell: Bell::new(),
            consumer_bell: Bell::new(),
        }
    }

    fn spsc(&self) -> Spsc<'_> {
        Spsc::new(&self.tail, &self.head, SharedBytes::new(&self.data))
    }
}

/// The consumer's side of `ShmTransport::drain`: waits for bytes, reads all that are there,
/// releases them and rings the producer; until `n` bytes have come.
fn consume(ring: &Ring, n: usize) -> Vec<u8> {
    let spsc = ring.spsc();
    let mut head = spsc.consumer_position();
    let mut got = Vec::new();
    while got.len() < n {
        wait_until(&ring.consumer_bell.doorbell(), || spsc.available(head) > 0);
        let avail = spsc.available(head);
        let old = got.len();
        got.resize(old + avail, 0);
        // SAFETY: the one consumer, reading what `available` saw.
        unsafe { spsc.read(head, &mut got[old..]) };
        head += avail as u64;
        spsc.release(head);
        ring.producer_bell.doorbell().ring();
    }
    got
}

#[test]
fn ring_with_doorbells_delivers_in_order_without_races_or_lost_wakeups() {
    model(|| {
        let ring = Arc::new(Ring::new());
        let r = ring.clone();
        let producer = thread::spawn(move || {
            // The producer's side of `ShmTransport::send_to_peer`, a byte at a time.
            let spsc = r.spsc();
            let mut tail = spsc.producer_position();
            // The consumer's position as last read: read anew only when it shows no space.
            let mut known_head = 0;
            for byte in [1u8, 2, 3] {
                // Wait for space (the consumer rings the producer's bell after moving `head`).
                wait_until(&r.producer_bell.doorbell(), || {
                    spsc.free_before(tail, known_head) > 0 || {
                        known_head = spsc.released();
                        spsc.free_before(tail, known_head) > 0
                    }
                });
                // SAFETY: the one producer, with space for the byte.
                tail = unsafe { spsc.push(tail, &[byte]) };
                r.consumer_bell.doorbell().ring();
            }
        });
        let got = consume(&ring, 3);
        producer.join().expect("producer");
        assert_eq!(got, [1, 2, 3]);
    });
}

/// A message's compact prefix: written as words and a payload in one publication
/// (`Spsc::push_words2`), read back as words (`Spsc::read_words`) once the tail shows them — every
/// byte visible to the consumer, no race.
#[test]
fn a_prefix_written_and_read_as_words_arrives_whole() {
    model(|| {
        let ring = Arc::new(Ring::with(16));
        let r = ring.clone();
        let producer = thread::spawn(move || {
            let spsc = r.spsc();
            // SAFETY: the one producer, into the empty ring (room for the word and the byte).
            unsafe { spsc.push_words2(0, &[0x0807_0605_0403_0201], &[9], 9) };
            r.consumer_bell.doorbell().ring();
        });
        let spsc = ring.spsc();
        wait_until(&ring.consumer_bell.doorbell(), || spsc.available(0) >= 9);
        // SAFETY: the one consumer, reading what `available` saw.
        let words = unsafe { spsc.read_words::<1>(0) };
        let mut byte = [0u8];
        unsafe { spsc.read(8, &mut byte) };
        producer.join().expect("producer");
        assert_eq!(words, Some([0x0807_0605_0403_0201]));
        assert_eq!(byte, [9]);
    });
}

/// A producer that publishes its tail with `Relaxed` (the real one releases it): the consumer's
/// read of the byte races with the write, which loom must report.
#[test]
#[should_panic(expected = "Causality violation")]
fn relaxed_tail_store_is_caught() {
    model(|| {
        let ring = Arc::new(Ring::new());
        let r = ring.clone();
        let producer = thread::spawn(move || {
            // SAFETY (model): the producer owns the free ring; loom checks the consumer's reads.
            unsafe { SharedBytes::new(&r.data).write(0, &[7]) };
            r.tail.store(1, Ordering::Relaxed);
            r.consumer_bell.doorbell().ring();
        });
        let got = consume(&ring, 1);
        producer.join().expect("producer");
        assert_eq!(got, [7]);
    });
}

/// A waiter that reads the doorbell and checks its condition before counting itself a sleeper (the
/// real one registers first): the waker can miss it and it sleeps forever, which loom must report.
#[test]
#[should_panic(expected = "deadlock")]
fn late_sleeper_registration_is_caught() {
    model(|| {
        let ring = Arc::new(Ring::new());
        let r = ring.clone();
        let producer = thread::spawn(move || {
            let spsc = r.spsc();
            // SAFETY: the one producer, with an empty ring.
            unsafe { spsc.push(0, &[7]) };
            r.consumer_bell.doorbell().ring();
        });
        let spsc = ring.spsc();
        let bell = &ring.consumer_bell;
        while spsc.available(0) == 0 {
            let v = bell.word.load(Ordering::SeqCst);
            if spsc.available(0) > 0 {
                break;
            }
            bell.sleepers.fetch_add(1, Ordering::SeqCst);
            atomics::futex_wait(&bell.word, v, Duration::MAX);
            bell.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        producer.join().expect("producer");
    });
}

struct Rank {
    step: AtomicU64,
    slots: Vec<UnsafeCell<u8>>,
    bufs: [UnsafeCell<u32>; 2],
}

impl Rank {
    fn steps(&self) -> Steps<'_> {
        Steps::new(&self.step, SharedBytes::new(&self.slots))
    }
}

/// Two ranks, three rounds of "write my buffer of this round's parity, post, wait for the peer's
/// post, read its slot and its buffer": round 3 reuses round 1's buffers and slots with no extra
/// synchronization.
#[test]
fn arena_rounds_reuse_buffers_safely() {
    model(|| {
        let ranks = Arc::new([0, 1].map(|_| Rank {
            step: AtomicU64::new(0),
            slots: cells(2 * FP_SLOT),
            bufs: [UnsafeCell::new(0), UnsafeCell::new(0)],
        }));
        let run = |me: usize, ranks: Arc<[Rank; 2]>| {
            let peer = 1 - me;
            let mut sums = Vec::new();
            for round in 1..=3u64 {
                let parity = (round % 2) as usize;
                let mine = (me as u32 + 1) * 10 + round as u32;
                // SAFETY (model): the owner writes before posting the round.
                ranks[me].bufs[parity].with_mut(|p| unsafe { *p = mine });
                // SAFETY: the owner posts its steps one at a time; small fingerprint and inline data.
                unsafe { ranks[me].steps().post(round, &[mine as u8], &[me as u8]) };
                while !ranks[peer].steps().posted(round) {
                    thread::yield_now();
                }
                let (mut fp, mut inline) = ([0u8], [0u8]);
                // SAFETY: posted (checked above); this rank posts its next step only afterwards.
                unsafe { ranks[peer].steps().read(round, &mut fp, &mut inline) };
                // SAFETY (model): the peer posted this round and rewrites the buffer only two
                // rounds later, after our next post.
                let theirs = ranks[peer].bufs[parity].with(|p| unsafe { *p });
                assert_eq!((fp[0], inline[0]), (theirs as u8, peer as u8));
                sums.push(mine + theirs);
            }
            sums
        };
        let r = ranks.clone();
        let h = thread::spawn(move || run(1, r));
        let a = run(0, ranks);
        let b = h.join().expect("rank 1");
        assert_eq!(a, b);
        assert_eq!(a, [11 + 21, 12 + 22, 13 + 23]);
    });
}
