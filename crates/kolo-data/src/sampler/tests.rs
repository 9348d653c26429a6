use std::collections::HashSet;

use proptest::prelude::*;

use super::*;

type TestResult = Result<(), DataError>;

const LENS: [usize; 5] = [0, 1, 7, 10, 101];
const REPLICAS: [usize; 5] = [1, 2, 3, 4, 5];

/// Every rank's shard for one configuration and epoch.
fn shards(
    len: usize,
    r: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    epoch: u64,
) -> Result<Vec<Vec<usize>>, DataError> {
    (0..r)
        .map(|rank| {
            let mut s = DistributedSampler::new(len, r, rank, shuffle, seed, drop_last)?;
            s.set_epoch(epoch);
            assert_eq!(s.indices().len(), s.num_samples());
            Ok(s.indices())
        })
        .collect()
}

/// Interleaves shards back into the global order they were strided from.
fn interleave(shards: &[Vec<usize>]) -> Vec<usize> {
    let n = shards.first().map_or(0, Vec::len);
    (0..n)
        .flat_map(|i| shards.iter().map(move |s| s[i]))
        .collect()
}

fn check_even_invariants(len: usize, r: usize, seed: u64, epoch: u64) -> TestResult {
    for drop_last in [false, true] {
        let sh = shards(len, r, true, seed, drop_last, epoch)?;
        let want = if drop_last { len / r } else { len.div_ceil(r) };
        for s in &sh {
            assert_eq!(s.len(), want, "len {len} R {r} drop_last {drop_last}");
            assert!(s.iter().all(|&i| i < len));
        }
        // Same permutation on every rank: the interleaved shards are the
        // seeded permutation, padded from its front or truncated.
        let global = interleave(&sh);
        let perm = permutation(len, seed.wrapping_add(epoch));
        let expect: Vec<usize> = (0..want * r).map(|k| perm[k % len.max(1)]).collect();
        assert_eq!(global, expect, "len {len} R {r} drop_last {drop_last}");
        if drop_last {
            let set: HashSet<usize> = global.iter().copied().collect();
            assert_eq!(set.len(), global.len(), "drop_last shards overlap");
        } else {
            let set: HashSet<usize> = global.iter().copied().collect();
            assert_eq!(set.len(), len, "shards do not cover 0..{len}");
        }
    }
    Ok(())
}

fn check_eval_cover(len: usize, r: usize) -> TestResult {
    let mut all = Vec::new();
    let mut lens = Vec::new();
    for rank in 0..r {
        let s = DistributedSampler::eval(len, r, rank)?;
        let idx = s.indices();
        assert_eq!(idx.len(), s.num_samples());
        lens.push(idx.len());
        all.extend(idx);
    }
    let (min, max) = (lens.iter().min(), lens.iter().max());
    if let (Some(min), Some(max)) = (min, max) {
        assert!(max - min <= 1, "{lens:?}");
    }
    all.sort_unstable();
    assert_eq!(all, (0..len).collect::<Vec<_>>(), "len {len} R {r}");
    Ok(())
}

#[test]
fn grid_of_sizes_and_ranks() -> TestResult {
    for len in LENS {
        for r in REPLICAS {
            for epoch in [0, 1, 5] {
                check_even_invariants(len, r, 1234, epoch)?;
            }
            check_eval_cover(len, r)?;
        }
    }
    Ok(())
}

#[test]
fn small_n_wraps_around() -> TestResult {
    // N = 1, R = 4: every rank gets the single sample.
    assert_eq!(shards(1, 4, true, 0, false, 0)?, vec![vec![0]; 4]);
    // N = 2, R = 5 unshuffled: 0 1 0 1 0.
    let sh = shards(2, 5, false, 0, false, 0)?;
    assert_eq!(interleave(&sh), vec![0, 1, 0, 1, 0]);
    // drop_last with N < R leaves nothing.
    assert!(shards(3, 4, true, 0, true, 0)?.iter().all(Vec::is_empty));
    Ok(())
}

#[test]
fn unshuffled_matches_torch() -> TestResult {
    // torch: DistributedSampler(range(10), num_replicas=4, rank=r, shuffle=False)
    let sh = shards(10, 4, false, 0, false, 0)?;
    assert_eq!(
        sh,
        vec![vec![0, 4, 8], vec![1, 5, 9], vec![2, 6, 0], vec![3, 7, 1]]
    );
    let sh = shards(10, 4, false, 0, true, 0)?;
    assert_eq!(sh, vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]);
    Ok(())
}

#[test]
fn epochs_differ_and_resume_is_stable() -> TestResult {
    let e0 = shards(101, 3, true, 7, false, 0)?;
    let e1 = shards(101, 3, true, 7, false, 1)?;
    assert_ne!(e0, e1, "epochs gave the same order");
    // A fresh sampler (e.g. after a restart) at the same epoch agrees.
    let mut s = DistributedSampler::new(101, 3, 2, true, 7, false)?;
    s.set_epoch(1);
    assert_eq!(s.indices(), e1[2]);
    assert_eq!(s.epoch(), 1);
    // The shuffle does shuffle.
    assert_ne!(interleave(&e0)[..101], (0..101).collect::<Vec<_>>()[..]);
    // Different seeds give different orders.
    assert_ne!(e0, shards(101, 3, true, 8, false, 0)?);
    Ok(())
}

#[test]
fn invalid_ranks_are_rejected() {
    assert!(matches!(
        DistributedSampler::new(10, 0, 0, true, 0, false),
        Err(DataError::InvalidArgument { .. })
    ));
    assert!(matches!(
        DistributedSampler::new(10, 2, 2, true, 0, false),
        Err(DataError::InvalidArgument { .. })
    ));
    assert!(DistributedSampler::eval(10, 0, 0).is_err());
    assert!(DistributedSampler::eval(10, 3, 3).is_err());
}

#[test]
fn accessors() -> TestResult {
    let s = DistributedSampler::new(10, 4, 1, true, 3, false)?;
    assert_eq!(
        (s.dataset_len(), s.num_replicas(), s.rank(), s.is_even()),
        (10, 4, 1, true)
    );
    assert_eq!((s.num_samples(), s.total_size()), (3, 12));
    let e = DistributedSampler::eval(10, 4, 3)?;
    assert_eq!(
        (e.num_samples(), e.total_size(), e.is_even()),
        (2, 10, false)
    );
    assert_eq!(e.indices(), vec![3, 7]);
    Ok(())
}

proptest! {
    #[test]
    fn sampler_invariants(len in 0usize..300, r in 1usize..9, seed in any::<u64>(), epoch in 0u64..1000) {
        check_even_invariants(len, r, seed, epoch).map_err(|e| TestCaseError::fail(e.to_string()))?;
        check_eval_cover(len, r).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}

#[test]
fn partitioner_parts_are_disjoint_sized_and_seeded() -> TestResult {
    for len in [0, 1, 10, 101, 1000] {
        let fr = [0.7, 0.2, 0.1];
        let p = DataPartitioner::new(len, &fr, 5)?;
        assert_eq!(p.num_partitions(), 3);
        let mut seen = HashSet::new();
        for (i, &f) in fr.iter().enumerate() {
            let part = p.partition(i)?;
            assert_eq!(
                part.len(),
                (f * len as f64 + 1e-9).floor() as usize,
                "len {len} part {i}"
            );
            for &x in part {
                assert!(x < len);
                assert!(seen.insert(x), "{x} in two parts");
            }
        }
        assert_eq!(p, DataPartitioner::new(len, &fr, 5)?);
        if len >= 10 {
            assert_ne!(p, DataPartitioner::new(len, &fr, 6)?);
        }
    }
    // Fractions summing to 1 cover everything; products near an integer
    // round to it.
    let p = DataPartitioner::new(100, &[0.29, 0.71], 0)?;
    assert_eq!((p.partition(0)?.len(), p.partition(1)?.len()), (29, 71));
    assert!(matches!(
        p.partition(2),
        Err(DataError::IndexOutOfRange { index: 2, len: 2 })
    ));
    Ok(())
}

#[test]
fn partitioner_rejects_bad_fractions() {
    for bad in [
        &[][..],
        &[0.5, 0.6],
        &[0.5, 0.0],
        &[-0.1, 0.5],
        &[f64::NAN],
        &[f64::INFINITY],
    ] {
        assert!(
            matches!(
                DataPartitioner::new(10, bad, 0),
                Err(DataError::InvalidArgument { .. })
            ),
            "{bad:?}"
        );
    }
    assert!(DataPartitioner::new(10, &[0.1; 10], 0).is_ok());
}

#[test]
fn uneven_mode_covers_every_sample_once_shuffled_per_epoch() -> TestResult {
    for len in LENS {
        for r in REPLICAS {
            let mut seen = Vec::new();
            let mut lens = Vec::new();
            for rank in 0..r {
                let mut s = DistributedSampler::uneven(len, r, rank, true, 3)?;
                s.set_epoch(1);
                let idx = s.indices();
                assert_eq!(idx.len(), s.num_samples());
                lens.push(idx.len());
                seen.extend(idx);
            }
            seen.sort_unstable();
            assert_eq!(seen, (0..len).collect::<Vec<_>>(), "len {len}, {r} ranks");
            let (lo, hi) = (lens.iter().min(), lens.iter().max());
            assert!(hi.zip(lo).is_none_or(|(h, l)| h - l <= 1), "{lens:?}");
        }
    }
    // Shuffled, and differently in another epoch.
    let mut s = DistributedSampler::uneven(100, 2, 0, true, 3)?;
    let a = s.indices();
    s.set_epoch(1);
    assert_ne!(a, s.indices());
    assert_ne!(a, (0..100).step_by(2).collect::<Vec<_>>());
    assert!(DistributedSampler::uneven(10, 2, 2, true, 0).is_err());
    Ok(())
}

#[test]
fn the_builder_names_the_positional_options() {
    for (shuffle, seed, drop_last) in [(true, 0, false), (false, 3, true), (true, 9, true)] {
        let built = DistributedSampler::builder(103, 4, 2)
            .shuffle(shuffle)
            .seed(seed)
            .drop_last(drop_last)
            .build()
            .ok();
        assert_eq!(
            built,
            DistributedSampler::new(103, 4, 2, shuffle, seed, drop_last).ok()
        );
        let uneven = DistributedSampler::builder(103, 4, 2)
            .shuffle(shuffle)
            .seed(seed)
            .uneven()
            .build()
            .ok();
        assert_eq!(
            uneven,
            DistributedSampler::uneven(103, 4, 2, shuffle, seed).ok()
        );
    }
    // torch's defaults: shuffled, seed 0, padded.
    assert_eq!(
        DistributedSampler::builder(10, 3, 0).build().ok(),
        DistributedSampler::new(10, 3, 0, true, 0, false).ok()
    );
    assert!(DistributedSampler::builder(10, 3, 3).build().is_err());
}
