use super::*;
use crate::ops::bf16_gemm::with_tile_unit;
use half::bf16;

/// Values varied in sign and size, rounded to bf16 (so the products are exact in f32).
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let v = ((i * 7 + seed * 13) % 29) as f32 - 14.0;
            bf16::from_f32(v / 16.0).to_f32()
        })
        .collect()
}

fn geom(
    b: usize,
    c: usize,
    (h, w): (usize, usize),
    (k, stride): (usize, usize),
    padding: usize,
) -> Geom {
    Geom {
        b,
        c,
        h,
        w,
        k,
        stride,
        padding,
        oh: (h + 2 * padding - k) / stride + 1,
        ow: (w + 2 * padding - k) / stride + 1,
    }
}

/// `y[b][co][i][j] = Σ x[b][ch][s·i + kh − p][s·j + kw − p] · w[co][ch][kh][kw]` in f64.
fn reference(x: &[f32], w: &[f32], g: &Geom, c_out: usize) -> Vec<f64> {
    let (c, k, p, st) = (g.c, g.k, g.padding as isize, g.stride as isize);
    let mut y = vec![0f64; g.b * c_out * g.oh * g.ow];
    for b in 0..g.b {
        for co in 0..c_out {
            for i in 0..g.oh {
                for j in 0..g.ow {
                    let mut s = 0f64;
                    for ch in 0..c {
                        for kh in 0..k {
                            for kw in 0..k {
                                let (ii, jj) = (
                                    st * i as isize + kh as isize - p,
                                    st * j as isize + kw as isize - p,
                                );
                                if ii < 0 || jj < 0 || ii >= g.h as isize || jj >= g.w as isize {
                                    continue;
                                }
                                let xv = x[((b * c + ch) * g.h + ii as usize) * g.w + jj as usize];
                                s +=
                                    f64::from(xv) * f64::from(w[((co * c + ch) * k + kh) * k + kw]);
                            }
                        }
                    }
                    y[((b * c_out + co) * g.oh + i) * g.ow + j] = s;
                }
            }
        }
    }
    y
}

/// The shapes: 3×3 with and without padding, 1×1, 5×5; images from 2×2 (more padding than
/// image) to 12×12, one sample or several chunks' worth (5 samples of 12×12: chunks of 3 and 2);
/// strides 2 and 3 over phases: 3×3 on even and odd images with and without padding, ResNet's
/// 1×1 stride-2 shortcut (one phase, pixels no tap reads), 5×5, stride 3 (nine phases), a batch
/// in several chunks (12 samples of 12×12); small images whose output rows are copied out of
/// the grid (4×4 on 5×5 cells, 24 samples: chunks of 20 and 4; 2×2, and the 4×4 outputs of
/// 8×8 at stride 2); and output rows of more than 16 values (20×20: two registers a row in
/// the compact kernel gradient).
/// `(samples, channels in, channels out, image, (kernel side, stride), padding)`.
type Case = (usize, usize, usize, (usize, usize), (usize, usize), usize);

const CASES: [Case; 16] = [
    (2, 32, 32, (6, 6), (3, 1), 1),
    (5, 32, 32, (12, 12), (3, 1), 1),
    (3, 64, 32, (9, 7), (3, 1), 1),
    (2, 32, 64, (5, 5), (3, 1), 0),
    (1, 32, 32, (4, 4), (1, 1), 0),
    (2, 32, 32, (2, 2), (3, 1), 1),
    (2, 32, 32, (7, 6), (5, 1), 2),
    (3, 32, 64, (8, 8), (3, 2), 1),
    (2, 32, 32, (7, 9), (3, 2), 1),
    (2, 32, 32, (9, 6), (1, 2), 0),
    (2, 64, 32, (6, 7), (3, 2), 0),
    (2, 32, 32, (9, 8), (5, 2), 2),
    (1, 32, 32, (10, 10), (3, 3), 1),
    (12, 32, 32, (12, 12), (3, 2), 1),
    (24, 32, 64, (4, 4), (3, 1), 1),
    (1, 32, 32, (20, 20), (3, 1), 1),
];

fn close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1f64, |m, v| m.max(v.abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        // Exact products, f32 sums in another order: a few ulps of the largest value.
        assert!(
            (f64::from(g) - w).abs() <= 1e-5 * scale,
            "{what} at {i}: {g} vs {w}"
        );
    }
}

/// The bf16 units this CPU has, each of which the tests run the products on; none, with a note,
/// on a CPU without one.
fn units() -> Vec<Bf16Path> {
    let units: Vec<Bf16Path> = [Bf16Path::Amx, Bf16Path::Avx512Bf16]
        .into_iter()
        .filter(|u| u.available() && layouts_available())
        .collect();
    if units.is_empty() {
        eprintln!("tile_conv: not run, this CPU has neither AMX nor AVX512-BF16");
    }
    units
}

#[test]
fn forward_and_gradients_match_a_direct_convolution_of_the_bf16_values() {
    for unit in units() {
        with_tile_unit(unit, || forward_and_gradients(unit.name()));
    }
}

fn forward_and_gradients(unit: &str) {
    for (b, c, c_out, (h, w), (k, st), p) in CASES {
        let g = geom(b, c, (h, w), (k, st), p);
        assert!(shape_fits(&g, c_out), "b{b} c{c} k{k} s{st}: not taken");
        let what = format!("{unit}: b{b} c{c}->{c_out} {h}x{w} k{k} s{st} p{p}");
        let x = values(b * c * h * w, 1);
        let wt = values(c_out * c * k * k, 2);
        let bias = values(c_out, 3);
        let layout = Layout::contiguous((b, c, h, w));
        let y = forward((&x, &layout), &g, &wt, Some(&bias), false).expect("forward");
        let mut want = reference(&x, &wt, &g, c_out);
        let plane = g.oh * g.ow;
        for (i, v) in want.iter_mut().enumerate() {
            *v += f64::from(bias[i / plane % c_out]);
        }
        close(&y, &want, &format!("{what}: forward"));
        let relu = forward((&x, &layout), &g, &wt, Some(&bias), true).expect("forward");
        let want_relu: Vec<f64> = want.iter().map(|v| v.max(0.0)).collect();
        close(&relu, &want_relu, &format!("{what}: forward + ReLU"));

        // Gradients of L = Σ y ⊙ dy: dx[b][ch][i][j] = Σ dy · w, dw[co][ch][kh][kw] = Σ dy · x.
        let dy = values(y.len(), 4);
        let mut out = Vec::new();
        backward((&x, &layout), &wt, &g, &dy, (true, true), &mut out).expect("backward");
        let (dx, dw) = out.split_at(x.len());
        let (mut want_dx, mut want_dw) = (vec![0f64; x.len()], vec![0f64; wt.len()]);
        let pi = p as isize;
        for bb in 0..b {
            for co in 0..c_out {
                for i in 0..g.oh {
                    for j in 0..g.ow {
                        let d = f64::from(dy[((bb * c_out + co) * g.oh + i) * g.ow + j]);
                        for ch in 0..c {
                            for kh in 0..k {
                                for kw in 0..k {
                                    let (ii, jj) =
                                        ((st * i + kh) as isize - pi, (st * j + kw) as isize - pi);
                                    if ii < 0 || jj < 0 || ii >= h as isize || jj >= w as isize {
                                        continue;
                                    }
                                    let xi = ((bb * c + ch) * h + ii as usize) * w + jj as usize;
                                    let wi = ((co * c + ch) * k + kh) * k + kw;
                                    want_dx[xi] += d * f64::from(wt[wi]);
                                    want_dw[wi] += d * f64::from(x[xi]);
                                }
                            }
                        }
                    }
                }
            }
        }
        close(dx, &want_dx, &format!("{what}: input gradient"));
        close(dw, &want_dw, &format!("{what}: kernel gradient"));
        // The compact form wherever it fits, whether or not `backward` takes it here.
        if compact::fits(&g) {
            let acc = compact::tap_grads(&x, &g, &dy, c_out);
            let mut dwc = Vec::new();
            dw_from_taps(&acc, (c, c_out, k * k), &mut dwc);
            close(&dwc, &want_dw, &format!("{what}: compact kernel gradient"));
        }
        // Only the kernel's gradient asked for: that alone.
        let mut only_w = Vec::new();
        backward((&x, &layout), &wt, &g, &dy, (false, true), &mut only_w).expect("backward");
        close(&only_w, &want_dw, &format!("{what}: kernel gradient alone"));
    }
}

#[test]
fn small_images_take_the_compact_kernel_gradient_and_large_ones_the_grid() {
    let fits = |(b, c, _, (h, w), (k, st), p): Case| compact::fits(&geom(b, c, (h, w), (k, st), p));
    assert!(
        CASES.iter().filter(|&&case| fits(case)).count() >= 10,
        "the cases try the compact form"
    );
    // ResNet-18's stages on 28 × 28 input: 4 × 4 and 7 × 7 (stride 1), and the 5 × 5 phase
    // images of the last stride-2 layer, waste enough of the grid's products; 28 × 28 does not.
    let resnet = |c, side, stride| geom(32, c, (side, side), (3, stride), 1);
    assert!(compact::pays(&resnet(512, 4, 1), 5 * 5));
    assert!(compact::pays(&resnet(256, 7, 1), 8 * 8));
    assert!(compact::pays(&resnet(256, 7, 2), 5 * 5));
    assert!(!compact::pays(&resnet(64, 28, 1), 29 * 29));
    // A strided 3×3 layer takes it wherever it fits (its phases cost a layout per phase), even
    // on 15 × 15 phase cells for 14 × 14 outputs; the 1×1 shortcut only for the waste.
    assert!(compact::pays_strided(&resnet(64, 28, 2), 15 * 15));
    assert!(!compact::pays(&resnet(64, 28, 2), 15 * 15));
    assert!(!compact::pays_strided(
        &geom(32, 64, (28, 28), (1, 2), 0),
        14 * 14
    ));
    // A row too wide for two registers keeps the grid.
    assert!(!compact::fits(&resnet(32, 40, 1)));
}

#[test]
fn operands_are_rounded_to_bf16_not_truncated() {
    for unit in units() {
        with_tile_unit(unit, rounded_not_truncated);
    }
}

fn rounded_not_truncated() {
    // 1 + 2⁻⁸ + 2⁻¹⁰ lies above the midpoint between the bf16 values 1 and 1 + 2⁻⁷: it rounds
    // up to 1 + 2⁻⁷, where truncation would give 1.
    let g = geom(1, 32, (1, 1), (1, 1), 0);
    let x = vec![1.0 + 2f32.powi(-8) + 2f32.powi(-10); 32];
    let mut w = vec![0f32; 32 * 32];
    w[0] = 1.0;
    let y = forward(
        (&x, &Layout::contiguous((1, 32, 1, 1))),
        &g,
        &w,
        None,
        false,
    )
    .expect("forward");
    assert_eq!(y[0], 1.0 + 2f32.powi(-7));
}
