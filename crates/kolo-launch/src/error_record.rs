//! The errors workers record for their launcher: each worker's `TORCHELASTIC_ERROR_FILE`, the JSON
//! torchrun reads, which kolo's communicators (and `kolo::error_file::record`, and PyTorch's
//! `@record`) write on a worker's first error. Read back to show the root cause's own message, and
//! to tell which rank failed first: a rank that aborts the others records its error before they
//! record theirs, though it may exit after them.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::spawn::{JobEnv, Worker};
use crate::Termination;

/// The variable naming a worker's error file (torchrun's name).
pub(crate) const ERROR_FILE_ENV: &str = "TORCHELASTIC_ERROR_FILE";

/// The longest message shown: a recorded traceback can be long.
const MAX_MESSAGE: usize = 4000;

/// What a worker recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ErrorRecord {
    /// The error's text (kolo's `KoloError: ` prefix taken off).
    pub(crate) message: String,
    /// When the worker recorded it, where the record says to the nanosecond (kolo's records do;
    /// a record in whole seconds cannot order failures milliseconds apart).
    pub(crate) at: Option<SystemTime>,
}

/// The directory of the error files of one group of workers of this launcher.
fn dir(job_id: &str) -> PathBuf {
    std::env::temp_dir().join(format!("kolo-run-{}-{job_id}", std::process::id()))
}

/// Removes the error-file directories in `tmp` of launchers of this user that no longer run (a
/// launcher killed with SIGKILL cannot remove its own). A directory whose launcher's pid runs
/// again (reused) stays.
fn remove_stale_in(tmp: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    let me = rustix::process::getuid().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("kolo-run-"))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<i32>().ok())
        else {
            continue;
        };
        let mine = entry.metadata().is_ok_and(|m| m.is_dir() && m.uid() == me);
        let gone = rustix::process::Pid::from_raw(pid).is_some_and(|p| {
            matches!(
                rustix::process::test_kill_process(p),
                Err(rustix::io::Errno::SRCH)
            )
        });
        if mine && gone {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A fresh error file for local worker `rank` of `job` (`None` where the directory cannot be
/// made: the worker then runs without one). The first call also removes what launchers that were
/// killed left behind.
pub(crate) fn file_for(job: &JobEnv, rank: usize) -> Option<PathBuf> {
    static STALE: std::sync::Once = std::sync::Once::new();
    STALE.call_once(|| remove_stale_in(&std::env::temp_dir()));
    let dir = dir(&job.job_id);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .ok()?;
    let path = dir.join(format!("rank-{rank}-{}.json", job.worker_restart));
    // A worker keeps the first error its file holds: an old one would hide the new.
    let _ = std::fs::remove_file(&path);
    Some(path)
}

/// Removes the error files of `job` (its workers are gone).
pub(crate) fn remove_all(job: &JobEnv) {
    let _ = std::fs::remove_dir_all(dir(&job.job_id));
}

/// The record in `path`, if the worker wrote one.
pub(crate) fn read(path: &Path) -> Option<ErrorRecord> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(parse(&text))
}

/// torchrun's format: `{"message": {"message": "<type>: <text>", "extraInfo": {"py_callstack":
/// ..., "timestamp": "<unix seconds>"}}}`, kolo adding `kolo_unix_ns` to `extraInfo`. Anything
/// else is shown as it is.
fn parse(text: &str) -> ErrorRecord {
    let json: Option<serde_json::Value> = serde_json::from_str(text).ok();
    let outer = json.as_ref().and_then(|j| j.get("message"));
    let message = outer
        .and_then(|m| m.get("message").or(Some(m)))
        .and_then(serde_json::Value::as_str)
        .unwrap_or(text.trim());
    let message = message.strip_prefix("KoloError: ").unwrap_or(message);
    let at = outer
        .and_then(|m| m.pointer("/extraInfo/kolo_unix_ns"))
        .and_then(serde_json::Value::as_str)
        .and_then(|ns| ns.parse::<u64>().ok())
        .map(|ns| UNIX_EPOCH + Duration::from_nanos(ns));
    ErrorRecord {
        message: clip(message.trim()),
        at,
    }
}

fn clip(message: &str) -> String {
    match message.char_indices().nth(MAX_MESSAGE) {
        Some((at, _)) => format!("{} [...]", &message[..at]),
        None => message.to_string(),
    }
}

/// The wall-clock time of `at` (an instant of the past).
fn wall(at: Instant) -> SystemTime {
    SystemTime::now()
        .checked_sub(at.elapsed())
        .unwrap_or(UNIX_EPOCH)
}

/// The root cause once every worker is gone: `root` (the earliest failure by exit time, one killed
/// by a signal preferred), unless it was not killed by a signal and another failed worker recorded
/// its error before `root` failed (recorded its own error or exited).
pub(crate) fn first_to_fail(workers: &[Worker], root: usize) -> usize {
    let Some(r) = workers.iter().find(|w| w.rank == root) else {
        return root;
    };
    if matches!(r.exit, Some(Termination::Signaled(_))) {
        return root;
    }
    let recorded = |w: &Worker| w.error_file.as_deref().and_then(read).and_then(|e| e.at);
    let root_at = [recorded(r), r.exited_at.map(wall)]
        .into_iter()
        .flatten()
        .min();
    let earliest = workers
        .iter()
        .filter(|w| !w.left_out && w.rank != root && w.exit.is_some_and(|t| !t.success()))
        .filter_map(|w| recorded(w).map(|at| (at, w.rank)))
        .min();
    match (earliest, root_at) {
        (Some((at, rank)), Some(root_at)) if at < root_at => rank,
        _ => root,
    }
}

/// The message `worker` recorded, if any.
pub(crate) fn message_of(worker: &Worker) -> Option<String> {
    worker
        .error_file
        .as_deref()
        .and_then(read)
        .map(|e| without_own_rank(&e.message, worker.rank).to_string())
        .filter(|m| !m.is_empty())
}

/// The message without a leading `rank R: ` or `rank R aborted: ` naming the worker's own
/// rank, which the launcher's line already names.
fn without_own_rank(message: &str, rank: usize) -> &str {
    let own = format!("rank {rank}");
    message
        .strip_prefix(own.as_str())
        .and_then(|rest| {
            rest.strip_prefix(": ")
                .or_else(|| rest.strip_prefix(" aborted: "))
        })
        .unwrap_or(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_of_launchers_that_are_gone_are_removed_and_no_other() {
        let tmp = tempfile::tempdir().expect("a temporary directory");
        // A pid beyond the kernel's largest runs no process.
        let gone = tmp.path().join("kolo-run-2147483600-job");
        let alive = tmp
            .path()
            .join(format!("kolo-run-{}-job", std::process::id()));
        let other = tmp.path().join("kolo-running-2147483600-x");
        for d in [&gone, &alive, &other] {
            std::fs::create_dir(d).expect("made");
            std::fs::write(d.join("rank-0-0.json"), "{}").expect("written");
        }
        remove_stale_in(tmp.path());
        assert!(!gone.exists());
        assert!(alive.exists() && other.exists());
    }

    #[test]
    fn the_own_rank_prefix_is_dropped_and_no_other() {
        assert_eq!(without_own_rank("rank 0 aborted: no data", 0), "no data");
        assert_eq!(
            without_own_rank("rank 3: all_reduce: lost rank 1", 3),
            "all_reduce: lost rank 1"
        );
        assert_eq!(without_own_rank("rank 12: x", 1), "rank 12: x");
        assert_eq!(without_own_rank("rank 1: x", 2), "rank 1: x");
        assert_eq!(without_own_rank("rank 1 lost", 1), "rank 1 lost");
    }

    #[test]
    fn kolo_and_torch_records_are_read() {
        let kolo = r#"{"message": {"message": "KoloError: rank 1: all_reduce: lost rank 0",
            "extraInfo": {"py_callstack": "KoloError: rank 1: all_reduce: lost rank 0",
            "timestamp": "1700000000", "kolo_unix_ns": "1700000000123456789"}}}"#;
        let e = parse(kolo);
        assert_eq!(e.message, "rank 1: all_reduce: lost rank 0");
        assert_eq!(
            e.at,
            Some(UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789))
        );
        let torch = r#"{"message": {"message": "ValueError: bad batch",
            "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1700000000"}}}"#;
        let e = parse(torch);
        assert_eq!((e.message.as_str(), e.at), ("ValueError: bad batch", None));
        assert_eq!(parse("  not json\n").message, "not json");
        assert_eq!(parse(r#"{"message": "plain"}"#).message, "plain");
        let long = "x".repeat(MAX_MESSAGE + 10);
        assert!(parse(&long).message.ends_with("x [...]"));
    }
}
