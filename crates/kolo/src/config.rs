//! Communicator settings, read through [`kolo_core::settings::Env`] (every `KOLO_*` variable is
//! listed, with its default and meaning, in [`kolo_core::settings::SETTINGS`]).

use std::time::Duration;

use kolo_collectives::select::Overrides;
use kolo_core::settings::{Env, ProcessEnv};
use kolo_core::{Error, Result};

/// Default time a collective may wait for a peer before failing.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Settings of a communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// How long an operation may wait for a peer before it fails with [`Error::Timeout`]
    /// (`KOLO_TIMEOUT`, seconds; default 300).
    pub timeout: Duration,
    /// Forced algorithms (`KOLO_ALGO_ALLREDUCE=ring|recursive_doubling|halving_doubling|tree`).
    pub overrides: Overrides,
    /// The fingerprint step that every collective on shared memory starts with (so that ranks in
    /// different collectives fail even where no message would flow). On by default; turning it off
    /// (`KOLO_CONFIRM_CALLS=0`) is only for measuring what it costs: mismatches are then still caught
    /// where messages flow, but e.g. a broadcast's root can finish before its peers notice.
    pub confirm_calls: bool,
    /// Operations of each kind (collective, point-to-point) the communicator's flight recorder
    /// keeps (`crate::flight`); `Some(0)` records nothing. `None`: `KOLO_FLIGHT_RECORDS`, else
    /// [`crate::flight::DEFAULT_RECORDS`].
    pub flight_records: Option<usize>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: DEFAULT_TIMEOUT,
            overrides: Overrides::default(),
            confirm_calls: true,
            flight_records: None,
        }
    }
}

impl Config {
    /// Defaults overridden by `KOLO_TIMEOUT` and `KOLO_ALGO_ALLREDUCE` where set.
    pub fn from_env() -> Result<Config> {
        Config::from_lookup(ProcessEnv)
    }

    /// Like [`Config::from_env`], reading variables from `env` (a map or a closure in tests).
    pub fn from_lookup(env: impl Env) -> Result<Config> {
        let get = |k: &str| env.lookup(k);
        let mut c = Config::default();
        if let Some(v) = get("KOLO_TIMEOUT") {
            c.timeout = v
                .trim()
                .parse()
                .ok()
                .and_then(timeout_from_secs)
                .ok_or_else(|| Error::Config {
                    var: "KOLO_TIMEOUT".into(),
                    value: v.clone(),
                    reason: "expected a positive number of seconds".into(),
                })?;
        }
        if let Some(v) = get("KOLO_CONFIRM_CALLS") {
            c.confirm_calls = match v.trim() {
                "1" | "on" | "true" => true,
                "0" | "off" | "false" => false,
                _ => {
                    return Err(Error::Config {
                        var: "KOLO_CONFIRM_CALLS".into(),
                        value: v.clone(),
                        reason: "expected 1 or 0".into(),
                    })
                }
            };
        }
        if let Some(v) = get("KOLO_ALGO_ALLREDUCE") {
            c.overrides.all_reduce = Some(Overrides::parse_all_reduce(
                "KOLO_ALGO_ALLREDUCE",
                v.trim(),
            )?);
        }
        Ok(c)
    }

    /// This config with another timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.min(MAX_TIMEOUT);
        self
    }
}

/// The longest timeout kolo keeps (about 31 years): any longer one means "no deadline" and is
/// taken as this, so that a deadline computed from it never overflows.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(1_000_000_000);

/// A timeout of `secs` seconds: `None` unless `secs` is a positive number (not NaN); infinity and
/// anything longer than [`MAX_TIMEOUT`] are [`MAX_TIMEOUT`].
pub fn timeout_from_secs(secs: f64) -> Option<Duration> {
    (secs > 0.0)
        .then(|| Duration::try_from_secs_f64(secs).map_or(MAX_TIMEOUT, |d| d.min(MAX_TIMEOUT)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides_and_errors() {
        let c = Config::from_lookup(|k: &str| match k {
            "KOLO_TIMEOUT" => Some("2.5".into()),
            "KOLO_ALGO_ALLREDUCE" => Some("tree".into()),
            _ => None,
        });
        let c = c.ok();
        assert_eq!(
            c.as_ref().map(|c| c.timeout),
            Some(Duration::from_millis(2500))
        );
        assert!(Config::from_lookup(|k: &str| (k == "KOLO_TIMEOUT").then(|| "-1".into())).is_err());
        assert!(
            Config::from_lookup(|k: &str| (k == "KOLO_ALGO_ALLREDUCE").then(|| "x".into()))
                .is_err()
        );
    }

    #[test]
    fn a_huge_timeout_means_no_deadline_and_never_panics() {
        for v in ["1e20", "inf", "18446744073709551616"] {
            let c = Config::from_lookup(|k: &str| (k == "KOLO_TIMEOUT").then(|| v.into()));
            assert_eq!(
                c.ok().map(|c| c.timeout),
                Some(MAX_TIMEOUT),
                "KOLO_TIMEOUT={v}"
            );
        }
        for v in ["nan", "0", "-inf"] {
            let c = Config::from_lookup(|k: &str| (k == "KOLO_TIMEOUT").then(|| v.into()));
            assert!(c.is_err(), "KOLO_TIMEOUT={v}");
        }
        let c = Config::default().with_timeout(Duration::MAX);
        assert_eq!(c.timeout, MAX_TIMEOUT);
        let c = Config {
            timeout: Duration::MAX,
            ..c
        };
        // A world with it works: deadlines computed from it do not overflow.
        let out = crate::run_local(2, c, |comm| {
            let mut v = [comm.rank() as f32 + 1.0];
            comm.all_reduce(&mut v, crate::ReduceOp::Sum)?;
            comm.barrier()?;
            Ok::<_, Error>(v[0])
        });
        for r in out {
            assert!(matches!(r, Ok(Ok(x)) if x == 3.0), "{r:?}");
        }
    }
}
