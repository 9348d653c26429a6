//! What the flight recorder costs a 4-byte all-reduce, measured without separate runs: two worlds
//! of two threads over shared memory in one process, one recording (the default) and one not
//! (`Config::flight_records = Some(0)`), used in alternating blocks of the same all-reduce; the
//! median over blocks of recording/not-recording time is the cost.
//!
//! ```text
//! cargo run --release -p kolo --example flight_cost [-- BLOCKS ITERS]
//! ```

use std::time::Instant;

use kolo::{Config, ReduceOp};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let blocks: usize = args.next().map_or(Ok(200), |a| a.parse())?;
    let iters: usize = args.next().map_or(Ok(20_000), |a| a.parse())?;
    let on = kolo::shm_communicators(2, Config::default())?;
    let off = kolo::shm_communicators(
        2,
        Config {
            flight_records: Some(0),
            ..Config::default()
        },
    )?;
    let threads: Vec<_> = on
        .into_iter()
        .zip(off)
        .map(|(on, off)| {
            std::thread::spawn(move || -> kolo::Result<Vec<(f64, f64)>> {
                let mut x = [1.0f32];
                let mut block = |c: &kolo::Communicator| -> kolo::Result<f64> {
                    c.barrier()?;
                    let t = Instant::now();
                    for _ in 0..iters {
                        c.all_reduce(&mut x, ReduceOp::Sum)?;
                    }
                    Ok(t.elapsed().as_nanos() as f64 / iters as f64)
                };
                // Warm both up, then alternate which goes first.
                block(&on)?;
                block(&off)?;
                let mut times = Vec::with_capacity(blocks);
                for b in 0..blocks {
                    let (a, z) = if b % 2 == 0 {
                        let a = block(&on)?;
                        (a, block(&off)?)
                    } else {
                        let z = block(&off)?;
                        (block(&on)?, z)
                    };
                    times.push((a, z));
                }
                Ok(times)
            })
        })
        .collect();
    let mut results = Vec::new();
    for t in threads {
        results.push(t.join().map_err(|_| "a rank panicked")??);
    }
    // Rank 0's timings (both ranks take part in every all-reduce).
    let times = &results[0];
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let ratio = median(times.iter().map(|(a, z)| a / z).collect());
    let (on_ns, off_ns) = (
        median(times.iter().map(|t| t.0).collect()),
        median(times.iter().map(|t| t.1).collect()),
    );
    println!(
        "4-byte all-reduce, 2 threads over shared memory, {blocks} alternating blocks of {iters}: \
         recording {on_ns:.1} ns, not recording {off_ns:.1} ns; median ratio {ratio:.4} ({:+.2} %)",
        (ratio - 1.0) * 100.0
    );
    Ok(())
}
