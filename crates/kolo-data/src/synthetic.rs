//! A deterministic, learnable synthetic classification set.
//!
//! `num_classes` Gaussian blobs: each class has a center drawn uniformly
//! from `[-1, 1]^d` (d = `C·H·W`), and each sample is its class's center plus
//! independent `N(0, noise²)` noise per feature. Labels cycle `0, 1, …,
//! num_classes - 1, 0, …`, so classes are balanced. The centers depend only
//! on the seed, so the train and test splits (drawn from different noise
//! streams) come from the same distribution.

use crate::dataset::{Dataset, Split};
use crate::error::DataError;
use crate::rng::SplitMix64;

/// What to generate. [`Default`] gives 10 classes of 32 features, 8192
/// training and 2048 test samples, noise 1.0, seed 0.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticSpec {
    /// The number of classes (blobs); at least 1.
    pub num_classes: usize,
    /// The shape of one sample; `[1, 1, d]` for plain vectors, or e.g.
    /// `[1, 8, 8]` for small images.
    pub shape: [usize; 3],
    /// Samples in the training split.
    pub train_samples: usize,
    /// Samples in the test split.
    pub test_samples: usize,
    /// Determines the centers and the noise.
    pub seed: u64,
    /// The standard deviation of the noise around each center (finite,
    /// ≥ 0); larger is harder.
    pub noise: f32,
}

impl Default for SyntheticSpec {
    fn default() -> Self {
        SyntheticSpec {
            num_classes: 10,
            shape: [1, 1, 32],
            train_samples: 8192,
            test_samples: 2048,
            seed: 0,
            noise: 1.0,
        }
    }
}

/// Distinct seeds for the centers and each split's noise, derived from the
/// spec's seed by fixed offsets (SplitMix64 decorrelates nearby seeds).
fn stream_seed(seed: u64, stream: u64) -> u64 {
    seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03)
}

/// Generates one split of the synthetic set, named `"synthetic/{split}"`.
///
/// The same spec and split always give the same dataset. Errors
/// ([`DataError::InvalidArgument`]) on zero classes, a zero dimension in
/// the shape, a negative or non-finite noise, or sizes that overflow.
pub fn generate(spec: &SyntheticSpec, split: Split) -> Result<Dataset, DataError> {
    if spec.num_classes == 0 || spec.num_classes > u32::MAX as usize {
        return Err(DataError::invalid(
            "num_classes",
            format!("{} is not in 1..=u32::MAX", spec.num_classes),
        ));
    }
    if !(spec.noise.is_finite() && spec.noise >= 0.0) {
        return Err(DataError::invalid(
            "noise",
            format!("{} must be finite and non-negative", spec.noise),
        ));
    }
    let dim = spec
        .shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&d| d > 0)
        .ok_or_else(|| {
            DataError::invalid(
                "shape",
                format!("{:?} has a zero or huge dimension", spec.shape),
            )
        })?;
    let n = match split {
        Split::Train => spec.train_samples,
        Split::Test => spec.test_samples,
    };
    let total = n
        .checked_mul(dim)
        .and_then(|t| spec.num_classes.checked_mul(dim).map(|_| t))
        .ok_or_else(|| {
            DataError::invalid("samples", format!("{n} samples of {dim} features overflow"))
        })?;

    let mut rng = SplitMix64::new(stream_seed(spec.seed, 1));
    let centers: Vec<f64> = (0..spec.num_classes * dim)
        .map(|_| 2.0 * rng.next_f64() - 1.0)
        .collect();

    let stream = match split {
        Split::Train => 2,
        Split::Test => 3,
    };
    let mut rng = SplitMix64::new(stream_seed(spec.seed, stream));
    let noise = f64::from(spec.noise);
    let mut data = Vec::with_capacity(total);
    let mut labels = Vec::with_capacity(n);
    for i in 0..n {
        let class = i % spec.num_classes;
        let center = &centers[class * dim..(class + 1) * dim];
        data.extend(
            center
                .iter()
                .map(|&c| (c + noise * rng.next_gaussian()) as f32),
        );
        // num_classes ≤ u32::MAX was checked above.
        labels.push(class as u32);
    }
    Dataset::from_f32(
        format!("synthetic/{split}"),
        spec.shape,
        spec.num_classes,
        data,
        labels,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn features(d: &Dataset) -> Result<Vec<f32>, DataError> {
        let (mut x, mut y) = (Vec::new(), Vec::new());
        let all: Vec<usize> = (0..d.len()).collect();
        d.gather(&all, &mut x, &mut y)?;
        Ok(x)
    }

    #[test]
    fn deterministic_and_seed_dependent() -> TestResult {
        let spec = SyntheticSpec {
            train_samples: 50,
            test_samples: 20,
            ..SyntheticSpec::default()
        };
        let a = generate(&spec, Split::Train)?;
        let b = generate(&spec, Split::Train)?;
        assert_eq!(features(&a)?, features(&b)?);
        assert_eq!(a.labels(), b.labels());
        let other = generate(
            &SyntheticSpec {
                seed: 1,
                ..spec.clone()
            },
            Split::Train,
        )?;
        assert_ne!(features(&a)?, features(&other)?);
        let test = generate(&spec, Split::Test)?;
        assert_eq!(test.len(), 20);
        assert_eq!(test.name, "synthetic/test");
        assert_eq!(a.class_histogram(), vec![5; 10]);
        Ok(())
    }

    #[test]
    fn learnable_by_nearest_centroid() -> TestResult {
        let spec = SyntheticSpec {
            train_samples: 2000,
            test_samples: 500,
            seed: 42,
            ..SyntheticSpec::default()
        };
        let train = generate(&spec, Split::Train)?;
        let test = generate(&spec, Split::Test)?;
        let d = train.sample_len();
        let (xtr, xte) = (features(&train)?, features(&test)?);
        let mut means = vec![0f64; spec.num_classes * d];
        let counts = train.class_histogram();
        for (i, &l) in train.labels().iter().enumerate() {
            for k in 0..d {
                means[l as usize * d + k] += f64::from(xtr[i * d + k]) / counts[l as usize] as f64;
            }
        }
        let mut correct = 0;
        for (i, &l) in test.labels().iter().enumerate() {
            let x = &xte[i * d..(i + 1) * d];
            let dist = |c: usize| -> f64 {
                (0..d)
                    .map(|k| (f64::from(x[k]) - means[c * d + k]).powi(2))
                    .sum()
            };
            let best = (0..spec.num_classes)
                .min_by(|&a, &b| dist(a).total_cmp(&dist(b)))
                .unwrap_or(0);
            correct += usize::from(best == l as usize);
        }
        let acc = correct as f64 / test.len() as f64;
        assert!(acc > 0.8, "nearest-centroid accuracy {acc}");
        assert!(acc < 1.0, "too easy: accuracy {acc}");
        Ok(())
    }

    #[test]
    fn image_shapes_and_validation() -> TestResult {
        let spec = SyntheticSpec {
            shape: [1, 8, 8],
            num_classes: 3,
            train_samples: 6,
            ..SyntheticSpec::default()
        };
        let d = generate(&spec, Split::Train)?;
        assert_eq!((d.shape, d.sample_len(), d.len()), ([1, 8, 8], 64, 6));
        for bad in [
            SyntheticSpec {
                num_classes: 0,
                ..spec.clone()
            },
            SyntheticSpec {
                noise: -1.0,
                ..spec.clone()
            },
            SyntheticSpec {
                noise: f32::NAN,
                ..spec.clone()
            },
            SyntheticSpec {
                shape: [0, 1, 1],
                ..spec.clone()
            },
            SyntheticSpec {
                train_samples: usize::MAX,
                ..spec.clone()
            },
        ] {
            assert!(
                matches!(
                    generate(&bad, Split::Train),
                    Err(DataError::InvalidArgument { .. })
                ),
                "{bad:?}"
            );
        }
        Ok(())
    }
}
