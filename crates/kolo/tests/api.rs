//! Point-to-point, asynchronous collectives, sub-groups and object collectives on every transport,
//! plus property tests over random sizes and data.

mod common;

use std::time::Duration;

use common::{data, reference, spawn, Kind, KINDS};
use kolo::prelude::*;
use proptest::prelude::*;
use serde::{Deserialize, Serialize};

fn cfg() -> Config {
    Config::default().with_timeout(Duration::from_secs(20))
}

#[test]
fn p2p_in_order_per_tag_and_typed() {
    for kind in KINDS {
        let res = spawn(kind, 2, cfg(), |c| -> kolo::Result<()> {
            if c.rank() == 0 {
                for i in 0..50i32 {
                    c.send(&[i], 1, 7)?;
                }
                c.send(&[1.5f64, 2.5], 1, 8)?;
                let req = c.isend(&[9u8; 1000], 1, 9);
                req.wait()?;
                // A message to self.
                c.send(&[42i64], 0, 1)?;
                assert_eq!(c.recv_vec::<i64>(0, 1)?, vec![42]);
            } else {
                // Tag 8 first: tags are independent queues.
                let mut two = [0.0f64; 2];
                c.recv(&mut two, 0, 8)?;
                assert_eq!(two, [1.5, 2.5]);
                for i in 0..50i32 {
                    let mut one = [0i32];
                    c.recv(&mut one, 0, 7)?;
                    assert_eq!(one[0], i, "messages with one tag arrive in order");
                }
                let mut req = c.irecv::<u8>(0, 9, Some(1000));
                while !req.test() {
                    std::thread::yield_now();
                }
                assert_eq!(req.wait()?, vec![9u8; 1000]);
            }
            Ok(())
        });
        for r in res {
            r.unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        }
    }
}

#[test]
fn p2p_errors() {
    for kind in KINDS {
        let res = spawn(
            kind,
            2,
            cfg().with_timeout(Duration::from_millis(300)),
            |c| {
                let mut out = Vec::new();
                if c.rank() == 0 {
                    out.push(c.send(&[1.0f32; 4], 5, 0).err());
                    c.send(&[1.0f32; 4], 1, 0).ok();
                    c.send(&[1i32; 4], 1, 1).ok();
                    // Stay alive, so that rank 1's receives time out rather than see a closed peer.
                    std::thread::sleep(Duration::from_millis(800));
                } else {
                    let mut three = [0.0f32; 3];
                    out.push(c.recv(&mut three, 0, 0).err());
                    let mut f = [0.0f32; 4];
                    out.push(c.recv(&mut f, 0, 1).err());
                    out.push(c.recv(&mut f, 0, 99).err());
                    let mut req = c.irecv::<f32>(0, 100, None);
                    out.push((!req.wait_timeout(Duration::from_millis(50))).then_some(
                        Error::Unsupported {
                            what: "pending".into(),
                        },
                    ));
                }
                out
            },
        );
        assert!(
            matches!(
                res[0][0],
                Some(Error::RankOutOfRange {
                    arg: "dest",
                    value: 5,
                    ..
                })
            ),
            "{:?}",
            res[0]
        );
        let r1 = &res[1];
        assert!(
            matches!(
                r1[0],
                Some(Error::MessageLength {
                    expected: 12,
                    actual: 16,
                    ..
                })
            ),
            "{r1:?}"
        );
        assert!(matches!(r1[1], Some(Error::Mismatch { .. })), "{r1:?}");
        assert!(
            matches!(
                r1[2],
                Some(Error::Timeout {
                    op: "recv",
                    peer: 0,
                    ..
                })
            ),
            "{r1:?}"
        );
        assert!(
            r1[3].is_some(),
            "an unmatched irecv is still pending after wait_timeout"
        );
    }
}

#[test]
fn async_collectives_complete_in_issue_order() {
    for kind in KINDS {
        for n in [1, 2, 3] {
            let res = spawn(kind, n, cfg(), |c| -> kolo::Result<()> {
                let r = c.rank();
                let works: Vec<Work<Vec<f32>>> = (0..8)
                    .map(|i| {
                        c.all_reduce_async(vec![(r + i) as f32; 1000 * (i + 1)], ReduceOp::Sum)
                    })
                    .collect();
                let b = c.broadcast_async(vec![r as i32; 5], n - 1);
                let g = c.all_gather_async(vec![r as u8; 3]);
                // A blocking collective after async ones waits for them.
                let mut x = [1i64];
                c.all_reduce(&mut x, ReduceOp::Sum)?;
                assert!(works.iter().all(Work::is_completed));
                let base: usize = (0..n).sum();
                for (i, w) in works.into_iter().enumerate().rev() {
                    let v = w.wait()?;
                    assert_eq!(v.len(), 1000 * (i + 1));
                    assert!(v.iter().all(|&e| e == (base + n * i) as f32));
                }
                assert_eq!(b.wait()?, vec![(n - 1) as i32; 5]);
                let all = g.wait()?;
                assert_eq!(all, (0..n).flat_map(|s| [s as u8; 3]).collect::<Vec<_>>());
                for (w, want) in [
                    (
                        c.reduce_scatter_async(vec![1.0f64; 4 * n], ReduceOp::Sum),
                        vec![n as f64; 4],
                    ),
                    (
                        c.all_to_all_async(vec![r as f64; 2 * n]),
                        (0..n).flat_map(|s| [s as f64; 2]).collect(),
                    ),
                    (
                        c.scatter_async(
                            if r == 0 {
                                (0..n).map(|s| s as f64).collect()
                            } else {
                                vec![]
                            },
                            1,
                            0,
                        ),
                        vec![r as f64],
                    ),
                    (
                        c.gather_async(vec![r as f64], 0),
                        if r == 0 {
                            (0..n).map(|s| s as f64).collect()
                        } else {
                            vec![]
                        },
                    ),
                    (
                        c.reduce_async(vec![2.0f64], ReduceOp::Prod, 0),
                        vec![if r == 0 { 2f64.powi(n as i32) } else { 2.0 }],
                    ),
                ] {
                    assert_eq!(w.wait()?, want);
                }
                // Variable-count forms: rank s contributes s + 1 elements.
                let counts: Vec<usize> = (1..=n).collect();
                let concat: Vec<i32> = (0..n).flat_map(|s| vec![s as i32; s + 1]).collect();
                assert_eq!(
                    c.all_gather_v_async(vec![r as i32; r + 1], counts.clone())
                        .wait()?,
                    concat
                );
                let g = c
                    .gather_v_async(vec![r as i32; r + 1], counts.clone(), 0)
                    .wait()?;
                assert_eq!(g, if r == 0 { concat.clone() } else { vec![] });
                let send = if r == 0 { concat.clone() } else { vec![] };
                assert_eq!(
                    c.scatter_v_async(send, counts.clone(), 0).wait()?,
                    vec![r as i32; r + 1]
                );
                let a2a = c
                    .all_to_all_v_async(vec![r as i32; n], vec![1; n], vec![1; n])
                    .wait()?;
                assert_eq!(a2a, (0..n as i32).collect::<Vec<_>>());
                c.barrier_async().wait()
            });
            for r in res {
                r.unwrap_or_else(|e| panic!("{kind:?} n={n}: {e}"));
            }
        }
    }
}

#[test]
fn async_errors_come_back_through_wait() {
    let res = kolo::run_local(2, cfg(), |c| {
        let w = c.all_reduce_async(vec![1u8; 1 + c.rank()], ReduceOp::Sum);
        let first = w.wait().err();
        let later = c.barrier_async().wait().err();
        (first, later)
    });
    for r in res {
        let (first, later) = r.unwrap_or_else(|p| panic!("{p}"));
        assert!(first.is_some());
        assert!(matches!(later, Some(Error::Failed { .. })), "{later:?}");
    }
}

#[test]
fn split_and_new_group() {
    for kind in KINDS {
        let res = spawn(kind, 5, cfg(), |c| -> kolo::Result<()> {
            let r = c.rank();
            // Even and odd ranks, odd ones in reverse order.
            let key = if r % 2 == 1 { -(r as i64) } else { r as i64 };
            let sub = c
                .split(Some((r % 2) as u32), key)?
                .expect("every rank has a color");
            let members: Vec<usize> = if r % 2 == 0 {
                vec![0, 2, 4]
            } else {
                vec![3, 1]
            };
            assert_eq!(sub.size(), members.len());
            assert_eq!(members[sub.rank()], r);
            let mut v = [r as i32];
            sub.all_reduce(&mut v, ReduceOp::Sum)?;
            assert_eq!(v[0], members.iter().sum::<usize>() as i32);
            // Collectives on the parent still work between group collectives.
            let mut w = [1i32];
            c.all_reduce(&mut w, ReduceOp::Sum)?;
            assert_eq!(w[0], 5);
            // A rank opting out gets no communicator.
            let none = c.split(if r == 4 { None } else { Some(0) }, 0)?;
            assert_eq!(none.is_none(), r == 4);
            // new_group in the listed order; ranks not listed get None.
            let g = c.new_group(&[3, 0, 4])?;
            match g {
                Some(g) => {
                    assert_eq!([3, 0, 4][g.rank()], r);
                    let mut b = [if g.rank() == 0 { 77u8 } else { 0 }];
                    g.broadcast(&mut b, 0)?;
                    assert_eq!(b[0], 77);
                    // Nested: a group of the group.
                    let gg = g.new_group(&[1, 2])?;
                    if let Some(gg) = gg {
                        let mut x = [gg.rank() as f32 + 1.0];
                        gg.all_reduce(&mut x, ReduceOp::Max)?;
                        assert_eq!(x[0], 2.0);
                    }
                }
                None => assert!(r == 1 || r == 2),
            }
            Ok(())
        });
        for r in res {
            r.unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        }
    }
}

#[test]
fn new_group_with_different_lists_is_an_error() {
    let res = kolo::run_local(3, cfg(), |c| {
        c.new_group(if c.rank() == 2 { &[0, 2] } else { &[0, 1] })
            .err()
    });
    for r in res {
        let e = r.unwrap_or_else(|p| panic!("{p}"));
        assert!(e.is_some_and(|e| e.to_string().contains("different list")));
    }
    let res = kolo::run_local(2, cfg(), |c| c.new_group(&[0, 0]).err());
    assert!(res.iter().all(|r| matches!(r, Ok(Some(_)))));
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Meta {
    name: String,
    shape: Vec<usize>,
    lr: f64,
}

#[test]
fn object_collectives() {
    for kind in KINDS {
        let res = spawn(kind, 3, cfg(), |c| -> kolo::Result<()> {
            let r = c.rank();
            let cfg = (r == 1).then(|| Meta {
                name: "lenet".into(),
                shape: vec![1, 28, 28],
                lr: 0.1,
            });
            let got: Meta = c.broadcast_object(cfg, 1)?;
            assert_eq!(got.name, "lenet");
            let names: Vec<String> = c.all_gather_object(&format!("worker-{}", "x".repeat(r)))?;
            assert_eq!(names, vec!["worker-", "worker-x", "worker-xx"]);
            let g = c.gather_object(&(r, vec![r; r]), 2)?;
            if r == 2 {
                assert_eq!(g, Some(vec![(0, vec![]), (1, vec![1]), (2, vec![2, 2])]));
            } else {
                assert!(g.is_none());
            }
            Ok(())
        });
        for r in res {
            r.unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        }
    }
}

#[test]
fn broadcast_object_needs_a_value_on_the_root() {
    let res = kolo::run_local(2, cfg(), |c| c.broadcast_object::<u32>(None, 0).err());
    for r in res {
        assert!(matches!(r, Ok(Some(_))));
    }
}

#[test]
fn topology_of_a_local_world() {
    let res = kolo::run_local(3, cfg(), |c| {
        (c.local_rank(), c.local_size(), c.node_rank(), c.num_nodes())
    });
    for (r, t) in res.into_iter().enumerate() {
        assert_eq!(t.ok(), Some((r, 3, 0, 1)));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random world sizes, counts, algorithms and data: all-reduce equals the sequential reference.
    #[test]
    fn all_reduce_matches_reference(
        n in 1usize..6,
        count in 0usize..3000,
        salt in 0usize..100,
        algo in 0usize..4,
        op in 0usize..5,
        tcp in any::<bool>(),
    ) {
        let mut config = cfg();
        config.overrides.all_reduce = Some([
            kolo::Algorithm::Ring,
            kolo::Algorithm::RecursiveDoubling,
            kolo::Algorithm::HalvingDoubling,
            kolo::Algorithm::BinomialTree,
        ][algo]);
        let op = ReduceOp::ALL[op];
        let kind = if tcp { Kind::Tcp } else { Kind::Local };
        let want = reference(&(0..n).map(|r| data::<i64>(r, count, salt)).collect::<Vec<_>>(), op);
        let res = spawn(kind, n, config, |c| {
            let mut v = data::<i64>(c.rank(), count, salt);
            c.all_reduce(&mut v, op).map(|_| v)
        });
        for r in res {
            prop_assert_eq!(r.map_err(|e| TestCaseError::fail(e.to_string()))?, want.clone());
        }
    }

    /// Random per-rank counts: all_gather_v and all_to_all_v move every element to the right place.
    #[test]
    fn variable_counts(n in 1usize..6, counts in proptest::collection::vec(0usize..50, 5)) {
        let counts = counts[..n].to_vec();
        let res = spawn(Kind::Local, n, cfg(), |c| -> kolo::Result<Vec<f32>> {
            let mine: Vec<f32> = (0..counts[c.rank()]).map(|i| (c.rank() * 1000 + i) as f32).collect();
            let mut all = vec![0.0f32; counts.iter().sum()];
            c.all_gather_v(&mine, &mut all, &counts)?;
            Ok(all)
        });
        let want: Vec<f32> = (0..n).flat_map(|r| (0..counts[r]).map(move |i| (r * 1000 + i) as f32)).collect();
        for r in res {
            prop_assert_eq!(r.map_err(|e| TestCaseError::fail(e.to_string()))?, want.clone());
        }
    }
}
