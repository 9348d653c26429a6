//! Raw-storage access shared by the kernels.

use candle_core::{Layout, Result};

/// The elements of a contiguous `layout` in `data`; an error naming `op` otherwise.
pub(crate) fn contiguous<'a, T>(data: &'a [T], layout: &Layout, op: &str) -> Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((a, b)) if b <= data.len() => Ok(&data[a..b]),
        _ => candle_core::bail!("{op}: expected a contiguous tensor, got {:?}", layout),
    }
}

/// `(a, b)` if they have the same length; an error naming `op` otherwise.
pub(crate) fn same_len<'a, T, U>(a: &'a [T], b: &'a [U], op: &str) -> Result<(&'a [T], &'a [U])> {
    if a.len() != b.len() {
        candle_core::bail!("{op}: operands of {} and {} elements", a.len(), b.len());
    }
    Ok((a, b))
}
