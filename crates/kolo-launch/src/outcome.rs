//! How a job ended: [`LaunchOutcome`], [`RankExit`], [`Termination`].

use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use crate::process::signal_name;

/// How one worker process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Termination {
    /// It exited with this code.
    Exited(i32),
    /// It was killed by this signal.
    Signaled(i32),
}

impl Termination {
    /// `true` for exit code 0.
    pub fn success(self) -> bool {
        self == Termination::Exited(0)
    }

    /// The shell convention: the exit code, or 128 + the signal number.
    pub fn exit_code(self) -> i32 {
        match self {
            Termination::Exited(code) => code,
            Termination::Signaled(sig) => 128 + sig,
        }
    }
}

impl From<ExitStatus> for Termination {
    fn from(status: ExitStatus) -> Self {
        match (status.code(), status.signal()) {
            (Some(code), _) => Termination::Exited(code),
            (None, Some(sig)) => Termination::Signaled(sig),
            // Stopped/continued statuses are not reported by `wait` without
            // WUNTRACED; keep a failure rather than panic.
            (None, None) => Termination::Exited(status.into_raw()),
        }
    }
}

impl fmt::Display for Termination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Termination::Exited(code) => write!(f, "exit code {code}"),
            Termination::Signaled(sig) => match signal_name(sig) {
                Some(name) => write!(f, "killed by signal {sig} ({name})"),
                None => write!(f, "killed by signal {sig}"),
            },
        }
    }
}

/// How one rank ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RankExit {
    /// The worker's rank.
    pub rank: usize,
    /// Its process id (also its process group id).
    pub pid: u32,
    /// How it ended.
    pub termination: Termination,
}

/// The result of a launched job: how every rank ended and why the job stopped.
///
/// At most one of [`first_failure`](Self::first_failure) and
/// [`interrupted_by`](Self::interrupted_by) is set: whichever stopped the job
/// first.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LaunchOutcome {
    /// One entry per rank, in rank order.
    pub ranks: Vec<RankExit>,
    /// The root cause: the rank that failed first (non-zero exit or killed by
    /// a signal), which made the launcher stop the others. "First" is by the
    /// time each worker exited; among failures within 100 ms of the earliest,
    /// one killed by a signal is preferred, since workers that lose a peer
    /// exit with an error right after it.
    pub first_failure: Option<usize>,
    /// The error the [`first_failure`](Self::first_failure) rank recorded in its error file
    /// (`TORCHELASTIC_ERROR_FILE`, which the launcher gives every worker and kolo's communicators
    /// write on their first failure), if it wrote one.
    pub root_cause_error: Option<String>,
    /// The other ranks that failed on their own, in rank order — typically
    /// workers that exited with an error after losing the
    /// [`first_failure`](Self::first_failure). Ranks the launcher itself
    /// terminated (with SIGTERM or SIGKILL while stopping the job) are not
    /// failures and are not listed. Empty unless `first_failure` is set.
    pub also_failed: Vec<usize>,
    /// The signal (SIGINT, SIGTERM or SIGHUP) the launcher received, which made
    /// it stop the workers.
    pub interrupted_by: Option<i32>,
    /// How many times the worker group was restarted after a failure before this, its last run
    /// (see [`LaunchConfig::max_restarts`](crate::LaunchConfig::max_restarts)).
    pub restarts: usize,
    /// In a job on several nodes: the job's first failure, wherever it was (`node N (host): rank R
    /// ... failed: ...`), when this node's workers were stopped because of it.
    pub remote_failure: Option<String>,
    /// Fault-tolerant workers (`restart_workers`) that failed with no restarts left, which the
    /// others went on without: the job succeeds if the workers still running at its end do.
    pub left_out: Vec<usize>,
}

impl LaunchOutcome {
    /// `true` if every rank exited with code 0 and the launcher was not interrupted.
    #[must_use]
    pub fn success(&self) -> bool {
        self.exit_code() == 0
    }

    /// The exit code the launcher should exit with: 0 on success, the root
    /// cause's exit code (128 + signal if it was killed by a signal), or
    /// 128 + signal if the launcher itself was interrupted.
    #[must_use]
    pub fn exit_code(&self) -> i32 {
        if let Some(sig) = self.interrupted_by {
            return 128 + sig;
        }
        match self.root_cause() {
            Some(r) if !r.termination.success() => r.termination.exit_code(),
            Some(_) => 1,
            None if self.remote_failure.is_some() => 1,
            // Workers left out count only when no other worker finished (a fault-tolerant job
            // that lost them all failed).
            None if !self.ranks.is_empty()
                && self.ranks.iter().all(|r| self.left_out.contains(&r.rank)) =>
            {
                self.ranks
                    .iter()
                    .map(|r| r.termination)
                    .find(|t| !t.success())
                    .map_or(1, Termination::exit_code)
            }
            None => self
                .ranks
                .iter()
                .filter(|r| !self.left_out.contains(&r.rank))
                .map(|r| r.termination)
                .find(|t| !t.success())
                .map_or(0, Termination::exit_code),
        }
    }

    /// How the [`first_failure`](Self::first_failure) rank ended, if any.
    #[must_use]
    pub fn root_cause(&self) -> Option<&RankExit> {
        self.rank(self.first_failure?)
    }

    /// How the [`also_failed`](Self::also_failed) ranks ended, in rank order.
    pub fn other_failures(&self) -> impl Iterator<Item = &RankExit> + '_ {
        self.also_failed.iter().filter_map(|&rank| self.rank(rank))
    }

    fn rank(&self, rank: usize) -> Option<&RankExit> {
        self.ranks.iter().find(|r| r.rank == rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rank: usize, termination: Termination) -> RankExit {
        RankExit {
            rank,
            pid: 1000 + rank as u32,
            termination,
        }
    }

    #[test]
    fn termination_exit_codes() {
        assert_eq!(Termination::Exited(0).exit_code(), 0);
        assert_eq!(Termination::Exited(3).exit_code(), 3);
        assert_eq!(Termination::Signaled(libc::SIGKILL).exit_code(), 137);
        assert_eq!(Termination::Signaled(libc::SIGTERM).exit_code(), 143);
        assert!(Termination::Exited(0).success());
        assert!(!Termination::Exited(1).success());
        assert!(!Termination::Signaled(9).success());
    }

    #[test]
    fn termination_from_exit_status() {
        // Raw wait statuses: exit code in bits 8..16, signal in the low 7 bits.
        assert_eq!(
            Termination::from(ExitStatus::from_raw(3 << 8)),
            Termination::Exited(3)
        );
        assert_eq!(
            Termination::from(ExitStatus::from_raw(libc::SIGKILL)),
            Termination::Signaled(libc::SIGKILL)
        );
    }

    #[test]
    fn termination_display() {
        assert_eq!(Termination::Exited(3).to_string(), "exit code 3");
        assert_eq!(
            Termination::Signaled(9).to_string(),
            "killed by signal 9 (SIGKILL)"
        );
        assert_eq!(Termination::Signaled(63).to_string(), "killed by signal 63");
    }

    #[test]
    fn outcome_success() {
        let out = LaunchOutcome {
            ranks: vec![
                rank(0, Termination::Exited(0)),
                rank(1, Termination::Exited(0)),
            ],
            first_failure: None,
            root_cause_error: None,
            also_failed: Vec::new(),
            interrupted_by: None,
            restarts: 0,
            remote_failure: None,
            left_out: Vec::new(),
        };
        assert_eq!(out.exit_code(), 0);
        assert!(out.success());
    }

    #[test]
    fn outcome_first_failure_exit_code() {
        let out = LaunchOutcome {
            ranks: vec![
                rank(0, Termination::Signaled(libc::SIGTERM)),
                rank(1, Termination::Exited(3)),
                rank(2, Termination::Exited(7)),
            ],
            first_failure: Some(1),
            root_cause_error: None,
            also_failed: vec![2],
            interrupted_by: None,
            restarts: 0,
            remote_failure: None,
            left_out: Vec::new(),
        };
        assert_eq!(out.exit_code(), 3);
        assert!(!out.success());
        assert_eq!(out.root_cause(), Some(&out.ranks[1]));
        let others: Vec<&RankExit> = out.other_failures().collect();
        assert_eq!(others, [&out.ranks[2]]);
    }

    #[test]
    fn outcome_first_failure_by_signal() {
        let out = LaunchOutcome {
            ranks: vec![
                rank(0, Termination::Signaled(libc::SIGKILL)),
                rank(1, Termination::Signaled(libc::SIGTERM)),
            ],
            first_failure: Some(0),
            root_cause_error: None,
            also_failed: Vec::new(),
            interrupted_by: None,
            restarts: 0,
            remote_failure: None,
            left_out: Vec::new(),
        };
        assert_eq!(out.exit_code(), 137);
    }

    #[test]
    fn outcome_interrupted() {
        let out = LaunchOutcome {
            ranks: vec![rank(0, Termination::Signaled(libc::SIGTERM))],
            first_failure: None,
            root_cause_error: None,
            also_failed: Vec::new(),
            interrupted_by: Some(libc::SIGINT),
            restarts: 0,
            remote_failure: None,
            left_out: Vec::new(),
        };
        assert_eq!(out.exit_code(), 130);
        let out = LaunchOutcome {
            interrupted_by: Some(libc::SIGTERM),
            ..out
        };
        assert_eq!(out.exit_code(), 143);
    }

    #[test]
    fn left_out_workers_fail_the_job_only_when_no_worker_finished() {
        let mut out = LaunchOutcome {
            ranks: vec![
                rank(0, Termination::Exited(0)),
                rank(1, Termination::Exited(4)),
            ],
            first_failure: None,
            root_cause_error: None,
            also_failed: Vec::new(),
            interrupted_by: None,
            restarts: 0,
            remote_failure: None,
            left_out: vec![1],
        };
        assert_eq!(out.exit_code(), 0);
        out.ranks[0] = rank(0, Termination::Exited(4));
        out.left_out = vec![0, 1];
        assert_eq!(out.exit_code(), 4);
    }
}
