//! Reporting a worker's error to torchrun: the JSON file named by `TORCHELASTIC_ERROR_FILE`, which
//! torchrun reads when a worker fails and shows as the "Root Cause" of the job's failure summary
//! (what PyTorch's `@record` decorator writes for a Python worker).
//!
//! A communicator writes its first failure there by itself (a mismatch, a lost peer, a timeout,
//! an abort — each naming the rank and the call); [`record`] wraps a whole program so that any
//! error it returns, or a panic, is written too. The first error of the process is kept: later
//! ones (often consequences of the first) do not overwrite it. Outside torchrun (the variable is
//! unset) nothing is written.

use std::fmt::Display;
use std::io::Write;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// The variable torchrun sets to the error file of each worker.
pub const ERROR_FILE_ENV: &str = "TORCHELASTIC_ERROR_FILE";

/// The error file this process should write, if a launcher named one.
pub fn error_file() -> Option<PathBuf> {
    error_file_in(kolo_core::settings::ProcessEnv)
}

/// The error file `env` names, if any.
pub fn error_file_in(env: impl kolo_core::settings::Env) -> Option<PathBuf> {
    env.lookup_os(ERROR_FILE_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The JSON torchrun expects: `{"message": {"message": ..., "extraInfo": {"py_callstack": ...,
/// "timestamp": "<unix seconds>"}}}`, `since_epoch` the moment of the error. Its summary prints
/// `py_callstack`, so that holds the whole message. `extraInfo` also holds `kolo_unix_ns`, the
/// moment to the nanosecond: `kolo run` reads it to tell which of several failing ranks failed
/// first (torchrun's whole seconds cannot).
pub fn error_json(message: &str, since_epoch: std::time::Duration) -> String {
    let text = format!("KoloError: {message}");
    serde_json::json!({
        "message": {
            "message": text,
            "extraInfo": {
                "py_callstack": text,
                "timestamp": since_epoch.as_secs().to_string(),
                "kolo_unix_ns": since_epoch.as_nanos().to_string(),
            }
        }
    })
    .to_string()
}

/// Writes `message` to `path` unless the file already holds an earlier error; returns whether it
/// wrote. The file is created whole (written to a temporary name, then renamed), so torchrun never
/// reads half of it.
pub fn write_error_file(path: &Path, message: &str) -> std::io::Result<bool> {
    // One writer at a time in this process (a communicator's thread and the SIGTERM report may
    // race): the first error wins and the temporary file is never shared.
    static WRITING: Mutex<()> = Mutex::new(());
    let _one = WRITING.lock().unwrap_or_else(|p| p.into_inner());
    if path.exists() {
        return Ok(false);
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let tmp = path.with_extension(format!("kolo-{}.tmp", std::process::id()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        // No fsync: torchrun reads the file on this machine, and a worker being stopped has
        // milliseconds to finish writing.
        f.write_all(error_json(message, now).as_bytes())?;
    }
    std::fs::rename(&tmp, path)?;
    Ok(true)
}

/// Writes `message` to this process's error file, if torchrun named one (see the module
/// documentation). Failing to write is reported on stderr, never an error of its own.
pub fn record_error(message: &str) {
    if let Some(path) = error_file() {
        if let Err(e) = write_error_file(&path, message) {
            eprintln!(
                "kolo: could not write the error file {} ({ERROR_FILE_ENV}): {e}",
                path.display()
            );
        }
    }
}

/// Runs `main` and records its error or panic in torchrun's error file, like PyTorch's `@record`
/// decorator; returns what `main` returned (a panic goes on unwinding after it is recorded).
///
/// ```no_run
/// fn main() -> Result<(), kolo::Error> {
///     kolo::error_file::record(|| {
///         let comm = kolo::init()?;
///         let mut x = [comm.rank() as f32];
///         comm.all_reduce(&mut x, kolo::ReduceOp::Sum)?;
///         Ok(())
///     })
/// }
/// ```
pub fn record<T, E: Display>(main: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    match catch_unwind(AssertUnwindSafe(main)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            record_error(&e.to_string());
            Err(e)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            record_error(&format!("panicked: {what}"));
            resume_unwind(panic)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_is_what_torchrun_parses() {
        let j: serde_json::Value = serde_json::from_str(&error_json(
            "rank 1: \"x\"\nlost",
            std::time::Duration::new(1_700_000_000, 5),
        ))
        .unwrap_or_default();
        assert_eq!(
            j["message"]["message"].as_str(),
            Some("KoloError: rank 1: \"x\"\nlost")
        );
        assert_eq!(
            j["message"]["extraInfo"]["py_callstack"].as_str(),
            Some("KoloError: rank 1: \"x\"\nlost")
        );
        assert_eq!(
            j["message"]["extraInfo"]["timestamp"].as_str(),
            Some("1700000000")
        );
        assert_eq!(
            j["message"]["extraInfo"]["kolo_unix_ns"].as_str(),
            Some("1700000000000000005")
        );
    }

    #[test]
    fn the_first_error_is_kept() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("error.json");
        assert!(write_error_file(&path, "first")?);
        assert!(!write_error_file(&path, "second")?);
        let text = std::fs::read_to_string(&path)?;
        assert!(text.contains("first") && !text.contains("second"), "{text}");
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path())?.count(), 1);
        Ok(())
    }
}
