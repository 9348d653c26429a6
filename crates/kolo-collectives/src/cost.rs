//! α-β-γ costs of kolo's all-reduce algorithms: the time a collective takes on a link of latency α
//! (seconds per message), inverse bandwidth β (seconds per byte) and reduction cost γ (seconds per
//! byte reduced).
//!
//! These are the formulas behind [`select`]'s thresholds (recursive doubling has the
//! fewest rounds, halving-doubling logarithmic rounds with ring-like bandwidth, ring the least
//! bandwidth), and what `kolo simulate` charges for each bucket. [`all_reduce_auto`] costs the
//! algorithm [`select::all_reduce`] picks, so the simulator and the
//! library agree on which algorithm runs.
//!
//! For `S` bytes over `n` ranks (`p` the largest power of two ≤ `n`, `r = n − p` extra ranks):
//!
//! | algorithm | cost |
//! |---|---|
//! | ring (reduce-scatter + all-gather) | 2(n−1)α + 2(n−1)/n·Sβ + (n−1)/n·Sγ |
//! | halving-doubling (Rabenseifner) | 2 log₂p·α + 2(p−1)/p·Sβ + (p−1)/p·Sγ, + fold |
//! | recursive doubling | log₂p·(α + Sβ + Sγ), + fold |
//! | binomial tree (reduce + broadcast) | 2⌈log₂n⌉(α + Sβ) + ⌈log₂n⌉·Sγ |
//! | shared memory (one host) | 2α + (2n−1)/n·Sβ + (n−1)/n·Sγ |
//! | hierarchical (l per host, h hosts) | intra ring reduce-scatter + inter all-reduce of S/l + intra ring all-gather |
//!
//! The fold of the `r` extra ranks (`r > 0`) costs 2(α + Sβ) + Sγ: the extra rank sends its buffer to
//! a partner before and receives the result after.

use kolo_core::Algorithm;

use crate::select::{self, Overrides};

/// A link: latency and inverse bandwidth.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Seconds per message (α).
    pub alpha: f64,
    /// Seconds per byte (β = 1 / bandwidth).
    pub beta: f64,
}

impl Link {
    /// A link of `latency` seconds and `bytes_per_second` bandwidth.
    pub fn new(latency: f64, bytes_per_second: f64) -> Link {
        Link {
            alpha: latency,
            beta: 1.0 / bytes_per_second,
        }
    }

    /// Time of one message of `bytes`: α + bytes·β.
    pub fn message(&self, bytes: f64) -> f64 {
        self.alpha + bytes * self.beta
    }
}

fn log2_floor(n: usize) -> u32 {
    usize::BITS - 1 - n.leading_zeros()
}

/// The fold of ranks beyond the largest power of two, if any: 2(α + Sβ) + Sγ.
fn fold(bytes: f64, n: usize, link: &Link, gamma: f64) -> f64 {
    if n.is_power_of_two() {
        0.0
    } else {
        2.0 * link.message(bytes) + bytes * gamma
    }
}

/// Ring reduce-scatter of `bytes` (the whole buffer) over `n` ranks: (n−1)(α + S/n·β + S/n·γ).
pub fn reduce_scatter_ring(bytes: f64, n: usize, link: &Link, gamma: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let k = (n - 1) as f64;
    let chunk = bytes / n as f64;
    k * (link.message(chunk) + chunk * gamma)
}

/// Ring all-gather to `bytes` (the whole result) over `n` ranks: (n−1)(α + S/n·β).
pub fn all_gather_ring(bytes: f64, n: usize, link: &Link) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    (n - 1) as f64 * link.message(bytes / n as f64)
}

/// Seconds an all-reduce of `bytes` over `n` ranks takes with `algo` on `link`, reducing at `gamma`
/// seconds per byte; `None` for an algorithm that is not an all-reduce schedule of one level
/// (see [`hierarchical`] for [`Algorithm::Hierarchical`]).
pub fn all_reduce(algo: Algorithm, bytes: f64, n: usize, link: &Link, gamma: f64) -> Option<f64> {
    if n <= 1 {
        return Some(0.0);
    }
    let nf = n as f64;
    let p = 1usize << log2_floor(n);
    let pf = p as f64;
    let rounds = f64::from(log2_floor(n));
    Some(match algo {
        Algorithm::Direct => 0.0,
        Algorithm::Ring => {
            reduce_scatter_ring(bytes, n, link, gamma) + all_gather_ring(bytes, n, link)
        }
        Algorithm::HalvingDoubling => {
            2.0 * rounds * link.alpha
                + 2.0 * (pf - 1.0) / pf * bytes * link.beta
                + (pf - 1.0) / pf * bytes * gamma
                + fold(bytes, n, link, gamma)
        }
        Algorithm::RecursiveDoubling => {
            rounds * (link.message(bytes) + bytes * gamma) + fold(bytes, n, link, gamma)
        }
        Algorithm::BinomialTree => {
            let depth = f64::from(n.next_power_of_two().trailing_zeros());
            2.0 * depth * link.message(bytes) + depth * bytes * gamma
        }
        Algorithm::Shm => {
            2.0 * link.alpha
                + (2.0 * nf - 1.0) / nf * bytes * link.beta
                + (nf - 1.0) / nf * bytes * gamma
        }
        _ => return None,
    })
}

/// The algorithm [`select::all_reduce`] picks for `count` elements of `elem` bytes over `n` ranks, and
/// its cost on `link`.
pub fn all_reduce_auto(
    count: usize,
    elem: usize,
    n: usize,
    ov: &Overrides,
    link: &Link,
    gamma: f64,
) -> (Algorithm, f64) {
    let algo = select::all_reduce(count, elem, n, ov);
    let bytes = (count * elem) as f64;
    // `select` only returns one-level schedules, all of which have a cost.
    (algo, all_reduce(algo, bytes, n, link, gamma).unwrap_or(0.0))
}

/// Hierarchical all-reduce of `count` elements of `elem` bytes over `hosts` hosts of `local` ranks
/// (kolo's `Algorithm::Hierarchical`): ring reduce-scatter inside each host on `intra`, all-reduce of
/// each `1/local` shard across hosts on `inter` (algorithm chosen by [`select::all_reduce`]), ring
/// all-gather inside each host.
pub fn hierarchical(
    count: usize,
    elem: usize,
    local: usize,
    hosts: usize,
    intra: &Link,
    inter: &Link,
    gamma: f64,
) -> f64 {
    let local = local.max(1);
    let per = count.div_ceil(local);
    let padded = (per * local * elem) as f64;
    let (_, cross) = all_reduce_auto(per, elem, hosts, &Overrides::default(), inter, gamma);
    reduce_scatter_ring(padded, local, intra, gamma) + cross + all_gather_ring(padded, local, intra)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1e-9)
    }

    // α = 10 µs, 1 GB/s (β = 1 ns/B), γ = 0.5 ns/B.
    const L: Link = Link {
        alpha: 1e-5,
        beta: 1e-9,
    };
    const G: f64 = 5e-10;

    #[test]
    fn ring_by_hand() {
        // n = 4, S = 4 MB: 6 steps of α + 1 MB·β, plus 3 MB of reduction.
        let t = all_reduce(Algorithm::Ring, 4e6, 4, &L, G).unwrap_or(0.0);
        assert!(close(t, 6.0 * (1e-5 + 1e-3) + 3e6 * 5e-10), "{t}");
    }

    #[test]
    fn halving_doubling_by_hand() {
        // n = 8, S = 8 MB: 2·3 α + 2·7/8·8 MB β + 7/8·8 MB γ.
        let t = all_reduce(Algorithm::HalvingDoubling, 8e6, 8, &L, G).unwrap_or(0.0);
        assert!(close(t, 6e-5 + 14e-3 + 7e6 * 5e-10), "{t}");
        // n = 6 folds two ranks into four: + 2(α + Sβ) + Sγ.
        let t6 = all_reduce(Algorithm::HalvingDoubling, 8e6, 6, &L, G).unwrap_or(0.0);
        let four = 4e-5 + 2.0 * 0.75 * 8e-3 + 0.75 * 8e6 * 5e-10;
        assert!(close(t6, four + 2.0 * (1e-5 + 8e-3) + 8e6 * 5e-10), "{t6}");
    }

    #[test]
    fn recursive_doubling_tree_and_one_rank() {
        let rd = all_reduce(Algorithm::RecursiveDoubling, 1000.0, 4, &L, G).unwrap_or(0.0);
        assert!(close(rd, 2.0 * (1e-5 + 1e-6 + 5e-7)), "{rd}");
        let tree = all_reduce(Algorithm::BinomialTree, 1000.0, 5, &L, G).unwrap_or(0.0);
        assert!(close(tree, 6.0 * (1e-5 + 1e-6) + 3.0 * 5e-7), "{tree}");
        assert_eq!(all_reduce(Algorithm::Ring, 1e9, 1, &L, G), Some(0.0));
        assert_eq!(all_reduce(Algorithm::Pairwise, 1e3, 4, &L, G), None);
    }

    #[test]
    fn auto_costs_what_select_picks() {
        let ov = Overrides::default();
        let (a, t) = all_reduce_auto(100_000, 4, 4, &ov, &L, G);
        assert_eq!(a, Algorithm::HalvingDoubling);
        assert_eq!(Some(t), all_reduce(a, 400_000.0, 4, &L, G));
        // Where select moves from halving-doubling to ring, the ring is no slower at large sizes
        // on a bandwidth-bound link (same β term, the ring pipelines) — and latency-bound sizes
        // favour the logarithmic schedules.
        let (small, _) = all_reduce_auto(10, 4, 8, &ov, &L, G);
        assert_eq!(small, Algorithm::RecursiveDoubling);
        let rd = all_reduce(Algorithm::RecursiveDoubling, 40.0, 8, &L, G).unwrap_or(0.0);
        let ring = all_reduce(Algorithm::Ring, 40.0, 8, &L, G).unwrap_or(0.0);
        assert!(rd < ring);
    }

    #[test]
    fn hierarchical_by_hand() {
        // 2 hosts of 4 ranks, 4 MB (1M f32): intra reduce-scatter and all-gather of 4 MB over 4,
        // inter all-reduce of 1 MB over 2 (ring: select picks ring for two ranks).
        let inter = Link::new(1e-4, 1e8);
        let t = hierarchical(1 << 20, 4, 4, 2, &L, &inter, G);
        let s = f64::from(1u32 << 22);
        let rs = 3.0 * (1e-5 + s / 4.0 * 1e-9 + s / 4.0 * G);
        let ag = 3.0 * (1e-5 + s / 4.0 * 1e-9);
        let shard = s / 4.0;
        let cross = 2.0 * (1e-4 + shard / 2.0 * 1e-8) + shard / 2.0 * G;
        assert!(close(t, rs + ag + cross), "{t} vs {}", rs + ag + cross);
    }
}
