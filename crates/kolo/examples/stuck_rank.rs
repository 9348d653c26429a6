//! A job in which one rank gets stuck in its own code: the hang `kolo diagnose` is for.
//!
//! Every rank all-reduces a gradient-sized buffer in a loop; the last rank stops before step
//! `STUCK_AT` (default 5) and sleeps. The others wait in that all-reduce until their timeout
//! (`KOLO_TIMEOUT`), fail, and every rank — the stuck one too — writes its flight record:
//!
//! ```text
//! KOLO_TIMEOUT=3 kolo run -n 3 -- target/debug/examples/stuck_rank
//! kolo diagnose /tmp/kolo-trace-<job>      # the directory kolo run prints
//! ```

use std::time::Duration;
// ANCHOR: main
fn main() -> kolo::Result<()> {
    let comm = kolo::init()?;
    let stuck_at: usize = std::env::var("STUCK_AT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let stuck = comm.rank() == comm.size() - 1;
    let mut grad = vec![comm.rank() as f32; 1 << 16];
    for step in 0..stuck_at + 3 {
        if stuck && step == stuck_at {
            // Stuck in its own code (a data loader that never returns, say).
            std::thread::sleep(Duration::from_secs(600));
        }
        comm.all_reduce(&mut grad, kolo::ReduceOp::Sum)?;
        comm.barrier()?;
    }
    println!("rank {} finished", comm.rank());
    Ok(())
}
// ANCHOR_END: main
