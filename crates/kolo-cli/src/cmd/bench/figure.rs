//! `kolo bench --csv`: the bus bandwidth of every size, as a CSV and the log-log PNG beside it.

use std::path::Path;

use kolo_metrics::{plot_series_csv, SeriesPlot};

/// Writes `bytes,IMPLEMENTATION` rows of busbw (GB/s) to `csv` and draws them into its `.png`;
/// errors are reported and do not fail the benchmark.
pub(super) fn write(csv: &Path, implementation: &str, title: &str, rows: &[(u64, f64)]) {
    let mut text = format!("bytes,{implementation}\n");
    for (bytes, busbw) in rows {
        text.push_str(&format!("{bytes},{busbw}\n"));
    }
    if let Err(e) = std::fs::write(csv, text) {
        eprintln!("kolo bench: --csv {}: {e}", csv.display());
        return;
    }
    let plot = SeriesPlot {
        title: title.to_string(),
        x_desc: Some("message size".into()),
        y_desc: "bus bandwidth (GB/s)".into(),
        bytes_x: true,
        log_y: true,
    };
    let png = csv.with_extension("png");
    match plot_series_csv(csv, &png, &plot) {
        Ok(warning) => {
            if let Some(w) = warning {
                eprintln!("kolo bench: {w}");
            }
            eprintln!("kolo bench: wrote {} and {}", csv.display(), png.display());
        }
        Err(e) => eprintln!("kolo bench: --csv: {e}"),
    }
}
