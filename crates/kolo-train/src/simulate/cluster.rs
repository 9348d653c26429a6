//! The cluster a simulation runs on: nodes, links, algorithm and DDP settings.
//!
//! Written as JSON (every field may also come from `kolo simulate` flags, which win):
//!
//! ```json
//! {
//!   "ranks_per_node": 4,
//!   "nodes": 128,
//!   "intra_node": { "bandwidth_gbps": 80, "latency_us": 5 },
//!   "inter_node": { "bandwidth_gbps": 25, "latency_us": 10 },
//!   "algorithm": "auto",
//!   "bucket_mb": 25,
//!   "overlap": true,
//!   "threads_per_rank": 1,
//!   "cores_per_node": 16,
//!   "shared_memory": false
//! }
//! ```
//!
//! A link's bandwidth is `bandwidth_gbps` (Gbit/s) or `bandwidth_bytes_per_s`, exactly one of them;
//! latencies are in microseconds. Required: `ranks_per_node`, `intra_node`; `inter_node` as soon as a
//! simulated world spans more than one node. The rest default as above (`nodes` unlimited,
//! `cores_per_node` unset = no oversubscription, `gamma_ns_per_byte` from the profile,
//! `scalar_allreduces_per_step` 1: `kolo train`'s loss check, `spin_us` 1000: how long a waiting rank
//! busy-waits, kolo's `KOLO_SHM_SPIN_US`).

use serde::Deserialize;

use kolo_collectives::cost::Link;

use super::error::SimError;

/// A link as written in the description.
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLink {
    /// Bandwidth in Gbit/s.
    pub bandwidth_gbps: Option<f64>,
    /// Bandwidth in bytes per second.
    pub bandwidth_bytes_per_s: Option<f64>,
    /// Latency (α) in microseconds (default 0).
    pub latency_us: Option<f64>,
}

/// A cluster description as written (every field optional until [`RawCluster::validate`]).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCluster {
    /// Ranks on each node.
    pub ranks_per_node: Option<usize>,
    /// Nodes available (the largest world is `nodes × ranks_per_node`).
    pub nodes: Option<usize>,
    /// Link between ranks of one node.
    pub intra_node: Option<RawLink>,
    /// Link between nodes.
    pub inter_node: Option<RawLink>,
    /// `auto`, `ring`, `halving-doubling`, `recursive-doubling`, `tree`, `hierarchical`, `shm`.
    pub algorithm: Option<String>,
    /// DDP bucket size in MiB.
    pub bucket_mb: Option<f64>,
    /// Whether buckets are sent while backward runs.
    pub overlap: Option<bool>,
    /// Compute threads of each rank.
    pub threads_per_rank: Option<usize>,
    /// Cores of each node; with more `ranks × threads` than cores, compute slows down in proportion.
    pub cores_per_node: Option<usize>,
    /// Whether `auto` uses kolo's shared-memory all-reduce inside one node (as kolo does when all
    /// ranks share a host).
    pub shared_memory: Option<bool>,
    /// Reduction cost in ns per byte (default: the profile's).
    pub gamma_ns_per_byte: Option<f64>,
    /// Small blocking all-reduces per step (default 1).
    pub scalar_allreduces_per_step: Option<usize>,
    /// Microseconds a waiting rank busy-waits before it sleeps (default 1000, kolo's shared-memory
    /// `KOLO_SHM_SPIN_US`); charged only on an oversubscribed node.
    pub spin_us: Option<f64>,
}

/// How all-reduces are scheduled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlgoChoice {
    /// What kolo picks (`select::choose`): shared memory on one node (if enabled), hierarchical
    /// across nodes from `select::HIERARCHICAL_MIN_BYTES`, otherwise by size.
    Auto,
    /// Ring reduce-scatter + all-gather over all ranks.
    Ring,
    /// Halving-doubling over all ranks.
    HalvingDoubling,
    /// Recursive doubling over all ranks.
    RecursiveDoubling,
    /// Binomial tree reduce + broadcast.
    Tree,
    /// Intra-node reduce-scatter, inter-node all-reduce, intra-node all-gather.
    Hierarchical,
    /// Shared memory (one node only).
    Shm,
}

impl AlgoChoice {
    /// Parses a name (`-` or `_` alike).
    pub fn parse(s: &str) -> Result<AlgoChoice, SimError> {
        Ok(
            match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
                "auto" => AlgoChoice::Auto,
                "ring" => AlgoChoice::Ring,
                "halving-doubling" | "hd" => AlgoChoice::HalvingDoubling,
                "recursive-doubling" | "rd" => AlgoChoice::RecursiveDoubling,
                "tree" | "binomial-tree" => AlgoChoice::Tree,
                "hierarchical" => AlgoChoice::Hierarchical,
                "shm" | "shared-memory" => AlgoChoice::Shm,
                _ => {
                    return Err(SimError::Cluster {
                        field: "algorithm".into(),
                        reason: format!(
                            "unknown algorithm `{s}` (expected auto, ring, halving-doubling, \
                         recursive-doubling, tree, hierarchical, shm)"
                        ),
                    })
                }
            },
        )
    }
}

/// A checked cluster description.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    /// Ranks on each node.
    pub ranks_per_node: usize,
    /// Nodes available (`None`: unlimited).
    pub nodes: Option<usize>,
    /// Link between ranks of one node.
    pub intra: Link,
    /// Link between nodes (`None`: the description has none; worlds must fit one node).
    pub inter: Option<Link>,
    /// Algorithm choice.
    pub algorithm: AlgoChoice,
    /// DDP bucket bytes.
    pub bucket_bytes: usize,
    /// Overlap communication with backward.
    pub overlap: bool,
    /// Compute threads per rank.
    pub threads_per_rank: usize,
    /// Cores per node (`None`: never oversubscribed).
    pub cores_per_node: Option<usize>,
    /// `auto` uses shared memory inside a node.
    pub shared_memory: bool,
    /// Reduction cost override, seconds per byte.
    pub gamma_s_per_byte: Option<f64>,
    /// Small blocking all-reduces per step.
    pub scalar_allreduces: usize,
    /// Seconds a waiting rank busy-waits before sleeping.
    pub spin_s: f64,
}

fn invalid(field: &str, reason: impl Into<String>) -> SimError {
    SimError::Cluster {
        field: field.to_string(),
        reason: reason.into(),
    }
}

fn positive(field: &str, v: Option<usize>) -> Result<Option<usize>, SimError> {
    match v {
        Some(0) => Err(invalid(field, "must be at least 1, got 0")),
        other => Ok(other),
    }
}

fn nonneg(field: &str, v: f64) -> Result<f64, SimError> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(invalid(
            field,
            format!("must be finite and non-negative, got {v}"),
        ))
    }
}

impl RawLink {
    fn validate(&self, name: &str) -> Result<Link, SimError> {
        let bytes_per_s = match (self.bandwidth_gbps, self.bandwidth_bytes_per_s) {
            (Some(g), None) => (format!("{name}.bandwidth_gbps"), g * 1e9 / 8.0, g),
            (None, Some(b)) => (format!("{name}.bandwidth_bytes_per_s"), b, b),
            (Some(_), Some(_)) => {
                return Err(invalid(
                    name,
                    "give bandwidth_gbps or bandwidth_bytes_per_s, not both",
                ))
            }
            (None, None) => {
                return Err(invalid(
                    &format!("{name}.bandwidth_gbps"),
                    "missing (or bandwidth_bytes_per_s)",
                ))
            }
        };
        let (field, bps, raw) = bytes_per_s;
        if !raw.is_finite() || raw <= 0.0 {
            return Err(invalid(&field, format!("must be positive, got {raw}")));
        }
        let lat = nonneg(
            &format!("{name}.latency_us"),
            self.latency_us.unwrap_or(0.0),
        )?;
        Ok(Link::new(lat * 1e-6, bps))
    }
}

impl RawCluster {
    /// Parses JSON text.
    pub fn from_json(text: &str, origin: &str) -> Result<RawCluster, SimError> {
        serde_json::from_str(text).map_err(|e| SimError::Parse {
            path: origin.to_string(),
            source: e,
        })
    }

    /// Reads a JSON file.
    pub fn load(path: &std::path::Path) -> Result<RawCluster, SimError> {
        let text = std::fs::read_to_string(path).map_err(|e| SimError::Io {
            path: path.display().to_string(),
            source: e,
        })?;
        RawCluster::from_json(&text, &path.display().to_string())
    }

    /// Fields set in `over` replace this description's.
    pub fn merge(mut self, over: RawCluster) -> RawCluster {
        macro_rules! take {
            ($($f:ident),*) => { $( if over.$f.is_some() { self.$f = over.$f; } )* };
        }
        take!(
            ranks_per_node,
            nodes,
            algorithm,
            bucket_mb,
            overlap,
            threads_per_rank,
            cores_per_node,
            shared_memory,
            gamma_ns_per_byte,
            scalar_allreduces_per_step,
            spin_us
        );
        for (mine, theirs) in [
            (&mut self.intra_node, over.intra_node),
            (&mut self.inter_node, over.inter_node),
        ] {
            if let Some(t) = theirs {
                let m = mine.get_or_insert_with(RawLink::default);
                if t.bandwidth_gbps.is_some() || t.bandwidth_bytes_per_s.is_some() {
                    m.bandwidth_gbps = t.bandwidth_gbps;
                    m.bandwidth_bytes_per_s = t.bandwidth_bytes_per_s;
                }
                if t.latency_us.is_some() {
                    m.latency_us = t.latency_us;
                }
            }
        }
        self
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<Cluster, SimError> {
        let ranks_per_node = positive("ranks_per_node", self.ranks_per_node)?
            .ok_or_else(|| invalid("ranks_per_node", "missing"))?;
        let nodes = positive("nodes", self.nodes)?;
        let intra = self
            .intra_node
            .ok_or_else(|| invalid("intra_node", "missing"))?
            .validate("intra_node")?;
        let inter = self
            .inter_node
            .map(|l| l.validate("inter_node"))
            .transpose()?;
        let algorithm = AlgoChoice::parse(self.algorithm.as_deref().unwrap_or("auto"))?;
        let bucket_mb = self.bucket_mb.unwrap_or(25.0);
        if !bucket_mb.is_finite() || bucket_mb <= 0.0 {
            return Err(invalid(
                "bucket_mb",
                format!("must be positive, got {bucket_mb}"),
            ));
        }
        let gamma = self
            .gamma_ns_per_byte
            .map(|g| nonneg("gamma_ns_per_byte", g).map(|g| g * 1e-9))
            .transpose()?;
        Ok(Cluster {
            ranks_per_node,
            nodes,
            intra,
            inter,
            algorithm,
            bucket_bytes: ((bucket_mb * 1024.0 * 1024.0) as usize).max(1),
            overlap: self.overlap.unwrap_or(true),
            threads_per_rank: positive("threads_per_rank", self.threads_per_rank)?.unwrap_or(1),
            cores_per_node: positive("cores_per_node", self.cores_per_node)?,
            shared_memory: self.shared_memory.unwrap_or(false),
            gamma_s_per_byte: gamma,
            scalar_allreduces: self.scalar_allreduces_per_step.unwrap_or(1),
            spin_s: nonneg("spin_us", self.spin_us.unwrap_or(1000.0))? * 1e-6,
        })
    }
}

impl Cluster {
    /// Nodes a world of `n` ranks occupies, and the ranks on each (the nodes are filled in turn).
    pub fn placement(&self, n: usize) -> Result<(usize, usize), SimError> {
        if n == 0 {
            return Err(invalid("ranks", "a world needs at least 1 rank"));
        }
        let local = n.min(self.ranks_per_node);
        let nodes = n.div_ceil(self.ranks_per_node);
        if let Some(max) = self.nodes {
            if nodes > max {
                return Err(invalid(
                    "nodes",
                    format!(
                        "{n} ranks need {nodes} nodes of {} ranks, the cluster has {max}",
                        self.ranks_per_node
                    ),
                ));
            }
        }
        if nodes > 1 && self.inter.is_none() {
            return Err(invalid(
                "inter_node",
                format!("missing, and {n} ranks span {nodes} nodes"),
            ));
        }
        Ok((nodes, local))
    }

    /// How much slower compute runs with `local` ranks on a node: `local × threads / cores`, at
    /// least 1 (1 when `cores_per_node` is unset).
    pub fn oversubscription(&self, local: usize) -> f64 {
        match self.cores_per_node {
            Some(c) => ((local * self.threads_per_rank) as f64 / c as f64).max(1.0),
            None => 1.0,
        }
    }
}
