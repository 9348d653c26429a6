//! The scaling plot (the figure of seed 001): throughput against the number of workers with ideal
//! linear scaling drawn for comparison, and the scaling efficiency of every point; points with more
//! ranks than cores (oversubscribed) drawn apart.

use std::path::Path;

use plotters::prelude::*;

use super::axis::{fmt_number, loss_axis, x_axis};
use super::{draw_panel, render, two_panels, DrawResult, Line, Panel, PlotOptions, PlotWarning};
use crate::error::Result;

const MEASURED: RGBColor = RGBColor(31, 119, 180);
const OVERSUBSCRIBED: RGBColor = RGBColor(214, 39, 40);
const IDEAL: RGBColor = RGBColor(150, 150, 150);
const EFFICIENCY: RGBColor = RGBColor(44, 160, 44);

/// One measured configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScalingPoint {
    /// Worker processes.
    pub workers: usize,
    /// Training samples per second, all workers together.
    pub samples_per_second: f64,
    /// More ranks than cores: the workers share cores.
    pub oversubscribed: bool,
}

/// Draws `points` (at least one; the first is the baseline of "ideal" and of the efficiency) as a
/// PNG at `path`: samples/s against workers with the ideal line `workers × baseline / workers₀`
/// on the left, efficiency (measured / ideal) in percent on the right.
pub fn plot_scaling(
    points: &[ScalingPoint],
    path: &Path,
    title: &str,
) -> Result<Option<PlotWarning>> {
    render(path, &PlotOptions::default(), |root, text| {
        draw(root, points, title, text)
    })
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    points: &[ScalingPoint],
    title: &str,
    text: bool,
) -> DrawResult<()>
where
    DB::ErrorType: 'static,
{
    let panels = two_panels(root, title, text)?;
    let Some(base) = points.first() else {
        return Ok(());
    };
    let per_worker = base.samples_per_second / base.workers.max(1) as f64;
    let xy = |p: &ScalingPoint| (p.workers as f64, p.samples_per_second);
    let fitting: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| !p.oversubscribed)
        .map(xy)
        .collect();
    // The oversubscribed points, joined to the last point that fits the cores.
    let mut over: Vec<(f64, f64)> = fitting.last().copied().into_iter().collect();
    over.extend(points.iter().filter(|p| p.oversubscribed).map(xy));
    if over.len() == 1 {
        over.clear();
    }
    let ideal: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.workers as f64, per_worker * p.workers as f64))
        .collect();
    let all: Vec<(f64, f64)> = points.iter().map(xy).chain(ideal.iter().copied()).collect();
    let (x_ticks, x_range) = x_axis(&all);
    let (y_ticks, y_range) = loss_axis(&all);
    let lines = [
        Line {
            label: "ideal (linear)",
            color: IDEAL,
            points: &ideal,
        },
        Line {
            label: "measured",
            color: MEASURED,
            points: &fitting,
        },
        Line {
            label: "oversubscribed (ranks > cores)",
            color: OVERSUBSCRIBED,
            points: &over,
        },
    ];
    draw_panel(
        &panels[0],
        Panel {
            caption: "Throughput",
            x_desc: "workers",
            y_desc: "samples/s",
            x: (x_ticks.clone(), x_range.clone()),
            y: (y_ticks, y_range),
            x_fmt: None,
            y_fmt: &fmt_number,
            lines: &lines,
            legend_pos: SeriesLabelPosition::UpperLeft,
        },
        text,
    )?;

    let eff = |p: &ScalingPoint| {
        let ideal = per_worker * p.workers as f64;
        (
            p.workers as f64,
            100.0 * p.samples_per_second / ideal.max(f64::MIN_POSITIVE),
        )
    };
    let eff_fit: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| !p.oversubscribed)
        .map(eff)
        .collect();
    let mut eff_over: Vec<(f64, f64)> = eff_fit.last().copied().into_iter().collect();
    eff_over.extend(points.iter().filter(|p| p.oversubscribed).map(eff));
    if eff_over.len() == 1 {
        eff_over.clear();
    }
    let hundred: Vec<(f64, f64)> = points.iter().map(|p| (p.workers as f64, 100.0)).collect();
    let mut eff_all: Vec<(f64, f64)> = eff_fit.iter().chain(&eff_over).copied().collect();
    eff_all.push((base.workers as f64, 0.0));
    eff_all.push((base.workers as f64, 100.0));
    let (e_ticks, e_range) = loss_axis(&eff_all);
    let eff_lines = [
        Line {
            label: "ideal (100 %)",
            color: IDEAL,
            points: &hundred,
        },
        Line {
            label: "efficiency",
            color: EFFICIENCY,
            points: &eff_fit,
        },
        Line {
            label: "oversubscribed",
            color: OVERSUBSCRIBED,
            points: &eff_over,
        },
    ];
    draw_panel(
        &panels[1],
        Panel {
            caption: "Scaling efficiency",
            x_desc: "workers",
            y_desc: "% of ideal",
            x: (x_ticks, x_range),
            y: (e_ticks, e_range),
            x_fmt: None,
            y_fmt: &fmt_number,
            lines: &eff_lines,
            legend_pos: SeriesLabelPosition::LowerLeft,
        },
        text,
    )?;
    Ok(())
}
