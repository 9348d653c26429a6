//! `kolo simulate`: predict step time and scaling efficiency of data-parallel training at N ranks.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::error::CliError;
use kolo_models::ModelKind;
use kolo_train::simulate::{
    predict_all, profile, published, Prediction, Profile, RawCluster, RawLink, SimError,
};

pub const LONG_ABOUT: &str = "\
Predict the step time and scaling efficiency of data-parallel training (DDP, fixed batch per rank) \
at N ranks on a described cluster.

The compute side is a profile of one rank's step: measured here for kolo's models (--model lenet, \
simple-cnn, mlp, resnet18: a few steps of forward, backward and SGD, medians; the time each \
parameter's gradient becomes ready is recorded by a backward hook), read from --profile FILE (as \
written by --save-profile), or built in for Horovod's benchmark models (--model resnet101, \
inception-v3, vgg16: published parameter counts and stated per-GPU throughput).

The cluster is a JSON file (--cluster) and/or flags, flags winning: ranks_per_node, nodes, \
intra_node / inter_node {bandwidth_gbps or bandwidth_bytes_per_s, latency_us}, algorithm (auto, ring, \
halving-doubling, recursive-doubling, tree, hierarchical, shm), bucket_mb, overlap, \
threads_per_rank (default: the profile's), cores_per_node (compute slows down by \
ranks x threads / cores above 1), shared_memory, gamma_ns_per_byte, scalar_allreduces_per_step.

Each bucket's all-reduce costs what kolo-collectives' alpha-beta-gamma model says for the algorithm \
kolo would run; buckets leave in order on one channel as backward makes them ready (or after \
backward with overlap off). Efficiency is step(1) / step(N).";

/// `kolo simulate` options.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Model to profile (lenet, simple-cnn, mlp, resnet18) or built in (resnet101, inception-v3, vgg16)
    #[arg(long, default_value = "lenet")]
    model: String,
    /// Samples per rank and step, for profiling
    #[arg(long, default_value = "64")]
    batch: usize,
    /// Profiled steps (after one warm-up)
    #[arg(long, default_value = "5")]
    steps: usize,
    /// Per-sample input shape for profiling, CxHxW (default: 1x28x28, 3x32x32 for resnet18)
    #[arg(long, value_name = "CxHxW")]
    input_shape: Option<String>,
    /// Compute threads for profiling (sets RAYON_NUM_THREADS)
    #[arg(long)]
    threads: Option<usize>,
    /// Use this saved profile instead of profiling (several, comma-separated: their average, e.g.
    /// profiles taken at once by the ranks that will share a node)
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "save_profile",
        value_delimiter = ','
    )]
    profile: Vec<PathBuf>,
    /// Save the profile as JSON
    #[arg(long, value_name = "FILE")]
    save_profile: Option<PathBuf>,
    /// Only profile (with --save-profile), no prediction
    #[arg(long, requires = "save_profile")]
    profile_only: bool,
    /// Cluster description (JSON)
    #[arg(long, value_name = "FILE")]
    cluster: Option<PathBuf>,
    /// World sizes to predict, comma-separated
    #[arg(long, default_value = "1,2,4,8", value_delimiter = ',')]
    ranks: Vec<usize>,
    /// Also write the table as CSV
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Ranks per node
    #[arg(long)]
    ranks_per_node: Option<usize>,
    /// Nodes available
    #[arg(long)]
    nodes: Option<usize>,
    /// Intra-node bandwidth, Gbit/s
    #[arg(long)]
    intra_gbps: Option<f64>,
    /// Intra-node latency, microseconds
    #[arg(long)]
    intra_latency_us: Option<f64>,
    /// Inter-node bandwidth, Gbit/s
    #[arg(long)]
    inter_gbps: Option<f64>,
    /// Inter-node latency, microseconds
    #[arg(long)]
    inter_latency_us: Option<f64>,
    /// All-reduce algorithm: auto, ring, halving-doubling, recursive-doubling, tree, hierarchical, shm
    #[arg(long)]
    algorithm: Option<String>,
    /// DDP bucket size, MiB
    #[arg(long)]
    bucket_mb: Option<f64>,
    /// Send buckets after backward instead of during it
    #[arg(long)]
    no_overlap: bool,
    /// Compute threads per rank
    #[arg(long)]
    threads_per_rank: Option<usize>,
    /// Cores per node (for oversubscription)
    #[arg(long)]
    cores_per_node: Option<usize>,
    /// Reduction cost, ns per byte
    #[arg(long)]
    gamma_ns: Option<f64>,
}

fn link(gbps: Option<f64>, latency_us: Option<f64>) -> Option<RawLink> {
    (gbps.is_some() || latency_us.is_some()).then_some(RawLink {
        bandwidth_gbps: gbps,
        bandwidth_bytes_per_s: None,
        latency_us,
    })
}

impl SimulateArgs {
    fn flags(&self) -> RawCluster {
        RawCluster {
            ranks_per_node: self.ranks_per_node,
            nodes: self.nodes,
            intra_node: link(self.intra_gbps, self.intra_latency_us),
            inter_node: link(self.inter_gbps, self.inter_latency_us),
            algorithm: self.algorithm.clone(),
            bucket_mb: self.bucket_mb,
            overlap: self.no_overlap.then_some(false),
            threads_per_rank: self.threads_per_rank,
            cores_per_node: self.cores_per_node,
            gamma_ns_per_byte: self.gamma_ns,
            ..RawCluster::default()
        }
    }

    fn input_shape(&self, kind: ModelKind) -> Result<[usize; 3], SimError> {
        let Some(text) = &self.input_shape else {
            return Ok(match kind {
                ModelKind::Resnet18 => [3, 32, 32],
                _ => [1, 28, 28],
            });
        };
        let dims: Vec<usize> = text
            .split(['x', 'X'])
            .map(|d| d.trim().parse::<usize>())
            .collect::<Result<_, _>>()
            .map_err(|e| bad("--input-shape", format!("`{text}`: {e}")))?;
        match dims[..] {
            [c, h, w] if c > 0 && h > 0 && w > 0 => Ok([c, h, w]),
            _ => Err(bad(
                "--input-shape",
                format!("`{text}`: expected CxHxW, each at least 1"),
            )),
        }
    }

    fn profile(&self) -> Result<Profile, SimError> {
        if !self.profile.is_empty() {
            let all = self
                .profile
                .iter()
                .map(|p| Profile::load(p))
                .collect::<Result<Vec<_>, _>>()?;
            return Profile::average(&all);
        }
        if let Some(p) = published::profile(&self.model) {
            return Ok(p);
        }
        let kind: ModelKind = self.model.parse().map_err(|_| {
            published::builtin(&self.model)
                .err()
                .unwrap_or_else(|| bad("--model", "unknown"))
        })?;
        if self.batch == 0 || self.steps == 0 {
            return Err(bad("--batch/--steps", "must be at least 1"));
        }
        if let Some(t) = self.threads {
            if t == 0 {
                return Err(bad("--threads", "must be at least 1"));
            }
            // Before the first tensor operation: candle and rayon read it then.
            std::env::set_var("RAYON_NUM_THREADS", t.to_string());
        }
        let threads = candle_core_threads();
        eprintln!(
            "kolo simulate: profiling {kind} at batch {} ({} steps, {threads} threads)...",
            self.batch, self.steps
        );
        let p = profile::measure(
            kind,
            self.batch,
            self.input_shape(kind)?,
            10,
            self.steps,
            threads,
        )?;
        if let Some(path) = &self.save_profile {
            p.save(path)?;
        }
        Ok(p)
    }
}

/// The compute threads candle uses (RAYON_NUM_THREADS, else the cores).
fn candle_core_threads() -> usize {
    kolo_core::settings::Env::lookup(&kolo_core::settings::ProcessEnv, "RAYON_NUM_THREADS")
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&t| t > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn bad(field: &str, reason: impl Into<String>) -> SimError {
    SimError::Cluster {
        field: field.to_string(),
        reason: reason.into(),
    }
}

fn table(p: &Profile, rows: &[Prediction]) -> String {
    let mut s = format!(
        "profile: {} batch {} threads {}: forward {:.2} ms, backward {:.2} ms, optimizer {:.2} ms, \
         other {:.2} ms, {} parameters ({:.1} MB of gradients)\n",
        p.model,
        p.batch,
        p.threads,
        p.forward_s * 1e3,
        p.backward_s * 1e3,
        p.optimizer_s * 1e3,
        p.other_s * 1e3,
        p.params.len(),
        p.gradient_bytes() as f64 / 1e6
    );
    s.push_str(&format!(
        "{:>6} {:>5} {:>10} {:>10} {:>10} {:>10} {:>12} {:>7} {:>7}  {}\n",
        "ranks",
        "nodes",
        "step_ms",
        "compute_ms",
        "comm_ms",
        "exposed_ms",
        "samples/s",
        "eff_%",
        "buckets",
        "algorithm"
    ));
    for r in rows {
        s.push_str(&format!(
            "{:>6} {:>5} {:>10.3} {:>10.3} {:>10.3} {:>10.3} {:>12.1} {:>7.1} {:>7}  {}\n",
            r.ranks,
            r.nodes,
            r.step_s * 1e3,
            r.compute_s * 1e3,
            r.comm_s * 1e3,
            r.exposed_s * 1e3,
            r.samples_per_s,
            r.efficiency * 100.0,
            r.buckets,
            r.algorithm
        ));
    }
    s
}

fn csv(rows: &[Prediction]) -> String {
    let mut s = String::from(
        "ranks,nodes,step_s,compute_s,comm_s,exposed_s,samples_per_s,efficiency,buckets,algorithm\n",
    );
    for r in rows {
        s.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{}\n",
            r.ranks,
            r.nodes,
            r.step_s,
            r.compute_s,
            r.comm_s,
            r.exposed_s,
            r.samples_per_s,
            r.efficiency,
            r.buckets,
            r.algorithm
        ));
    }
    s
}

fn run(args: &SimulateArgs) -> Result<(), SimError> {
    let profile = args.profile()?;
    profile.validate()?;
    if args.profile_only {
        return Ok(());
    }
    let file = match &args.cluster {
        Some(path) => RawCluster::load(path)?,
        None => RawCluster::default(),
    };
    let mut raw = file.merge(args.flags());
    raw.threads_per_rank = raw.threads_per_rank.or(Some(profile.threads));
    let cluster = raw.validate()?;
    if args.ranks.is_empty() {
        return Err(bad("--ranks", "give at least one world size"));
    }
    let rows = predict_all(&profile, &cluster, &args.ranks)?;
    print!("{}", table(&profile, &rows));
    if let Some(path) = &args.csv {
        std::fs::write(path, csv(&rows)).map_err(|e| SimError::Io {
            path: path.display().to_string(),
            source: e,
        })?;
    }
    Ok(())
}

pub fn execute(args: SimulateArgs) -> ExitCode {
    // A profile must time the step as `kolo train`'s workers run it, with their malloc settings
    // (without them a ResNet-18 step profiled 15-20 % slower than it trains). glibc reads them at
    // start-up only, so run again with them.
    let profiles_here = args.profile.is_empty() && published::profile(&args.model).is_none();
    let tunables =
        kolo_core::settings::Env::lookup_os(&kolo_core::settings::ProcessEnv, "GLIBC_TUNABLES");
    if profiles_here && tunables.is_none() {
        use std::os::unix::process::CommandExt;
        let err = std::env::current_exe().map(|exe| {
            std::process::Command::new(exe)
                .args(std::env::args_os().skip(1))
                .env("GLIBC_TUNABLES", super::TRAIN_MALLOC_TUNABLES)
                .exec()
        });
        // Only reached when the program could not be run again: profile as it is.
        let why = match err {
            Ok(e) | Err(e) => e,
        };
        eprintln!("kolo simulate: profiling without kolo train's malloc settings ({why})");
    }
    let outcome = run(&args)
        .map(|()| ExitCode::SUCCESS)
        .map_err(CliError::from);
    super::error::finish("simulate", outcome)
}
