//! Tree all-reduce: binomial reduce to rank 0, then binomial broadcast from it.
//!
//! Cost: 2 ⌈log₂ n⌉ (α + m β). Simple and latency-friendly for small worlds; the ring and
//! halving-doubling algorithms move less data for large buffers.

use kolo_core::{Reducer, Result};

use crate::algorithms::{broadcast_binomial, reduce_binomial};
use crate::Ctx;

/// All-reduces `buf` in place.
pub fn all_reduce(ctx: &Ctx, buf: &mut [u8], elem: usize, red: &Reducer) -> Result<()> {
    reduce_binomial::reduce(ctx, buf, elem, red, 0)?;
    broadcast_binomial::broadcast(ctx, buf, elem, 0)
}
