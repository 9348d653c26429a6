//! PNG plots: file validity, size, content, and the no-font fallback.

use std::path::{Path, PathBuf};

use kolo_metrics::{
    plot_csv, plot_training, plot_training_with, FontSource, MetricsCsv, MetricsError, PlotOptions,
    PlotWarning, TrainingSeries, FONT_CANDIDATES, TRAINING_COLUMNS,
};

const TRAIN_RGB: [u8; 3] = [31, 119, 180];
const ACC_RGB: [u8; 3] = [44, 160, 44];

fn series(epochs: u32) -> TrainingSeries {
    let mut s = TrainingSeries::default();
    for e in 1..=epochs {
        let x = f64::from(e);
        s.train_loss.push((x, 2.3 / x));
        s.test_loss.push((x, 2.0 / x + 0.05));
        s.test_accuracy.push((x, 0.9 + 0.08 * (1.0 - 1.0 / x)));
    }
    s
}

/// Checks the PNG signature and IHDR, and returns the decoded RGB pixels.
fn check_png(path: &Path, width: u32, height: u32) -> Vec<u8> {
    let bytes = std::fs::read(path).expect("read png");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&bytes[12..16], b"IHDR");
    let w = u32::from_be_bytes(bytes[16..20].try_into().expect("w"));
    let h = u32::from_be_bytes(bytes[20..24].try_into().expect("h"));
    assert_eq!((w, h), (width, height));
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().expect("png header");
    let mut buf = vec![0; reader.output_buffer_size().expect("size")];
    let info = reader.next_frame(&mut buf).expect("png data");
    assert_eq!(info.color_type, png::ColorType::Rgb);
    buf.truncate(info.buffer_size());
    buf
}

fn count_color(rgb: &[u8], color: [u8; 3]) -> usize {
    rgb.chunks_exact(3).filter(|p| *p == color).count()
}

/// Dark (text-like) pixels in rows `rows` of an RGB image of width `w`.
fn dark_pixels(rgb: &[u8], w: u32, rows: std::ops::Range<u32>) -> usize {
    let stride = w as usize * 3;
    rgb[rows.start as usize * stride..rows.end as usize * stride]
        .chunks_exact(3)
        .filter(|p| p.iter().all(|&c| c < 100))
        .count()
}

fn no_leftovers(dir: &Path) {
    let names: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.ends_with(".tmp")),
        "temporary files left: {names:?}"
    );
}

fn font_available() -> Option<PathBuf> {
    FONT_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

#[test]
fn plot_with_font_lookup() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("training.png");
    let warning = plot_training(&series(12), &path, "mnist: 12 epochs").expect("plot");
    let rgb = check_png(&path, 1200, 480);
    assert!(
        count_color(&rgb, TRAIN_RGB) > 500,
        "train loss line missing"
    );
    assert!(count_color(&rgb, ACC_RGB) > 500, "accuracy line missing");
    match (&warning, font_available()) {
        (None, _) => {
            // The title is drawn in the top rows.
            assert!(dark_pixels(&rgb, 1200, 0..34) > 100, "title missing");
        }
        (Some(PlotWarning::NoFont { tried }), None) => {
            eprintln!("no font installed; checked the text-less fallback only");
            assert!(!tried.is_empty());
        }
        (w, font) => panic!("unexpected warning {w:?} with font {font:?}"),
    }
    no_leftovers(tmp.path());
}

#[test]
fn plot_without_font_still_draws() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("p.png");
    let opts = PlotOptions {
        width: 900,
        height: 400,
        font: FontSource::Disabled,
    };
    let warning = plot_training_with(&series(5), &path, "title", &opts).expect("plot");
    assert_eq!(warning, Some(PlotWarning::TextDisabled));
    let rgb = check_png(&path, 900, 400);
    assert!(
        count_color(&rgb, TRAIN_RGB) > 300,
        "train loss line missing"
    );
    assert!(count_color(&rgb, ACC_RGB) > 300, "accuracy line missing");
    // No title text at the top.
    assert_eq!(dark_pixels(&rgb, 900, 0..6), 0);

    // Redrawing replaces the file atomically.
    plot_training_with(&series(8), &path, "title", &opts).expect("replot");
    check_png(&path, 900, 400);
    no_leftovers(tmp.path());
}

#[test]
fn plot_with_unusable_font_file_warns() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let bogus = tmp.path().join("bogus.ttf");
    std::fs::write(&bogus, b"definitely not a font").expect("write");
    let path = tmp.path().join("p.png");
    for font in [bogus.clone(), tmp.path().join("missing.ttf")] {
        let opts = PlotOptions {
            font: FontSource::File(font.clone()),
            ..PlotOptions::default()
        };
        let warning = plot_training_with(&series(3), &path, "t", &opts).expect("plot");
        match warning {
            Some(PlotWarning::NoFont { tried }) => assert_eq!(tried[0].0, font),
            other => panic!("expected NoFont, got {other:?}"),
        }
        check_png(&path, 1200, 480);
    }
}

#[test]
fn plot_edge_cases() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("p.png");
    let opts = PlotOptions {
        font: FontSource::Disabled,
        ..PlotOptions::default()
    };
    // Empty, single epoch, NaN-only and constant series must all render.
    let mut cases = vec![TrainingSeries::default(), series(1)];
    let mut nan = series(3);
    nan.test_loss = vec![(1.0, f64::NAN), (2.0, f64::INFINITY)];
    cases.push(nan);
    let mut flat = series(4);
    flat.train_loss.iter_mut().for_each(|p| p.1 = 0.0);
    flat.test_accuracy.iter_mut().for_each(|p| p.1 = 1.0);
    cases.push(flat);
    cases.push(series(500));
    for s in &cases {
        plot_training_with(s, &path, "edge", &opts).expect("plot");
        check_png(&path, 1200, 480);
    }
    let bad = PlotOptions {
        width: 10,
        ..PlotOptions::default()
    };
    assert!(matches!(
        plot_training_with(&series(2), &path, "t", &bad),
        Err(MetricsError::Plot { .. })
    ));
    let err = plot_training_with(&series(2), &tmp.path().join("no/dir/p.png"), "t", &opts)
        .expect_err("missing dir");
    assert!(err.to_string().contains("no/dir"), "{err}");
}

#[test]
fn plot_from_metrics_csv() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let csv_path = tmp.path().join("metrics.csv");
    let mut csv = MetricsCsv::create(&csv_path, &TRAINING_COLUMNS).expect("csv");
    for e in 1..=6 {
        let x = f64::from(e);
        csv.append(&[
            x,
            x * 100.0,
            1.0 / x,
            1.1 / x,
            0.8 + x / 50.0,
            3.0,
            1e4,
            0.1,
        ])
        .expect("append");
    }
    let series = TrainingSeries::from_csv(&csv_path).expect("series");
    assert_eq!(series.train_loss.len(), 6);
    assert_eq!(series.test_accuracy[5], (6.0, 0.8 + 6.0 / 50.0));
    let png = tmp.path().join("training.png");
    plot_csv(&csv_path, &png, "from csv").expect("plot");
    check_png(&png, 1200, 480);

    let cols = vec!["step".to_string()];
    assert!(matches!(
        TrainingSeries::from_table(&cols, &[vec![1.0]]),
        Err(MetricsError::MissingColumn { .. })
    ));
}
