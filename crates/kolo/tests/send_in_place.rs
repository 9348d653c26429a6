//! Sends in place (`Communicator::send_in_place`) on every transport: where the receiver can copy
//! the payload out of the sender's memory (shared memory, and the same-host peers of a hybrid
//! world) the send is pending until it has; elsewhere it is an ordinary buffered send. Either way
//! every receive form gets the right bytes, in order with ordinary sends, and the sender learns
//! when its buffer is free.

mod common;

use std::time::Duration;

use common::{in_place_shm, spawn_with, Kind};
use kolo::prelude::*;
use kolo::Result;

const ALL: [Kind; 4] = [Kind::Local, Kind::Shm, Kind::Tcp, Kind::Hybrid];
const N: usize = 300_000;

fn cfg() -> Config {
    Config::default().with_timeout(Duration::from_secs(20))
}

fn payload(rank: usize, i: usize) -> Vec<u8> {
    (0..N)
        .map(|j| ((j * 31 + rank * 7 + i) % 251) as u8)
        .collect()
}

#[test]
fn sends_in_place_arrive_whole_on_every_transport() {
    for kind in ALL {
        let res = spawn_with(kind, 3, cfg(), &in_place_shm(), |c| -> Result<Vec<bool>> {
            let me = c.rank();
            let mut buffered = Vec::new();
            if me != 0 {
                let (a, b) = (payload(me, 0), payload(me, 1));
                // SAFETY: `a` and `b` stay alive and unchanged until the sends are done (waited
                // on below, before they go out of scope).
                let sa = unsafe { c.send_in_place(&a, 0, 7)? };
                let sb = unsafe { c.send_in_place(&b, 0, 7)? };
                c.send(&[me as u8; 5], 0, 7)?;
                buffered.push(sa.is_buffered());
                c.wait_in_place(&sa)?;
                while !c.in_place_done(&sb)? {
                    std::thread::yield_now();
                }
            } else {
                for src in 1..c.size() {
                    let mut exact = vec![0u8; N];
                    c.recv(&mut exact, src, 7)?;
                    assert!(
                        exact == payload(src, 0),
                        "{kind:?}: from rank {src}, posted"
                    );
                    let mut longer = vec![9u8; N + 10];
                    assert_eq!(c.recv_upto(&mut longer, src, 7)?, N);
                    assert!(longer[..N] == payload(src, 1)[..] && longer[N..] == [9; 10]);
                    assert_eq!(c.recv_vec::<u8>(src, 7)?, [src as u8; 5], "order kept");
                }
            }
            c.barrier()?;
            Ok(buffered)
        });
        let sends: Vec<Vec<bool>> = res
            .into_iter()
            .map(|r| r.expect("every rank succeeds"))
            .collect();
        // Which went in place: shared memory between every pair, hybrid within a pretend host
        // (ranks 0 and 2), nothing on threads and TCP.
        let in_place = |src: usize| match kind {
            Kind::Shm => true,
            Kind::Hybrid => src.is_multiple_of(2),
            _ => false,
        };
        for (src, sent) in sends.iter().enumerate().skip(1) {
            assert_eq!(sent, &[!in_place(src)], "{kind:?}: rank {src}'s send");
        }
    }
}
