//! Row copies and additions shared by the kernels.

/// The first and the last `N` elements of a row of `N < len ≤ 2N`, as two fixed-size copies
/// that overlap in the middle (see [`copy_row`]).
#[inline(always)]
fn ends<T: Copy, const N: usize>(dst: &mut [T], src: &[T]) {
    let len = dst.len();
    dst[..N].copy_from_slice(&src[..N]);
    dst[len - N..].copy_from_slice(&src[len - N..len]);
}

/// `dst.copy_from_slice(src)` without a `memcpy` call for rows of up to 64 elements: a copy of
/// a run-time length is a call, whose overhead dominates the short rows of small images (LeNet's
/// 10- and 28-pixel rows, ResNet's 4×4 and 7×7 stages). Rows of up to 8 elements are one
/// fixed-size copy; longer ones two fixed-size copies of the row's first and last `N` elements
/// (`N` the power of two with `N < len ≤ 2N`), which overlap in the middle — moves of vector
/// registers, inlined. `dst` and `src` must have the same length.
#[inline(always)]
pub(crate) fn copy_row<T: Copy>(dst: &mut [T], src: &[T]) {
    macro_rules! fixed {
        ($($n:literal)*) => {
            match dst.len() {
                $($n => dst[..$n].copy_from_slice(&src[..$n]),)*
                9..=16 => ends::<T, 8>(dst, src),
                17..=32 => ends::<T, 16>(dst, src),
                33..=64 => ends::<T, 32>(dst, src),
                _ => dst.copy_from_slice(src),
            }
        };
    }
    if dst.len() != src.len() {
        // The slice copy's own length check, with its message.
        dst.copy_from_slice(src);
        return;
    }
    fixed!(0 1 2 3 4 5 6 7 8);
}

/// `count` rows of `len` elements: row `i` of `src` (at `i·src_step`) to row `i` of `dst` (at
/// `i·dst_step`), with [`copy_row`]'s fixed-size copies chosen once for all the rows (a choice
/// per row costs as much as the copy of a short one). Panics if a row leaves its slice.
pub(crate) fn copy_rows<T: Copy>(
    (dst, dst_step): (&mut [T], usize),
    (src, src_step): (&[T], usize),
    count: usize,
    len: usize,
) {
    #[inline(always)]
    fn rows<T: Copy>(
        (dst, dst_step): (&mut [T], usize),
        (src, src_step): (&[T], usize),
        count: usize,
        len: usize,
        copy: impl Fn(&mut [T], &[T]),
    ) {
        for i in 0..count {
            copy(
                &mut dst[i * dst_step..i * dst_step + len],
                &src[i * src_step..i * src_step + len],
            );
        }
    }
    let (d, s) = ((dst, dst_step), (src, src_step));
    match len {
        0 => {}
        1..=8 => rows(d, s, count, len, |d, s| copy_row(d, s)),
        9..=16 => rows(d, s, count, len, ends::<T, 8>),
        17..=32 => rows(d, s, count, len, ends::<T, 16>),
        33..=64 => rows(d, s, count, len, ends::<T, 32>),
        _ => rows(d, s, count, len, <[T]>::copy_from_slice),
    }
}

/// `count` rows of `len` elements: row `i` of `src` (at `i·src_step`) added into row `i` of
/// `dst` (at `i·dst_step`), eight elements at a time — fixed-size blocks that vectorize for any
/// length (a loop of run-time length over a short row runs scalar) — then the rest one by one.
/// Panics if a row leaves its slice.
pub(crate) fn add_rows<T: Copy + std::ops::AddAssign>(
    (dst, dst_step): (&mut [T], usize),
    (src, src_step): (&[T], usize),
    count: usize,
    len: usize,
) {
    for i in 0..count {
        let d = &mut dst[i * dst_step..i * dst_step + len];
        let s = &src[i * src_step..i * src_step + len];
        let (mut d8, mut s8) = (d.chunks_exact_mut(8), s.chunks_exact(8));
        for (d, s) in (&mut d8).zip(&mut s8) {
            for j in 0..8 {
                d[j] += s[j];
            }
        }
        for (d, s) in d8.into_remainder().iter_mut().zip(s8.remainder()) {
            *d += *s;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn copy_rows_copies_every_row_of_every_length() {
        for len in 0..80 {
            let (count, src_step, dst_step) = (3, len + 5, len + 2);
            let src: Vec<u32> = (0..(count * src_step) as u32).collect();
            let mut dst = vec![u32::MAX; count * dst_step];
            super::copy_rows((&mut dst, dst_step), (&src, src_step), count, len);
            for i in 0..count {
                let row = &dst[i * dst_step..(i + 1) * dst_step];
                assert_eq!(
                    &row[..len],
                    &src[i * src_step..i * src_step + len],
                    "len {len}"
                );
                assert!(row[len..].iter().all(|&v| v == u32::MAX), "len {len}");
            }
        }
    }

    #[test]
    fn add_rows_adds_every_row_of_every_length() {
        for len in 0..40 {
            let (count, src_step, dst_step) = (3, len + 1, len + 4);
            let src: Vec<i64> = (0..(count * src_step) as i64).map(|v| v * 3 - 7).collect();
            let mut dst: Vec<i64> = (0..(count * dst_step) as i64).map(|v| v * 100).collect();
            super::add_rows((&mut dst, dst_step), (&src, src_step), count, len);
            for (at, &v) in dst.iter().enumerate() {
                let (i, j) = (at / dst_step, at % dst_step);
                let added = if j < len { src[i * src_step + j] } else { 0 };
                assert_eq!(v, at as i64 * 100 + added, "len {len}, element {at}");
            }
        }
    }

    #[test]
    fn copy_row_copies_every_length() {
        for len in 0..140 {
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
