//! The 16 × 16 transpose of 32-bit values in sixteen AVX-512 registers, shared by the kernels
//! that change layouts sixteen by sixteen values (the AMX convolution's layouts, the bf16
//! packing's gathers).

use std::arch::x86_64::*;

/// Transposes the 16 × 16 matrix of 32-bit values in `r` (row `i` in `r[i]`) in place.
#[inline(always)]
pub(super) fn transpose16(r: &mut [__m512i; 16]) {
    // SAFETY (of the intrinsics): register-only operations; callers run with AVX-512F.
    unsafe {
        let mut t = [_mm512_setzero_si512(); 16];
        for i in (0..16).step_by(2) {
            t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
            t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
        }
        for i in (0..16).step_by(4) {
            r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
            r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
            r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
            r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
        }
        for i in [0, 8] {
            for j in 0..4 {
                t[i + j] = _mm512_shuffle_i32x4::<0x88>(r[i + j], r[i + j + 4]);
                t[i + j + 4] = _mm512_shuffle_i32x4::<0xdd>(r[i + j], r[i + j + 4]);
            }
        }
        for j in 0..8 {
            r[j] = _mm512_shuffle_i32x4::<0x88>(t[j], t[j + 8]);
            r[j + 8] = _mm512_shuffle_i32x4::<0xdd>(t[j], t[j + 8]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_by_sixteen_transposes() {
        if !std::is_x86_feature_detected!("avx512f") {
            eprintln!("skipped: no AVX-512F");
            return;
        }
        let src: Vec<u32> = (0..256).collect();
        let mut r = [unsafe { _mm512_setzero_si512() }; 16];
        for (i, v) in r.iter_mut().enumerate() {
            *v = unsafe { _mm512_loadu_si512(src.as_ptr().add(16 * i).cast()) };
        }
        #[target_feature(enable = "avx512f")]
        fn run(r: &mut [__m512i; 16]) {
            transpose16(r)
        }
        unsafe { run(&mut r) };
        let mut got = vec![0u32; 256];
        for (i, v) in r.iter().enumerate() {
            unsafe { _mm512_storeu_si512(got.as_mut_ptr().add(16 * i).cast(), *v) };
        }
        for i in 0..16 {
            for j in 0..16 {
                assert_eq!(got[i * 16 + j], src[j * 16 + i], "({i}, {j})");
            }
        }
    }
}
