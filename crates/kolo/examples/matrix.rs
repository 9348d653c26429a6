//! Scatter, all-reduce and all-gather on a small array (a port of the classic mpi4py example).
//!
//! Rank 0 builds `0, 1, ..., 7` and scatters it in equal parts; every rank sums its part and squares
//! it, the sums are all-reduced and the squares all-gathered, and rank 0 prints `sum: 28` and
//! `squares: 0 1 4 9 16 25 36 49`. The world size must divide 8.
//!
//! Run: `kolo run -n 4 -- target/release/examples/matrix`

use std::error::Error;
use std::process::ExitCode;

use kolo::{Communicator, ReduceOp};

/// Length of the array rank 0 scatters.
const N: usize = 8;

fn join(values: &[f64]) -> String {
    let text: Vec<String> = values.iter().map(f64::to_string).collect();
    text.join(" ")
}

fn run(comm: &Communicator) -> Result<(), Box<dyn Error>> {
    // ANCHOR: collectives
    let (rank, size) = (comm.rank(), comm.size());
    let data: Vec<f64> = if rank == 0 {
        (0..N).map(|i| i as f64).collect()
    } else {
        Vec::new() // only the root's send buffer is read
    };
    let mut part = vec![0.0; N / size];
    comm.scatter(&data, &mut part, 0)?;
    println!("part: {}", join(&part));

    let mut sum = [part.iter().sum::<f64>()];
    comm.all_reduce(&mut sum, ReduceOp::Sum)?;

    let squares: Vec<f64> = part.iter().map(|x| x * x).collect();
    let mut all = vec![0.0; N];
    comm.all_gather(&squares, &mut all)?;
    // ANCHOR_END: collectives

    if rank == 0 {
        println!("sum: {}", sum[0]);
        println!("squares: {}", join(&all));
    }
    Ok(())
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
    let (rank, size) = (comm.rank(), comm.size());
    // Checked on every rank, so that no rank waits in the scatter for one that gave up.
    if (N / size) * size != N {
        let msg = format!(
            "world size {size} does not divide the {N} elements; run with 1, 2, 4 or 8 processes"
        );
        eprintln!("rank {rank}: error: {msg}");
        kolo::error_file::record_error(&msg);
        return ExitCode::from(2);
    }
    match run(&comm) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rank {rank}: error: {e}");
            kolo::error_file::record_error(&e.to_string()); // shown by torchrun
            ExitCode::FAILURE
        }
    }
}
