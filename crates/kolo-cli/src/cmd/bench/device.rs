//! `kolo bench allreduce --device cuda`: the all-reduce of GPU memory through kolo's device
//! collectives (NCCL's `ncclAllReduce` on the engine's stream, after the fingerprint step every
//! collective starts with), timed and checked as on the host: known data (element i of rank r is
//! (i % 7) + r), --warmup untimed iterations, --iters timed ones (queued back to back, then waited
//! for), the slowest rank's mean, a final check on fresh data.

use kolo::Communicator;

use super::BenchArgs;
#[cfg(feature = "cuda")]
use super::Row;

/// Times every size on the GPU; returns the wrong elements.
#[cfg(feature = "cuda")]
pub(super) fn run(comm: &Communicator, args: &BenchArgs) -> kolo::Result<u64> {
    let implementation = format!("kolo-{}-cuda", comm.backend());
    let device = kolo_ddp::device::DeviceKind::Cuda
        .device((comm.rank(), comm.local_rank()))
        .map_err(|e| kolo::Error::Unsupported {
            what: e.to_string(),
        })?;
    super::report(comm, args, (&implementation, "f32"), |bytes| {
        bench_size(comm, args, &device, bytes).map_err(|e| match e {
            kolo_ddp::TrainError::Comm(e) => e,
            e => kolo::Error::Unsupported {
                what: e.to_string(),
            },
        })
    })
}

#[cfg(feature = "cuda")]
fn bench_size(
    comm: &Communicator,
    args: &BenchArgs,
    device: &candle_core::Device,
    bytes: u64,
) -> kolo_ddp::Result<Row> {
    use candle_core::Tensor;
    use kolo::ReduceOp;
    use kolo_ddp::gpu::all_reduce_tensor;
    use std::time::Instant;

    let (n, rank) = (comm.size(), comm.rank());
    let count = (bytes / 4).max(1) as usize;
    let known = || {
        let data: Vec<f32> = (0..count).map(|i| (i % 7) as f32 + rank as f32).collect();
        Tensor::from_vec(data, count, device)
    };
    let buf = known()?;
    for _ in 0..args.warmup {
        all_reduce_tensor(comm, &buf, ReduceOp::Sum)?.wait()?;
    }
    let iters = args.iters.unwrap_or_else(|| super::default_iters(bytes));
    comm.barrier()?;
    // Queued back to back, then waited for, as nccl-tests times them (each queuing waits for the
    // ranks' agreement on the call unless KOLO_CONFIRM_CALLS=0).
    let start = Instant::now();
    let queued = (0..iters)
        .map(|_| all_reduce_tensor(comm, &buf, ReduceOp::Sum))
        .collect::<kolo_ddp::Result<Vec<_>>>()?;
    for w in queued {
        w.wait()?;
    }
    let mut elapsed = [start.elapsed().as_secs_f64()];
    // Once more on fresh known data, checked on the host.
    let fresh = known()?;
    all_reduce_tensor(comm, &fresh, ReduceOp::Sum)?.wait()?;
    let got = fresh.to_vec1::<f32>()?;
    let tri = (n * (n - 1) / 2) as f64;
    let wrong = super::count_wrong(&got, |i| n as f64 * (i % 7) as f64 + tri);
    comm.all_reduce(&mut elapsed, ReduceOp::Max)?;
    let mut wrong_all = [wrong as i64];
    comm.all_reduce(&mut wrong_all, ReduceOp::Sum)?;
    let time = elapsed[0] / iters as f64;
    let algbw = (count * 4) as f64 / time / 1e9;
    Ok(Row {
        bytes: (count * 4) as u64,
        count,
        time_us: time * 1e6,
        algbw,
        busbw: algbw * super::Op::Allreduce.bus_factor(n),
        wrong: wrong_all[0].max(0) as u64,
    })
}

/// Without CUDA in this build, GPU buffers are an error naming the fix.
#[cfg(not(feature = "cuda"))]
pub(super) fn run(_comm: &Communicator, _args: &BenchArgs) -> kolo::Result<u64> {
    Err(kolo::Error::Unsupported {
        what: "--device cuda: this build of kolo has no CUDA support (build it with \
               `--features kolo-cli/cuda,kolo-cli/nccl`)"
            .into(),
    })
}
