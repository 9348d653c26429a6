//! Coverage-guided fuzz targets for kolo's decoders of bytes that come from the network or from disk.
//!
//! Each target is a function of one input; its first byte picks the decoder:
//!
//! | target | decoders |
//! | --- | --- |
//! | `store` | store requests, responses, both hellos, the job-secret exchange (both sides), store files |
//! | `transport` | TCP hello, TCP frames, the shared-memory message prefix |
//! | `data` | gzip, idx image and label files, CIFAR-10 batches, digits CSV |
//! | `checkpoint` | the `latest` file, safetensors model/optimizer files, `state.json` |
//!
//! A target panics only on a bug (a panic in a decoder, or a decoded value that does not survive
//! re-encoding); refused input is fine. Built with the `afl` feature and instrumented
//! (`scripts/fuzz.sh`), each binary is an AFL++ persistent-mode fuzzer reading its input from AFL++.
//! Built plainly, it replays the files and directories named on its command line, and
//! `--seeds DIR` writes its seed inputs (made by kolo's own encoders) into `DIR`.
#![warn(missing_docs)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub mod targets;

/// A fuzz target: one input in, a panic on a bug.
pub type Target = fn(&[u8]);

/// Every target by name, with its seed inputs (named files, made by kolo's encoders; `dir` is
/// scratch space for encoders that write files).
pub type Seeds = fn(dir: &Path) -> Result<Vec<(String, Vec<u8>)>, String>;

/// The targets: name, entry point, seeds.
pub const TARGETS: &[(&str, Target, Seeds)] = &[
    ("store", targets::store, targets::store_seeds),
    ("transport", targets::transport, targets::transport_seeds),
    ("data", targets::data, targets::data_seeds),
    #[cfg(feature = "train")]
    ("checkpoint", targets::checkpoint, targets::checkpoint_seeds),
];

/// The files named by `paths`: files themselves, and the files directly inside directories, sorted.
pub fn inputs(paths: &[PathBuf]) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut files = Vec::new();
            for entry in std::fs::read_dir(p)? {
                let path = entry?.path();
                if path.is_file() {
                    files.push(path);
                }
            }
            files.sort();
            out.extend(files);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// Runs `target` on every input file in `paths` (see [`inputs`]); returns how many ran.
pub fn replay(target: Target, paths: &[PathBuf]) -> std::io::Result<usize> {
    let files = inputs(paths)?;
    for f in &files {
        let data = std::fs::read(f)?;
        target(&data);
    }
    Ok(files.len())
}

/// The target called `name`.
pub fn find(name: &str) -> Option<(Target, Seeds)> {
    TARGETS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|&(_, t, s)| (t, s))
}

/// Writes the seeds of `seeds` into `dir`, one file per seed; returns how many.
pub fn write_seeds(seeds: Seeds, dir: &Path) -> Result<usize, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let all = seeds(&std::env::temp_dir())?;
    for (name, data) in &all {
        let path = dir.join(name);
        std::fs::write(&path, data).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(all.len())
}

/// The main function of a target's binary: `--seeds DIR` writes the target's seeds into `DIR`;
/// otherwise, built with the `afl` feature, it fuzzes under AFL++, and built plainly, it replays the
/// files and directories named by its arguments.
pub fn main(name: &str) -> ExitCode {
    let Some((target, seeds)) = find(name) else {
        eprintln!("no fuzz target {name}");
        return ExitCode::FAILURE;
    };
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let result = match args.as_slice() {
        [flag, dir] if flag.as_os_str() == "--seeds" => {
            write_seeds(seeds, dir).map(|n| format!("wrote {n} seeds into {}", dir.display()))
        }
        paths => run(target, paths),
    };
    match result {
        Ok(msg) => {
            println!("{msg}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(feature = "afl")]
fn run(target: Target, _: &[PathBuf]) -> Result<String, String> {
    afl::fuzz!(|data: &[u8]| target(data));
    Ok(String::new())
}

#[cfg(not(feature = "afl"))]
fn run(target: Target, paths: &[PathBuf]) -> Result<String, String> {
    if paths.is_empty() {
        return Err("usage: fuzz-TARGET FILE|DIR... (replay) or --seeds DIR".to_string());
    }
    replay(target, paths)
        .map(|n| format!("replayed {n} inputs"))
        .map_err(|e| e.to_string())
}
