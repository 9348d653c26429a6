//! Axes: tick positions, ranges and labels for the plots.

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, KeyPointWeight, Ranged};

/// (bold) and the points between them (light).
/// A linear `f64` axis whose grid lines are exactly the given ticks
pub(super) struct TickAxis {
    pub(super) range: Range<f64>,
    pub(super) bold: Vec<f64>,
    pub(super) light: Vec<f64>,
}

impl Ranged for TickAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = self.range.end - self.range.start;
        if span == 0.0 || !span.is_finite() {
            return (limit.0 + limit.1) / 2;
        }
        let frac = ((value - self.range.start) / span).clamp(-10.0, 10.0);
        let pixels = f64::from(limit.1 - limit.0) * frac;
        limit.0 + pixels.round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        match hint.weight() {
            KeyPointWeight::Bold => self.bold.clone(),
            KeyPointWeight::Any => self.light.clone(),
        }
    }

    fn range(&self) -> Range<f64> {
        self.range.clone()
    }
}

pub(super) fn finite_point(p: &(f64, f64)) -> bool {
    p.0.is_finite() && p.1.is_finite()
}

/// Formats a tick value compactly: `3`, `0.25`, `1.5e-4`.
pub(super) fn fmt_number(v: &f64) -> String {
    let v = *v;
    if v == 0.0 {
        return "0".to_string();
    }
    let a = v.abs();
    if !(1e-3..1e5).contains(&a) {
        return format!("{v:.1e}");
    }
    let s = format!("{v:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

pub(super) fn midpoints(ticks: &[f64]) -> Vec<f64> {
    ticks.windows(2).map(|w| (w[0] + w[1]) / 2.0).collect()
}

/// A "nice" step (1, 2 or 5 times a power of ten) giving at most about
/// `max_ticks` ticks over `span`.
pub(super) fn nice_step(span: f64, max_ticks: usize) -> f64 {
    let raw = span / max_ticks.max(1) as f64;
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let nice = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

/// Multiples of `step` inside `range`.
pub(super) fn ticks_in(range: &Range<f64>, step: f64) -> Vec<f64> {
    let first = (range.start / step).ceil() as i64;
    let last = (range.end / step).floor() as i64;
    (first..=last.max(first - 1))
        .take(1000)
        .map(|k| {
            let v = k as f64 * step;
            // Avoid `-0` and float noise such as 0.30000000000000004.
            let v = (v / step).round() * step;
            if v == 0.0 {
                0.0
            } else {
                v
            }
        })
        .collect()
}

/// Epoch axis: integer ticks when the span allows it.
pub(super) fn x_axis(points: &[(f64, f64)]) -> (Vec<f64>, Range<f64>) {
    let xs = points.iter().filter(|p| finite_point(p)).map(|p| p.0);
    let (lo, hi) = min_max(xs).unwrap_or((0.0, 1.0));
    let span = hi - lo;
    let range = if span <= 0.0 {
        (lo - 1.0)..(hi + 1.0)
    } else {
        let pad = span * 0.04;
        (lo - pad)..(hi + pad)
    };
    let mut step = nice_step(range.end - range.start, 12);
    if span >= 2.0 {
        step = step.max(1.0);
    }
    (ticks_in(&range, step), range)
}

pub(super) fn loss_axis(points: &[(f64, f64)]) -> (Vec<f64>, Range<f64>) {
    let ys = points.iter().filter(|p| finite_point(p)).map(|p| p.1);
    let (lo, hi) = min_max(ys).unwrap_or((0.0, 1.0));
    let span = hi - lo;
    let pad = if span > 0.0 {
        span * 0.08
    } else {
        (hi.abs() * 0.1).max(0.05)
    };
    let start = if lo >= 0.0 {
        (lo - pad).max(0.0)
    } else {
        lo - pad
    };
    let range = start..(hi + pad);
    let step = nice_step(range.end - range.start, 8);
    (ticks_in(&range, step), range)
}

/// Accuracy axis in data units; returns the decimals for percent labels.
pub(super) fn accuracy_axis(
    points: &[(f64, f64)],
    percent_scale: f64,
) -> (Vec<f64>, Range<f64>, usize) {
    let top = 100.0 / percent_scale;
    let (lo, hi) = min_max(points.iter().map(|p| p.1)).unwrap_or((0.0, top));
    let span = hi - lo;
    let pad = if span > 0.0 { span * 0.1 } else { top * 0.02 };
    let range = (lo - pad).max(0.0)..(hi + pad).min(top);
    let range = if range.end > range.start {
        range
    } else {
        0.0..top
    };
    let step = nice_step(range.end - range.start, 8);
    let step_pct = step * percent_scale;
    let decimals = if step_pct >= 1.0 {
        0
    } else if step_pct >= 0.1 {
        1
    } else {
        2
    };
    (ticks_in(&range, step), range, decimals)
}

pub(super) fn min_max(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values.fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
    })
}
