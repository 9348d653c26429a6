//! Recursive-doubling all-reduce (MPICH's algorithm for short messages).
//!
//! With p the largest power of two ≤ n and e = n − p, the first 2e ranks pair up: each even one sends
//! its buffer to the odd one above it and sits out. The remaining p ranks run ⌈log₂ p⌉ rounds; in round
//! k a rank exchanges its whole buffer with the rank whose index differs in bit k and reduces. Finally
//! each odd rank of the first 2e sends the result to the even rank it absorbed. Cost:
//! (log₂ p + 2) α + log₂ p · m β — the fewest rounds, so the choice for small buffers.
//!
//! Every partner pair combines the same two partial results (a ⊕ b on one side, b ⊕ a on the other),
//! which are equal for the commutative operators kolo has, so all ranks agree bit for bit.

use kolo_core::{Reducer, Result};

use crate::algorithms::pow2_floor;
use crate::Ctx;

/// All-reduces `buf` in place.
pub fn all_reduce(ctx: &Ctx, buf: &mut [u8], red: &Reducer) -> Result<()> {
    let n = ctx.size();
    let r = ctx.rank;
    let p = pow2_floor(n);
    let extra = n - p;
    // Fold the extra ranks in.
    let vrank = if r < 2 * extra {
        if r.is_multiple_of(2) {
            ctx.send(r + 1, buf)?;
            None
        } else {
            ctx.recv_reduce(r - 1, buf, red)?;
            Some(r / 2)
        }
    } else {
        Some(r - extra)
    };
    let real = |v: usize| if v < extra { 2 * v + 1 } else { v + extra };
    if let Some(v) = vrank {
        let mut mask = 1;
        while mask < p {
            let partner = real(v ^ mask);
            ctx.send(partner, buf)?;
            ctx.recv_reduce(partner, buf, red)?;
            mask <<= 1;
        }
        red.finish(buf, n);
    }
    // Hand results back to the folded ranks.
    if r < 2 * extra {
        if r % 2 == 1 {
            ctx.send(r - 1, buf)?;
        } else {
            ctx.recv_into(r + 1, buf)?;
        }
    }
    Ok(())
}
