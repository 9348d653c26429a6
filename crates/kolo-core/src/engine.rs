//! A collective engine: a communication library that runs whole collectives itself (MPI's
//! `MPI_Allreduce` and friends) instead of kolo's algorithms over a [`crate::Transport`].
//!
//! A communicator with an engine checks its arguments as always, then asks the engine to confirm that
//! every rank is in the same call ([`Engine::agree`]) and hands it the whole operation. Point-to-point
//! messages still go through the communicator's transport (an engine brings its own, see `kolo-mpi`).

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use crate::{DType, Error, Header, ReduceOp, Result, HEADER_LEN};

/// Whole collectives on raw bytes of one element type, over a group of `size()` ranks.
///
/// Buffers are checked by the caller (lengths agree with the counts and the group); `Avg` is the
/// engine's to finish (divide by the group size). Every method is collective: all ranks of the group
/// call it in the same order, which [`Engine::agree`] verifies first.
pub trait Engine: Send + Sync + fmt::Debug {
    /// Short name (`mpi`), reported as the communicator's backend.
    fn name(&self) -> &'static str;
    /// This rank in the engine's group.
    fn rank(&self) -> usize;
    /// Ranks in the engine's group.
    fn size(&self) -> usize;
    /// A node identity per rank (equal for ranks that share a host).
    fn node_ids(&self) -> Result<Vec<String>>;

    /// Confirms that every rank is about to run the collective described by `header` (same call,
    /// same place in the sequence). Returns [`crate::Error::Mismatch`] naming a rank that is in a
    /// different call, [`crate::Error::Timeout`] when not every rank arrives before `deadline`, or
    /// the error `interrupted` returns (a peer's abort) while waiting.
    fn agree(
        &self,
        header: &Header,
        deadline: Instant,
        interrupted: &dyn Fn() -> Result<()>,
    ) -> Result<()>;

    /// Waits for every rank.
    fn barrier(&self) -> Result<()>;
    /// `buf` of `root` into `buf` of every rank.
    fn broadcast(&self, buf: &mut [u8], dtype: DType, root: usize) -> Result<()>;
    /// Element-wise reduction of `buf` over all ranks, result everywhere.
    fn all_reduce(&self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()>;
    /// Element-wise reduction into `buf` of `root`; other ranks' buffers unchanged.
    fn reduce(&self, buf: &mut [u8], dtype: DType, op: ReduceOp, root: usize) -> Result<()>;
    /// `send` holds `size()` blocks of `recv.len()` bytes; rank r gets block r reduced.
    fn reduce_scatter(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()>;
    /// Every rank's `send` in rank order into `recv`; `counts` in elements for the variable form.
    fn all_gather(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<&[usize]>,
    ) -> Result<()>;
    /// Every rank's `send` in rank order into `recv` of `root`.
    fn gather(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<&[usize]>,
        root: usize,
    ) -> Result<()>;
    /// Block r of `send` on `root` into `recv` of rank r.
    fn scatter(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<&[usize]>,
        root: usize,
    ) -> Result<()>;
    /// Block d of `send` to rank d; the block from rank s into block s of `recv`. `counts` is
    /// `(send_counts, recv_counts)` in elements for the variable form.
    fn all_to_all(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        counts: Option<(&[usize], &[usize])>,
    ) -> Result<()>;
    /// The engine of a sub-group: ranks passing the same `color` ordered by `key` (ties by rank);
    /// `None` for a rank passing no color. Collective over this group (MPI's `MPI_Comm_split`).
    fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Arc<dyn Engine>>>;

    /// The engine's collectives on GPU memory, if its library has them (NCCL): GPU tensors go
    /// to it where they lie. `None` (the default): host memory only.
    fn device(&self) -> Option<&dyn crate::DeviceCollectives> {
        None
    }
}

/// The error behind an agreement that failed ([`Engine::agree`]): `all` holds every rank's encoded
/// header in rank order (an all-gather of [`Header::encode`]); names the first rank whose call
/// differs from `header`, this rank's (`rank`).
pub fn disagreement(header: &Header, rank: usize, all: &[u8]) -> Error {
    let mine = header.encode();
    for (peer, chunk) in all.chunks_exact(HEADER_LEN).enumerate() {
        if chunk == mine.as_slice() {
            continue;
        }
        let mut b = [0u8; HEADER_LEN];
        b.copy_from_slice(chunk);
        return match Header::decode(&b) {
            Ok(theirs) => Error::Mismatch {
                rank,
                peer,
                local: header.call,
                remote: theirs.call,
                tag: header.tag,
            },
            Err(e) => Error::Protocol {
                rank,
                peer,
                reason: format!("undecodable call fingerprint: {}", e.0),
            },
        };
    }
    Error::Protocol {
        rank,
        peer: rank,
        reason: "the ranks disagreed on a call but every fingerprint is equal".into(),
    }
}
