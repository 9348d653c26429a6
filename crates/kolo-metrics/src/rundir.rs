//! The directory a training run writes its outputs into.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{MetricsError, Result};

/// How many numeric suffixes are tried before giving up on a name.
const MAX_SUFFIX: u32 = 10_000;

/// A run's output directory and the well-known file names inside it.
///
/// The accessors only compute paths; they do not create the files or
/// subdirectories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDir {
    root: PathBuf,
}

impl RunDir {
    /// Uses `out` if given (creating it and its parents if missing; an
    /// existing directory is reused, e.g. to resume a run), otherwise creates
    /// a fresh `base/{name_hint}-{YYYYmmdd-HHMMSS}` (UTC), adding `-1`, `-2`,
    /// ... if that name is already taken.
    ///
    /// Characters of `name_hint` other than ASCII letters, digits, `-`, `_`
    /// and `.` are replaced by `-`; an empty hint becomes `run`.
    pub fn create(out: Option<&Path>, base: &Path, name_hint: &str) -> Result<RunDir> {
        match out {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| MetricsError::io(dir, e))?;
                Ok(RunDir {
                    root: dir.to_path_buf(),
                })
            }
            None => Self::create_fresh(base, name_hint, SystemTime::now()),
        }
    }

    /// Creates `base/{hint}-{timestamp of now}[-N]`; never reuses a directory.
    pub(crate) fn create_fresh(base: &Path, name_hint: &str, now: SystemTime) -> Result<RunDir> {
        std::fs::create_dir_all(base).map_err(|e| MetricsError::io(base, e))?;
        let stem = format!("{}-{}", sanitize(name_hint), utc_timestamp(now));
        for n in 0..=MAX_SUFFIX {
            let name = if n == 0 {
                stem.clone()
            } else {
                format!("{stem}-{n}")
            };
            let dir = base.join(name);
            // create_dir (not create_dir_all) fails if the directory exists,
            // so two concurrent runs never share one.
            match std::fs::create_dir(&dir) {
                Ok(()) => return Ok(RunDir { root: dir }),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(MetricsError::io(&dir, e)),
            }
        }
        Err(MetricsError::RunDir {
            base: base.to_path_buf(),
            reason: format!("{stem} and {MAX_SUFFIX} numbered variants all exist"),
        })
    }

    /// Wraps an existing directory without touching the file system.
    pub fn from_path(dir: impl Into<PathBuf>) -> RunDir {
        RunDir { root: dir.into() }
    }

    /// The run directory itself.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// `metrics.csv`: one row of [`TRAINING_COLUMNS`](crate::TRAINING_COLUMNS) per epoch.
    pub fn metrics_csv(&self) -> PathBuf {
        self.root.join("metrics.csv")
    }

    /// `training.png`: the loss/accuracy plot.
    pub fn plot_png(&self) -> PathBuf {
        self.root.join("training.png")
    }

    /// `tensorboard/`: the directory for TensorBoard event files.
    pub fn tensorboard_dir(&self) -> PathBuf {
        self.root.join("tensorboard")
    }

    /// `checkpoints/`: the directory for model checkpoints.
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.root.join("checkpoints")
    }

    /// `summary.json`: the final summary of the run.
    pub fn summary_json(&self) -> PathBuf {
        self.root.join("summary.json")
    }
}

fn sanitize(hint: &str) -> String {
    let s: String = hint
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let s = s.trim_matches('.');
    if s.is_empty() {
        "run".to_string()
    } else {
        s.to_string()
    }
}

/// Formats `t` as `YYYYmmdd-HHMMSS` in UTC. Times before 1970 format as the epoch.
pub(crate) fn utc_timestamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Converts days since 1970-01-01 to a (year, month, day) civil date
/// (Howard Hinnant's `civil_from_days`, restricted to non-negative days).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn timestamps() {
        assert_eq!(utc_timestamp(at(0)), "19700101-000000");
        // 2000-02-29 12:34:56 UTC (leap day).
        assert_eq!(utc_timestamp(at(951_827_696)), "20000229-123456");
        // 2024-12-31 23:59:59 UTC.
        assert_eq!(utc_timestamp(at(1_735_689_599)), "20241231-235959");
        // 2025-03-01 00:00:00 UTC.
        assert_eq!(utc_timestamp(at(1_740_787_200)), "20250301-000000");
        assert_eq!(
            utc_timestamp(UNIX_EPOCH - Duration::from_secs(5)),
            "19700101-000000"
        );
    }

    #[test]
    fn sanitizes_hints() {
        assert_eq!(sanitize("mnist/mlp v2"), "mnist-mlp-v2");
        assert_eq!(sanitize(""), "run");
        assert_eq!(sanitize(".."), "run");
        assert_eq!(sanitize("a.b_c-d"), "a.b_c-d");
    }

    #[test]
    fn collisions_get_numeric_suffixes() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = tmp.path().join("runs");
        let t = at(1_735_689_599);
        let a = RunDir::create_fresh(&base, "mnist", t).expect("first");
        let b = RunDir::create_fresh(&base, "mnist", t).expect("second");
        let c = RunDir::create_fresh(&base, "mnist", t).expect("third");
        assert_eq!(a.path(), base.join("mnist-20241231-235959"));
        assert_eq!(b.path(), base.join("mnist-20241231-235959-1"));
        assert_eq!(c.path(), base.join("mnist-20241231-235959-2"));
        assert!(a.path().is_dir() && b.path().is_dir() && c.path().is_dir());
    }
}
