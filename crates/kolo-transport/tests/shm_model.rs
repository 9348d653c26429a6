//! Model check (with `loom`: every interleaving and memory-order outcome) of the shared-memory
//! transport's lock-free protocols, written with the same orderings as `src/shm`:
//!
//! - the single-producer single-consumer ring (`tail` released by the producer after writing data,
//!   `head` released by the consumer after reading it), including wrap-around and a full ring;
//! - the doorbell sleep/wake handshake (`src/shm/sync.rs`), with the futex modelled as "sleep while
//!   the word equals the value read, until a wake": a lost wake-up shows as a deadlock, which loom
//!   reports. (The real waits also time out to poll liveness, which would hide such a bug.)
//! - the arena's rounds (`kolo_core::arena`): two buffers per rank alternating by round, no
//!   synchronization besides the posts.
//!
//! Data slots are loom `UnsafeCell`s, so a read that could race with a write fails the check.

use loom::cell::UnsafeCell;
use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

const CAP: u64 = 2;

/// Explores every interleaving with up to three preemptions (loom's usual bound; exhaustive
/// exploration of these loops does not finish in CI time).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

struct Futex {
    word: AtomicU32,
    sleepers: AtomicU32,
    lock: Mutex<()>,
    cond: Condvar,
}

impl Futex {
    fn new() -> Self {
        Futex {
            word: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
            lock: Mutex::new(()),
            cond: Condvar::new(),
        }
    }

    /// `futex_wait(word, v)`: sleeps while the word is `v`.
    fn futex_wait(&self, v: u32) {
        let mut g = self.lock.lock().expect("model lock");
        while self.word.load(Ordering::SeqCst) == v {
            g = self.cond.wait(g).expect("model wait");
        }
    }

    /// `Doorbell::ring`.
    fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::Relaxed) > 0 {
            let _g = self.lock.lock().expect("model lock");
            self.word.fetch_add(1, Ordering::SeqCst);
            self.cond.notify_all();
        }
    }

    /// `Doorbell::sleep_unless` without the timeout, looping until `ready`.
    fn wait_until(&self, ready: impl Fn() -> bool) {
        loop {
            if ready() {
                return;
            }
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            let v = self.word.load(Ordering::SeqCst);
            let done = ready();
            if !done {
                self.futex_wait(v);
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
            if done {
                return;
            }
        }
    }
}

struct Ring {
    tail: AtomicU64,
    head: AtomicU64,
    data: [UnsafeCell<u8>; CAP as usize],
    producer_bell: Futex,
    consumer_bell: Futex,
}

#[test]
fn ring_with_doorbells_delivers_in_order_without_races_or_lost_wakeups() {
    model(|| {
        let ring = Arc::new(Ring {
            tail: AtomicU64::new(0),
            head: AtomicU64::new(0),
            data: [UnsafeCell::new(0), UnsafeCell::new(0)],
            producer_bell: Futex::new(),
            consumer_bell: Futex::new(),
        });
        let r = ring.clone();
        let producer = thread::spawn(move || {
            let mut tail = 0u64;
            for byte in [1u8, 2, 3] {
                // Wait for space (the consumer rings the producer's bell after moving `head`).
                r.producer_bell
                    .wait_until(|| CAP - (tail - r.head.load(Ordering::Acquire)) > 0);
                // SAFETY (model): the producer owns slots in [tail, head + CAP).
                r.data[(tail % CAP) as usize].with_mut(|p| unsafe { *p = byte });
                tail += 1;
                r.tail.store(tail, Ordering::Release);
                r.consumer_bell.ring();
            }
        });
        let mut head = 0u64;
        let mut got = Vec::new();
        while got.len() < 3 {
            ring.consumer_bell
                .wait_until(|| ring.tail.load(Ordering::Acquire) > head);
            let tail = ring.tail.load(Ordering::Acquire);
            while head < tail {
                // SAFETY (model): the consumer owns slots in [head, tail).
                got.push(ring.data[(head % CAP) as usize].with(|p| unsafe { *p }));
                head += 1;
            }
            ring.head.store(head, Ordering::Release);
            ring.producer_bell.ring();
        }
        producer.join().expect("producer");
        assert_eq!(got, [1, 2, 3]);
    });
}

struct Rank {
    step: AtomicU64,
    bufs: [UnsafeCell<u32>; 2],
}

/// Two ranks, three rounds of "write my buffer of this round's parity, post, wait for the peer's
/// post, read its buffer": round 3 reuses round 1's buffers with no extra synchronization.
#[test]
fn arena_rounds_reuse_buffers_safely() {
    model(|| {
        let ranks = Arc::new([0, 1].map(|_| Rank {
            step: AtomicU64::new(0),
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
                ranks[me].step.store(round, Ordering::Release);
                while ranks[peer].step.load(Ordering::Acquire) < round {
                    thread::yield_now();
                }
                // SAFETY (model): the peer posted this round and rewrites the buffer only two
                // rounds later, after our next post.
                let theirs = ranks[peer].bufs[parity].with(|p| unsafe { *p });
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
