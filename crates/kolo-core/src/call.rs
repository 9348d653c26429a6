//! What travels in front of every message: the [`Tag`] that matches it to a receive and the [`Call`]
//! (fingerprint) that lets the receiver check that both sides are in the same operation.
//!
//! A collective's tag is `(group, sequence number)`: every collective gets the next number of its
//! communicator, so consecutive or concurrent collectives can never match each other's messages (gloo's
//! `Slot`). Its fingerprint carries the operation, element type, count, root, reduce operator and
//! algorithm; a receiver that finds a different fingerprint under the same tag reports both calls instead
//! of reducing garbage or waiting forever.

use std::fmt;

use crate::dtype::DType;
use crate::reduce::ReduceOp;

/// The operation a message belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum OpKind {
    Send = 1,
    Barrier = 2,
    Broadcast = 3,
    Scatter = 4,
    Gather = 5,
    AllGather = 6,
    AllToAll = 7,
    Reduce = 8,
    AllReduce = 9,
    ReduceScatter = 10,
    ScatterV = 11,
    GatherV = 12,
    AllGatherV = 13,
    AllToAllV = 14,
    /// All-reduce by adaptive summation (Adasum); `count` is a hash of the layer lengths.
    AllReduceAdasum = 15,
    /// The all-gather of colors and keys that `Communicator::split` starts with: a kind
    /// of its own, so that it never agrees with another rank's `all_gather` of two `i64`.
    Split = 16,
    /// The all-gather of rank-list fingerprints that `Communicator::new_group` starts with
    /// (likewise).
    NewGroup = 17,
}

impl OpKind {
    const ALL: [OpKind; 17] = [
        OpKind::Send,
        OpKind::Barrier,
        OpKind::Broadcast,
        OpKind::Scatter,
        OpKind::Gather,
        OpKind::AllGather,
        OpKind::AllToAll,
        OpKind::Reduce,
        OpKind::AllReduce,
        OpKind::ReduceScatter,
        OpKind::ScatterV,
        OpKind::GatherV,
        OpKind::AllGatherV,
        OpKind::AllToAllV,
        OpKind::AllReduceAdasum,
        OpKind::Split,
        OpKind::NewGroup,
    ];

    /// The name users know the operation by (`all_reduce`, `send`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            OpKind::Send => "send",
            OpKind::Barrier => "barrier",
            OpKind::Broadcast => "broadcast",
            OpKind::Scatter => "scatter",
            OpKind::Gather => "gather",
            OpKind::AllGather => "all_gather",
            OpKind::AllToAll => "all_to_all",
            OpKind::Reduce => "reduce",
            OpKind::AllReduce => "all_reduce",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::ScatterV => "scatter_v",
            OpKind::GatherV => "gather_v",
            OpKind::AllGatherV => "all_gather_v",
            OpKind::AllToAllV => "all_to_all_v",
            OpKind::AllReduceAdasum => "all_reduce_adasum",
            OpKind::Split => "split",
            OpKind::NewGroup => "new_group",
        }
    }

    /// Decodes a wire code.
    #[inline]
    pub fn from_code(code: u8) -> Option<OpKind> {
        // `ALL` lists the variants in the order of their codes, from 1: an index, not a search
        // (this decodes every message's header); checked, so a list out of order only refuses.
        let v = *OpKind::ALL.get(usize::from(code.wrapping_sub(1)))?;
        (v as u8 == code).then_some(v)
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The algorithm a collective runs; part of the fingerprint so that ranks configured differently (for
/// example a `KOLO_ALGO_*` variable set on one rank only) get an error rather than a hang.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum Algorithm {
    /// Point-to-point, or a collective of one rank.
    Direct = 0,
    Ring = 1,
    RecursiveDoubling = 2,
    HalvingDoubling = 3,
    BinomialTree = 4,
    Linear = 5,
    Pairwise = 6,
    Dissemination = 7,
    /// Through memory every rank of the group maps (see [`crate::Arena`]).
    Shm = 8,
    /// Reduce-scatter inside each host, all-reduce across hosts, all-gather inside each host.
    Hierarchical = 9,
    /// The whole collective run by a collective engine (MPI's own implementation).
    Engine = 10,
}

impl Algorithm {
    const ALL: [Algorithm; 11] = [
        Algorithm::Direct,
        Algorithm::Ring,
        Algorithm::RecursiveDoubling,
        Algorithm::HalvingDoubling,
        Algorithm::BinomialTree,
        Algorithm::Linear,
        Algorithm::Pairwise,
        Algorithm::Dissemination,
        Algorithm::Shm,
        Algorithm::Hierarchical,
        Algorithm::Engine,
    ];

    /// Name as accepted by the `KOLO_ALGO_*` variables.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Direct => "direct",
            Algorithm::Ring => "ring",
            Algorithm::RecursiveDoubling => "recursive_doubling",
            Algorithm::HalvingDoubling => "halving_doubling",
            Algorithm::BinomialTree => "tree",
            Algorithm::Linear => "linear",
            Algorithm::Pairwise => "pairwise",
            Algorithm::Dissemination => "dissemination",
            Algorithm::Shm => "shm",
            Algorithm::Hierarchical => "hierarchical",
            Algorithm::Engine => "engine",
        }
    }

    /// Decodes a wire code.
    #[inline]
    pub fn from_code(code: u8) -> Option<Algorithm> {
        // `ALL` lists the variants in the order of their codes, from 0: an index, not a search
        // (this decodes every message's header); checked, so a list out of order only refuses.
        let v = *Algorithm::ALL.get(usize::from(code))?;
        (v as u8 == code).then_some(v)
    }

    /// Parses a name as printed by [`Algorithm::name`].
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The fingerprint of one call: two ranks in the same collective must have equal fingerprints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Call {
    /// The operation.
    pub op: OpKind,
    /// Element type, if the operation moves typed data.
    pub dtype: Option<DType>,
    /// Reduce operator, for reductions.
    pub reduce: Option<ReduceOp>,
    /// Element count per rank; for the variable-count forms a hash of all counts.
    pub count: u64,
    /// Root rank (group-local), for rooted operations.
    pub root: Option<u32>,
    /// Algorithm.
    pub algo: Algorithm,
}

impl Call {
    /// A call with no type, count or root (a barrier, say).
    pub const fn new(op: OpKind, algo: Algorithm) -> Self {
        Call {
            op,
            dtype: None,
            reduce: None,
            count: 0,
            root: None,
            algo,
        }
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(", self.op)?;
        if matches!(self.op, OpKind::Split | OpKind::NewGroup) {
            // Its data (colors and keys, a list's fingerprint) are kolo's, not the caller's.
            return f.write_str(")");
        }
        let mut sep = "";
        if let Some(d) = self.dtype {
            let vform = matches!(
                self.op,
                OpKind::ScatterV | OpKind::GatherV | OpKind::AllGatherV | OpKind::AllToAllV
            );
            if vform {
                write!(f, "{d}, counts#{:016x}", self.count)?;
            } else if self.op == OpKind::AllReduceAdasum {
                write!(f, "{d}, layers#{:016x}", self.count)?;
            } else {
                write!(f, "{d} x {}", self.count)?;
            }
            sep = ", ";
        }
        if let Some(r) = self.reduce {
            write!(f, "{sep}{r}")?;
            sep = ", ";
        }
        if let Some(root) = self.root {
            write!(f, "{sep}root={root}")?;
            sep = ", ";
        }
        if self.algo != Algorithm::Direct {
            write!(f, "{sep}algo={}", self.algo)?;
        }
        f.write_str(")")
    }
}

/// Which matching space a tag lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TagSpace {
    /// Collective messages: the value is the collective's sequence number.
    Collective = 1,
    /// Point-to-point messages: the value is the user's tag.
    P2p = 2,
    /// Confirmations that a collective's message was accepted (see [`Header::ack`]): the value is the
    /// collective's sequence number.
    Ack = 3,
}

/// Matches a message to a receive: same source, same tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tag {
    /// Communicator (group) id.
    pub group: u64,
    /// Collective or point-to-point.
    pub space: TagSpace,
    /// Sequence number (collectives) or user tag (point-to-point).
    pub value: u64,
}

impl Tag {
    /// The `value` of a receive's tag that matches any point-to-point tag of its group (MPI's
    /// `MPI_ANY_TAG`); never the tag of a message (sends refuse it).
    pub const ANY_VALUE: u64 = u64::MAX;

    /// Whether a message with this tag matches a receive for `pattern`: equal, or of the same group
    /// and space when `pattern` is a point-to-point tag with [`Tag::ANY_VALUE`].
    pub fn matches(&self, pattern: &Tag) -> bool {
        self == pattern
            || (pattern.is_wildcard() && self.group == pattern.group && self.space == pattern.space)
    }

    /// Whether this is a receive's any-tag pattern.
    pub fn is_wildcard(&self) -> bool {
        self.value == Tag::ANY_VALUE && self.space == TagSpace::P2p
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.space {
            TagSpace::Collective => write!(f, "group {:x} collective #{}", self.group, self.value),
            TagSpace::P2p if self.is_wildcard() => write!(f, "group {:x} any tag", self.group),
            TagSpace::P2p => write!(f, "group {:x} tag {}", self.group, self.value),
            TagSpace::Ack => write!(
                f,
                "group {:x} confirmation of collective #{}",
                self.group, self.value
            ),
        }
    }
}

/// Tag and fingerprint, sent in front of every payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Matching tag.
    pub tag: Tag,
    /// Fingerprint of the call that sent it.
    pub call: Call,
    /// The sender waits for the receiver to confirm that it accepted this message (a rank whose
    /// only part in a collective is to send, so that it learns of a mismatch before it returns).
    /// Not part of the fingerprint; carried in the top bit of the tag-space byte.
    pub ack: bool,
}

/// Encoded size of a [`Header`].
pub const HEADER_LEN: usize = 33;

/// Why a header could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadHeader(pub &'static str);

impl Header {
    /// Encodes to the fixed little-endian wire layout.
    #[inline]
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&self.tag.group.to_le_bytes());
        b[8] = self.tag.space as u8 | if self.ack { 0x80 } else { 0 };
        b[9..17].copy_from_slice(&self.tag.value.to_le_bytes());
        b[17] = self.call.op as u8;
        b[18] = self.call.dtype.map_or(0, |d| d as u8);
        b[19] = self.call.reduce.map_or(0, |r| r as u8);
        b[20] = self.call.algo as u8;
        b[21..25].copy_from_slice(&self.call.root.unwrap_or(u32::MAX).to_le_bytes());
        b[25..33].copy_from_slice(&self.call.count.to_le_bytes());
        b
    }

    /// Decodes the wire layout, rejecting unknown codes.
    #[inline]
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, BadHeader> {
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let space = match b[8] & 0x7f {
            1 => TagSpace::Collective,
            2 => TagSpace::P2p,
            3 => TagSpace::Ack,
            _ => return Err(BadHeader("unknown tag space")),
        };
        let op = OpKind::from_code(b[17]).ok_or(BadHeader("unknown operation code"))?;
        let dtype = match b[18] {
            0 => None,
            c => Some(DType::from_code(c).ok_or(BadHeader("unknown element type code"))?),
        };
        let reduce = match b[19] {
            0 => None,
            c => Some(ReduceOp::from_code(c).ok_or(BadHeader("unknown reduce operator code"))?),
        };
        let algo = Algorithm::from_code(b[20]).ok_or(BadHeader("unknown algorithm code"))?;
        let mut r = [0u8; 4];
        r.copy_from_slice(&b[21..25]);
        let root = match u32::from_le_bytes(r) {
            u32::MAX => None,
            v => Some(v),
        };
        Ok(Header {
            tag: Tag {
                group: u64_at(0),
                space,
                value: u64_at(9),
            },
            call: Call {
                op,
                dtype,
                reduce,
                count: u64_at(25),
                root,
                algo,
            },
            ack: b[8] & 0x80 != 0,
        })
    }
}

/// FNV-1a hash, used for group ids and count-vector fingerprints (stable across processes and builds,
/// unlike `std`'s hasher).
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // Separate parts so that ("ab","c") and ("a","bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Fingerprint of a vector of counts (the variable-count collectives).
pub fn counts_hash(counts: &[usize]) -> u64 {
    let bytes: Vec<u8> = counts
        .iter()
        .flat_map(|c| (*c as u64).to_le_bytes())
        .collect();
    fnv1a(&[&bytes])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_code_decodes_to_its_variant_and_no_other_code_does() {
        for code in 0..=u8::MAX {
            let op = OpKind::ALL.into_iter().find(|o| *o as u8 == code);
            assert_eq!(OpKind::from_code(code), op, "operation code {code}");
            let algo = Algorithm::ALL.into_iter().find(|a| *a as u8 == code);
            assert_eq!(Algorithm::from_code(code), algo, "algorithm code {code}");
            let reduce = ReduceOp::ALL.into_iter().find(|r| *r as u8 == code);
            assert_eq!(ReduceOp::from_code(code), reduce, "reduce code {code}");
        }
        assert_eq!(OpKind::from_code(15), Some(OpKind::AllReduceAdasum));
        assert_eq!(Algorithm::from_code(0), Some(Algorithm::Direct));
    }

    fn sample() -> Header {
        Header {
            ack: false,
            tag: Tag {
                group: 0xdead_beef,
                space: TagSpace::Collective,
                value: 42,
            },
            call: Call {
                op: OpKind::AllReduce,
                dtype: Some(DType::BF16),
                reduce: Some(ReduceOp::Max),
                count: 1_000_003,
                root: None,
                algo: Algorithm::Ring,
            },
        }
    }

    #[test]
    fn header_round_trip() {
        let h = sample();
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        let mut p2p = h;
        p2p.tag.space = TagSpace::P2p;
        p2p.call = Call {
            root: Some(3),
            ..Call::new(OpKind::Send, Algorithm::Direct)
        };
        assert_eq!(Header::decode(&p2p.encode()), Ok(p2p));
    }

    #[test]
    fn a_disagreement_names_the_first_rank_in_another_call() {
        let h = sample();
        let mut other = h;
        other.call.count = 12;
        let all: Vec<u8> = [h, h, other, other]
            .iter()
            .flat_map(|x| x.encode())
            .collect();
        match crate::disagreement(&h, 1, &all) {
            crate::Error::Mismatch {
                rank: 1,
                peer: 2,
                remote,
                ..
            } => assert_eq!(remote.count, 12),
            e => panic!("expected a mismatch naming rank 2, got {e}"),
        }
        let mut garbled = h.encode();
        garbled[17] = 0xff;
        let all: Vec<u8> = h.encode().iter().chain(garbled.iter()).copied().collect();
        assert!(matches!(
            crate::disagreement(&h, 0, &all),
            crate::Error::Protocol { peer: 1, .. }
        ));
        let same: Vec<u8> = [h, h].iter().flat_map(|x| x.encode()).collect();
        assert!(matches!(
            crate::disagreement(&h, 0, &same),
            crate::Error::Protocol { peer: 0, .. }
        ));
    }

    #[test]
    fn call_display_names_everything() {
        assert_eq!(
            sample().call.to_string(),
            "all_reduce(bf16 x 1000003, max, algo=ring)"
        );
    }

    #[test]
    fn adasum_call_round_trips_and_shows_its_layers() {
        let mut h = sample();
        h.call = Call {
            op: OpKind::AllReduceAdasum,
            dtype: Some(DType::F32),
            reduce: None,
            count: 0xabc,
            root: None,
            algo: Algorithm::HalvingDoubling,
        };
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        assert_eq!(
            h.call.to_string(),
            "all_reduce_adasum(f32, layers#0000000000000abc, algo=halving_doubling)"
        );
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), HEADER_LEN)) {
            let mut b = [0u8; HEADER_LEN];
            b.copy_from_slice(&bytes);
            if let Ok(h) = Header::decode(&b) {
                prop_assert_eq!(Header::decode(&h.encode()), Ok(h));
            }
        }
    }
}
