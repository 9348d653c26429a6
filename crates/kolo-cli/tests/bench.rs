//! `kolo bench`: every operation on tiny sizes over real worker processes, the table, bad input.

use std::process::{Command, Output};

fn kolo_bench(args: &[&str]) -> Output {
    kolo_bench_on(None, args)
}

/// `kolo bench ARGS` with `KOLO_TRANSPORT` set to `transport` (default: unset, i.e. auto).
fn kolo_bench_on(transport: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kolo"));
    cmd.arg("bench").args(args).env("KOLO_TIMEOUT", "60");
    if let Some(t) = transport {
        cmd.env("KOLO_TRANSPORT", t);
    }
    cmd.output().expect("run kolo bench")
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The JSON lines of `kolo bench OP -n N --sizes SIZES --iters 3 --warmup 1 --json`.
fn json_lines(op: &str, n: &str, sizes: &str) -> Vec<serde_json::Value> {
    json_lines_on(None, op, n, sizes)
}

fn json_lines_on(
    transport: Option<&str>,
    op: &str,
    n: &str,
    sizes: &str,
) -> Vec<serde_json::Value> {
    let out = kolo_bench_on(
        transport,
        &[
            op, "-n", n, "--sizes", sizes, "--iters", "3", "--warmup", "1", "--json", "--check",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}\n{}", text(&out))))
        .collect();
    assert_eq!(lines.len(), sizes.split(',').count(), "{}", text(&out));
    for v in &lines {
        let obj = v.as_object().expect("a JSON object");
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "algbw_gbps",
                "busbw_gbps",
                "bytes",
                "impl",
                "n",
                "op",
                "time_us",
                "wrong"
            ],
            "{v}"
        );
        assert_eq!(v["op"], op, "{v}");
        assert_eq!(v["n"], n.parse::<u64>().expect("a number"), "{v}");
        assert_eq!(v["wrong"], 0, "{v}");
        assert!(
            v["impl"].as_str().expect("a string").starts_with("kolo-"),
            "{v}"
        );
        assert!(v["time_us"].as_f64().expect("a number") >= 0.0, "{v}");
        assert!(v["busbw_gbps"].as_f64().expect("a number") >= 0.0, "{v}");
        assert!(v["bytes"].as_u64().expect("a count") > 0, "{v}");
    }
    lines
}

#[test]
fn allreduce_json_lines() {
    // Workers of one host talk through shared memory unless told otherwise.
    for (transport, name) in [(None, "kolo-shm"), (Some("tcp"), "kolo-tcp")] {
        let lines = json_lines_on(transport, "allreduce", "2", "4,64K,3M");
        assert_eq!(lines[0]["bytes"], 4);
        assert_eq!(lines[1]["bytes"], 65536);
        assert_eq!(lines[0]["impl"], name);
    }
}

#[test]
fn allgather_json_lines() {
    let lines = json_lines("allgather", "3", "4,1K,1000");
    // Whole blocks per rank, at least one element each.
    assert_eq!(lines[0]["bytes"], 12);
    assert_eq!(lines[1]["bytes"], 1020);
}

#[test]
fn reduce_scatter_json_lines() {
    json_lines("reduce_scatter", "2", "4,1K");
}

#[test]
fn broadcast_json_lines() {
    json_lines("broadcast", "3", "4,1K");
}

#[test]
fn alltoall_json_lines() {
    json_lines("alltoall", "3", "4,1K");
}

#[test]
fn p2p_json_lines() {
    json_lines("p2p", "2", "4,1K");
}

#[test]
fn other_dtypes_check_out() {
    for dtype in ["f64", "bf16", "i32"] {
        let out = kolo_bench(&[
            "allreduce",
            "-n",
            "2",
            "--sizes",
            "1K",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--dtype",
            dtype,
        ]);
        assert!(out.status.success(), "{dtype}: {}", text(&out));
    }
}

#[test]
fn table_has_a_header_and_a_row_per_size() {
    let out = kolo_bench(&[
        "allreduce",
        "-n",
        "2",
        "--sizes",
        "4,1K",
        "--iters",
        "3",
        "--warmup",
        "1",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let header = stdout
        .lines()
        .find(|l| l.contains("busbw(GB/s)"))
        .unwrap_or_else(|| panic!("no header\n{}", text(&out)));
    for col in ["size", "count", "type", "time(us)", "algbw(GB/s)", "wrong"] {
        assert!(header.contains(col), "{header}");
    }
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && l.contains("f32"))
        .collect();
    assert_eq!(rows.len(), 2, "{}", text(&out));
    assert!(
        rows[1].split_whitespace().next() == Some("1024"),
        "{}",
        rows[1]
    );
    assert!(rows
        .iter()
        .all(|r| r.split_whitespace().last() == Some("0")));
}

#[test]
fn bad_input_is_an_error_before_launching() {
    for args in [
        &["allreduce", "--sizes", "12Q"][..],
        &["allreduce", "--sizes", "4,,8"],
        &["allreduce", "-n", "0"],
        &["allshuffle"],
        &["p2p", "-n", "1"],
    ] {
        let out = kolo_bench(args);
        assert!(!out.status.success(), "{args:?}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.is_empty(), "{args:?}: no message");
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out));
    }
    let out = kolo_bench(&["allreduce", "--sizes", "12Q"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("12Q"),
        "{}",
        text(&out)
    );
}

#[test]
fn csv_holds_every_sizes_busbw_and_its_picture_is_drawn() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("busbw.csv");
    let out = kolo_bench(&[
        "allreduce",
        "-n",
        "2",
        "--sizes",
        "4,1K,64K",
        "--csv",
        csv.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let written = std::fs::read_to_string(&csv).expect("the CSV");
    let rows: Vec<&str> = written.lines().collect();
    assert_eq!(rows[0], "bytes,kolo-shm", "{written}");
    let sizes: Vec<&str> = rows[1..]
        .iter()
        .map(|r| r.split(',').next().unwrap_or(""))
        .collect();
    assert_eq!(sizes, ["4", "1024", "65536"], "{written}");
    for r in &rows[1..] {
        let busbw: f64 = r
            .split(',')
            .nth(1)
            .and_then(|v| v.parse().ok())
            .expect("busbw");
        assert!(busbw > 0.0, "{written}");
    }
    let png = std::fs::read(dir.path().join("busbw.png")).expect("the PNG");
    assert_eq!(&png[1..4], b"PNG");
}
