use super::*;

/// A bf16 matrix with values that are exact in bf16 and varied in sign and size.
fn matrix(rows: usize, cols: usize, seed: usize) -> Vec<bf16> {
    (0..rows * cols)
        .map(|i| {
            let v = ((i * 7 + seed * 13) % 23) as f32 - 11.0;
            bf16::from_f32(v / 8.0)
        })
        .collect()
}

fn reference(a: &[bf16], b: &[bf16], (m, k, n): (usize, usize, usize)) -> Vec<f64> {
    let mut c = vec![0f64; m * n];
    for i in 0..m {
        for kk in 0..k {
            let x = f64::from(a[i * k + kk].to_f32());
            for j in 0..n {
                c[i * n + j] += x * f64::from(b[kk * n + j].to_f32());
            }
        }
    }
    c
}

const SHAPES: [(usize, usize, usize); 7] = [
    (1, 1, 1),
    (5, 3, 7),
    (16, 32, 16),
    (17, 33, 19),
    (33, 65, 70),
    (64, 300, 48),
    (9, 513, 40),
];

#[test]
fn every_path_this_cpu_has_multiplies_exactly_as_f32_sums_do() {
    let paths = [Bf16Path::Amx, Bf16Path::Avx512Bf16, Bf16Path::F32];
    let mut ran = Vec::new();
    for path in paths.into_iter().filter(|p| p.available()) {
        ran.push(path.name());
        for (m, k, n) in SHAPES {
            let (a, b) = (matrix(m, k, 1), matrix(k, n, 2));
            let want = reference(&a, &b, (m, k, n));
            // Into ones, accumulating; and into garbage, not.
            let mut acc = vec![1f32; m * n];
            matmul_bf16_on(path, &a, &b, &mut acc, (m, k, n), true).expect("gemm");
            let mut set = vec![f32::NAN; m * n];
            matmul_bf16_on(path, &a, &b, &mut set, (m, k, n), false).expect("gemm");
            for i in 0..m * n {
                // Products of bf16 values are exact in f32; sums of these small values too.
                assert_eq!(f64::from(set[i]), want[i], "{path:?} {m}x{k}x{n} at {i}");
                assert_eq!(
                    f64::from(acc[i]),
                    want[i] + 1.0,
                    "{path:?} {m}x{k}x{n} at {i}"
                );
            }
        }
    }
    eprintln!("bf16 GEMM paths checked on this CPU: {ran:?}");
    assert!(ran.contains(&"f32"));
}

#[test]
fn the_chosen_path_is_the_fastest_unit_and_short_operands_are_refused() {
    if std::env::var_os("KOLO_BF16_GEMM").is_none() {
        let want = if Bf16Path::Amx.available() {
            Bf16Path::Amx
        } else if avx512_bf16_speed().is_some_and(|s| s.pays()) {
            Bf16Path::Avx512Bf16
        } else {
            Bf16Path::F32
        };
        assert_eq!(bf16_path().expect("a path"), want);
    }
    let (a, b) = (matrix(2, 3, 1), matrix(3, 2, 2));
    let mut c = vec![0f32; 3];
    let e = matmul_bf16(&a, &b, &mut c, (2, 3, 2), false).expect_err("c is too short");
    assert!(e.to_string().contains("too short"), "{e}");
}

#[test]
fn transposed_operands_are_read_through_their_strides() {
    for path in [Bf16Path::Amx, Bf16Path::Avx512Bf16, Bf16Path::F32]
        .into_iter()
        .filter(|p| p.available())
    {
        for (m, k, n) in SHAPES {
            // a stored as k × m and b as n × k: the views are their transposes.
            let (at, bt) = (matrix(k, m, 3), matrix(n, k, 4));
            let a: Vec<bf16> = (0..m * k).map(|i| at[(i % k) * m + i / k]).collect();
            let b: Vec<bf16> = (0..k * n).map(|i| bt[(i % n) * k + i / n]).collect();
            let want = reference(&a, &b, (m, k, n));
            let mut c = vec![f32::NAN; m * n];
            let (av, bv) = (
                MatRef::row_major(&at[..], k, m).t(),
                MatRef::row_major(&bt[..], n, k).t(),
            );
            matmul_views(path, av, bv, &mut c, false).expect("gemm");
            for i in 0..m * n {
                assert_eq!(f64::from(c[i]), want[i], "{path:?} {m}x{k}x{n} at {i}");
            }
        }
    }
}

#[test]
fn the_bf16_note_says_what_computes_on_which_unit() {
    use super::{bf16_note, Bf16Path};
    let none = bf16_note(None, &[], None, true);
    assert!(
        none.contains("no bf16 instructions")
            && none.contains("compute in f32, as fast as --precision f32"),
        "{none}"
    );
    let converted = bf16_note(None, &[], None, false);
    assert!(
        converted.contains("no bf16 instructions")
            && converted.contains("around bf16 conversions (KOLO_BF16_GEMM=f32)"),
        "{converted}"
    );
    let avx = bf16_note(
        Some(Bf16Path::Avx512Bf16),
        &[Bf16Path::Avx512Bf16],
        None,
        false,
    );
    assert!(
        avx.starts_with(
            "bf16: the matrix products of the convolutions and linear layers on this CPU's \
             AVX512-BF16 unit"
        ) && avx.contains("implicit GEMMs"),
        "{avx}"
    );
    let amx = bf16_note(
        Some(Bf16Path::Amx),
        &[Bf16Path::Amx, Bf16Path::Avx512Bf16],
        None,
        false,
    );
    assert!(
        amx.contains("this CPU's AMX unit") && amx.contains("implicit GEMMs"),
        "{amx}"
    );
    let kept_out = bf16_note(None, &[Bf16Path::Avx512Bf16], None, false);
    assert!(
        kept_out.contains("around bf16 conversions") && kept_out.contains("KOLO_BF16_GEMM=f32"),
        "{kept_out}"
    );
    let slow = UnitSpeed {
        bf16_gflops: 68.2,
        f32_gflops: 171.4,
    };
    let slower = bf16_note(None, &[Bf16Path::Avx512Bf16], Some(slow), false);
    assert!(
        slower.contains("slower than its f32 FMAs (68 against 171 GFLOP/s")
            && slower.contains("compute in f32, as fast as --precision f32")
            && slower.contains("KOLO_BF16_GEMM=avx512bf16"),
        "{slower}"
    );
    assert_eq!(bf16_note(Some(Bf16Path::F32), &[], None, true), none);
}

#[test]
fn avx512_bf16_is_taken_only_where_it_multiplies_faster_than_f32() {
    let speed = |bf16_gflops, f32_gflops| UnitSpeed {
        bf16_gflops,
        f32_gflops,
    };
    // The peaks measured: AMD EPYC (Zen 4), an Intel Xeon with AMX, one without.
    let (amd, intel, intel_no_amx) = (speed(233.0, 116.0), speed(83.0, 176.0), speed(89.0, 179.0));
    assert!(amd.pays() && !intel.pays() && !intel_no_amx.pays());
    assert!(speed(125.0, 100.0).pays() && !speed(124.0, 100.0).pays());
    assert_eq!(default_path(false, || Some(amd)), Bf16Path::Avx512Bf16);
    assert_eq!(default_path(false, || Some(intel_no_amx)), Bf16Path::F32);
    assert_eq!(default_path(false, || None), Bf16Path::F32);
    // AMX wins without the AVX512-BF16 unit being timed.
    let untimed = || -> Option<UnitSpeed> { panic!("AVX512-BF16 timed on an AMX CPU") };
    assert_eq!(default_path(true, untimed), Bf16Path::Amx);
    // This CPU's figures: both units timed where it has the bf16 one, each a rate.
    match avx512_bf16_speed() {
        Some(s) => {
            eprintln!("this CPU: {s:?}, AVX512-BF16 {:.2}× f32", s.speedup());
            assert!(s.bf16_gflops.is_finite() && s.bf16_gflops > 1.0, "{s:?}");
            assert!(s.f32_gflops.is_finite() && s.f32_gflops > 1.0, "{s:?}");
        }
        None => assert!(!Bf16Path::Avx512Bf16.available()),
    }
}

/// An f32 matrix whose values are not bf16 values (rounding matters), varied in sign and size.
fn matrix_f32(rows: usize, cols: usize, seed: usize) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| {
            let v = ((i * 7 + seed * 13) % 23) as f32 - 11.0;
            v / 8.0 + (i % 5) as f32 * 1.3e-3
        })
        .collect()
}

#[test]
fn f32_operands_multiply_as_their_bf16_roundings_do() {
    let shapes = SHAPES
        .iter()
        .copied()
        .chain([(8, 64, 32), (16, 257, 33), (3, 7, 64)]);
    for path in [Bf16Path::Amx, Bf16Path::Avx512Bf16, Bf16Path::F32]
        .into_iter()
        .filter(|p| p.available())
    {
        for (m, k, n) in shapes.clone() {
            // A larger product first leaves other values in the kept packing buffers: the padding
            // along k must be written, not assumed.
            let (big_a, big_b) = (vec![f32::MAX; 40 * 600], vec![f32::MAX; 600 * 70]);
            let mut big_c = vec![0f32; 40 * 70];
            let (ba, bb) = (
                MatRef::row_major(&big_a[..], 40, 600),
                MatRef::row_major(&big_b[..], 600, 70),
            );
            matmul_views(path, ba, bb, &mut big_c, false).expect("gemm");
            let (a, b) = (matrix_f32(m, k, 5), matrix_f32(k, n, 6));
            let round = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
            let (ar, br) = (round(&a), round(&b));
            let mut want = vec![0f32; m * n];
            matmul_views(
                path,
                MatRef::row_major(&ar[..], m, k),
                MatRef::row_major(&br[..], k, n),
                &mut want,
                false,
            )
            .expect("gemm");
            // Row-major, then both operands read through their transposes.
            let mut got = vec![f32::NAN; m * n];
            let (av, bv) = (
                MatRef::row_major(&a[..], m, k),
                MatRef::row_major(&b[..], k, n),
            );
            matmul_views(path, av, bv, &mut got, false).expect("gemm");
            assert_eq!(got, want, "{path:?} {m}x{k}x{n}");
            let at: Vec<f32> = (0..m * k).map(|i| a[(i % m) * k + i / m]).collect();
            let bt: Vec<f32> = (0..k * n).map(|i| b[(i % k) * n + i / k]).collect();
            let mut got_t = vec![1f32; m * n];
            matmul_views(
                path,
                MatRef::row_major(&at[..], k, m).t(),
                MatRef::row_major(&bt[..], n, k).t(),
                &mut got_t,
                true,
            )
            .expect("gemm");
            // Summed into what `c` held: AMX adds into the loaded tile of `C` product by product,
            // so the last bits may differ from `want + 1`.
            for (i, (g, w)) in got_t.iter().zip(&want).enumerate() {
                let close = (g - (w + 1.0)).abs() <= 1e-5 * (w + 1.0).abs().max(1.0);
                assert!(
                    close,
                    "{path:?} {m}x{k}x{n} transposed, accumulated, at {i}: {g} vs {w} + 1"
                );
            }
        }
    }
}

/// Runs of every length up to 40 (a masked tail, or a run shorter than a vector: an image row of
/// 7 or 4 values) round as `half` rounds, ties to even, NaN kept; the values past the run stay.
#[test]
fn runs_of_any_length_round_to_nearest_even_and_stop_at_their_end() {
    let src: Vec<f32> = (0..40)
        .map(|i| match i % 9 {
            0 => f32::NAN,
            1 => f32::from_bits(0x3f80_8000), // halfway: rounds to even (down)
            2 => f32::from_bits(0x3f81_8000), // halfway: rounds to even (up)
            _ => (i as f32 * 0.731).sin() * 1e3,
        })
        .collect();
    for n in 0..=40 {
        let mut dst = vec![0xbeefu16; 48];
        pack::round_run(&src[..n], &mut dst);
        for (i, &x) in src[..n].iter().enumerate() {
            let want = bf16::from_f32(x);
            if x.is_nan() {
                assert!(
                    bf16::from_bits(dst[i]).is_nan(),
                    "run of {n}: value {i} not NaN"
                );
            } else {
                assert_eq!(dst[i], want.to_bits(), "run of {n}: value {i} ({x})");
            }
        }
        assert!(
            dst[n..].iter().all(|&v| v == 0xbeef),
            "run of {n} wrote past its end"
        );
    }
}
