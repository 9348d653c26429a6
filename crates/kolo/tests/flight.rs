//! The flight recorder on every transport: what it records, and what `kolo diagnose`'s analysis
//! makes of a hang, a mismatched call and a missing record.

mod common;

use std::time::Duration;

use common::{spawn, Kind, KINDS};
use kolo::flight::{analysis, FlightDump};
use kolo::prelude::*;

fn config(timeout_ms: u64) -> Config {
    Config::default().with_timeout(Duration::from_millis(timeout_ms))
}

#[test]
fn records_each_collective_with_its_call_state_and_caller() {
    for kind in KINDS {
        let dumps = spawn(kind, 3, config(10_000), |c| {
            let mut v = vec![c.rank() as f64; 10];
            c.all_reduce(&mut v, ReduceOp::Max).expect("all_reduce");
            c.broadcast(&mut v, 2).expect("broadcast");
            let line = line!() + 1;
            let w = c.all_reduce_async(vec![1i32; 4], ReduceOp::Sum);
            w.wait().expect("async all_reduce");
            if c.rank() == 0 {
                c.send(&[1u8, 2, 3], 1, 7).expect("send");
            } else if c.rank() == 1 {
                let mut b = [0u8; 3];
                c.recv(&mut b, 0, 7).expect("recv");
            }
            (c.flight_record("test"), line)
        });
        for (rank, (d, line)) in dumps.iter().enumerate() {
            assert_eq!((d.rank, d.size, d.reason.as_str()), (rank, 3, "test"));
            let ops = &d.groups[0].collectives;
            let calls: Vec<(u64, &str, Option<&str>, u64, &str)> = ops
                .iter()
                .map(|o| {
                    (
                        o.id,
                        o.op.as_str(),
                        o.dtype.as_deref(),
                        o.count,
                        o.state.as_str(),
                    )
                })
                .collect();
            assert_eq!(
                calls,
                [
                    (0, "all_reduce", Some("f64"), 10, "completed"),
                    (1, "broadcast", Some("f64"), 10, "completed"),
                    (2, "all_reduce", Some("i32"), 4, "completed"),
                ],
                "{kind:?} rank {rank}"
            );
            assert_eq!(ops[0].reduce.as_deref(), Some("max"));
            assert_eq!(ops[1].root, Some(2));
            assert!(
                ops[2].queued.is_some(),
                "an async collective is queued first"
            );
            for o in ops {
                let loc = o.location.as_deref().unwrap_or("");
                assert!(loc.contains("tests/flight.rs"), "{kind:?}: {loc}");
                // Timed: one collective in TIMED_EVERY, chosen by sequence number.
                assert_eq!(
                    o.started.is_some(),
                    o.id % kolo::flight::TIMED_EVERY == 0,
                    "{kind:?}: {o:?}"
                );
            }
            let async_line = ops[2].location.as_deref().unwrap_or("");
            assert!(
                async_line.contains(&format!("flight.rs:{line}:")),
                "{async_line}"
            );
            let p2p = &d.groups[0].p2p;
            match rank {
                0 | 1 => {
                    let (op, peer) = if rank == 0 { ("send", 1) } else { ("recv", 0) };
                    assert_eq!(p2p.len(), 1, "{kind:?} rank {rank}: {p2p:?}");
                    assert_eq!(
                        (p2p[0].op.as_str(), p2p[0].peer, p2p[0].tag, p2p[0].count),
                        (op, Some(peer), Some(7), 3)
                    );
                    assert_eq!(p2p[0].state, "completed");
                }
                _ => assert!(p2p.is_empty()),
            }
        }
    }
}

#[test]
fn a_rank_that_never_enters_is_named_with_where_it_was() {
    for kind in KINDS {
        let dumps: Vec<FlightDump> = spawn(kind, 3, config(400), |c| {
            let mut v = vec![1f32; 100];
            for _ in 0..3 {
                c.all_reduce(&mut v, ReduceOp::Sum).expect("all_reduce");
            }
            if c.rank() == 2 {
                // Stuck in its own code while the others wait and time out.
                std::thread::sleep(Duration::from_millis(900));
            } else {
                assert!(c.all_reduce(&mut v, ReduceOp::Sum).is_err());
            }
            c.flight_record("test")
        });
        let text = analysis::diagnose(&dumps);
        assert!(text.contains("3 of 3 ranks left a flight record"), "{text}");
        assert!(
            text.contains("collective #3: all_reduce f32 × 100 (sum"),
            "{kind:?}: {text}"
        );
        // #3 is not one of the timed collectives; failed, its start is known all the same.
        assert!(
            text.contains("ranks 0, 1 waited in it and failed, up to "),
            "{kind:?}: {text}"
        );
        assert!(
            text.contains("rank 2 never entered collective #3: its last completed collective was #2 (all_reduce f32 × 100"),
            "{kind:?}: {text}"
        );
        assert!(text.contains("tests/flight.rs:"), "{text}");
        // Without rank 2's record: named as missing.
        let text = analysis::diagnose(&dumps[..2]);
        assert!(text.contains("2 of 3 ranks left a flight record"), "{text}");
        assert!(text.contains("No record from rank 2"), "{text}");
        assert!(text.contains("died before writing it"), "{text}");
        // A rank the others saw close its communicator finished early: said so, not "died".
        let mut closed = dumps[..2].to_vec();
        closed[0].reason = "all_gather on rank 0: rank 2 has closed its communicator".into();
        let text = analysis::diagnose(&closed);
        assert!(
            text.contains("No record from rank 2: it closed its communicator (returned or exited)"),
            "{text}"
        );
        assert!(!text.contains("died before writing it"), "{text}");
    }
}

#[test]
fn a_mismatched_call_shows_both_calls() {
    let dumps: Vec<FlightDump> = spawn(Kind::Local, 2, config(2_000), |c| {
        let mut v = vec![1f32; 8];
        c.all_reduce(&mut v, ReduceOp::Sum).expect("all_reduce");
        let r = if c.rank() == 0 {
            c.all_reduce(&mut v, ReduceOp::Sum)
        } else {
            c.broadcast(&mut v, 0)
        };
        assert!(r.is_err());
        c.flight_record("test")
    });
    let text = analysis::diagnose(&dumps);
    assert!(
        text.contains("MISMATCH: rank 0 called all_reduce f32 × 8")
            && text.contains("rank 1 called broadcast f32 × 8"),
        "{text}"
    );
}

#[test]
fn a_receive_that_waits_is_shown_with_its_peer_and_tag() {
    let dumps: Vec<FlightDump> = spawn(Kind::Tcp, 2, config(300), |c| {
        if c.rank() == 0 {
            let mut b = [0f32; 2];
            assert!(c.recv(&mut b, 1, 42).is_err(), "nothing was sent");
        } else {
            std::thread::sleep(Duration::from_millis(500));
        }
        c.flight_record("test")
    });
    let p2p = &dumps[0].groups[0].p2p;
    assert_eq!(
        (p2p[0].op.as_str(), p2p[0].state.as_str()),
        ("recv", "failed")
    );
    assert!(p2p[0].ended.is_some(), "a failure has its time");
    assert_eq!((p2p[0].peer, p2p[0].tag), (Some(1), Some(42)));
}

#[test]
fn stragglers_are_the_ranks_that_arrive_last() {
    // Rank 2 is 5 ms late at every collective, rank 1 at none.
    let arrivals: Vec<Vec<f64>> = (0..100)
        .map(|k| {
            let t = k as f64;
            vec![t + 0.001, t, t + 0.005]
        })
        .collect();
    let s = analysis::stragglers(&arrivals);
    assert_eq!(s.collectives, 100);
    assert_eq!((s.ranks[0].rank, s.ranks[0].last), (2, 100));
    assert!((s.skew_p50_s - 0.005).abs() < 1e-9 && (s.skew_p99_s - 0.005).abs() < 1e-9);
    assert!((s.ranks[0].behind_p50_s - 0.005).abs() < 1e-9);
    let text = analysis::straggler_text(&s);
    assert!(text.contains("rank 2 arrived last at 100 (100 %"), "{text}");
}

#[test]
fn the_python_main_threads_stack_comes_from_the_last_faulthandler_dump() {
    let text = r#"Thread 0x00007efe029fc6c0 (most recent call first):
  File "/tmp/fh.py", line 5 in worker
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007efe03472b80 (most recent call first):
  File "/tmp/fh.py", line 8 in load_batch
  File "/tmp/fh.py", line 10 in <module>
Thread 0x00007efe029fc6c0 (most recent call first):
  File "/tmp/fh.py", line 5 in worker

Thread 0x00007efe03472b80 (most recent call first):
  File "/site-packages/kolo/_comm.py", line 74 in checked
  File "/tmp/train.py", line 88 in load_batch
  File "/tmp/train.py", line 120 in <module>
"#;
    let stack = analysis::python_main_stack(text).expect("a stack");
    assert_eq!(
        stack,
        [
            "/site-packages/kolo/_comm.py:74 in checked",
            "/tmp/train.py:88 in load_batch",
            "/tmp/train.py:120 in <module>"
        ]
    );
    assert_eq!(analysis::python_main_stack("no dump here"), None);
}
