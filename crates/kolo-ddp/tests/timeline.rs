//! The timeline API in one's own loop: spans on clocks aligned to rank 0's, and flushes that
//! append and leave a complete trace each time. (A `kolo train` run's timeline: kolo-train's
//! `tests/timeline.rs`.)

use std::path::Path;
use std::time::{Duration, Instant};

use kolo::Config;
use kolo_ddp::timeline::Timeline;
use kolo_ddp::TrainError;
use serde_json::Value;

fn events(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("timeline written");
    let v: Value = serde_json::from_str(&text).expect("the timeline is JSON");
    v["traceEvents"].as_array().expect("traceEvents").clone()
}

fn num(e: &Value, key: &str) -> f64 {
    e[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} of {e} is not a number"))
}

/// Complete events named `name` of rank `pid` on track `tid`.
fn spans<'a>(ev: &'a [Value], pid: u64, tid: u64, name: &str) -> Vec<&'a Value> {
    ev.iter()
        .filter(|e| e["ph"] == "X" && e["pid"] == pid && e["tid"] == tid && e["name"] == name)
        .collect()
}

#[test]
fn own_loop_spans_with_aligned_clocks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("own.json");
    // The ranks are threads of one process: one clock they all read gives the truth to check the
    // alignment against, whatever the scheduler does between the ranks.
    let shared = Instant::now();
    let res = kolo::run_local(3, Config::default(), |comm| {
        // Each rank's clock starts when it calls start: 30 ms apart.
        std::thread::sleep(Duration::from_millis(30 * comm.rank() as u64));
        let t = Timeline::start(&comm)?;
        assert!(t.is_enabled());
        let s = t.span("barrier");
        comm.barrier()?;
        drop(s);
        // A span starting at a known moment of the shared clock.
        let mark = Instant::now();
        t.record("mark", mark);
        let mark_us = mark.duration_since(shared).as_secs_f64() * 1e6;
        for _ in 0..3 {
            let _s = t.span("work");
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(t.len(), 5);
        t.write(&path)?;
        assert!(t.is_empty(), "written events leave the buffer");
        let off = Timeline::disabled();
        drop(off.span("nothing"));
        assert!(off.is_empty());
        Ok::<_, TrainError>(mark_us)
    });
    let marks: Vec<f64> = res
        .into_iter()
        .map(|r| r.expect("no panic").expect("writes"))
        .collect();
    let ev = events(&path);
    // On rank 0's clock each mark lies where rank 0's origin plus the shared-clock moment puts it:
    // timestamp minus shared-clock moment is the same on every rank, within the estimate's error
    // (half the shortest of the ping-pongs; the ranks started 30 and 60 ms apart).
    let origin = |pid: u64| {
        let m = spans(&ev, pid, 0, "mark");
        assert_eq!(m.len(), 1, "rank {pid}'s mark");
        num(m[0], "ts") - marks[pid as usize]
    };
    for pid in 1..3 {
        let skew = (origin(pid) - origin(0)).abs();
        assert!(
            skew < 3_000.0,
            "rank {pid}'s clock is {skew} µs off rank 0's"
        );
    }
    for pid in 0..3 {
        assert_eq!(spans(&ev, pid, 0, "barrier").len(), 1);
        let work = spans(&ev, pid, 0, "work");
        assert_eq!(work.len(), 3);
        assert!(work.iter().all(|e| num(e, "dur") >= 1900.0), "{work:?}");
    }
}

#[test]
fn flushes_append_and_leave_a_complete_trace_each_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("flushed.json");
    let res = kolo::run_local(2, Config::default(), |comm| {
        let t = Timeline::create(&comm, &path)?;
        for round in 0..3 {
            for _ in 0..=round {
                let _s = t.span("work");
            }
            t.flush()?;
            assert!(t.is_empty(), "flushed events leave the buffer");
            comm.barrier()?;
            if comm.rank() == 0 {
                // A complete trace after every flush, holding every span so far (1, 3, 6 a rank).
                let ev = events(&path);
                let want = (round + 1) * (round + 2) / 2;
                for pid in 0..2 {
                    assert_eq!(spans(&ev, pid, 0, "work").len(), want, "round {round}");
                }
            }
            comm.barrier()?;
        }
        t.finish()?;
        Ok::<_, TrainError>(())
    });
    for r in res {
        r.expect("no panic").expect("flushes");
    }
    let ev = events(&path);
    for pid in 0..2u64 {
        assert_eq!(spans(&ev, pid, 0, "work").len(), 6);
        let names = ev
            .iter()
            .filter(|e| e["ph"] == "M" && e["pid"] == pid && e["name"] == "thread_name")
            .count();
        assert_eq!(names, 2, "track names written once per rank");
    }
}
