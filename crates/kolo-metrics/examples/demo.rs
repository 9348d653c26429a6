//! Writes a fake training run (CSV, TensorBoard events, PNG plot) and shows
//! the progress line, the way `kolo train` uses this crate.
//!
//! `cargo run -p kolo-metrics --example demo -- [OUT_DIR] [EPOCHS] [--no-font]`

use std::path::{Path, PathBuf};
use std::time::Instant;

use kolo_metrics::{
    plot_training_with, FontSource, MetricsCsv, PlotOptions, Progress, RunDir, TensorBoardWriter,
    TrainingSeries, TRAINING_COLUMNS,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let no_font = std::env::args().any(|a| a == "--no-font");
    let mut args = std::env::args().skip(1).filter(|a| a != "--no-font");
    let options = PlotOptions {
        font: if no_font {
            FontSource::Disabled
        } else {
            FontSource::Auto
        },
        ..PlotOptions::default()
    };
    let out = args.next().map(PathBuf::from);
    let epochs: u64 = args.next().map_or(Ok(10), |s| s.parse())?;
    let run = RunDir::create(out.as_deref(), Path::new("runs"), "demo")?;
    let mut csv = MetricsCsv::create(&run.metrics_csv(), &TRAINING_COLUMNS)?;
    let mut tb = TensorBoardWriter::create(&run.tensorboard_dir())?;
    let steps = 200u64;
    for epoch in 1..=epochs {
        let start = Instant::now();
        let mut progress = Progress::new(steps, epoch, epochs);
        let mut loss = 0.0;
        for step in 1..=steps {
            let t = (epoch - 1) as f64 + step as f64 / steps as f64;
            loss = 2.3 * (-0.6 * t).exp() + 0.05 + 0.02 * ((step as f64) * 0.7).sin();
            progress.update(step, loss, 25_000.0);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        progress.finish();
        let e = epoch as f64;
        let test_loss = 2.2 * (-0.55 * e).exp() + 0.08;
        let acc = 0.99 - 0.5 * (-0.7 * e).exp();
        let secs = start.elapsed().as_secs_f64();
        let global_step = (epoch * steps) as f64;
        csv.append(&[e, global_step, loss, test_loss, acc, secs, 25_000.0, 0.1])?;
        tb.add_scalars(
            (epoch * steps) as i64,
            &[
                ("loss/train", loss as f32),
                ("loss/test", test_loss as f32),
                ("accuracy/test", acc as f32),
            ],
        )?;
        tb.flush()?;
        let series = TrainingSeries::from_csv(&run.metrics_csv())?;
        if let Some(w) = plot_training_with(&series, &run.plot_png(), "demo run", &options)? {
            eprintln!("warning: {w}");
        }
    }
    println!("{}", run.path().display());
    Ok(())
}
