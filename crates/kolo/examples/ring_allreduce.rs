//! A ring all-reduce written by hand with `isend`/`recv`, checked and timed against the library's
//! `Communicator::all_reduce` (the classic "all-reduce from scratch" example).
//!
//! The vector is split into `n` chunks, `n` the world size; rank `r` sends to its right neighbour
//! `r + 1` and receives from its left neighbour `r - 1` (all ranks and chunks modulo `n`).
//!
//! * Reduce-scatter, steps `s = 0..n-1`: rank `r` sends chunk `r - s` to the right and receives
//!   chunk `r - s - 1` from the left, adding it to its own. The chunk a rank receives at step `s`
//!   holds the sum over `s + 1` ranks, so after `n - 1` steps rank `r` holds the full sum of chunk
//!   `r + 1`.
//! * All-gather, steps `s = 0..n-1`: rank `r` sends the complete chunk `r + 1 - s` to the right and
//!   receives the complete chunk `r - s` from the left, replacing its own. After `n - 1` steps every
//!   rank has every chunk.
//!
//! Each rank sends and receives `2 (n - 1) / n` of the vector whatever `n` is, which is why rings are
//! the bandwidth-optimal all-reduce. Sends are buffered (an `isend` completes at once), so every rank
//! may send before it receives without deadlock; each step has its own tag.
//!
//! Run: `kolo run -n 4 -- target/release/examples/ring_allreduce [--count N] [--iters K]`
//! (defaults: 1,000,003 `f32`s, odd on purpose so that chunks differ in length; 20 timed iterations
//! after one warm-up). Rank 0 prints the median times; the exit code is 1 if the results differ.
//!
//! `--short-rank R` makes rank R pass one element fewer to `all_reduce`, the kind of bug that hangs
//! other libraries: kolo stops every rank with an error naming both calls.

use std::error::Error;
use std::ops::Range;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use kolo::{Communicator, ReduceOp};

const USAGE: &str = "usage: ring_allreduce [--count N] [--iters K] [--short-rank R]";

struct Args {
    count: usize,
    iters: usize,
    /// This rank all-reduces one element fewer (a deliberate mismatch).
    short_rank: Option<usize>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        count: 1_000_003,
        iters: 20,
        short_rank: None,
    };
    let mut short = usize::MAX;
    let mut argv = std::env::args().skip(1);
    while let Some(arg) = argv.next() {
        let slot = match arg.as_str() {
            "--count" => &mut args.count,
            "--iters" => &mut args.iters,
            "--short-rank" => &mut short,
            _ => return Err(format!("unknown argument {arg:?}; {USAGE}")),
        };
        let value = argv
            .next()
            .ok_or_else(|| format!("{arg} needs a value; {USAGE}"))?;
        *slot = value
            .parse()
            .map_err(|_| format!("{arg}: expected a non-negative integer, got {value:?}"))?;
    }
    if args.iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    args.short_rank = (short != usize::MAX).then_some(short);
    Ok(args)
}

/// The elements of chunk `c` when `len` elements are split into `n` chunks.
fn chunk(c: usize, len: usize, n: usize) -> Range<usize> {
    c * len / n..(c + 1) * len / n
}

// ANCHOR: ring
/// Sums `data` over all ranks, in place; the messages use tags `tag..tag + 2 (n - 1)`.
fn ring_all_reduce(comm: &Communicator, data: &mut [f32], tag: u64) -> kolo::Result<()> {
    let (r, n, len) = (comm.rank(), comm.size(), data.len());
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let mut incoming = vec![0.0f32; len.div_ceil(n)];
    for s in 0..n - 1 {
        let (send, recv) = (
            chunk((r + n - s) % n, len, n),
            chunk((r + 2 * n - s - 1) % n, len, n),
        );
        let sent = comm.isend(&data[send], right, tag + s as u64);
        let buf = &mut incoming[..recv.len()];
        comm.recv(buf, left, tag + s as u64)?;
        for (x, y) in data[recv].iter_mut().zip(buf.iter()) {
            *x += y;
        }
        sent.wait()?;
    }
    for s in 0..n - 1 {
        let (send, recv) = (
            chunk((r + 1 + n - s) % n, len, n),
            chunk((r + n - s) % n, len, n),
        );
        let step_tag = tag + (n - 1 + s) as u64;
        let sent = comm.isend(&data[send], right, step_tag);
        comm.recv(&mut data[recv], left, step_tag)?;
        sent.wait()?;
    }
    Ok(())
}
// ANCHOR_END: ring

/// Runs `op` once to warm up and `iters` times timed, each on fresh input, and returns the median time
/// and the last result. Element `i` on rank `r` is `(i + r) % 7`: small integers, so sums are exact.
fn bench(
    comm: &Communicator,
    args: &Args,
    mut op: impl FnMut(&mut [f32], usize) -> kolo::Result<()>,
) -> kolo::Result<(Duration, Vec<f32>)> {
    let rank = comm.rank();
    let mut times = Vec::with_capacity(args.iters);
    let mut data = Vec::new();
    for iter in 0..=args.iters {
        data = (0..args.count).map(|i| ((i + rank) % 7) as f32).collect();
        comm.barrier()?;
        let start = Instant::now();
        op(&mut data, iter)?;
        if iter > 0 {
            times.push(start.elapsed());
        }
    }
    times.sort();
    Ok((
        times.get(times.len() / 2).copied().unwrap_or_default(),
        data,
    ))
}

fn run(comm: &Communicator) -> Result<bool, Box<dyn Error>> {
    let args = parse_args()?;
    let (rank, size) = (comm.rank(), comm.size());
    let steps = 2 * size as u64; // tags per call, with room to spare
    let (ring_time, ring) = bench(comm, &args, |data, iter| {
        ring_all_reduce(comm, data, iter as u64 * steps)
    })?;
    let (kolo_time, kolo) = bench(comm, &args, |data, _| {
        let n = data.len() - usize::from(args.short_rank == Some(rank) && !data.is_empty());
        comm.all_reduce(&mut data[..n], ReduceOp::Sum)
    })?;

    let differ = ring.iter().zip(&kolo).position(|(a, b)| a != b);
    if let Some(i) = differ {
        eprintln!(
            "rank {rank}: error: results differ at index {i}: hand-written {}, kolo all_reduce {}",
            ring[i], kolo[i]
        );
    }
    // Agree on the verdict, so that rank 0 does not report a match another rank contradicts.
    let mut bad_ranks = [i32::from(differ.is_some())];
    comm.all_reduce(&mut bad_ranks, ReduceOp::Sum)?;
    if rank == 0 {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let verdict = match bad_ranks[0] {
            0 => "results match".to_string(),
            k => format!("results DIFFER on {k} rank(s)"),
        };
        println!(
            "ring_allreduce: count {} ranks {size}: hand-written {:.2} ms, kolo all_reduce {:.2} ms ({:.1}x), {verdict}",
            args.count,
            ms(ring_time),
            ms(kolo_time),
            ms(ring_time) / ms(kolo_time),
        );
    }
    Ok(bad_ranks[0] == 0)
}

fn main() -> ExitCode {
    let comm = match kolo::init() {
        Ok(comm) => comm,
        Err(e) => {
            let rank = std::env::var("RANK").unwrap_or_else(|_| "?".into());
            eprintln!("rank {rank}: error: {e}");
            kolo::error_file::record_error(&e.to_string()); // shown by torchrun
            return ExitCode::FAILURE;
        }
    };
    match run(&comm) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("rank {}: error: {e}", comm.rank());
            kolo::error_file::record_error(&e.to_string());
            ExitCode::FAILURE
        }
    }
}
