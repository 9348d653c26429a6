//! Liveness: when each peer was last heard from, the heartbeat sender and the watchdog that fails a
//! silent peer.

use std::io::Read;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, TryLockError};
use std::thread;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use crate::io_err;
use kolo_core::{Error, LinkFailure, Mailbox};

use super::frame::{self, Kind};
use super::{control_header, Link};

/// When each peer was last heard from, shared by the reader threads and the heartbeat threads.
#[derive(Debug)]
pub(super) struct Liveness {
    pub(super) epoch: Instant,
    /// Milliseconds since `epoch` when bytes last came from each peer.
    pub(super) last_seen: Vec<AtomicU64>,
    /// Peers that closed cleanly (or were declared lost): no heartbeat expected.
    pub(super) quiet: Vec<AtomicBool>,
    pub(super) stop: AtomicBool,
}

impl Liveness {
    pub(super) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
    pub(super) fn touch(&self, peer: usize) {
        self.last_seen[peer].store(self.now_ms(), Ordering::Relaxed);
    }
}

/// A reader that notes every arrival of bytes (so a long frame keeps its sender alive, too).
pub(super) struct Touch {
    pub(super) inner: TcpStream,
    pub(super) live: Arc<Liveness>,
    pub(super) peer: usize,
}

impl Read for Touch {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n > 0 {
            self.live.touch(self.peer);
        }
        Ok(n)
    }
}

/// How often an idle link carries a heartbeat frame.
pub(super) const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// Starts the two heartbeat threads of a transport: one sends a heartbeat on every idle link each
/// second, the other fails the mailbox (naming the peer) when a peer has been silent for `timeout`.
/// Two threads, so that a heartbeat stuck behind a full socket cannot stop the check.
pub(super) fn start_heartbeats(
    rank: usize,
    links: &Arc<Vec<Option<Link>>>,
    live: &Arc<Liveness>,
    mailbox: &Arc<Mailbox>,
    timeout: Duration,
) -> Result<(), Error> {
    let (l, lv) = (links.clone(), live.clone());
    thread::Builder::new()
        .name(format!("kolo-beat-{rank}"))
        .spawn(move || {
            while !lv.stop.load(Ordering::SeqCst) {
                for link in l.iter().flatten() {
                    // A link busy with a send needs no heartbeat, nor can one that is full (a peer
                    // that stopped reading) take one: the others still get theirs.
                    send_control(link, Kind::Heartbeat, &[], Duration::ZERO);
                }
                let mut slept = Duration::ZERO;
                while slept < HEARTBEAT_EVERY && !lv.stop.load(Ordering::SeqCst) {
                    thread::sleep(Duration::from_millis(100));
                    slept += Duration::from_millis(100);
                }
            }
        })
        .map_err(io_err(format!("rank {rank}: spawn heartbeat thread")))?;
    let (l, lv, mb) = (links.clone(), live.clone(), mailbox.clone());
    thread::Builder::new()
        .name(format!("kolo-watch-{rank}"))
        .spawn(move || {
            // Everyone counts as heard from at the start.
            for p in 0..l.len() {
                lv.touch(p);
            }
            let limit = timeout.as_millis() as u64;
            while !lv.stop.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(200));
                let now = lv.now_ms();
                for (peer, link) in l.iter().enumerate() {
                    let Some(link) = link else { continue };
                    if lv.quiet[peer].load(Ordering::SeqCst) {
                        continue;
                    }
                    let seen = lv.last_seen[peer].load(Ordering::Relaxed);
                    if now.saturating_sub(seen) > limit {
                        lv.quiet[peer].store(true, Ordering::SeqCst);
                        mb.fail(LinkFailure::PeerLost {
                            peer,
                            reason: format!(
                                "nothing (not even a heartbeat) from it for {:.0} s: its process \
                                 is stopped or hung, or its host is unreachable",
                                timeout.as_secs_f64()
                            ),
                        });
                        let _ = link.ctl.shutdown(Shutdown::Both);
                    }
                }
            }
        })
        .map_err(io_err(format!("rank {rank}: spawn heartbeat thread")))?;
    Ok(())
}

/// Writes a control frame (heartbeat, abort, goodbye) on `link` unless that would wait more than
/// `wait` for the writer's lock (a send in progress) or for room in the socket (a peer that stopped
/// reading: its process stopped, its host cut off, where a blocking write would wait for as long as
/// TCP retries — many minutes). Returns whether the frame was written whole; when it was not,
/// what was written of it (only a long abort reason can be cut) leaves the stream unusable, and the
/// caller closes the link.
pub(super) fn send_control(link: &Link, kind: Kind, payload: &[u8], wait: Duration) -> bool {
    let until = Instant::now() + wait;
    let mut w = loop {
        match link.writer.try_lock() {
            Ok(w) => break w,
            Err(TryLockError::Poisoned(p)) => break p.into_inner(),
            Err(TryLockError::WouldBlock) if Instant::now() < until => {
                thread::sleep(Duration::from_millis(1))
            }
            Err(TryLockError::WouldBlock) => return false,
        }
    };
    // Writable means a good part of the send buffer is free: far more than a frame's prefix.
    let left = until.saturating_duration_since(Instant::now());
    let ts = Timespec {
        tv_sec: left.as_secs() as i64,
        tv_nsec: i64::from(left.subsec_nanos()),
    };
    let mut fds = [PollFd::new(&*w, PollFlags::OUT)];
    if !matches!(poll(&mut fds, Some(&ts)), Ok(n) if n > 0) {
        return false;
    }
    // The lock keeps data sends out while the timeout is set: only this frame is bounded by it.
    let bound = left.max(Duration::from_millis(100));
    let _ = w.set_write_timeout(Some(bound));
    let written = frame::write_frame(&mut *w, kind, &control_header(), payload).is_ok();
    let _ = w.set_write_timeout(None);
    written
}
