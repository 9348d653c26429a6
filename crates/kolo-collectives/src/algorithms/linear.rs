//! Linear gather and scatter: the root exchanges one message with every other rank.
//!
//! Gather: every non-root rank sends its block to the root, which receives them in rank order. Scatter:
//! the root sends each rank its block. Cost at the root: (n−1) α + (n−1)/n m β, which is what the root's
//! link must carry anyway; gloo uses the same schedule. Blocks may differ in size (the -v forms).

use std::ops::Range;

use kolo_core::Result;

use crate::Ctx;

/// Gathers `send` of every rank into `recv[blocks[r]]` on `root` (`recv` is unused elsewhere).
pub fn gather(
    ctx: &Ctx,
    send: &[u8],
    recv: &mut [u8],
    blocks: &[Range<usize>],
    elem: usize,
    root: usize,
) -> Result<()> {
    if ctx.rank != root {
        return ctx.send_segmented(root, send, elem);
    }
    recv[blocks[root].clone()].copy_from_slice(send);
    for (peer, b) in blocks.iter().enumerate() {
        if peer != root {
            ctx.recv_segmented(peer, &mut recv[b.clone()], elem, None)?;
        }
    }
    Ok(())
}

/// Scatters `send[blocks[r]]` from `root` into `recv` of rank r (`send` is unused off the root).
pub fn scatter(
    ctx: &Ctx,
    send: &[u8],
    recv: &mut [u8],
    blocks: &[Range<usize>],
    elem: usize,
    root: usize,
) -> Result<()> {
    if ctx.rank != root {
        return ctx.recv_segmented(root, recv, elem, None);
    }
    for (peer, b) in blocks.iter().enumerate() {
        if peer != root {
            ctx.send_segmented(peer, &send[b.clone()], elem)?;
        }
    }
    recv.copy_from_slice(&send[blocks[root].clone()]);
    Ok(())
}
