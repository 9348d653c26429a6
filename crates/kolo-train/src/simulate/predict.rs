//! Predicted step time of data-parallel training at N ranks: a [`Profile`] on a [`Cluster`].
//!
//! One step is `other + forward + scalar all-reduces + max(backward, last bucket's all-reduce) +
//! optimizer`, with compute (and the reduction cost γ) slowed down by the node's oversubscription,
//! bucket all-reduces timed by [`kolo_collectives::cost`] and scheduled by [`overlap::simulate`].
//! Ranks synchronize every step, so each waits for the slowest: with step-to-step jitter of standard
//! deviation σ (the profile's `step_sd_s`), the step grows by σ·E[max of N standard normals]
//! ([`expected_max_normal`]), reported as part of the exposed time.
//! On an oversubscribed node (more ranks × threads than cores) every blocking synchronization (each
//! bucket all-reduce and scalar all-reduce) lets the `local − 1` ranks that wait busy-wait for up to
//! `spin_s`, taking that CPU time from the ranks they wait for: `syncs × (local − 1) × spin / cores`
//! per step, also reported as exposed time.
//! Per-rank batch is fixed (weak scaling): the scaling efficiency at N is `step(1) / step(N)`.

use kolo::{Algorithm, OpKind};
use kolo_collectives::cost::{self, Link};
use kolo_collectives::select::{self, Group, Hosts, Overrides};

use super::cluster::{AlgoChoice, Cluster};
use super::error::SimError;
use super::overlap;
use super::profile::Profile;
use kolo_ddp::ddp::BucketLayout;

/// The prediction for one world size.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    /// Ranks.
    pub ranks: usize,
    /// Nodes they occupy.
    pub nodes: usize,
    /// Predicted seconds per step.
    pub step_s: f64,
    /// Compute seconds per step (oversubscription included).
    pub compute_s: f64,
    /// Seconds of bucket all-reduces (hidden or not) plus the scalar all-reduces.
    pub comm_s: f64,
    /// Communication seconds not hidden behind compute.
    pub exposed_s: f64,
    /// Samples per second over all ranks.
    pub samples_per_s: f64,
    /// `step(1) / step(N)`, filled in by [`predict_all`] (1 for a single prediction at N = 1).
    pub efficiency: f64,
    /// Buckets per step.
    pub buckets: usize,
    /// Algorithm of the largest bucket.
    pub algorithm: String,
}

/// Seconds one all-reduce of `count` elements of `elem` bytes takes over `n` ranks on `nodes` nodes
/// of `local` ranks, and the algorithm's name.
pub fn all_reduce_time(
    cluster: &Cluster,
    count: usize,
    elem: usize,
    n: usize,
    nodes: usize,
    local: usize,
    gamma: f64,
) -> (f64, &'static str) {
    if n <= 1 {
        return (0.0, "none");
    }
    let bytes = (count * elem) as f64;
    // Flat schedules over several nodes run at the pace of the slower link.
    let link: Link = if nodes > 1 {
        cluster.inter.unwrap_or(cluster.intra)
    } else {
        cluster.intra
    };
    let flat = |a: Algorithm| cost::all_reduce(a, bytes, n, &link, gamma).unwrap_or(0.0);
    let hier =
        |inter: &Link| cost::hierarchical(count, elem, local, nodes, &cluster.intra, inter, gamma);
    match cluster.algorithm {
        AlgoChoice::Ring => (flat(Algorithm::Ring), "ring"),
        AlgoChoice::HalvingDoubling => (flat(Algorithm::HalvingDoubling), "halving-doubling"),
        AlgoChoice::RecursiveDoubling => (flat(Algorithm::RecursiveDoubling), "recursive-doubling"),
        AlgoChoice::Tree => (flat(Algorithm::BinomialTree), "tree"),
        AlgoChoice::Shm => (flat(Algorithm::Shm), "shm"),
        AlgoChoice::Hierarchical => match (nodes > 1 && local > 1, cluster.inter) {
            (true, Some(inter)) => (hier(&inter), "hierarchical"),
            _ => auto_flat(count, elem, n, &link, gamma),
        },
        AlgoChoice::Auto => {
            // kolo's own choice: shared memory needs one node, hierarchical an inter-node link.
            let hosts = match cluster.inter {
                Some(_) if nodes > 1 && local > 1 => Some(Hosts {
                    local,
                    count: nodes,
                }),
                _ => None,
            };
            let group = Group {
                size: n,
                engine: false,
                arena: nodes == 1 && cluster.shared_memory,
                hosts,
            };
            let ov = Overrides::default();
            match (
                select::choose(OpKind::AllReduce, count, elem, &group, &ov),
                cluster.inter,
            ) {
                (Algorithm::Shm, _) => (flat(Algorithm::Shm), "shm"),
                (Algorithm::Hierarchical, Some(inter)) => (hier(&inter), "hierarchical"),
                _ => auto_flat(count, elem, n, &link, gamma),
            }
        }
    }
}

fn auto_flat(count: usize, elem: usize, n: usize, link: &Link, gamma: f64) -> (f64, &'static str) {
    let (a, t) = cost::all_reduce_auto(count, elem, n, &Overrides::default(), link, gamma);
    let name = match a {
        Algorithm::Ring => "ring",
        Algorithm::HalvingDoubling => "halving-doubling",
        Algorithm::RecursiveDoubling => "recursive-doubling",
        Algorithm::BinomialTree => "tree",
        _ => "other",
    };
    (t, name)
}

/// The buckets Ddp sends: a first bucket of at most `DdpOptions::first_bucket_bytes`, filled in
/// reverse parameter order, and with overlap re-laid in the order the gradients arrive (the
/// profile's `ready_s`), as Ddp re-lays them after its first step.
fn ddp_layout(profile: &Profile, numels: &[usize], elem: usize, cluster: &Cluster) -> BucketLayout {
    let mut order: Vec<usize> = (0..numels.len()).rev().collect();
    if cluster.overlap {
        // A stable sort: parameters ready at once keep the reverse order.
        order.sort_by(|&a, &b| {
            profile.params[a]
                .ready_s
                .total_cmp(&profile.params[b].ready_s)
        });
    }
    let first = kolo_ddp::ddp::DdpOptions::default().first_bucket_bytes;
    BucketLayout::in_order(&order, numels, elem, first, cluster.bucket_bytes)
}

/// Predicts the step at `n` ranks (efficiency left at 1; see [`predict_all`]).
pub fn predict(profile: &Profile, cluster: &Cluster, n: usize) -> Result<Prediction, SimError> {
    profile.validate()?;
    let (nodes, local) = cluster.placement(n)?;
    let slow = cluster.oversubscription(local);
    let gamma = cluster.gamma_s_per_byte.unwrap_or(profile.gamma_s_per_byte) * slow;
    let elem = profile.elem_bytes;
    let numels: Vec<usize> = profile.params.iter().map(|p| p.numel).collect();
    let layout = ddp_layout(profile, &numels, elem, cluster);
    let backward = profile.backward_s * slow;
    let mut ready = Vec::with_capacity(layout.count());
    let mut costs = Vec::with_capacity(layout.count());
    let (mut biggest, mut algorithm) = (0usize, "none");
    for (b, members) in layout.buckets.iter().enumerate() {
        let r = members
            .iter()
            .filter_map(|&p| profile.params.get(p))
            .map(|p| p.ready_s * slow)
            .fold(0.0f64, f64::max);
        let count = layout.len.get(b).copied().unwrap_or(0);
        let (t, name) = all_reduce_time(cluster, count, elem, n, nodes, local, gamma);
        if count >= biggest {
            biggest = count;
            algorithm = name;
        }
        ready.push(r);
        costs.push(t);
    }
    let tl = overlap::simulate(&ready, &costs, backward, cluster.overlap);
    let scalar =
        cluster.scalar_allreduces as f64 * all_reduce_time(cluster, 1, 8, n, nodes, local, gamma).0;
    let compute_s = profile.compute_s() * slow;
    let straggler = profile.step_sd_s * slow * expected_max_normal(n);
    let spinning = match cluster.cores_per_node {
        Some(cores) if slow > 1.0 => {
            let syncs = (cluster.scalar_allreduces + layout.count()) as f64;
            syncs * (local - 1) as f64 * cluster.spin_s / cores as f64
        }
        _ => 0.0,
    };
    let straggler = straggler + spinning;
    let step_s = compute_s + scalar + straggler + tl.exposed;
    Ok(Prediction {
        ranks: n,
        nodes,
        step_s,
        compute_s,
        comm_s: tl.comm_total + scalar,
        exposed_s: tl.exposed + scalar + straggler,
        samples_per_s: (profile.batch * n) as f64 / step_s.max(1e-12),
        efficiency: 1.0,
        buckets: layout.count(),
        algorithm: algorithm.to_string(),
    })
}

/// E[max of `n` independent standard normals]: 0 for one, 0.564 for two, 1.029 for four, 1.424 for
/// eight (Blom's approximation Φ⁻¹((n − 0.375) / (n + 0.25)) beyond the table).
pub fn expected_max_normal(n: usize) -> f64 {
    const EXACT: [f64; 9] = [
        0.0, 0.0, 0.5642, 0.8463, 1.0294, 1.1630, 1.2672, 1.3522, 1.4236,
    ];
    if let Some(&e) = EXACT.get(n) {
        return e;
    }
    // Φ⁻¹ by bisection on the error function's series-free approximation (Abramowitz-Stegun 7.1.26).
    let p = (n as f64 - 0.375) / (n as f64 + 0.25);
    let phi = |x: f64| {
        let t = 1.0 / (1.0 + 0.327_591_1 * x / std::f64::consts::SQRT_2);
        let poly = t
            * (0.254_829_592
                + t * (-0.284_496_736
                    + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
        1.0 - 0.5 * poly * (-(x * x) / 2.0).exp()
    };
    let (mut lo, mut hi) = (0.0f64, 8.0f64);
    for _ in 0..60 {
        let mid = (lo + hi) / 2.0;
        if phi(mid) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
}

/// Predicts every world size in `ranks`, with scaling efficiency against one rank.
pub fn predict_all(
    profile: &Profile,
    cluster: &Cluster,
    ranks: &[usize],
) -> Result<Vec<Prediction>, SimError> {
    let base = predict(profile, cluster, 1)?.step_s;
    ranks
        .iter()
        .map(|&n| {
            let mut p = predict(profile, cluster, n)?;
            p.efficiency = base / p.step_s.max(1e-12);
            Ok(p)
        })
        .collect()
}
