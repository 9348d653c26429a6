//! `kolo plot`: a CSV of series against one x drawn as a PNG (the benchmark scripts' pictures).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use kolo_metrics::{plot_series_csv, SeriesPlot};

use super::error::CliError;

pub const LONG_ABOUT: &str = "\
Draw a CSV as a PNG: its first column is x, every other column one line named by its header \
(empty or nan cells are gaps). The benchmark scripts write such CSVs (scripts/compare_peers.py \
--csv, scripts/bench_train.py --csv) and draw them with this: bus bandwidth against message size \
with one line per implementation (--bytes-x --log-y), samples/s against workers.

Example: kolo plot busbw.csv --out busbw.png --title 'all-reduce, 2 ranks' --y-desc 'busbw GB/s' \
--bytes-x --log-y";

/// `kolo plot` options.
#[derive(Debug, Args)]
pub struct PlotArgs {
    /// The CSV: x in the first column, one series per further column
    csv: PathBuf,
    /// The PNG to write (default: the CSV's path with .png)
    #[arg(long)]
    out: Option<PathBuf>,
    /// Title above the plot
    #[arg(long, default_value = "")]
    title: String,
    /// Name of the x axis (default: the first column's header)
    #[arg(long)]
    x_desc: Option<String>,
    /// Name of the y axis
    #[arg(long, default_value = "")]
    y_desc: String,
    /// x is a size in bytes: log2 scale labelled 4 B, 1 KiB, 1 MiB, ...
    #[arg(long)]
    bytes_x: bool,
    /// log10 scale for y
    #[arg(long)]
    log_y: bool,
}

pub fn execute(args: PlotArgs) -> ExitCode {
    super::finish("plot", run(args))
}

fn run(args: PlotArgs) -> Result<ExitCode, CliError> {
    let out = args.out.unwrap_or_else(|| args.csv.with_extension("png"));
    let plot = SeriesPlot {
        title: args.title,
        x_desc: args.x_desc,
        y_desc: args.y_desc,
        bytes_x: args.bytes_x,
        log_y: args.log_y,
    };
    let warning = plot_series_csv(&args.csv, &out, &plot)
        .map_err(|e| CliError::Failed(format!("{}: {e}", args.csv.display())))?;
    if let Some(w) = warning {
        eprintln!("kolo plot: {w}");
    }
    println!("kolo plot: wrote {}", out.display());
    Ok(ExitCode::SUCCESS)
}
