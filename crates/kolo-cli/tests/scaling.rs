//! `kolo bench scaling`: trains at each worker count and writes the CSV and the PNG; bad worker
//! counts are refused.

use std::process::Command;

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[test]
fn scaling_writes_its_csv_and_png() -> TestResult {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("scaling");
    let o = Command::new(env!("CARGO_BIN_EXE_kolo"))
        .args([
            "bench",
            "scaling",
            "--model",
            "mlp",
            "--dataset",
            "synthetic",
        ])
        .args([
            "--workers",
            "1,2",
            "--train-limit",
            "256",
            "--batch-size",
            "16",
            "--out",
        ])
        .arg(&out)
        .current_dir(dir.path())
        .output()?;
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let csv = std::fs::read_to_string(out.join("scaling.csv"))?;
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some("workers,replicas,ranks,samples_per_second,seconds_per_epoch,speedup,efficiency,oversubscribed")
    );
    assert_eq!(lines.len(), 3, "{csv}");
    let mut base = None;
    for (line, workers) in lines[1..].iter().zip([1.0, 2.0]) {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(f.len(), 8, "{line}");
        assert_eq!(f[0].parse::<f64>()?, workers);
        let sps: f64 = f[3].parse()?;
        assert!(sps > 0.0, "{line}");
        // The speed-up is this point's samples/s over the first point's, the efficiency that over
        // the workers (the CSV rounds both to 4 decimals).
        let first = *base.get_or_insert(sps);
        let (speedup, efficiency): (f64, f64) = (f[5].parse()?, f[6].parse()?);
        assert!(
            (speedup - sps / first).abs() < 1e-4,
            "{line}: speed-up vs {}",
            sps / first
        );
        assert!(
            (efficiency - sps / first / workers).abs() < 1e-4,
            "{line}: efficiency"
        );
    }
    // The first point is the baseline: speed-up and efficiency 1.
    assert!(lines[1].contains(",1.0000,1.0000,"), "{}", lines[1]);
    let png = std::fs::read(out.join("scaling.png"))?;
    assert_eq!(png.get(..8), Some(&b"\x89PNG\r\n\x1a\n"[..]));
    assert!(stdout.contains("efficiency"), "{stdout}");
    Ok(())
}

#[test]
fn zero_workers_are_refused() -> TestResult {
    let o = Command::new(env!("CARGO_BIN_EXE_kolo"))
        .args(["bench", "scaling", "--workers", "1,0"])
        .output()?;
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--workers") && err.contains("at least 1"),
        "{err}"
    );
    Ok(())
}
