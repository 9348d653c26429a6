//! Datasets and samplers for kolo's data-parallel training.
//!
//! Plain Rust data, no tensor library: a [`Dataset`] holds samples in memory
//! (images as bytes, normalized on the fly) and [`Dataset::gather`] writes a
//! mini-batch's `f32` features and `u32` labels into reusable buffers, which
//! the training crate turns into tensors.
//!
//! * Loaders, one module per format: [`mnist`] (idx files of MNIST and
//!   Fashion-MNIST), [`cifar`] (CIFAR-10 binary), [`digits`] (scikit-learn's
//!   `digits.csv.gz`) and [`synthetic`] (seeded Gaussian blobs).
//! * [`load`] finds a [`DatasetKind`] by name in the usual places; run
//!   `scripts/fetch-data.sh` to install the real data.
//! * [`DistributedSampler`] splits the indices across ranks with
//!   `torch.utils.data.DistributedSampler`'s semantics (plus an exact,
//!   unpadded evaluation mode); [`DataPartitioner`] cuts a seeded shuffle
//!   into fixed fractions; [`batches`] cuts an index list into mini-batches.
//!
//! ```
//! use kolo_data::{batches, load, DatasetKind, DistributedSampler, Split};
//!
//! # fn main() -> Result<(), kolo_data::DataError> {
//! let train = load(DatasetKind::Synthetic, Split::Train, None)?;
//! let mut sampler = DistributedSampler::new(train.len(), 2, 0, true, 42, false)?;
//! sampler.set_epoch(0);
//! let (mut x, mut y) = (Vec::new(), Vec::new());
//! for batch in batches(&sampler.indices(), 64, false)? {
//!     train.gather(batch, &mut x, &mut y)?;
//!     assert_eq!(x.len(), batch.len() * train.sample_len());
//! }
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

pub mod batch;
pub mod cifar;
pub mod dataset;
pub mod digits;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
mod io;
pub mod mnist;
pub mod registry;
pub mod rng;
pub mod sampler;
pub mod synthetic;

pub use batch::{batches, num_batches, Batches};
pub use dataset::{Dataset, Split};
pub use error::DataError;
pub use registry::{load, search_dirs, DatasetKind, DATA_DIR_ENV};
pub use sampler::{DataPartitioner, DistributedSampler, SamplerBuilder};
pub use synthetic::SyntheticSpec;
