//! Which GPU a rank uses: the one rule kolo's NCCL engine and `kolo train --device cuda` share,
//! PyTorch's `torch.cuda.set_device(local_rank)` with two additions: `KOLO_CUDA_DEVICE` names the
//! GPU outright, and a rank that sees exactly one GPU because its launcher gave it its own
//! (`CUDA_VISIBLE_DEVICES`, as `srun --gpus-per-task=1` sets it) uses that one.

use crate::settings::Env;
use crate::{Error, Result};

/// The CUDA device ordinal of the rank with local rank `local_rank` (rank `rank`) on a host where
/// it sees `visible` GPUs; an error naming the fix where it has none.
pub fn device_ordinal(
    env: impl Env,
    (rank, local_rank): (usize, usize),
    visible: usize,
) -> Result<usize> {
    let out_of_range = |ordinal: usize, var: &str, value: String| Error::Config {
        var: var.into(),
        value,
        reason: format!(
            "rank {rank} would use GPU {ordinal}, but it sees {visible}: start at most one \
             process per GPU on each host, or name each rank's GPU with KOLO_CUDA_DEVICE"
        ),
    };
    if let Some(v) = env.lookup("KOLO_CUDA_DEVICE") {
        let ordinal: usize = v.trim().parse().map_err(|_| Error::Config {
            var: "KOLO_CUDA_DEVICE".into(),
            value: v.clone(),
            reason: "expected a GPU number (0, 1, ...)".into(),
        })?;
        return match ordinal < visible {
            true => Ok(ordinal),
            false => Err(out_of_range(ordinal, "KOLO_CUDA_DEVICE", v)),
        };
    }
    let own_gpu = visible == 1
        && env
            .lookup("CUDA_VISIBLE_DEVICES")
            .is_some_and(|d| d.split(',').filter(|s| !s.trim().is_empty()).count() == 1);
    match local_rank < visible {
        true => Ok(local_rank),
        false if own_gpu => Ok(0),
        false => Err(out_of_range(
            local_rank,
            "LOCAL_RANK",
            local_rank.to_string(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::MapEnv;

    fn env(vars: &[(&str, &str)]) -> MapEnv {
        vars.iter().copied().collect()
    }

    #[test]
    fn local_rank_by_default_and_kolo_cuda_device_outright() {
        assert_eq!(device_ordinal(env(&[]), (5, 1), 4).ok(), Some(1));
        let named = env(&[("KOLO_CUDA_DEVICE", "3")]);
        assert_eq!(device_ordinal(named, (5, 1), 4).ok(), Some(3));
        let e =
            device_ordinal(env(&[("KOLO_CUDA_DEVICE", "4")]), (5, 1), 4).expect_err("GPU 4 of 4");
        assert!(e.to_string().contains("rank 5 would use GPU 4"), "{e}");
        let e =
            device_ordinal(env(&[("KOLO_CUDA_DEVICE", "x")]), (0, 0), 1).expect_err("not a number");
        assert!(e.to_string().contains("KOLO_CUDA_DEVICE"), "{e}");
    }

    #[test]
    fn a_rank_given_its_own_gpu_uses_it_and_too_few_gpus_is_an_error() {
        let own = env(&[("CUDA_VISIBLE_DEVICES", "3")]);
        assert_eq!(device_ordinal(own, (7, 3), 1).ok(), Some(0));
        // Every rank sees the same two GPUs: local rank 2 has none.
        let shared = env(&[("CUDA_VISIBLE_DEVICES", "0,1")]);
        let e = device_ordinal(shared, (2, 2), 2).expect_err("two GPUs, local rank 2");
        assert!(e.to_string().contains("KOLO_CUDA_DEVICE"), "{e}");
        let e = device_ordinal(env(&[]), (1, 1), 1).expect_err("one GPU, not the rank's own");
        assert!(e.to_string().contains("rank 1 would use GPU 1"), "{e}");
    }
}
