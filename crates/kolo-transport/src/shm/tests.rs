//! Posted receives over shared memory: straight from the ring, in order with the mailbox, misfits
//! and deadlines.

use std::time::{Duration, Instant};

use kolo_core::{
    Algorithm, Call, Error, Header, OpKind, Received, RecvError, ReduceOp, Reducer, Tag, TagSpace,
    Transport,
};

use super::{shm_world, ShmOptions, ShmTransport};

/// The threshold of sends in place in these tests: 8 KiB, so that their messages of 10 KiB – 3 MiB
/// go in place (the default, [`super::SINGLE_COPY_BYTES`], is 16 MiB).
pub(super) const TEST_SINGLE_COPY_BYTES: usize = 8 << 10;

/// Two ranks of a world with rings of `ring_bytes` and sends in place from
/// [`TEST_SINGLE_COPY_BYTES`].
pub(super) fn pair(ring_bytes: usize) -> (ShmTransport, ShmTransport) {
    let opts = ShmOptions {
        ring_bytes,
        single_copy_bytes: TEST_SINGLE_COPY_BYTES,
        ..ShmOptions::default()
    };
    let mut w = shm_world(2, &opts).expect("a shared-memory world of two threads");
    let b = w.pop().expect("rank 1");
    let a = w.pop().expect("rank 0");
    (a, b)
}

pub(super) fn header(value: u64) -> Header {
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

pub(super) fn error(e: RecvError) -> Error {
    Error::Io {
        context: format!("receive failed: {e:?}"),
        source: std::io::Error::other("recv").into(),
    }
}

/// Receives the next message from `peer` with `tag` into a posted buffer of `len` bytes, waiting
/// up to 20 s: the buffer, and whether the message came straight into it.
pub(super) fn posted_once(t: &ShmTransport, peer: usize, tag: u64, len: usize) -> (Vec<u8>, bool) {
    let mut into = vec![0u8; len];
    let mut direct = false;
    t.recv_posted(
        peer,
        &header(tag).tag,
        &mut into,
        len.max(1),
        None,
        Some(Instant::now() + Duration::from_secs(20)),
        &mut || Ok(()),
        &mut |dst, got| {
            match got {
                Received::Direct(_) => direct = true,
                Received::Message(m) => dst[..m.payload.len()].copy_from_slice(&m.payload),
            }
            Ok(())
        },
        &error,
    )
    .expect("posted receive");
    (into, direct)
}

pub(super) fn bytes(len: usize, salt: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|j| (j * 7 + salt * 13 + j / 251) as u8)
        .collect()
}

/// Posts `into` for messages of `seg` bytes from the peer with `tag`, sending `out` in `seg`-byte
/// messages meanwhile; returns how many arrived straight into `into` and whether it succeeded.
fn post(
    t: &ShmTransport,
    tag: u64,
    out: &[u8],
    into: &mut [u8],
    seg: usize,
    reduce: Option<Reducer>,
    deadline: Duration,
) -> (usize, kolo_core::Result<()>) {
    let peer = 1 - t.rank();
    let h = header(tag);
    let mut direct = 0;
    let r = t.recv_posted(
        peer,
        &h.tag,
        into,
        seg,
        reduce,
        Some(Instant::now() + deadline),
        &mut || {
            for c in out.chunks(seg) {
                t.send(peer, &h, c)
                    .map_err(|f| f.into_error("post", t.rank()))?;
            }
            Ok(())
        },
        &mut |dst, got| {
            match got {
                Received::Direct(_) => direct += 1,
                Received::Message(m) => match reduce {
                    Some(red) => red.apply(dst, &m.payload),
                    None => dst.copy_from_slice(&m.payload),
                },
            }
            Ok(())
        },
        &error,
    );
    (direct, r)
}

/// `rounds` exchanges of four messages each way at once, checking every byte; returns
/// how many messages went straight into the posted buffer.
fn exchanges(t: &ShmTransport, rounds: u64, reduce: Option<Reducer>) -> usize {
    let (seg, len) = (24 << 10, 3 * (24 << 10) + 100);
    let peer = 1 - t.rank() as u64;
    let mut direct = 0;
    for i in 0..rounds {
        let out = bytes(len, i * 2 + t.rank() as u64);
        let mut into = vec![0u8; len];
        let (d, r) = post(
            t,
            i % 3,
            &out,
            &mut into,
            seg,
            reduce,
            Duration::from_secs(20),
        );
        assert!(r.is_ok(), "rank {} exchange {i}: {r:?}", t.rank());
        direct += d;
        assert!(
            into == bytes(len, i * 2 + peer),
            "rank {} exchange {i}: wrong bytes",
            t.rank()
        );
    }
    direct
}

#[test]
fn exchanges_both_ways_are_exact_and_direct() {
    let (a, b) = pair(256 << 10);
    let direct = std::thread::scope(|s| {
        let ha = s.spawn(|| exchanges(&a, 200, None));
        let db = exchanges(&b, 200, None);
        ha.join().unwrap_or(0) + db
    });
    // 2 ranks × 200 exchanges × 4 messages that fit in the ring: read from the ring, not the mailbox
    // (a message drained by a rank's own send while it waits for ring space may still go there).
    assert!(
        direct > 1200,
        "only {direct} of 1600 messages went straight into the buffer"
    );
}

#[test]
fn a_message_longer_than_the_ring_streams_straight_into_the_buffer() {
    let (a, b) = pair(4096);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..8 {
                assert!(a.send(1, &header(7), &bytes(256 << 10, i)).is_ok());
            }
        });
        for i in 0..8 {
            let mut into = vec![0u8; 256 << 10];
            let (direct, r) = post(
                &b,
                7,
                &[],
                &mut into,
                256 << 10,
                None,
                Duration::from_secs(20),
            );
            assert!(r.is_ok(), "message {i}: {r:?}");
            assert!(into == bytes(256 << 10, i), "message {i}: wrong bytes");
            assert_eq!(direct, 1, "message {i} went through the mailbox");
        }
    });
}

#[test]
fn a_posting_with_a_reducer_goes_through_the_mailbox_and_is_exact() {
    let (a, b) = pair(4096);
    let red = Some(Reducer::new(kolo_core::DType::U8, ReduceOp::Sum));
    let direct = std::thread::scope(|s| {
        let ha = s.spawn(|| exchanges(&a, 20, red));
        let db = exchanges(&b, 20, red);
        ha.join().unwrap_or(0) + db
    });
    assert_eq!(direct, 0);
}

#[test]
fn messages_of_other_tags_and_lengths_keep_their_order() {
    let (a, b) = pair(64 << 10);
    // Before the posting: another tag, then the posting's tag with the wrong length, then two of
    // the right length, all drained into the mailbox; then one more, left in the ring. They come
    // out in the order sent (per source and tag), the last straight from the ring.
    let other = bytes(10_000, 1);
    let short = bytes(100, 2);
    let (right, later, last) = (bytes(5000, 3), bytes(5000, 4), bytes(5000, 5));
    for (tag, m) in [(9, &other), (5, &short), (5, &right), (5, &later)] {
        assert!(a.send(1, &header(tag), m).is_ok());
    }
    assert!(matches!(b.try_recv(0, &header(99).tag), Ok(None)));
    assert!(a.send(1, &header(5), &last).is_ok());
    let deadline = Some(Instant::now() + Duration::from_secs(20));
    let mut seen = Vec::new();
    let mut into = vec![0u8; 5000];
    for _ in 0..4 {
        let r = b.recv_posted(
            0,
            &header(5).tag,
            &mut into,
            5000,
            None,
            deadline,
            &mut || Ok(()),
            &mut |dst, got| {
                match got {
                    Received::Direct(_) => seen.push(("direct", dst.to_vec())),
                    Received::Message(m) => seen.push(("mailbox", m.payload)),
                }
                Ok(())
            },
            &error,
        );
        assert!(r.is_ok(), "{r:?}");
    }
    let got: Vec<_> = seen.iter().map(|(_, m)| m.clone()).collect();
    assert!(got == [short, right, later, last.clone()], "out of order");
    assert_eq!(seen[3].0, "direct", "the last one straight from the ring");
    let m = b.recv(0, &header(9).tag, deadline);
    assert!(
        matches!(m, Ok(m) if m.payload == other),
        "the other tag's message is intact"
    );
}

#[test]
fn a_posting_that_times_out_leaves_the_stream_intact() {
    let (a, b) = pair(4096);
    let big = bytes(16 << 20, 5);
    let mut timeouts = 0;
    std::thread::scope(|s| {
        s.spawn(|| {
            for tag in 0..3 {
                assert!(a.send(1, &header(tag), &big).is_ok());
            }
        });
        for tag in 0..3 {
            // A deadline far shorter than the stream: the posting gives up part way through the
            // message, whose remainder must then reach the mailbox whole.
            let mut into = vec![0u8; big.len()];
            let (_, r) = post(
                &b,
                tag,
                &[],
                &mut into,
                big.len(),
                None,
                Duration::from_micros(300),
            );
            match r {
                Ok(()) => assert!(into == big),
                Err(_) => {
                    timeouts += 1;
                    let deadline = Some(Instant::now() + Duration::from_secs(20));
                    let m = b.recv(0, &header(tag).tag, deadline);
                    assert!(
                        matches!(&m, Ok(m) if m.payload == big),
                        "message {tag} damaged"
                    );
                }
            }
        }
    });
    assert!(timeouts > 0, "no posting timed out: the test did not test");
}

#[test]
fn a_posting_with_nothing_coming_times_out() {
    let (_a, b) = pair(4096);
    let mut into = vec![0u8; 64];
    let started = Instant::now();
    let (_, r) = post(&b, 1, &[], &mut into, 64, None, Duration::from_millis(50));
    assert!(r.is_err());
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A peer that posts its last arena step and closes at once: the step is read, not taken for a
/// close (the waiter's check of the close and of the step can straddle both).
#[test]
fn an_arena_step_posted_just_before_a_close_is_read() {
    use kolo_core::Arena;
    for round in 0..1500 {
        let (a, b) = pair(1 << 12);
        let closer = std::thread::spawn(move || {
            let step = b.post(&header(round), &[round as u8]);
            drop(b);
            step
        });
        let mut inline = [0u8; 1];
        let got = a.wait(
            1,
            1,
            Some(Instant::now() + Duration::from_secs(10)),
            &mut inline,
        );
        let step = closer.join().expect("the closing thread");
        assert_eq!(step, 1);
        let h = got.unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        assert_eq!((h.tag.value, inline[0]), (round, round as u8));
    }
}

/// A posting waits for a peer that then aborts, is lost or closes: the posting ends at once with
/// the peer's reason (it used to spin on the peer's changed state without ever reading it).
#[test]
fn a_posting_ends_when_its_peer_aborts_or_closes() {
    for ending in ["abort", "close"] {
        let (a, b) = pair(1 << 12);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut into = vec![0u8; 4096];
            let (_, r) = post(&b, 7, &[], &mut into, 1024, None, Duration::from_secs(60));
            let _ = tx.send(r);
        });
        std::thread::sleep(Duration::from_millis(100));
        match ending {
            "abort" => a.abort("rank 0 gives up"),
            _ => drop(a),
        }
        let r = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{ending}: the posting did not end within 10 s"));
        let e = r.expect_err("a posting whose peer went away");
        let text = format!("{e:?}");
        let named = match ending {
            "abort" => text.contains("rank 0 gives up") && text.contains("Aborted"),
            _ => text.contains("PeerClosed"),
        };
        assert!(named, "{ending}: {text}");
    }
}

#[test]
fn messages_of_every_small_length_and_streamed_ones_start_on_cache_lines_and_arrive_whole() {
    // Every length 0..=130 (prefix and payload inside one line, across two, three), then messages
    // longer than the ring (their padding written after them, maybe after the receiver has read
    // them), mixed; received alternately straight from the ring and through the mailbox, from
    // another thread as they come. Every third message's header takes the prefix's full form (a
    // count over 2^32), the others the compact one. At rest, both positions are multiples of a
    // cache line.
    let (a, b) = pair(4 << 10);
    let lens: Vec<usize> = (0..=130)
        .chain([9000, 0, 5, 12_345, 64, 4096 - 41, 4096 - 24, 9001])
        .collect();
    let sent = lens.clone();
    let sender = std::thread::spawn(move || {
        let mut full = header(3);
        full.call.count = 1 << 33;
        for (i, &len) in sent.iter().enumerate() {
            let h = if i % 3 == 0 { full } else { header(3) };
            assert!(a.send(1, &h, &bytes(len, i as u64)).is_ok());
        }
        a
    });
    let deadline = Some(Instant::now() + Duration::from_secs(20));
    for (i, &len) in lens.iter().enumerate() {
        let want = bytes(len, i as u64);
        if i % 2 == 0 {
            let mut into = vec![0u8; len];
            let r = b.recv_posted(
                0,
                &header(3).tag,
                &mut into,
                len.max(1),
                None,
                deadline,
                &mut || Ok(()),
                &mut |dst, got| {
                    if let Received::Message(m) = got {
                        dst.copy_from_slice(&m.payload);
                    }
                    Ok(())
                },
                &error,
            );
            assert!(r.is_ok(), "message {i} ({len} B): {r:?}");
            assert!(into == want, "message {i} ({len} B) posted: wrong bytes");
        } else {
            let m = b.recv(0, &header(3).tag, deadline);
            let count = if i % 3 == 0 { 1 << 33 } else { 0 };
            assert!(
                matches!(&m, Ok(m) if m.payload == want && m.header.call.count == count),
                "message {i} ({len} B) from the mailbox: {m:?}"
            );
        }
    }
    let a = sender.join().expect("the sender");
    let ring = b.ring(0, 1);
    let (tail, head) = (ring.producer_position(), ring.consumer_position());
    assert_eq!(tail, head, "everything read");
    assert_eq!(
        tail % super::ring::MESSAGE_ALIGN,
        0,
        "the stream ends on a line"
    );
    drop(a);
}
