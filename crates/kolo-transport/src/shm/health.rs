//! Peer liveness and failures: each rank's state line (alive, closed, aborted, lost and why), the
//! pidfd watches, and the heartbeat that tells a stopped or hung process from a slow one.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::io_err;
use kolo_core::{Error, LinkFailure};

use super::layout::{LINE, REASON_MAX};
use super::{lock, ShmTransport};

pub(super) const STATE_ALIVE: u32 = 0;
pub(super) const STATE_CLOSED: u32 = 1;
pub(super) const STATE_ABORTED: u32 = 2;
pub(super) const STATE_LOST: u32 = 3;

impl ShmTransport {
    /// Records `peer`'s state change (abort, loss, exit) in the mailbox; returns whether it failed.
    pub(super) fn check_peer(&self, peer: usize) -> bool {
        match self.state_word(peer, 0).load(Ordering::Acquire) {
            STATE_ABORTED | STATE_LOST => {
                let reason = self.reason(peer);
                let failure = if self.state_word(peer, 0).load(Ordering::Acquire) == STATE_LOST {
                    LinkFailure::PeerLost { peer, reason }
                } else {
                    LinkFailure::Aborted { by: peer, reason }
                };
                self.mailbox.fail(failure);
                true
            }
            STATE_CLOSED => false,
            _ => match &self.watches[peer] {
                Some(w) if w.exited() => {
                    // Re-check: a clean close just before exit is not a loss.
                    if self.state_word(peer, 0).load(Ordering::Acquire) == STATE_ALIVE {
                        self.mailbox.fail(LinkFailure::PeerLost {
                            peer,
                            reason: format!(
                                "its process (pid {}) exited without closing the connection",
                                self.state_word(peer, 1).load(Ordering::Relaxed)
                            ),
                        });
                        return true;
                    }
                    false
                }
                Some(_) => self.check_heartbeat(peer),
                None => false,
            },
        }
    }

    /// Fails the mailbox when `peer`'s heartbeat (bumped twice a second by a thread of its process)
    /// has not moved for the heartbeat timeout: the process is stopped or hung.
    pub(super) fn check_heartbeat(&self, peer: usize) -> bool {
        let Some(timeout) = self.opts.heartbeat_timeout else {
            return false;
        };
        let beat = self.state_word(peer, 3).load(Ordering::Relaxed);
        let mut seen = lock(&self.beats);
        let (last, since) = &mut seen[peer];
        if *last != beat {
            *last = beat;
            *since = Instant::now();
            return false;
        }
        if since.elapsed() < timeout {
            return false;
        }
        drop(seen);
        self.mailbox.fail(LinkFailure::PeerLost {
            peer,
            reason: format!(
                "no heartbeat from its process (pid {}) for {:.0} s: it is stopped or hung",
                self.state_word(peer, 1).load(Ordering::Relaxed),
                timeout.as_secs_f64()
            ),
        });
        true
    }

    /// Bumps this rank's heartbeat word twice a second until the transport is dropped.
    pub(super) fn start_heartbeat(&self) -> Result<(), Error> {
        let seg = self.seg.clone();
        let off = self.layout.ctrl(self.rank) + LINE + 12;
        let stop = self.beat_stop.clone();
        std::thread::Builder::new()
            .name(format!("kolo-shm-beat-{}", self.rank))
            .spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    // SAFETY: a 4-aligned word of the rank's own state line, inside the mapping that
                    // `seg` keeps alive; only accessed atomically.
                    let word = unsafe { &*(seg.ptr().add(off) as *const AtomicU32) };
                    word.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(500));
                }
            })
            .map(|_| ())
            .map_err(io_err(format!(
                "rank {}: spawn heartbeat thread",
                self.rank
            )))
    }

    pub(super) fn reason(&self, peer: usize) -> String {
        let len = (self.state_word(peer, 2).load(Ordering::Acquire) as usize).min(REASON_MAX);
        let mut b = vec![0u8; len];
        // SAFETY: the reason bytes were written before the state word (release) we read above.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.at(self.layout.ctrl(peer) + LINE + 16),
                b.as_mut_ptr(),
                len,
            )
        };
        String::from_utf8_lossy(&b).into_owned()
    }

    pub(super) fn set_state(&self, state: u32, reason: &str) {
        let me = self.rank;
        if self
            .state_word(me, 0)
            .compare_exchange(STATE_ALIVE, state, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let mut b = reason.as_bytes();
        if b.len() > REASON_MAX {
            b = &b[..REASON_MAX];
        }
        // SAFETY: the owner writes its reason area once, then publishes its length (release).
        unsafe {
            std::ptr::copy_nonoverlapping(
                b.as_ptr(),
                self.at(self.layout.ctrl(me) + LINE + 16),
                b.len(),
            )
        };
        self.state_word(me, 2)
            .store(b.len() as u32, Ordering::Release);
        for peer in 0..self.layout.n {
            if peer != me {
                self.bell(peer).ring_always();
            }
        }
    }

    /// Checks every peer and this endpoint; the failure, if any.
    pub(super) fn health(&self) -> Option<LinkFailure> {
        for peer in 0..self.layout.n {
            if peer != self.rank {
                self.check_peer(peer);
            }
        }
        self.mailbox.failure()
    }

    pub(super) fn fail_protocol(&self, peer: usize, reason: String) {
        self.mailbox.fail(LinkFailure::Protocol { peer, reason });
    }
}
