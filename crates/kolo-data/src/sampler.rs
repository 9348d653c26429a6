//! Splitting sample indices across ranks: [`DistributedSampler`] (torch's
//! `DistributedSampler` semantics) and [`DataPartitioner`].

use crate::error::DataError;
use crate::rng::{permutation, SplitMix64};

/// Chooses the sample indices one rank visits in an epoch.
///
/// In the default (*even*) mode, built with [`DistributedSampler::new`], it
/// follows `torch.utils.data.DistributedSampler`:
///
/// 1. every rank computes the same order of `0..len`: a permutation seeded
///    with `seed + epoch` ([`crate::rng::permutation`]) when shuffling, else
///    the identity;
/// 2. without `drop_last` the order is padded by repeating it from the front
///    (wrapping as often as needed when `len < num_replicas`) to
///    `⌈len / R⌉ · R` entries; with `drop_last` it is truncated to
///    `⌊len / R⌋ · R`;
/// 3. rank `r` takes entries `r, r + R, r + 2R, …`.
///
/// All shards therefore have the same length, which keeps collective steps in
/// lockstep; the price is a few duplicated samples (or, with `drop_last`, a
/// few skipped ones) per epoch.
///
/// The *eval* mode, built with [`DistributedSampler::eval`], neither
/// shuffles nor pads: rank `r` takes `r, r + R, …` of `0..len`, so the
/// shards are disjoint, cover the dataset exactly, and differ in length by
/// at most one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedSampler {
    len: usize,
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    even: bool,
    epoch: u64,
}

fn check_ranks(num_replicas: usize, rank: usize) -> Result<(), DataError> {
    if num_replicas == 0 {
        return Err(DataError::invalid("num_replicas", "must be at least 1"));
    }
    if rank >= num_replicas {
        return Err(DataError::invalid(
            "rank",
            format!("rank {rank} is not below num_replicas = {num_replicas}"),
        ));
    }
    Ok(())
}

/// Named options for a [`DistributedSampler`], with torch's defaults: shuffled, seed 0, padded
/// (not `drop_last`), even shards.
///
/// ```
/// use kolo_data::DistributedSampler;
/// let sampler = DistributedSampler::builder(60_000, 4, 1).seed(7).drop_last(true).build()?;
/// assert_eq!(sampler.indices().len(), 15_000);
/// # Ok::<(), kolo_data::DataError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a builder does nothing until build() is called"]
pub struct SamplerBuilder {
    len: usize,
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    uneven: bool,
}

impl SamplerBuilder {
    /// Whether the order is a permutation seeded with seed + epoch (default true).
    pub fn shuffle(self, shuffle: bool) -> Self {
        SamplerBuilder { shuffle, ..self }
    }

    /// The seed every rank shuffles with (default 0; the same on every rank).
    pub fn seed(self, seed: u64) -> Self {
        SamplerBuilder { seed, ..self }
    }

    /// Even shards by dropping the tail instead of repeating samples (default false).
    pub fn drop_last(self, drop_last: bool) -> Self {
        SamplerBuilder { drop_last, ..self }
    }

    /// Every sample exactly once, shards differing by at most one (for training with join; see
    /// [`DistributedSampler::uneven`]); `drop_last` is then ignored.
    pub fn uneven(self) -> Self {
        SamplerBuilder {
            uneven: true,
            ..self
        }
    }

    /// The sampler; errors if `num_replicas` is 0 or `rank >= num_replicas`.
    pub fn build(self) -> Result<DistributedSampler, DataError> {
        let b = self;
        if b.uneven {
            DistributedSampler::uneven(b.len, b.num_replicas, b.rank, b.shuffle, b.seed)
        } else {
            DistributedSampler::new(
                b.len,
                b.num_replicas,
                b.rank,
                b.shuffle,
                b.seed,
                b.drop_last,
            )
        }
    }
}

impl DistributedSampler {
    /// A builder for rank `rank` of `num_replicas` over a dataset of `len` samples, with named
    /// options ([`SamplerBuilder`]).
    pub fn builder(len: usize, num_replicas: usize, rank: usize) -> SamplerBuilder {
        SamplerBuilder {
            len,
            num_replicas,
            rank,
            shuffle: true,
            seed: 0,
            drop_last: false,
            uneven: false,
        }
    }

    /// An even-mode sampler (see the type's docs) for a dataset of `len`
    /// samples. Errors if `num_replicas` is 0 or `rank >= num_replicas`.
    pub fn new(
        len: usize,
        num_replicas: usize,
        rank: usize,
        shuffle: bool,
        seed: u64,
        drop_last: bool,
    ) -> Result<Self, DataError> {
        check_ranks(num_replicas, rank)?;
        Ok(DistributedSampler {
            len,
            num_replicas,
            rank,
            shuffle,
            seed,
            drop_last,
            even: true,
            epoch: 0,
        })
    }

    /// An eval-mode sampler: no shuffling, no padding, no duplicates; the
    /// ranks' shards are a disjoint exact cover of `0..len`. Errors if
    /// `num_replicas` is 0 or `rank >= num_replicas`.
    pub fn eval(len: usize, num_replicas: usize, rank: usize) -> Result<Self, DataError> {
        check_ranks(num_replicas, rank)?;
        Ok(DistributedSampler {
            len,
            num_replicas,
            rank,
            shuffle: false,
            seed: 0,
            drop_last: false,
            even: false,
            epoch: 0,
        })
    }

    /// An uneven-mode sampler for training with join (`Ddp::set_join`): every
    /// sample exactly once per epoch, shuffled as the even mode (seed + epoch),
    /// no padding and no duplicates, so the shards differ in length by at most
    /// one and ranks may take different numbers of batches. Errors if
    /// `num_replicas` is 0 or `rank >= num_replicas`.
    pub fn uneven(
        len: usize,
        num_replicas: usize,
        rank: usize,
        shuffle: bool,
        seed: u64,
    ) -> Result<Self, DataError> {
        Ok(DistributedSampler {
            shuffle,
            seed,
            ..DistributedSampler::eval(len, num_replicas, rank)?
        })
    }

    /// Sets the epoch, which (with the seed) determines the shuffle. Call it
    /// with the same value on every rank before each epoch, as in torch.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The dataset length this sampler splits.
    pub fn dataset_len(&self) -> usize {
        self.len
    }

    /// The number of ranks.
    pub fn num_replicas(&self) -> usize {
        self.num_replicas
    }

    /// This sampler's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Whether this is an even-mode sampler (equal-length, possibly padded
    /// shards) rather than an eval-mode one.
    pub fn is_even(&self) -> bool {
        self.even
    }

    /// The number of indices this rank gets per epoch: `⌈len / R⌉` (or
    /// `⌊len / R⌋` with `drop_last`) in even mode; in eval mode this rank's
    /// exact share, `⌈(len - rank) / R⌉`.
    pub fn num_samples(&self) -> usize {
        let r = self.num_replicas;
        if !self.even {
            return self.len.saturating_sub(self.rank).div_ceil(r);
        }
        if self.drop_last {
            self.len / r
        } else {
            self.len.div_ceil(r)
        }
    }

    /// The number of indices all ranks get together per epoch.
    pub fn total_size(&self) -> usize {
        if self.even {
            self.num_samples() * self.num_replicas
        } else {
            self.len
        }
    }

    /// This rank's indices for the current epoch, in visiting order.
    pub fn indices(&self) -> Vec<usize> {
        let (r, rank) = (self.num_replicas, self.rank);
        if !self.even {
            if !self.shuffle {
                return (rank..self.len).step_by(r).collect();
            }
            let order = permutation(self.len, self.seed.wrapping_add(self.epoch));
            return (rank..self.len).step_by(r).map(|k| order[k]).collect();
        }
        let order = if self.shuffle {
            permutation(self.len, self.seed.wrapping_add(self.epoch))
        } else {
            (0..self.len).collect()
        };
        // Entry k of the padded (or truncated) order is order[k % len], and
        // this rank takes k = rank, rank + R, …, below total_size.
        (rank..self.total_size())
            .step_by(r)
            .map(|k| order[k % self.len])
            .collect()
    }
}

/// Cuts a seeded shuffle of `0..len` into consecutive parts of given
/// fractions — the classic "partition the dataset by rank" helper.
///
/// Part `i` has `⌊fractions[i] · len⌋` indices (a product within 1e-9 of an
/// integer counts as that integer, so `0.29 · 100` gives 29); whatever the
/// fractions leave over belongs to no part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataPartitioner {
    parts: Vec<Vec<usize>>,
}

fn part_size(fraction: f64, len: usize) -> usize {
    let x = fraction * len as f64;
    let r = x.round();
    let size = if (x - r).abs() <= 1e-9 * r.max(1.0) {
        r
    } else {
        x.floor()
    };
    // `size` is in [0, len·(1 + 1e-9)]; the float-to-int cast saturates.
    size as usize
}

impl DataPartitioner {
    /// Shuffles `0..len` once with `seed` and cuts it into parts.
    ///
    /// Errors unless `fractions` is non-empty, every fraction is finite and
    /// positive, and they sum to at most `1 + 1e-9`.
    pub fn new(len: usize, fractions: &[f64], seed: u64) -> Result<Self, DataError> {
        if fractions.is_empty() {
            return Err(DataError::invalid(
                "fractions",
                "need at least one fraction",
            ));
        }
        if let Some((i, f)) = fractions
            .iter()
            .enumerate()
            .find(|(_, f)| !(f.is_finite() && **f > 0.0))
        {
            return Err(DataError::invalid(
                "fractions",
                format!("fraction {i} is {f}; each must be finite and positive"),
            ));
        }
        let sum: f64 = fractions.iter().sum();
        if sum > 1.0 + 1e-9 {
            return Err(DataError::invalid(
                "fractions",
                format!("fractions {fractions:?} sum to {sum}, more than 1"),
            ));
        }
        let mut order: Vec<usize> = (0..len).collect();
        SplitMix64::new(seed).shuffle(&mut order);
        let mut parts = Vec::with_capacity(fractions.len());
        let mut start = 0;
        for &f in fractions {
            let end = start + part_size(f, len).min(len - start);
            parts.push(order[start..end].to_vec());
            start = end;
        }
        Ok(DataPartitioner { parts })
    }

    /// The number of parts.
    pub fn num_partitions(&self) -> usize {
        self.parts.len()
    }

    /// The indices of part `i`.
    pub fn partition(&self, i: usize) -> Result<&[usize], DataError> {
        self.parts
            .get(i)
            .map(Vec::as_slice)
            .ok_or(DataError::IndexOutOfRange {
                index: i,
                len: self.parts.len(),
            })
    }
}

#[cfg(test)]
mod tests;
