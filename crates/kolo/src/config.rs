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
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: DEFAULT_TIMEOUT,
            overrides: Overrides::default(),
            confirm_calls: true,
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
            let secs: f64 = v
                .trim()
                .parse()
                .ok()
                .filter(|s: &f64| *s > 0.0 && s.is_finite())
                .ok_or_else(|| Error::Config {
                    var: "KOLO_TIMEOUT".into(),
                    value: v.clone(),
                    reason: "expected a positive number of seconds".into(),
                })?;
            c.timeout = Duration::from_secs_f64(secs);
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
        self.timeout = timeout;
        self
    }
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
}
