//! Halving-doubling all-reduce (Rabenseifner; gloo's `allreduce_halving_doubling`).
//!
//! Extra ranks beyond the largest power of two p are folded in as in recursive doubling. Then a
//! reduce-scatter by recursive halving: in round k (distance p/2, p/4, …, 1) each rank splits its current
//! range in two, sends the half its partner keeps and reduces the half it keeps with the partner's copy.
//! After log₂ p rounds each rank owns 1/p of the buffer fully reduced. An all-gather by recursive
//! doubling retraces the rounds in reverse, exchanging owned ranges until every rank has everything.
//! Cost: 2 log₂ p α + 2 (p−1)/p m β — ring-like bandwidth with logarithmic latency, for medium buffers.

use std::ops::Range;

use kolo_core::{Reducer, Result};

use crate::algorithms::pow2_floor;
use crate::Ctx;

/// All-reduces `buf` (`elem`-byte elements) in place.
pub fn all_reduce(ctx: &Ctx, buf: &mut [u8], elem: usize, red: &Reducer) -> Result<()> {
    let n = ctx.size();
    let r = ctx.rank;
    let p = pow2_floor(n);
    let extra = n - p;
    let vrank = if r < 2 * extra {
        if r.is_multiple_of(2) {
            ctx.send_segmented(r + 1, buf, elem)?;
            None
        } else {
            ctx.recv_segmented(r - 1, buf, elem, Some(red))?;
            Some(r / 2)
        }
    } else {
        Some(r - extra)
    };
    let real = |v: usize| if v < extra { 2 * v + 1 } else { v + extra };
    if let Some(v) = vrank {
        let count = buf.len() / elem;
        // Element ranges kept after each halving round, outermost first.
        let mut kept: Vec<(Range<usize>, Range<usize>, usize)> = Vec::new();
        let mut range = 0..count;
        let mut dist = p / 2;
        while dist >= 1 {
            let partner = real(v ^ dist);
            let mid = range.start + (range.end - range.start) / 2;
            let (keep, give) = if v & dist == 0 {
                (range.start..mid, mid..range.end)
            } else {
                (mid..range.end, range.start..mid)
            };
            let bytes = |x: &Range<usize>| x.start * elem..x.end * elem;
            ctx.send_segmented(partner, &buf[bytes(&give)], elem)?;
            ctx.recv_segmented(partner, &mut buf[bytes(&keep)], elem, Some(red))?;
            kept.push((keep.clone(), give, partner));
            range = keep;
            dist /= 2;
        }
        red.finish(&mut buf[range.start * elem..range.end * elem], n);
        // Recursive doubling all-gather: undo the halvings, innermost first.
        for (keep, give, partner) in kept.into_iter().rev() {
            ctx.send_segmented(partner, &buf[keep.start * elem..keep.end * elem], elem)?;
            ctx.recv_segmented(
                partner,
                &mut buf[give.start * elem..give.end * elem],
                elem,
                None,
            )?;
        }
    }
    if r < 2 * extra {
        if r % 2 == 1 {
            ctx.send_segmented(r - 1, buf, elem)?;
        } else {
            ctx.recv_segmented(r + 1, buf, elem, None)?;
        }
    }
    Ok(())
}
