//! What the flight recorder costs a 4-byte all-reduce, measured on one world: two threads over
//! shared memory in one process run blocks of the same all-reduce with recording on and paused in
//! turn (`Communicator::set_flight_recording`); the median over blocks of on/paused time is the
//! cost. (Two worlds, one recording and one not, differ by more than the recorder from the
//! placement of their shared memory alone; separate runs, by the machine's noise.)
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
    let world = kolo::shm_communicators(2, Config::default())?;
    let threads: Vec<_> = world
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || -> kolo::Result<Vec<(f64, f64)>> {
                let mut x = [1.0f32];
                let mut block = |on: bool| -> kolo::Result<f64> {
                    c.set_flight_recording(on);
                    c.barrier()?;
                    let t = Instant::now();
                    for _ in 0..iters {
                        c.all_reduce(&mut x, ReduceOp::Sum)?;
                    }
                    Ok(t.elapsed().as_nanos() as f64 / iters as f64)
                };
                block(true)?;
                block(false)?;
                let mut times = Vec::with_capacity(blocks);
                for b in 0..blocks {
                    // Alternate which goes first.
                    let (on, off) = if b % 2 == 0 {
                        let on = block(true)?;
                        (on, block(false)?)
                    } else {
                        let off = block(false)?;
                        (block(true)?, off)
                    };
                    times.push((on, off));
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
    let ratio = median(times.iter().map(|(on, off)| on / off).collect());
    let (on, off) = (
        median(times.iter().map(|t| t.0).collect()),
        median(times.iter().map(|t| t.1).collect()),
    );
    println!(
        "4-byte all-reduce, 2 threads over shared memory, {blocks} alternating blocks of {iters}: \
         recording {on:.1} ns, paused {off:.1} ns; median ratio {ratio:.4} ({:+.2} %)",
        (ratio - 1.0) * 100.0
    );
    Ok(())
}
