//! The hasher of the postings' tables ([`super::postings`]): one rotate, xor and multiply a word
//! (FxHash's step, as rustc hashes its own tables) instead of std's SipHash, which was 8 % of a
//! small posted receive. SipHash resists keys chosen to collide; these tables' keys are this
//! rank's own — posting ids it numbers itself, and the peers and tags of its own receives (a
//! peer's message only looks a key up, never adds one) — so there is nothing to resist.

use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap`'s hasher state for [`WordHasher`].
pub(super) type WordHash = BuildHasherDefault<WordHasher>;

/// Hashes the words of a key (integers as they are, bytes eight at a time).
#[derive(Default)]
pub(super) struct WordHasher(u64);

/// An odd constant with its bits spread (FxHash's).
const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl WordHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for WordHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(w));
        }
    }

    #[inline]
    fn write_u8(&mut self, v: u8) {
        self.add(u64::from(v));
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }

    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }

    #[inline]
    fn write_isize(&mut self, v: isize) {
        self.add(v as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::hash::BuildHasher;

    #[test]
    fn keys_that_differ_hash_apart() {
        let h = WordHash::default();
        // Posting ids: consecutive, spread over the table's buckets (its low bits) and control
        // bytes (its top 7 bits).
        let ids: Vec<u64> = (0..4096u64).map(|i| h.hash_one(i)).collect();
        let low: HashSet<u64> = ids.iter().map(|x| x & 4095).collect();
        let top: HashSet<u64> = ids.iter().map(|x| x >> 57).collect();
        assert_eq!(low.len(), 4096, "consecutive ids share buckets");
        assert_eq!(top.len(), 128, "the top bits take {} values", top.len());
        // (peer, tag)-like keys: each word counts, and their order.
        let pairs: HashSet<u64> = (0..64usize)
            .flat_map(|p| (0..64u64).map(move |t| (p, t)))
            .map(|k| h.hash_one(k))
            .collect();
        assert_eq!(pairs.len(), 64 * 64);
        assert_ne!(h.hash_one((1usize, 2u64)), h.hash_one((2usize, 1u64)));
        assert_ne!(h.hash_one([1u8, 2, 3]), h.hash_one([1u8, 2, 4]));
    }
}
