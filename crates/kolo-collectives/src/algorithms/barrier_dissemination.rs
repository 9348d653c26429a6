//! Dissemination barrier (Hensgen, Finkel, Manber).
//!
//! In round k (k = 0, 1, …, ⌈log₂ n⌉−1) rank r sends an empty message to r + 2ᵏ and waits for one from
//! r − 2ᵏ (mod n). After the last round every rank has heard, directly or through others, from every
//! rank, so no rank leaves before all have entered. Cost: ⌈log₂ n⌉ α, no data.

use kolo_core::Result;

use crate::Ctx;

/// Runs the barrier.
pub fn barrier(ctx: &Ctx) -> Result<()> {
    let n = ctx.size();
    let r = ctx.rank;
    let mut dist = 1;
    while dist < n {
        ctx.send((r + dist) % n, &[])?;
        ctx.recv((r + n - dist) % n, 0)?;
        dist *= 2;
    }
    Ok(())
}
