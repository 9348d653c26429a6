//! Linear gather and scatter: the root exchanges one message with every other rank.
//!
//! Gather: every non-root rank sends its block to the root, which receives them in rank order. Scatter:
//! the root sends each rank its block. Cost at the root: (n−1) α + (n−1)/n m β, which is what the root's
//! link must carry anyway; gloo uses the same schedule. Blocks may differ in size (the -v forms).
//!
//! Blocks go in place where the transport can (see [`Ctx::send_segmented_in_place`]): the receiver
//! posts its block and copies the message straight out of the sender's memory, one copy in all.

use std::ops::Range;

use kolo_core::Result;

use crate::ctx::{InPlace, IN_PLACE_BLOCK_BYTES};
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
        let mut sent = InPlace::default();
        // SAFETY: `send` is borrowed, unchanged, until the root has copied it (`wait_sent`).
        unsafe { ctx.send_segmented_in_place(root, send, elem, IN_PLACE_BLOCK_BYTES, &mut sent) }?;
        return ctx.wait_sent(&mut sent);
    }
    recv[blocks[root].clone()].copy_from_slice(send);
    for (peer, b) in blocks.iter().enumerate() {
        if peer != root {
            ctx.recv_segmented_posted(peer, &mut recv[b.clone()], elem, None, &mut || Ok(()))?;
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
        return ctx.recv_segmented_posted(root, recv, elem, None, &mut || Ok(()));
    }
    let mut sent = InPlace::default();
    for (peer, b) in blocks.iter().enumerate() {
        if peer != root {
            // SAFETY: `send` is borrowed, unchanged, until every rank has copied its block.
            unsafe {
                ctx.send_segmented_in_place(
                    peer,
                    &send[b.clone()],
                    elem,
                    IN_PLACE_BLOCK_BYTES,
                    &mut sent,
                )
            }?;
        }
    }
    recv.copy_from_slice(&send[blocks[root].clone()]);
    ctx.wait_sent(&mut sent)
}
