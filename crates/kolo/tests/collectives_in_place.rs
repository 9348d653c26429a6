//! Collectives whose blocks go in place (the receiver copies each block once, out of the
//! sender's memory, where the transport can: shared memory, and a hybrid world's same-host
//! peers): all-gather (ring, blocks of 512 KiB and more), all-to-all (pairwise), gather and
//! scatter (linear, 64 KiB and more), on every transport. Every block lands whole and in its
//! place, and each call returns only once its blocks are copied: the senders change their
//! buffers at once and call again, and the next call's results must be the new bytes. And the
//! all-gather in place (`Communicator::all_gather_in_place`, MPI's `IN_PLACE`). The shared-memory
//! worlds send in place from 8 KiB (`common::in_place_shm`; by default only from 16 MiB, which
//! no segment reaches).

mod common;

use std::time::Duration;

use common::{checks, in_place_shm, spawn_with, Kind};
use kolo::prelude::*;
use kolo::Result;

const ALL: [Kind; 4] = [Kind::Local, Kind::Shm, Kind::Tcp, Kind::Hybrid];
const RANKS: usize = 3;
/// Above the ring's threshold (512 KiB) and more than one 1 MiB segment.
const GATHERED: usize = 1_300_000;
/// Above the pairwise and linear algorithms' threshold (64 KiB).
const BLOCK: usize = 100_000;

fn cfg() -> Config {
    Config::default().with_timeout(Duration::from_secs(30))
}

/// Rank `from`'s bytes for rank `to` in round `round`.
fn bytes(from: usize, to: usize, round: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| ((j * 31 + from * 7 + to * 3 + round * 11) % 251) as u8)
        .collect()
}

fn rounds(c: &Communicator) -> Result<()> {
    let (me, n) = (c.rank(), c.size());
    let (mut send, mut recv) = (Vec::new(), Vec::new());
    for round in 0..3 {
        // All-gather.
        send.clear();
        send.extend(bytes(me, 0, round, GATHERED));
        recv.clear();
        recv.resize(n * GATHERED, 0u8);
        c.all_gather(&send, &mut recv)?;
        for (from, got) in recv.chunks(GATHERED).enumerate() {
            assert!(
                got == bytes(from, 0, round, GATHERED),
                "all_gather: rank {me} from {from}, round {round}"
            );
        }
        // All-to-all.
        send.clear();
        for to in 0..n {
            send.extend(bytes(me, to, round, BLOCK));
        }
        recv.clear();
        recv.resize(n * BLOCK, 0);
        c.all_to_all(&send, &mut recv)?;
        for (from, got) in recv.chunks(BLOCK).enumerate() {
            assert!(
                got == bytes(from, me, round, BLOCK),
                "all_to_all: rank {me} from {from}, round {round}"
            );
        }
        // Gather to rank 1, then scatter from it.
        let root = 1;
        send.clear();
        send.extend(bytes(me, root, round, BLOCK));
        recv.clear();
        recv.resize(if me == root { n * BLOCK } else { 0 }, 0);
        c.gather(&send, &mut recv, root)?;
        if me == root {
            for (from, got) in recv.chunks(BLOCK).enumerate() {
                assert!(
                    got == bytes(from, root, round, BLOCK),
                    "gather: from {from}, round {round}"
                );
            }
        }
        send.clear();
        if me == root {
            for to in 0..n {
                send.extend(bytes(root, to, round + 5, BLOCK));
            }
        }
        recv.clear();
        recv.resize(BLOCK, 0);
        c.scatter(&send, &mut recv, root)?;
        assert!(
            recv == bytes(root, me, round + 5, BLOCK),
            "scatter: rank {me}, round {round}"
        );
        // The senders change their buffers at once (the next round's `clear`, above): a call that
        // returned before its blocks were copied would hand the next call's bytes, or garbage.
        send.fill(0xEE);
    }
    Ok(())
}

#[test]
fn all_gather_in_place_on_every_transport() {
    for kind in ALL {
        for (rank, r) in spawn_with(kind, RANKS, cfg(), &in_place_shm(), |c| {
            checks::all_gather_in_place(&c, true)
        })
        .into_iter()
        .enumerate()
        {
            r.unwrap_or_else(|e| panic!("{kind:?}: rank {rank}: {e}"));
        }
    }
}

#[test]
fn blocks_sent_in_place_land_whole_and_in_time_on_every_transport() {
    for kind in ALL {
        for (rank, r) in spawn_with(kind, RANKS, cfg(), &in_place_shm(), |c| rounds(&c))
            .into_iter()
            .enumerate()
        {
            r.unwrap_or_else(|e| panic!("{kind:?}: rank {rank}: {e}"));
        }
    }
}
