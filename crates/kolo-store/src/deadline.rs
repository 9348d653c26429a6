//! Deadlines for blocking calls.

use std::time::{Duration, Instant};

/// Longest single sleep or condvar wait used when a deadline is "never".
const FOREVER_CHUNK: Duration = Duration::from_secs(3600);

/// A point in time after which a blocking call gives up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    start: Instant,
    /// `None` when `start + timeout` does not fit in an `Instant` (wait forever).
    end: Option<Instant>,
}

impl Deadline {
    /// A deadline `timeout` from now.
    pub(crate) fn after(timeout: Duration) -> Self {
        let start = Instant::now();
        Deadline {
            start,
            end: start.checked_add(timeout),
        }
    }

    /// Time left (zero once expired). A "never" deadline reports one hour,
    /// so callers simply loop.
    pub(crate) fn remaining(&self) -> Duration {
        match self.end {
            Some(end) => end.saturating_duration_since(Instant::now()),
            None => FOREVER_CHUNK,
        }
    }

    /// Whether the deadline has passed.
    pub(crate) fn expired(&self) -> bool {
        match self.end {
            Some(end) => Instant::now() >= end,
            None => false,
        }
    }

    /// Time since the deadline was created.
    pub(crate) fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }
}

/// Exponential backoff for polling loops, never sleeping past a deadline.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// Backoff starting at `min`, doubling up to `max`.
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        Backoff { next: min, max }
    }

    /// Sleeps for the next backoff step, or less if the deadline comes first.
    pub(crate) fn sleep(&mut self, deadline: &Deadline) {
        let step = self.next.min(deadline.remaining());
        if !step.is_zero() {
            std::thread::sleep(step);
        }
        self.next = (self.next * 2).min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_timeout_never_expires() {
        let d = Deadline::after(Duration::MAX);
        assert!(!d.expired());
        assert_eq!(d.remaining(), FOREVER_CHUNK);
    }

    #[test]
    fn zero_timeout_expires_at_once() {
        let d = Deadline::after(Duration::ZERO);
        assert!(d.expired());
        assert_eq!(d.remaining(), Duration::ZERO);
    }

    #[test]
    fn backoff_respects_deadline() {
        // A backoff of seconds against a deadline of 5 ms: what a loaded machine adds to a short
        // sleep stays far below the backoff that ignoring the deadline would take.
        let d = Deadline::after(Duration::from_millis(5));
        let mut b = Backoff::new(Duration::from_secs(2), Duration::from_secs(4));
        let t = Instant::now();
        b.sleep(&d);
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }
}
