//! Receives posted ahead of their messages: filled by whichever call moves the ring, in posting
//! order with queued messages and later receives, never written past the message or after being
//! withdrawn, and ended by a peer's close or abort.

use std::time::{Duration, Instant};

use kolo_core::{LinkFailure, RecvError, Transport};

use super::tests::{bytes, header, pair};
use super::ShmTransport;

fn soon() -> Option<Instant> {
    Some(Instant::now() + Duration::from_secs(20))
}

/// Posts `buf` on `t` for the next message from rank 0 with tag 5.
fn post(t: &ShmTransport, buf: &mut [u8]) -> u64 {
    // SAFETY: every caller keeps `buf` alive and untouched until the posting ends or is withdrawn.
    let p = unsafe { t.post_recv(0, &header(5).tag, buf.as_mut_ptr(), buf.len()) };
    p.expect("post").expect("shared memory posts receives")
}

fn wait(t: &ShmTransport, p: u64) -> Result<usize, RecvError> {
    t.posted_recv(p, true, soon())
        .map(|got| got.expect("a blocking wait ends with the message").1)
}

#[test]
fn postings_take_their_messages_in_order_whatever_the_way_they_came() {
    let (a, b) = pair(64 << 10);
    let (small, queued) = (bytes(100, 1), bytes(3000, 2));
    let (streamed, in_place, after) = (bytes(300_000, 3), bytes(200_000, 4), bytes(50, 5));
    a.send(1, &header(5), &queued).expect("send");
    // A receive of another tag drains `queued` into the mailbox, before the postings.
    let _ = b.recv(
        0,
        &header(9).tag,
        Some(Instant::now() + Duration::from_millis(10)),
    );
    assert_eq!(b.mailbox.queued(0, &header(5).tag), 1);
    let mut bufs = [
        vec![0xEEu8; 4000],
        vec![0xEE; 200],
        vec![0xEE; 300_000],
        vec![0xEE; 200_000],
    ];
    let ps: Vec<u64> = bufs.iter_mut().map(|buf| post(&b, buf)).collect();
    a.send(1, &header(5), &small).expect("send");
    // Longer than the ring: streamed into the posting as the sender writes it.
    let got = std::thread::scope(|s| {
        s.spawn(|| a.send(1, &header(5), &streamed));
        [wait(&b, ps[0]), wait(&b, ps[1]), wait(&b, ps[2])]
    });
    let lens = [queued.len(), small.len(), streamed.len()];
    assert_eq!(
        got.map(|g| g.ok()),
        lens.map(Some),
        "queued before the postings, small, streamed"
    );
    // SAFETY: `in_place` outlives the wait below.
    let ticket = unsafe { a.send_in_place(1, &header(5), &in_place) }.expect("send");
    a.send(1, &header(5), &after).expect("send");
    assert_eq!(wait(&b, ps[3]).expect("in place"), in_place.len());
    a.wait_in_place(1, ticket.expect("in place"), soon())
        .expect("copied");
    assert_eq!(&bufs[0][..3000], &queued[..]);
    assert!(
        bufs[0][3000..].iter().all(|&x| x == 0xEE),
        "nothing past the message"
    );
    assert_eq!(&bufs[1][..100], &small[..]);
    assert!(
        bufs[1][100..].iter().all(|&x| x == 0xEE),
        "nothing past the message"
    );
    assert!(bufs[2] == streamed && bufs[3] == in_place);
    let next = b
        .recv(0, &header(5).tag, soon())
        .expect("the message after");
    assert_eq!(next.payload, after, "a later receive gets the next message");
}

#[test]
fn a_posting_is_filled_by_another_wait_and_a_message_longer_than_it_is_reported_unwritten() {
    let (a, b) = pair(64 << 10);
    let (big, long) = (bytes(100_000, 6), bytes(500, 7));
    let (mut into, mut short) = (vec![0u8; 100_000], vec![0xEEu8; 100]);
    let (p, q) = (post(&b, &mut into), post(&b, &mut short));
    // SAFETY: `big` outlives the waits below.
    let ticket = unsafe { a.send_in_place(1, &header(5), &big) }
        .expect("send")
        .expect("in place");
    a.send(1, &header(5), &long).expect("send");
    a.send(1, &header(6), b"x").expect("send");
    // A receive of another tag moves the ring: the sender's buffer is copied into the posting
    // before anyone waits on it.
    b.recv(0, &header(6).tag, soon()).expect("recv");
    assert!(
        a.in_place_done(1, ticket).expect("no failure"),
        "copied by the other receive"
    );
    assert_eq!(wait(&b, p).expect("filled"), big.len());
    assert!(into == big);
    let (h, len) = b
        .posted_recv(q, false, None)
        .expect("no failure")
        .expect("arrived");
    assert_eq!(
        (h.tag, len),
        (header(5).tag, 500),
        "the message's length, for the caller to refuse"
    );
    assert!(
        short.iter().all(|&x| x == 0xEE),
        "nothing written into a posting too short"
    );
    assert!(
        b.posted_recv(q, false, None).is_err(),
        "a posting reported is gone"
    );
}

#[test]
fn a_withdrawn_posting_is_never_written_again_and_its_message_goes_on_whole() {
    // Withdrawn once part of a message longer than the ring is in it (a fast sender may finish
    // first now and then: tried again then).
    let long = bytes(1 << 20, 8);
    let mut withdrawn_part_way = false;
    for _ in 0..20 {
        let (a, b) = pair(64 << 10);
        let mut into = vec![0u8; 1 << 20];
        let p = post(&b, &mut into);
        std::thread::scope(|s| {
            s.spawn(|| a.send(1, &header(5), &long).expect("send"));
            let t0 = Instant::now();
            let mut complete = false;
            while into.iter().all(|&x| x == 0) && !complete {
                complete = b.posted_recv(p, false, None).expect("no failure").is_some();
                assert!(t0.elapsed() < Duration::from_secs(20), "nothing arrived");
            }
            if complete {
                return;
            }
            b.unpost_recv(p);
            let seen = into.clone();
            let got = b
                .recv(0, &header(5).tag, soon())
                .expect("the message, whole");
            assert!(got.payload == long);
            assert!(into == seen, "not written after the withdrawal");
            withdrawn_part_way |= seen != long;
        });
        if withdrawn_part_way {
            return;
        }
    }
    panic!("the message was never withdrawn part way in 20 tries");
}

#[test]
fn a_posting_ends_when_its_peer_closes_or_aborts() {
    let (a, b) = pair(64 << 10);
    let mut into = vec![0u8; 10];
    let p = post(&b, &mut into);
    drop(a);
    assert!(matches!(
        wait(&b, p),
        Err(RecvError::Link(LinkFailure::PeerClosed { peer: 0 }))
    ));

    let (a, b) = pair(64 << 10);
    let p = post(&b, &mut into);
    a.abort("stopped on purpose");
    let e = wait(&b, p).expect_err("aborted");
    assert!(format!("{e:?}").contains("stopped on purpose"), "{e:?}");
    let gone = b
        .posted_recv(p, false, None)
        .expect_err("a failed posting is gone");
    assert!(
        format!("{gone:?}").contains("no receive posted"),
        "{gone:?}"
    );
}

#[test]
fn messages_in_place_for_postings_are_read_together_in_order_with_one_for_the_mailbox() {
    let (a, b) = pair(64 << 10);
    let msgs: Vec<Vec<u8>> = (0..5)
        .map(|i| bytes(70_000 + 1000 * i, 20 + i as u64))
        .collect();
    let mut bufs = vec![vec![0u8; 80_000]; 4];
    let ps: Vec<u64> = bufs.iter_mut().map(|buf| post(&b, buf)).collect();
    let mut tickets = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        // The third has a tag no posting waits for: it goes to the mailbox, between the others.
        let tag = if i == 2 { 6 } else { 5 };
        // SAFETY: `msgs` outlives the waits below.
        let t = unsafe { a.send_in_place(1, &header(tag), m) }.expect("send");
        tickets.push(t.expect("in place"));
    }
    // One drain reads all five: the postings' in batches around the mailbox's.
    let other = b
        .recv(0, &header(6).tag, soon())
        .expect("the one for the mailbox");
    assert!(other.payload == msgs[2]);
    for t in &tickets {
        assert!(
            a.in_place_done(1, *t).expect("no failure"),
            "ticket {t} counted copied"
        );
    }
    for (i, (p, m)) in ps.iter().zip([0, 1, 3, 4]).enumerate() {
        assert_eq!(wait(&b, *p).expect("filled"), msgs[m].len());
        assert!(bufs[i][..msgs[m].len()] == msgs[m][..], "posting {i}");
    }
}
