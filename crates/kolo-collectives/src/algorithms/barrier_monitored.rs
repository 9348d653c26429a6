//! Monitored barrier (torch.distributed's `monitored_barrier`): every rank reports to rank 0, which
//! waits for all of them until the call's deadline, then releases the ones that came with the list of
//! those that did not. Every rank that arrived then fails with the same list, so a rank that is stuck
//! elsewhere is named instead of the job hanging.
//!
//! Rank 0 waits for the ranks in order against one deadline: once it has passed, the remaining ranks
//! are only checked for a message already there, so the whole call takes at most the timeout.

use std::time::Duration;

use kolo_core::{Error, Result};

use crate::ctx::Ctx;

/// Runs the barrier; `ctx.deadline` is the barrier's timeout.
pub fn barrier(ctx: &Ctx) -> Result<()> {
    let n = ctx.size();
    let waited = ctx
        .deadline
        .map(|d| d.saturating_duration_since(ctx.started))
        .unwrap_or_default();
    if n == 1 {
        return Ok(());
    }
    if ctx.rank != 0 {
        ctx.send(0, &[])?;
        // Rank 0 answers only once its own wait is over: give it that long again, and a second.
        let patient = Ctx::new(
            ctx.transport,
            ctx.members,
            ctx.rank,
            ctx.header,
            ctx.started,
            ctx.deadline.map(|d| d + waited + Duration::from_secs(1)),
            ctx.arena,
        );
        let verdict = patient.recv(0, n)?;
        let missing: Vec<usize> = (0..n).filter(|&r| verdict[r] != 0).collect();
        if missing.is_empty() {
            return Ok(());
        }
        return Err(Error::BarrierTimeout {
            rank: ctx.rank,
            missing,
            waited,
        });
    }
    let mut verdict = vec![0u8; n];
    for (r, v) in verdict.iter_mut().enumerate().skip(1) {
        match ctx.recv(r, 0) {
            Ok(_) => {}
            Err(Error::Timeout { .. }) => *v = 1,
            Err(e) => return Err(e),
        }
    }
    for (r, &v) in verdict.iter().enumerate().skip(1) {
        if v == 0 {
            ctx.send(r, &verdict)?;
        }
    }
    let missing: Vec<usize> = (0..n).filter(|&r| verdict[r] != 0).collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::BarrierTimeout {
            rank: 0,
            missing,
            waited,
        })
    }
}
