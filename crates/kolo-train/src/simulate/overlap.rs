//! Event simulation of one backward pass with DDP's bucketed all-reduces.
//!
//! Times are seconds from the start of backward. Bucket `b` is ready when its last gradient is; one
//! communication channel takes the buckets strictly in order (as DDP launches them), each starting when
//! it is ready and the previous one has finished. With overlap off every bucket is ready only when
//! backward ends.

/// The result of [`simulate`].
#[derive(Clone, Debug, PartialEq)]
pub struct Timeline {
    /// Start and end of each bucket's all-reduce.
    pub buckets: Vec<(f64, f64)>,
    /// When the last all-reduce ends (0 without buckets).
    pub comm_end: f64,
    /// Sum of the all-reduce times.
    pub comm_total: f64,
    /// Communication not hidden behind backward: `max(0, comm_end − backward)`.
    pub exposed: f64,
    /// Backward and communication both done: `max(backward, comm_end)`.
    pub end: f64,
}

/// Simulates backward of `backward` seconds producing buckets ready at `ready[b]` whose all-reduces
/// take `cost[b]` seconds (`ready` and `cost` are in launch order and of equal length).
pub fn simulate(ready: &[f64], cost: &[f64], backward: f64, overlap: bool) -> Timeline {
    let mut free = 0.0f64;
    let mut buckets = Vec::with_capacity(ready.len());
    for (&r, &c) in ready.iter().zip(cost) {
        let r = if overlap { r.min(backward) } else { backward };
        let start = free.max(r);
        free = start + c;
        buckets.push((start, free));
    }
    let comm_end = buckets.last().map_or(0.0, |b| b.1);
    Timeline {
        buckets,
        comm_end,
        comm_total: cost.iter().take(ready.len()).sum(),
        exposed: (comm_end - backward).max(0.0),
        end: comm_end.max(backward),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn near(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn hidden_when_each_bucket_fits_in_the_remaining_backward() {
        // Backward 10 s; buckets ready at 2, 5, 8; each takes 1 s: all done by 9 < 10.
        let t = simulate(&[2.0, 5.0, 8.0], &[1.0, 1.0, 1.0], 10.0, true);
        assert_eq!(t.buckets, vec![(2.0, 3.0), (5.0, 6.0), (8.0, 9.0)]);
        assert!(near(t.exposed, 0.0));
        assert!(near(t.end, 10.0));
        assert!(near(t.comm_total, 3.0));
    }

    #[test]
    fn exposed_when_comm_is_longer() {
        // Each bucket takes 4 s: 2→6, 6→10, 10→14: 4 s past backward's end.
        let t = simulate(&[2.0, 5.0, 8.0], &[4.0, 4.0, 4.0], 10.0, true);
        assert_eq!(t.buckets[1], (6.0, 10.0));
        assert!(near(t.exposed, 4.0));
        assert!(near(t.end, 14.0));
    }

    #[test]
    fn no_overlap_sends_everything_after_backward() {
        let t = simulate(&[2.0, 5.0, 8.0], &[1.0, 1.0, 1.0], 10.0, false);
        assert!(near(t.exposed, 3.0));
        assert!(near(t.end, 13.0));
        let none = simulate(&[], &[], 10.0, true);
        assert!(near(none.end, 10.0) && near(none.exposed, 0.0));
    }

    #[test]
    fn last_bucket_always_exposed_when_ready_at_the_end() {
        let t = simulate(&[1.0, 10.0], &[0.5, 2.0], 10.0, true);
        assert!(near(t.exposed, 2.0));
    }
}
