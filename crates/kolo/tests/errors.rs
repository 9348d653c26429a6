//! Errors, not hangs: mismatched calls, bad arguments, timeouts and lost peers end in the documented
//! error on every rank, within seconds, on every transport.

mod common;

use std::time::{Duration, Instant};

use common::{spawn, Kind, KINDS};
use kolo::prelude::*;

fn quick() -> Config {
    Config::default().with_timeout(Duration::from_secs(5))
}

/// The errors of every rank, which must all have failed well before the timeout.
fn all_fail(
    kind: Kind,
    n: usize,
    f: impl Fn(&Communicator) -> kolo::Result<()> + Sync,
) -> Vec<Error> {
    let t = Instant::now();
    let res = spawn(kind, n, quick(), |c| f(&c));
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "{kind:?}: took {:?}",
        t.elapsed()
    );
    res.into_iter()
        .enumerate()
        .map(|(r, x)| match x {
            Err(e) => e,
            Ok(()) => panic!("{kind:?}: rank {r} succeeded but should have failed"),
        })
        .collect()
}

/// A mismatch, or an abort whose kind says the aborting rank saw one (not read from the text);
/// the message names the mismatch too.
fn mentions_mismatch(e: &Error) -> bool {
    let text_says = match e.root_cause() {
        Error::Mismatch { .. } => true,
        Error::Aborted { reason, .. } => reason.contains("collective mismatch"),
        _ => false,
    };
    text_says && e.kind() == kolo::ErrorKind::Mismatch
}

#[test]
fn different_counts_are_a_mismatch_on_every_rank() {
    for kind in KINDS {
        for n in [2, 3, 5] {
            let errs = all_fail(kind, n, |c| {
                let mut v = vec![1.0f32; if c.rank() == 1 { 12 } else { 10 }];
                c.all_reduce(&mut v, ReduceOp::Sum)
            });
            for e in &errs {
                assert!(mentions_mismatch(e), "{kind:?} n={n}: {e}");
            }
            // The message names both calls.
            let text = errs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n");
            assert!(
                text.contains("f32 x 12") && text.contains("f32 x 10"),
                "{text}"
            );
        }
    }
}

#[test]
fn different_collectives_are_a_mismatch() {
    for kind in KINDS {
        // The root of a broadcast only sends: it waits for the receiver's confirmation (or, on
        // shared memory, the fingerprint step), so its broadcast itself fails.
        let errs = all_fail(kind, 2, |c| {
            let mut v = vec![1i64; 4];
            if c.rank() == 0 {
                c.broadcast(&mut v, 0)
            } else {
                c.all_reduce(&mut v, ReduceOp::Max)
            }
        });
        let text = errs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            text.contains("broadcast(i64 x 4, root=0") && text.contains("all_reduce(i64 x 4, max"),
            "{text}"
        );
    }
}

/// `split` and `new_group` start with an all-gather of kolo's own (colors and keys, a list's
/// fingerprint): a rank calling `all_gather` with the same count and type meanwhile is a mismatch
/// named by the group call, not a silent agreement.
#[test]
fn group_calls_never_agree_with_an_all_gather() {
    /// Rank 0 makes a group call, rank 1 an all-gather of `n` i64 (the call's own exchange's
    /// shape); both must fail with a mismatch naming `group_call` and the all-gather.
    fn check(
        kind: Kind,
        group_call: &str,
        n: usize,
        f: impl Fn(&Communicator) -> kolo::Result<()> + Sync,
    ) {
        let errs = all_fail(kind, 2, |c| {
            if c.rank() == 0 {
                f(c)
            } else {
                c.all_gather(&vec![0i64; n], &mut vec![0i64; 2 * n])
            }
        });
        let text = errs.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert!(errs.iter().all(mentions_mismatch), "{kind:?}: {text:?}");
        assert!(
            text.iter()
                .any(|t| t.contains(&format!("rank 0 called {group_call}()"))
                    && t.contains(&format!("rank 1 called all_gather(i64 x {n}"))),
            "{kind:?}: {text:?}"
        );
    }
    for kind in KINDS {
        check(kind, "split", 2, |c| c.split(Some(0), 0).map(drop));
        check(kind, "new_group", 1, |c| c.new_group(&[0, 1]).map(drop));
    }
}

#[test]
fn different_types_are_a_mismatch() {
    for kind in KINDS {
        let errs = all_fail(kind, 3, |c| {
            if c.rank() == 2 {
                c.all_reduce(&mut [1.0f64; 3], ReduceOp::Sum)
            } else {
                c.all_reduce(&mut [1.0f32; 3], ReduceOp::Sum)
            }
        });
        assert!(errs.iter().all(mentions_mismatch), "{errs:?}");
    }
}

#[test]
fn root_out_of_range_fails_every_rank() {
    for kind in KINDS {
        let errs = all_fail(kind, 3, |c| {
            let root = if c.rank() == 1 { 7 } else { 0 };
            // The root only sends and may finish first; its next call reports the abort.
            c.broadcast(&mut [0i32; 2], root)?;
            std::thread::sleep(Duration::from_millis(100));
            c.barrier()
        });
        assert!(
            matches!(
                errs[1],
                Error::RankOutOfRange {
                    arg: "root",
                    value: 7,
                    size: 3,
                    ..
                }
            ),
            "{}",
            errs[1]
        );
        for e in [&errs[0], &errs[2]] {
            assert!(e.to_string().contains("root = 7"), "{e}");
        }
    }
}

#[test]
fn wrong_buffer_length_names_the_argument() {
    for kind in KINDS {
        let errs = all_fail(kind, 2, |c| {
            let send = vec![0.0f32; 5];
            let mut recv = vec![0.0f32; 3];
            c.reduce_scatter(&send, &mut recv, ReduceOp::Sum)
        });
        assert!(
            matches!(
                errs[0],
                Error::BufferLength {
                    op: "reduce_scatter",
                    arg: "send",
                    expected: 6,
                    actual: 5,
                    ..
                }
            ),
            "{}",
            errs[0]
        );
    }
}

#[test]
fn a_byte_buffers_length_is_said_in_bytes() {
    for kind in KINDS {
        let errs = all_fail(kind, 2, |c| {
            let send = vec![0u8; 3];
            // Rank 0's receive buffer is a byte short; rank 1's fits.
            let mut recv = vec![0u8; 5 + c.rank()];
            c.all_gather(&send, &mut recv)
        });
        let text = errs[0].to_string();
        assert!(
            text.ends_with("buffer `recv` has 5 bytes, expected 6"),
            "{text}"
        );
        // The peer's abort carries the same words.
        let peer = errs[1].to_string();
        assert!(peer.contains("has 5 bytes, expected 6"), "{peer}");
        // `Debug` (what a `main` returning the error prints) is the message, not the fields.
        assert_eq!(format!("{:?}", errs[0]), text);
    }
}

#[test]
fn a_missing_rank_times_out_naming_it() {
    for kind in KINDS {
        let t = Instant::now();
        let res = spawn(
            kind,
            3,
            Config::default().with_timeout(Duration::from_millis(400)),
            |c| {
                if c.rank() == 2 {
                    // Never joins the collective, but stays alive past the others' timeout.
                    std::thread::sleep(Duration::from_millis(1500));
                    return Ok(());
                }
                c.all_reduce(&mut [1.0f32; 8], ReduceOp::Sum)
            },
        );
        assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
        // Both ranks in the collective fail: the first to time out names the rank it waited for
        // (which, depending on the schedule, may be a rank that is itself waiting for rank 2) and
        // aborts the other.
        let errs: Vec<&Error> = res.iter().filter_map(|r| r.as_ref().err()).collect();
        assert_eq!(errs.len(), 2, "{res:?}");
        assert!(
            errs.iter().any(|e| matches!(
                e,
                Error::Timeout {
                    op: "all_reduce",
                    ..
                }
            )),
            "{kind:?}: {errs:?}"
        );
    }
}

#[test]
fn a_dead_thread_is_a_lost_peer_not_a_hang() {
    let t = Instant::now();
    let res = kolo::run_local(3, quick(), |c| {
        let mut v = vec![1.0f32; 1 << 16];
        c.all_reduce(&mut v, ReduceOp::Sum)?;
        if c.rank() == 1 {
            panic!("rank 1 fails between collectives");
        }
        c.all_reduce(&mut v, ReduceOp::Sum)
    });
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(res[1].is_err());
    for r in [0, 2] {
        match &res[r] {
            Ok(Err(e)) => assert!(
                e.to_string().contains("rank 1") || e.to_string().contains("aborted"),
                "rank {r}: {e}"
            ),
            other => panic!("rank {r}: {other:?}"),
        }
    }
}

#[test]
fn failure_sticks() {
    for kind in KINDS {
        let res = spawn(kind, 2, quick(), |c| {
            let mut v = vec![0u8; if c.rank() == 0 { 1 } else { 2 }];
            let first = c.all_reduce(&mut v, ReduceOp::Sum).err();
            let later = c.barrier().err();
            (first, later, c.failure().is_some())
        });
        for (first, later, failed) in res {
            assert!(first.is_some() && failed);
            assert!(matches!(later, Some(Error::Failed { .. })), "{later:?}");
        }
    }
}

#[test]
fn abort_reaches_every_rank() {
    for kind in KINDS {
        let errs = all_fail(kind, 3, |c| {
            if c.rank() == 0 {
                c.abort("giving up");
                return c.barrier();
            }
            c.barrier()
        });
        // The reason once, the rank once: not "abort on rank 0: aborted by rank 0: giving up".
        let own = errs[0].to_string();
        assert!(
            own.ends_with("rank 0 aborted: giving up"),
            "{kind:?}: {own}"
        );
        for e in &errs[1..] {
            let text = e.to_string();
            assert!(
                text.ends_with(": aborted by rank 0: giving up"),
                "{kind:?}: {text}"
            );
        }
    }
}

#[test]
fn bad_v_counts_are_errors() {
    for kind in KINDS {
        let errs = all_fail(kind, 2, |c| {
            let mut recv = vec![0i32; 3];
            c.all_gather_v(&[1, 2], &mut recv, &[2, 1, 0])
        });
        assert!(
            matches!(errs[0], Error::InvalidArgument { arg: "counts", .. }),
            "{}",
            errs[0]
        );
    }
}

/// An all-to-all-v whose counts disagree with themselves on one rank (its block to itself sent
/// with one length and expected with another) is that rank's argument error, and an error on
/// every other rank at once, not a panic and a hang.
#[test]
fn all_to_all_v_counts_that_disagree_with_themselves_are_errors() {
    for kind in KINDS {
        let errs = all_fail(kind, 2, |c| {
            let (sc, rc) = if c.rank() == 1 {
                ([2, 3], [2, 2])
            } else {
                ([2, 2], [2, 2])
            };
            let send = vec![1.0f32; sc.iter().sum()];
            let mut recv = vec![0.0f32; rc.iter().sum()];
            c.all_to_all_v(&send, &sc, &mut recv, &rc)
        });
        assert!(
            matches!(
                errs[1],
                Error::InvalidArgument {
                    arg: "recv_counts",
                    rank: 1,
                    ..
                }
            ),
            "{kind:?}: {}",
            errs[1]
        );
        assert!(
            errs[1].to_string().contains("send_counts[1]"),
            "{}",
            errs[1]
        );
    }
}

#[test]
fn monitored_barrier_names_the_ranks_that_do_not_arrive() {
    for kind in KINDS {
        let t = Instant::now();
        let res = spawn(kind, 4, quick(), |c| {
            if c.rank() == 2 || c.rank() == 3 {
                // Busy elsewhere past the barrier's timeout.
                std::thread::sleep(Duration::from_millis(1500));
            }
            c.monitored_barrier(Duration::from_millis(500))
        });
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "{kind:?}: {:?}",
            t.elapsed()
        );
        for (r, x) in res.iter().enumerate().take(2) {
            match x {
                Err(Error::BarrierTimeout { rank, missing, .. }) => {
                    assert_eq!((*rank, missing.clone()), (r, vec![2, 3]), "{kind:?}");
                    let text = x.as_ref().expect_err("failed").to_string();
                    // Gloo's wording (which torch's tests match): rank 0 names the missing
                    // ranks, the others say that rank 0 reported them.
                    let said = match r {
                        0 => "Ranks 2, 3 failed to pass monitoredBarrier in 500 ms".to_string(),
                        _ => format!(
                            "Rank {r} successfully reached monitoredBarrier, but received errors \
                             while waiting for send/recv from rank 0: Ranks 2, 3 failed"
                        ),
                    };
                    assert!(text.contains(&said), "{text}");
                }
                other => panic!("{kind:?}: rank {r} got {other:?}"),
            }
        }
        // The late ranks learn that the job failed rather than waiting.
        for x in &res[2..] {
            assert!(x.is_err(), "{kind:?}: a late rank succeeded");
        }
        // And when everyone comes, it is a barrier.
        let ok = spawn(kind, 3, quick(), |c| {
            c.monitored_barrier(Duration::from_secs(5))
        });
        assert!(ok.iter().all(|r| r.is_ok()), "{kind:?}: {ok:?}");
    }
}

/// Every collective in which some rank only sends (broadcast and scatter roots, gather and reduce
/// leaves), against a mismatched call on the last rank, within a second: with two ranks both fail in
/// that call; with more, the last rank fails in it and every other rank in it or in its next call
/// (a rank whose own exchanges matched may finish the call).
#[test]
fn pure_senders_fail_in_the_mismatched_call_itself() {
    for kind in KINDS {
        for n in [2, 3, 4] {
            for case in 0..4 {
                let t = Instant::now();
                // Per rank: the error of the call, else the error of the next call.
                let res: Vec<(Option<Error>, Option<Error>)> = spawn(kind, n, quick(), |c| {
                    let mut v = vec![1.0f32; 8];
                    let mut out = vec![0.0f32; 8 * n];
                    let call = if c.rank() == n - 1 {
                        // The odd one out calls something else.
                        c.all_reduce(&mut v, ReduceOp::Sum)
                    } else {
                        match case {
                            0 => c.broadcast(&mut v, 0),
                            1 => c.reduce(&mut v, ReduceOp::Sum, 0),
                            2 => c.gather(&v, &mut out, 0),
                            _ => {
                                let mut one = vec![0.0f32; 8];
                                c.scatter(&out, &mut one, 0)
                            }
                        }
                    };
                    let next = c.barrier();
                    (call.err(), next.err())
                });
                let what = format!("{kind:?} n={n} case {case}");
                assert!(
                    t.elapsed() < Duration::from_secs(1),
                    "{what}: {:?}",
                    t.elapsed()
                );
                for (r, (call, next)) in res.iter().enumerate() {
                    let in_call = n == 2 || r == n - 1;
                    let e = match (call, next) {
                        (Some(e), _) => e,
                        (None, Some(e)) if !in_call => e,
                        _ => panic!("{what}: rank {r} did not fail ({call:?}, {next:?})"),
                    };
                    assert!(
                        mentions_mismatch(e)
                            || matches!(e, Error::Aborted { .. } | Error::Failed { .. }),
                        "{what} rank {r}: {e}"
                    );
                }
                // Somebody names the mismatch itself.
                assert!(
                    res.iter()
                        .any(|(c, _)| c.as_ref().is_some_and(mentions_mismatch)),
                    "{what}: {res:?}"
                );
            }
        }
    }
}

#[test]
fn matched_asymmetric_collectives_still_work_and_leave_nothing_behind() {
    for kind in KINDS {
        let res = spawn(kind, 3, quick(), |c| {
            for i in 0..50 {
                let root = i % 3;
                let mut v = vec![c.rank() as f64; 5];
                c.broadcast(&mut v, root)?;
                assert_eq!(v, vec![root as f64; 5]);
                let mut s = vec![1.0f64; 5];
                c.reduce(&mut s, ReduceOp::Sum, root)?;
                if c.rank() == root {
                    assert_eq!(s, vec![3.0; 5]);
                }
                let mut all = vec![0.0f64; 15];
                c.gather(&v, &mut all, root)?;
                let mut one = vec![0.0f64; 5];
                c.scatter(&all, &mut one, root)?;
            }
            c.barrier()
        });
        assert!(res.iter().all(|r| r.is_ok()), "{kind:?}: {res:?}");
    }
}

/// GPU memory handed to a communicator on kolo's own transports (host memory only) is an
/// `Unsupported` error naming the backend that has device collectives, on every rank at once; the
/// communicator stays usable (every rank refused the same call), and `device_ordinal` is `None`.
#[test]
fn gpu_memory_without_nccl_is_refused_on_every_rank() {
    for kind in KINDS {
        let results = spawn(kind, 2, quick(), |comm| -> kolo::Result<(String, f32)> {
            assert_eq!(comm.device_ordinal(), None);
            let buf = kolo::DeviceBuffer {
                ptr: 0x1000,
                count: 4,
                dtype: DType::F32,
                ready: 0,
            };
            let e = comm
                .all_reduce_device(buf, ReduceOp::Sum)
                .map(|_| ())
                .expect_err("no device collectives on kolo's transports");
            let mut v = [comm.rank() as f32];
            comm.all_reduce(&mut v, ReduceOp::Sum)?;
            Ok((e.to_string(), v[0]))
        });
        for r in results {
            let (e, sum) = r.expect("collectives after the refusal");
            assert!(
                e.contains("KOLO_BACKEND=nccl") && e.contains("kolo backend"),
                "{kind:?}: {e}"
            );
            assert_eq!(sum, 1.0);
        }
    }
}

/// A buffer that panics when the collective takes its elements.
struct Panicking(Vec<f32>);

impl kolo::CollectiveBuffer for Panicking {
    type Elem = f32;
    fn elements(&self) -> &[f32] {
        &self.0
    }
    fn elements_mut(&mut self) -> &mut [f32] {
        panic!("this buffer refuses to be written")
    }
}

/// A panic inside an asynchronous collective on one rank fails that rank's call with the panic's
/// message and its peers' at once (an abort naming it), instead of leaving them waiting for the
/// timeout.
#[test]
fn a_panic_inside_a_collective_fails_every_rank_at_once() {
    for kind in KINDS {
        let errs = all_fail(kind, 2, |c| {
            if c.rank() == 1 {
                c.all_reduce_async(Panicking(vec![1.0; 4]), ReduceOp::Sum)
                    .wait()
                    .map(|_| ())
            } else {
                c.all_reduce_async(vec![1.0f32; 4], ReduceOp::Sum)
                    .wait()
                    .map(|_| ())
            }
        });
        assert!(
            matches!(&errs[1], Error::Panicked { rank: 1, message, .. }
                if message.contains("refuses to be written")),
            "{kind:?}: {}",
            errs[1]
        );
        assert!(
            errs[0].to_string().contains("panicked"),
            "{kind:?}: {}",
            errs[0]
        );
    }
}
