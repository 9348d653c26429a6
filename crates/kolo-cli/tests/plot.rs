//! `kolo plot`: a CSV of series drawn as a PNG; a CSV it cannot draw is an error naming the file.

use std::process::{Command, Output};

fn kolo_plot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kolo"))
        .arg("plot")
        .args(args)
        .output()
        .expect("run kolo plot")
}

#[test]
fn a_csv_becomes_a_png_and_a_bad_one_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("busbw.csv");
    std::fs::write(&csv, "bytes,kolo-shm,gloo\n4,0.008,\n65536,5.5,0.05\n").expect("csv");
    let png = dir.path().join("out.png");
    let out = kolo_plot(&[
        csv.to_str().expect("utf-8"),
        "--out",
        png.to_str().expect("utf-8"),
        "--bytes-x",
        "--log-y",
        "--title",
        "all-reduce",
    ]);
    assert!(out.status.success(), "{out:?}");
    let bytes = std::fs::read(&png).expect("the PNG");
    assert_eq!(&bytes[1..4], b"PNG");
    // Without --out: beside the CSV.
    let out = kolo_plot(&[csv.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{out:?}");
    assert!(dir.path().join("busbw.png").exists());

    std::fs::write(&csv, "bytes,kolo\n4,fast\n").expect("csv");
    let out = kolo_plot(&[csv.to_str().expect("utf-8")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("busbw.csv") && err.contains("not a number"),
        "{err}"
    );
}
