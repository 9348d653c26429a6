//! Fault-tolerant worlds of threads over one in-memory store, on the TCP and shared-memory
//! transports: a lost worker (its heartbeat stopped, its communicator aborted), the survivors'
//! next generation, a worker joining at a step boundary, the floor, rank 0's loss, and a half that
//! must not go on alone.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use super::*;
use crate::init::TransportChoice;
use kolo_store::MemoryStore;

const TRANSPORTS: [TransportChoice; 2] = [TransportChoice::Tcp, TransportChoice::Shm];

fn quick() -> ElasticOptions {
    ElasticOptions {
        min_size: 1,
        dead_after: Duration::from_millis(800),
        settle: Duration::from_secs(2),
        timeout: Duration::from_secs(20),
        join_poll: Duration::from_millis(0),
    }
}

fn world(
    store: &Arc<dyn Store>,
    job: &str,
    rank: usize,
    size: usize,
    t: TransportChoice,
    o: ElasticOptions,
) -> Result<ElasticWorld> {
    let method = InitMethod::Store {
        store: SharedStore(store.clone()),
        host: None,
    };
    let mut opts = InitOptions::new(method, rank, size);
    opts.transport = t;
    opts.config.timeout = Duration::from_secs(20);
    ElasticWorld::new(opts, job, o)
}

fn sum(comm: &Communicator) -> Result<f32> {
    let mut v = [comm.rank() as f32 + 1.0];
    comm.all_reduce(&mut v, ReduceOp::Sum)?;
    Ok(v[0])
}

/// Runs `f(rank)` on `n` threads; their results in rank order.
fn on_threads<R: Send + 'static>(
    n: usize,
    f: impl Fn(usize) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let f = Arc::new(f);
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let f = f.clone();
            std::thread::spawn(move || f(r))
        })
        .collect();
    hs.into_iter()
        .map(|h| h.join().expect("a worker thread panicked"))
        .collect()
}

/// Generation 0 of 3; `dead` crashes after one all-reduce; the others go on at size 2 with new
/// ranks, survivors in their old order.
fn lose_one(t: TransportChoice, dead: usize) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let job = format!("lose{dead}-{t:?}");
    let out = on_threads(3, move |rank| {
        let mut w = world(&store, &job, rank, 3, t, quick()).expect("generation 0");
        assert_eq!(w.generation(), 0);
        assert_eq!(sum(w.comm()).expect("first all-reduce"), 6.0);
        if rank == dead {
            w.crash_for_test();
            return None;
        }
        // Fails (the peer's abort or its loss), then the survivors reconfigure.
        let e = sum(w.comm()).expect_err("an all-reduce with a dead member");
        assert!(w.comm().failure().is_some(), "{e}");
        let change = w.reconfigure().expect("generation 1");
        let after = sum(w.comm()).expect("all-reduce at size 2");
        Some((rank, change, after))
    });
    let survivors: Vec<_> = out.into_iter().flatten().collect();
    assert_eq!(survivors.len(), 2);
    let mut new_ranks = vec![];
    for (old, change, after) in survivors {
        assert_eq!(change.generation, 1);
        assert_eq!(change.size, 2);
        assert_eq!(change.lost.len(), 1);
        assert!(change.joined.is_empty() && change.was_member);
        assert_eq!(after, 3.0, "ranks 0 and 1 of the new world: 1 + 2");
        new_ranks.push((old, change.rank));
    }
    let mut expected: Vec<usize> = (0..3).filter(|&r| r != dead).collect();
    expected.sort_unstable();
    assert_eq!(
        new_ranks,
        expected
            .iter()
            .enumerate()
            .map(|(i, &o)| (o, i))
            .collect::<Vec<_>>()
    );
}

#[test]
fn survivors_go_on_without_a_lost_worker() {
    for t in TRANSPORTS {
        lose_one(t, 2);
    }
}

#[test]
fn survivors_go_on_without_rank_0() {
    for t in TRANSPORTS {
        lose_one(t, 0);
    }
}

#[test]
fn a_worker_started_later_joins_at_a_step_boundary() {
    for t in TRANSPORTS {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let job = format!("grow-{t:?}");
        let go = Arc::new(Barrier::new(3));
        let out = on_threads(3, move |rank| {
            if rank == 2 {
                // Started once the first two train.
                go.wait();
                let w = world(&store, &job, 2, 2, t, quick()).expect("joining");
                assert_eq!(w.generation(), 1);
                return (
                    sum(w.comm()).expect("all-reduce at size 3"),
                    w.comm().rank(),
                    0,
                );
            }
            let mut w = world(&store, &job, rank, 2, t, quick()).expect("generation 0");
            go.wait();
            let mut steps = 0;
            loop {
                assert_eq!(sum(w.comm()).expect("a step at size 2"), 3.0);
                steps += 1;
                if w.grow_requested().expect("agreed join check") {
                    break;
                }
                assert!(steps < 10_000, "the joiner was never seen");
            }
            let change = w.reconfigure().expect("generation 1");
            assert_eq!((change.size, change.joined.len()), (3, 1));
            assert!(change.was_member && change.lost.is_empty());
            (
                sum(w.comm()).expect("all-reduce at size 3"),
                change.rank,
                steps,
            )
        });
        assert_eq!(out.iter().map(|o| o.0).collect::<Vec<_>>(), vec![6.0; 3]);
        assert_eq!(
            out.iter().map(|o| o.1).collect::<Vec<_>>(),
            vec![0, 1, 2],
            "old members keep their ranks, the joiner comes last"
        );
    }
}

#[test]
fn fewer_workers_than_the_floor_ends_every_survivor() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let out = on_threads(3, move |rank| {
        let o = ElasticOptions {
            min_size: 3,
            ..quick()
        };
        let mut w = world(&store, "floor", rank, 3, TransportChoice::Tcp, o).expect("gen 0");
        if rank == 1 {
            w.crash_for_test();
            return None;
        }
        let _ = sum(w.comm());
        Some(w.reconfigure().expect_err("below the floor").to_string())
    });
    for e in out.into_iter().flatten() {
        assert!(
            e.contains("fewer than the floor of 3") && e.contains("--min-workers"),
            "{e}"
        );
    }
}

#[test]
fn two_workers_lost_at_once() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let out = on_threads(4, move |rank| {
        let mut w = world(&store, "two", rank, 4, TransportChoice::Tcp, quick()).expect("gen 0");
        if rank == 1 || rank == 3 {
            w.crash_for_test();
            return None;
        }
        let _ = sum(w.comm());
        let change = w.reconfigure().expect("generation 1");
        Some((
            change.size,
            change.lost.len(),
            sum(w.comm()).expect("size 2"),
        ))
    });
    assert_eq!(
        out.into_iter().flatten().collect::<Vec<_>>(),
        vec![(2, 2, 3.0); 2]
    );
}

#[test]
fn half_of_the_world_does_not_go_on_alone() {
    // Ranks 2 and 3 stay alive (heartbeats in the store) but never ask to go on, as the half
    // of a world cut in two that still reaches the store; 2 of 4 is no majority.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let done = Arc::new(Barrier::new(4));
    let out = on_threads(4, move |rank| {
        let o = ElasticOptions {
            settle: Duration::from_millis(500),
            timeout: Duration::from_secs(3),
            ..quick()
        };
        let mut w = world(&store, "split", rank, 4, TransportChoice::Tcp, o).expect("gen 0");
        let r = if rank >= 2 {
            None
        } else {
            w.comm().abort("cut off from ranks 2 and 3");
            Some(w.reconfigure().map(|c| c.size).map_err(|e| e.to_string()))
        };
        done.wait();
        r
    });
    for r in out.into_iter().flatten() {
        let e = r.expect_err("a half went on alone");
        assert!(
            e.contains("2 of the 4 members") && e.contains("majority"),
            "{e}"
        );
    }
}

#[test]
fn mpi_and_nccl_worlds_are_refused_naming_why() {
    let built = [cfg!(feature = "mpi"), cfg!(feature = "nccl")];
    for ((backend, says), built) in [("mpi", "MPI_Comm_shrink"), ("nccl", "NCCL")]
        .into_iter()
        .zip(built)
    {
        let env = |k: &str| match k {
            "KOLO_BACKEND" => Some(backend.to_string()),
            "RANK" => Some("0".into()),
            "WORLD_SIZE" => Some("2".into()),
            _ => None,
        };
        match ElasticWorld::from_lookup(env, quick()) {
            Err(e @ Error::Unsupported { .. }) if built => {
                assert!(e.to_string().contains(says), "{e}")
            }
            // A build without the backend refuses it first.
            Err(Error::Config { var, .. }) if !built => assert_eq!(var, "KOLO_BACKEND"),
            other => panic!("KOLO_BACKEND={backend}: {other:?}"),
        }
    }
}

#[test]
fn a_store_rank_0_would_host_is_refused() {
    let mut opts = InitOptions::new(
        InitMethod::Tcp {
            host: "127.0.0.1".into(),
            port: 1,
        },
        0,
        2,
    );
    opts.host_store = true;
    // (Were it not refused, the store connection would fail within this.)
    opts.config.timeout = Duration::from_secs(2);
    match ElasticWorld::new(opts, "own-store", quick()) {
        Err(e @ Error::Unsupported { .. }) => {
            assert!(e.to_string().contains("could not outlive rank 0"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}
