//! Entry points for kolo's fuzz targets (the `kolo-fuzz` crate): the data set loaders' real
//! decoders (gzip, idx, CIFAR-10 records, digits CSV) run on untrusted file contents, and small
//! valid files for seeds. Not a stable API.
//!
//! Each entry point returns the number of samples it loaded, or `None` when the loader refused the
//! contents; it panics only on a broken invariant, which the fuzzer reports as a crash.

use std::io::Write;
use std::path::Path;

use flate2::write::GzEncoder;
use flate2::Compression;

use crate::dataset::Dataset;
use crate::io::decode_maybe_gz;
use crate::{cifar, digits, mnist};

/// Most bytes a fuzzed gzip input may decompress to (the loaders' own limit is far larger; a small
/// one keeps each run fast).
pub const LIMIT: u64 = 1 << 20;

fn gather_some(ds: &Dataset) -> usize {
    let n = ds.len().min(4);
    let indices: Vec<usize> = (0..n).collect();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    if let Err(e) = ds.gather(&indices, &mut x, &mut y) {
        panic!("a loaded dataset refused to gather its first {n} samples: {e}");
    }
    assert_eq!(x.len(), n * ds.sample_len(), "gathered features");
    assert_eq!(y.len(), n, "gathered labels");
    ds.len()
}

/// Gzip (or plain) file contents.
pub fn gzip(data: &[u8]) -> Option<usize> {
    let out = decode_maybe_gz(Path::new("fuzz.gz"), data.to_vec(), LIMIT).ok()?;
    assert!(out.len() as u64 <= LIMIT, "decompressed past the limit");
    Some(out.len())
}

/// An idx images file and an idx labels file: the first two bytes (little-endian) give the length
/// of the images file, the rest is the labels file. Each may be gzip-compressed.
pub fn idx(data: &[u8]) -> Option<usize> {
    let (len, rest) = data.split_first_chunk::<2>()?;
    let (images, labels) = rest.split_at(usize::from(u16::from_le_bytes(*len)).min(rest.len()));
    let ds = mnist::idx_from_bytes(
        Path::new("images-idx3-ubyte"),
        images.to_vec(),
        Path::new("labels-idx1-ubyte"),
        labels.to_vec(),
        LIMIT,
    )
    .ok()?;
    Some(gather_some(&ds))
}

/// A CIFAR-10 binary batch file (plain or gzip).
pub fn cifar(data: &[u8]) -> Option<usize> {
    let path = Path::new("data_batch_1.bin");
    let raw = decode_maybe_gz(path, data.to_vec(), LIMIT).ok()?;
    let (mut pixels, mut labels) = (Vec::new(), Vec::new());
    cifar::append_records(path, &raw, &mut pixels, &mut labels).ok()?;
    let ds = Dataset::from_u8(
        "cifar10",
        cifar::SHAPE,
        cifar::NUM_CLASSES,
        pixels,
        255,
        labels,
    )
    .ok()?;
    Some(gather_some(&ds))
}

/// A digits CSV file (plain or gzip).
pub fn csv(data: &[u8]) -> Option<usize> {
    let path = Path::new("digits.csv.gz");
    let raw = decode_maybe_gz(path, data.to_vec(), LIMIT).ok()?;
    let ds = digits::parse_csv(path, &raw).ok()?;
    Some(gather_some(&ds))
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
    // Writing into a Vec cannot fail.
    let _ = enc.write_all(bytes);
    enc.finish().unwrap_or_default()
}

/// Small valid files, by name: idx pairs, CIFAR-10 records and digits CSV, plain and gzip. The idx
/// seeds carry the two-byte length prefix [`idx`] expects.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let (n, rows, cols) = (2u32, 2u32, 3u32);
    let mut images = Vec::new();
    images.extend_from_slice(&mnist::IMAGES_MAGIC.to_be_bytes());
    for d in [n, rows, cols] {
        images.extend_from_slice(&d.to_be_bytes());
    }
    images.extend((0..n * rows * cols).map(|i| (i * 20) as u8));
    let mut labels = Vec::new();
    labels.extend_from_slice(&mnist::LABELS_MAGIC.to_be_bytes());
    labels.extend_from_slice(&n.to_be_bytes());
    labels.extend_from_slice(&[3, 9]);
    let pair = |images: &[u8], labels: &[u8]| {
        let mut out = (images.len() as u16).to_le_bytes().to_vec();
        out.extend_from_slice(images);
        out.extend_from_slice(labels);
        out
    };
    let mut records = Vec::new();
    for label in [0u8, 7] {
        records.push(label);
        records.extend((0..cifar::IMAGE_BYTES).map(|i| (i % 251) as u8));
    }
    let mut csv = String::new();
    for label in [1, 8] {
        let row: Vec<String> = (0..digits::PIXELS).map(|i| (i % 17).to_string()).collect();
        csv.push_str(&format!("{},{label}\n", row.join(",")));
    }
    csv.push_str(&format!(
        "{}.0,2.0\n",
        vec!["0"; digits::PIXELS].join(".0,")
    ));
    vec![
        ("idx", pair(&images, &labels)),
        ("idx-gz", pair(&gz(&images), &gz(&labels))),
        ("cifar", records.clone()),
        ("cifar-gz", gz(&records)),
        ("csv", csv.clone().into_bytes()),
        ("csv-gz", gz(csv.as_bytes())),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_accepted_and_bombs_refused() {
        let seeds: std::collections::HashMap<_, _> = seeds().into_iter().collect();
        assert_eq!(idx(&seeds["idx"]), Some(2));
        assert_eq!(idx(&seeds["idx-gz"]), Some(2));
        assert_eq!(cifar(&seeds["cifar"]), Some(2));
        assert_eq!(cifar(&seeds["cifar-gz"]), Some(2));
        assert_eq!(csv(&seeds["csv"]), Some(3));
        assert_eq!(csv(&seeds["csv-gz"]), Some(3));
        assert_eq!(gzip(&seeds["csv-gz"]), Some(seeds["csv"].len()));
        let bomb = gz(&vec![0u8; LIMIT as usize + 1]);
        assert_eq!(gzip(&bomb), None);
    }
}
