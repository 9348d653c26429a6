//! [`Mailbox`]: the incoming messages of one rank, matched to receives by (source, tag), with
//! waiting, deadlines, failure, and receives from any of several sources in arrival order.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::call::{Call, Header, Tag};
use crate::error::{LinkFailure, RecvError};
use crate::transport::Message;

#[derive(Debug, Default)]
struct MailboxState {
    /// Queued messages with their arrival numbers (for [`Mailbox::recv_any`]).
    queues: HashMap<(usize, Tag), VecDeque<(u64, Message)>>,
    arrivals: u64,
    failure: Option<LinkFailure>,
    closed: Vec<bool>,
    /// The fingerprints of the collectives this rank is in or has recently been in, by tag (see
    /// [`Mailbox::expect`]), and their tags, oldest first.
    expected: HashMap<Tag, Call>,
    expected_order: VecDeque<Tag>,
    /// Messages queued, plus one for each peer closed (shared with [`Mailbox::stirred`]).
    stirred: Arc<AtomicUsize>,
    /// Threads waiting on the condition variable: a change with none waiting wakes nobody (a
    /// condition variable's notify is a system call every time).
    waiters: usize,
}

/// How many finished collectives a mailbox remembers, to catch mismatched messages that arrive late.
const REMEMBERED_CALLS: usize = 256;

impl MailboxState {
    /// Fails the mailbox if `msg` belongs to a collective this rank is in but was sent by a
    /// different call.
    fn screen(&mut self, src: usize, header: &Header) -> bool {
        match self.expected.get(&header.tag) {
            Some(call) if *call != header.call => {
                if self.failure.is_none() {
                    self.failure = Some(LinkFailure::Mismatch {
                        peer: src,
                        local: *call,
                        remote: header.call,
                        tag: header.tag,
                    });
                }
                true
            }
            _ => false,
        }
    }
}

/// Incoming messages of one rank, keyed by (source, tag), with waiting, deadlines and failure.
///
/// Transports deliver into it from wherever bytes arrive (a reader thread, another thread's `send`)
/// and implement `recv`/`try_recv` with it.
#[derive(Debug)]
pub struct Mailbox {
    state: Mutex<MailboxState>,
    cond: Condvar,
    /// Set once a failure is recorded: lets [`Mailbox::failure`] answer the common case unlocked.
    failed: AtomicBool,
    /// Messages queued plus peers closed, changed under the lock: zero (and no failure) lets
    /// [`Mailbox::try_recv`] and [`Mailbox::queued`] answer "nothing" unlocked — what a receive
    /// polling its transport asks on every turn.
    stirred: Arc<AtomicUsize>,
}

impl Mailbox {
    /// An empty mailbox for a world of `size` ranks.
    pub fn new(size: usize) -> Self {
        let stirred = Arc::new(AtomicUsize::new(0));
        Mailbox {
            state: Mutex::new(MailboxState {
                closed: vec![false; size],
                expected: HashMap::new(),
                expected_order: VecDeque::new(),
                stirred: stirred.clone(),
                ..MailboxState::default()
            }),
            cond: Condvar::new(),
            failed: AtomicBool::new(false),
            stirred,
        }
    }

    /// Waits on the condition variable (up to `timeout`), counted as a waiter meanwhile.
    fn sleep<'a>(
        &'a self,
        mut s: MutexGuard<'a, MailboxState>,
        timeout: Option<std::time::Duration>,
    ) -> MutexGuard<'a, MailboxState> {
        s.waiters += 1;
        let mut s = match timeout {
            None => self.cond.wait(s).unwrap_or_else(|p| p.into_inner()),
            Some(t) => {
                self.cond
                    .wait_timeout(s, t)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            }
        };
        s.waiters -= 1;
        s
    }

    /// Releases the lock after a change, waking the threads waiting for one (if any).
    fn changed(&self, s: MutexGuard<'_, MailboxState>) {
        let waiting = s.waiters > 0;
        drop(s);
        if waiting {
            self.cond.notify_all();
        }
    }

    /// Nothing queued, no peer closed, no failure: every receive would find nothing now.
    fn quiet(&self) -> bool {
        self.stirred.load(Ordering::Acquire) == 0 && !self.failed.load(Ordering::Acquire)
    }

    fn lock(&self) -> MutexGuard<'_, MailboxState> {
        // A panic while holding this lock cannot leave the queues inconsistent (every critical section
        // is a single insert or remove), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a message from `src`.
    pub fn deliver(&self, src: usize, msg: Message) {
        let mut s = self.lock();
        if s.screen(src, &msg.header) {
            self.failed.store(true, Ordering::Release);
        }
        s.arrivals += 1;
        let n = s.arrivals;
        s.queues
            .entry((src, msg.header.tag))
            .or_default()
            .push_back((n, msg));
        s.stirred.fetch_add(1, Ordering::Release);
        self.changed(s);
    }

    /// Screens a message from `src` whose payload a transport wrote straight into a posted buffer
    /// (it never enters the queues): a different call under an expected tag fails the mailbox, as
    /// [`Mailbox::deliver`] would.
    pub fn screen(&self, src: usize, header: &Header) {
        let mut s = self.lock();
        if s.screen(src, header) {
            self.failed.store(true, Ordering::Release);
            self.changed(s);
        }
    }

    /// How many messages from `src` with `tag` are queued.
    pub fn queued(&self, src: usize, tag: &Tag) -> usize {
        if self.stirred.load(Ordering::Acquire) == 0 {
            return 0;
        }
        self.lock().queues.get(&(src, *tag)).map_or(0, |q| q.len())
    }

    /// Notes that this rank is now in the collective of `header`: a message with its tag from a
    /// different call (already queued, arriving during the call or after it) fails the mailbox with
    /// [`LinkFailure::Mismatch`] at once, even when this rank is waiting on another peer — so ranks in
    /// different collectives fail even when the mismatched messages are not the ones being waited for.
    /// The fingerprints of the last 256 collectives are remembered, so a mismatched message that
    /// arrives after this rank has finished the call still fails the mailbox.
    pub fn expect(&self, header: &Header) {
        let mut s = self.lock();
        // A message of this collective already queued from a different call (no allocation: this
        // runs on every collective).
        let early = s
            .queues
            .iter()
            .filter(|((_, tag), _)| *tag == header.tag)
            .flat_map(|((src, _), q)| q.iter().map(move |(_, m)| (*src, m.header)))
            .find(|(_, h)| h.call != header.call);
        if s.expected.insert(header.tag, header.call).is_none() {
            s.expected_order.push_back(header.tag);
            while s.expected_order.len() > REMEMBERED_CALLS {
                if let Some(old) = s.expected_order.pop_front() {
                    s.expected.remove(&old);
                }
            }
        }
        if early.is_some_and(|(src, h)| s.screen(src, &h)) {
            self.failed.store(true, Ordering::Release);
            self.changed(s);
        }
    }

    /// Marks `peer` as cleanly closed: its queued messages can still be received, then receives from it
    /// fail with [`LinkFailure::PeerClosed`].
    pub fn close_peer(&self, peer: usize) {
        let mut s = self.lock();
        if s.closed.get(peer) == Some(&false) {
            s.closed[peer] = true;
            s.stirred.fetch_add(1, Ordering::Release);
        }
        self.changed(s);
    }

    /// Whether `peer` has closed cleanly (its messages still queued can be received).
    pub fn is_closed(&self, peer: usize) -> bool {
        self.stirred.load(Ordering::Acquire) > 0
            && self.lock().closed.get(peer).copied().unwrap_or(false)
    }

    /// Fails the mailbox; the first failure sticks and wakes every waiter.
    pub fn fail(&self, failure: LinkFailure) {
        let mut s = self.lock();
        if s.failure.is_none() {
            s.failure = Some(failure);
        }
        self.failed.store(true, Ordering::Release);
        self.changed(s);
    }

    /// The failure, if any.
    pub fn failure(&self) -> Option<LinkFailure> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.lock().failure.clone()
    }

    /// Waits up to `timeout` for a failure to be recorded and returns it. A transport whose send to a
    /// peer fails uses this to give the peer's reader a moment to deliver the reason (an abort frame
    /// that says why the peer went away) before falling back to a bare "connection lost".
    pub fn wait_failure(&self, timeout: std::time::Duration) -> Option<LinkFailure> {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        loop {
            if let Some(f) = &s.failure {
                return Some(f.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            s = self.sleep(s, Some(deadline - now));
        }
    }

    /// The queue whose first message matches a receive from one of `srcs` for `tag` (a pattern
    /// when [`Tag::is_wildcard`]) and arrived first: its key.
    fn first(s: &MailboxState, srcs: &[usize], tag: &Tag) -> Option<(usize, Tag)> {
        if tag.is_wildcard() {
            return s
                .queues
                .iter()
                .filter(|((src, t), _)| t.matches(tag) && srcs.contains(src))
                .filter_map(|(key, q)| q.front().map(|(n, _)| (*n, *key)))
                .min_by_key(|(n, _)| *n)
                .map(|(_, key)| key);
        }
        srcs.iter()
            .filter_map(|&src| {
                let q = s.queues.get(&(src, *tag))?;
                q.front().map(|(n, _)| (*n, src))
            })
            .min()
            .map(|(_, src)| (src, *tag))
    }

    /// A message that arrived before a failure is still delivered (messages and failures keep the
    /// order the peer sent them in); after that, the failure.
    fn take(s: &mut MailboxState, src: usize, tag: &Tag) -> Result<Option<Message>, LinkFailure> {
        if tag.is_wildcard() {
            return Mailbox::take_any(s, &[src], tag).map(|m| m.map(|(_, m)| m));
        }
        Mailbox::take_key(s, src, *tag)
    }

    fn take_key(
        s: &mut MailboxState,
        src: usize,
        tag: Tag,
    ) -> Result<Option<Message>, LinkFailure> {
        let key = (src, tag);
        if let Some(q) = s.queues.get_mut(&key) {
            if let Some((_, m)) = q.pop_front() {
                if q.is_empty() {
                    s.queues.remove(&key);
                }
                s.stirred.fetch_sub(1, Ordering::Release);
                return Ok(Some(m));
            }
        }
        if let Some(f) = &s.failure {
            return Err(f.clone());
        }
        if s.closed.get(src).copied().unwrap_or(false) {
            return Err(LinkFailure::PeerClosed { peer: src });
        }
        Ok(None)
    }

    /// The message matching `tag` (see [`Tag::matches`]) from any of `srcs` that arrived first,
    /// with its sender; else the mailbox's failure; else, once every one of `srcs` has closed, [`LinkFailure::PeerClosed`].
    fn take_any(
        s: &mut MailboxState,
        srcs: &[usize],
        tag: &Tag,
    ) -> Result<Option<(usize, Message)>, LinkFailure> {
        if let Some((src, key)) = Mailbox::first(s, srcs, tag) {
            return Mailbox::take_key(s, src, key).map(|m| m.map(|m| (src, m)));
        }
        if let Some(f) = &s.failure {
            return Err(f.clone());
        }
        let closed = |p: &usize| s.closed.get(*p).copied().unwrap_or(false);
        match srcs.first() {
            Some(&peer) if srcs.iter().all(closed) => Err(LinkFailure::PeerClosed { peer }),
            _ => Ok(None),
        }
    }

    /// Returns the message with `tag` from any of `srcs` that arrived first, if there is one (see
    /// [`Transport::recv_any`](crate::Transport::recv_any)).
    pub fn try_recv_any(
        &self,
        srcs: &[usize],
        tag: &Tag,
    ) -> Result<Option<(usize, Message)>, LinkFailure> {
        Mailbox::take_any(&mut self.lock(), srcs, tag)
    }

    /// Waits until `deadline` for a message with `tag` from any of `srcs` (see
    /// [`Transport::recv_any`](crate::Transport::recv_any)).
    pub fn recv_any(
        &self,
        srcs: &[usize],
        tag: &Tag,
        deadline: Option<Instant>,
    ) -> Result<(usize, Message), RecvError> {
        self.wait(deadline, |s| Mailbox::take_any(s, srcs, tag))
    }

    /// Waits until `take` finds something (or fails), at most until `deadline`.
    fn wait<R>(
        &self,
        deadline: Option<Instant>,
        mut take: impl FnMut(&mut MailboxState) -> Result<Option<R>, LinkFailure>,
    ) -> Result<R, RecvError> {
        let mut s = self.lock();
        loop {
            if let Some(r) = take(&mut s).map_err(RecvError::Link)? {
                return Ok(r);
            }
            let timeout = match deadline {
                None => None,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(RecvError::Timeout);
                    }
                    Some(d - now)
                }
            };
            s = self.sleep(s, timeout);
        }
    }

    /// Returns the next message from `src` with `tag` if there is one.
    pub fn try_recv(&self, src: usize, tag: &Tag) -> Result<Option<Message>, LinkFailure> {
        if self.quiet() {
            return Ok(None);
        }
        Mailbox::take(&mut self.lock(), src, tag)
    }

    /// Waits for the next message from `src` with `tag` until `deadline`.
    pub fn recv(
        &self,
        src: usize,
        tag: &Tag,
        deadline: Option<Instant>,
    ) -> Result<Message, RecvError> {
        self.wait(deadline, |s| Mailbox::take(s, src, tag))
    }
}

#[cfg(test)]
mod tests;
