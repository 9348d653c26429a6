//! Binomial-tree broadcast (as in MPICH and gloo's `broadcast.cc`).
//!
//! Ranks are renumbered relative to the root: v = (r − root) mod n. A rank receives once, from v minus
//! its lowest set bit, then sends to v + 2ᵏ for every 2ᵏ below that bit (largest first), so the data
//! reaches all ranks in ⌈log₂ n⌉ rounds. Cost: ⌈log₂ n⌉ (α + m β). Large messages are segmented, so an
//! inner rank forwards segment i while segment i+1 is still arriving.

use kolo_core::Result;

use crate::Ctx;

/// Broadcasts `buf` (`elem`-byte elements) from `root` to every rank.
pub fn broadcast(ctx: &Ctx, buf: &mut [u8], elem: usize, root: usize) -> Result<()> {
    let n = ctx.size();
    let v = (ctx.rank + n - root) % n;
    let abs = |rel: usize| (rel + root) % n;
    let mut mask = 1;
    while mask < n {
        if v & mask != 0 {
            ctx.recv_segmented(abs(v - mask), buf, elem, None)?;
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while mask > 0 {
        if v + mask < n {
            ctx.send_segmented(abs(v + mask), buf, elem)?;
        }
        mask >>= 1;
    }
    Ok(())
}
