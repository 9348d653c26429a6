//! The timeline of `kolo train`: `trainer::run` with a timeline writes one Chrome trace with a
//! process per rank, main and comm tracks, the training phases and every bucket's all-reduce
//! (overlapping backward); an unwritable path fails before training. (The timeline in one's own
//! loop: kolo-ddp's `tests/timeline.rs`.)

use std::path::Path;
use std::time::Duration;

use kolo::Config;
use kolo_data::DatasetKind;
use kolo_ddp::TrainError;
use kolo_models::ModelKind;
use kolo_train::trainer::{run, Summary, TrainConfig};
use kolo_train::RunError;
use serde_json::Value;

fn config(out: &Path, timeline: &Path) -> TrainConfig {
    TrainConfig {
        model: ModelKind::Mlp,
        dataset: DatasetKind::Synthetic,
        epochs: 1,
        batch_size: 32,
        train_limit: Some(512),
        test_limit: Some(128),
        out: Some(out.to_path_buf()),
        progress: false,
        seed: 3,
        // Several buckets, so that some are launched while backward goes on.
        bucket_bytes: 4 << 10,
        overlap: true,
        timeline: Some(timeline.to_path_buf()),
        ..TrainConfig::default()
    }
}

fn train(n: usize, cfg: &TrainConfig) -> Vec<Result<Summary, RunError>> {
    kolo::run_local(
        n,
        Config::default().with_timeout(Duration::from_secs(60)),
        |comm| run(&comm, cfg),
    )
    .into_iter()
    .map(|r| r.expect("rank thread panicked"))
    .collect()
}

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

fn meta<'a>(ev: &'a [Value], name: &str, pid: u64, tid: u64) -> Option<&'a str> {
    ev.iter()
        .find(|e| e["ph"] == "M" && e["name"] == name && e["pid"] == pid && e["tid"] == tid)
        .and_then(|e| e["args"]["name"].as_str())
}

#[test]
fn a_training_run_writes_one_trace_of_every_rank() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("trace.json");
    let cfg = config(&dir.path().join("run"), &path);
    for r in train(2, &cfg) {
        r.expect("trains");
    }
    let ev = events(&path);

    // One process per rank, each with its main and comm tracks named.
    let mut pids: Vec<u64> = ev.iter().filter_map(|e| e["pid"].as_u64()).collect();
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids, [0, 1]);
    for pid in [0, 1] {
        assert_eq!(
            meta(&ev, "process_name", pid, 0),
            Some(format!("rank {pid}").as_str())
        );
        assert_eq!(meta(&ev, "thread_name", pid, 0), Some("main"));
        assert_eq!(meta(&ev, "thread_name", pid, 1), Some("comm"));
    }
    for e in ev.iter().filter(|e| e["ph"] == "X") {
        assert!(num(e, "dur") >= 0.0, "negative duration: {e}");
        assert!(num(e, "ts").is_finite(), "{e}");
    }

    let steps = 512 / 2 / 32;
    for pid in [0, 1] {
        for name in [
            "data",
            "forward",
            "backward",
            "gradient sync",
            "optimizer step",
        ] {
            assert_eq!(
                spans(&ev, pid, 0, name).len(),
                steps,
                "rank {pid}: one {name} per step"
            );
        }
        assert_eq!(spans(&ev, pid, 0, "evaluate").len(), 1);
        assert_eq!(spans(&ev, pid, 0, "checkpoint").len(), 1);

        // Every bucket of every step on the comm track, with its args.
        let reduces = spans(&ev, pid, 1, "allreduce");
        let buckets: std::collections::BTreeSet<u64> = reduces
            .iter()
            .map(|e| e["args"]["bucket"].as_u64().expect("bucket"))
            .collect();
        assert!(buckets.len() > 1, "several buckets: {buckets:?}");
        assert_eq!(reduces.len(), steps * buckets.len());
        for e in &reduces {
            assert!(e["args"]["bytes"].as_u64().expect("bytes") > 0, "{e}");
            assert_eq!(e["args"]["hook"], "allreduce");
            assert!(num(&e["args"], "queued_us") >= 0.0);
        }
        // Launches (the async slices' begins) pair with their ends.
        let begins = ev
            .iter()
            .filter(|e| e["ph"] == "b" && e["pid"] == pid)
            .count();
        let ends = ev
            .iter()
            .filter(|e| e["ph"] == "e" && e["pid"] == pid)
            .count();
        assert_eq!((begins, ends), (reduces.len(), reduces.len()));

        // Overlap: buckets are launched, and some run, while backward is still going on.
        let backward = spans(&ev, pid, 0, "backward");
        let inside = |ts: f64| {
            backward
                .iter()
                .any(|b| ts >= num(b, "ts") && ts <= num(b, "ts") + num(b, "dur"))
        };
        let launched_inside = ev
            .iter()
            .filter(|e| e["ph"] == "b" && e["pid"] == pid)
            .filter(|e| inside(num(e, "ts")))
            .count();
        assert!(
            launched_inside > 0,
            "rank {pid}: no bucket launched in backward"
        );
        assert!(
            reduces.iter().any(|e| inside(num(e, "ts"))),
            "rank {pid}: no all-reduce started during backward"
        );
    }
}

#[test]
fn no_overlap_launches_after_backward() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("trace.json");
    let cfg = TrainConfig {
        overlap: false,
        ..config(&dir.path().join("run"), &path)
    };
    for r in train(2, &cfg) {
        r.expect("trains");
    }
    let ev = events(&path);
    let backward = spans(&ev, 0, 0, "backward");
    assert!(!backward.is_empty());
    let launches: Vec<&Value> = ev
        .iter()
        .filter(|e| e["ph"] == "b" && e["pid"] == 0)
        .collect();
    assert!(!launches.is_empty());
    for l in launches {
        let ts = num(l, "ts");
        assert!(
            !backward
                .iter()
                .any(|b| ts > num(b, "ts") && ts < num(b, "ts") + num(b, "dur")),
            "launched inside backward without overlap: {l}"
        );
    }
}

#[test]
fn an_unwritable_timeline_fails_before_training() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("no-such-dir").join("trace.json");
    let run_dir = dir.path().join("run");
    let cfg = config(&run_dir, &path);
    for r in train(2, &cfg) {
        match r {
            Err(e @ RunError::Train(TrainError::Io { .. })) => {
                let msg = e.to_string();
                assert!(msg.contains("trace.json"), "names the file: {msg}");
            }
            other => panic!("expected an I/O error naming the file, got {other:?}"),
        }
    }
    assert!(!run_dir.join("metrics.csv").exists(), "nothing trained");
}
