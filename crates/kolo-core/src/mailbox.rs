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
        drop(s);
        self.cond.notify_all();
    }

    /// Screens a message from `src` whose payload a transport wrote straight into a posted buffer
    /// (it never enters the queues): a different call under an expected tag fails the mailbox, as
    /// [`Mailbox::deliver`] would.
    pub fn screen(&self, src: usize, header: &Header) {
        let failed = self.lock().screen(src, header);
        if failed {
            self.failed.store(true, Ordering::Release);
            self.cond.notify_all();
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
        let failed = early.is_some_and(|(src, h)| s.screen(src, &h));
        drop(s);
        if failed {
            self.failed.store(true, Ordering::Release);
            self.cond.notify_all();
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
        drop(s);
        self.cond.notify_all();
    }

    /// Fails the mailbox; the first failure sticks and wakes every waiter.
    pub fn fail(&self, failure: LinkFailure) {
        let mut s = self.lock();
        if s.failure.is_none() {
            s.failure = Some(failure);
        }
        self.failed.store(true, Ordering::Release);
        drop(s);
        self.cond.notify_all();
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
            s = self
                .cond
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
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
            s = match deadline {
                None => self.cond.wait(s).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(RecvError::Timeout);
                    }
                    self.cond
                        .wait_timeout(s, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
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
mod tests {
    use super::*;
    use crate::call::{Algorithm, Call, OpKind, TagSpace};
    use std::sync::Arc;
    use std::time::Duration;

    fn header(value: u64) -> Header {
        Header {
            ack: false,
            tag: Tag {
                group: 1,
                space: TagSpace::P2p,
                value,
            },
            call: Call::new(OpKind::Send, Algorithm::Direct),
        }
    }

    #[test]
    fn an_empty_mailbox_answers_unlocked_but_never_hides_a_message_a_close_or_a_failure() {
        let mb = Mailbox::new(3);
        let h = header(5);
        let msg = |b: u8| Message {
            header: h,
            payload: vec![b],
        };
        assert!(matches!(mb.try_recv(1, &h.tag), Ok(None)));
        assert_eq!(mb.queued(1, &h.tag), 0);
        mb.deliver(1, msg(7));
        mb.deliver(1, msg(8));
        assert_eq!(mb.queued(1, &h.tag), 2);
        assert!(matches!(mb.try_recv(1, &h.tag), Ok(Some(m)) if m.payload == [7]));
        assert!(matches!(mb.try_recv(1, &h.tag), Ok(Some(m)) if m.payload == [8]));
        assert_eq!(mb.queued(1, &h.tag), 0);
        assert!(matches!(mb.try_recv(1, &h.tag), Ok(None)));
        // A close with nothing queued, twice: receives from that peer fail, others find nothing.
        mb.close_peer(2);
        mb.close_peer(2);
        assert!(matches!(
            mb.try_recv(2, &h.tag),
            Err(LinkFailure::PeerClosed { peer: 2 })
        ));
        assert!(matches!(mb.try_recv(1, &h.tag), Ok(None)));
        let failed = Mailbox::new(2);
        failed.fail(LinkFailure::LocalClosed {
            reason: "stop".into(),
        });
        assert!(failed.try_recv(1, &h.tag).is_err());
    }

    #[test]
    fn fifo_per_source_and_tag() {
        let mb = Mailbox::new(2);
        for (i, t) in [(1u8, 7), (2, 8), (3, 7)] {
            mb.deliver(
                1,
                Message {
                    header: header(t),
                    payload: vec![i],
                },
            );
        }
        let tag7 = header(7).tag;
        assert_eq!(mb.recv(1, &tag7, None).map(|m| m.payload), Ok(vec![1]));
        assert_eq!(mb.recv(1, &tag7, None).map(|m| m.payload), Ok(vec![3]));
        assert!(matches!(mb.try_recv(0, &tag7), Ok(None)));
        assert_eq!(
            mb.recv(1, &header(8).tag, None).map(|m| m.payload),
            Ok(vec![2])
        );
    }

    #[test]
    fn deadline_and_failure_wake_waiters() {
        let mb = Arc::new(Mailbox::new(2));
        let t = Instant::now();
        let r = mb.recv(1, &header(1).tag, Some(t + Duration::from_millis(50)));
        assert!(matches!(r, Err(RecvError::Timeout)));
        assert!(t.elapsed() >= Duration::from_millis(50));

        let mb2 = mb.clone();
        let h = std::thread::spawn(move || mb2.recv(1, &header(1).tag, None));
        std::thread::sleep(Duration::from_millis(20));
        mb.fail(LinkFailure::PeerLost {
            peer: 1,
            reason: "eof".into(),
        });
        let r = h.join().map_err(|_| "panicked");
        assert!(matches!(
            r,
            Ok(Err(RecvError::Link(LinkFailure::PeerLost { peer: 1, .. })))
        ));
    }

    #[test]
    fn closed_peer_drains_then_fails() {
        let mb = Mailbox::new(2);
        mb.deliver(
            1,
            Message {
                header: header(1),
                payload: vec![9],
            },
        );
        mb.close_peer(1);
        assert!(mb.recv(1, &header(1).tag, None).is_ok());
        assert!(matches!(
            mb.recv(1, &header(1).tag, None),
            Err(RecvError::Link(LinkFailure::PeerClosed { peer: 1 }))
        ));
    }

    #[test]
    fn any_tag_takes_the_first_to_arrive_of_its_group_and_space() {
        let mb = Mailbox::new(3);
        let any = Tag {
            value: Tag::ANY_VALUE,
            ..header(0).tag
        };
        // A collective's message and another group's never match a point-to-point wildcard.
        let mut other_group = msg(4, 90);
        other_group.header.tag.group = 2;
        mb.deliver(1, other_group);
        let mut collective = msg(4, 91);
        collective.header.tag.space = TagSpace::Collective;
        mb.deliver(1, collective);
        mb.deliver(1, msg(5, 1));
        mb.deliver(2, msg(4, 2));
        mb.deliver(1, msg(3, 3));
        mb.deliver(1, msg(5, 4));
        let from = |src: usize| mb.try_recv(src, &any).map(|m| m.map(|m| m.payload[0]));
        assert_eq!(from(1), Ok(Some(1)));
        assert_eq!(from(1), Ok(Some(3)));
        // From any source: rank 2's message came before rank 1's last one.
        let got = mb
            .try_recv_any(&[1, 2], &any)
            .map(|m| m.map(|(s, m)| (s, m.header.tag.value)));
        assert_eq!(got, Ok(Some((2, 4))));
        assert_eq!(
            mb.recv_any(&[1, 2], &any, None)
                .map(|(s, m)| (s, m.payload[0])),
            Ok((1, 4))
        );
        assert_eq!(from(1), Ok(None));
        assert_eq!(
            mb.queued(
                1,
                &Tag {
                    group: 2,
                    ..header(4).tag
                }
            ),
            1
        );
        assert!(header(7).tag.matches(&any));
        assert!(!any.matches(&header(7).tag));
    }

    fn msg(tag: u64, byte: u8) -> Message {
        Message {
            header: header(tag),
            payload: vec![byte],
        }
    }

    #[test]
    fn any_source_takes_the_first_to_arrive() {
        let mb = Mailbox::new(3);
        mb.deliver(2, msg(7, 1));
        mb.deliver(1, msg(8, 2)); // another tag
        mb.deliver(1, msg(7, 3));
        mb.deliver(2, msg(7, 4));
        let tag = header(7).tag;
        let got: Vec<_> = (0..3)
            .map(|_| {
                mb.recv_any(&[0, 1, 2], &tag, None)
                    .map(|(p, m)| (p, m.payload))
            })
            .collect();
        assert_eq!(
            got,
            vec![Ok((2, vec![1])), Ok((1, vec![3])), Ok((2, vec![4]))]
        );
        // Only the sources asked for.
        mb.deliver(2, msg(7, 5));
        assert!(matches!(mb.try_recv_any(&[0, 1], &tag), Ok(None)));
        assert_eq!(
            mb.try_recv_any(&[1, 2], &tag)
                .map(|o| o.map(|(p, m)| (p, m.payload))),
            Ok(Some((2, vec![5])))
        );
        // The untouched tag is still there for a receive from its source.
        assert_eq!(
            mb.recv(1, &header(8).tag, None).map(|m| m.payload),
            Ok(vec![2])
        );
    }

    #[test]
    fn any_source_waits_deadlines_and_fails() {
        let mb = Arc::new(Mailbox::new(3));
        let tag = header(1).tag;
        let t = Instant::now();
        let r = mb.recv_any(&[1, 2], &tag, Some(t + Duration::from_millis(50)));
        assert!(matches!(r, Err(RecvError::Timeout)));
        assert!(t.elapsed() >= Duration::from_millis(50));

        // A message delivered while waiting wakes the receive.
        let waiter = {
            let mb = mb.clone();
            std::thread::spawn(move || mb.recv_any(&[1, 2], &tag, None).map(|(p, _)| p))
        };
        std::thread::sleep(Duration::from_millis(20));
        mb.deliver(2, msg(1, 0));
        assert!(matches!(waiter.join(), Ok(Ok(2))));

        // A closed source is passed over while another may still send; once all have closed, an
        // error naming one of them.
        mb.close_peer(1);
        assert!(matches!(mb.try_recv_any(&[1, 2], &tag), Ok(None)));
        mb.deliver(2, msg(1, 0));
        assert!(matches!(mb.recv_any(&[1, 2], &tag, None), Ok((2, _))));
        mb.close_peer(2);
        assert!(matches!(
            mb.recv_any(&[1, 2], &tag, None),
            Err(RecvError::Link(LinkFailure::PeerClosed { peer: 1 }))
        ));

        // A failure ends every wait, after the messages that came before it.
        let mb = Mailbox::new(2);
        mb.deliver(1, msg(1, 9));
        mb.fail(LinkFailure::Aborted {
            by: 1,
            reason: "boom".into(),
        });
        assert!(matches!(mb.recv_any(&[0, 1], &tag, None), Ok((1, _))));
        assert!(matches!(
            mb.recv_any(&[0, 1], &tag, None),
            Err(RecvError::Link(LinkFailure::Aborted { by: 1, .. }))
        ));
    }
}
