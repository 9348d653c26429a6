//! All-reduce through an [`Arena`]: every rank reads its peers' buffers in place.
//!
//! - Up to the arena's inline length (16 bytes on shared memory: a scalar loss, a few counters): the
//!   data rides in the step's slot next to the fingerprint, so a peer's contribution arrives in the
//!   one cache line that also tells it has arrived.
//! - Up to [`ONE_PHASE_BYTES`]: each rank copies its input into its buffer and posts; once every peer
//!   has posted, each rank reduces all buffers itself (one synchronization, no second copy).
//! - Larger: chunks of the buffer length. For each, every rank copies its chunk in and posts; then
//!   reduces its own 1/n slice of the chunk from all buffers, writes the result over that slice of its
//!   own buffer (no peer reads it in this phase) and posts again; then copies the other slices from
//!   their owners. Each rank reads and reduces only 1/n of the data.
//!
//! Contributions are always combined in rank order, so every rank gets bit-identical results.
//! Every post carries the call's fingerprint and every wait checks it, so ranks in different
//! collectives fail with a mismatch error (see [`confirm`], which other collectives on an arena
//! group run first).

use kolo_core::{Arena, Error, Reducer, Result};

use crate::ctx::{even_blocks, Ctx};

/// Largest message reduced in one phase.
pub const ONE_PHASE_BYTES: usize = 32 * 1024;

/// Posts this call's fingerprint and checks every peer's: the first step of every collective on a
/// group with an arena, so that ranks calling different collectives fail fast instead of waiting.
pub fn confirm(ctx: &Ctx, arena: &dyn Arena) -> Result<()> {
    let step = arena.post(&ctx.header, &[]);
    wait_all(ctx, arena, step)
}

/// Checks a peer's fingerprint against this call's.
pub(crate) fn check_peer(ctx: &Ctx, peer: usize, remote: &kolo_core::Header) -> Result<()> {
    if *remote != ctx.header {
        return Err(Error::Mismatch {
            rank: ctx.rank,
            peer,
            local: ctx.header.call,
            remote: remote.call,
            tag: ctx.header.tag,
        });
    }
    Ok(())
}

/// Posts nothing; waits for every peer's `step` and checks its fingerprint.
pub(crate) fn wait_all(ctx: &Ctx, arena: &dyn Arena, step: u64) -> Result<()> {
    for peer in 0..ctx.size() {
        if peer == ctx.rank {
            continue;
        }
        let remote = arena
            .wait(peer, step, ctx.deadline, &mut [])
            .map_err(|e| ctx.recv_error(peer, e))?;
        check_peer(ctx, peer, &remote)?;
    }
    Ok(())
}

/// `len` bytes of `rank`'s buffer of `parity` from byte `at`.
///
/// # Safety
/// The arena protocol must give this rank read access to that range now (see `kolo_core::arena`).
unsafe fn peer_bytes(
    arena: &dyn Arena,
    rank: usize,
    parity: usize,
    at: usize,
    len: usize,
) -> &[u8] {
    debug_assert!(at + len <= arena.buffer_len());
    // SAFETY: in bounds (above); nobody writes the range while the protocol grants the read.
    unsafe { std::slice::from_raw_parts(arena.buffer(rank, parity).add(at), len) }
}

/// Copies `data` into this rank's buffer of `parity` at byte `at`.
fn write_own(arena: &dyn Arena, parity: usize, at: usize, data: &[u8]) {
    assert!(at + data.len() <= arena.buffer_len());
    // SAFETY: in bounds; this rank's own buffer is written only by this rank, at points where no peer
    // reads the range (the protocol).
    unsafe {
        std::ptr::copy_nonoverlapping(
            data.as_ptr(),
            arena.buffer(arena.rank(), parity).add(at),
            data.len(),
        )
    };
}

/// All-reduce of `buf` (elements of `elem` bytes) in place.
pub fn all_reduce(
    ctx: &Ctx,
    arena: &dyn Arena,
    buf: &mut [u8],
    elem: usize,
    red: &Reducer,
) -> Result<()> {
    let n = ctx.size();
    if buf.is_empty() || n == 1 {
        confirm(ctx, arena)?;
        red.finish(buf, n);
        return Ok(());
    }
    let chunk = (arena.buffer_len() / elem).max(1) * elem;
    if buf.len() <= arena.inline_len() {
        return all_reduce_inline(ctx, arena, buf, red);
    }
    if buf.len() <= ONE_PHASE_BYTES.min(chunk) {
        let parity = arena.next_round();
        write_own(arena, parity, 0, buf);
        let step = arena.post(&ctx.header, &[]);
        wait_all(ctx, arena, step)?;
        let len = buf.len();
        if ctx.rank != 0 {
            // SAFETY: every rank posted this round's data and reads only until its next post.
            buf.copy_from_slice(unsafe { peer_bytes(arena, 0, parity, 0, len) });
        }
        for r in 1..n {
            // SAFETY: as above.
            red.apply(buf, unsafe { peer_bytes(arena, r, parity, 0, len) });
        }
        red.finish(buf, n);
        return Ok(());
    }
    for piece in buf.chunks_mut(chunk) {
        let parity = arena.next_round();
        write_own(arena, parity, 0, piece);
        let step = arena.post(&ctx.header, &[]);
        wait_all(ctx, arena, step)?;
        let blocks = even_blocks(piece.len() / elem, n, elem);
        let mine = blocks[ctx.rank].clone();
        {
            let out = &mut piece[mine.clone()];
            // SAFETY: after the first post, slice `mine` of every buffer is read only by this rank.
            out.copy_from_slice(unsafe { peer_bytes(arena, 0, parity, mine.start, mine.len()) });
            for r in 1..n {
                // SAFETY: as above.
                red.apply(out, unsafe {
                    peer_bytes(arena, r, parity, mine.start, mine.len())
                });
            }
            red.finish(out, n);
            write_own(arena, parity, mine.start, out);
        }
        let step = arena.post(&ctx.header, &[]);
        wait_all(ctx, arena, step)?;
        for (r, b) in blocks.iter().enumerate() {
            if r != ctx.rank && !b.is_empty() {
                // SAFETY: after the second post, slice `b` of rank r's buffer holds its result and
                // nobody writes it before this rank's next post.
                piece[b.clone()]
                    .copy_from_slice(unsafe { peer_bytes(arena, r, parity, b.start, b.len()) });
            }
        }
    }
    Ok(())
}

/// All-reduce of a message that fits in a step's inline data: one post, then every peer's data read
/// from its slot and combined in rank order.
fn all_reduce_inline(ctx: &Ctx, arena: &dyn Arena, buf: &mut [u8], red: &Reducer) -> Result<()> {
    const MAX: usize = 64;
    let len = buf.len();
    let mut mine = [0u8; MAX];
    let mut theirs = [0u8; MAX];
    assert!(len <= MAX, "arena inline length above {MAX}");
    mine[..len].copy_from_slice(buf);
    let step = arena.post(&ctx.header, buf);
    for r in 0..ctx.size() {
        let data: &[u8] = if r == ctx.rank {
            &mine[..len]
        } else {
            let remote = arena
                .wait(r, step, ctx.deadline, &mut theirs[..len])
                .map_err(|e| ctx.recv_error(r, e))?;
            check_peer(ctx, r, &remote)?;
            &theirs[..len]
        };
        if r == 0 {
            buf.copy_from_slice(data);
        } else {
            red.apply(buf, data);
        }
    }
    red.finish(buf, ctx.size());
    Ok(())
}
