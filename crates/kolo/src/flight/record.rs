//! What a dump holds, as JSON: one [`FlightDump`] per rank, a [`GroupRecord`] per communicator, an
//! [`OpRecord`] per operation. `kolo diagnose` reads these back.

use kolo_core::{Algorithm, DType, OpKind, ReduceOp};
use serde::{Deserialize, Serialize};

use super::clock;
use super::ring::Snapshot;

/// The op code of a receive in the point-to-point ring (collectives use [`OpKind`]'s codes).
pub(crate) const RECV: u8 = 200;
/// The peer of a receive from any source.
pub(crate) const ANY_PEER: u32 = 0xFF_FFFE;

/// One rank's flight record.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FlightDump {
    /// Format version (1).
    pub version: u32,
    /// This process's rank in its world.
    pub rank: usize,
    /// The world's size.
    pub size: usize,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Why it was written: the failure, `SIGUSR1`, or the caller's reason.
    pub reason: String,
    /// When (Unix seconds).
    pub dumped_at: f64,
    /// One entry per communicator (each world first, then its sub-groups).
    pub groups: Vec<GroupRecord>,
    /// The Python threads' stacks at the last `SIGUSR1` (innermost frame first, one per line;
    /// the program's main thread), when the program is Python: read by `kolo diagnose` from
    /// `rank-R.py.txt` beside the record.
    #[serde(default)]
    pub python_stack: Option<Vec<String>>,
}

/// One communicator's operations.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupRecord {
    /// The job of the world it belongs to (one process can hold several: torch's process groups,
    /// a second `kolo::init`); empty for a world `kolo::init` did not make.
    #[serde(default)]
    pub world: String,
    /// The group id (hex), the same on every member.
    pub group: String,
    /// This rank in the group.
    pub rank: usize,
    /// The group's size.
    pub size: usize,
    /// Its members (world ranks).
    pub members: Vec<usize>,
    /// The last collectives, oldest first; `id` is the collective's sequence number, the same on
    /// every rank for the same call.
    pub collectives: Vec<OpRecord>,
    /// The last point-to-point operations of this rank, oldest first.
    pub p2p: Vec<OpRecord>,
    /// The communicator's first failure, if it failed.
    pub error: Option<String>,
}

/// One operation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpRecord {
    /// Collective sequence number, or this rank's point-to-point operation number.
    pub id: u64,
    /// `all_reduce`, `broadcast`, ..., `send`, `recv`; `?` while only issued.
    pub op: String,
    /// Element type.
    pub dtype: Option<String>,
    /// Element count (per rank; a hash of the counts for the variable forms).
    pub count: u64,
    /// Reduce operator.
    pub reduce: Option<String>,
    /// Root (group rank) of a rooted collective.
    pub root: Option<u32>,
    /// Peer of a point-to-point operation (`None` for any source).
    pub peer: Option<u32>,
    /// Tag of a point-to-point operation.
    pub tag: Option<u64>,
    /// Algorithm of a collective.
    pub algorithm: Option<String>,
    /// `queued`, `started`, `completed` or `failed`.
    pub state: String,
    /// Unix seconds: issued (when it waited behind asynchronous work).
    pub queued: Option<f64>,
    /// Unix seconds: started (this rank entered it). Recorded for one collective in
    /// [`super::TIMED_EVERY`], every failed one, and (coarsely, see `start_coarse`) one found
    /// running, point-to-point operations too (a point-to-point operation that finishes before
    /// the watcher's next tick has none).
    pub started: Option<f64>,
    /// `started` is a coarse reading, within about 0.1 s: how long the rank waited, not when it
    /// arrived (left out of the straggler report).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub start_coarse: bool,
    /// Unix seconds: ended (point-to-point operations and failures).
    pub ended: Option<f64>,
    /// The caller: `file:line:column`.
    pub location: Option<String>,
}

impl OpRecord {
    /// `all_reduce f32 × 1,048,576 (sum, ring)`: what the call was.
    pub fn describe(&self) -> String {
        let mut s = self.op.clone();
        if let Some(d) = &self.dtype {
            s.push_str(&format!(" {d} × {}", thousands(self.count)));
        }
        let mut extra = Vec::new();
        if let Some(r) = &self.reduce {
            extra.push(r.clone());
        }
        if let Some(r) = self.root {
            extra.push(format!("root {r}"));
        }
        if let Some(p) = self.peer {
            extra.push(format!("peer {p}"));
        }
        if let Some(t) = self.tag {
            extra.push(format!("tag {t}"));
        }
        if let Some(a) = &self.algorithm {
            extra.push(a.clone());
        }
        if !extra.is_empty() {
            s.push_str(&format!(" ({})", extra.join(", ")));
        }
        s
    }
}

/// 1048576 → `1,048,576`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub(crate) fn op_record(s: &Snapshot, p2p: bool) -> OpRecord {
    let op = match (p2p, s.op) {
        (_, 0) => "?".to_string(),
        (true, RECV) => "recv".to_string(),
        (_, c) => OpKind::from_code(c).map_or_else(|| format!("op{c}"), |o| o.name().to_string()),
    };
    let known = s.op != 0;
    let rank = (s.rank != u32::MAX && s.rank != ANY_PEER).then_some(s.rank);
    OpRecord {
        id: s.id,
        op,
        dtype: DType::from_code(s.dtype).map(|d| d.name().to_string()),
        count: s.count,
        reduce: ReduceOp::from_code(s.reduce).map(|r| r.name().to_string()),
        root: if p2p { None } else { rank },
        peer: if p2p { rank } else { None },
        tag: (p2p && known).then_some(s.tag),
        algorithm: if p2p || !known {
            None
        } else {
            Algorithm::from_code(s.algo).map(|a| a.name().to_string())
        },
        state: s.state.name().to_string(),
        queued: clock::unix(s.queued),
        started: clock::unix(s.started),
        start_coarse: s.start_coarse,
        ended: clock::unix(s.ended),
        location: s
            .location
            .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_in_thousands() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_048_576), "1,048,576");
    }
}
