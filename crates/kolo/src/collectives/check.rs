//! Argument checks of the typed collectives, and the fingerprint of each call.

use kolo_core::call::counts_hash;
use kolo_core::{Call, DType, Error, OpKind, ReduceOp, Result};

use crate::communicator::Inner;

/// The arguments of one typed collective, checked against the group.
pub(super) struct Check<'a> {
    pub inner: &'a Inner,
    pub op: OpKind,
}

impl Check<'_> {
    pub fn root(&self, root: usize) -> Result<u32> {
        let size = self.inner.size();
        if root >= size {
            return Err(Error::RankOutOfRange {
                op: self.op.name(),
                rank: self.inner.rank,
                arg: "root",
                value: root,
                size,
            });
        }
        Ok(root as u32)
    }

    pub fn len(
        &self,
        arg: &'static str,
        dtype: DType,
        actual: usize,
        expected: usize,
    ) -> Result<()> {
        if actual != expected {
            return Err(Error::BufferLength {
                op: self.op.name(),
                rank: self.inner.rank,
                arg,
                dtype,
                expected,
                actual,
            });
        }
        Ok(())
    }

    pub fn counts(&self, arg: &'static str, counts: &[usize]) -> Result<usize> {
        let size = self.inner.size();
        if counts.len() != size {
            return Err(Error::InvalidArgument {
                op: self.op.name(),
                rank: self.inner.rank,
                arg,
                reason: format!(
                    "has {} entries, expected one per rank ({size})",
                    counts.len()
                ),
            });
        }
        Ok(counts.iter().sum())
    }

    /// The fingerprint of this call on `count` elements, with the algorithm the cost model chooses
    /// for this communicator.
    pub fn call(
        &self,
        dtype: DType,
        count: usize,
        reduce: Option<ReduceOp>,
        root: Option<u32>,
    ) -> Call {
        let algo = self.inner.choose(self.op, count, dtype.size());
        Call {
            op: self.op,
            dtype: Some(dtype),
            reduce,
            count: count as u64,
            root,
            algo,
        }
    }

    /// The fingerprint of a variable-count call: `counts` hashed in place of the count.
    pub fn call_v(&self, dtype: DType, counts: &[usize], root: Option<u32>) -> Call {
        Call {
            count: counts_hash(counts),
            ..self.call(dtype, 0, None, root)
        }
    }

    /// Gather/scatter arguments: this rank's `piece` and, on the root, the `whole` buffer of all
    /// pieces; returns the fingerprint.
    pub fn rooted(
        &self,
        dtype: DType,
        counts: Option<&[usize]>,
        root: usize,
        piece: Piece,
        whole: Piece,
    ) -> Result<Call> {
        let (n, me) = (self.inner.size(), self.inner.rank);
        let root32 = self.root(root)?;
        let (call, total) = match counts {
            None => (
                self.call(dtype, piece.len, None, Some(root32)),
                piece.len * n,
            ),
            Some(counts) => {
                let total = self.counts("counts", counts)?;
                self.len(piece.arg, dtype, piece.len, counts[me])?;
                (self.call_v(dtype, counts, Some(root32)), total)
            }
        };
        if me == root {
            self.len(whole.arg, dtype, whole.len, total)?;
        }
        Ok(call)
    }
}

/// A buffer argument of a rooted collective: its name and length in elements.
#[derive(Clone, Copy)]
pub(super) struct Piece {
    pub arg: &'static str,
    pub len: usize,
}
