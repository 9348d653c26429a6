//! Helpers built on top of the [`Store`] primitives.

use std::time::Duration;

use crate::deadline::Deadline;
use crate::{Store, StoreError};

/// Higher-level operations available on every [`Store`] (including
/// `dyn Store`).
pub trait StoreExt: Store {
    /// Blocks until all `world` ranks have called `barrier` with the same
    /// `prefix`, or until `timeout`.
    ///
    /// Each rank increments `"{prefix}/count"`; the rank that brings it to a
    /// multiple of `world` sets `"{prefix}/done/{generation}"`, and every
    /// rank waits for that key. The generation number makes the barrier
    /// reusable: all ranks may call it again with the same prefix, as long as
    /// every rank makes the same sequence of calls.
    ///
    /// On timeout the error names the `done` key still missing.
    fn barrier(
        &self,
        prefix: &str,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        if world == 0 {
            return Err(StoreError::InvalidArgument {
                reason: "barrier world size must be at least 1".to_owned(),
            });
        }
        if rank >= world {
            return Err(StoreError::InvalidArgument {
                reason: format!("barrier rank {rank} is not below the world size {world}"),
            });
        }
        let world_i64 = i64::try_from(world).map_err(|_| StoreError::InvalidArgument {
            reason: format!("barrier world size {world} does not fit in an i64"),
        })?;
        let deadline = Deadline::after(timeout);
        let arrived = self.add(&format!("{prefix}/count"), 1)?;
        if arrived < 1 {
            return Err(StoreError::InvalidArgument {
                reason: format!(
                    "barrier counter {prefix}/count is {arrived} after incrementing; \
                     was it modified outside the barrier?"
                ),
            });
        }
        let generation = (arrived - 1) / world_i64;
        let done = format!("{prefix}/done/{generation}");
        if arrived % world_i64 == 0 {
            self.set(&done, b"1")?;
        }
        self.wait(&[&done], timeout.saturating_sub(deadline.elapsed()))
    }
}

impl<S: Store + ?Sized> StoreExt for S {}
