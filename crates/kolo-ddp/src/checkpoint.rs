//! Checkpoints: model parameters and buffers (safetensors), optimizer state (safetensors) and training
//! state (JSON), written by rank 0 at the end of each epoch and read back by `--resume`.
//!
//! Layout of a checkpoint directory:
//!
//! ```text
//! checkpoints/
//!   epoch-0003/model.safetensors, optimizer.safetensors, state.json
//!   latest            text: the directory name of the newest complete checkpoint
//! ```
//!
//! Atomic: a checkpoint is written into `epoch-NNNN.tmp/`, renamed to `epoch-NNNN/`, and only then is
//! `latest` replaced (written to `latest.tmp`, then renamed). A job killed at any moment leaves either
//! the previous checkpoint or the new one as `latest`, never a half-written one. Older checkpoints
//! beyond the newest two are removed.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Shape, Tensor, Var};
use kolo::Communicator;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};
use crate::optim::OptimizerState;
use crate::vars_comm::Flat;

/// Training progress saved with each checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Epochs completed.
    pub epoch: usize,
    /// Global optimizer steps taken.
    pub step: u64,
    /// Seed of the sampler and initialization.
    pub seed: u64,
    /// Optimizer step count (its bias corrections).
    pub optimizer_steps: u64,
    /// Model name, to refuse resuming another model.
    pub model: String,
    /// Dataset name.
    pub dataset: String,
    /// Number of workers that wrote it.
    pub world_size: usize,
    /// Per-worker batch size.
    pub batch_size: usize,
}

impl TrainState {
    /// The progress after `epoch` epochs and `step` optimizer steps (the rest empty: the fields
    /// `kolo train` fills to refuse resuming another model, dataset or batch).
    pub fn at(epoch: usize, step: u64) -> TrainState {
        TrainState {
            epoch,
            step,
            ..TrainState::default()
        }
    }
}

/// A checkpoint read from disk.
#[derive(Debug)]
pub struct Checkpoint {
    /// Directory it was read from.
    pub dir: PathBuf,
    /// Parameters and buffers by name.
    pub model: HashMap<String, Tensor>,
    /// Optimizer state by name.
    pub optimizer: HashMap<String, Tensor>,
    /// Training progress.
    pub state: TrainState,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn tensors_err(path: &Path) -> impl FnOnce(candle_core::Error) -> TrainError + '_ {
    move |source| TrainError::CheckpointTensors {
        path: path.to_path_buf(),
        source,
    }
}

fn json_err(path: &Path) -> impl FnOnce(serde_json::Error) -> TrainError + '_ {
    move |source| TrainError::CheckpointJson {
        path: path.to_path_buf(),
        source,
    }
}

fn bad(path: &Path, reason: impl Into<String>) -> TrainError {
    TrainError::Checkpoint {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Writes a checkpoint of `vars` (parameters and buffers), `optimizer` and `state` into `root`.
/// A [`ShardedOptimizer`](crate::optim::ShardedOptimizer) is refused (its state is one rank's
/// shard): save what its [`gather_state`](crate::optim::DynOptimizer::gather_state) returns on
/// rank 0 instead (a collective: call it on every rank).
pub fn save(
    root: &Path,
    vars: &[(String, Var)],
    optimizer: &dyn OptimizerState,
    state: &TrainState,
) -> Result<PathBuf> {
    if optimizer.is_shard() {
        return Err(bad(
            root,
            "the optimizer's state is this rank's shard of a ShardedOptimizer: save \
             opt.gather_state()? (called on every rank; Some on rank 0) instead",
        ));
    }
    fs::create_dir_all(root).map_err(io(root))?;
    let name = format!("epoch-{:04}", state.epoch);
    let tmp = root.join(format!("{name}.tmp"));
    let dir = root.join(&name);
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let model: HashMap<String, Tensor> = vars
        .iter()
        .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
        .collect();
    let mpath = tmp.join("model.safetensors");
    candle_core::safetensors::save(&model, &mpath).map_err(tensors_err(&mpath))?;
    let opt: HashMap<String, Tensor> = optimizer.state().into_iter().collect();
    let opath = tmp.join("optimizer.safetensors");
    candle_core::safetensors::save(&opt, &opath).map_err(tensors_err(&opath))?;
    let spath = tmp.join("state.json");
    let json = serde_json::to_vec_pretty(state).map_err(json_err(&spath))?;
    fs::write(&spath, json).map_err(io(&spath))?;
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(io(&dir))?;
    }
    fs::rename(&tmp, &dir).map_err(io(&dir))?;
    let latest_tmp = root.join("latest.tmp");
    fs::write(&latest_tmp, &name).map_err(io(&latest_tmp))?;
    fs::rename(&latest_tmp, root.join("latest")).map_err(io(root))?;
    prune(root, &name)?;
    Ok(dir)
}

/// Removes complete checkpoints older than the newest two.
fn prune(root: &Path, newest: &str) -> Result<()> {
    let mut names: Vec<String> = fs::read_dir(root)
        .map_err(io(root))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("epoch-") && !n.ends_with(".tmp") && n.as_str() <= newest)
        .collect();
    names.sort();
    let keep = names.len().saturating_sub(2);
    for n in &names[..keep] {
        let p = root.join(n);
        fs::remove_dir_all(&p).map_err(io(&p))?;
    }
    Ok(())
}

/// Reads the newest complete checkpoint under `root`, or `None` if there is none.
pub fn load_latest(root: &Path, device: &Device) -> Result<Option<Checkpoint>> {
    let latest = root.join("latest");
    let text = match fs::read(&latest) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&latest)(e)),
    };
    let name = parse_latest(&latest, &text)?;
    let dir = root.join(&name);
    let read = |path: &Path| fs::read(path).map_err(io(path));
    let mpath = dir.join("model.safetensors");
    let model = parse_tensors(&mpath, &read(&mpath)?, device)?;
    let opath = dir.join("optimizer.safetensors");
    let optimizer = parse_tensors(&opath, &read(&opath)?, device)?;
    let spath = dir.join("state.json");
    let state = parse_state(&spath, &read(&spath)?)?;
    Ok(Some(Checkpoint {
        dir,
        model,
        optimizer,
        state,
    }))
}

/// Rank 0 reads the newest checkpoint under `root` ([`load_latest`]) and every rank learns its
/// progress, or that there is none (`None` on every rank) — or, where rank 0 could not read it,
/// that it failed and why (on the other ranks an error naming rank 0), not only that rank 0
/// stopped. A collective. Rank 0's result also holds the checkpoint, whose tensors
/// [`broadcast_tensors`] then sends.
pub fn load_latest_on_rank0(
    comm: &Communicator,
    root: &Path,
    device: &Device,
) -> Result<Option<(TrainState, Option<Checkpoint>)>> {
    let loaded = (comm.rank() == 0).then(|| load_latest(root, device));
    let told = loaded.as_ref().map(|r| match r {
        Ok(c) => Ok(c.as_ref().map(|c| c.state.clone())),
        Err(e) => Err(e.to_string()),
    });
    let told: std::result::Result<Option<TrainState>, String> = comm.broadcast_object(told, 0)?;
    match (loaded, told) {
        (Some(Err(e)), _) => Err(e),
        (_, Err(reason)) => Err(TrainError::Checkpoint {
            path: root.to_path_buf(),
            reason: format!("rank 0 could not read the newest checkpoint: {reason}"),
        }),
        (_, Ok(None)) => Ok(None),
        (loaded, Ok(Some(state))) => Ok(Some((state, loaded.and_then(|r| r.ok().flatten())))),
    }
}

/// The checkpoint directory named by the contents of the `latest` file at `path`: one plain name,
/// no path.
pub(crate) fn parse_latest(path: &Path, text: &[u8]) -> Result<String> {
    let name = std::str::from_utf8(text)
        .map_err(|_| bad(path, "is not UTF-8 text"))?
        .trim();
    // One plain directory name: not empty, no separator, not `.` or `..`.
    let mut parts = Path::new(name).components();
    let plain = matches!(
        (parts.next(), parts.next()),
        (Some(std::path::Component::Normal(_)), None)
    );
    if !plain || name.contains('/') || name.contains("..") {
        return Err(bad(
            path,
            format!("names an invalid checkpoint directory {name:?}"),
        ));
    }
    Ok(name.to_string())
}

/// The tensors of the safetensors file at `path`, whose contents are `bytes`.
pub(crate) fn parse_tensors(
    path: &Path,
    bytes: &[u8],
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    candle_core::safetensors::load_buffer(bytes, device).map_err(tensors_err(path))
}

/// The training state in the JSON file at `path`, whose contents are `bytes`.
pub(crate) fn parse_state(path: &Path, bytes: &[u8]) -> Result<TrainState> {
    serde_json::from_slice(bytes).map_err(json_err(path))
}

/// Copies saved values into `vars` (every variable must be present with its shape).
pub fn restore_vars(
    path: &Path,
    vars: &[(String, Var)],
    saved: &HashMap<String, Tensor>,
) -> Result<()> {
    for (name, var) in vars {
        let t = saved
            .get(name)
            .ok_or_else(|| bad(path, format!("has no tensor {name}")))?;
        if t.dims() != var.dims() {
            return Err(bad(
                path,
                format!(
                    "tensor {name} has shape {:?}, the model expects {:?}",
                    t.dims(),
                    var.dims()
                ),
            ));
        }
        var.set(&t.to_dtype(var.dtype())?)?;
    }
    Ok(())
}

/// Broadcasts named tensors from `root` to every rank: the root passes its tensors, the others get
/// copies (same names, shapes, types and values); every rank returns the tensors on `device`. The
/// names, shapes and types go first, then the values in one flat broadcast per type (f64 state and
/// integer step counts stay exact; f16 and bf16 travel as f32, u32 as i64, all exactly).
pub fn broadcast_tensors(
    comm: &Communicator,
    root: usize,
    tensors: Option<&HashMap<String, Tensor>>,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    let mut entries: Vec<(String, Vec<usize>, String)> = tensors
        .map(|t| {
            t.iter()
                .map(|(k, v)| (k.clone(), v.dims().to_vec(), v.dtype().as_str().to_string()))
                .collect()
        })
        .unwrap_or_default();
    entries.sort();
    let entries: Vec<(String, Vec<usize>, String)> =
        comm.broadcast_object((comm.rank() == root).then_some(entries), root)?;
    let mut out = HashMap::with_capacity(entries.len());
    for dtype in [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::U32,
        DType::U8,
    ] {
        let group: Vec<&(String, Vec<usize>, String)> =
            entries.iter().filter(|e| e.2 == dtype.as_str()).collect();
        if group.is_empty() {
            continue;
        }
        let mine = tensors.filter(|_| comm.rank() == root);
        let got = match dtype {
            // f16 and bf16 are exact in f32, u32 in i64: cast back below.
            DType::F32 | DType::F16 | DType::BF16 => {
                broadcast_group::<f32>(comm, root, mine, &group, device)?
            }
            DType::F64 => broadcast_group::<f64>(comm, root, mine, &group, device)?,
            DType::U8 => broadcast_group::<u8>(comm, root, mine, &group, device)?,
            _ => broadcast_group::<i64>(comm, root, mine, &group, device)?,
        };
        for ((name, _, _), t) in group.into_iter().zip(got) {
            out.insert(name.clone(), t.to_dtype(dtype)?);
        }
    }
    if out.len() != entries.len() {
        let unknown: Vec<&str> = entries
            .iter()
            .filter(|e| !out.contains_key(&e.0))
            .map(|e| e.0.as_str())
            .collect();
        return Err(TrainError::Unsupported {
            what: format!("broadcasting tensors of an unsupported type: {unknown:?}"),
        });
    }
    Ok(out)
}

/// One flat broadcast of the tensors `group` names (all of one type, `T` on the wire).
fn broadcast_group<T: kolo::Element + candle_core::WithDType>(
    comm: &Communicator,
    root: usize,
    tensors: Option<&HashMap<String, Tensor>>,
    group: &[&(String, Vec<usize>, String)],
    device: &Device,
) -> Result<Vec<Tensor>> {
    let mut flat = match tensors {
        Some(t) => Flat::<T>::of(group.iter().filter_map(|(name, _, _)| t.get(name)))?,
        None => Flat::zeros(
            group
                .iter()
                .map(|(_, d, _)| Shape::from(d.clone()))
                .collect(),
        ),
    };
    comm.broadcast(flat.values_mut(), root)?;
    flat.tensors(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_tensors_keeps_every_type_and_value() -> Result<()> {
        let dev = Device::Cpu;
        let mut sent = HashMap::new();
        // Values f32 cannot hold: an f64 with more than 24 bits of mantissa, a step count past 2^24.
        sent.insert(
            "m.f64".to_string(),
            Tensor::new(&[0.1f64, 1.0 + 1e-12], &dev)?,
        );
        sent.insert("step".to_string(), Tensor::new(&[(1i64 << 40) + 1], &dev)?);
        sent.insert("count".to_string(), Tensor::new(&[16_777_217u32], &dev)?);
        sent.insert("w".to_string(), Tensor::new(&[[1.5f32, -2.0]], &dev)?);
        sent.insert(
            "h".to_string(),
            Tensor::new(&[0.3f32], &dev)?.to_dtype(DType::BF16)?,
        );
        sent.insert("b".to_string(), Tensor::new(&[7u8, 250], &dev)?);
        let got = kolo::run_local(3, kolo::Config::default(), |comm| {
            let mine = (comm.rank() == 1).then_some(&sent);
            broadcast_tensors(&comm, 1, mine, &dev)
        });
        for (r, g) in got.into_iter().enumerate() {
            let g = match g {
                Ok(Ok(g)) => g,
                other => panic!("rank {r}: {other:?}"),
            };
            assert_eq!(g.len(), sent.len());
            for (name, t) in &sent {
                let u = &g[name];
                assert_eq!(u.dtype(), t.dtype(), "rank {r}: {name}");
                assert_eq!(u.dims(), t.dims(), "rank {r}: {name}");
                let same = t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?
                    == u.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
                assert!(same, "rank {r}: {name} changed");
            }
        }
        Ok(())
    }
}
