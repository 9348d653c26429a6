//! Adasum all-reduce by vector halving, distance doubling (Horovod's `AdasumMPI`), for large buffers.
//!
//! The same binary tree as `allreduce_adasum` (level 1 combines ranks (0,1), (2,3), …; level 2 the
//! results of {0,1} and {2,3}; …), with each level's vectors spread over the ranks that hold them.
//! In round j (distance 2^j) a rank and its partner r XOR 2^j hold the same slice of the two vectors
//! being combined; each keeps half of the slice, sends the other half, and so holds both vectors' parts
//! of its half. Each layer's dot product and norms are then the sum of partial sums over the 2^(j+1)
//! ranks of the group, all-reduced among them by recursive doubling (three f64 per layer); every rank
//! combines its half. After log₂ p rounds each rank owns 1/p of the result, and a recursive-doubling
//! all-gather retraces the rounds. Cost: about 2 m β of data per rank (instead of log₂ p · m) plus
//! O(log² p) small messages of 24 bytes per layer.
//!
//! The partial sums are added pairwise, each addition computed alike on both sides (IEEE addition is
//! commutative), so every rank of a group gets the same coefficients bit for bit, and each element
//! of the result is computed by exactly one rank: all ranks end with the same bits. The sums are
//! added in a different order than `allreduce_adasum`'s, so the two algorithms can differ in the last
//! bits. The group size must be a power of two.

use std::ops::Range;

use kolo_core::dtype::{as_bytes, as_bytes_mut, vec_from_bytes};
use kolo_core::Result;

use crate::algorithms::allreduce_adasum::{apply, partial_sums, AdasumFloat};
use crate::Ctx;

/// Adds `sums` element-wise over the `group` ranks whose index differs from this rank's only in the
/// bits below `group` (a power of two), by recursive doubling; every one of them ends with the same
/// bits.
fn group_sum(ctx: &Ctx, sums: &mut [f64], group: usize) -> Result<()> {
    let bytes = std::mem::size_of_val(sums);
    let mut mask = 1;
    while mask < group {
        let partner = ctx.rank ^ mask;
        ctx.send(partner, as_bytes(sums))?;
        let theirs: Vec<f64> = vec_from_bytes(&ctx.recv(partner, bytes)?);
        for (s, t) in sums.iter_mut().zip(theirs) {
            *s += t;
        }
        mask <<= 1;
    }
    Ok(())
}

/// Adasum-reduces `buf` in place over the group; `layers` are the segment lengths (summing to
/// `buf.len()`) and the group size is a power of two.
pub fn all_reduce<T: AdasumFloat>(ctx: &Ctx, buf: &mut [T], layers: &[usize]) -> Result<()> {
    let n = ctx.size();
    let r = ctx.rank;
    let elem = std::mem::size_of::<T>();
    let mut range = 0..buf.len();
    // (kept, given, partner) of each round, for the all-gather.
    let mut rounds: Vec<(Range<usize>, Range<usize>, usize)> = Vec::new();
    let mut mask = 1;
    while mask < n {
        let partner = r ^ mask;
        let mid = range.start + range.len() / 2;
        let lower = r & mask == 0;
        let (keep, give) = if lower {
            (range.start..mid, mid..range.end)
        } else {
            (mid..range.end, range.start..mid)
        };
        ctx.send(partner, as_bytes(&buf[give.clone()]))?;
        let theirs: Vec<T> = vec_from_bytes(&ctx.recv(partner, keep.len() * elem)?);
        let mine = buf[keep.clone()].to_vec();
        // The lower group's vector is `a` on both sides.
        let (a, b) = if lower {
            (&mine[..], &theirs[..])
        } else {
            (&theirs[..], &mine[..])
        };
        let mut sums = partial_sums(a, b, keep.start, layers);
        group_sum(ctx, &mut sums, 2 * mask)?;
        apply(a, b, keep.start, layers, &sums, &mut buf[keep.clone()]);
        rounds.push((keep.clone(), give, partner));
        range = keep;
        mask <<= 1;
    }
    for (keep, give, partner) in rounds.into_iter().rev() {
        ctx.send(partner, as_bytes(&buf[keep]))?;
        ctx.recv_into(partner, as_bytes_mut(&mut buf[give]))?;
    }
    Ok(())
}
