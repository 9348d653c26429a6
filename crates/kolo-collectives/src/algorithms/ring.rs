//! Ring algorithms: reduce-scatter, all-gather and their composition, all-reduce (Patarasuk & Yuan;
//! the schedule NCCL, gloo and Horovod use for large buffers).
//!
//! The buffer is cut into n blocks, block b belonging to rank b. Ranks form a ring r → r+1.
//!
//! Reduce-scatter, steps s = 0 … n−2: rank r sends block (r − s − 1) mod n to r+1 and receives block
//! (r − s − 2) mod n from r−1, reducing it into its own copy. The block a rank sends in step s is the one
//! it received and reduced in step s−1, so after n−1 steps rank r holds block r reduced over all ranks.
//!
//! All-gather, steps s = 0 … n−2: rank r sends block (r − s) mod n to r+1 and receives block
//! (r − s − 1) mod n from r−1 — each finished block travels once around the ring.
//!
//! All-reduce = reduce-scatter + all-gather: 2(n−1) steps, each rank sends and receives 2(n−1)/n of the
//! buffer, which is optimal in bandwidth. Every block is reduced by exactly one chain of ranks and then
//! copied, so all ranks end with bit-identical results. Blocks are sent in segments of at most
//! [`SEGMENT_BYTES`](crate::ctx::SEGMENT_BYTES), so reduction of one segment overlaps the transfer of
//! the next. Blocks may have different sizes (the variable-count forms use that), including zero.

use std::ops::Range;

use kolo_core::{Reducer, Result};

use crate::ctx::{even_blocks, split_pair, InPlace, IN_PLACE_RING_BYTES};
use crate::Ctx;

/// Reduce-scatter phase, in place: on return `buf[blocks[rank]]` holds that block reduced over all ranks
/// (without the final `Avg` division); other blocks hold partial sums.
pub fn reduce_scatter_in_place(
    ctx: &Ctx,
    buf: &mut [u8],
    blocks: &[Range<usize>],
    elem: usize,
    red: &Reducer,
) -> Result<()> {
    let n = ctx.size();
    let r = ctx.rank;
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    for s in 0..n.saturating_sub(1) {
        let send_b = (r + 2 * n - s - 1) % n;
        let recv_b = (r + 2 * n - s - 2) % n;
        // Posted first, so that a transport can reduce what arrives into place as it comes.
        let (out, into) = split_pair(buf, blocks[send_b].clone(), blocks[recv_b].clone());
        ctx.recv_segmented_posted(prev, into, elem, Some(red), &mut || {
            ctx.send_segmented(next, out, elem)
        })?;
    }
    Ok(())
}

/// All-gather phase, in place: `buf[blocks[rank]]` is this rank's block; on return every block is filled.
pub fn all_gather_in_place(
    ctx: &Ctx,
    buf: &mut [u8],
    blocks: &[Range<usize>],
    elem: usize,
) -> Result<()> {
    let n = ctx.size();
    let r = ctx.rank;
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let mut sent = InPlace::default();
    for s in 0..n.saturating_sub(1) {
        let send_b = (r + n - s) % n;
        let recv_b = (r + 2 * n - s - 1) % n;
        // The block to receive is posted before this step's send, so that a transport can write
        // what arrives straight into it — out of the sender's memory where the block goes in place.
        let (out, into) = split_pair(buf, blocks[send_b].clone(), blocks[recv_b].clone());
        ctx.recv_segmented_posted(prev, into, elem, None, &mut || {
            // SAFETY: `out` stays borrowed, unchanged, until `next` has copied it (`wait_sent`).
            unsafe { ctx.send_segmented_in_place(next, out, elem, IN_PLACE_RING_BYTES, &mut sent) }
        })?;
        ctx.wait_sent(&mut sent)?;
    }
    Ok(())
}

/// Ring all-reduce of `buf` in place.
pub fn all_reduce(ctx: &Ctx, buf: &mut [u8], elem: usize, red: &Reducer) -> Result<()> {
    let blocks = even_blocks(buf.len() / elem, ctx.size(), elem);
    reduce_scatter_in_place(ctx, buf, &blocks, elem, red)?;
    red.finish(&mut buf[blocks[ctx.rank].clone()], ctx.size());
    all_gather_in_place(ctx, buf, &blocks, elem)
}

/// Ring reduce-scatter: `send` holds every rank's blocks laid out as `blocks`; `recv` receives this
/// rank's block, reduced.
pub fn reduce_scatter(
    ctx: &Ctx,
    send: &[u8],
    recv: &mut [u8],
    blocks: &[Range<usize>],
    elem: usize,
    red: &Reducer,
) -> Result<()> {
    let mut scratch = send.to_vec();
    reduce_scatter_in_place(ctx, &mut scratch, blocks, elem, red)?;
    let mine = &mut scratch[blocks[ctx.rank].clone()];
    red.finish(mine, ctx.size());
    recv.copy_from_slice(mine);
    Ok(())
}

/// Ring all-gather: `send` is this rank's block; `recv` receives all blocks laid out as `blocks`.
pub fn all_gather(
    ctx: &Ctx,
    send: &[u8],
    recv: &mut [u8],
    blocks: &[Range<usize>],
    elem: usize,
) -> Result<()> {
    recv[blocks[ctx.rank].clone()].copy_from_slice(send);
    all_gather_in_place(ctx, recv, blocks, elem)
}
