//! Sends in place over shared memory: the receiver copies the payload out of the sender's memory,
//! through a posted buffer or the mailbox, in order with ordinary messages; the sender learns when
//! it may reuse its buffer, and a failure on either side is an error, never stale bytes.

use std::time::{Duration, Instant};

use kolo_core::{LinkFailure, RecvError, Transport};

use super::tests::{bytes, header, posted_once, TEST_SINGLE_COPY_BYTES};
use super::{shm_world, ShmOptions, ShmTransport};

/// The default settings but sends in place from [`TEST_SINGLE_COPY_BYTES`].
fn in_place() -> ShmOptions {
    ShmOptions {
        single_copy_bytes: TEST_SINGLE_COPY_BYTES,
        ..ShmOptions::default()
    }
}

fn pair_with(opts: ShmOptions) -> (ShmTransport, ShmTransport) {
    let mut w = shm_world(2, &opts).expect("a shared-memory world of two threads");
    let b = w.pop().expect("rank 1");
    let a = w.pop().expect("rank 0");
    (a, b)
}

fn soon() -> Option<Instant> {
    Some(Instant::now() + Duration::from_secs(20))
}

/// Sends `payload` in place from `t` to rank 1, expecting a ticket.
fn send_in_place(t: &ShmTransport, payload: &[u8]) -> u64 {
    // SAFETY: every caller keeps `payload` alive and unchanged until it has been received.
    let sent = unsafe { t.send_in_place(1, &header(5), payload) };
    sent.expect("send in place")
        .expect("a message this long goes in place")
}

/// Receives the next message with tag 5 from rank 0 into a posted buffer of `len` bytes; whether
/// it came straight into it.
fn posted(t: &ShmTransport, len: usize) -> (Vec<u8>, bool) {
    posted_once(t, 0, 5, len)
}

fn recv(t: &ShmTransport) -> Result<Vec<u8>, RecvError> {
    t.recv(0, &header(5).tag, soon()).map(|m| m.payload)
}

#[test]
fn messages_in_place_arrive_whole_through_a_posting_and_the_mailbox_in_order_with_others() {
    let (a, b) = pair_with(ShmOptions {
        ring_bytes: 64 << 10,
        ..in_place()
    });
    let small = bytes(1000, 1);
    // SAFETY: `small` outlives the world.
    let below = unsafe { a.send_in_place(1, &header(5), &small) };
    assert_eq!(
        below.expect("send"),
        None,
        "below the threshold: through the ring"
    );
    let (big1, big2, last) = (bytes(70_000, 2), bytes((3 << 20) + 5, 3), bytes(77, 4));
    let t1 = send_in_place(&a, &big1);
    let t2 = send_in_place(&a, &big2);
    a.send(1, &header(5), &last).expect("send");
    assert_eq!((t1, t2), (1, 2));
    assert!(
        !a.in_place_done(1, t1).expect("no failure"),
        "nothing copied yet"
    );

    let (got, direct) = posted(&b, small.len());
    assert!(got == small && direct);
    let (got, direct) = posted(&b, big1.len());
    assert!(
        got == big1 && direct,
        "copied straight into the posted buffer"
    );
    assert!(a.in_place_done(1, t1).expect("no failure"));
    assert!(!a.in_place_done(1, t2).expect("no failure"));
    assert!(recv(&b).expect("through the mailbox") == big2);
    a.wait_in_place(1, t2, soon()).expect("copied");
    assert_eq!(recv(&b).expect("the one sent after"), last);
}

#[test]
fn a_message_in_place_that_a_posting_does_not_fit_goes_through_the_mailbox() {
    let (a, b) = pair_with(in_place());
    let big = bytes(100_000, 5); // above the threshold
    let t = send_in_place(&a, &big);
    let (got, direct) = posted(&b, 200_000);
    assert!(!direct && got[..big.len()] == big[..] && got[big.len()..].iter().all(|&x| x == 0));
    a.wait_in_place(1, t, soon()).expect("copied");
}

#[test]
fn where_single_copy_is_off_a_send_in_place_is_an_ordinary_one() {
    let (a, b) = pair_with(ShmOptions {
        single_copy_bytes: 0,
        ..ShmOptions::default()
    });
    let big = bytes(100_000, 6); // fits in the ring: this thread receives it after
                                 // SAFETY: `big` outlives the world.
    let sent = unsafe { a.send_in_place(1, &header(5), &big) }.expect("send");
    assert_eq!(sent, None);
    assert!(recv(&b).expect("received") == big);
}

#[test]
fn a_sender_learns_that_its_receiver_closed_without_copying() {
    let (a, b) = pair_with(in_place());
    let big = bytes(1 << 20, 7);
    let t = send_in_place(&a, &big);
    drop(b);
    match a.wait_in_place(1, t, soon()) {
        Err(RecvError::Link(LinkFailure::PeerClosed { peer: 1 })) => {}
        other => panic!("expected the receiver's close, got {other:?}"),
    }
}

#[test]
fn a_closing_sender_waits_until_its_messages_in_place_are_copied() {
    let (a, b) = pair_with(in_place());
    let big = bytes(2 << 20, 8);
    let want = big.clone();
    std::thread::scope(|s| {
        let receiver = s.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let got = recv(&b);
            (got, b)
        });
        send_in_place(&a, &big);
        let closing = Instant::now();
        drop(a);
        assert!(
            closing.elapsed() >= Duration::from_millis(200),
            "the close waited"
        );
        let (got, _b) = receiver.join().expect("receiver thread");
        assert!(got.expect("the copy of an open sender's memory") == want);
    });
}

#[test]
fn a_copy_from_a_sender_that_aborted_is_a_failure_not_a_message() {
    let (a, b) = pair_with(in_place());
    let big = bytes(1 << 20, 9);
    send_in_place(&a, &big);
    a.abort("gave up");
    match recv(&b) {
        Err(RecvError::Link(LinkFailure::Aborted { by: 0, .. })) => {}
        other => panic!("expected rank 0's abort, got {:?}", other.map(|p| p.len())),
    }
}

#[test]
fn payloads_drained_into_the_mailbox_reuse_recycled_buffers() {
    let (a, b) = pair_with(in_place());
    let big = bytes(100_000, 10);
    for in_place in [false, true] {
        // A buffer no payload of this length would get from the allocator.
        b.recycle(Vec::with_capacity(3 << 20));
        if in_place {
            send_in_place(&a, &big);
        } else {
            a.send(1, &header(5), &big).expect("send");
        }
        let got = recv(&b).expect("received");
        assert!(
            got == big && got.capacity() == 3 << 20,
            "read into the recycled buffer"
        );
    }
}
