//! The average of integers, exact: summed in the integer type itself, `n` values of `u8` or `i32`
//! would wrap (200 and 200 averaging to 72) before the division. So an integer [`ReduceOp::Avg`]
//! sums in `i64` instead — `u8` and `i32` values widened, each `i64` value split into its high
//! and low 32 bits (two `i64`s whose sums over up to 2³¹ ranks cannot overflow) — and divides the
//! exact sum by the number of ranks, truncating toward zero, as integer division does.
//!
//! The call's fingerprint stays the caller's (`all_reduce(i32 x 4, avg)`), so a mismatch is
//! still found and named as the caller wrote it; what travels is the wider sum.

use kolo_core::{DType, ReduceOp};

/// Whether `(dtype, op)` is an integer average, which this module computes.
pub(super) fn applies(dtype: DType, op: ReduceOp) -> bool {
    op == ReduceOp::Avg && matches!(dtype, DType::U8 | DType::I32 | DType::I64)
}

/// `i64`s per element of `dtype` in the wide form.
fn width(dtype: DType) -> usize {
    if dtype == DType::I64 {
        2
    } else {
        1
    }
}

/// The wide form of the integers in `bytes` (of `dtype`), whose element-wise sum is exact.
pub(super) fn widen(dtype: DType, bytes: &[u8]) -> Vec<i64> {
    let mut out = Vec::with_capacity(bytes.len() / dtype.size() * width(dtype));
    match dtype {
        DType::U8 => out.extend(bytes.iter().map(|&b| i64::from(b))),
        DType::I32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| i64::from(i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))),
        ),
        _ => {
            for c in bytes.chunks_exact(8) {
                let v = i64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
                out.push(v >> 32);
                out.push(v & 0xffff_ffff);
            }
        }
    }
    out
}

/// Writes the average over `n` ranks of the summed wide form `sum` into `bytes` (of `dtype`).
pub(super) fn narrow(dtype: DType, sum: &[i64], n: usize, bytes: &mut [u8]) {
    let n = n.max(1) as i128;
    let e = dtype.size();
    let values = sum.chunks_exact(width(dtype)).map(|w| match w {
        [hi, lo] => ((i128::from(*hi) << 32) + i128::from(*lo)) / n,
        [v, ..] => i128::from(*v) / n,
        [] => 0,
    });
    // The average lies between the smallest and largest value averaged: it fits the type.
    for (out, v) in bytes.chunks_exact_mut(e).zip(values) {
        match dtype {
            DType::U8 => out.copy_from_slice(&[v as u8]),
            DType::I32 => out.copy_from_slice(&(v as i32).to_ne_bytes()),
            _ => out.copy_from_slice(&(v as i64).to_ne_bytes()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_core::dtype::as_bytes;

    /// The sum of the ranks' wide forms, narrowed: the exact average, truncated toward zero.
    fn average<T: kolo_core::Element>(dtype: DType, ranks: &[Vec<T>]) -> Vec<u8> {
        let wides: Vec<Vec<i64>> = ranks.iter().map(|r| widen(dtype, as_bytes(r))).collect();
        let sum: Vec<i64> = (0..wides[0].len())
            .map(|i| wides.iter().map(|w| w[i]).sum())
            .collect();
        let mut out = as_bytes(&ranks[0]).to_vec();
        narrow(dtype, &sum, ranks.len(), &mut out);
        out
    }

    #[test]
    fn averages_are_exact_where_the_sum_overflows_the_type() {
        assert_eq!(
            average(DType::U8, &[vec![200u8, 255, 0], vec![200, 254, 1]]),
            [200, 254, 0]
        );
        let big = i32::MAX - 3;
        let got = average(
            DType::I32,
            &[vec![big, -7, i32::MIN], vec![big, 0, i32::MIN]],
        );
        assert_eq!(got, as_bytes(&[big, -3, i32::MIN]));
        let got = average(
            DType::I64,
            &[
                vec![i64::MAX, i64::MIN, -5, 3],
                vec![i64::MAX - 2, i64::MIN, 0, 4],
            ],
        );
        assert_eq!(got, as_bytes(&[i64::MAX - 1, i64::MIN, -2, 3]));
    }
}
