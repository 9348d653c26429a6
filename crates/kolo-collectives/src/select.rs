//! The cost model: which algorithm runs a collective, by message size and world size.
//!
//! The choice depends only on values every rank shares (count, element size, group size and the
//! configured overrides), so every rank picks the same algorithm. The algorithm is part of each call's
//! fingerprint, so ranks configured differently get a mismatch error rather than a hang.
//!
//! All-reduce: recursive doubling below [`SMALL_BYTES`] (fewest rounds), halving-doubling up to
//! [`MEDIUM_BYTES`] when there are at least four ranks (log rounds, near-optimal bandwidth), ring above
//! (optimal bandwidth, segments pipelined).
//!
//! The α-β-γ time of each algorithm is in [`crate::cost`] (what `kolo simulate` charges).
//!
//! Adasum ([`adasum`]): recursive doubling up to [`SMALL_BYTES`], vector halving with distance
//! doubling above, from four ranks.
//!
//! [`choose`] is the whole choice for a communicator's collective: it adds what the group offers
//! beyond messages between its ranks ([`Group`]): a collective engine runs every collective but a
//! forced all-reduce; an automatic all-reduce goes through shared memory on a group with an arena,
//! and hierarchical from [`HIERARCHICAL_MIN_BYTES`] on a group spread evenly over several hosts.

use kolo_core::{Algorithm, Error, OpKind, Result};

/// Up to this many bytes, all-reduce uses recursive doubling.
pub const SMALL_BYTES: usize = 32 * 1024;
/// Up to this many bytes (and from four ranks), all-reduce uses halving-doubling.
pub const MEDIUM_BYTES: usize = 1 << 20;

/// From this size, all-reduce on a world spread over several hosts goes hierarchical.
pub const HIERARCHICAL_MIN_BYTES: usize = 64 * 1024;

/// Algorithms each collective can run, the first being the default.
pub const ALL_REDUCE_ALGOS: &[Algorithm] = &[
    Algorithm::Ring,
    Algorithm::RecursiveDoubling,
    Algorithm::HalvingDoubling,
    Algorithm::BinomialTree,
];

/// Per-collective algorithm overrides (e.g. from `KOLO_ALGO_ALLREDUCE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Forced all-reduce algorithm.
    pub all_reduce: Option<Algorithm>,
}

impl Overrides {
    /// Parses an all-reduce algorithm name, as the `KOLO_ALGO_ALLREDUCE` variable holds it.
    pub fn parse_all_reduce(var: &str, value: &str) -> Result<Algorithm> {
        Algorithm::from_name(value)
            .filter(|a| ALL_REDUCE_ALGOS.contains(a))
            .ok_or_else(|| Error::Config {
                var: var.to_string(),
                value: value.to_string(),
                reason: format!(
                    "expected one of {}",
                    ALL_REDUCE_ALGOS
                        .iter()
                        .map(|a| a.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
    }
}

/// A world spread evenly over several hosts: the two levels of a hierarchical all-reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hosts {
    /// Ranks on each host (at least two).
    pub local: usize,
    /// Hosts (at least two).
    pub count: usize,
}

/// What a group runs its collectives over, as far as the choice of algorithm goes. Every rank of
/// the group derives the same value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Group {
    /// Ranks in the group.
    pub size: usize,
    /// A collective engine (MPI) runs whole collectives.
    pub engine: bool,
    /// The group shares an arena (shared memory): all-reduce can run through it.
    pub arena: bool,
    /// The group's hosts, when it can run a hierarchical all-reduce.
    pub hosts: Option<Hosts>,
}

impl Group {
    /// A group of `size` ranks with point-to-point messages only.
    pub fn plain(size: usize) -> Group {
        Group {
            size,
            ..Group::default()
        }
    }
}

/// Chooses the algorithm of collective `op` on `count` elements of `elem` bytes over `group`.
///
/// An engine runs every collective ([`Algorithm::Engine`]) except an all-reduce with a forced
/// algorithm, which runs kolo's own over the engine's point-to-point transport. An automatic
/// all-reduce over more than one rank runs hierarchical from [`HIERARCHICAL_MIN_BYTES`] when the
/// group has [`Group::hosts`], else through shared memory when it has an arena, else by size
/// ([`all_reduce`]). A broadcast goes through shared memory on a group with an arena; other
/// collectives have one schedule ([`fixed`]).
pub fn choose(op: OpKind, count: usize, elem: usize, group: &Group, ov: &Overrides) -> Algorithm {
    let n = group.size;
    if op != OpKind::AllReduce {
        return if group.engine {
            Algorithm::Engine
        } else if op == OpKind::Broadcast && group.arena && n > 1 {
            Algorithm::Shm
        } else {
            fixed(op, n)
        };
    }
    let algo = all_reduce(count, elem, n, ov);
    if ov.all_reduce.is_some() {
        return algo;
    }
    if group.engine {
        return Algorithm::Engine;
    }
    if n <= 1 {
        return algo;
    }
    match group.hosts {
        Some(_) if count * elem >= HIERARCHICAL_MIN_BYTES => Algorithm::Hierarchical,
        _ if group.arena => Algorithm::Shm,
        _ => algo,
    }
}

/// Chooses the all-reduce algorithm for `count` elements of `elem` bytes over `n` ranks.
pub fn all_reduce(count: usize, elem: usize, n: usize, ov: &Overrides) -> Algorithm {
    if n <= 1 {
        return Algorithm::Direct;
    }
    if let Some(a) = ov.all_reduce {
        return a;
    }
    let bytes = count * elem;
    if bytes <= SMALL_BYTES || count < n {
        Algorithm::RecursiveDoubling
    } else if bytes <= MEDIUM_BYTES && n >= 4 {
        Algorithm::HalvingDoubling
    } else {
        Algorithm::Ring
    }
}

/// Chooses the Adasum algorithm for `count` elements of `elem` bytes over `n` ranks (a power of two):
/// recursive doubling (`allreduce_adasum`) up to [`SMALL_BYTES`], vector halving with distance
/// doubling (`allreduce_adasum_halving`) above, from four ranks (with two, both send the same).
pub fn adasum(count: usize, elem: usize, n: usize) -> Algorithm {
    if n <= 1 {
        Algorithm::Direct
    } else if count * elem <= SMALL_BYTES || n < 4 {
        Algorithm::RecursiveDoubling
    } else {
        Algorithm::HalvingDoubling
    }
}

/// Algorithm of the collectives that have one schedule.
pub fn fixed(op: kolo_core::OpKind, n: usize) -> Algorithm {
    use kolo_core::OpKind::*;
    if n <= 1 {
        return Algorithm::Direct;
    }
    match op {
        Barrier => Algorithm::Dissemination,
        Broadcast | Reduce => Algorithm::BinomialTree,
        AllGather | AllGatherV | ReduceScatter | Split | NewGroup => Algorithm::Ring,
        AllToAll | AllToAllV => Algorithm::Pairwise,
        Scatter | ScatterV | Gather | GatherV => Algorithm::Linear,
        // Chosen by size in [`adasum`].
        AllReduceAdasum => Algorithm::RecursiveDoubling,
        Send | AllReduce => Algorithm::Direct,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_pick_algorithms() {
        let ov = Overrides::default();
        assert_eq!(all_reduce(1, 4, 1, &ov), Algorithm::Direct);
        assert_eq!(all_reduce(1, 4, 3, &ov), Algorithm::RecursiveDoubling);
        assert_eq!(all_reduce(100_000, 4, 4, &ov), Algorithm::HalvingDoubling);
        assert_eq!(all_reduce(100_000, 4, 2, &ov), Algorithm::Ring);
        assert_eq!(all_reduce(10_000_000, 4, 4, &ov), Algorithm::Ring);
        let forced = Overrides {
            all_reduce: Some(Algorithm::BinomialTree),
        };
        assert_eq!(all_reduce(10, 4, 4, &forced), Algorithm::BinomialTree);
    }

    #[test]
    fn groups_pick_engine_shm_and_hierarchical() {
        let ov = Overrides::default();
        let forced = Overrides {
            all_reduce: Some(Algorithm::Ring),
        };
        let engine = Group {
            engine: true,
            ..Group::plain(4)
        };
        assert_eq!(
            choose(OpKind::AllReduce, 1, 4, &engine, &ov),
            Algorithm::Engine
        );
        assert_eq!(
            choose(OpKind::Gather, 1, 4, &engine, &ov),
            Algorithm::Engine
        );
        assert_eq!(
            choose(OpKind::AllReduce, 1, 4, &engine, &forced),
            Algorithm::Ring
        );
        let shm = Group {
            arena: true,
            ..Group::plain(4)
        };
        assert_eq!(
            choose(OpKind::AllReduce, 1 << 20, 4, &shm, &ov),
            Algorithm::Shm
        );
        assert_eq!(
            choose(OpKind::AllReduce, 8, 4, &shm, &forced),
            Algorithm::Ring
        );
        assert_eq!(choose(OpKind::Broadcast, 8, 4, &shm, &ov), Algorithm::Shm);
        assert_eq!(
            choose(OpKind::Broadcast, 8, 4, &Group::plain(4), &ov),
            Algorithm::BinomialTree
        );
        let hosts = Group {
            hosts: Some(Hosts { local: 2, count: 2 }),
            ..Group::plain(4)
        };
        let big = HIERARCHICAL_MIN_BYTES / 4;
        assert_eq!(
            choose(OpKind::AllReduce, big, 4, &hosts, &ov),
            Algorithm::Hierarchical
        );
        assert_eq!(
            choose(OpKind::AllReduce, big - 1, 4, &hosts, &ov),
            Algorithm::HalvingDoubling
        );
        assert_eq!(
            choose(OpKind::AllReduce, big, 4, &Group::plain(1), &ov),
            Algorithm::Direct
        );
    }

    #[test]
    fn adasum_halves_large_buffers() {
        assert_eq!(adasum(10, 4, 1), Algorithm::Direct);
        assert_eq!(adasum(10, 4, 8), Algorithm::RecursiveDoubling);
        assert_eq!(adasum(1 << 20, 4, 2), Algorithm::RecursiveDoubling);
        assert_eq!(adasum(1 << 20, 4, 4), Algorithm::HalvingDoubling);
    }

    #[test]
    fn bad_override_names_the_choices() {
        let e = Overrides::parse_all_reduce("KOLO_ALGO_ALLREDUCE", "fast");
        assert!(
            matches!(e, Err(Error::Config { ref reason, .. }) if reason.contains("halving_doubling"))
        );
        assert_eq!(
            Overrides::parse_all_reduce("X", "ring").ok(),
            Some(Algorithm::Ring)
        );
    }
}
