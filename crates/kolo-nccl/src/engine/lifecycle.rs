//! The NCCL communicator's life, with a deadline on every step: joining it (a non-blocking
//! `ncclCommInitRankConfig`, polled with kolo's heartbeats and aborted when not every rank joins
//! in time) and closing it (`ncclCommFinalize` flushes what is queued, then `ncclCommDestroy`; a
//! flush that does not end in time is `ncclCommAbort`ed instead, so a process never hangs on exit).

use std::time::{Duration, Instant};

use kolo_core::{Error, Result};

use super::{int, NcclId, RawComm};
use crate::device::Gpu;
use crate::ffi::{Comm, Config, Nccl, Status, IN_PROGRESS, SUCCESS};

/// Polls `ready` until it says so (`Ok(true)`), `deadline` passes (`Ok(false)`), or it or
/// `stop` (a peer's failure) returns an error.
pub(super) fn poll(
    deadline: Instant,
    stop: &dyn Fn() -> Result<()>,
    mut ready: impl FnMut() -> Result<bool>,
) -> Result<bool> {
    let started = Instant::now();
    loop {
        if ready()? {
            return Ok(true);
        }
        stop()?;
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(if started.elapsed() < Duration::from_millis(2) {
            Duration::from_micros(10)
        } else {
            Duration::from_micros(500)
        });
    }
}

/// Whether NCCL is done with the last call on `comm` (`Ok(false)` while `ncclInProgress`).
fn idle(nccl: &Nccl, comm: Comm, rank: usize, what: &str) -> Result<bool> {
    let mut state: Status = SUCCESS;
    // SAFETY: `comm` is a communicator NCCL handed out and nobody has destroyed.
    let rc = unsafe { (nccl.comm_get_async_error)(comm, &mut state) };
    match (rc, state) {
        (SUCCESS, SUCCESS) => Ok(true),
        (SUCCESS, IN_PROGRESS) => Ok(false),
        (SUCCESS, e) | (e, _) => Err(Error::Backend {
            op: "init",
            rank,
            backend: "nccl",
            reason: format!("{what}: {}", nccl.describe(e)),
        }),
    }
}

/// Joins the communicator `id` names as `rank` of `size` on `gpu`, within `timeout`; `watch`
/// reports a peer's failure while the ranks join.
pub(super) fn join(
    nccl: &'static Nccl,
    gpu: &Gpu,
    id: &NcclId,
    (rank, size): (usize, usize),
    timeout: Duration,
    watch: &dyn Fn() -> Result<()>,
) -> Result<RawComm> {
    const WHAT: &str = "ncclCommInitRankConfig";
    let (n, r) = (
        int("init", rank, "size", size)?,
        int("init", rank, "rank", rank)?,
    );
    gpu.bind("init", rank)?;
    let mut config = Config::non_blocking();
    let mut comm: Comm = std::ptr::null_mut();
    // SAFETY: `comm` and `config` are valid for the call; the GPU's context is current.
    let rc = unsafe { (nccl.comm_init_rank_config)(&mut comm, n, id.raw(), r, &mut config) };
    let failed = |reason: String| {
        if !comm.is_null() {
            // SAFETY: the half-made communicator is never used again.
            unsafe { (nccl.comm_abort)(comm) };
        }
        Err(Error::Backend {
            op: "init",
            rank,
            backend: "nccl",
            reason,
        })
    };
    if rc != SUCCESS && rc != IN_PROGRESS {
        return failed(format!("{WHAT}: {}", nccl.describe(rc)));
    }
    if comm.is_null() {
        return failed(format!("{WHAT} returned no communicator"));
    }
    match poll(Instant::now() + timeout, watch, || {
        idle(nccl, comm, rank, WHAT)
    }) {
        Ok(true) => Ok(RawComm(comm)),
        Ok(false) => failed(format!(
            "{WHAT} did not complete within {timeout:?}: not every one of the {size} ranks \
             joined (a rank failed before it, or uses another id); the communicator is aborted"
        )),
        Err(Error::Backend { reason, .. }) => failed(reason),
        Err(e) => failed(e.to_string()),
    }
}

/// Flushes and destroys `comm` (the engine's end), or aborts it when the flush does not end
/// within `timeout` (a peer that is gone).
pub(super) fn close(nccl: &Nccl, gpu: &Gpu, comm: RawComm, timeout: Duration) {
    let comm = comm.0;
    if gpu.bind("close", 0).is_err() {
        // SAFETY: no call is in flight on `comm` (the engine is being dropped).
        unsafe { (nccl.comm_abort)(comm) };
        return;
    }
    // SAFETY: the engine owns `comm` and is being dropped: no other call uses it.
    let rc = unsafe { (nccl.comm_finalize)(comm) };
    let deadline = Instant::now() + timeout;
    let flushed = (rc == SUCCESS || rc == IN_PROGRESS)
        && matches!(
            poll(deadline, &|| Ok(()), || idle(
                nccl,
                comm,
                0,
                "ncclCommFinalize"
            )),
            Ok(true)
        );
    // SAFETY: finalized (destroy frees it) or not (abort ends what is in flight); never used again.
    unsafe {
        if flushed {
            (nccl.comm_destroy)(comm);
        } else {
            (nccl.comm_abort)(comm);
        }
    }
}
