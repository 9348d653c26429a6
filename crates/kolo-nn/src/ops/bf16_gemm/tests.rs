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
fn the_chosen_path_is_amx_where_available_and_short_operands_are_refused() {
    if std::env::var_os("KOLO_BF16_GEMM").is_none() {
        let want = if Bf16Path::Amx.available() {
            Bf16Path::Amx
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
    let none = bf16_note(None, &[]);
    assert!(
        none.contains("no bf16 instructions") && none.contains("in f32"),
        "{none}"
    );
    let avx = bf16_note(None, &[Bf16Path::Avx512Bf16]);
    assert!(
        avx.contains("KOLO_BF16_GEMM=avx512bf16") && avx.contains("AVX512-BF16"),
        "{avx}"
    );
    assert!(avx.contains("in f32 around bf16 conversions"), "{avx}");
    let amx = bf16_note(None, &[Bf16Path::Amx, Bf16Path::Avx512Bf16]);
    assert!(amx.contains("KOLO_BF16_GEMM=amx"), "{amx}");
    let asked = bf16_note(Some(Bf16Path::Avx512Bf16), &[Bf16Path::Avx512Bf16]);
    assert!(
        asked.starts_with("bf16: convolutions on this CPU's AVX512-BF16 unit"),
        "{asked}"
    );
    let f32_asked = bf16_note(Some(Bf16Path::F32), &[]);
    assert_eq!(f32_asked, none);
}
