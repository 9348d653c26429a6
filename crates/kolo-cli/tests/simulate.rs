//! `kolo simulate`: built-in profiles on the Horovod cluster, a tiny measured profile, bad input.

use std::process::{Command, Output};

fn kolo_simulate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kolo"))
        .arg("simulate")
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("run kolo simulate")
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn builtin_profile_on_a_cluster_file_writes_table_and_csv() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("vgg.csv");
    let out = kolo_simulate(&[
        "--model",
        "vgg16",
        "--cluster",
        "scripts/horovod-25gbe.json",
        "--ranks",
        "1,8,128",
        "--csv",
        csv.to_str().expect("utf-8 path"),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("eff_%") && stdout.contains("ring"),
        "{stdout}"
    );
    let rows = std::fs::read_to_string(&csv).expect("csv");
    assert_eq!(rows.lines().count(), 4, "{rows}");
    assert!(rows.lines().nth(1).is_some_and(|l| l.starts_with("1,1,")));
}

#[test]
fn measured_profile_round_trips() {
    let dir = tempfile::tempdir().expect("tempdir");
    let prof = dir.path().join("p.json");
    let p = prof.to_str().expect("utf-8 path");
    let out = kolo_simulate(&[
        "--model",
        "mlp",
        "--batch",
        "4",
        "--steps",
        "1",
        "--threads",
        "1",
        "--save-profile",
        p,
        "--profile-only",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let out = kolo_simulate(&[
        "--profile",
        p,
        "--ranks-per-node",
        "4",
        "--intra-gbps",
        "100",
        "--ranks",
        "1,2,4",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("100.0"));
}

#[test]
fn bad_clusters_name_the_field() {
    for (args, field) in [
        (vec!["--intra-gbps", "10"], "ranks_per_node"),
        (
            vec!["--ranks-per-node", "2", "--intra-gbps=-1"],
            "intra_node.bandwidth_gbps",
        ),
        (
            vec![
                "--ranks-per-node",
                "2",
                "--intra-gbps",
                "1",
                "--algorithm",
                "best",
            ],
            "algorithm",
        ),
        (
            vec!["--ranks-per-node", "2", "--intra-gbps", "1", "--ranks", "4"],
            "inter_node",
        ),
    ] {
        let mut all = vec!["--model", "resnet101"];
        all.extend(args);
        let out = kolo_simulate(&all);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("`{field}`")), "{field}: {err}");
    }
    let out = kolo_simulate(&["--model", "alexnet"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("vgg16"));
}

/// Column `name` of every data row of a `kolo simulate --csv` file.
fn column(csv: &str, name: &str) -> Vec<f64> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    let i = header
        .iter()
        .position(|h| *h == name)
        .unwrap_or_else(|| panic!("no column {name} in {header:?}"));
    lines
        .map(|l| {
            l.split(',')
                .nth(i)
                .and_then(|v| v.parse().ok())
                .expect("a number")
        })
        .collect()
}

#[test]
fn a_known_profile_on_a_known_link_gives_the_step_time_by_hand() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = |f: &str| dir.path().join(f).to_string_lossy().into_owned();
    // 35 ms of compute; one parameter of 1,000,000 f32 (4 MB), ready at the end of backward.
    let profile = r#"{"model": "hand", "batch": 8, "threads": 1, "forward_s": 0.010,
        "backward_s": 0.020, "optimizer_s": 0.003, "other_s": 0.002, "elem_bytes": 4,
        "gamma_s_per_byte": 0.0, "step_sd_s": 0.0,
        "params": [{"name": "w", "numel": 1000000, "ready_s": 0.020}], "method": "by hand"}"#;
    // 1 GB/s and 10 us between the two ranks of a node; a ring all-reduce; nothing overlapped.
    let cluster = r#"{"ranks_per_node": 2, "nodes": 1,
        "intra_node": {"bandwidth_bytes_per_s": 1e9, "latency_us": 10},
        "algorithm": "ring", "bucket_mb": 25, "overlap": false, "threads_per_rank": 1,
        "shared_memory": false, "gamma_ns_per_byte": 0, "scalar_allreduces_per_step": 0,
        "spin_us": 0}"#;
    std::fs::write(path("p.json"), profile).expect("profile");
    std::fs::write(path("c.json"), cluster).expect("cluster");
    let out = kolo_simulate(&[
        "--profile",
        &path("p.json"),
        "--cluster",
        &path("c.json"),
        "--ranks",
        "1,2",
        "--csv",
        &path("out.csv"),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let csv = std::fs::read_to_string(path("out.csv")).expect("csv");
    // Ring over 2 ranks: 2(n-1)·α + 2(n-1)/n·S·β = 20 us + 4 ms, all of it exposed.
    let comm = 2.0 * 10e-6 + 4e6 / 1e9;
    let want = [0.035, 0.035 + comm];
    let near = |a: f64, b: f64| (a - b).abs() <= 1e-9 + 1e-6 * b;
    for (got, want) in column(&csv, "step_s").iter().zip(want) {
        assert!(near(*got, want), "step {got} s, by hand {want} s\n{csv}");
    }
    let sps = column(&csv, "samples_per_s");
    assert!(near(sps[1], 16.0 / (0.035 + comm)), "{csv}");
    let eff = column(&csv, "efficiency");
    assert!(near(eff[1], 0.035 / (0.035 + comm)), "{csv}");
}
