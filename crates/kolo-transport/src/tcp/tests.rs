//! Posted receives over real connections: order, early and late arrivals, misfits and failures.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kolo_core::{
    Algorithm, Call, DType, Error, Header, LinkFailure, Received, ReduceOp, Reducer, Tag, TagSpace,
    Transport,
};
use kolo_store::MemoryStore;

use super::{TcpOptions, TcpTransport};

static JOB: AtomicU64 = AtomicU64::new(0);

fn pair() -> (TcpTransport, TcpTransport) {
    pair_with(TcpOptions::default())
}

fn pair_with(opts: TcpOptions) -> (TcpTransport, TcpTransport) {
    let store = MemoryStore::new();
    let prefix = format!("posted/{}", JOB.fetch_add(1, Ordering::SeqCst));
    std::thread::scope(|s| {
        let a = s.spawn(|| TcpTransport::connect(&store, &prefix, 0, 2, &opts));
        let b = TcpTransport::connect(&store, &prefix, 1, 2, &opts);
        match (a.join(), b) {
            (Ok(Ok(a)), Ok(b)) => (a, b),
            _ => panic!("connecting a pair of TCP transports failed"),
        }
    })
}

fn header(value: u64) -> Header {
    Header {
        ack: false,
        tag: Tag {
            group: 1,
            space: TagSpace::Collective,
            value,
        },
        call: Call::new(kolo_core::OpKind::Send, Algorithm::Direct),
    }
}

/// One step of a ring between two ranks: a message each way, then post `into`, send `out` in
/// `seg`-byte messages and receive (reducing into `into` with `reduce`); returns how many messages
/// went straight into the buffer.
fn exchange(
    t: &TcpTransport,
    value: u64,
    out: &[u8],
    into: &mut [u8],
    seg: usize,
    reduce: Option<Reducer>,
) -> usize {
    let peer = 1 - t.rank();
    let h = header(value);
    let mut direct = 0;
    let deadline = Some(Instant::now() + Duration::from_secs(20));
    // A first message of the same tag, taken from the mailbox just before posting (as a ring's
    // reduce-scatter precedes its all-gather): the posting must not mistake it for one in flight.
    assert!(t.send(peer, &h, &out[..8]).is_ok());
    assert!(matches!(t.recv(peer, &h.tag, deadline), Ok(m) if m.payload.len() == 8));
    let r = t.recv_posted(
        peer,
        &h.tag,
        into,
        seg,
        reduce,
        deadline,
        &mut || {
            for c in out.chunks(seg) {
                t.send(peer, &h, c)
                    .map_err(|f| f.into_error("exchange", t.rank()))?;
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
        &|e| Error::Io {
            context: format!("receive failed: {e:?}"),
            source: std::io::Error::other("recv").into(),
        },
    );
    assert!(r.is_ok(), "rank {}: {r:?}", t.rank());
    direct
}

/// 300 exchanges of 4 full segments and a short one, checking every byte (with `reduce`, a wrapping
/// u8 sum into a buffer that starts at `3j`); returns the direct count.
fn exchanges(t: &TcpTransport, reduce: Option<Reducer>) -> usize {
    let (seg, len) = (4096, 4 * 4096 + 100);
    let peer = 1 - t.rank() as u64;
    let start = |j: usize| if reduce.is_some() { (j * 3) as u8 } else { 0 };
    let mut direct = 0;
    for i in 0..300u64 {
        let out: Vec<u8> = (0..len)
            .map(|j| (j as u64 * 7 + i + t.rank() as u64) as u8)
            .collect();
        let mut into: Vec<u8> = (0..len).map(start).collect();
        direct += exchange(t, i, &out, &mut into, seg, reduce);
        let want: Vec<u8> = (0..len)
            .map(|j| ((j as u64 * 7 + i + peer) as u8).wrapping_add(start(j)))
            .collect();
        assert!(into == want, "rank {} exchange {i}: wrong bytes", t.rank());
    }
    direct
}

fn symmetric(reduce: Option<Reducer>) -> usize {
    let (a, b) = pair();
    std::thread::scope(|s| {
        let ha = s.spawn(|| exchanges(&a, reduce));
        let db = exchanges(&b, reduce);
        ha.join().unwrap_or(0) + db
    })
}

#[test]
fn symmetric_exchanges_are_exact_in_order_and_mostly_direct() {
    let total_direct = symmetric(None);
    // Every exchange has five messages a side; many should skip the copy.
    assert!(total_direct > 300, "only {total_direct} of 3000 direct");
}

#[test]
fn symmetric_reducing_exchanges_are_exact_and_mostly_reduced_off_the_wire() {
    let total_direct = symmetric(Some(Reducer::new(DType::U8, ReduceOp::Sum)));
    assert!(
        total_direct > 300,
        "only {total_direct} of 3000 reduced off the wire"
    );
}

#[test]
fn early_messages_and_misfits_take_the_mailbox_in_order() {
    let (a, b) = pair();
    let h = header(9);
    // Two messages arrive before the receive is posted; after it, one that does not fit the
    // posting's segments (so it and the next take the mailbox), then a fitting one.
    for payload in [&[1u8; 8][..], &[2u8; 8]] {
        assert!(b.send(0, &h, payload).is_ok());
    }
    std::thread::sleep(Duration::from_millis(100));
    let mut buf = [0u8; 32];
    let mut seen = Vec::new();
    let r = a.recv_posted(
        1,
        &h.tag,
        &mut buf,
        8,
        None,
        None,
        &mut || {
            for payload in [&[3u8; 5][..], &[4u8; 8]] {
                b.send(0, &h, payload)
                    .map_err(|f| f.into_error("send", 1))?;
            }
            Ok(())
        },
        &mut |dst, got| {
            if let Received::Message(m) = got {
                seen.push(m.payload.len());
                let n = m.payload.len().min(dst.len());
                dst[..n].copy_from_slice(&m.payload[..n]);
            }
            Ok(())
        },
        &|_| Error::Io {
            context: "recv".into(),
            source: std::io::Error::other("recv").into(),
        },
    );
    assert!(r.is_ok());
    assert_eq!(seen, vec![8, 8, 5, 8]);
    assert_eq!(
        &buf[..17],
        &[1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3]
    );
    assert_eq!(buf[24], 4);
}

#[test]
fn a_peer_lost_while_a_receive_is_posted_is_named() {
    let (a, b) = pair();
    let h = header(3);
    let mut buf = vec![0u8; 1 << 16];
    // The peer sends half of what is posted, then its process "dies" (its socket closes without a
    // goodbye: the stream is shut down under it).
    assert!(b.send(0, &h, &[5u8; 1 << 15]).is_ok());
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            for link in b.links.iter().flatten() {
                let _ = link.ctl.shutdown(std::net::Shutdown::Both);
            }
        });
        a.recv_posted(
            1,
            &h.tag,
            &mut buf,
            1 << 15,
            None,
            Some(Instant::now() + Duration::from_secs(20)),
            &mut || Ok(()),
            &mut |_, _| Ok(()),
            &|e| match e {
                kolo_core::RecvError::Link(f) => f.into_error("test", 0),
                kolo_core::RecvError::Timeout => Error::Io {
                    context: "timed out".into(),
                    source: std::io::Error::other("timeout").into(),
                },
            },
        )
    });
    assert!(
        matches!(r, Err(Error::PeerLost { peer: 1, .. })),
        "expected rank 1 lost, got {r:?}"
    );
    assert!(matches!(
        a.failure(),
        Some(LinkFailure::PeerLost { peer: 1, .. })
    ));
}

#[test]
fn a_posted_receive_from_no_such_rank_is_an_error() {
    let (a, _b) = pair();
    let r = a.recv_posted(
        7,
        &header(1).tag,
        &mut [0u8; 4],
        4,
        None,
        None,
        &mut || Ok(()),
        &mut |_, _| Ok(()),
        &|e| match e {
            kolo_core::RecvError::Link(f) => f.into_error("test", 0),
            kolo_core::RecvError::Timeout => Error::Io {
                context: "timed out".into(),
                source: std::io::Error::other("timeout").into(),
            },
        },
    );
    assert!(matches!(r, Err(Error::PeerLost { peer: 7, .. })), "{r:?}");
}

#[test]
fn a_frame_still_arriving_does_not_hold_back_the_sends() {
    // On a slow link a frame takes long to arrive. A receive posted while one is partly read must
    // still run its sends at once (and take that frame from the mailbox later): waiting for the
    // peer's frames before sending would make the two directions of the link take turns.
    use std::io::Write;
    use std::sync::atomic::AtomicBool;
    // No heartbeats: one could go out between the two halves of the frame written by hand below.
    let (a, b) = pair_with(TcpOptions {
        heartbeat_timeout: None,
        ..TcpOptions::default()
    });
    let h = header(4);
    let payload = [6u8; 64];
    let prefix = super::frame::encode_prefix(super::frame::Kind::Data, &h, 64);
    let link = b.links[0].as_ref().expect("rank 1 has a link to rank 0");
    {
        let mut w = link.writer.lock().unwrap_or_else(|p| p.into_inner());
        assert!(w.write_all(&prefix).is_ok() && w.write_all(&payload[..10]).is_ok());
    }
    std::thread::sleep(Duration::from_millis(100));
    let sent = AtomicBool::new(false);
    let mut buf = [0u8; 128];
    let (r, sends_first) = std::thread::scope(|s| {
        let rest = s.spawn(|| {
            // The rest of the first frame comes once the sends ran (or after 5 s, so that a
            // receiver that waits for it first finishes, late, and fails the check below).
            let t = Instant::now();
            while !sent.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(5));
            }
            let sends_first = sent.load(Ordering::SeqCst);
            let mut w = link.writer.lock().unwrap_or_else(|p| p.into_inner());
            assert!(w.write_all(&payload[10..]).is_ok());
            drop(w);
            assert!(b.send(0, &h, &[7u8; 64]).is_ok());
            sends_first
        });
        let r = a.recv_posted(
            1,
            &h.tag,
            &mut buf,
            64,
            None,
            Some(Instant::now() + Duration::from_secs(20)),
            &mut || {
                sent.store(true, Ordering::SeqCst);
                Ok(())
            },
            &mut |dst, got| {
                if let Received::Message(m) = got {
                    dst.copy_from_slice(&m.payload);
                }
                Ok(())
            },
            &|e| Error::Io {
                context: format!("recv: {e:?}"),
                source: std::io::Error::other("recv").into(),
            },
        );
        (r, rest.join().unwrap_or(false))
    });
    assert!(r.is_ok(), "{r:?}");
    assert!(sends_first, "the sends waited for the frame in flight");
    assert!(buf[..64].iter().all(|&x| x == 6) && buf[64..].iter().all(|&x| x == 7));
}

/// Rank `rank` of `size` as a bare socket: it connects to rank 0, proves the secret, says hello and
/// then never reads — a process stopped, or a host cut off with its connections still open.
fn frozen_peer(
    store: &MemoryStore,
    prefix: &str,
    rank: u32,
    size: u32,
    secret: &kolo_store::JobSecret,
) -> std::net::TcpStream {
    use kolo_store::Store;
    use std::io::{Read, Write};
    let addr = store
        .get(&format!("{prefix}/tcp/0"), Duration::from_secs(20))
        .expect("rank 0's address");
    let addr = String::from_utf8_lossy(&addr).to_string();
    let mut s = std::net::TcpStream::connect(addr.as_str()).expect("connect to rank 0");
    kolo_store::auth::client(&mut s, secret).expect("the secret exchange");
    let world = kolo_core::call::fnv1a(&[prefix.as_bytes(), &u64::from(size).to_le_bytes()]);
    s.write_all(&super::frame::Hello { rank, size, world }.encode())
        .expect("hello");
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack).expect("rank 0's acknowledgement");
    s
}

/// A peer that stopped reading, with the send buffers towards it full: neither an abort nor
/// dropping the transport waits for it (a blocking write of the last frame would wait for as long
/// as TCP retries), and the frame that cannot go is replaced by closing the link.
#[test]
fn a_peer_that_stopped_reading_holds_up_neither_abort_nor_close() {
    for ending in ["abort", "drop"] {
        let store = MemoryStore::new();
        let prefix = format!("frozen/{}", JOB.fetch_add(1, Ordering::SeqCst));
        let opts = TcpOptions {
            heartbeat_timeout: None,
            ..TcpOptions::default()
        };
        let (t, _frozen) = std::thread::scope(|s| {
            let t = s.spawn(|| TcpTransport::connect(&store, &prefix, 0, 2, &opts));
            let peer = frozen_peer(&store, &prefix, 1, 2, &opts.secret);
            match t.join() {
                Ok(Ok(t)) => (t, peer),
                _ => panic!("rank 0 did not connect"),
            }
        });
        // Fill what the kernel buffers towards the peer.
        {
            use std::io::Write;
            let link = t.links[1].as_ref().expect("the link to rank 1");
            let mut ctl = &link.ctl;
            ctl.set_nonblocking(true).expect("non-blocking");
            let chunk = vec![0u8; 1 << 16];
            let mut filled = 0usize;
            loop {
                match ctl.write(&chunk) {
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("filling the socket: {e}"),
                }
            }
            ctl.set_nonblocking(false).expect("blocking again");
            assert!(filled > 0);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let started = Instant::now();
        std::thread::spawn(move || {
            if ending == "abort" {
                t.abort("rank 0 gives up");
            }
            drop(t);
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{ending}: still waiting for the frozen peer after 20 s"));
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{ending} took {:?}",
            started.elapsed()
        );
    }
}
