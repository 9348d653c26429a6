//! Tiles into and out of lane vectors eight tiles at a time, for f32 on AVX2: the tiles' rows
//! read (or written) as whole 8-float vectors and turned into lane vectors by an 8 × 8
//! transpose in registers.
//!
//! The generic passes move a tile's values one at a time between its rows and the lane vectors
//! (value `(i, j)` of tile `l` to lane `l` of vector `(i, j)`): `A²` scalar loads and stores per
//! tile, which took a third of the Winograd convolution's time outside its GEMMs (ResNet-18's
//! 64-channel layers on an AVX2 EPYC: the input transform alone half as long as the GEMMs). Here
//! the same moves take 8 vector loads, 24 shuffles and `A` vector stores per row of 8 tiles.
//!
//! Each function returns `false` (having done nothing) where its fast path does not apply — not
//! f32, a CPU without AVX2 or with AVX-512F ([`cpu_takes_them`]), a partial group of tiles, a
//! tile side outside 4..=8, or an 8-float row that would reach past the buffer — and the caller
//! takes the generic path.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use candle_core::{DType, WithDType};

use super::lanes::{Lanes, LANES};

/// Whether the fast paths can run for `T`: f32, a tile side in 4..=8, a full group of tiles, on
/// a CPU that [takes them](cpu_takes_them).
#[inline(always)]
fn applies<T: WithDType>(side: usize, n: usize) -> bool {
    T::DTYPE == DType::F32 && (4..=8).contains(&side) && n == LANES && cpu_takes_them()
}

/// Whether this CPU takes the fast paths: AVX2 without AVX-512F (std caches the checks). With
/// AVX-512 the passes run their AVX-512 copies, whose lane vectors are one 16-float register
/// each, and keep their generic loops there: these 8-float moves were measured on AVX2 CPUs only.
/// A 16-tile form for AVX-512 (masked loads of a tile row, tiles `l` and `l + 8` in one register,
/// two 8 × 8 transposes at once) measured no faster on a Zen 4 EPYC, whose passes wait on their
/// strided reads of the transformed planes, not on these moves (performance chapter, Zen 4).
#[inline(always)]
fn cpu_takes_them() -> bool {
    is_x86_feature_detected!("avx2") && !is_x86_feature_detected!("avx512f")
}

/// Whether 8 values from every `at + i·pw` (`i < rows`) lie inside `len`.
#[inline(always)]
fn rows_fit(at: &[usize], rows: usize, pw: usize, len: usize) -> bool {
    let last = at.iter().copied().max().unwrap_or(0);
    last + (rows - 1) * pw + 8 <= len
}

/// Transposes the 8 × 8 matrix of f32 in `r` (row `i` in `r[i]`) in place.
#[inline(always)]
fn transpose8(r: &mut [__m256; 8]) {
    // SAFETY (of the intrinsics): register-only operations; callers run with AVX2.
    unsafe {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        // Columns 0-3 of rows 0-3 (low halves) and 4-7 (high halves); then rows 4-7.
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xee>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xee>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xee>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xee>(t5, t7);
        r[0] = _mm256_permute2f128_ps::<0x20>(s0, s4);
        r[1] = _mm256_permute2f128_ps::<0x20>(s1, s5);
        r[2] = _mm256_permute2f128_ps::<0x20>(s2, s6);
        r[3] = _mm256_permute2f128_ps::<0x20>(s3, s7);
        r[4] = _mm256_permute2f128_ps::<0x31>(s0, s4);
        r[5] = _mm256_permute2f128_ps::<0x31>(s1, s5);
        r[6] = _mm256_permute2f128_ps::<0x31>(s2, s6);
        r[7] = _mm256_permute2f128_ps::<0x31>(s3, s7);
    }
}

/// Lane vectors from 8 rows: `row(l)` is where lane `l`'s 8 values lie; after the transpose,
/// vector `v < count` (value `v` of every lane) is stored at `dst + v·LANES`.
///
/// # Safety
/// The CPU has AVX2; 8 values from every `row(l)` are readable and `LANES·(count − 1) + 8` from
/// `dst` writable.
#[inline(always)]
unsafe fn lanes_from_rows(row: impl Fn(usize) -> *const f32, count: usize, dst: *mut f32) {
    // SAFETY: the caller's.
    unsafe {
        let mut r: [__m256; 8] = std::array::from_fn(|l| _mm256_loadu_ps(row(l)));
        transpose8(&mut r);
        for (v, x) in r.iter().enumerate().take(count) {
            _mm256_storeu_ps(dst.add(v * LANES), *x);
        }
    }
}

/// Rows from lane vectors, the inverse of [`lanes_from_rows`]: vectors `v < count` read from
/// `src + v·LANES` (zeros past `count`), transposed, so that `r[l]` holds lane `l`'s values.
///
/// # Safety
/// The CPU has AVX2; `LANES·(count − 1) + 8` values from `src` are readable.
#[inline(always)]
unsafe fn rows_from_lanes(src: *const f32, count: usize) -> [__m256; 8] {
    // SAFETY: the caller's.
    unsafe {
        let mut r: [__m256; 8] = std::array::from_fn(|v| {
            if v < count {
                _mm256_loadu_ps(src.add(v * LANES))
            } else {
                _mm256_setzero_ps()
            }
        });
        transpose8(&mut r);
        r
    }
}

/// `d[i][j][l] = src[at[l] + i·pw + j]`: the `N × N` tiles at the [`LANES`] offsets `at` as lane
/// vectors (see [`super::lanes::load`]), every value written (no zero-filled array first);
/// `None` where the fast path does not apply.
#[inline(always)]
pub(super) fn load<T: WithDType, const N: usize>(
    src: &[T],
    at: &[usize],
    pw: usize,
) -> Option<[[Lanes<T>; N]; N]> {
    if !applies::<T>(N, at.len()) || !rows_fit(at, N, pw, src.len()) {
        return None;
    }
    let s = src.as_ptr().cast::<f32>();
    let mut d = MaybeUninit::<[[Lanes<T>; N]; N]>::uninit();
    let out = d.as_mut_ptr().cast::<f32>();
    for half in [0, 8] {
        for i in 0..N {
            // SAFETY: T is f32 (`applies`), every row read lies inside `src` (`rows_fit`), and
            // every store inside `d` (`i, j < N`, lanes `half..half + 8` of `LANES`); the CPU
            // has AVX2 (`applies`).
            unsafe {
                let row = |l: usize| s.add(at[half + l] + i * pw);
                lanes_from_rows(row, N, out.add(i * N * LANES + half));
            }
        }
    }
    // SAFETY: the loops above wrote all `N·N·LANES` values: lanes `half..half + 8` of vector
    // `(i, j)` for both halves and every `i, j < N`.
    Some(unsafe { d.assume_init() })
}

/// `dst[at[l] + i·pw + j] += d[i][j][l]` (overlapping tiles add up): the scatter of
/// [`super::passes::input_grad_transform`]; `false` where the fast path does not apply. Reads
/// and writes back 8 values per tile row, of which the `N` of the tile change. The even tiles go
/// first, then the odd ones: neighbours in a tile row overlap (by `N − M` columns), and a
/// vector load over part of a store still in flight waits for it, where one from an earlier
/// pass finds it written.
#[inline(always)]
pub(super) fn add_into<T: WithDType, const N: usize>(
    d: &[[Lanes<T>; N]; N],
    at: &[usize],
    pw: usize,
    dst: &mut [T],
) -> bool {
    if !applies::<T>(N, at.len()) || !rows_fit(at, N, pw, dst.len()) {
        return false;
    }
    let out = dst.as_mut_ptr().cast::<f32>();
    let d = (d as *const [[Lanes<T>; N]; N]).cast::<f32>();
    // rows[i][l]: row `i` of tile `l`, all of them written below.
    let mut rows = MaybeUninit::<[[__m256; LANES]; N]>::uninit();
    let rp = rows.as_mut_ptr().cast::<__m256>();
    for half in [0, 8] {
        for i in 0..N {
            // SAFETY: T is f32 (`applies`); every load is inside `d` (`i, j < N`, lanes
            // `half..half + 8` of `LANES`). The vectors past `N` are zeros, so the values after
            // a tile's row are written back unchanged.
            unsafe {
                let r = rows_from_lanes(d.add(i * N * LANES + half), N);
                for (l, v) in r.iter().enumerate() {
                    rp.add(i * LANES + half + l).write(*v);
                }
            }
        }
    }
    // SAFETY: the loops above wrote rows[i][l] for every `i < N` and `l < LANES`.
    let rows = unsafe { rows.assume_init() };
    for parity in [0, 1] {
        for (i, row) in rows.iter().enumerate() {
            for l in (parity..LANES).step_by(2) {
                // SAFETY: 8 values from `at[l] + i·pw` lie inside `dst` (`rows_fit`).
                unsafe {
                    let p = out.add(at[l] + i * pw);
                    _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), row[l]));
                }
            }
        }
    }
    true
}

/// The rows of [`LANES`] tiles of side `M` from their lane vectors (`tile[i][j][l]`), each plus
/// `bias`: `rows[i][l][..M]` is row `i` of tile `l` (the rest of the 8 values is padding, the
/// bias too), for
/// [`super::passes::output_transform`]; `false` where the fast path does not apply.
#[inline(always)]
pub(super) fn rows_of<T: WithDType, const M: usize>(
    tile: &[[Lanes<T>; M]; M],
    bias: T,
    rows: &mut [[[T; 8]; LANES]; M],
) -> bool {
    if !applies::<T>(M, LANES) {
        return false;
    }
    let t = (tile as *const [[Lanes<T>; M]; M]).cast::<f32>();
    let out = (rows as *mut [[[T; 8]; LANES]; M]).cast::<f32>();
    // SAFETY: T is f32 (`applies`), so `bias` is one.
    let b = unsafe { _mm256_set1_ps(*(&bias as *const T).cast::<f32>()) };
    for half in [0, 8] {
        for i in 0..M {
            // SAFETY: T is f32 and the CPU has AVX2 (`applies`); every load is inside `tile`
            // (`i, j < M`, lanes `half..half + 8`) and every store inside `rows` (8 values of
            // tile `half + l`'s row `i`).
            unsafe {
                let r = rows_from_lanes(t.add(i * M * LANES + half), M);
                for (l, v) in r.iter().enumerate() {
                    _mm256_storeu_ps(out.add((i * LANES + half + l) * 8), _mm256_add_ps(*v, b));
                }
            }
        }
    }
    true
}

/// The 3 × 3 kernels `k0..k0 + LANES` of `w` (`[kernels, 9]`, contiguous) as lane vectors
/// (`d[i][j][l] = w[(k0 + l)·9 + 3i + j]`), for [`super::passes::kernel_transform`]: values 0–7
/// of 8 kernels by one transpose, the ninth gathered; `None` where the fast path does not
/// apply.
#[inline(always)]
pub(super) fn load_kernels<T: WithDType>(w: &[T], k0: usize) -> Option<[[Lanes<T>; 3]; 3]> {
    if !applies::<T>(8, LANES) || (k0 + LANES) * 9 > w.len() {
        return None;
    }
    // SAFETY: inside `w` (checked just above).
    let s = unsafe { w.as_ptr().cast::<f32>().add(k0 * 9) };
    let mut d = MaybeUninit::<[[Lanes<T>; 3]; 3]>::uninit();
    let out = d.as_mut_ptr().cast::<f32>();
    for half in [0, 8] {
        // SAFETY: T is f32 and the CPU has AVX2 (`applies`); kernel `half + l` is the 9 values
        // from `(half + l)·9`, all inside `w`; value `v` of lane `half + l` is at `v·LANES +
        // half + l` of `d`.
        unsafe {
            lanes_from_rows(|l| s.add((half + l) * 9), 8, out.add(half));
            let last: [f32; 8] = std::array::from_fn(|l| *s.add((half + l) * 9 + 8));
            _mm256_storeu_ps(out.add(8 * LANES + half), _mm256_loadu_ps(last.as_ptr()));
        }
    }
    // SAFETY: all 9 vectors of both halves were written.
    Some(unsafe { d.assume_init() })
}

/// The [`LANES`] 3 × 3 kernels of `dg` (`dg[i][j][l]`) one after the other, 9 values each, into
/// `kernels`: the inverse of [`load_kernels`], for [`super::passes::kernel_grad_transform`];
/// `false` where the fast path does not apply.
#[inline(always)]
pub(super) fn kernels_of<T: WithDType>(
    dg: &[[Lanes<T>; 3]; 3],
    kernels: &mut [T; LANES * 9],
) -> bool {
    if !applies::<T>(8, LANES) {
        return false;
    }
    let d = (dg as *const [[Lanes<T>; 3]; 3]).cast::<f32>();
    let out = kernels.as_mut_ptr().cast::<f32>();
    for half in [0, 8] {
        // SAFETY: T is f32 and the CPU has AVX2 (`applies`); the loads are values 0-7 of lanes
        // `half..half + 8` of `dg`, each store the 8 values from `(half + l)·9` of `kernels`
        // (the ninth, after them, written next), inside its `LANES·9`.
        unsafe {
            let r = rows_from_lanes(d.add(half), 8);
            for (l, x) in r.iter().enumerate() {
                _mm256_storeu_ps(out.add((half + l) * 9), *x);
                *out.add((half + l) * 9 + 8) = *d.add(8 * LANES + half + l);
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether this CPU runs the fast paths (AVX2 without AVX-512F), to test them.
    fn avx2() -> bool {
        let ok = cpu_takes_them();
        if !ok {
            eprintln!("skipped: the AVX2 tile moves run on CPUs with AVX2 and without AVX-512F");
        }
        ok
    }

    #[test]
    fn eight_by_eight_transposes() {
        if !is_x86_feature_detected!("avx2") {
            eprintln!("skipped: no AVX2");
            return;
        }
        #[target_feature(enable = "avx2")]
        fn run(src: &[f32; 64]) -> [f32; 64] {
            // SAFETY: 8 loads and stores of 8 inside 64 values.
            unsafe {
                let mut r: [__m256; 8] =
                    std::array::from_fn(|i| _mm256_loadu_ps(src.as_ptr().add(8 * i)));
                transpose8(&mut r);
                let mut out = [0f32; 64];
                for (i, v) in r.iter().enumerate() {
                    _mm256_storeu_ps(out.as_mut_ptr().add(8 * i), *v);
                }
                out
            }
        }
        let src: [f32; 64] = std::array::from_fn(|i| i as f32);
        // SAFETY: the CPU has AVX2 (checked above).
        let got = unsafe { run(&src) };
        for i in 0..8 {
            for j in 0..8 {
                assert_eq!(got[i * 8 + j], src[j * 8 + i], "({i}, {j})");
            }
        }
    }

    /// Offsets of 16 tiles of side 6 on a plane 40 wide (two tile rows, tiles 4 apart), as the
    /// Winograd passes lay them out.
    fn offsets() -> [usize; LANES] {
        std::array::from_fn(|l| (l / 8) * 4 * 40 + (l % 8) * 4)
    }

    #[test]
    fn tiles_load_and_add_back_as_the_generic_loops_do() {
        if !avx2() {
            return;
        }
        let at = offsets();
        let src: Vec<f32> = (0..40 * 16).map(|i| (i * 7 % 101) as f32).collect();
        let d = load::<f32, 6>(&src, &at, 40).expect("taken");
        for (l, &o) in at.iter().enumerate() {
            for i in 0..6 {
                for j in 0..6 {
                    assert_eq!(d[i][j][l], src[o + i * 40 + j], "tile {l} ({i}, {j})");
                }
            }
        }
        // A row that would reach past the buffer: not taken.
        assert!(load::<f32, 6>(&src[..at[15] + 5 * 40 + 7], &at, 40).is_none());
        // Not f32, or fewer tiles, or a tile of 3 × 3: not taken.
        assert!(load::<f64, 6>(&[0f64; 640], &at, 40).is_none());
        assert!(load::<f32, 6>(&src, &at[..15], 40).is_none());
        assert!(load::<f32, 3>(&src, &at, 40).is_none());

        let mut dst: Vec<f32> = (0..40 * 16).map(|i| i as f32).collect();
        let mut want = dst.clone();
        for (l, &o) in at.iter().enumerate() {
            for i in 0..6 {
                for j in 0..6 {
                    want[o + i * 40 + j] += d[i][j][l];
                }
            }
        }
        assert!(add_into(&d, &at, 40, &mut dst));
        assert_eq!(dst, want, "overlapping tiles add up, the rest is unchanged");
    }

    #[test]
    fn kernels_load_and_come_back_as_the_generic_loops_do() {
        if !avx2() {
            return;
        }
        // 20 kernels: lanes from kernel 3 (16 of them), and one start too far for 16.
        let w: Vec<f32> = (0..20 * 9).map(|i| (i * 13 % 97) as f32 - 40.0).collect();
        let d = load_kernels(&w, 3).expect("taken");
        for l in 0..LANES {
            for i in 0..3 {
                for j in 0..3 {
                    assert_eq!(
                        d[i][j][l],
                        w[(3 + l) * 9 + 3 * i + j],
                        "kernel {l} ({i}, {j})"
                    );
                }
            }
        }
        assert!(load_kernels(&w, 5).is_none(), "past the last kernel");
        assert!(load_kernels(&[0f64; 180], 0).is_none(), "not f32");
        let mut kernels = [0f32; LANES * 9];
        assert!(kernels_of(&d, &mut kernels));
        assert_eq!(&kernels[..], &w[27..27 + LANES * 9]);
    }

    #[test]
    fn rows_of_tiles_come_out_with_the_bias() {
        if !avx2() {
            return;
        }
        let tile: [[Lanes<f32>; 4]; 4] = std::array::from_fn(|i| {
            std::array::from_fn(|j| std::array::from_fn(|l| (100 * l + 10 * i + j) as f32))
        });
        let mut rows = [[[0f32; 8]; LANES]; 4];
        assert!(rows_of(&tile, 0.5, &mut rows));
        for i in 0..4 {
            for l in 0..LANES {
                for j in 0..4 {
                    assert_eq!(rows[i][l][j], tile[i][j][l] + 0.5, "tile {l} ({i}, {j})");
                }
            }
        }
        // 2 × 2 tiles (fewer moves than a transpose saves): not taken.
        let mut rows2 = [[[0f32; 8]; LANES]; 2];
        assert!(!rows_of(&[[[0f32; LANES]; 2]; 2], 1.0, &mut rows2));
    }
}
