//! Point-to-point, asynchronous collectives, sub-groups and object collectives on every transport,
//! plus property tests over random sizes and data.

mod common;

use std::time::Duration;

use common::{checks, data, reference, spawn, Kind, KINDS};
use kolo::prelude::*;
use proptest::prelude::*;

fn cfg() -> Config {
    Config::default().with_timeout(Duration::from_secs(20))
}

#[test]
fn p2p_in_order_per_tag_and_typed() {
    for kind in KINDS {
        let res = spawn(kind, 2, cfg(), |c| checks::p2p_in_order(&c));
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
        // Said as what it is: a receive of f32s and a send of i32s, not two collectives.
        let text = r1[1].as_ref().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.starts_with(
                "point-to-point mismatch: rank 1 called recv(f32 x 4) from rank 0, but rank 0 \
                 sent i32 x 4"
            ),
            "{text}"
        );
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
fn p2p_recv_upto_takes_a_message_up_to_the_buffer() {
    for kind in KINDS {
        let res = spawn(kind, 2, cfg(), |c| {
            if c.rank() == 0 {
                c.send(&[1u8, 2, 3], 1, 0)?;
                c.send(&[9u8; 8], 1, 1)?;
                c.send(&[7u8; 2], 1, 2)?;
                c.send(&[5u8; 6], 1, 4)?;
                c.barrier()?; // alive until rank 1 has looked for tag 3
                return Ok((vec![], None, None));
            }
            let mut buf = [0xeeu8; 6];
            let n = c.recv_upto(&mut buf, 0, 0)?;
            assert_eq!(
                buf[n..],
                [0xee; 3],
                "{kind:?}: bytes past the message untouched"
            );
            let truncated = c.recv_upto(&mut buf[..4], 0, 1).err();
            let mut two = [0u8; 2];
            let mut got = None;
            while got.is_none() {
                got = c.try_recv_upto(&mut two, 0, 2)?;
            }
            let none = c.try_recv_upto(&mut two, 0, 3)?;
            let mut full = [0u8; 6];
            assert_eq!(c.recv_upto(&mut full, 0, 4)?, 6, "{kind:?}");
            assert_eq!(full, [5u8; 6], "{kind:?}");
            c.barrier()?;
            Ok::<_, Error>((buf[..n].to_vec(), truncated, none.or(got)))
        });
        let (head, truncated, got) = res[1].as_ref().unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        assert_eq!(head, &[1, 2, 3], "{kind:?}");
        assert!(
            matches!(truncated, Some(Error::InvalidArgument { arg: "buf", reason, .. })
                if reason.contains("ERR_TRUNCATE")),
            "{kind:?}: {truncated:?}"
        );
        assert_eq!(*got, Some(2), "{kind:?}");
    }
}

#[test]
fn async_collectives_complete_in_issue_order() {
    for kind in KINDS {
        for n in [1, 2, 3] {
            let res = spawn(kind, n, cfg(), |c| checks::async_in_order(&c));
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
fn async_work_says_when_it_ran() {
    let res = kolo::run_local(2, cfg(), |c| {
        let before = std::time::Instant::now();
        let w = c.all_reduce_async(vec![1.0f32; 1000], ReduceOp::Sum);
        let (r, t) = w.wait_timed();
        (before, r, t, std::time::Instant::now())
    });
    for r in res {
        let (before, r, t, after) = r.unwrap_or_else(|p| panic!("{p}"));
        assert_eq!(r.expect("all-reduce"), vec![2.0f32; 1000]);
        let (started, completed) = (t.started.expect("started"), t.completed.expect("completed"));
        assert!(
            before <= started && started <= completed && completed <= after,
            "{t:?}"
        );
    }
}

#[test]
fn split_and_new_group() {
    for kind in KINDS {
        let res = spawn(kind, 5, cfg(), |c| checks::split_and_new_group(&c));
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

#[test]
fn object_collectives() {
    for kind in KINDS {
        let res = spawn(kind, 3, cfg(), |c| checks::object_collectives(&c));
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

/// The `*_into_async` forms fill the caller's receive buffer exactly as the blocking calls do,
/// and give both buffers back; a `Box<[T]>` works where a `Vec<T>` does.
#[test]
fn async_into_forms_equal_the_blocking_calls() {
    for kind in KINDS {
        for n in [1usize, 2, 3] {
            let res = spawn(kind, n, cfg(), move |c| -> kolo::Result<()> {
                let r = c.rank();
                let send: Vec<f64> = (0..4 * n).map(|i| (i * 7 + r * 3) as f64).collect();
                let boxed: Box<[f64]> = send.clone().into_boxed_slice();
                // Blocking references, then the queued forms, compared element for element.
                let mut want = vec![0.0; n * send.len()];
                c.all_gather(&send, &mut want)?;
                let (s, got) = c
                    .all_gather_into_async(boxed, vec![-1.0; n * send.len()], None)
                    .wait()?;
                assert_eq!((&*s, &got), (&send[..], &want), "all_gather");
                let mut want = vec![0.0; 4];
                c.reduce_scatter(&send, &mut want, ReduceOp::Sum)?;
                let (_, got) = c
                    .reduce_scatter_into_async(send.clone(), vec![-1.0; 4], ReduceOp::Sum)
                    .wait()?;
                assert_eq!(got, want, "reduce_scatter");
                let mut want = vec![0.0; send.len()];
                c.all_to_all(&send, &mut want)?;
                let (_, got) = c
                    .all_to_all_into_async(send.clone(), vec![-1.0; send.len()], None)
                    .wait()?;
                assert_eq!(got, want, "all_to_all");
                let root = n - 1;
                let mut want = vec![0.0; if r == root { n * send.len() } else { 0 }];
                c.gather(&send, &mut want, root)?;
                let (_, got) = c
                    .gather_into_async(send.clone(), vec![-1.0; want.len()], None, root)
                    .wait()?;
                assert_eq!(got, want, "gather");
                let mut want = vec![0.0; 4];
                c.scatter(&send, &mut want, root)?;
                let (_, got) = c
                    .scatter_into_async(send.clone(), vec![-1.0; 4], None, root)
                    .wait()?;
                assert_eq!(got, want, "scatter");
                let counts: Vec<usize> = (0..n).map(|i| i + 1).collect();
                let mine = vec![r as f64; r + 1];
                let mut want = vec![0.0; counts.iter().sum()];
                c.all_gather_v(&mine, &mut want, &counts)?;
                let (_, got) = c
                    .all_gather_into_async(
                        mine.clone(),
                        vec![-1.0; want.len()],
                        Some(counts.clone()),
                    )
                    .wait()?;
                assert_eq!(got, want, "all_gather_v");
                Ok(())
            });
            for r in res {
                r.unwrap_or_else(|e| panic!("{kind:?} n={n}: {e}"));
            }
        }
    }
}

/// `Work::then` runs once with the result: on the worker thread when the collective completes,
/// at once when it already has; errors arrive the same way.
#[test]
fn then_hands_over_the_result() {
    let res = kolo::run_local(2, cfg(), |c| {
        let (tx, rx) = std::sync::mpsc::channel();
        let tx2 = tx.clone();
        c.all_reduce_async(vec![1.0f32 + c.rank() as f32; 3], ReduceOp::Sum)
            .then(move |r| tx.send(r.map(|v| v[0])).unwrap_or(()));
        let first = rx.recv_timeout(Duration::from_secs(10));
        // Completed before `then`: runs here.
        let w = c.barrier_async();
        assert!(w.wait_timeout(Duration::from_secs(10)));
        let here = std::thread::current().id();
        w.then(move |r| {
            tx2.send(
                r.map(|()| 0.0)
                    .and(Ok(f32::from(u8::from(std::thread::current().id() == here)))),
            )
            .unwrap_or(())
        });
        let second = rx.recv_timeout(Duration::from_secs(10));
        // An error comes through the callback.
        let (etx, erx) = std::sync::mpsc::channel();
        c.all_reduce_async(vec![0u8; 1 + c.rank()], ReduceOp::Sum)
            .then(move |r| etx.send(r.is_err()).unwrap_or(()));
        (first, second, erx.recv_timeout(Duration::from_secs(10)))
    });
    for r in res {
        let (first, second, err) = r.unwrap_or_else(|p| panic!("{p}"));
        assert_eq!(first.expect("callback ran").expect("all-reduce"), 3.0);
        assert_eq!(second.expect("ran at once").expect("barrier"), 1.0);
        assert!(err.expect("callback ran"), "a mismatched call fails");
    }
}

/// The average of integers whose sum overflows their type is exact (200 and 200 average to 200,
/// not to the wrapped 72), truncated toward zero, in all-reduce, reduce, reduce-scatter and the
/// asynchronous form, on every transport.
#[test]
fn integer_averages_do_not_overflow() {
    for kind in KINDS {
        let res = spawn(kind, 2, cfg(), |c| -> kolo::Result<_> {
            let r = c.rank();
            let mut bytes = [200u8, if r == 0 { 255 } else { 254 }];
            c.all_reduce(&mut bytes, ReduceOp::Avg)?;
            let mut ints = [i32::MAX - 3, if r == 0 { -7 } else { 0 }];
            c.reduce(&mut ints, ReduceOp::Avg, 1)?;
            let send = [i64::MAX - 2 * r as i64, i64::MIN, -5 * (1 - r as i64), 9];
            let mut longs = [0i64; 2];
            c.reduce_scatter(&send, &mut longs, ReduceOp::Avg)?;
            let late = c.all_reduce_async(vec![250u8; 3], ReduceOp::Avg).wait()?;
            Ok((bytes, (r == 1).then_some(ints), longs, late))
        });
        let [a, b] = [&res[0], &res[1]].map(|x| x.as_ref().expect("the rank's results"));
        assert_eq!((a.0, b.0), ([200, 254], [200, 254]), "{kind:?}");
        assert_eq!(b.1, Some([i32::MAX - 3, -3]), "{kind:?}");
        assert_eq!(a.2, [i64::MAX - 1, i64::MIN], "{kind:?}");
        assert_eq!(b.2, [-2, 9], "{kind:?}");
        assert_eq!(
            (&a.3[..], &b.3[..]),
            (&[250u8; 3][..], &[250u8; 3][..]),
            "{kind:?}"
        );
    }
}
