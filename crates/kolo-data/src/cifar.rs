//! CIFAR-10, binary version (`cifar-10-batches-bin`).
//!
//! Each file is a sequence of 3073-byte records: one label byte (0–9) then
//! 3072 pixel bytes, a 3×32×32 image stored channel-major (1024 red, 1024
//! green, 1024 blue, each row-major). The training set is
//! `data_batch_1.bin` … `data_batch_5.bin`, the test set `test_batch.bin`.

use std::path::{Path, PathBuf};

use crate::dataset::{Dataset, Split};
use crate::error::DataError;
use crate::io::read_maybe_gz;

/// CIFAR-10 has ten classes.
pub const NUM_CLASSES: usize = 10;
/// The shape of one image: `[channels, height, width]`.
pub const SHAPE: [usize; 3] = [3, 32, 32];
/// Pixel bytes per image.
pub const IMAGE_BYTES: usize = 3 * 32 * 32;
/// Bytes per record: the label byte and the image.
pub const RECORD_BYTES: usize = 1 + IMAGE_BYTES;
/// The number of training batch files in the full dataset.
pub const TRAIN_BATCHES: usize = 5;

/// The name of training batch `i` (1-based): `data_batch_{i}.bin`.
pub fn train_batch_name(i: usize) -> String {
    format!("data_batch_{i}.bin")
}

/// The name of the test batch file.
pub const TEST_BATCH: &str = "test_batch.bin";

/// The files of a split in `dir`, or `None` if the split is absent.
///
/// The test split is `test_batch.bin`. The training split is
/// `data_batch_1.bin` followed by as many of `data_batch_2.bin` …
/// `data_batch_5.bin` as are present *consecutively*; the full dataset has
/// all five (50 000 images), and a smaller prefix is accepted for tests and
/// quick experiments — check [`Dataset::len`] if that matters.
pub fn find_split(dir: &Path, split: Split) -> Option<Vec<PathBuf>> {
    match split {
        Split::Test => {
            let p = dir.join(TEST_BATCH);
            p.is_file().then(|| vec![p])
        }
        Split::Train => {
            let files: Vec<PathBuf> = (1..=TRAIN_BATCHES)
                .map(|i| dir.join(train_batch_name(i)))
                .take_while(|p| p.is_file())
                .collect();
            (!files.is_empty()).then_some(files)
        }
    }
}

/// Loads CIFAR-10 record files, concatenated in the given order, into one
/// dataset of shape `[3, 32, 32]` with pixels scaled by 1/255.
///
/// A file whose length is not a multiple of 3073 bytes, or with a label
/// ≥ 10, is a [`DataError::Format`] naming it.
pub fn load_files(paths: &[PathBuf], name: &str) -> Result<Dataset, DataError> {
    let mut pixels = Vec::new();
    let mut labels = Vec::new();
    for path in paths {
        append_records(path, &read_maybe_gz(path)?, &mut pixels, &mut labels)?;
    }
    Dataset::from_u8(name, SHAPE, NUM_CLASSES, pixels, 255, labels)
}

/// Appends the records of the file `path`, whose contents are `data`.
pub(crate) fn append_records(
    path: &Path,
    data: &[u8],
    pixels: &mut Vec<u8>,
    labels: &mut Vec<u32>,
) -> Result<(), DataError> {
    if !data.len().is_multiple_of(RECORD_BYTES) {
        return Err(DataError::format(
            path,
            format!(
                "length {} is not a multiple of the {RECORD_BYTES}-byte record \
                 ({} whole records and {} extra bytes)",
                data.len(),
                data.len() / RECORD_BYTES,
                data.len() % RECORD_BYTES
            ),
        ));
    }
    let n = data.len() / RECORD_BYTES;
    pixels.reserve(n * IMAGE_BYTES);
    labels.reserve(n);
    for (i, rec) in data.chunks_exact(RECORD_BYTES).enumerate() {
        let label = rec[0];
        if usize::from(label) >= NUM_CLASSES {
            return Err(DataError::format(
                path,
                format!(
                    "label {label} of record {i} (byte offset {}) is not below {NUM_CLASSES}",
                    i * RECORD_BYTES
                ),
            ));
        }
        labels.push(u32::from(label));
        pixels.extend_from_slice(&rec[1..]);
    }
    Ok(())
}

/// Loads a split from a `cifar-10-batches-bin` directory (see
/// [`find_split`]). The dataset is named `"cifar10/{split}"`.
///
/// A directory without the files is [`DataError::NotFound`].
pub fn load_split(dir: &Path, split: Split) -> Result<Dataset, DataError> {
    let Some(files) = find_split(dir, split) else {
        let wanted = match split {
            Split::Train => "data_batch_1.bin … data_batch_5.bin",
            Split::Test => TEST_BATCH,
        };
        return Err(DataError::NotFound {
            dataset: "cifar10".to_owned(),
            searched: vec![dir.to_owned()],
            hint: format!("expected {wanted} there (the CIFAR-10 binary version)"),
        });
    };
    load_files(&files, &format!("cifar10/{split}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// `n` records; record `i` has label `labels[i]` and every pixel of
    /// channel `c` equal to `(i + c) % 256`.
    fn records(labels: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        for (i, &l) in labels.iter().enumerate() {
            v.push(l);
            for c in 0..3 {
                v.extend(std::iter::repeat_n(((i + c) % 256) as u8, 1024));
            }
        }
        v
    }

    #[test]
    fn two_batch_dir_round_trips() -> TestResult {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("data_batch_1.bin"), records(&[0, 1, 2]))?;
        std::fs::write(dir.path().join("data_batch_2.bin"), records(&[9, 8]))?;
        // A gap: data_batch_4 without 3 is ignored.
        std::fs::write(dir.path().join("data_batch_4.bin"), records(&[5]))?;
        std::fs::write(dir.path().join(TEST_BATCH), records(&[4]))?;

        let train = load_split(dir.path(), Split::Train)?;
        assert_eq!(train.name, "cifar10/train");
        assert_eq!(train.shape, [3, 32, 32]);
        assert_eq!(train.labels(), &[0, 1, 2, 9, 8]);
        let (mut x, mut y) = (Vec::new(), Vec::new());
        train.gather(&[4], &mut x, &mut y)?;
        assert_eq!(x.len(), 3072);
        // Record 1 of the second file: channels hold 1, 2, 3.
        assert_eq!(x[0], 1.0 / 255.0);
        assert_eq!(x[1024], 2.0 / 255.0);
        assert_eq!(x[3071], 3.0 / 255.0);
        assert_eq!(y, vec![8]);

        let test = load_split(dir.path(), Split::Test)?;
        assert_eq!(test.labels(), &[4]);
        Ok(())
    }

    #[test]
    fn missing_split_is_not_found() -> TestResult {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("data_batch_2.bin"), records(&[1]))?;
        for split in [Split::Train, Split::Test] {
            assert!(matches!(
                load_split(dir.path(), split),
                Err(DataError::NotFound { .. })
            ));
        }
        Ok(())
    }

    #[test]
    fn bad_length_names_file_and_length() -> TestResult {
        let dir = tempfile::tempdir()?;
        let f = dir.path().join(TEST_BATCH);
        let mut bytes = records(&[1, 2]);
        bytes.pop();
        std::fs::write(&f, &bytes)?;
        match load_split(dir.path(), Split::Test) {
            Err(DataError::Format { path, reason }) => {
                assert_eq!(path, f);
                assert!(reason.contains("6145"), "{reason}");
            }
            other => panic!("expected Format, got {other:?}"),
        }
        Ok(())
    }

    #[test]
    fn label_out_of_range_names_file_and_record() -> TestResult {
        let dir = tempfile::tempdir()?;
        let f = dir.path().join("data_batch_1.bin");
        std::fs::write(&f, records(&[1, 2, 10]))?;
        match load_split(dir.path(), Split::Train) {
            Err(DataError::Format { path, reason }) => {
                assert_eq!(path, f);
                assert!(reason.contains("label 10 of record 2"), "{reason}");
            }
            other => panic!("expected Format, got {other:?}"),
        }
        Ok(())
    }
}
