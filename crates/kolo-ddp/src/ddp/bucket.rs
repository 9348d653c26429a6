//! Gradient buckets: parameters grouped into contiguous buffers of about `bucket_bytes`, filled in
//! reverse parameter order (roughly the order backward produces gradients), each all-reduced as one
//! message.

use std::ops::Range;

/// Where each parameter's gradient lives in the bucket buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketLayout {
    /// Parameter indices of each bucket, in filling order.
    pub buckets: Vec<Vec<usize>>,
    /// For each parameter: its bucket and its element range inside the bucket buffer.
    pub slot: Vec<(usize, Range<usize>)>,
    /// Elements in each bucket.
    pub len: Vec<usize>,
}

impl BucketLayout {
    /// Lays out parameters of `numels` elements (of `elem_bytes` each) into buckets of at most
    /// `bucket_bytes` (a parameter larger than that gets a bucket of its own), last parameter first.
    pub fn new(numels: &[usize], elem_bytes: usize, bucket_bytes: usize) -> Self {
        let reverse: Vec<usize> = (0..numels.len()).rev().collect();
        Self::in_order(&reverse, numels, elem_bytes, bucket_bytes, bucket_bytes)
    }

    /// Lays out the parameters in `order` (every index of `numels` once; the order gradients are
    /// expected in) into buckets: the first of at most `first_bytes`, the others of at most
    /// `bucket_bytes` (a parameter larger than its cap gets a bucket of its own). PyTorch's DDP
    /// keeps the first bucket small (1 MiB) so that communication starts early in backward.
    pub fn in_order(
        order: &[usize],
        numels: &[usize],
        elem_bytes: usize,
        first_bytes: usize,
        bucket_bytes: usize,
    ) -> Self {
        let elems = |bytes: usize| (bytes / elem_bytes.max(1)).max(1);
        // The cap of bucket `b`, in elements.
        let cap = |b: usize| match b {
            0 => elems(first_bytes.min(bucket_bytes)),
            _ => elems(bucket_bytes),
        };
        let mut buckets: Vec<Vec<usize>> = Vec::new();
        let mut len: Vec<usize> = Vec::new();
        let mut slot = vec![(0, 0..0); numels.len()];
        for &p in order {
            let n = numels[p];
            let current = len.len().saturating_sub(1);
            let fits = len.last().is_some_and(|&l| l > 0 && l + n <= cap(current));
            if !fits {
                buckets.push(Vec::new());
                len.push(0);
            }
            let b = buckets.len() - 1;
            slot[p] = (b, len[b]..len[b] + n);
            len[b] += n;
            buckets[b].push(p);
        }
        BucketLayout { buckets, slot, len }
    }

    /// The order the parameters are laid out in (bucket by bucket).
    pub fn order(&self) -> Vec<usize> {
        self.buckets.iter().flatten().copied().collect()
    }

    /// Number of buckets.
    pub fn count(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reverse_order_and_caps() {
        // 4-byte elements, 40-byte buckets = 10 elements.
        let l = BucketLayout::new(&[4, 4, 30, 3, 3], 4, 40);
        assert_eq!(l.buckets, vec![vec![4, 3], vec![2], vec![1, 0]]);
        assert_eq!(l.len, vec![6, 30, 8]);
        assert_eq!(l.slot[3], (0, 3..6));
        assert_eq!(l.slot[0], (2, 4..8));
        // A small first bucket, then full ones, in the order given.
        let l = BucketLayout::in_order(&[1, 3, 0, 4, 2], &[4, 4, 30, 3, 3], 4, 20, 40);
        assert_eq!(l.buckets, vec![vec![1], vec![3, 0, 4], vec![2]]);
        assert_eq!(l.len, vec![4, 10, 30]);
        assert_eq!(l.order(), vec![1, 3, 0, 4, 2]);
        assert_eq!(l.slot[0], (1, 3..7));
        let one = BucketLayout::new(&[5, 5], 4, 1 << 20);
        assert_eq!(one.count(), 1);
        assert_eq!(BucketLayout::new(&[], 4, 10).count(), 0);
    }
}
