//! How a thread of the shared-memory transport waits: it spins, then sleeps on its rank's doorbell
//! (see the module's "Waiting"), with a spin that adapts to how long the waits turn out to be.
//!
//! A rank that sleeps pays a wake-up when its peer rings, and on a virtual machine whose host is
//! busy that wake-up can take milliseconds: the halted virtual CPU runs again only when the host
//! schedules it. A stream of messages whose waits now and then outlast the spin (the peer's CPU
//! taken by the host for a moment) then falls into sleeping on every message, one wake-up after
//! another. So the spin is not fixed: it starts at `spin` (`KOLO_SHM_SPIN_US`, the least), doubles,
//! up to [`SPIN_GROWTH`] times that, after a wait that slept but ended within [`SHORT`] spins —
//! spinning a little longer would have caught it — and halves after a wait longer than [`LONG`]
//! spins, where spinning longer would only have burnt the core. Idle ranks (waits of a training
//! step's length) keep the least spin; ranks in a stream of messages stop sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kolo_core::RecvError;

use super::ShmTransport;

/// Looks a wait takes without a `pause` between them.
const FAST_SPINS: u32 = 256;

/// The most the spin grows to, as a multiple of the configured one.
pub(super) const SPIN_GROWTH: u32 = 16;
/// A wait that slept and ended within this many spins doubles the spin.
const SHORT: u32 = 8;
/// A wait longer than this many spins halves it.
const LONG: u32 = 32;

/// The current spin of one endpoint, between the configured spin and [`SPIN_GROWTH`] times it.
#[derive(Debug)]
pub(super) struct Spin {
    nanos: AtomicU64,
    least: Duration,
}

impl Spin {
    pub(super) fn new(least: Duration) -> Spin {
        Spin {
            nanos: AtomicU64::new(nanos(least)),
            least,
        }
    }

    /// How long a wait spins now.
    pub(super) fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }

    /// Adapts the spin to a wait that spun for `spun` and then slept, `waited` in all since the
    /// spin began.
    fn after_sleep(&self, spun: Duration, waited: Duration) {
        let next = if waited <= spun * SHORT {
            (spun * 2).min(self.least * SPIN_GROWTH)
        } else if waited > spun * LONG {
            (spun / 2).max(self.least)
        } else {
            return;
        };
        self.nanos.store(nanos(next), Ordering::Relaxed);
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl ShmTransport {
    /// Spins, then sleeps on this rank's doorbell, until `ready` returns `Some`, the deadline passes
    /// (`Err(Timeout)`) or a link fails.
    pub(super) fn wait_for<R>(
        &self,
        deadline: Option<Instant>,
        mut ready: impl FnMut() -> Option<R>,
    ) -> Result<R, RecvError> {
        // Most waits end within a few hundred spins: read the clock only after that. Past that, yield
        // the core every 16 spins: a thread or rank waiting for it (more ranks than free cores, or
        // both placed on one core) runs at once. Sleep only after the spin: once a rank sleeps its
        // peers pay a wake-up per step, which on a virtual machine can outlast a short spin and keep
        // every rank sleeping on every step.
        let mut spinning: Option<(Instant, Duration)> = None;
        let mut i = 0u32;
        let (began, spun) = loop {
            if let Some(r) = ready() {
                return Ok(r);
            }
            i = i.wrapping_add(1);
            if i.is_multiple_of(16) && i >= 256 {
                let now = Instant::now();
                match spinning {
                    None => spinning = Some((now, self.spin.now())),
                    Some((t, spin)) if now >= t + spin => break (t, spin),
                    Some(_) => std::thread::yield_now(),
                }
            }
            // The first spins look again at once: a `pause` there (tens of cycles on current
            // cores) only delays seeing a message that arrives within the next few hundred
            // nanoseconds, the ping-pong case. Longer waits pause between looks. (The loop's
            // shape is measured: the same logic with this test nested into the clock's, one
            // `i >= FAST_SPINS` for both, ran 256-384 B ping-pong 6-11 % slower on a Zen 5.)
            if i >= FAST_SPINS {
                std::hint::spin_loop();
            }
        };
        let bell = self.bell(self.rank);
        loop {
            if let Some(f) = self.health() {
                return Err(RecvError::Link(f));
            }
            let mut timeout = self.opts.poll;
            if let Some(d) = deadline {
                let now = Instant::now();
                if now >= d {
                    return Err(RecvError::Timeout);
                }
                timeout = timeout.min(d - now);
            }
            let mut out = None;
            bell.sleep_unless(timeout, &mut || {
                out = ready();
                out.is_some()
            });
            if let Some(r) = out.or_else(&mut ready) {
                self.spin.after_sleep(spun, began.elapsed());
                return Ok(r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_spin_grows_after_short_sleeps_and_shrinks_after_long_waits_within_its_bounds() {
        let s = Spin::new(MS);
        s.after_sleep(MS, 4 * MS); // woken soon after it slept
        assert_eq!(s.now(), 2 * MS);
        for _ in 0..10 {
            s.after_sleep(s.now(), s.now() + MS);
        }
        assert_eq!(s.now(), 16 * MS, "at most SPIN_GROWTH times the least");
        s.after_sleep(s.now(), 20 * s.now()); // neither short nor long: kept
        assert_eq!(s.now(), 16 * MS);
        s.after_sleep(s.now(), Duration::from_secs(1)); // an idle wait
        assert_eq!(s.now(), 8 * MS);
        for _ in 0..10 {
            s.after_sleep(s.now(), Duration::from_secs(1));
        }
        assert_eq!(s.now(), MS, "never below the configured spin");
        let none = Spin::new(Duration::ZERO);
        none.after_sleep(Duration::ZERO, MS);
        assert_eq!(none.now(), Duration::ZERO, "no spin configured: none grows");
    }
}
