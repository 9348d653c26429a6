//! Pairwise-exchange all-to-all (MPICH's algorithm for long messages).
//!
//! In step s = 1 … n−1 rank r sends its block for r + s and receives the block from r − s (mod n);
//! its own block is a local copy. Every pair exchanges exactly once and no rank receives from two
//! ranks in one step. Cost: (n−1) (α + m/n β). Blocks may differ in size (all-to-all-v).
//!
//! Each step posts the block to receive before it sends, and sends in place where the transport
//! can (see [`Ctx::send_segmented_in_place`]): one copy per block, out of the sender's memory.

use std::ops::Range;

use kolo_core::Result;

use crate::ctx::{InPlace, IN_PLACE_BLOCK_BYTES};
use crate::Ctx;

/// `send_blocks[d]` of `send` goes to rank d; the block from rank s lands in `recv[recv_blocks[s]]`.
pub fn all_to_all(
    ctx: &Ctx,
    send: &[u8],
    send_blocks: &[Range<usize>],
    recv: &mut [u8],
    recv_blocks: &[Range<usize>],
    elem: usize,
) -> Result<()> {
    let n = ctx.size();
    let r = ctx.rank;
    recv[recv_blocks[r].clone()].copy_from_slice(&send[send_blocks[r].clone()]);
    let mut sent = InPlace::default();
    for s in 1..n {
        let to = (r + s) % n;
        let from = (r + n - s) % n;
        let out = &send[send_blocks[to].clone()];
        ctx.recv_segmented_posted(
            from,
            &mut recv[recv_blocks[from].clone()],
            elem,
            None,
            &mut || {
                // SAFETY: `send` is borrowed, unchanged, until `to` has copied its block.
                unsafe {
                    ctx.send_segmented_in_place(to, out, elem, IN_PLACE_BLOCK_BYTES, &mut sent)
                }
            },
        )?;
        ctx.wait_sent(&mut sent)?;
    }
    Ok(())
}
