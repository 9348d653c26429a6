//! Broadcast through an [`Arena`]: the root publishes, every other rank reads the root's buffer in
//! place.
//!
//! - Up to the arena's inline length (16 bytes on shared memory): the data rides in the root's step
//!   slot, in the one cache line each peer reads anyway to see the step (the all-reduce's inline path,
//!   with one writer).
//! - Larger: chunks of the buffer length, one round each. The root copies a chunk into its buffer of
//!   the round and posts; every rank posts (so every fingerprint is checked, as in every arena
//!   collective) and waits for all; the others copy the chunk out of the root's buffer. The root
//!   fills the next round's buffer while the others still read this one (two buffers alternate), so
//!   a long message is pipelined.
//!
//! Every rank reads the root's buffer at once: one copy in and n − 1 copies out in parallel, against
//! ⌈log₂ n⌉ message hops of the binomial tree.

use kolo_core::{Arena, Result};

use crate::algorithms::allreduce_shm::{check_peer, wait_all};
use crate::ctx::Ctx;

/// Broadcasts `buf` from `root` to every rank of the arena's group.
pub fn broadcast(ctx: &Ctx, arena: &dyn Arena, buf: &mut [u8], root: usize) -> Result<()> {
    if buf.len() <= arena.inline_len() {
        return broadcast_inline(ctx, arena, buf, root);
    }
    let me = ctx.rank;
    for piece in buf.chunks_mut(arena.buffer_len()) {
        let parity = arena.next_round();
        let own = arena.buffer(me, parity);
        if me == root {
            // SAFETY: this rank's buffer of the round, written only by it and only before the
            // round's first post (the arena protocol); the chunk fits (chunks of buffer_len).
            unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), own, piece.len()) };
        }
        let step = arena.post(&ctx.header, &[]);
        wait_all(ctx, arena, step)?;
        if me != root {
            let from = arena.buffer(root, parity);
            // SAFETY: the root posted this round after filling its buffer and rewrites it only after
            // this rank's next post; in bounds as above.
            unsafe { std::ptr::copy_nonoverlapping(from, piece.as_mut_ptr(), piece.len()) };
        }
    }
    Ok(())
}

/// Broadcast of a message that fits in a step's inline data: one post each, the root's with the data.
fn broadcast_inline(ctx: &Ctx, arena: &dyn Arena, buf: &mut [u8], root: usize) -> Result<()> {
    const MAX: usize = 64;
    let len = buf.len();
    assert!(len <= MAX, "arena inline length above {MAX}");
    let mut theirs = [0u8; MAX];
    let me = ctx.rank;
    let step = arena.post(&ctx.header, if me == root { buf } else { &[] });
    for r in 0..ctx.size() {
        if r == me {
            continue;
        }
        let inline = if r == root {
            &mut theirs[..len]
        } else {
            &mut [][..]
        };
        let remote = arena
            .wait(r, step, ctx.deadline, inline)
            .map_err(|e| ctx.recv_error(r, e))?;
        check_peer(ctx, r, &remote)?;
    }
    if me != root {
        buf.copy_from_slice(&theirs[..len]);
    }
    Ok(())
}
