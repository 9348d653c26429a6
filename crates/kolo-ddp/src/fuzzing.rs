//! Entry points for kolo's fuzz targets (the `kolo-fuzz` crate): the checkpoint readers' real
//! decoders (the `latest` file, safetensors model and optimizer files, `state.json`) run on
//! untrusted file contents, and seeds written by the real checkpoint writer. Not a stable API.
//!
//! Each entry point returns what it accepted, or `None` when the reader refused the contents; it
//! panics only on a broken invariant, which the fuzzer reports as a crash.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::checkpoint::{parse_latest, parse_state, parse_tensors, TrainState};

/// The contents of a `latest` file; an accepted name is a single plain path component.
pub fn latest(data: &[u8]) -> Option<String> {
    let name = parse_latest(Path::new("latest"), data).ok()?;
    let mut parts = Path::new(&name).components();
    assert!(
        matches!(
            (parts.next(), parts.next()),
            (Some(std::path::Component::Normal(_)), None)
        ),
        "accepted checkpoint name {name:?} is not one plain directory name"
    );
    Some(name)
}

/// The contents of a safetensors file; every tensor loaded must convert to f32 (as resuming does).
/// Returns the number of tensors.
pub fn tensors(data: &[u8]) -> Option<usize> {
    let map = parse_tensors(Path::new("model.safetensors"), data, &Device::Cpu).ok()?;
    for (name, t) in &map {
        if let Err(e) = t.to_dtype(DType::F32).and_then(|t| t.flatten_all()) {
            panic!("loaded tensor {name} does not convert to f32: {e}");
        }
    }
    Some(map.len())
}

/// The contents of a `state.json` file; an accepted state must survive a JSON round trip.
pub fn state(data: &[u8]) -> Option<TrainState> {
    let path = Path::new("state.json");
    let state = parse_state(path, data).ok()?;
    let json = match serde_json::to_vec(&state) {
        Ok(j) => j,
        Err(e) => panic!("state {state:?} does not encode: {e}"),
    };
    match parse_state(path, &json) {
        Ok(again) => assert_eq!(again, state, "state changed in a round trip"),
        Err(e) => panic!("re-encoded state does not decode: {e}"),
    }
    Some(state)
}

/// Files written by the real checkpoint code (in `dir`), by name: `latest`, a safetensors file of
/// tensors of several dtypes, and `state.json`.
pub fn seeds(dir: &Path) -> crate::Result<Vec<(&'static str, Vec<u8>)>> {
    let dev = Device::Cpu;
    let tensors: HashMap<&str, Tensor> = [
        ("w", Tensor::new(&[[1f32, -2.0], [0.5, 3.0]], &dev)?),
        ("b", Tensor::new(&[1u8, 2, 3], &dev)?),
        ("m", Tensor::new(&[1.5f64], &dev)?.to_dtype(DType::BF16)?),
    ]
    .into_iter()
    .collect();
    let path = dir.join("seed.safetensors");
    candle_core::safetensors::save(&tensors, &path)?;
    let io = |source| crate::TrainError::Io {
        path: path.clone(),
        source,
    };
    let safetensors = std::fs::read(&path).map_err(io)?;
    std::fs::remove_file(&path).map_err(io)?;
    let state = TrainState {
        epoch: 3,
        step: 1200,
        seed: 42,
        optimizer_steps: 1200,
        model: "mlp".into(),
        dataset: "mnist".into(),
        world_size: 2,
        batch_size: 64,
    };
    let json =
        serde_json::to_vec_pretty(&state).map_err(|source| crate::TrainError::CheckpointJson {
            path: "state.json".into(),
            source,
        })?;
    Ok(vec![
        ("latest", b"epoch-0003".to_vec()),
        ("safetensors", safetensors),
        ("state", json),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_accepted_and_paths_refused() -> crate::Result<()> {
        let dir = tempfile::tempdir().map_err(|source| crate::TrainError::Io {
            path: std::env::temp_dir(),
            source,
        })?;
        let seeds: HashMap<_, _> = seeds(dir.path())?.into_iter().collect();
        assert_eq!(latest(&seeds["latest"]).as_deref(), Some("epoch-0003"));
        assert_eq!(tensors(&seeds["safetensors"]), Some(3));
        assert_eq!(state(&seeds["state"]).map(|s| s.epoch), Some(3));
        assert_eq!(latest(b"../epoch-0003"), None);
        assert_eq!(latest(b"\xff"), None);
        // Found by fuzzing: "." named the checkpoint root itself.
        assert_eq!(latest(b" .\n"), None);
        Ok(())
    }
}
