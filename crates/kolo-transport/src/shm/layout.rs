//! Layout of the mapped segment: the header, each rank's control lines, the rings and the arena
//! buffers (see the module documentation of `shm`).

use kolo_core::HEADER_LEN;

use super::steps::{FP_SLOT, INLINE_AT};
use super::ShmOptions;

pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"kolo-shm");
pub(super) const LINE: usize = 128;
const HEADER_BYTES: usize = 128;
const CTRL_BYTES: usize = 4 * LINE;
pub(super) const REASON_MAX: usize = 2 * LINE - 16;
/// A step's slot (see `steps`) holds the fingerprint (`HEADER_LEN` bytes), then inline data from
/// `INLINE_AT`. The step word and both slots share one 128-byte line.
const _: () = assert!(HEADER_LEN <= INLINE_AT && 8 + 2 * FP_SLOT <= LINE);
pub(super) const RING_CTRL: usize = 2 * LINE;

/// Sizes that fix the segment layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Layout {
    pub(super) n: usize,
    pub(super) ring: usize,
    pub(super) buffer: usize,
}

fn round64(x: usize) -> usize {
    x.max(4096).div_ceil(64) * 64
}

impl Layout {
    pub(super) fn new(n: usize, opts: &ShmOptions) -> Layout {
        Layout {
            n,
            ring: round64(opts.ring_for(n)),
            buffer: round64(opts.buffer_bytes),
        }
    }
    pub(super) fn ctrl(&self, r: usize) -> usize {
        HEADER_BYTES + r * CTRL_BYTES
    }
    pub(super) fn rings(&self) -> usize {
        self.ctrl(self.n)
    }
    pub(super) fn ring(&self, src: usize, dst: usize) -> usize {
        let idx = src * (self.n - 1) + if dst < src { dst } else { dst - 1 };
        self.rings() + idx * (RING_CTRL + self.ring)
    }
    pub(super) fn buffers(&self) -> usize {
        (self.rings() + self.n * (self.n - 1) * (RING_CTRL + self.ring)).div_ceil(4096) * 4096
    }
    pub(super) fn buffer(&self, r: usize, parity: usize) -> usize {
        self.buffers() + (2 * r + parity) * self.buffer
    }
    pub(super) fn total(&self) -> usize {
        self.buffer(self.n, 0)
    }
}
