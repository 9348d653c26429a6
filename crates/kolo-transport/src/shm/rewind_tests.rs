//! Small messages back and forth go on at the ring's start (see `ring`): the stream skips to the
//! next lap and both sides agree where the next message is, whether it is read into the mailbox or
//! straight into a posted buffer, streamed while the ring fills, or ending right at a lap's end.

use std::time::{Duration, Instant};

use kolo_core::Transport;

use super::ring::{next_message, REWIND_EVERY};
use super::tests::{bytes, header, pair, posted_once};
use super::{lock, ShmTransport};
use crate::shm::prefix::PREFIX_COMPACT;

const RING: usize = 16 << 10;

fn soon() -> Option<Instant> {
    Some(Instant::now() + Duration::from_secs(20))
}

/// Payload lengths from 0 to 1,100 bytes (a few too long to rewind), varied so that messages end
/// everywhere in a lap.
fn sizes(count: usize) -> impl Iterator<Item = usize> {
    (0..count).map(|i| (i * 389 + i / 7) % 1100)
}

/// The ring bytes that messages of these lengths (with [`header`]'s compact prefix) take without
/// rewinding.
fn stream_bytes(lens: impl Iterator<Item = usize>) -> u64 {
    lens.map(|l| next_message((PREFIX_COMPACT + l) as u64))
        .sum()
}

/// The producer's position towards `peer`.
fn position(t: &ShmTransport, peer: usize) -> u64 {
    lock(&t.producers[peer]).tail
}

/// How a message is received.
#[derive(Clone, Copy, PartialEq)]
enum Via {
    Mailbox,
    /// A posted receive, which finds the message in the mailbox or reads it straight.
    Posted,
    /// A posted receive that must read it straight from the ring.
    Straight,
}

/// Receives the next message from `peer` with `tag` of `len` bytes.
fn receive(t: &ShmTransport, peer: usize, tag: u64, len: usize, via: Via) -> Vec<u8> {
    if via == Via::Mailbox {
        return t
            .recv(peer, &header(tag).tag, soon())
            .expect("the message arrives")
            .payload;
    }
    let (buf, direct) = posted_once(t, peer, tag, len);
    assert!(
        direct || len == 0 || via == Via::Posted,
        "a message of {len} bytes read straight"
    );
    buf
}

fn ping_pong(via: Via) {
    let (a, b) = pair(RING);
    let count = 400;
    let echo = std::thread::spawn(move || {
        for (i, len) in sizes(count).enumerate() {
            let m = receive(&b, 0, 1, len, via);
            assert_eq!(
                m,
                bytes(len, i as u64),
                "message {i} ({len} bytes) at rank 1"
            );
            b.send(0, &header(2), &m).expect("echo");
        }
        position(&b, 0)
    });
    for (i, len) in sizes(count).enumerate() {
        a.send(1, &header(1), &bytes(len, i as u64)).expect("send");
        let back = receive(&a, 1, 2, len, via);
        assert_eq!(
            back,
            bytes(len, i as u64),
            "echo {i} ({len} bytes) at rank 0"
        );
    }
    let echoed = echo.join().expect("no panic");
    // Each side found the ring empty at every look, and skipped to the next lap: its stream is
    // longer than its messages (about 4 KiB apart, a lap's rest each time).
    let sent = stream_bytes(sizes(count));
    for (rank, at) in [(0, position(&a, 1)), (1, echoed)] {
        let laps = at / RING as u64;
        assert!(
            at > sent + 10 * REWIND_EVERY
                && laps as usize > sent as usize / REWIND_EVERY as usize / 2,
            "rank {rank}: position {at} after {sent} bytes of messages ({laps} laps)"
        );
    }
}

#[test]
fn ping_pong_through_the_mailbox_rewinds_and_keeps_every_byte() {
    ping_pong(Via::Mailbox);
}

#[test]
fn ping_pong_into_posted_buffers_rewinds_and_keeps_every_byte() {
    ping_pong(Via::Straight);
}

#[test]
fn a_stream_that_fills_the_ring_keeps_every_byte() {
    let (a, b) = pair(RING);
    let count = 2000;
    // The receiver takes its time: the sender finds the ring full, or at least not empty.
    let reader = std::thread::spawn(move || {
        for (i, len) in sizes(count).enumerate() {
            if i % 100 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
            let m = receive(&b, 0, 1, len, [Via::Mailbox, Via::Posted][i % 2]);
            assert_eq!(m, bytes(len, i as u64), "message {i} ({len} bytes)");
        }
    });
    for (i, len) in sizes(count).enumerate() {
        a.send(1, &header(1), &bytes(len, i as u64)).expect("send");
    }
    reader.join().expect("no panic");
    // Whatever rewinds the pauses allowed, the stream never went past what the ring holds.
    assert!(position(&a, 1) >= stream_bytes(sizes(count)));
}

#[test]
fn a_prefix_both_in_place_and_rewinding_is_refused() {
    use crate::shm::prefix::{decode_prefix, encode_in_place_prefix, encode_rewind_prefix};
    for h in [header(3), header(1 << 40)] {
        let rewind = encode_rewind_prefix(&h, 10);
        let p = decode_prefix(&rewind.to_vec(), 1 << 20)
            .expect("whole")
            .expect("a rewinding prefix");
        assert!(p.rewind && !p.in_place && p.len == 10);
        let mut both = encode_in_place_prefix(&h, 10).to_vec();
        both[7] |= rewind.bytes()[7];
        let e = decode_prefix(&both, 1 << 20)
            .expect("whole")
            .expect_err("in place and rewinding");
        assert!(e.contains("rewind"), "{e}");
    }
}
