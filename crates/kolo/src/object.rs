//! Collectives on any serde type: values are serialized with bincode and moved as bytes.

use bincode::Options;
use serde::de::DeserializeOwned;
use serde::Serialize;

use kolo_core::{Error, Result};

use crate::communicator::Communicator;

fn codec() -> impl Options {
    bincode::DefaultOptions::new()
}

impl Communicator {
    fn encode<T: Serialize>(&self, op: &'static str, value: &T) -> Result<Vec<u8>> {
        codec().serialize(value).map_err(|e| {
            self.inner.poison(Error::Serialize {
                op,
                rank: self.rank(),
                reason: e.to_string(),
            })
        })
    }

    fn decode<T: DeserializeOwned>(&self, op: &'static str, bytes: &[u8]) -> Result<T> {
        // The limit bounds every length prefix by the bytes actually received.
        codec()
            .with_limit(bytes.len() as u64)
            .deserialize(bytes)
            .map_err(|e| Error::Serialize {
                op,
                rank: self.rank(),
                reason: e.to_string(),
            })
    }

    /// Broadcasts a value from `root`: the root passes `Some(value)`, the others `None`; every rank
    /// gets the root's value.
    #[track_caller]
    pub fn broadcast_object<T: Serialize + DeserializeOwned>(
        &self,
        value: Option<T>,
        root: usize,
    ) -> Result<T> {
        const OP: &str = "broadcast_object";
        let mut bytes = Vec::new();
        if self.rank() == root {
            let v = value.as_ref().ok_or_else(|| {
                self.inner.poison(Error::InvalidArgument {
                    op: OP,
                    rank: self.rank(),
                    arg: "value",
                    reason: "the root must pass Some(value)".into(),
                })
            })?;
            bytes = self.encode(OP, v)?;
        }
        let mut len = [bytes.len() as i64];
        self.broadcast(&mut len, root)?;
        bytes.resize(usize::try_from(len[0]).unwrap_or(0), 0);
        self.broadcast(&mut bytes, root)?;
        match value {
            Some(v) if self.rank() == root => Ok(v),
            _ => self.decode(OP, &bytes),
        }
    }

    fn gather_lengths(&self, mine: usize) -> Result<Vec<usize>> {
        let mut lens = vec![0i64; self.size()];
        self.all_gather(&[mine as i64], &mut lens)?;
        Ok(lens
            .into_iter()
            .map(|l| usize::try_from(l).unwrap_or(0))
            .collect())
    }

    /// Gathers a value from every rank onto every rank, in rank order.
    #[track_caller]
    pub fn all_gather_object<T: Serialize + DeserializeOwned>(&self, value: &T) -> Result<Vec<T>> {
        const OP: &str = "all_gather_object";
        let bytes = self.encode(OP, value)?;
        let counts = self.gather_lengths(bytes.len())?;
        let mut all = vec![0u8; counts.iter().sum()];
        self.all_gather_v(&bytes, &mut all, &counts)?;
        split_decode(self, OP, &all, &counts)
    }

    /// Gathers a value from every rank onto `root`: `Some(values in rank order)` there, `None` elsewhere.
    #[track_caller]
    pub fn gather_object<T: Serialize + DeserializeOwned>(
        &self,
        value: &T,
        root: usize,
    ) -> Result<Option<Vec<T>>> {
        const OP: &str = "gather_object";
        let bytes = self.encode(OP, value)?;
        let counts = self.gather_lengths(bytes.len())?;
        let mut all = vec![
            0u8;
            if self.rank() == root {
                counts.iter().sum()
            } else {
                0
            }
        ];
        self.gather_v(&bytes, &mut all, &counts, root)?;
        if self.rank() != root {
            return Ok(None);
        }
        split_decode(self, OP, &all, &counts).map(Some)
    }
}

fn split_decode<T: DeserializeOwned>(
    comm: &Communicator,
    op: &'static str,
    all: &[u8],
    counts: &[usize],
) -> Result<Vec<T>> {
    let mut out = Vec::with_capacity(counts.len());
    let mut at = 0;
    for c in counts {
        out.push(comm.decode(op, &all[at..at + c])?);
        at += c;
    }
    Ok(out)
}
