//! Communicator settings, with their environment variables read in one place.

use std::time::Duration;

use kolo_collectives::select::Overrides;
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
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: DEFAULT_TIMEOUT,
            overrides: Overrides::default(),
        }
    }
}

impl Config {
    /// Defaults overridden by `KOLO_TIMEOUT` and `KOLO_ALGO_ALLREDUCE` where set.
    pub fn from_env() -> Result<Config> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`Config::from_env`], reading variables through `get` (for tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
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
        let c = Config::from_lookup(|k| match k {
            "KOLO_TIMEOUT" => Some("2.5".into()),
            "KOLO_ALGO_ALLREDUCE" => Some("tree".into()),
            _ => None,
        });
        let c = c.ok();
        assert_eq!(
            c.as_ref().map(|c| c.timeout),
            Some(Duration::from_millis(2500))
        );
        assert!(Config::from_lookup(|k| (k == "KOLO_TIMEOUT").then(|| "-1".into())).is_err());
        assert!(Config::from_lookup(|k| (k == "KOLO_ALGO_ALLREDUCE").then(|| "x".into())).is_err());
    }
}
