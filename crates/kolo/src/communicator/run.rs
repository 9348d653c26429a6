//! The run machinery of a communicator: sequence numbers for blocking and queued collectives, and
//! running one collective of kolo's own ([`Inner::run`]): its tag and fingerprint, the arena's turn
//! and fingerprint step, its deadline, and poisoning on error.

use std::panic::Location;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kolo_collectives::Ctx;
use kolo_core::{Call, Error, Header, Result, Tag, TagSpace, Transport};

use super::{Communicator, Inner};
use crate::backend::{Collective, Job, Runner};
use crate::config::Config;
use crate::stop_report::StopReport;
use crate::wait::TurnGuard;
use crate::work::WorkQueue;

impl Inner {
    /// Takes the next collective sequence number for a blocking call, after every queued async
    /// collective has finished (so collectives complete in issue order).
    #[track_caller]
    pub fn issue_blocking(&self) -> Result<u64> {
        self.check()?;
        let _g = self.issue.lock().unwrap_or_else(|p| p.into_inner());
        self.pending.wait_zero();
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        self.recorder.issue(seq, Location::caller(), false);
        Ok(seq)
    }

    /// Runs collective `c` as number `seq` with fingerprint `call` on the backend, recorded.
    pub(crate) fn exec(&self, seq: u64, call: Call, c: Collective<'_>) -> Result<()> {
        let at = self.recorder.start(seq, &call);
        let op = call.op.name();
        let job = Job {
            comm: self,
            seq,
            call,
            at,
        };
        // A panic (a bug) fails the communicator and tells the peers, instead of leaving them
        // waiting for this rank until the timeout.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.backend.run(job, c)))
            .unwrap_or_else(|panic| {
                Err(self.poison(Error::Panicked {
                    op,
                    rank: self.rank,
                    message: panic_message(&*panic),
                }))
            });
        self.recorder.end(seq, at, &r);
        r
    }

    /// Runs `f` as collective `seq` (kolo's own, whatever the backend), recorded.
    pub(crate) fn exec_own<R>(
        &self,
        seq: u64,
        call: Call,
        timeout: Duration,
        confirm: bool,
        f: impl FnOnce(&Ctx) -> Result<R>,
    ) -> Result<R> {
        let at = self.recorder.start(seq, &call);
        let r = self.run_timed(seq, call, timeout, at, confirm, f);
        self.recorder.end(seq, at, &r);
        r
    }

    /// [`Inner::run`] with its own timeout; `confirm: false` skips the arena's fingerprint step (for
    /// a collective that checks the fingerprints of its own messages and must honour its timeout).
    pub fn run_timed<R>(
        &self,
        seq: u64,
        call: Call,
        timeout: Duration,
        started: Instant,
        confirm: bool,
        f: impl FnOnce(&Ctx) -> Result<R>,
    ) -> Result<R> {
        self.check()?;
        let header = self.collective_header(seq, call);
        let deadline = Some(started + timeout);
        let ctx = |arena| {
            Ctx::new(
                &*self.transport,
                &self.members,
                self.rank,
                header,
                started,
                deadline,
                arena,
            )
        };
        if !self.uses_arena {
            let mut ctx = ctx(None);
            if !self.config.confirm_calls {
                ctx = ctx.without_confirmation();
            }
            // A message of this collective from a different call fails it at once, whichever peer
            // this rank is waiting on.
            self.transport.expect(&header);
            return f(&ctx)
                .and_then(|r| ctx.finish().map(|()| r))
                .map_err(|e| self.poison(e));
        }
        let _turn = self.take_turn(seq)?;
        let ctx = ctx(self.transport.arena());
        let r = match (ctx.arena, call.algo) {
            (Some(_), kolo_core::Algorithm::Shm) => f(&ctx),
            (Some(_), _) if !confirm || !self.config.confirm_calls => f(&ctx),
            (Some(arena), _) => kolo_collectives::algorithms::allreduce_shm::confirm(&ctx, arena)
                .and_then(|()| f(&ctx)),
            (None, _) => f(&ctx),
        };
        r.map_err(|e| self.poison(e))
    }

    /// The header of collective number `seq` of this group.
    pub fn collective_header(&self, seq: u64, call: Call) -> Header {
        Header {
            ack: false,
            tag: Tag {
                group: self.group,
                space: TagSpace::Collective,
                value: seq,
            },
            call,
        }
    }

    /// Waits until collective `seq` may use the arena; the returned guard passes the turn on.
    fn take_turn(&self, seq: u64) -> Result<TurnGuard<'_>> {
        let t = &self.turn;
        // A failed wait returns before the guard exists: not our turn, so nothing to pass on.
        t.sleepers.wait(Duration::from_millis(10), || {
            if t.next.load(Ordering::SeqCst) >= seq {
                return Ok(true);
            }
            self.check().map(|()| false)
        })?;
        Ok(TurnGuard { turn: t, seq })
    }

    /// Queues `job` on this communicator's worker thread as collective number `seq`; `done` then
    /// gets its result.
    ///
    /// The worker thread lets go of its handle on the communicator before `done` runs, so that a
    /// caller woken by `done` always holds the last handle when it drops its own: the transport
    /// is closed (a clean close its peers see) by the program's own thread, not left to the worker
    /// thread as the process ends right after its last wait.
    #[track_caller]
    pub fn submit<R: Send + 'static>(
        self: &Arc<Self>,
        job: impl FnOnce(&Arc<Inner>, u64) -> R + Send + 'static,
        done: impl FnOnce(R) + Send + 'static,
    ) -> Result<()> {
        self.check()?;
        let _g = self.issue.lock().unwrap_or_else(|p| p.into_inner());
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        self.recorder.issue(seq, Location::caller(), true);
        self.pending.add();
        let me = self.clone();
        let finished = Finished(self.pending.clone());
        let task = Box::new(move || {
            let r = job(&me, seq);
            drop(me);
            drop(finished);
            done(r);
        });
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.is_none() {
            *q = Some(WorkQueue::start(self.rank)?);
        }
        match q.as_ref() {
            Some(q) => q.push(task),
            None => Ok(()),
        }
    }
}

/// Counts a queued collective as finished when dropped — also when its job panics (the worker
/// thread catches it), so that blocking calls issued after it do not wait for it forever.
struct Finished(Arc<crate::wait::Pending>);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.done();
    }
}

/// The communicator as its backend sees it.
impl Runner for Inner {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        Inner::size(self)
    }

    fn config(&self) -> &Config {
        &self.config
    }

    fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    fn check(&self) -> Result<()> {
        Inner::check(self)
    }

    fn poison(&self, e: Error) -> Error {
        Inner::poison(self, e)
    }

    fn collective_header(&self, seq: u64, call: Call) -> Header {
        Inner::collective_header(self, seq, call)
    }

    fn run_step(
        &self,
        seq: u64,
        call: Call,
        at: Instant,
        step: &mut dyn FnMut(&Ctx) -> Result<()>,
    ) -> Result<()> {
        self.run_timed(seq, call, self.config.timeout, at, true, step)
    }

    fn issue_blocking(&self) -> Result<u64> {
        Inner::issue_blocking(self)
    }

    fn run_recorded(
        &self,
        seq: u64,
        call: Call,
        step: &mut dyn FnMut(&Ctx) -> Result<()>,
    ) -> Result<()> {
        self.exec_own(seq, call, self.config.timeout, true, step)
    }

    fn child(&self, members: Vec<usize>, rank: usize, id: u64) -> Arc<dyn Runner> {
        let child = Communicator::from_parts(
            self.transport.clone(),
            members,
            rank,
            id,
            self.topology.clone(),
            self.config.clone(),
            None,
        );
        child.inner
    }

    fn group(&self) -> u64 {
        self.group
    }
}

impl StopReport for Inner {
    fn report_on_stop(&self) -> bool {
        Inner::report_on_stop(self)
    }
}

/// The text of a panic's payload (a `&str` or a `String`, as `panic!` makes them).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::sync::{Arc, Barrier};
    use std::time::Duration;

    use kolo_core::ReduceOp;

    use crate::config::Config;

    /// By the time an asynchronous collective's result is delivered, the worker thread holds no
    /// handle on the communicator: a program that drops its communicator right after its last
    /// wait closes the transport itself (its peers see a clean close), instead of the worker
    /// thread holding the last handle while the process exits.
    #[test]
    fn the_worker_lets_go_of_the_communicator_before_the_result_is_delivered() {
        let go = Barrier::new(2);
        let out = crate::run_local(2, Config::default(), |comm| {
            if comm.rank() == 1 {
                go.wait();
                return comm.all_reduce(&mut [1.0f32], ReduceOp::Sum).map(|()| true);
            }
            let transport = Arc::downgrade(&comm.inner.transport);
            let (dropped_tx, dropped_rx) = mpsc::channel::<()>();
            let (alive_tx, alive_rx) = mpsc::channel();
            // Rank 1 has not joined yet: the callback is set before the collective completes
            // and runs on the worker thread at completion.
            comm.all_reduce_async(vec![1.0f32], ReduceOp::Sum)
                .then(move |_| {
                    let _ = dropped_rx.recv_timeout(Duration::from_secs(10));
                    let _ = alive_tx.send(transport.upgrade().is_some());
                });
            drop(comm);
            let _ = dropped_tx.send(());
            go.wait();
            let alive = alive_rx.recv_timeout(Duration::from_secs(10));
            Ok(alive == Ok(false))
        });
        for (rank, r) in out.into_iter().enumerate() {
            assert!(
                matches!(r, Ok(Ok(true))),
                "rank {rank}: {r:?} (rank 0: true = the transport was gone at delivery)"
            );
        }
    }

    /// A `Work::then` callback that panics (on the worker thread) neither fails the collective
    /// for the peers nor leaves it counted as queued: the blocking call after it runs.
    #[test]
    fn a_panicking_callback_does_not_hold_up_the_next_blocking_call() {
        let out = crate::run_local(2, Config::default(), |comm| {
            comm.all_reduce_async(vec![1.0f32], ReduceOp::Sum)
                .then(|_| panic!("a callback's own bug"));
            let (tx, rx) = mpsc::channel();
            // On a thread of its own, so that a call that never returns fails the test instead
            // of hanging it.
            let c = comm.clone();
            std::thread::spawn(move || {
                let mut x = [2.0f32];
                let r = c.all_reduce(&mut x, ReduceOp::Sum).map(|()| x[0]);
                let _ = tx.send(r);
            });
            rx.recv_timeout(Duration::from_secs(20))
        });
        for (rank, r) in out.into_iter().enumerate() {
            assert!(
                matches!(r, Ok(Ok(Ok(x))) if x == 4.0),
                "rank {rank}: {r:?} (want the blocking all-reduce's 4 within 20 s)"
            );
        }
    }
}
