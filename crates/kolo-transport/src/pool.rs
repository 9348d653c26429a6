//! Idle payload buffers for messages that go through a mailbox (TCP's readers, shared memory's
//! drains), reused so that steady traffic allocates nothing: a fresh buffer per large message
//! costs page faults, and returning it to the system costs more.

use std::sync::Mutex;

/// Payloads shorter than this are read into fresh buffers; longer ones reuse pooled ones.
const POOLED_MIN: usize = 64 * 1024;
/// Most bytes of idle payload buffers a transport keeps for reuse.
const POOL_BYTES: usize = 64 << 20;

/// Idle payload buffers, reused by the reader threads so that steady traffic allocates nothing (a
/// fresh buffer per message costs page faults, and returning it to the system costs more).
#[derive(Debug, Default)]
pub(crate) struct Pool {
    bufs: Mutex<(Vec<Vec<u8>>, usize)>,
}

impl Pool {
    /// A buffer for a payload of `len` bytes (its contents are overwritten by the read).
    pub(crate) fn take(&self, len: usize) -> Vec<u8> {
        if len < POOLED_MIN {
            return Vec::new();
        }
        let mut g = self.bufs.lock().unwrap_or_else(|p| p.into_inner());
        match g.0.pop() {
            Some(b) => {
                g.1 -= b.capacity();
                b
            }
            None => Vec::new(),
        }
    }

    /// Keeps `buf` for reuse, up to the pool's limit.
    pub(crate) fn put(&self, buf: Vec<u8>) {
        let cap = buf.capacity();
        if cap < POOLED_MIN {
            return;
        }
        let mut g = self.bufs.lock().unwrap_or_else(|p| p.into_inner());
        if g.1 + cap <= POOL_BYTES {
            g.1 += cap;
            g.0.push(buf);
        }
    }
}
