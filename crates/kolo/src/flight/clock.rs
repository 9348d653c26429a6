//! The recorder's clock: nanoseconds since a process-wide base, taken either from an [`Instant`]
//! the operation already has (exact) or from `CLOCK_MONOTONIC_COARSE` (a few nanoseconds to read,
//! a few milliseconds of resolution: enough for "waited 30.1 s"). Both count from the same
//! monotonic clock; a dump turns them into wall-clock seconds with the base's Unix time, so that
//! the ranks of one host line up exactly and those of several hosts as well as their clocks agree.
//!
//! 0 means "not known"; every real reading is at least 1.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

struct Base {
    instant: Instant,
    /// `CLOCK_MONOTONIC_COARSE` at `instant`, in nanoseconds.
    coarse: u64,
    /// Unix time at `instant`, in seconds.
    unix: f64,
}

fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| {
        let instant = Instant::now();
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        Base {
            instant,
            coarse: raw(libc::CLOCK_MONOTONIC),
            unix,
        }
    })
}

fn raw(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to write.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// The clock's base, copied into each recorder (reading a `OnceLock` on every operation costs
/// more than the rest of the recording).
#[derive(Clone, Copy)]
pub(crate) struct Clock {
    instant: Instant,
    coarse: u64,
}

impl Clock {
    pub(crate) fn get() -> Clock {
        let b = base();
        Clock {
            instant: b.instant,
            coarse: b.coarse,
        }
    }

    /// `at` on the recorder's clock.
    #[inline]
    pub(crate) fn nanos(&self, at: Instant) -> u64 {
        // `Instant - Instant` saturates at zero.
        ((at - self.instant).as_nanos() as u64).max(1)
    }

    /// Now, from the coarse clock.
    #[inline]
    pub(crate) fn coarse_now(&self) -> u64 {
        raw(libc::CLOCK_MONOTONIC_COARSE)
            .saturating_sub(self.coarse)
            .max(1)
    }

    /// Now as an [`Instant`] from the coarse clock: at most a tick (4 ms at 250 Hz) early, for
    /// what counts seconds (a deadline, "waited 30.1 s"). `Instant::now()` reads the exact
    /// clock, which in a virtual machine costs as much as a tenth of a small message's round
    /// trip.
    #[inline]
    pub(crate) fn coarse_instant(&self) -> Instant {
        self.instant + std::time::Duration::from_nanos(self.coarse_now())
    }
}

/// Now, exactly.
pub(crate) fn now() -> u64 {
    Clock::get().nanos(Instant::now())
}

/// A reading as Unix seconds (`None` for 0, not known).
pub(crate) fn unix(ns: u64) -> Option<f64> {
    (ns != 0).then(|| base().unix + ns as f64 * 1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clocks_agree() {
        let exact = now();
        let coarse = Clock::get().coarse_now();
        // The coarse clock lags by at most a tick (4 ms at 250 Hz).
        assert!(
            coarse + 20_000_000 > exact && coarse <= exact + 1_000_000,
            "{coarse} vs {exact}"
        );
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let u = unix(exact).unwrap_or(0.0);
        assert!((u - wall).abs() < 0.5, "{u} vs {wall}");
        assert_eq!(unix(0), None);
        // The coarse instant is at most a tick before the exact one, never after it.
        let (early, exact) = (Clock::get().coarse_instant(), Instant::now());
        assert!(early <= exact && exact - early < std::time::Duration::from_millis(20));
    }
}
