//! Plots of named series against one x, from a CSV whose first column is x and every other column
//! one line (empty or `nan` cells are gaps): the benchmark pictures — bus bandwidth against message
//! size with a line per implementation, samples/s against workers — that `kolo plot` draws.

use std::path::Path;

use plotters::prelude::*;

use super::axis::{fmt_number, loss_axis, x_axis};
use super::{draw_panel, render, DrawResult, Line, Panel, PlotOptions, PlotWarning, FAMILY};
use crate::csv::read_csv;
use crate::error::{MetricsError, Result};

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// How [`plot_series_csv`] draws.
#[derive(Clone, Debug, Default)]
pub struct SeriesPlot {
    /// Above the plot.
    pub title: String,
    /// The x axis' name (default: the CSV's first column).
    pub x_desc: Option<String>,
    /// The y axis' name.
    pub y_desc: String,
    /// x is a size in bytes: a log₂ scale labelled 4 B, 1 KiB, 1 MiB, ...
    pub bytes_x: bool,
    /// A log₁₀ scale for y (values spanning orders of magnitude; values ≤ 0 are gaps).
    pub log_y: bool,
}

/// Draws the CSV at `csv` as a PNG at `png`: one line per column after the first, against the
/// first. Returns `Ok(Some(warning))` if the plot was written without text.
pub fn plot_series_csv(csv: &Path, png: &Path, plot: &SeriesPlot) -> Result<Option<PlotWarning>> {
    let (columns, rows) = read_csv(csv)?;
    if columns.len() < 2 || rows.is_empty() {
        return Err(MetricsError::Csv {
            path: csv.to_path_buf(),
            line: 1,
            reason: "needs an x column, at least one series column and one row".into(),
        });
    }
    let tx = |v: f64| if plot.bytes_x { v.log2() } else { v };
    let ty = |v: f64| {
        if !plot.log_y {
            v
        } else if v > 0.0 {
            v.log10()
        } else {
            f64::NAN
        }
    };
    let lines: Vec<(String, Vec<(f64, f64)>)> = columns[1..]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let points = rows
                .iter()
                .map(|r| (tx(r[0]), ty(r.get(i + 1).copied().unwrap_or(f64::NAN))))
                .collect();
            (name.clone(), points)
        })
        .collect();
    let x_desc = plot.x_desc.clone().unwrap_or_else(|| columns[0].clone());
    render(png, &PlotOptions::default(), |root, text| {
        draw(root, plot, &x_desc, &lines, text)
    })
}

/// The upper corner whose quarter of the plot holds fewer points, for the legend.
fn legend_corner(
    points: &[(f64, f64)],
    x: &std::ops::Range<f64>,
    y: &std::ops::Range<f64>,
) -> SeriesLabelPosition {
    let (x_mid, y_mid) = ((x.start + x.end) / 2.0, (y.start + y.end) / 2.0);
    let upper = |left: bool| {
        points
            .iter()
            .filter(|p| p.1 > y_mid && (p.0 < x_mid) == left)
            .count()
    };
    if upper(true) > upper(false) {
        SeriesLabelPosition::UpperRight
    } else {
        SeriesLabelPosition::UpperLeft
    }
}

/// A size in bytes from its log₂: `4 B`, `64 KiB`, `16 MiB`.
fn bytes_label(log2: &f64) -> String {
    let v = 2f64.powf(*log2).round();
    let units = [("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (unit, shift) in units {
        let scale = (1u64 << shift) as f64;
        if v >= scale {
            return format!("{} {unit}", fmt_number(&(v / scale)));
        }
    }
    format!("{} B", fmt_number(&v))
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    plot: &SeriesPlot,
    x_desc: &str,
    lines: &[(String, Vec<(f64, f64)>)],
    text: bool,
) -> DrawResult<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let body = if text {
        root.titled(&plot.title, (FAMILY, 24).into_font().color(&BLACK))?
    } else {
        root.margin(8, 0, 0, 0)
    };
    let mut all: Vec<(f64, f64)> = lines.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    let (x_ticks, x_range) = x_axis(&all);
    // Whole ticks where x is whole (powers of two, workers), if that leaves two or more.
    let whole_x = plot.bytes_x || all.iter().all(|p| !p.0.is_finite() || p.0.fract() == 0.0);
    let whole: Vec<f64> = x_ticks
        .iter()
        .copied()
        .filter(|t| t.fract() == 0.0)
        .collect();
    let x_ticks = if whole_x && whole.len() >= 2 {
        whole
    } else {
        x_ticks
    };
    // A linear scale of quantities (samples/s, GB/s) starts at zero.
    if !plot.log_y && all.iter().all(|p| !p.1.is_finite() || p.1 >= 0.0) {
        all.push((x_range.start, 0.0));
    }
    let (y_ticks, y_range) = loss_axis(&all);
    let decades: Vec<f64> = y_ticks
        .iter()
        .copied()
        .filter(|t| t.fract() == 0.0)
        .collect();
    // On a log scale, whole decades (1, 10, 100) where there are two or more.
    let y_ticks = if plot.log_y && decades.len() >= 2 {
        decades
    } else {
        y_ticks
    };
    let drawn: Vec<Line<'_>> = lines
        .iter()
        .enumerate()
        .map(|(i, (label, points))| Line {
            label,
            color: PALETTE[i % PALETTE.len()],
            points,
        })
        .collect();
    let pow10 = |v: &f64| fmt_number(&10f64.powf(*v));
    let corner = legend_corner(&all, &x_range, &y_range);
    draw_panel(
        &body,
        Panel {
            caption: "",
            x_desc,
            y_desc: &plot.y_desc,
            x: (x_ticks, x_range),
            y: (y_ticks, y_range),
            y_fmt: if plot.log_y { &pow10 } else { &fmt_number },
            x_fmt: plot
                .bytes_x
                .then_some(&bytes_label as &dyn Fn(&f64) -> String),
            lines: &drawn,
            legend_pos: corner,
        },
        text,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_labelled_in_binary_units() {
        assert_eq!(bytes_label(&2.0), "4 B");
        assert_eq!(bytes_label(&16.0), "64 KiB");
        assert_eq!(bytes_label(&26.0), "64 MiB");
    }

    #[test]
    fn a_csv_becomes_a_png_and_a_bad_one_an_error() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| MetricsError::io(Path::new("tmp"), e))?;
        let csv = dir.path().join("busbw.csv");
        let text = "bytes,kolo-shm,gloo\n4,0.001,0.0002\n65536,1.5,\n16777216,9.8,2.1\n";
        std::fs::write(&csv, text).map_err(|e| MetricsError::io(&csv, e))?;
        let png = dir.path().join("busbw.png");
        let plot = SeriesPlot {
            title: "all-reduce".into(),
            y_desc: "GB/s".into(),
            bytes_x: true,
            log_y: true,
            ..SeriesPlot::default()
        };
        plot_series_csv(&csv, &png, &plot)?;
        let bytes = std::fs::read(&png).map_err(|e| MetricsError::io(&png, e))?;
        assert_eq!(&bytes[1..4], b"PNG");
        std::fs::write(&csv, "bytes\n4\n").map_err(|e| MetricsError::io(&csv, e))?;
        assert!(plot_series_csv(&csv, &png, &plot).is_err());
        Ok(())
    }
}
