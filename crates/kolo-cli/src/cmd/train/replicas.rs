//! A worker with replicas: R threads, each a rank with its own model copy and its share of every
//! batch of the worker (single-process data parallel; Rust has no GIL to serialize them).
//!
//! With one worker the replicas are a world of their own over the in-process transport. With N
//! workers, the worker of rank p (of N) runs ranks p·R … p·R + R − 1 of a world of N·R ranks, each
//! joining through the same rendezvous as a worker process would.

use std::process::ExitCode;

use kolo::{Communicator, InitOptions};
use kolo_train::trainer::TrainConfig;

/// Runs the replicas of this worker; fails if any of them fails.
pub fn worker(replicas: usize, cfg: &TrainConfig) -> ExitCode {
    let comms = match communicators(replicas) {
        Ok(c) => c,
        Err(e) => {
            super::report(&format!("kolo train: worker could not join the job: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let failed = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(i, comm)| {
                std::thread::Builder::new()
                    .name(format!("kolo-replica-{i}"))
                    .spawn_scoped(s, move || super::train_rank(&comm, cfg))
            })
            .collect();
        let mut failed = false;
        for h in handles {
            match h {
                Ok(h) => failed |= !h.join().unwrap_or(false),
                Err(e) => {
                    eprintln!("kolo train: cannot start a replica thread: {e}");
                    failed = true;
                }
            }
        }
        failed
    });
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// This worker's replicas' communicators, in rank order.
fn communicators(replicas: usize) -> kolo::Result<Vec<Communicator>> {
    let base = InitOptions::from_env()?;
    if base.size == 1 {
        return Ok(kolo::local_communicators(replicas, base.config));
    }
    // Every replica joins the rendezvous at once (rank 0 hosts the store the others wait for).
    std::thread::scope(|s| {
        let joins: Vec<_> = (0..replicas)
            .map(|i| {
                let mut opts = base.clone();
                opts.rank = base.rank * replicas + i;
                opts.size = base.size * replicas;
                s.spawn(move || kolo::init_with(opts))
            })
            .collect();
        joins
            .into_iter()
            .map(|j| {
                j.join().unwrap_or_else(|_| {
                    Err(kolo::Error::Config {
                        var: "replicas".into(),
                        value: replicas.to_string(),
                        reason: "a replica's rendezvous thread panicked".into(),
                    })
                })
            })
            .collect()
    })
}
