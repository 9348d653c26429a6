//! Binomial-tree reduce (as in MPICH), for commutative operators.
//!
//! With v = (r − root) mod n, in round k a rank whose bit k is set sends its partial result to
//! v − 2ᵏ and stops; otherwise it receives from v + 2ᵏ (if that rank exists) and reduces. The root ends
//! with every contribution after ⌈log₂ n⌉ rounds. Cost: ⌈log₂ n⌉ (α + m β + m γ). Non-root buffers are
//! left unchanged (partial results live in a scratch copy).

use kolo_core::{Reducer, Result};

use crate::Ctx;

/// Reduces `buf` of every rank into `buf` of `root` (including the final `Avg` division).
pub fn reduce(ctx: &Ctx, buf: &mut [u8], elem: usize, red: &Reducer, root: usize) -> Result<()> {
    let n = ctx.size();
    let v = (ctx.rank + n - root) % n;
    let abs = |rel: usize| (rel + root) % n;
    let mut scratch;
    let acc: &mut [u8] = if v == 0 {
        buf
    } else {
        scratch = buf.to_vec();
        &mut scratch
    };
    let mut mask = 1;
    while mask < n {
        if v & mask == 0 {
            if v + mask < n {
                ctx.recv_segmented(abs(v + mask), acc, elem, Some(red))?;
            }
        } else {
            ctx.send_segmented(abs(v - mask), acc, elem)?;
            return Ok(());
        }
        mask <<= 1;
    }
    red.finish(acc, n);
    Ok(())
}
