//! scikit-learn's handwritten digits (`digits.csv.gz`).
//!
//! The file ships inside the scikit-learn wheel as
//! `sklearn/datasets/data/digits.csv.gz`: 1797 rows, no header, each with 64
//! comma-separated pixel intensities 0–16 (an 8×8 image, row-major) and then
//! the label 0–9. Samples have shape `[1, 8, 8]` and are scaled by 1/16.
//!
//! The dataset has no official train/test split; [`split`] uses a fixed,
//! seeded 80/20 split (see [`SPLIT_SEED`]).

use std::path::Path;

use crate::dataset::{Dataset, Split};
use crate::error::DataError;
use crate::io::read_maybe_gz;
use crate::rng::permutation;

/// Ten classes, the digits 0–9.
pub const NUM_CLASSES: usize = 10;
/// The shape of one sample.
pub const SHAPE: [usize; 3] = [1, 8, 8];
/// Pixel values per row.
pub const PIXELS: usize = 64;
/// The largest pixel value; features are scaled by its inverse.
pub const MAX_VALUE: u8 = 16;
/// The number of rows in scikit-learn's file.
pub const EXPECTED_ROWS: usize = 1797;
/// The seed of the fixed train/test split.
pub const SPLIT_SEED: u64 = 0x6469_6769_7473; // "digits"
/// The standard file name.
pub const FILE_NAME: &str = "digits.csv.gz";

/// Parses one CSV field as an integer 0..=`max` (accepting integral decimals
/// such as `5.0`, as NumPy writes them).
fn parse_field(field: &str, max: u8) -> Result<u8, String> {
    let f = field.trim();
    let value = match f.parse::<u64>() {
        Ok(v) => Some(v),
        Err(_) => match f.parse::<f64>() {
            Ok(x) if x.fract() == 0.0 && (0.0..=255.0).contains(&x) => Some(x as u64),
            Ok(_) => None,
            Err(_) => return Err(format!("`{f}` is not a number")),
        },
    };
    match value {
        Some(v) if v <= u64::from(max) => Ok(v as u8),
        _ => Err(format!("`{f}` is not an integer in 0..={max}")),
    }
}

/// Loads the whole file (plain or gzip, detected by content) as one dataset
/// named `"digits"`.
///
/// A malformed row is a [`DataError::Parse`] naming the file and its
/// 1-based line number; blank lines are skipped; a file without rows is a
/// [`DataError::Format`].
pub fn load_csv(path: &Path) -> Result<Dataset, DataError> {
    parse_csv(path, &read_maybe_gz(path)?)
}

/// Parses the (decompressed) contents of the CSV file `path`.
pub(crate) fn parse_csv(path: &Path, bytes: &[u8]) -> Result<Dataset, DataError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let line = 1 + bytes[..e.valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        DataError::Parse {
            path: path.to_owned(),
            line,
            reason: "not valid UTF-8".to_owned(),
        }
    })?;
    let mut pixels = Vec::with_capacity(EXPECTED_ROWS * PIXELS);
    let mut labels = Vec::with_capacity(EXPECTED_ROWS);
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let parse_err = |reason: String| DataError::Parse {
            path: path.to_owned(),
            line: i + 1,
            reason,
        };
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() != PIXELS + 1 {
            return Err(parse_err(format!(
                "expected {} comma-separated values ({PIXELS} pixels and a label), found {}",
                PIXELS + 1,
                fields.len()
            )));
        }
        for (j, field) in fields[..PIXELS].iter().enumerate() {
            let v = parse_field(field, MAX_VALUE)
                .map_err(|r| parse_err(format!("pixel {}: {r}", j + 1)))?;
            pixels.push(v);
        }
        let label = parse_field(fields[PIXELS], (NUM_CLASSES - 1) as u8)
            .map_err(|r| parse_err(format!("label: {r}")))?;
        labels.push(u32::from(label));
    }
    if labels.is_empty() {
        return Err(DataError::format(path, "no data rows"));
    }
    Dataset::from_u8("digits", SHAPE, NUM_CLASSES, pixels, MAX_VALUE, labels)
}

/// The indices of `split` in a dataset of `len` samples under the fixed
/// split: the samples are shuffled with [`SPLIT_SEED`]
/// ([`crate::rng::permutation`]); the first `⌊0.8·len⌋` form the training
/// set and the rest the test set, each returned in ascending order.
pub fn split_indices(len: usize, split: Split) -> Vec<usize> {
    let perm = permutation(len, SPLIT_SEED);
    let n_train = len * 4 / 5;
    let mut part = match split {
        Split::Train => perm[..n_train].to_vec(),
        Split::Test => perm[n_train..].to_vec(),
    };
    part.sort_unstable();
    part
}

/// One side of the fixed 80/20 split of `full` (see [`split_indices`]),
/// named `"digits/{split}"`. For scikit-learn's 1797 rows: 1437 train,
/// 360 test.
pub fn split(full: &Dataset, split: Split) -> Result<Dataset, DataError> {
    let mut part = full.subset(&split_indices(full.len(), split))?;
    part.name = format!("digits/{split}");
    Ok(part)
}

/// Loads `path` and returns one side of the fixed split.
pub fn load_split(path: &Path, which: Split) -> Result<Dataset, DataError> {
    split(&load_csv(path)?, which)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mnist::tests::write;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn row(pixel: u8, label: u8) -> String {
        let mut s = vec![pixel.to_string(); PIXELS];
        s.push(label.to_string());
        s.join(",")
    }

    #[test]
    fn small_csv_gz_round_trips_and_splits() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join(FILE_NAME);
        let rows: Vec<String> = (0..10).map(|i| row(i as u8, (9 - i) as u8)).collect();
        write(&path, format!("{}\n", rows.join("\n")).as_bytes(), true)?;
        let d = load_csv(&path)?;
        assert_eq!(d.len(), 10);
        assert_eq!(d.shape, [1, 8, 8]);
        assert_eq!(d.label(0)?, 9);
        let (mut x, mut y) = (Vec::new(), Vec::new());
        d.gather(&[8], &mut x, &mut y)?;
        assert_eq!(x, vec![0.5; 64]);
        assert_eq!(y, vec![1]);

        let train = split(&d, Split::Train)?;
        let test = split(&d, Split::Test)?;
        assert_eq!((train.len(), test.len()), (8, 2));
        assert_eq!(train.name, "digits/train");
        let mut all: Vec<u32> = train
            .labels()
            .iter()
            .chain(test.labels())
            .copied()
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..10).collect::<Vec<u32>>());
        Ok(())
    }

    #[test]
    fn split_is_fixed_and_disjoint() {
        let a = split_indices(EXPECTED_ROWS, Split::Train);
        let b = split_indices(EXPECTED_ROWS, Split::Test);
        assert_eq!((a.len(), b.len()), (1437, 360));
        assert_eq!(a, split_indices(EXPECTED_ROWS, Split::Train));
        let mut all = [a, b].concat();
        all.sort_unstable();
        assert_eq!(all, (0..EXPECTED_ROWS).collect::<Vec<_>>());
    }

    #[test]
    fn bad_line_names_its_number() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("d.csv");
        let cases = [
            (row(17, 1), "pixel 1"),
            (row(1, 10), "label"),
            (row(1, 1).replacen("1", "x", 1), "`x` is not a number"),
            (row(1, 1) + ",3", "found 66"),
        ];
        for (bad, needle) in cases {
            let text = format!("{}\n\n{}\n{bad}\n{}\n", row(0, 0), row(1, 1), row(2, 2));
            write(&path, text.as_bytes(), false)?;
            match load_csv(&path) {
                Err(DataError::Parse {
                    path: p,
                    line,
                    reason,
                }) => {
                    assert_eq!(p, path);
                    assert_eq!(line, 4, "{reason}");
                    assert!(reason.contains(needle), "{reason} lacks {needle}");
                }
                other => panic!("expected Parse, got {other:?}"),
            }
        }
        Ok(())
    }

    #[test]
    fn numpy_style_decimals_are_accepted() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("d.csv");
        let mut fields = vec!["16.0"; PIXELS];
        fields.push("3.0");
        write(&path, fields.join(",").as_bytes(), false)?;
        let d = load_csv(&path)?;
        assert_eq!(d.labels(), &[3]);
        assert!(parse_field("1.5", 16).is_err());
        Ok(())
    }

    #[test]
    fn empty_file_is_an_error() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("d.csv");
        write(&path, b"\n\n", false)?;
        assert!(matches!(load_csv(&path), Err(DataError::Format { .. })));
        Ok(())
    }
}
