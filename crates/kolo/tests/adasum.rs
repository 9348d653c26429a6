//! Adasum all-reduce: against a sequential reference of the formula over the same binary tree, its
//! defining properties, bit-identical results on every rank, and its errors (non-power-of-two groups,
//! bad layer lengths, ranks that cut the buffer differently) — on every transport.

mod common;

use std::time::{Duration, Instant};

use common::{spawn, Kind, KINDS};
use kolo::prelude::*;
use kolo::AdasumFloat;

fn quick() -> Config {
    Config::default().with_timeout(Duration::from_secs(5))
}

/// A small deterministic generator (splitmix64), values in [-1, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

/// Each rank's gradient: a direction shared by all ranks plus its own noise, so that dot products
/// are far from zero and Adasum differs clearly from a sum.
fn gradients(n: usize, len: usize, seed: u64) -> Vec<Vec<f64>> {
    let mut common = Rng(seed);
    let shared: Vec<f64> = (0..len).map(|_| common.next()).collect();
    (0..n)
        .map(|r| {
            let mut rng = Rng(seed ^ (0x1234_5678 * (r as u64 + 1)));
            shared.iter().map(|s| s + 0.7 * rng.next()).collect()
        })
        .collect()
}

/// The formula, written out independently of kolo: per segment,
/// (1 − a·b / (2|a|²)) a + (1 − a·b / (2|b|²)) b, a zero vector leaving the other one.
fn adasum_ref(a: &[f64], b: &[f64], layers: &[usize]) -> Vec<f64> {
    let mut out = Vec::with_capacity(a.len());
    let mut start = 0;
    for &len in layers {
        let (sa, sb) = (&a[start..start + len], &b[start..start + len]);
        let dot: f64 = sa.iter().zip(sb).map(|(x, y)| x * y).sum();
        let na: f64 = sa.iter().map(|x| x * x).sum();
        let nb: f64 = sb.iter().map(|y| y * y).sum();
        for (x, y) in sa.iter().zip(sb) {
            out.push(if na == 0.0 {
                *y
            } else if nb == 0.0 {
                *x
            } else {
                (1.0 - dot / (2.0 * na)) * x + (1.0 - dot / (2.0 * nb)) * y
            });
        }
        start += len;
    }
    out
}

/// Pairwise up the binary tree: (0,1), (2,3), …, then the results pairwise again.
fn tree_ref(inputs: &[Vec<f64>], layers: &[usize]) -> Vec<f64> {
    let mut level = inputs.to_vec();
    while level.len() > 1 {
        level = level
            .chunks(2)
            .map(|p| adasum_ref(&p[0], &p[1], layers))
            .collect();
    }
    level.remove(0)
}

/// Largest element difference relative to the largest reference element.
fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-300);
    got.iter()
        .zip(want)
        .fold(0.0f64, |m, (g, w)| m.max((g - w).abs()))
        / scale
}

/// Runs Adasum over `n` ranks of `kind` on each rank's `inputs[r]` (converted to `T`); returns each
/// rank's result widened to f64, after checking that every rank's bits are the same.
fn run_adasum<T: AdasumFloat>(
    kind: Kind,
    n: usize,
    inputs: &[Vec<f64>],
    layers: &[usize],
) -> Vec<f64> {
    let results = spawn(kind, n, quick(), |comm| {
        let mut buf: Vec<T> = inputs[comm.rank()]
            .iter()
            .map(|x| T::from_f64(*x))
            .collect();
        comm.all_reduce_adasum(&mut buf, layers).map(|()| buf)
    });
    let results: Vec<Vec<T>> = results
        .into_iter()
        .enumerate()
        .map(|(r, x)| x.unwrap_or_else(|e| panic!("{kind:?} n={n}: rank {r}: {e}")))
        .collect();
    for (r, res) in results.iter().enumerate() {
        let same = res
            .iter()
            .zip(&results[0])
            .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits());
        assert!(
            same && res.len() == results[0].len(),
            "{kind:?} n={n}: rank {r} differs from rank 0"
        );
    }
    results[0].iter().map(|x| x.to_f64()).collect()
}

/// Small enough for recursive doubling.
const LAYERS: [usize; 6] = [5, 0, 17, 1, 40, 3];
/// Over 32 KiB in f32 and f64: vector halving from four ranks, with layers that straddle the ranks'
/// slices.
const BIG_LAYERS: [usize; 7] = [1, 4095, 0, 3000, 7, 2000, 13];

/// Every transport with both layer sets.
fn cases() -> impl Iterator<Item = (Kind, &'static [usize])> {
    KINDS
        .into_iter()
        .flat_map(|k| [(k, &LAYERS[..]), (k, &BIG_LAYERS[..])])
}

#[test]
fn matches_the_sequential_tree_in_f64_and_f32() {
    for (kind, layers) in cases() {
        let len: usize = layers.iter().sum();
        for n in [1, 2, 4, 8] {
            let inputs = gradients(n, len, 7 + n as u64);
            let want = tree_ref(&inputs, layers);
            if n > 1 {
                // The check can fail: Adasum is far from both the sum and the average here.
                let sum: Vec<f64> = (0..len)
                    .map(|i| inputs.iter().map(|v| v[i]).sum())
                    .collect();
                let avg: Vec<f64> = sum.iter().map(|s| s / n as f64).collect();
                assert!(rel_err(&sum, &want) > 0.05 && rel_err(&avg, &want) > 0.05);
            }
            let got = run_adasum::<f64>(kind, n, &inputs, layers);
            let e = rel_err(&got, &want);
            assert!(e <= 1e-12, "{kind:?} n={n} f64: relative error {e}");

            // f32: the reference runs on the same f32-rounded inputs, in f64.
            let rounded: Vec<Vec<f64>> = inputs
                .iter()
                .map(|v| v.iter().map(|x| f64::from(*x as f32)).collect())
                .collect();
            let want32 = tree_ref(&rounded, layers);
            let got = run_adasum::<f32>(kind, n, &inputs, layers);
            let e = rel_err(&got, &want32);
            assert!(e <= 1e-5, "{kind:?} n={n} f32: relative error {e}");
        }
    }
}

#[test]
fn one_segment_differs_from_per_layer() {
    // The layer boundaries matter: the whole-buffer form is the one-segment reference, not the
    // per-layer one.
    let len: usize = LAYERS.iter().sum();
    let inputs = gradients(4, len, 99);
    let results = spawn(Kind::Local, 4, quick(), |comm| {
        let mut buf = inputs[comm.rank()].clone();
        comm.all_reduce_adasum_whole(&mut buf).map(|()| buf)
    });
    let whole = tree_ref(&inputs, &[len]);
    let per_layer = tree_ref(&inputs, &LAYERS);
    assert!(rel_err(&whole, &per_layer) > 1e-3);
    for r in results {
        let got = r.expect("adasum");
        assert!(rel_err(&got, &whole) <= 1e-12);
    }
}

#[test]
fn large_buffer_in_two_layers() {
    let layers = [100_000, 150_001];
    let len = layers.iter().sum();
    let inputs = gradients(4, len, 3);
    let want = tree_ref(&inputs, &layers);
    for kind in KINDS {
        let got = run_adasum::<f32>(kind, 4, &inputs, &layers);
        let e = rel_err(&got, &want);
        assert!(e <= 1e-5, "{kind:?}: relative error {e}");
    }
}

#[test]
fn identical_gradients_come_back_unchanged() {
    for (kind, layers) in cases() {
        let len: usize = layers.iter().sum();
        let g = gradients(1, len, 5).remove(0);
        for n in [2, 4, 8] {
            let inputs = vec![g.clone(); n];
            let got = run_adasum::<f64>(kind, n, &inputs, layers);
            // Not n times it: a·b = |a|² makes both coefficients exactly ½.
            assert_eq!(got, g, "{kind:?} n={n}");
        }
    }
}

#[test]
fn orthogonal_gradients_add() {
    // Rank r is non-zero only at positions ≡ r (mod n): pairwise orthogonal in every segment, and so
    // are the partial results up the tree.
    for (kind, layers) in cases() {
        for n in [2, 4, 8] {
            let len: usize = layers.iter().sum();
            let inputs: Vec<Vec<f64>> = (0..n)
                .map(|r| {
                    (0..len)
                        .map(|i| {
                            if i % n == r {
                                1.0 + (i as f64) * 0.5
                            } else {
                                0.0
                            }
                        })
                        .collect()
                })
                .collect();
            let sum: Vec<f64> = (0..len)
                .map(|i| inputs.iter().map(|v| v[i]).sum())
                .collect();
            let got = run_adasum::<f64>(kind, n, &inputs, layers);
            assert_eq!(got, sum, "{kind:?} n={n}");
        }
    }
}

#[test]
fn async_form_matches_blocking() {
    let len: usize = LAYERS.iter().sum();
    let inputs = gradients(4, len, 11);
    let want = tree_ref(&inputs, &LAYERS);
    let results = spawn(Kind::Local, 4, quick(), |comm| {
        comm.all_reduce_adasum_async(inputs[comm.rank()].clone(), LAYERS.to_vec())
            .wait()
    });
    for r in results {
        let got = r.expect("adasum async");
        assert!(rel_err(&got, &want) <= 1e-12);
    }
}

#[test]
fn non_power_of_two_is_refused_on_every_rank() {
    for kind in [Kind::Local, Kind::Shm] {
        for n in [3, 5, 6] {
            let t = Instant::now();
            let results = spawn(kind, n, quick(), |comm| {
                let mut buf = vec![1.0f32; 8];
                let e = comm.all_reduce_adasum(&mut buf, &[8]);
                // The communicator is still usable afterwards: fall back to an average.
                let fallback = comm.all_reduce(&mut buf, ReduceOp::Avg).map(|()| buf);
                (e, fallback)
            });
            assert!(t.elapsed() < Duration::from_secs(3), "{kind:?} n={n}");
            for (r, (e, fallback)) in results.into_iter().enumerate() {
                match e {
                    Err(Error::Unsupported { what }) => assert!(
                        what.contains(&format!("{n} ranks")) && what.contains("power-of-two"),
                        "{what}"
                    ),
                    other => panic!("{kind:?} n={n} rank {r}: {other:?}"),
                }
                assert_eq!(fallback.expect("fallback all_reduce"), vec![1.0f32; 8]);
            }
        }
    }
}

fn is_layers_error(e: &Error) -> bool {
    matches!(e, Error::InvalidArgument { arg: "layers", .. })
}

#[test]
fn bad_layer_lengths_are_an_error() {
    for kind in [Kind::Local, Kind::Shm] {
        // On every rank: each names `layers`.
        for layers in [vec![3, 4], vec![], vec![usize::MAX, 2]] {
            let results = spawn(kind, 2, quick(), |comm| {
                let mut buf = vec![1.0f64; 8];
                comm.all_reduce_adasum(&mut buf, &layers)
            });
            for r in results {
                let e = r.expect_err("bad layers accepted");
                assert!(is_layers_error(&e), "{kind:?} {layers:?}: {e}");
            }
        }
        // On one rank: it names `layers`, the others fail too instead of waiting.
        let t = Instant::now();
        let results = spawn(kind, 4, quick(), |comm| {
            let mut buf = vec![1.0f64; 8];
            let layers = if comm.rank() == 2 {
                vec![4, 5]
            } else {
                vec![4, 4]
            };
            comm.all_reduce_adasum(&mut buf, &layers)
        });
        assert!(t.elapsed() < Duration::from_secs(4), "{kind:?}");
        for (r, res) in results.into_iter().enumerate() {
            let e = res.expect_err("a rank succeeded");
            if r == 2 {
                assert!(is_layers_error(&e), "{kind:?}: {e}");
            }
        }
    }
}

#[test]
fn different_layer_cuts_are_a_mismatch() {
    for kind in KINDS {
        let t = Instant::now();
        let results = spawn(kind, 2, quick(), |comm| {
            let mut buf = vec![1.0f64; 8];
            let layers = if comm.rank() == 0 { [4, 4] } else { [2, 6] };
            comm.all_reduce_adasum(&mut buf, &layers)
        });
        assert!(t.elapsed() < Duration::from_secs(4), "{kind:?}");
        let mut mismatch = false;
        for res in results {
            let e = res.expect_err("mismatched layers accepted");
            mismatch |= matches!(e.root_cause(), Error::Mismatch { .. })
                || e.to_string().contains("collective mismatch");
        }
        assert!(mismatch, "{kind:?}: no rank reported the mismatch");
    }
}

#[test]
fn an_average_on_one_rank_is_a_mismatch() {
    // Adasum on one rank and an ordinary all-reduce on the other: caught by the fingerprint.
    let results = spawn(Kind::Local, 2, quick(), |comm| {
        let mut buf = vec![1.0f32; 8];
        if comm.rank() == 0 {
            comm.all_reduce_adasum(&mut buf, &[8])
        } else {
            comm.all_reduce(&mut buf, ReduceOp::Avg)
        }
    });
    for res in results {
        let e = res.expect_err("mixed calls accepted");
        assert!(
            e.to_string().contains("all_reduce_adasum"),
            "error does not name the call: {e}"
        );
    }
}
