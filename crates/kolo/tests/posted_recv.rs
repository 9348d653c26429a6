//! Receives posted ahead of their messages (`Communicator::post_recv`) on every transport: where
//! the transport writes the message straight into the buffer (shared memory, and the same-host
//! peers of a hybrid world) it is posted, elsewhere nothing is and the caller receives as usual.
//! A posted receive gets its messages in posting order, before later receives, leaves the bytes
//! past the message as they were, and refuses a message too long or of another type.

mod common;

use std::time::Duration;

use common::{spawn, Kind};
use kolo::prelude::*;
use kolo::{Error, Result};

const ALL: [Kind; 4] = [Kind::Local, Kind::Shm, Kind::Tcp, Kind::Hybrid];

fn cfg() -> Config {
    Config::default().with_timeout(Duration::from_secs(20))
}

fn payload(rank: usize, n: usize) -> Vec<u8> {
    (0..n)
        .map(|j| ((j * 31 + rank * 7 + n) % 251) as u8)
        .collect()
}

/// Rank 0 posts three receives from each other rank, then the senders send four messages and
/// one of another type; what was posted where.
#[test]
fn posted_receives_get_their_messages_in_order_on_every_transport() {
    for kind in ALL {
        let res = spawn(kind, 3, cfg(), |c| -> Result<Vec<bool>> {
            let sizes = [10, 100_000, 300_000, 7];
            let mut posted_from = Vec::new();
            if c.rank() != 0 {
                for n in sizes {
                    c.send(&payload(c.rank(), n), 0, 4)?;
                }
                c.send(&[1.0f32, 2.0], 0, 5)?;
                c.barrier()?;
                return Ok(posted_from);
            }
            for src in 1..c.size() {
                let mut bufs = [vec![0xEEu8; 20], vec![0xEE; 100_000], vec![0xEE; 100]];
                let mut wrong = vec![0u8; 8];
                let [b0, b1, b2] = &mut bufs;
                // SAFETY: the buffers outlive the postings, which are waited on or withdrawn
                // below, and are not touched meanwhile.
                let ps = unsafe {
                    [
                        c.post_recv(b0, src, 4)?,
                        c.post_recv(b1, src, 4)?,
                        c.post_recv(b2, src, 4)?,
                    ]
                };
                // SAFETY: as above.
                let typed = unsafe { c.post_recv(&mut wrong, src, 5)? };
                posted_from.push(ps.iter().all(Option::is_some));
                let mut got = Vec::new();
                for (p, buf) in ps.into_iter().zip(&mut bufs) {
                    got.push(match p {
                        Some(p) => c.wait_posted(&p),
                        None => c.recv_upto(buf, src, 4),
                    });
                }
                assert_eq!(got[0].as_ref().ok(), Some(&10), "{kind:?}");
                assert_eq!(got[1].as_ref().ok(), Some(&100_000), "{kind:?}");
                assert!(
                    matches!(got[2], Err(Error::InvalidArgument { .. })),
                    "{kind:?}: too long"
                );
                assert!(bufs[0][..10] == payload(src, 10)[..] && bufs[0][10..] == [0xEE; 10]);
                assert!(bufs[1] == payload(src, 100_000), "{kind:?}");
                let mut last = [0u8; 7];
                assert_eq!(
                    c.recv_upto(&mut last, src, 4)?,
                    7,
                    "{kind:?}: after the postings"
                );
                assert_eq!(last[..], payload(src, 7)[..]);
                let got = match typed {
                    Some(p) => c.wait_posted(&p),
                    None => c.recv_upto(&mut wrong, src, 5),
                };
                assert!(
                    matches!(got, Err(Error::Mismatch { .. })),
                    "{kind:?}: {got:?}"
                );
            }
            c.barrier()?;
            Ok(posted_from)
        });
        let posted: Vec<Vec<bool>> = res
            .into_iter()
            .map(|r| r.expect("every rank succeeds"))
            .collect();
        // Posted: shared memory from every peer, hybrid from the same pretend host (rank 2).
        let expect = match kind {
            Kind::Shm => vec![true, true],
            Kind::Hybrid => vec![false, true],
            _ => vec![false, false],
        };
        assert_eq!(posted[0], expect, "{kind:?}");
    }
}

#[test]
fn a_withdrawn_posting_leaves_its_message_to_the_next_receive() {
    let res = spawn(Kind::Shm, 2, cfg(), |c| -> Result<()> {
        if c.rank() == 1 {
            c.barrier()?;
            c.send(&payload(1, 5000), 0, 3)?;
            return c.barrier();
        }
        let mut buf = vec![0u8; 5000];
        // SAFETY: withdrawn before `buf` is used again.
        let p = unsafe { c.post_recv(&mut buf, 1, 3)? }.expect("shared memory posts");
        c.unpost(p);
        c.barrier()?;
        let got = c.recv_vec::<u8>(1, 3)?;
        assert!(got == payload(1, 5000) && buf == [0; 5000]);
        c.barrier()
    });
    for r in res {
        r.expect("every rank succeeds");
    }
}
