//! The in-memory dataset type shared by every loader.

use std::fmt;
use std::str::FromStr;

use crate::error::DataError;

/// Which half of a dataset to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// The training set.
    Train,
    /// The held-out test set.
    Test,
}

impl Split {
    /// The lowercase name: `"train"` or `"test"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Test => "test",
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Split {
    type Err = DataError;

    /// Parses `train` or `test` (case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "train" => Ok(Split::Train),
            "test" => Ok(Split::Test),
            _ => Err(DataError::invalid(
                "split",
                format!("unknown split `{s}`; expected `train` or `test`"),
            )),
        }
    }
}

/// Compact feature storage.
#[derive(Clone)]
enum Features {
    /// Quantized values (image pixels); value `v` means `lut[v]`.
    U8 {
        data: Vec<u8>,
        /// `lut[v] = v / max`, computed once so `gather` is a table lookup.
        lut: Box<[f32; 256]>,
        max: u8,
    },
    /// Plain floating-point features, returned as stored.
    F32(Vec<f32>),
}

/// An in-memory labelled dataset: `len()` samples of `shape` features each,
/// labels in `0..num_classes`.
///
/// Image sets are stored as one byte per value and normalized on the fly by
/// [`Dataset::gather`]; other sets are stored as `f32`.
#[derive(Clone)]
pub struct Dataset {
    /// A human-readable name, e.g. `"mnist/train"`.
    pub name: String,
    /// The shape of one sample as `[channels, height, width]`; tabular data
    /// is `[1, 1, features]`.
    pub shape: [usize; 3],
    /// The number of classes; every label is below it.
    pub num_classes: usize,
    features: Features,
    labels: Vec<u32>,
}

impl fmt::Debug for Dataset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let storage = match &self.features {
            Features::U8 { max, .. } => format!("u8/{max}"),
            Features::F32(_) => "f32".to_owned(),
        };
        f.debug_struct("Dataset")
            .field("name", &self.name)
            .field("len", &self.labels.len())
            .field("shape", &self.shape)
            .field("num_classes", &self.num_classes)
            .field("storage", &storage)
            .finish()
    }
}

fn checked_sample_len(shape: [usize; 3]) -> Result<usize, DataError> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            DataError::invalid(
                "shape",
                format!("{shape:?} must have non-zero dimensions whose product fits in usize"),
            )
        })
}

fn check_labels(labels: &[u32], num_classes: usize) -> Result<(), DataError> {
    if num_classes == 0 {
        return Err(DataError::invalid("num_classes", "must be at least 1"));
    }
    if let Some((i, &l)) = labels
        .iter()
        .enumerate()
        .find(|&(_, &l)| l as usize >= num_classes)
    {
        return Err(DataError::invalid(
            "labels",
            format!("label {l} of sample {i} is not below num_classes = {num_classes}"),
        ));
    }
    Ok(())
}

fn check_len(features: usize, sample_len: usize, labels: usize) -> Result<(), DataError> {
    if labels.checked_mul(sample_len) != Some(features) {
        return Err(DataError::invalid(
            "features",
            format!(
                "{features} values for {labels} labels of {sample_len} values each \
                 (expected {labels} × {sample_len})"
            ),
        ));
    }
    Ok(())
}

impl Dataset {
    /// A dataset of byte-quantized features (e.g. image pixels): value `v` is
    /// presented by [`gather`](Self::gather) as `v / max` (so `max = 255`
    /// maps pixels to `[0, 1]`).
    ///
    /// `data` holds `labels.len()` samples of `shape[0]·shape[1]·shape[2]`
    /// bytes each, sample-major. Errors if the lengths disagree, `shape` has
    /// a zero dimension, `max` is 0, or a label is not below `num_classes`.
    pub fn from_u8(
        name: impl Into<String>,
        shape: [usize; 3],
        num_classes: usize,
        data: Vec<u8>,
        max: u8,
        labels: Vec<u32>,
    ) -> Result<Dataset, DataError> {
        let sample_len = checked_sample_len(shape)?;
        check_len(data.len(), sample_len, labels.len())?;
        check_labels(&labels, num_classes)?;
        if max == 0 {
            return Err(DataError::invalid("max", "must be at least 1"));
        }
        let mut lut = Box::new([0f32; 256]);
        for (v, slot) in lut.iter_mut().enumerate() {
            *slot = v as f32 / f32::from(max);
        }
        Ok(Dataset {
            name: name.into(),
            shape,
            num_classes,
            features: Features::U8 { data, lut, max },
            labels,
        })
    }

    /// A dataset of `f32` features, presented by [`gather`](Self::gather)
    /// as stored.
    ///
    /// `data` holds `labels.len()` samples of `shape[0]·shape[1]·shape[2]`
    /// values each, sample-major. Errors if the lengths disagree, `shape`
    /// has a zero dimension, a value is not finite, or a label is not below
    /// `num_classes`.
    pub fn from_f32(
        name: impl Into<String>,
        shape: [usize; 3],
        num_classes: usize,
        data: Vec<f32>,
        labels: Vec<u32>,
    ) -> Result<Dataset, DataError> {
        let sample_len = checked_sample_len(shape)?;
        check_len(data.len(), sample_len, labels.len())?;
        check_labels(&labels, num_classes)?;
        if let Some(i) = data.iter().position(|v| !v.is_finite()) {
            return Err(DataError::invalid(
                "features",
                format!("value {} at position {i} is not finite", data[i]),
            ));
        }
        Ok(Dataset {
            name: name.into(),
            shape,
            num_classes,
            features: Features::F32(data),
            labels,
        })
    }

    /// The number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the dataset has no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The number of feature values in one sample (`C·H·W`).
    pub fn sample_len(&self) -> usize {
        self.shape[0] * self.shape[1] * self.shape[2]
    }

    /// The label of sample `i`.
    pub fn label(&self, i: usize) -> Result<u32, DataError> {
        self.labels
            .get(i)
            .copied()
            .ok_or(DataError::IndexOutOfRange {
                index: i,
                len: self.len(),
            })
    }

    /// All labels, in sample order.
    pub fn labels(&self) -> &[u32] {
        &self.labels
    }

    /// The number of samples of each class (`histogram[c]` for class `c`).
    pub fn class_histogram(&self) -> Vec<usize> {
        let mut h = vec![0usize; self.num_classes];
        for &l in &self.labels {
            // Labels are validated < num_classes at construction.
            if let Some(slot) = h.get_mut(l as usize) {
                *slot += 1;
            }
        }
        h
    }

    fn check_indices(&self, indices: &[usize]) -> Result<(), DataError> {
        let len = self.len();
        match indices.iter().find(|&&i| i >= len) {
            Some(&index) => Err(DataError::IndexOutOfRange { index, len }),
            None => Ok(()),
        }
    }

    /// Writes the features of `indices` (in that order) to `out_x` as
    /// normalized `f32` (byte-quantized sets scaled to `[0, 1]`),
    /// `sample_len()` values per sample, and their labels to `out_y`.
    ///
    /// Both buffers are cleared first and then filled, so reusing them across
    /// steps avoids allocation. Indices may repeat. An index out of range is
    /// an error, checked before anything is written.
    pub fn gather(
        &self,
        indices: &[usize],
        out_x: &mut Vec<f32>,
        out_y: &mut Vec<u32>,
    ) -> Result<(), DataError> {
        self.check_indices(indices)?;
        let n = self.sample_len();
        out_x.clear();
        out_y.clear();
        out_x.reserve(indices.len() * n);
        out_y.reserve(indices.len());
        match &self.features {
            Features::U8 { data, lut, .. } => {
                for &i in indices {
                    let row = &data[i * n..(i + 1) * n];
                    out_x.extend(row.iter().map(|&v| lut[usize::from(v)]));
                }
            }
            Features::F32(data) => {
                for &i in indices {
                    out_x.extend_from_slice(&data[i * n..(i + 1) * n]);
                }
            }
        }
        out_y.extend(indices.iter().map(|&i| self.labels[i]));
        Ok(())
    }

    /// A new dataset holding the samples at `indices` (in that order, repeats
    /// allowed), with the same name, shape, class count and storage.
    pub fn subset(&self, indices: &[usize]) -> Result<Dataset, DataError> {
        self.check_indices(indices)?;
        let n = self.sample_len();
        let labels = indices.iter().map(|&i| self.labels[i]).collect();
        let features = match &self.features {
            Features::U8 { data, lut, max } => {
                let mut out = Vec::with_capacity(indices.len() * n);
                for &i in indices {
                    out.extend_from_slice(&data[i * n..(i + 1) * n]);
                }
                Features::U8 {
                    data: out,
                    lut: lut.clone(),
                    max: *max,
                }
            }
            Features::F32(data) => {
                let mut out = Vec::with_capacity(indices.len() * n);
                for &i in indices {
                    out.extend_from_slice(&data[i * n..(i + 1) * n]);
                }
                Features::F32(out)
            }
        };
        Ok(Dataset {
            name: self.name.clone(),
            shape: self.shape,
            num_classes: self.num_classes,
            features,
            labels,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_u8() -> Dataset {
        // 3 samples of shape [1, 1, 2].
        Dataset::from_u8(
            "t",
            [1, 1, 2],
            3,
            vec![0, 255, 51, 102, 10, 20],
            255,
            vec![0, 1, 2],
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn gather_normalizes_and_orders() {
        let d = tiny_u8();
        let (mut x, mut y) = (vec![9.0; 100], vec![7; 100]);
        d.gather(&[2, 0, 2], &mut x, &mut y)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(y, vec![2, 0, 2]);
        let expect = [
            10.0 / 255.0,
            20.0 / 255.0,
            0.0,
            1.0,
            10.0 / 255.0,
            20.0 / 255.0,
        ];
        assert_eq!(x.len(), expect.len());
        for (a, b) in x.iter().zip(expect) {
            assert!((a - b).abs() < 1e-7, "{a} vs {b}");
        }
    }

    #[test]
    fn gather_out_of_range_is_error_and_writes_nothing() {
        let d = tiny_u8();
        let (mut x, mut y) = (vec![1.0], vec![1]);
        let e = d.gather(&[0, 3], &mut x, &mut y);
        assert!(
            matches!(e, Err(DataError::IndexOutOfRange { index: 3, len: 3 })),
            "{e:?}"
        );
        assert_eq!((x, y), (vec![1.0], vec![1]));
    }

    #[test]
    fn f32_gather_and_subset() {
        let d = Dataset::from_f32("f", [1, 1, 2], 2, vec![1.0, 2.0, 3.0, 4.0], vec![1, 0])
            .unwrap_or_else(|e| panic!("{e}"));
        let s = d.subset(&[1, 1, 0]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.len(), 3);
        assert_eq!(s.labels(), &[0, 0, 1]);
        let (mut x, mut y) = (Vec::new(), Vec::new());
        s.gather(&[0, 2], &mut x, &mut y)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(x, vec![3.0, 4.0, 1.0, 2.0]);
        assert_eq!(y, vec![0, 1]);
        assert!(d.subset(&[2]).is_err());
    }

    #[test]
    fn u8_subset_keeps_scale() {
        let s = tiny_u8().subset(&[0]).unwrap_or_else(|e| panic!("{e}"));
        let (mut x, mut y) = (Vec::new(), Vec::new());
        s.gather(&[0], &mut x, &mut y)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(x, vec![0.0, 1.0]);
    }

    #[test]
    fn constructors_validate() {
        assert!(Dataset::from_u8("x", [1, 1, 2], 2, vec![0; 3], 255, vec![0]).is_err());
        assert!(Dataset::from_u8("x", [1, 0, 2], 2, vec![], 255, vec![]).is_err());
        assert!(Dataset::from_u8("x", [1, 1, 1], 2, vec![0], 0, vec![0]).is_err());
        assert!(Dataset::from_u8("x", [1, 1, 1], 2, vec![0], 255, vec![2]).is_err());
        assert!(Dataset::from_u8("x", [1, 1, 1], 0, vec![], 255, vec![]).is_err());
        assert!(Dataset::from_f32("x", [1, 1, 1], 2, vec![f32::NAN], vec![0]).is_err());
        assert!(Dataset::from_f32("x", [usize::MAX, 2, 1], 2, vec![], vec![]).is_err());
        let d =
            Dataset::from_f32("x", [1, 1, 1], 2, vec![], vec![]).unwrap_or_else(|e| panic!("{e}"));
        assert!(d.is_empty());
    }

    #[test]
    fn label_and_histogram() {
        let d = tiny_u8();
        assert_eq!(d.label(1).ok(), Some(1));
        assert!(matches!(
            d.label(3),
            Err(DataError::IndexOutOfRange { index: 3, len: 3 })
        ));
        assert_eq!(d.class_histogram(), vec![1, 1, 1]);
        assert_eq!(d.sample_len(), 2);
    }

    #[test]
    fn split_parses() {
        assert_eq!("Train".parse::<Split>().ok(), Some(Split::Train));
        assert_eq!("test".parse::<Split>().ok(), Some(Split::Test));
        assert!("val".parse::<Split>().is_err());
        assert_eq!(Split::Test.to_string(), "test");
    }
}
