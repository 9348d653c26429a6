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
