//! Operand layouts of the bf16 kernels: rows padded with zeros to whole tiles, and `B` in the
//! pair-interleaved ("VNNI") order both `vdpbf16ps` and `tdpbf16ps` read: row `p` of a packed
//! panel holds, for each column `j`, the pair `(b[2p][j], b[2p + 1][j])`.

use half::bf16;

/// `a` (`m × k`, row-major) as blocks of `rows` rows by `kc` columns (zero-padded), block
/// `(i, kb)` at `(i · kbs + kb) · rows · kc`, each row-major; `m` rounded up to `rows · mult`.
pub(super) fn pack_a(
    a: &[bf16],
    (m, k): (usize, usize),
    (rows, kc, mult): (usize, usize, usize),
) -> (Vec<u16>, usize, usize) {
    let mbs = m.div_ceil(rows).div_ceil(mult) * mult;
    let kbs = k.div_ceil(kc);
    let mut out = vec![0u16; mbs * kbs * rows * kc];
    for i in 0..m {
        let (bi, r) = (i / rows, i % rows);
        let row = &a[i * k..(i + 1) * k];
        for (kb, chunk) in row.chunks(kc).enumerate() {
            let at = ((bi * kbs + kb) * rows + r) * kc;
            for (o, x) in out[at..at + chunk.len()].iter_mut().zip(chunk) {
                *o = x.to_bits();
            }
        }
    }
    (out, mbs, kbs)
}

/// `b` (`k × n`, row-major) as panels of `cols` columns by `kc` rows (zero-padded), pair-
/// interleaved: panel `(j, kb)` at `(j · kbs + kb) · kc · cols`, holding `kc / 2` rows of
/// `2 · cols` values; `n` rounded up to `cols · mult`.
pub(super) fn pack_b(
    b: &[bf16],
    (k, n): (usize, usize),
    (cols, kc, mult): (usize, usize, usize),
) -> (Vec<u16>, usize, usize) {
    let nbs = n.div_ceil(cols).div_ceil(mult) * mult;
    let kbs = k.div_ceil(kc);
    let mut out = vec![0u16; nbs * kbs * kc * cols];
    for kk in 0..k {
        let (kb, p, q) = (kk / kc, kk % kc / 2, kk % 2);
        let row = &b[kk * n..(kk + 1) * n];
        for (j, x) in row.iter().enumerate() {
            let (bj, c) = (j / cols, j % cols);
            out[(bj * kbs + kb) * kc * cols + p * 2 * cols + 2 * c + q] = x.to_bits();
        }
    }
    (out, nbs, kbs)
}
