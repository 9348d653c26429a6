//! The GPU path on NVIDIA GPUs and NCCL: the entry points of the ranks `scripts/gpu-check.sh`
//! starts with `kolo run -n N -- <this binary> --ignored --exact <entry>` under
//! `KOLO_BACKEND=nccl`. Each entry point ends with a line `rank R: <what> ok`, which the script
//! counts per rank (a rank that returned early, or a filter that matched nothing, is a failure).
//!
//! - `gpu_collectives_rank`: `gpu::all_reduce_tensor` (NCCL on GPU memory) for every float type
//!   and operator against the host's arithmetic, and the errors of bad tensors;
//! - `gpu_ddp_rank`: the DDP invariant with buckets on the GPU: N ranks with batch b end, after
//!   5 SGD steps, with the parameters of one model trained on batch N·b;
//! - `gpu_mismatch_rank`: ranks that reduce tensors of different lengths all get an error;
//! - `gpu_peer_loss_rank`: rank 1 exits; rank 0's next GPU collective fails within seconds
//!   (kolo's heartbeats), not at the communicator's timeout;
//! - `gpu_stuck_rank`: the flight record of GPU collectives: a queued one is `started` until its
//!   wait sees it done on the GPU, then `completed`; then rank 1 gets stuck in its own code and
//!   rank 0 times out in the next one, for `kolo diagnose` to name (the script checks what it says).
#![cfg(all(feature = "cuda", feature = "nccl"))]

mod common;

use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use candle_nn::{Optimizer, VarBuilder, VarMap, SGD};
use common::{conv_batch, init, params, rank_share, ConvNet};
use kolo::{Communicator, ReduceOp};
use kolo_ddp::ddp::{Ddp, DdpOptions};
use kolo_ddp::device::DeviceKind;
use kolo_ddp::gpu::all_reduce_tensor;

/// The job's world on NCCL and this rank's GPU, or `None` when not started by a launcher.
fn world() -> Option<(Communicator, Device)> {
    if std::env::var("WORLD_SIZE").is_err() {
        eprintln!("not started by a launcher: nothing to do (and no `ok` line)");
        return None;
    }
    let opts = kolo::InitOptions::from_env().expect("launcher environment");
    let comm = kolo::init_nccl(opts).expect("NCCL world");
    let dev = DeviceKind::Cuda
        .device((comm.rank(), comm.local_rank()))
        .expect("this rank's GPU");
    Some((comm, dev))
}

/// Rank `r`'s element `i`: small values, so that products over a few ranks stay exact in f16.
fn value(r: usize, i: usize) -> f64 {
    ((i * 3 + r * 5) % 11) as f64 / 4.0 + 0.5
}

fn expected(op: ReduceOp, n: usize, i: usize) -> f64 {
    let vals = (0..n).map(|r| value(r, i));
    match op {
        ReduceOp::Sum => vals.sum(),
        ReduceOp::Avg => vals.sum::<f64>() / n as f64,
        ReduceOp::Prod => vals.product(),
        ReduceOp::Max => vals.fold(f64::MIN, f64::max),
        ReduceOp::Min => vals.fold(f64::MAX, f64::min),
    }
}

#[test]
#[ignore = "entry point of the ranks scripts/gpu-check.sh starts"]
fn gpu_collectives_rank() {
    let Some((comm, dev)) = world() else { return };
    let (n, r) = (comm.size(), comm.rank());
    let Device::Cuda(cuda) = &dev else {
        panic!("not a GPU")
    };
    assert_eq!(
        comm.device_ordinal(),
        Some(cuda.cuda_stream().context().ordinal())
    );
    let mut failures = Vec::new();
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let tol = match dtype {
            DType::F64 => 1e-12,
            DType::F32 => 1e-6,
            _ => 1e-2,
        };
        for op in ReduceOp::ALL {
            for count in [1usize, 7, 1000, 65_537] {
                let data: Vec<f64> = (0..count).map(|i| value(r, i)).collect();
                let t = Tensor::from_vec(data, count, &dev)
                    .and_then(|t| t.to_dtype(dtype))
                    .expect("tensor on the GPU");
                all_reduce_tensor(&comm, &t, op)
                    .and_then(|w| w.wait())
                    .expect("all-reduce on the GPU");
                let got = t
                    .to_dtype(DType::F64)
                    .and_then(|t| t.to_vec1::<f64>())
                    .expect("back on the host");
                let bad = (0..count)
                    .filter(|&i| {
                        let want = expected(op, n, i);
                        (got[i] - want).abs() > tol * want.abs().max(1.0)
                    })
                    .count();
                if bad > 0 {
                    let i = (0..count)
                        .find(|&i| (got[i] - expected(op, n, i)).abs() > tol)
                        .unwrap_or(0);
                    failures.push(format!(
                        "{dtype:?} {op:?} x{count}: {bad} wrong, [{i}] = {} not {}",
                        got[i],
                        expected(op, n, i)
                    ));
                }
            }
        }
    }
    // A host tensor and an integer tensor are refused before anything is queued.
    let host = Tensor::zeros(4, DType::F32, &Device::Cpu).expect("host tensor");
    let e = all_reduce_tensor(&comm, &host, ReduceOp::Sum).expect_err("a CPU tensor");
    assert!(e.to_string().contains("CUDA tensors"), "{e}");
    let ints = Tensor::zeros(4, DType::U32, &dev).expect("u32 tensor");
    let e = all_reduce_tensor(&comm, &ints, ReduceOp::Sum).expect_err("a u32 tensor");
    assert!(e.to_string().contains("U32"), "{e}");
    assert!(failures.is_empty(), "rank {r}:\n{}", failures.join("\n"));
    comm.barrier().expect("barrier");
    println!("rank {r}: gpu collectives ok");
}

const STEPS: usize = 5;
const LR: f64 = 0.1;

/// The [`ConvNet`] (conv → relu → avg-pool → linear → relu → linear, as tests/ddp.rs) on `vb`.
fn conv_net(vb: VarBuilder) -> ConvNet {
    ConvNet::new(vb, false).expect("net")
}

#[test]
#[ignore = "entry point of the ranks scripts/gpu-check.sh starts"]
fn gpu_ddp_rank() {
    let Some((comm, dev)) = world() else { return };
    let (n, r) = (comm.size(), comm.rank());
    // One model on the whole batch, plain candle on this GPU.
    let reference = {
        let varmap = VarMap::new();
        let net = conv_net(VarBuilder::from_varmap(&varmap, DType::F32, &dev));
        init(&varmap, 0.3).expect("init");
        let mut opt = SGD::new(varmap.all_vars(), LR).expect("sgd");
        for step in 0..STEPS {
            let (x, y) = conv_batch(step, n, &dev).expect("batch");
            opt.backward_step(&net.loss(&x, &y).expect("loss"))
                .expect("step");
        }
        params(&varmap).expect("values")
    };
    // Several buckets (512 bytes), overlapped with backward.
    for overlap in [true, false] {
        let varmap = VarMap::new();
        conv_net(VarBuilder::from_varmap(&varmap, DType::F32, &dev));
        if r == 0 {
            init(&varmap, 0.3).expect("init"); // the others start elsewhere: Ddp copies rank 0's
        }
        let opts = DdpOptions {
            bucket_bytes: 512,
            overlap,
            ..DdpOptions::default()
        };
        let ddp = Ddp::new(&comm, &varmap, opts).expect("ddp");
        assert_eq!(ddp.buckets_on_gpu(), n > 1, "buckets on the GPU");
        assert!(ddp.layout().count() > 2, "several buckets");
        let mut opt =
            SGD::new(ddp.params().iter().map(|(_, v)| v.clone()).collect(), LR).expect("sgd");
        for step in 0..STEPS {
            let net = conv_net(ddp.var_builder(DType::F32, &dev));
            let batch = conv_batch(step, n, &dev).expect("batch");
            let (x, y) = rank_share(&batch, r).expect("this rank's share");
            let grads = ddp.backward(&net.loss(&x, &y).expect("loss")).expect("ddp");
            opt.step(&grads).expect("sgd step");
        }
        for ((name, want), (_, got)) in reference.iter().zip(params(&varmap).expect("values")) {
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * a.abs().max(1.0),
                    "rank {r}, overlap {overlap}: {name}[{i}] = {b}, the one-process model has {a}"
                );
            }
        }
    }
    comm.barrier().expect("barrier");
    println!("rank {r}: gpu ddp ok");
}

#[test]
#[ignore = "entry point of the ranks scripts/gpu-check.sh starts"]
fn gpu_mismatch_rank() {
    let Some((comm, dev)) = world() else { return };
    let r = comm.rank();
    let t = Tensor::ones(if r == 1 { 12 } else { 10 }, DType::F32, &dev).expect("tensor");
    let e = all_reduce_tensor(&comm, &t, ReduceOp::Sum)
        .and_then(|w| w.wait())
        .expect_err("a mismatched call must fail");
    let text = e.to_string();
    assert!(
        text.contains("mismatch") || text.contains("Mismatch") || text.contains("abort"),
        "{text}"
    );
    println!("rank {r}: gpu mismatch ok: {text}");
}

#[test]
#[ignore = "entry point of the ranks scripts/gpu-check.sh starts"]
fn gpu_peer_loss_rank() {
    let Some((comm, dev)) = world() else { return };
    let r = comm.rank();
    let t = Tensor::ones(1 << 20, DType::F32, &dev).expect("tensor");
    all_reduce_tensor(&comm, &t, ReduceOp::Sum)
        .and_then(|w| w.wait())
        .expect("first all-reduce");
    if r == 1 {
        println!("rank 1: leaving the job");
        std::process::exit(0);
    }
    std::thread::sleep(Duration::from_secs(1));
    let started = Instant::now();
    let e = all_reduce_tensor(&comm, &t, ReduceOp::Sum)
        .and_then(|w| w.wait())
        .expect_err("rank 1 is gone");
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(30),
        "the error took {waited:?}: {e}"
    );
    println!("rank {r}: gpu peer loss ok after {waited:?}: {e}");
}

/// The state of the last collective in this rank's flight record.
fn last_state(comm: &Communicator) -> String {
    let dump = comm.flight_record("gpu check");
    dump.groups
        .iter()
        .flat_map(|g| g.collectives.last())
        .map(|o| o.state.clone())
        .next_back()
        .unwrap_or_default()
}

#[test]
#[ignore = "entry point of the ranks scripts/gpu-check.sh starts"]
fn gpu_stuck_rank() {
    let Some((comm, dev)) = world() else { return };
    let r = comm.rank();
    let t = Tensor::ones(1 << 20, DType::F32, &dev).expect("tensor");
    for _ in 0..3 {
        let work = all_reduce_tensor(&comm, &t, ReduceOp::Sum).expect("queued");
        assert_eq!(
            last_state(&comm),
            "started",
            "queued on the GPU, not waited for"
        );
        work.wait().expect("all-reduce");
        assert_eq!(last_state(&comm), "completed", "waited for");
    }
    if r == 1 {
        println!("rank 1: stuck in its own code");
        std::thread::sleep(Duration::from_secs(300));
    }
    let e = all_reduce_tensor(&comm, &t, ReduceOp::Sum)
        .and_then(|w| w.wait())
        .expect_err("rank 1 never enters");
    assert_eq!(last_state(&comm), "failed");
    println!("rank {r}: gpu stuck ok: {e}");
    // A failed rank: kolo run asks the others for their records and stops them.
    std::process::exit(3);
}
