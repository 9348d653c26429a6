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

/// `dst.copy_from_slice(src)`, with fixed-size copies for rows of up to 8 elements: a copy of a
/// run-time length is a `memcpy` call, whose overhead dominates the short rows of small images
/// (ResNet's 4×4 and 7×7 stages).
#[inline(always)]
pub(crate) fn copy_row<T: Copy>(dst: &mut [T], src: &[T]) {
    macro_rules! fixed {
        ($($n:literal)*) => {
            match dst.len() {
                $($n => dst[..$n].copy_from_slice(&src[..$n]),)*
                _ => dst.copy_from_slice(src),
            }
        };
    }
    fixed!(1 2 3 4 5 6 7 8);
}

#[cfg(test)]
mod tests {
    #[test]
    fn copy_row_copies_every_length() {
        for len in 0..20 {
            let src: Vec<u32> = (0..len as u32).map(|v| v * 7 + 1).collect();
            let mut dst = vec![0u32; len + 3];
            super::copy_row(&mut dst[1..1 + len], &src);
            assert_eq!(&dst[1..1 + len], &src[..], "length {len}");
            assert_eq!(
                (dst[0], dst[len + 1], dst[len + 2]),
                (0, 0, 0),
                "length {len}"
            );
        }
    }
}
