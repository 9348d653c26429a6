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

use candle_core::{Device, Shape, Tensor, Var};
use kolo::Communicator;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};
use crate::optim::OptimizerState;
use crate::vars_comm::Flat;

/// Training progress saved with each checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
/// copies (same names, shapes, f32 values); every rank returns f32 tensors on `device`. The names
/// and shapes go first, then the values in one flat broadcast.
pub fn broadcast_tensors(
    comm: &Communicator,
    root: usize,
    tensors: Option<&HashMap<String, Tensor>>,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    let mut entries: Vec<(String, Vec<usize>)> = tensors
        .map(|t| {
            t.iter()
                .map(|(k, v)| (k.clone(), v.dims().to_vec()))
                .collect()
        })
        .unwrap_or_default();
    entries.sort();
    let entries: Vec<(String, Vec<usize>)> =
        comm.broadcast_object((comm.rank() == root).then_some(entries), root)?;
    let shapes = entries
        .iter()
        .map(|(_, d)| Shape::from(d.clone()))
        .collect();
    let mut flat = match tensors {
        Some(t) if comm.rank() == root => {
            Flat::<f32>::of(entries.iter().filter_map(|(name, _)| t.get(name)))?
        }
        _ => Flat::zeros(shapes),
    };
    comm.broadcast(flat.values_mut(), root)?;
    let names = entries.into_iter().map(|(name, _)| name);
    Ok(names.zip(flat.tensors(device)?).collect())
}
