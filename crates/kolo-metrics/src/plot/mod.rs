//! The PNG plot of loss and accuracy per epoch.
//!
//! Drawn with `plotters` into an in-memory RGB buffer, encoded with `png` to
//! a temporary file and renamed into place, so a viewer never sees a
//! half-written image even though the plot is redrawn every epoch.
//!
//! Text needs a TrueType font, and a fresh machine may have none. The font is
//! loaded from a file at run time (see [`FontSource`]); if none is usable the
//! plot is still drawn — curves, axes and grid, without any text — and a
//! [`PlotWarning`] is returned instead of an error, so training never fails
//! because of fonts.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::error::{MetricsError, Result};

mod axis;
mod font;
mod png;
mod scaling;
mod series;

pub use scaling::{plot_scaling, ScalingPoint};
pub use series::{plot_series_csv, SeriesPlot};

use axis::*;
use font::{load_any_font, load_font};
use png::write_png_atomically;

/// Environment variable naming a TTF/OTF file to use for plot text.
pub const FONT_ENV: &str = "KOLO_PLOT_FONT";

/// Font files tried, in order, by [`FontSource::Auto`] after [`FONT_ENV`].
pub const FONT_CANDIDATES: &[&str] = &[
    // Debian / Ubuntu: fonts-dejavu-core
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    // Fedora / RHEL
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    // Arch / Alpine
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/ttf-dejavu/DejaVuSans.ttf",
    // Other common sans fonts
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
    // macOS
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "/Library/Fonts/Arial.ttf",
    // Windows
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Font files larger than this are rejected (they are kept in memory for
/// the life of the process).
const MAX_FONT_BYTES: u64 = 64 << 20;

/// The family name the font is registered under: the one plotters uses for
/// its default text styles.
const FAMILY: &str = "sans-serif";

const TRAIN_COLOR: RGBColor = RGBColor(31, 119, 180);
const TEST_COLOR: RGBColor = RGBColor(255, 127, 14);
const ACC_COLOR: RGBColor = RGBColor(44, 160, 44);
const AXIS_COLOR: RGBColor = RGBColor(60, 60, 60);
const GRID_COLOR: RGBColor = RGBColor(225, 225, 225);
const LIGHT_GRID_COLOR: RGBColor = RGBColor(242, 242, 242);

/// The per-epoch series to plot: `(epoch, value)` points, in any order of
/// epochs (they are drawn as given). Non-finite values are skipped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrainingSeries {
    /// Training loss per epoch.
    pub train_loss: Vec<(f64, f64)>,
    /// Test (validation) loss per epoch.
    pub test_loss: Vec<(f64, f64)>,
    /// Test accuracy per epoch, as a fraction in `[0, 1]` or a percentage in
    /// `[0, 100]` (detected from the values).
    pub test_accuracy: Vec<(f64, f64)>,
}

impl TrainingSeries {
    /// Builds the series from a table as returned by
    /// [`read_csv`](crate::read_csv): the `epoch` column is required;
    /// `train_loss`, `test_loss` and `test_accuracy` are used if present.
    /// Rows with a non-finite epoch and non-finite cells are skipped.
    pub fn from_table(columns: &[String], rows: &[Vec<f64>]) -> Result<TrainingSeries> {
        Self::from_table_at(Path::new("<memory>"), columns, rows)
    }

    /// Reads a metrics CSV file and builds the series from it.
    pub fn from_csv(path: &Path) -> Result<TrainingSeries> {
        let (columns, rows) = crate::read_csv(path)?;
        Self::from_table_at(path, &columns, &rows)
    }

    fn from_table_at(path: &Path, columns: &[String], rows: &[Vec<f64>]) -> Result<TrainingSeries> {
        let find = |name: &str| columns.iter().position(|c| c == name);
        let epoch = find("epoch").ok_or_else(|| MetricsError::MissingColumn {
            path: path.to_path_buf(),
            reason: format!("no `epoch` column (columns: {})", columns.join(",")),
        })?;
        let pick = |col: Option<usize>| -> Vec<(f64, f64)> {
            let Some(col) = col else { return Vec::new() };
            rows.iter()
                .filter_map(|r| Some((*r.get(epoch)?, *r.get(col)?)))
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect()
        };
        Ok(TrainingSeries {
            train_loss: pick(find("train_loss")),
            test_loss: pick(find("test_loss")),
            test_accuracy: pick(find("test_accuracy")),
        })
    }
}

/// Where the font for plot text comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FontSource {
    /// The file named by [`FONT_ENV`] if set, else the first usable file of
    /// [`FONT_CANDIDATES`].
    #[default]
    Auto,
    /// This TTF/OTF file only.
    File(PathBuf),
    /// No text at all (no font lookup).
    Disabled,
}

/// Size and font of a plot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlotOptions {
    /// Image width in pixels (200..=8192).
    pub width: u32,
    /// Image height in pixels (150..=8192).
    pub height: u32,
    /// Where the font comes from.
    pub font: FontSource,
}

impl Default for PlotOptions {
    fn default() -> Self {
        PlotOptions {
            width: 1200,
            height: 480,
            font: FontSource::Auto,
        }
    }
}

/// A problem that did not stop the plot from being written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlotWarning {
    /// No usable font was found, so the plot has no text.
    NoFont {
        /// Each font file tried and why it was not used.
        tried: Vec<(PathBuf, String)>,
    },
    /// Text was disabled with [`FontSource::Disabled`].
    TextDisabled,
}

impl fmt::Display for PlotWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlotWarning::NoFont { tried } => {
                write!(f, "no usable font, plot drawn without text (")?;
                let mut found_any = false;
                for (path, why) in tried {
                    if why != NOT_FOUND {
                        if found_any {
                            f.write_str("; ")?;
                        }
                        write!(f, "{}: {why}", path.display())?;
                        found_any = true;
                    }
                }
                if !found_any {
                    write!(f, "none of {} known font paths exists", tried.len())?;
                }
                write!(
                    f,
                    "); install fonts-dejavu-core or set {FONT_ENV} to a .ttf file"
                )
            }
            PlotWarning::TextDisabled => f.write_str("plot text disabled, drawn without text"),
        }
    }
}

const NOT_FOUND: &str = "not found";

/// Draws `series` as a PNG at `path` with the default [`PlotOptions`]:
/// train/test loss vs epoch on the left, test accuracy vs epoch on the right,
/// with axes, labels, legends and `title` on top.
///
/// Returns `Ok(Some(warning))` if the plot was written without text.
pub fn plot_training(
    series: &TrainingSeries,
    path: &Path,
    title: &str,
) -> Result<Option<PlotWarning>> {
    plot_training_with(series, path, title, &PlotOptions::default())
}

/// Reads the metrics CSV at `csv` and plots it to `png` (see [`plot_training`]).
pub fn plot_csv(csv: &Path, png: &Path, title: &str) -> Result<Option<PlotWarning>> {
    let series = TrainingSeries::from_csv(csv)?;
    plot_training(&series, png, title)
}

/// Like [`plot_training`], with explicit size and font.
pub fn plot_training_with(
    series: &TrainingSeries,
    path: &Path,
    title: &str,
    options: &PlotOptions,
) -> Result<Option<PlotWarning>> {
    render(path, options, |root, text| draw(root, series, title, text))
}

/// Draws with `draw` (given whether text can be drawn) into a `options`-sized image and writes it
/// to `path` as a PNG, atomically; the warning when there is no font for text.
fn render(
    path: &Path,
    options: &PlotOptions,
    draw: impl FnOnce(&DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>, bool) -> DrawResult<()>,
) -> Result<Option<PlotWarning>> {
    let plot_err = |reason: String| MetricsError::Plot {
        path: path.to_path_buf(),
        reason,
    };
    let (w, h) = (options.width, options.height);
    if !(200..=8192).contains(&w) || !(150..=8192).contains(&h) {
        return Err(plot_err(format!(
            "image size {w}x{h} outside 200x150..=8192x8192"
        )));
    }
    let warning = match &options.font {
        FontSource::Disabled => Some(PlotWarning::TextDisabled),
        FontSource::File(p) => load_font(p).err().map(|why| PlotWarning::NoFont {
            tried: vec![(p.clone(), why)],
        }),
        FontSource::Auto => load_any_font().err(),
    };
    let text = warning.is_none();

    let mut buf = vec![255u8; w as usize * h as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        draw(&root, text).map_err(|e| plot_err(e.to_string()))?;
        root.present().map_err(|e| plot_err(e.to_string()))?;
    }
    write_png_atomically(path, &buf, w, h)?;
    Ok(warning)
}

pub(super) type DrawResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Clears `root`, puts `title` on top (when there is text) and returns the left and right panels
/// below it.
pub(super) fn two_panels<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    text: bool,
) -> DrawResult<Vec<DrawingArea<DB, plotters::coord::Shift>>>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let body = if text {
        root.titled(title, (FAMILY, 24).into_font().color(&BLACK))?
    } else {
        root.margin(8, 0, 0, 0)
    };
    Ok(body.split_evenly((1, 2)))
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    series: &TrainingSeries,
    title: &str,
    text: bool,
) -> DrawResult<()>
where
    DB::ErrorType: 'static,
{
    let panels = two_panels(root, title, text)?;

    // Left: losses.
    let loss_points: Vec<(f64, f64)> = series
        .train_loss
        .iter()
        .chain(&series.test_loss)
        .copied()
        .collect();
    let (x_ticks, x_range) = x_axis(&loss_points);
    let (y_ticks, y_range) = loss_axis(&loss_points);
    let losses = [
        Line {
            label: "train loss",
            color: TRAIN_COLOR,
            points: &series.train_loss,
        },
        Line {
            label: "test loss",
            color: TEST_COLOR,
            points: &series.test_loss,
        },
    ];
    draw_panel(
        &panels[0],
        Panel {
            caption: "Loss",
            x_desc: "epoch",
            y_desc: "loss",
            x: (x_ticks, x_range),
            y: (y_ticks, y_range),
            x_fmt: None,
            y_fmt: &fmt_number,
            lines: &losses,
            legend_pos: SeriesLabelPosition::UpperRight,
        },
        text,
    )?;

    // Right: accuracy.
    let acc = &series.test_accuracy;
    let finite: Vec<(f64, f64)> = acc.iter().copied().filter(finite_point).collect();
    let percent_scale = if finite.iter().all(|p| p.1 <= 1.0 + 1e-9) {
        100.0
    } else {
        1.0
    };
    let (x_ticks, x_range) = x_axis(acc);
    let (y_ticks, y_range, decimals) = accuracy_axis(&finite, percent_scale);
    let best = finite
        .iter()
        .copied()
        .fold(None, |best: Option<(f64, f64)>, p| match best {
            Some(b) if b.1 >= p.1 => Some(b),
            _ => Some(p),
        });
    let acc_label = match best {
        Some((e, v)) => format!(
            "test accuracy (best {:.*}% at epoch {})",
            decimals.max(1),
            v * percent_scale,
            fmt_number(&e)
        ),
        None => "test accuracy".to_string(),
    };
    let y_fmt = move |v: &f64| format!("{:.*}%", decimals, v * percent_scale);
    let acc_lines = [Line {
        label: &acc_label,
        color: ACC_COLOR,
        points: acc,
    }];
    draw_panel(
        &panels[1],
        Panel {
            caption: "Test accuracy",
            x_desc: "epoch",
            y_desc: "accuracy",
            x: (x_ticks, x_range),
            y: (y_ticks, y_range),
            x_fmt: None,
            y_fmt: &y_fmt,
            lines: &acc_lines,
            legend_pos: SeriesLabelPosition::LowerRight,
        },
        text,
    )?;
    Ok(())
}

pub(super) struct Panel<'a> {
    pub(super) caption: &'a str,
    pub(super) x_desc: &'a str,
    pub(super) y_desc: &'a str,
    pub(super) x: (Vec<f64>, Range<f64>),
    pub(super) y: (Vec<f64>, Range<f64>),
    pub(super) y_fmt: &'a dyn Fn(&f64) -> String,
    /// Labels of the x axis' ticks (`None`: plain numbers).
    pub(super) x_fmt: Option<&'a dyn Fn(&f64) -> String>,
    pub(super) lines: &'a [Line<'a>],
    pub(super) legend_pos: SeriesLabelPosition,
}

/// One curve of a panel.
pub(super) struct Line<'a> {
    pub(super) label: &'a str,
    pub(super) color: RGBColor,
    pub(super) points: &'a [(f64, f64)],
}

pub(super) fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: Panel<'_>,
    text: bool,
) -> DrawResult<()>
where
    DB::ErrorType: 'static,
{
    let (x_ticks, x_range) = panel.x;
    let (y_ticks, y_range) = panel.y;
    let x_light = midpoints(&x_ticks);
    let y_light = midpoints(&y_ticks);
    let x_coord = TickAxis {
        range: x_range.clone(),
        bold: x_ticks,
        light: x_light,
    };
    let y_coord = TickAxis {
        range: y_range.clone(),
        bold: y_ticks,
        light: y_light,
    };

    let mut builder = ChartBuilder::on(area);
    builder
        .margin_top(8)
        .margin_bottom(12)
        .margin_left(12)
        .margin_right(24);
    if text {
        builder
            .caption(panel.caption, (FAMILY, 18).into_font().color(&BLACK))
            .x_label_area_size(48)
            .y_label_area_size(72);
    } else {
        builder.margin_left(40).margin_bottom(30);
    }
    let mut chart = builder.build_cartesian_2d(x_coord, y_coord)?;

    {
        let mut mesh = chart.configure_mesh();
        mesh.bold_line_style(GRID_COLOR)
            .light_line_style(LIGHT_GRID_COLOR)
            .axis_style(AXIS_COLOR)
            .x_label_formatter(panel.x_fmt.unwrap_or(&fmt_number))
            .y_label_formatter(&panel.y_fmt);
        if text {
            mesh.x_desc(panel.x_desc)
                .y_desc(panel.y_desc)
                .label_style((FAMILY, 14).into_font().color(&AXIS_COLOR))
                .axis_desc_style((FAMILY, 15).into_font().color(&BLACK));
        }
        mesh.draw()?;
    }
    // The frame: without label areas plotters draws no axis lines.
    chart.draw_series(std::iter::once(Rectangle::new(
        [(x_range.start, y_range.start), (x_range.end, y_range.end)],
        AXIS_COLOR.stroke_width(1),
    )))?;

    for line in panel.lines {
        let (label, color) = (line.label, line.color);
        let points: Vec<(f64, f64)> = line.points.iter().copied().filter(finite_point).collect();
        if points.is_empty() {
            continue;
        }
        let style = color.stroke_width(2);
        let drawn = chart.draw_series(LineSeries::new(points.iter().copied(), style))?;
        if text {
            drawn.label(label).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
            });
        }
        // Markers only while they do not merge into a blob.
        if points.len() <= 60 {
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
    }
    if text
        && panel
            .lines
            .iter()
            .any(|l| l.points.iter().any(finite_point))
    {
        chart
            .configure_series_labels()
            .position(panel.legend_pos)
            .margin(10)
            .legend_area_size(32)
            .background_style(WHITE.mix(0.9))
            .border_style(GRID_COLOR)
            .label_font((FAMILY, 14).into_font().color(&BLACK))
            .draw()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::axis::*;
    use super::*;

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(10.0, 10), 1.0);
        assert_eq!(nice_step(30.0, 10), 5.0);
        assert_eq!(nice_step(0.9, 8), 0.2);
        assert!((nice_step(0.05, 8) - 0.01).abs() < 1e-12);
    }

    #[test]
    fn epoch_ticks_are_integers() {
        let pts: Vec<(f64, f64)> = (1..=7).map(|e| (f64::from(e), 1.0)).collect();
        let (ticks, range) = x_axis(&pts);
        assert_eq!(ticks, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        assert!(range.start < 1.0 && range.end > 7.0);
        let pts: Vec<(f64, f64)> = (0..100).map(|e| (f64::from(e), 1.0)).collect();
        let (ticks, _) = x_axis(&pts);
        assert_eq!(ticks.first(), Some(&0.0));
        assert_eq!(ticks.get(1), Some(&10.0));
        // A single epoch still gives a usable axis.
        let (ticks, range) = x_axis(&[(3.0, 1.0)]);
        assert!(ticks.contains(&3.0) && range.start < 3.0 && range.end > 3.0);
    }

    #[test]
    fn accuracy_axis_fraction_and_percent() {
        let pts = [(1.0, 0.90), (2.0, 0.95), (3.0, 0.97)];
        let (ticks, range, decimals) = accuracy_axis(&pts, 100.0);
        assert!(range.start >= 0.0 && range.end <= 1.0);
        assert!(range.start < 0.90 && range.end > 0.97);
        assert!(!ticks.is_empty());
        assert_eq!(decimals, 0);
        let (_, range, _) = accuracy_axis(&[(1.0, 50.0), (2.0, 99.9)], 1.0);
        assert!(range.end <= 100.0 && range.start < 50.0);
    }

    #[test]
    fn number_format() {
        assert_eq!(fmt_number(&3.0), "3");
        assert_eq!(fmt_number(&0.25), "0.25");
        assert_eq!(fmt_number(&0.0), "0");
        assert_eq!(fmt_number(&1.5e-4), "1.5e-4");
    }

    #[test]
    fn warning_messages() {
        let w = PlotWarning::NoFont {
            tried: vec![
                (PathBuf::from("/a.ttf"), NOT_FOUND.to_string()),
                (PathBuf::from("/b.ttf"), "not a valid font".to_string()),
            ],
        };
        let s = w.to_string();
        assert!(s.contains("/b.ttf: not a valid font"), "{s}");
        assert!(!s.contains("/a.ttf"), "{s}");
        assert!(s.contains(FONT_ENV));
    }
}
