//! `kolo bench`: time kolo's collectives like nccl-tests, launching its own workers.
//!
//! Without `--worker`, this process is the launcher: it starts N copies of itself (`kolo bench
//! --worker ...` with the same options) through the same machinery as `kolo run`, rank 0 writing
//! straight to the terminal. With `--worker` (set by the launcher, or when started by
//! torchrun/`mpirun`/`srun`), it joins the job through `kolo::init()` and times the operation for
//! every size, printing one row (or one JSON line) per size on rank 0.

use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, ValueEnum};
use kolo::{bf16, f16, Communicator, Element, ReduceOp};

use super::error::CliError;
use kolo_ddp::device::DeviceKind;

mod device;
mod figure;

pub const LONG_ABOUT: &str = "\
Time one of kolo's collectives (or point-to-point ping-pong) on N workers, like nccl-tests, \
for a range of message sizes; kolo bench starts the workers itself.

For each size: --warmup iterations, a barrier, then --iters in-place iterations timed together; \
time(us) is the elapsed time divided by the iterations, taken on the slowest rank (the maximum \
over ranks, by an all-reduce). algbw = bytes / time; busbw = algbw x 2(n-1)/n for allreduce, \
(n-1)/n for allgather, reduce_scatter and alltoall, 1 for broadcast and p2p. For p2p (ping-pong \
between ranks 0 and 1; other ranks idle) time is half a round trip.

Sizes are bytes of one rank's buffer as nccl-tests counts them (K, M, G = 1024, 1024^2, 1024^3): \
the buffer all-reduced or broadcast, the full gathered buffer of allgather, the full input of \
reduce_scatter, one rank's whole send buffer of alltoall, the message of p2p. Each size is rounded \
down to whole elements (and whole blocks per rank), at least one.

After timing, every size is run once more on known data (element i of rank r is (i % 7) + r) and \
checked; `wrong` counts the wrong elements over all ranks, and kolo bench exits non-zero if any is \
wrong. --json prints one JSON object per size instead of the table, with the fields of the peer \
baselines: impl (kolo-<transport>), op, n, bytes, time_us, algbw_gbps, busbw_gbps, wrong.";

/// The operation to time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Op {
    /// All-reduce (sum)
    #[value(name = "allreduce", alias = "all_reduce", alias = "all-reduce")]
    Allreduce,
    /// All-gather
    #[value(name = "allgather", alias = "all_gather", alias = "all-gather")]
    Allgather,
    /// Reduce-scatter (sum)
    #[value(
        name = "reduce_scatter",
        alias = "reduce-scatter",
        alias = "reducescatter"
    )]
    ReduceScatter,
    /// Broadcast from rank 0
    #[value(name = "broadcast")]
    Broadcast,
    /// All-to-all
    #[value(name = "alltoall", alias = "all_to_all", alias = "all-to-all")]
    Alltoall,
    /// Ping-pong between ranks 0 and 1
    #[value(name = "p2p", alias = "pingpong")]
    P2p,
}

impl Op {
    /// The peers' name of the operation.
    fn name(self) -> &'static str {
        match self {
            Op::Allreduce => "allreduce",
            Op::Allgather => "allgather",
            Op::ReduceScatter => "reduce_scatter",
            Op::Broadcast => "broadcast",
            Op::Alltoall => "alltoall",
            Op::P2p => "p2p",
        }
    }

    /// busbw / algbw for `n` ranks (nccl-tests' factors).
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Op::Allreduce => 2.0 * (n - 1.0) / n,
            Op::Allgather | Op::ReduceScatter | Op::Alltoall => (n - 1.0) / n,
            Op::Broadcast | Op::P2p => 1.0,
        }
    }

    /// Whether `bytes` covers all ranks' blocks (rounded to whole blocks per rank).
    fn blocked(self) -> bool {
        matches!(self, Op::Allgather | Op::ReduceScatter | Op::Alltoall)
    }
}

/// Element type of the buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Dtype {
    F32,
    F64,
    F16,
    Bf16,
    I32,
    I64,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchArgs {
    /// `kolo bench scaling`: training throughput against the number of workers
    #[command(subcommand)]
    scaling: Option<BenchCommand>,
    /// Operation: allreduce, allgather, reduce_scatter, broadcast, alltoall, p2p
    #[arg(value_name = "OP", required = true)]
    op: Option<Op>,
    /// Number of workers
    #[arg(short = 'n', long = "nproc", visible_alias = "nproc-per-node", value_name = "N",
          default_value = "2", value_parser = parse_positive)]
    nproc: usize,
    /// Message sizes in bytes, comma-separated, with K/M/G suffixes (1024-based)
    #[arg(long, value_name = "SIZES", value_delimiter = ',', value_parser = parse_size,
          default_value = "4,1K,64K,1M,4M,16M,64M")]
    sizes: Vec<u64>,
    /// Timed iterations per size (default: 1000 below 1 MiB, 50 below 16 MiB, 10 from 16 MiB)
    #[arg(long, value_name = "K", value_parser = parse_positive)]
    iters: Option<usize>,
    /// Untimed warm-up iterations per size
    #[arg(long, value_name = "W", default_value = "5")]
    warmup: usize,
    /// One JSON object per size instead of the table
    #[arg(long)]
    json: bool,
    /// Also write each size's busbw (GB/s) to this CSV, drawn log-log into the PNG beside it
    #[arg(long, value_name = "FILE")]
    csv: Option<std::path::PathBuf>,
    /// Also check the result of every warm-up and timed iteration where it is stable
    /// (broadcast, allgather, reduce_scatter, alltoall, p2p); the final check always runs
    #[arg(long)]
    check: bool,
    /// Element type: f32, f64, f16, bf16, i32, i64
    #[arg(long, default_value = "f32")]
    dtype: Dtype,
    /// Where the buffers live: `cpu`, or `cuda` (allreduce of f32 GPU memory on NCCL,
    /// KOLO_BACKEND=nccl; a build with the `cuda` and `nccl` features)
    #[arg(long, default_value = "cpu")]
    device: DeviceKind,
    #[command(flatten)]
    launch: super::launch_args::LaunchArgs,
    /// Run as a worker of a job (set by the launcher)
    #[arg(long, hide = true)]
    worker: bool,
}

/// `kolo bench` subcommands besides the collectives.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// Train a model for a fixed amount of data at each worker count; write a CSV and a PNG of
    /// samples/s against workers (with ideal linear scaling) and the efficiency of each point
    #[command(long_about = super::scaling::LONG_ABOUT)]
    Scaling(super::scaling::ScalingArgs),
}

impl BenchArgs {
    /// The operation (clap requires one unless a subcommand is given).
    fn op(&self) -> Op {
        self.op.unwrap_or(Op::Allreduce)
    }
}

fn parse_positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Parses `4`, `1K`, `64KiB`, `16M`, `1G`, `512B` (K/M/G are 1024-based).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits);
    if num.is_empty() {
        return Err(format!(
            "bad size {s:?}: expected bytes like 4, 1K, 64K, 16M, 1G"
        ));
    }
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => {
            return Err(format!(
                "bad size {s:?}: unknown suffix {suffix:?} (use K, M or G, 1024-based)"
            ))
        }
    };
    let n: u64 = num.parse().map_err(|e| format!("bad size {s:?}: {e}"))?;
    let bytes = n
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("bad size {s:?}: too large"))?;
    if bytes == 0 {
        return Err(format!("bad size {s:?}: must be at least 1 byte"));
    }
    Ok(bytes)
}

/// The peers' default iteration counts.
fn default_iters(bytes: u64) -> usize {
    if bytes < 1 << 20 {
        1000
    } else if bytes < 16 << 20 {
        50
    } else {
        10
    }
}

/// An element type kolo bench can fill with known data and check.
trait BenchElement: Element + Copy + Default {
    const NAME: &'static str;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
}

macro_rules! bench_float {
    ($($t:ty => $name:literal),*) => {$(
        impl BenchElement for $t {
            const NAME: &'static str = $name;
            fn from_f64(v: f64) -> Self { v as $t }
            fn to_f64(self) -> f64 { self as f64 }
        }
    )*};
}
bench_float!(f32 => "f32", f64 => "f64", i32 => "i32", i64 => "i64");

macro_rules! bench_half {
    ($($t:ty => $name:literal),*) => {$(
        impl BenchElement for $t {
            const NAME: &'static str = $name;
            fn from_f64(v: f64) -> Self { <$t>::from_f64(v) }
            fn to_f64(self) -> f64 { <$t>::to_f64(self) }
        }
    )*};
}
bench_half!(f16 => "f16", bf16 => "bf16");

/// Counts the elements of `buf` that differ from `expected(i)` (compared in the element type).
fn count_wrong<T: BenchElement>(buf: &[T], expected: impl Fn(usize) -> f64) -> u64 {
    buf.iter()
        .enumerate()
        .filter(|(i, v)| v.to_f64() != T::from_f64(expected(*i)).to_f64())
        .count() as u64
}

fn fill<T: BenchElement>(buf: &mut [T], value: impl Fn(usize) -> f64) {
    for (i, v) in buf.iter_mut().enumerate() {
        *v = T::from_f64(value(i));
    }
}

/// One size's buffers and what the right results are.
struct Case<T> {
    op: Op,
    n: usize,
    rank: usize,
    /// Elements per rank block (blocked ops) or of the whole buffer.
    block: usize,
    send: Vec<T>,
    recv: Vec<T>,
}

const PING: u64 = 1;
const PONG: u64 = 2;

impl<T: BenchElement> Case<T> {
    /// The element count of the whole buffer (`bytes / size_of::<T>()`, rounded to whole blocks).
    fn new(op: Op, n: usize, rank: usize, bytes: u64) -> Self {
        let sz = std::mem::size_of::<T>() as u64;
        let elems = (bytes / sz).max(1) as usize;
        let block = if op.blocked() {
            (elems / n).max(1)
        } else {
            elems
        };
        let (send_len, recv_len) = match op {
            Op::Allreduce | Op::Broadcast | Op::P2p => (block, 0),
            Op::Allgather => (block, block * n),
            Op::ReduceScatter => (block * n, block),
            Op::Alltoall => (block * n, block * n),
        };
        let mut case = Case {
            op,
            n,
            rank,
            block,
            send: vec![T::default(); send_len],
            recv: vec![T::default(); recv_len],
        };
        case.reset();
        case
    }

    /// Elements of the whole buffer that `bytes` stands for.
    fn count(&self) -> usize {
        if self.op.blocked() {
            self.block * self.n
        } else {
            self.block
        }
    }

    /// Puts the known data into the send buffer.
    fn reset(&mut self) {
        let (r, n, block) = (self.rank as f64, self.n as f64, self.block);
        match self.op {
            Op::Alltoall => fill(&mut self.send, |j| {
                ((j % block) % 7) as f64 + r * n + (j / block) as f64
            }),
            _ => fill(&mut self.send, |i| (i % 7) as f64 + r),
        }
        self.recv.fill(T::default());
    }

    /// One iteration of the operation.
    fn step(&mut self, comm: &Communicator) -> kolo::Result<()> {
        match self.op {
            Op::Allreduce => comm.all_reduce(&mut self.send, ReduceOp::Sum),
            Op::Broadcast => comm.broadcast(&mut self.send, 0),
            Op::Allgather => comm.all_gather(&self.send, &mut self.recv),
            Op::ReduceScatter => comm.reduce_scatter(&self.send, &mut self.recv, ReduceOp::Sum),
            Op::Alltoall => comm.all_to_all(&self.send, &mut self.recv),
            Op::P2p => match self.rank {
                0 => {
                    comm.send(&self.send, 1, PING)?;
                    comm.recv(&mut self.send, 1, PONG)
                }
                1 => {
                    comm.recv(&mut self.send, 0, PING)?;
                    comm.send(&self.send, 0, PONG)
                }
                _ => Ok(()),
            },
        }
    }

    /// Wrong elements after one step on known data (for allreduce, only right after [`Case::reset`]:
    /// its in-place result drifts with every further step).
    fn wrong(&self) -> u64 {
        let (n, r, block) = (self.n as f64, self.rank, self.block);
        let tri = n * (n - 1.0) / 2.0;
        match self.op {
            Op::Allreduce => count_wrong(&self.send, |i| n * (i % 7) as f64 + tri),
            Op::Broadcast => count_wrong(&self.send, |i| (i % 7) as f64),
            Op::Allgather => count_wrong(&self.recv, |j| {
                ((j % block) % 7) as f64 + (j / block) as f64
            }),
            Op::ReduceScatter => {
                count_wrong(&self.recv, |i| n * ((r * block + i) % 7) as f64 + tri)
            }
            Op::Alltoall => count_wrong(&self.recv, |j| {
                ((j % block) % 7) as f64 + (j / block) as f64 * n + r as f64
            }),
            // Ping-pong echoes rank 0's data back.
            Op::P2p if r < 2 => count_wrong(&self.send, |i| (i % 7) as f64),
            Op::P2p => 0,
        }
    }
}

/// One size's result on rank 0.
struct Row {
    bytes: u64,
    count: usize,
    time_us: f64,
    algbw: f64,
    busbw: f64,
    wrong: u64,
}

fn bench_size<T: BenchElement>(
    comm: &Communicator,
    args: &BenchArgs,
    bytes: u64,
) -> kolo::Result<Row> {
    let (n, rank) = (comm.size(), comm.rank());
    let op = args.op();
    let mut case = Case::<T>::new(op, n, rank, bytes);
    let stable = !matches!(op, Op::Allreduce);
    let mut wrong = 0u64;
    for _ in 0..args.warmup {
        case.step(comm)?;
        if args.check && stable {
            wrong += case.wrong();
        }
    }
    let iters = args.iters.unwrap_or_else(|| default_iters(bytes));
    comm.barrier()?;
    let start = Instant::now();
    for _ in 0..iters {
        case.step(comm)?;
    }
    let mut elapsed = [start.elapsed().as_secs_f64()];
    if args.check && stable {
        wrong += case.wrong();
    }
    // Once more on fresh known data: the check that always runs.
    case.reset();
    case.step(comm)?;
    wrong += case.wrong();

    comm.all_reduce(&mut elapsed, ReduceOp::Max)?;
    let mut wrong_all = [wrong as i64];
    comm.all_reduce(&mut wrong_all, ReduceOp::Sum)?;

    let count = case.count();
    let bytes = (count * std::mem::size_of::<T>()) as u64;
    let mut time = elapsed[0] / iters as f64;
    if op == Op::P2p {
        time /= 2.0; // one way of the round trip
    }
    let algbw = if time > 0.0 {
        bytes as f64 / time / 1e9
    } else {
        0.0
    };
    Ok(Row {
        bytes,
        count,
        time_us: time * 1e6,
        algbw,
        busbw: algbw * op.bus_factor(n),
        wrong: wrong_all[0].max(0) as u64,
    })
}

fn run<T: BenchElement>(comm: &Communicator, args: &BenchArgs) -> kolo::Result<u64> {
    let implementation = format!("kolo-{}", comm.transport_kind());
    report(comm, args, (&implementation, T::NAME), |bytes| {
        bench_size::<T>(comm, args, bytes)
    })
}

/// Times every size with `bench_size` and prints its row on rank 0 (`implementation` and the
/// element type's name label them); returns the wrong elements over all sizes.
fn report(
    comm: &Communicator,
    args: &BenchArgs,
    (implementation, type_name): (&str, &str),
    mut bench_size: impl FnMut(u64) -> kolo::Result<Row>,
) -> kolo::Result<u64> {
    let n = comm.size();
    let lead = comm.rank() == 0;
    if lead && !args.json {
        println!(
            "# kolo bench {}: {n} ranks, transport {}{}, dtype {}, {} warm-up iterations; \
             time = slowest rank's mean per iteration{}",
            args.op().name(),
            comm.transport_kind(),
            match comm.device_ordinal() {
                Some(d) if args.device == DeviceKind::Cuda =>
                    format!(", collectives on GPU {d} ({})", comm.backend()),
                _ => String::new(),
            },
            type_name,
            args.warmup,
            if args.op() == Op::P2p {
                " (one way, half a round trip)"
            } else {
                ""
            }
        );
        println!(
            "# {:>12} {:>12} {:>6} {:>12} {:>12} {:>12} {:>8}",
            "size", "count", "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "wrong"
        );
    }
    let mut total_wrong = 0u64;
    let mut busbw = Vec::new();
    for &bytes in &args.sizes {
        let row = bench_size(bytes)?;
        total_wrong += row.wrong;
        busbw.push((row.bytes, row.busbw));
        if !lead {
            continue;
        }
        if args.json {
            // The peers' field order and precision (`mpi_allreduce.c`).
            println!(
                "{{\"impl\":{},\"op\":\"{}\",\"n\":{n},\"bytes\":{},\"time_us\":{:.3},\
                 \"algbw_gbps\":{:.4},\"busbw_gbps\":{:.4},\"wrong\":{}}}",
                serde_json::Value::from(implementation),
                args.op().name(),
                row.bytes,
                row.time_us,
                row.algbw,
                row.busbw,
                row.wrong
            );
        } else {
            println!(
                "  {:>12} {:>12} {:>6} {:>12.2} {:>12.3} {:>12.3} {:>8}",
                row.bytes, row.count, type_name, row.time_us, row.algbw, row.busbw, row.wrong
            );
        }
    }
    if let (true, Some(csv)) = (lead, &args.csv) {
        let title = format!("kolo bench {}, {n} ranks, {type_name}", args.op().name());
        figure::write(csv, implementation, &title, &busbw);
    }
    Ok(total_wrong)
}

fn worker(args: &BenchArgs) -> Result<ExitCode, CliError> {
    let comm = kolo::init()
        .map_err(|e| CliError::Failed(format!("worker could not join the job: {e}")))?;
    if args.op() == Op::P2p && comm.size() < 2 {
        return Err(CliError::Failed("p2p needs at least 2 ranks".into()));
    }
    let result = match args.dtype {
        _ if args.device == DeviceKind::Cuda => device::run(&comm, args),
        Dtype::F32 => run::<f32>(&comm, args),
        Dtype::F64 => run::<f64>(&comm, args),
        Dtype::F16 => run::<f16>(&comm, args),
        Dtype::Bf16 => run::<bf16>(&comm, args),
        Dtype::I32 => run::<i32>(&comm, args),
        Dtype::I64 => run::<i64>(&comm, args),
    };
    match result {
        Ok(0) => Ok(ExitCode::SUCCESS),
        Ok(wrong) => {
            // Every rank knows the count; one reports it.
            if comm.rank() == 0 {
                eprintln!("kolo bench: {wrong} wrong elements");
            }
            Ok(ExitCode::FAILURE)
        }
        Err(e) => Err(CliError::Failed(format!("rank {}: {e}", comm.rank()))),
    }
}

pub fn execute(args: BenchArgs) -> ExitCode {
    if let Some(BenchCommand::Scaling(s)) = &args.scaling {
        return super::scaling::execute(s);
    }
    if args.worker {
        return super::error::finish("bench", worker(&args));
    }
    super::finish("bench", launch_job(&args))
}

/// Checks the options and starts the workers; returns the job's exit code.
fn launch_job(args: &BenchArgs) -> Result<ExitCode, super::error::CliError> {
    if args.launch.on_hosts() {
        return super::launch_args::execute_hosts("bench", args.nproc, &args.launch);
    }
    if args.device == DeviceKind::Cuda && (args.op() != Op::Allreduce || args.dtype != Dtype::F32) {
        return Err(super::error::CliError::Usage(
            "--device cuda times the f32 allreduce (GPU memory on NCCL)".into(),
        ));
    }
    // With several nodes the world is larger than -n (the workers check the world's size).
    if args.op() == Op::P2p && args.nproc * args.launch.nnodes.1 < 2 {
        return Err(super::error::CliError::Usage(
            "p2p needs at least 2 workers (-n 2 or more, or several nodes)".into(),
        ));
    }
    let defaults = [("RAYON_NUM_THREADS", "1".to_string())];
    super::launch_workers("bench", args.nproc, &args.launch, &defaults)
}

#[cfg(test)]
mod tests;
