//! Sub-groups: [`Communicator::split`] (MPI's `Comm_split`) and [`Communicator::new_group`]
//! (torch's `new_group`). Both are collective over the parent; the new communicator shares the parent's
//! transport, with its own group id in every tag so its messages never mix with the parent's.

use kolo_core::call::fnv1a;
use kolo_core::{Error, OpKind, Result};

use crate::communicator::Communicator;

impl Communicator {
    fn child(
        &self,
        engine: Option<std::sync::Arc<dyn kolo_core::Engine>>,
        members: Vec<usize>,
        rank: usize,
        group: u64,
    ) -> Communicator {
        let inner = &self.inner;
        Communicator::assemble(
            inner.transport.clone(),
            engine,
            members,
            rank,
            group,
            inner.topology.clone(),
            inner.config.clone(),
            None,
        )
    }

    /// With an engine: its sub-group (`MPI_Comm_split`), made by every rank of this group in the
    /// same order (after the all-gather that every split and new_group starts with).
    fn engine_split(
        &self,
        color: Option<u32>,
        key: i64,
    ) -> Result<Option<std::sync::Arc<dyn kolo_core::Engine>>> {
        match self.inner.backend.engine() {
            None => Ok(None),
            Some(e) => e.split(color, key).map_err(|err| self.inner.poison(err)),
        }
    }

    fn child_id(&self, seq: u64, members: &[usize]) -> u64 {
        let m: Vec<u8> = members
            .iter()
            .flat_map(|r| (*r as u64).to_le_bytes())
            .collect();
        fnv1a(&[&self.inner.group.to_le_bytes(), &seq.to_le_bytes(), &m])
    }

    /// Splits the group: ranks passing the same `color` form a new communicator, ordered by `key` (ties
    /// by their rank here). A rank passing `None` joins no group and gets `None`. Collective: every rank
    /// of this communicator must call it; a rank making another collective call meanwhile (even an
    /// `all_gather` of two `i64`, the shape of split's own exchange) is a collective mismatch that
    /// names `split()`.
    #[track_caller]
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        let mine = [color.map_or(-1, i64::from), key];
        let mut all = vec![0i64; 2 * self.size()];
        let seq = self.inner.issue_blocking()?;
        self.inner
            .group_gather(OpKind::Split, seq, &mine, &mut all)?;
        let engine = self.engine_split(color, key)?;
        let Some(c) = color else {
            return Ok(None);
        };
        let mut chosen: Vec<(i64, usize)> = (0..self.size())
            .filter(|&r| all[2 * r] == i64::from(c))
            .map(|r| (all[2 * r + 1], r))
            .collect();
        chosen.sort_unstable();
        let ranks: Vec<usize> = chosen.iter().map(|&(_, r)| r).collect();
        let me = ranks.iter().position(|&r| r == self.rank()).unwrap_or(0);
        let members: Vec<usize> = ranks.iter().map(|&r| self.inner.members[r]).collect();
        let id = self.child_id(seq, &members);
        Ok(Some(self.child(engine, members, me, id)))
    }

    /// A communicator of the listed ranks (of this communicator), in the order given. Collective: every
    /// rank must call it with the same list; ranks not listed get `None`.
    #[track_caller]
    pub fn new_group(&self, ranks: &[usize]) -> Result<Option<Communicator>> {
        const OP: &str = "new_group";
        self.inner.check()?;
        let invalid = |reason: String| Error::InvalidArgument {
            op: OP,
            rank: self.rank(),
            arg: "ranks",
            reason,
        };
        let mut problem = None;
        for (i, &r) in ranks.iter().enumerate() {
            if r >= self.size() {
                problem = Some(Error::RankOutOfRange {
                    op: OP,
                    rank: self.rank(),
                    arg: "ranks",
                    value: r,
                    size: self.size(),
                });
                break;
            }
            if ranks[..i].contains(&r) {
                problem = Some(invalid(format!("rank {r} is listed twice")));
                break;
            }
        }
        if ranks.is_empty() {
            problem = Some(invalid("the list is empty".into()));
        }
        if let Some(e) = problem {
            return Err(self.inner.poison(e));
        }
        // Every rank must pass the same list: compare fingerprints of the lists.
        let list: Vec<u8> = ranks
            .iter()
            .flat_map(|r| (*r as u64).to_le_bytes())
            .collect();
        let h = fnv1a(&[&list]) as i64;
        let mut all = vec![0i64; self.size()];
        let seq = self.inner.issue_blocking()?;
        self.inner
            .group_gather(OpKind::NewGroup, seq, &[h], &mut all)?;
        if let Some(other) = all.iter().position(|&x| x != h) {
            return Err(self.inner.poison(invalid(format!(
                "rank {} passed a different list of ranks than rank {}",
                other,
                self.rank()
            ))));
        }
        let position = ranks.iter().position(|&r| r == self.rank());
        let engine = self.engine_split(position.map(|_| 0), position.unwrap_or(0) as i64)?;
        let Some(me) = position else {
            return Ok(None);
        };
        let members: Vec<usize> = ranks.iter().map(|&r| self.inner.members[r]).collect();
        let id = self.child_id(seq, &members);
        Ok(Some(self.child(engine, members, me, id)))
    }
}
