//! The idx format of MNIST and Fashion-MNIST.
//!
//! An images file (`*-images-idx3-ubyte`) is the big-endian header
//! `0x00000803, n, rows, cols` followed by `n·rows·cols` pixel bytes; a labels
//! file (`*-labels-idx1-ubyte`) is `0x00000801, n` followed by `n` label
//! bytes. Either may be gzip-compressed (detected by content, not by name).
//! Files must be exactly as long as their header says.

use std::path::{Path, PathBuf};

use crate::dataset::{Dataset, Split};
use crate::error::DataError;
use crate::io::{decode_maybe_gz, read_maybe_gz};

/// The magic number of an idx3 unsigned-byte (images) file.
pub const IMAGES_MAGIC: u32 = 0x0000_0803;
/// The magic number of an idx1 unsigned-byte (labels) file.
pub const LABELS_MAGIC: u32 = 0x0000_0801;
/// MNIST and Fashion-MNIST both have ten classes.
pub const NUM_CLASSES: usize = 10;

const IMAGES_HEADER: usize = 16;
const LABELS_HEADER: usize = 8;

fn be_u32(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    if let Some(s) = bytes.get(at..at + 4) {
        b.copy_from_slice(s);
    }
    u32::from_be_bytes(b)
}

fn describe_magic(magic: u32) -> &'static str {
    match magic {
        IMAGES_MAGIC => " (an idx3 images file)",
        LABELS_MAGIC => " (an idx1 labels file)",
        _ => "",
    }
}

/// Validates the header and length of an idx file; returns the header's
/// dimensions (the count first).
fn check_header(
    path: &Path,
    data: &[u8],
    magic: u32,
    header_len: usize,
) -> Result<Vec<u64>, DataError> {
    let actual = data.len() as u64;
    let short = || DataError::Truncated {
        path: path.to_owned(),
        expected: header_len as u64,
        actual,
    };
    // The magic is checked as soon as it is there, so a wrong kind of file
    // is reported as such even when it is also short.
    if data.len() < 4 {
        return Err(short());
    }
    let found = be_u32(data, 0);
    if found != magic {
        return Err(DataError::format(
            path,
            format!(
                "bad magic number 0x{found:08x}{}, expected 0x{magic:08x}{}",
                describe_magic(found),
                describe_magic(magic)
            ),
        ));
    }
    if data.len() < header_len {
        return Err(short());
    }
    let dims: Vec<u64> = (4..header_len)
        .step_by(4)
        .map(|at| u64::from(be_u32(data, at)))
        .collect();
    if let Some(pos) = dims.iter().skip(1).position(|&d| d == 0) {
        return Err(DataError::format(
            path,
            format!("dimension {} is zero (header dimensions {dims:?})", pos + 1),
        ));
    }
    // At most three u32 factors plus a small header: fits in u128, and the
    // comparison below rejects anything no real file could hold.
    let body: u128 = dims.iter().map(|&d| u128::from(d)).product();
    let expected = body + header_len as u128;
    let expected = u64::try_from(expected).unwrap_or(u64::MAX);
    if actual < expected {
        return Err(DataError::Truncated {
            path: path.to_owned(),
            expected,
            actual,
        });
    }
    if actual > expected {
        return Err(DataError::format(
            path,
            format!(
                "{} trailing bytes: header {dims:?} implies {expected} bytes, file has {actual}",
                actual - expected
            ),
        ));
    }
    Ok(dims)
}

/// Reads an idx3 images file: returns `(pixels, count, rows, cols)`.
fn read_images(path: &Path) -> Result<(Vec<u8>, usize, usize, usize), DataError> {
    parse_images(path, read_maybe_gz(path)?)
}

/// Parses the contents of the idx3 images file `path`.
fn parse_images(
    path: &Path,
    mut data: Vec<u8>,
) -> Result<(Vec<u8>, usize, usize, usize), DataError> {
    let dims = check_header(path, &data, IMAGES_MAGIC, IMAGES_HEADER)?;
    data.drain(..IMAGES_HEADER);
    // The length check proved n·rows·cols bytes are in memory, so each fits.
    let [n, rows, cols] = [dims[0], dims[1], dims[2]].map(|d| d as usize);
    Ok((data, n, rows, cols))
}

/// Reads an idx1 labels file, checking every label is below [`NUM_CLASSES`].
fn read_labels(path: &Path) -> Result<Vec<u32>, DataError> {
    parse_labels(path, &read_maybe_gz(path)?)
}

/// Parses the contents of the idx1 labels file `path`.
fn parse_labels(path: &Path, data: &[u8]) -> Result<Vec<u32>, DataError> {
    check_header(path, data, LABELS_MAGIC, LABELS_HEADER)?;
    let labels = &data[LABELS_HEADER..];
    if let Some((i, &l)) = labels
        .iter()
        .enumerate()
        .find(|&(_, &l)| usize::from(l) >= NUM_CLASSES)
    {
        return Err(DataError::format(
            path,
            format!("label {l} of sample {i} is not below {NUM_CLASSES}"),
        ));
    }
    Ok(labels.iter().map(|&l| u32::from(l)).collect())
}

/// Loads an idx images/labels pair into a dataset of shape `[1, rows, cols]`
/// with pixels scaled by 1/255 and ten classes.
///
/// Errors name the offending file: unreadable ([`DataError::Io`]), bad
/// magic, zero dimensions, trailing bytes, labels ≥ 10 or image and label
/// counts that disagree ([`DataError::Format`]), or shorter than the header
/// says ([`DataError::Truncated`]).
pub fn load_idx(images_path: &Path, labels_path: &Path, name: &str) -> Result<Dataset, DataError> {
    let (pixels, n, rows, cols) = read_images(images_path)?;
    let labels = read_labels(labels_path)?;
    pair(
        images_path,
        (pixels, n, rows, cols),
        labels_path,
        labels,
        name,
    )
}

/// [`load_idx`] on file contents already in memory (decompressed at most to
/// `limit` bytes each); the paths only name the files in errors.
pub(crate) fn idx_from_bytes(
    images_path: &Path,
    images: Vec<u8>,
    labels_path: &Path,
    labels: Vec<u8>,
    limit: u64,
) -> Result<Dataset, DataError> {
    let images = parse_images(images_path, decode_maybe_gz(images_path, images, limit)?)?;
    let labels = parse_labels(labels_path, &decode_maybe_gz(labels_path, labels, limit)?)?;
    pair(images_path, images, labels_path, labels, "idx")
}

/// Checks that images and labels agree and makes the dataset.
fn pair(
    images_path: &Path,
    (pixels, n, rows, cols): (Vec<u8>, usize, usize, usize),
    labels_path: &Path,
    labels: Vec<u32>,
    name: &str,
) -> Result<Dataset, DataError> {
    if labels.len() != n {
        return Err(DataError::format(
            labels_path,
            format!(
                "holds {} labels but {} holds {n} images",
                labels.len(),
                images_path.display()
            ),
        ));
    }
    Dataset::from_u8(name, [1, rows, cols], NUM_CLASSES, pixels, 255, labels)
}

/// The file-name stem of a split: `train` or `t10k`.
fn prefix(split: Split) -> &'static str {
    match split {
        Split::Train => "train",
        Split::Test => "t10k",
    }
}

/// The accepted names of a split's images and labels files, in order of
/// preference: `{train,t10k}-{images-idx3,labels-idx1}-ubyte`, the
/// `…-images.idx3-ubyte` spelling some archives use, each plain or `.gz`.
pub fn candidate_names(split: Split) -> (Vec<String>, Vec<String>) {
    let p = prefix(split);
    let names = |kind: &str, idx: &str| {
        let mut v = Vec::new();
        for sep in ['-', '.'] {
            for ext in ["", ".gz"] {
                v.push(format!("{p}-{kind}{sep}{idx}-ubyte{ext}"));
            }
        }
        v
    };
    (names("images", "idx3"), names("labels", "idx1"))
}

/// Finds a split's images and labels files in `dir`, if both are there.
pub fn find_split(dir: &Path, split: Split) -> Option<(PathBuf, PathBuf)> {
    let (images, labels) = candidate_names(split);
    let first = |names: Vec<String>| names.into_iter().map(|n| dir.join(n)).find(|p| p.is_file());
    Some((first(images)?, first(labels)?))
}

/// Loads a split from a directory holding the standard idx file names
/// (`train-images-idx3-ubyte[.gz]`, `t10k-labels-idx1-ubyte[.gz]`, …; see
/// [`candidate_names`]). The dataset is named `"{name}/{split}"`.
///
/// A directory without the files is [`DataError::NotFound`].
pub fn load_split(dir: &Path, split: Split, name: &str) -> Result<Dataset, DataError> {
    let Some((images, labels)) = find_split(dir, split) else {
        let p = prefix(split);
        return Err(DataError::NotFound {
            dataset: name.to_owned(),
            searched: vec![dir.to_owned()],
            hint: format!(
                "expected {p}-images-idx3-ubyte[.gz] and {p}-labels-idx1-ubyte[.gz] there"
            ),
        });
    };
    load_idx(&images, &labels, &format!("{name}/{split}"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use flate2::Compression;
    use std::io::Write;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    pub(crate) fn images_bytes(n: u32, rows: u32, cols: u32, pixels: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        for x in [IMAGES_MAGIC, n, rows, cols] {
            v.extend_from_slice(&x.to_be_bytes());
        }
        v.extend_from_slice(pixels);
        v
    }

    pub(crate) fn labels_bytes(labels: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&LABELS_MAGIC.to_be_bytes());
        v.extend_from_slice(&(labels.len() as u32).to_be_bytes());
        v.extend_from_slice(labels);
        v
    }

    pub(crate) fn write(path: &Path, bytes: &[u8], gz: bool) -> std::io::Result<()> {
        if gz {
            let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
            enc.write_all(bytes)?;
            std::fs::write(path, enc.finish()?)
        } else {
            std::fs::write(path, bytes)
        }
    }

    /// Writes a 5-sample 2×3 split to `dir` under the standard names.
    fn write_split(
        dir: &Path,
        split: Split,
        gz: bool,
    ) -> Result<(Vec<u8>, Vec<u8>), std::io::Error> {
        let pixels: Vec<u8> = (0..30).map(|i| (i * 8) as u8).collect();
        let labels = vec![3, 0, 9, 1, 3];
        let ext = if gz { ".gz" } else { "" };
        let p = prefix(split);
        write(
            &dir.join(format!("{p}-images-idx3-ubyte{ext}")),
            &images_bytes(5, 2, 3, &pixels),
            gz,
        )?;
        write(
            &dir.join(format!("{p}-labels-idx1-ubyte{ext}")),
            &labels_bytes(&labels),
            gz,
        )?;
        Ok((pixels, labels))
    }

    #[test]
    fn round_trip_plain_and_gz() -> TestResult {
        for gz in [false, true] {
            let dir = tempfile::tempdir()?;
            let (pixels, labels) = write_split(dir.path(), Split::Test, gz)?;
            let d = load_split(dir.path(), Split::Test, "toy")?;
            assert_eq!(d.name, "toy/test");
            assert_eq!(d.len(), 5);
            assert_eq!(d.shape, [1, 2, 3]);
            assert_eq!(d.num_classes, 10);
            assert_eq!(
                d.labels(),
                labels.iter().map(|&l| u32::from(l)).collect::<Vec<_>>()
            );
            let (mut x, mut y) = (Vec::new(), Vec::new());
            d.gather(&[0, 1, 2, 3, 4], &mut x, &mut y)?;
            let expect: Vec<f32> = pixels.iter().map(|&p| f32::from(p) / 255.0).collect();
            assert_eq!(x, expect);
            // The train split is not there.
            assert!(matches!(
                load_split(dir.path(), Split::Train, "toy"),
                Err(DataError::NotFound { .. })
            ));
        }
        Ok(())
    }

    #[test]
    fn dotted_names_are_found() -> TestResult {
        let dir = tempfile::tempdir()?;
        write(
            &dir.path().join("train-images.idx3-ubyte"),
            &images_bytes(1, 1, 1, &[7]),
            false,
        )?;
        write(
            &dir.path().join("train-labels.idx1-ubyte.gz"),
            &labels_bytes(&[2]),
            true,
        )?;
        let d = load_split(dir.path(), Split::Train, "m")?;
        assert_eq!(d.labels(), &[2]);
        Ok(())
    }

    #[test]
    fn bad_magic_names_the_file() -> TestResult {
        let dir = tempfile::tempdir()?;
        let img = dir.path().join("i");
        let lab = dir.path().join("l");
        // A labels file where the images file should be.
        write(&img, &labels_bytes(&[1, 2]), false)?;
        write(&lab, &labels_bytes(&[1, 2]), false)?;
        match load_idx(&img, &lab, "x") {
            Err(DataError::Format { path, reason }) => {
                assert_eq!(path, img);
                assert!(reason.contains("0x00000801"), "{reason}");
                assert!(reason.contains("0x00000803"), "{reason}");
            }
            other => panic!("expected Format, got {other:?}"),
        }
        Ok(())
    }

    #[test]
    fn truncated_images_reports_expected_and_actual() -> TestResult {
        for gz in [false, true] {
            let dir = tempfile::tempdir()?;
            let img = dir.path().join("train-images-idx3-ubyte");
            let lab = dir.path().join("train-labels-idx1-ubyte");
            let mut bytes = images_bytes(4, 2, 2, &[0; 16]);
            bytes.truncate(16 + 13);
            write(&img, &bytes, gz)?;
            write(&lab, &labels_bytes(&[0, 1, 2, 3]), gz)?;
            match load_idx(&img, &lab, "x") {
                Err(DataError::Truncated {
                    path,
                    expected,
                    actual,
                }) => {
                    assert_eq!(path, img);
                    assert_eq!((expected, actual), (32, 29));
                }
                other => panic!("expected Truncated, got {other:?}"),
            }
            // Shorter than the header itself.
            write(&img, &bytes[..10], gz)?;
            assert!(matches!(
                load_idx(&img, &lab, "x"),
                Err(DataError::Truncated {
                    expected: 16,
                    actual: 10,
                    ..
                })
            ));
        }
        Ok(())
    }

    #[test]
    fn trailing_bytes_are_an_error() -> TestResult {
        let dir = tempfile::tempdir()?;
        let img = dir.path().join("i");
        let lab = dir.path().join("l");
        write(&img, &images_bytes(1, 1, 2, &[0, 0, 0]), false)?;
        write(&lab, &labels_bytes(&[0]), false)?;
        match load_idx(&img, &lab, "x") {
            Err(DataError::Format { path, reason }) => {
                assert_eq!(path, img);
                assert!(reason.contains("1 trailing"), "{reason}");
            }
            other => panic!("expected Format, got {other:?}"),
        }
        Ok(())
    }

    #[test]
    fn zero_dimension_is_an_error() -> TestResult {
        let dir = tempfile::tempdir()?;
        let img = dir.path().join("i");
        let lab = dir.path().join("l");
        write(&img, &images_bytes(1, 0, 2, &[]), false)?;
        write(&lab, &labels_bytes(&[0]), false)?;
        assert!(matches!(
            load_idx(&img, &lab, "x"),
            Err(DataError::Format { .. })
        ));
        Ok(())
    }

    #[test]
    fn count_mismatch_names_both_files() -> TestResult {
        let dir = tempfile::tempdir()?;
        let img = dir.path().join("imgs");
        let lab = dir.path().join("labs");
        write(&img, &images_bytes(3, 1, 1, &[1, 2, 3]), true)?;
        write(&lab, &labels_bytes(&[1, 2]), true)?;
        match load_idx(&img, &lab, "x") {
            Err(DataError::Format { path, reason }) => {
                assert_eq!(path, lab);
                assert!(reason.contains("2 labels"), "{reason}");
                assert!(reason.contains("3 images"), "{reason}");
                assert!(reason.contains("imgs"), "{reason}");
            }
            other => panic!("expected Format, got {other:?}"),
        }
        Ok(())
    }

    #[test]
    fn label_out_of_range_names_file_and_sample() -> TestResult {
        let dir = tempfile::tempdir()?;
        let img = dir.path().join("i");
        let lab = dir.path().join("l");
        write(&img, &images_bytes(3, 1, 1, &[1, 2, 3]), false)?;
        write(&lab, &labels_bytes(&[1, 10, 2]), false)?;
        match load_idx(&img, &lab, "x") {
            Err(DataError::Format { path, reason }) => {
                assert_eq!(path, lab);
                assert!(reason.contains("label 10 of sample 1"), "{reason}");
            }
            other => panic!("expected Format, got {other:?}"),
        }
        Ok(())
    }

    #[test]
    fn huge_header_is_truncated_not_an_allocation() -> TestResult {
        let dir = tempfile::tempdir()?;
        let img = dir.path().join("i");
        let lab = dir.path().join("l");
        write(
            &img,
            &images_bytes(u32::MAX, u32::MAX, u32::MAX, &[]),
            false,
        )?;
        write(&lab, &labels_bytes(&[]), false)?;
        assert!(matches!(
            load_idx(&img, &lab, "x"),
            Err(DataError::Truncated { actual: 16, .. })
        ));
        Ok(())
    }
}
