//! `kolo bench scaling`: seed 001's figure — training time against the number of workers — for
//! this machine (or these hosts): trains the same model on the same amount of data at each worker
//! count with `kolo train`, and writes `scaling.csv` and `scaling.png` (samples/s against workers
//! with ideal linear scaling, and the efficiency of each point).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::Args;

use super::error::CliError;
use kolo_data::DatasetKind;
use kolo_metrics::{plot_scaling, RunDir, ScalingPoint};
use kolo_models::ModelKind;

pub const LONG_ABOUT: &str = "\
Trains the same model on the same amount of data (--train-limit samples, one epoch) with `kolo \
train -n W` for each W of --workers, --rounds times alternating, and reports the median samples/s \
of each, the speed-up over the first worker count, the efficiency (samples/s divided by ideal \
linear scaling from the first point) and whether the ranks (workers x replicas) outnumber the \
cores (oversubscribed: the workers share cores, so efficiency drops for that reason alone). Every \
rank computes on one thread (RAYON_NUM_THREADS=1 unless set).

Writes scaling.csv (workers, replicas, ranks, samples_per_second, seconds_per_epoch, speedup, \
efficiency, oversubscribed) and scaling.png into --out (default runs/scaling-MODEL-DATASET-TIME/), \
with each run's own directory under runs/.";

#[derive(Debug, Args)]
pub struct ScalingArgs {
    /// Worker counts, comma-separated, each at least 1
    #[arg(long, value_name = "W,...", value_delimiter = ',', default_value = "1,2",
          value_parser = parse_workers)]
    workers: Vec<usize>,
    /// Replica threads per worker (see kolo train --replicas)
    #[arg(long, default_value = "1", value_parser = parse_workers)]
    replicas: usize,
    /// Model: lenet, simple-cnn, mlp, resnet18
    #[arg(long, default_value = "lenet")]
    model: ModelKind,
    /// Dataset: fashion-mnist, mnist, cifar10, digits, synthetic
    #[arg(long, default_value = "fashion-mnist")]
    dataset: DatasetKind,
    /// Directory holding the dataset's files
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Training samples per run (the fixed amount of work)
    #[arg(long, value_name = "N", default_value = "12000", value_parser = parse_workers)]
    train_limit: usize,
    /// Batch size per worker
    #[arg(long, default_value = "64", value_parser = parse_workers)]
    batch_size: usize,
    /// Rounds over all worker counts (median of the rounds)
    #[arg(long, default_value = "1", value_parser = parse_workers)]
    rounds: usize,
    /// Output directory (default: a new runs/scaling-MODEL-DATASET-TIME/)
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

fn parse_workers(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{s:?}: {e}")),
    }
}

/// One measured worker count.
#[derive(Debug, Clone)]
struct Row {
    workers: usize,
    samples_per_second: f64,
    oversubscribed: bool,
}

pub fn execute(args: &ScalingArgs) -> ExitCode {
    let outcome = run(args)
        .map(|()| ExitCode::SUCCESS)
        .map_err(CliError::Failed);
    super::error::finish("bench scaling", outcome)
}

fn run(args: &ScalingArgs) -> Result<(), String> {
    if args.workers.is_empty() {
        return Err("--workers: give at least one worker count".into());
    }
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the kolo executable: {e}"))?;
    let name = format!("scaling-{}-{}", args.model, args.dataset);
    let dir = RunDir::create(args.out.as_deref(), Path::new("runs"), &name)
        .map_err(|e| format!("cannot create the output directory: {e}"))?;
    let out = dir.path().to_path_buf();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); args.workers.len()];
    for round in 0..args.rounds {
        for (i, &w) in args.workers.iter().enumerate() {
            let sps = train_once(
                args,
                &exe,
                &out.join("runs").join(format!("w{w}-r{round}")),
                w,
            )?;
            eprintln!(
                "round {}/{}: {w} worker{} x {} replica{}: {sps:.0} samples/s",
                round + 1,
                args.rounds,
                if w == 1 { "" } else { "s" },
                args.replicas,
                if args.replicas == 1 { "" } else { "s" }
            );
            rates[i].push(sps);
        }
    }
    let rows: Vec<Row> = args
        .workers
        .iter()
        .zip(&rates)
        .map(|(&w, r)| Row {
            workers: w,
            samples_per_second: median(r),
            oversubscribed: w * args.replicas > cores,
        })
        .collect();
    write_outputs(args, &out, &rows, cores)
}

/// Trains once with `workers` workers; its samples/s.
fn train_once(args: &ScalingArgs, exe: &Path, dir: &Path, workers: usize) -> Result<f64, String> {
    let mut cmd = Command::new(exe);
    cmd.arg("train")
        .args(["-n", &workers.to_string()])
        .args(["--replicas", &args.replicas.to_string()])
        .args(["--model", &args.model.to_string()])
        .args(["--dataset", &args.dataset.to_string()])
        .args(["--epochs", "1", "--test-limit", "100", "--no-progress"])
        .args(["--train-limit", &args.train_limit.to_string()])
        .args(["--batch-size", &args.batch_size.to_string()])
        .arg("--out")
        .arg(dir);
    if let Some(d) = &args.data_dir {
        cmd.arg("--data-dir").arg(d);
    }
    // One compute thread per rank at every point, so that the points differ only in the number of
    // workers (kolo train would give a lone worker all the cores).
    if kolo_core::settings::Env::lookup_os(&kolo_core::settings::ProcessEnv, "RAYON_NUM_THREADS")
        .is_none()
    {
        cmd.env("RAYON_NUM_THREADS", "1");
    }
    let output = cmd
        .output()
        .map_err(|e| format!("cannot start kolo train: {e}"))?;
    if !output.status.success() {
        let err = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        return Err(format!(
            "kolo train -n {workers} failed ({}): {}",
            output.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
    }
    let summary = dir.join("summary.json");
    let text =
        std::fs::read_to_string(&summary).map_err(|e| format!("{}: {e}", summary.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", summary.display()))?;
    v["samples_per_second"]
        .as_f64()
        .filter(|s| s.is_finite() && *s > 0.0)
        .ok_or_else(|| format!("{}: no samples_per_second", summary.display()))
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

fn write_outputs(args: &ScalingArgs, out: &Path, rows: &[Row], cores: usize) -> Result<(), String> {
    let Some(base) = rows.first() else {
        return Err("no measurements".into());
    };
    let per_worker = base.samples_per_second / base.workers as f64;
    let mut csv = String::from(
        "workers,replicas,ranks,samples_per_second,seconds_per_epoch,speedup,efficiency,oversubscribed\n",
    );
    println!(
        "{} on {}, {} samples per run, batch {} per worker, {} core{}:",
        args.model,
        args.dataset,
        args.train_limit,
        args.batch_size,
        cores,
        if cores == 1 { "" } else { "s" }
    );
    println!("  workers  ranks  samples/s  s/epoch  speed-up  efficiency");
    for r in rows {
        let speedup = r.samples_per_second / base.samples_per_second;
        let efficiency = r.samples_per_second / (per_worker * r.workers as f64);
        let secs = args.train_limit as f64 / r.samples_per_second;
        let ranks = r.workers * args.replicas;
        csv.push_str(&format!(
            "{},{},{ranks},{:.3},{secs:.4},{speedup:.4},{efficiency:.4},{}\n",
            r.workers, args.replicas, r.samples_per_second, r.oversubscribed
        ));
        println!(
            "  {:>7}  {ranks:>5}  {:>9.0}  {secs:>7.2}  {speedup:>7.2}x  {:>9.0}%{}",
            r.workers,
            r.samples_per_second,
            100.0 * efficiency,
            if r.oversubscribed {
                "  (oversubscribed)"
            } else {
                ""
            }
        );
    }
    let csv_path = out.join("scaling.csv");
    std::fs::write(&csv_path, csv).map_err(|e| format!("{}: {e}", csv_path.display()))?;
    let points: Vec<ScalingPoint> = rows
        .iter()
        .map(|r| ScalingPoint {
            workers: r.workers,
            samples_per_second: r.samples_per_second,
            oversubscribed: r.oversubscribed,
        })
        .collect();
    let png = out.join("scaling.png");
    let title = format!(
        "{} on {}: throughput vs workers ({cores} cores)",
        args.model, args.dataset
    );
    match plot_scaling(&points, &png, &title) {
        Ok(Some(w)) => eprintln!("kolo bench scaling: plot without text: {w}"),
        Ok(None) => {}
        Err(e) => return Err(format!("{}: {e}", png.display())),
    }
    println!("wrote {} and {}", csv_path.display(), png.display());
    Ok(())
}
