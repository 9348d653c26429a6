//! The mailbox's tests: matching, waiting, failures, receives from any source.
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

#[test]
fn a_delivery_wakes_the_receives_already_waiting_for_it() {
    // Deliveries notify only when someone waits: receives that are already asleep, with and
    // without a deadline, wake for their messages (a missed wake-up would leave one asleep until
    // its 20 s deadline, or for ever).
    let mb = Arc::new(Mailbox::new(3));
    let waiting: Vec<_> = (0..4u64)
        .map(|i| {
            let mb = mb.clone();
            std::thread::spawn(move || {
                let deadline = (i % 2 == 0).then(|| Instant::now() + Duration::from_secs(20));
                let t = Instant::now();
                let m = mb.recv(1 + (i as usize % 2), &header(10 + i).tag, deadline);
                (m.map(|m| m.payload), t.elapsed())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    for i in 0..4u64 {
        let header = header(10 + i);
        mb.deliver(
            1 + (i as usize % 2),
            Message {
                header,
                payload: vec![i as u8],
            },
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    for (i, h) in waiting.into_iter().enumerate() {
        let r = h.join().map_err(|_| "panicked");
        assert!(
            matches!(&r, Ok((Ok(p), waited)) if *p == [i as u8] && *waited < Duration::from_secs(5)),
            "receive {i}: {r:?}"
        );
    }
}
