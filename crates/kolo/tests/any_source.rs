//! Receives from any source (`recv_any`, `recv_vec_any`) on every transport, shared memory and TCP
//! combined (`Hybrid`) included: the sender named, each sender's messages in order, only the
//! receive's group and tag matched, and every failure a typed error in time — never a hang.

mod common;

use std::time::{Duration, Instant};

use common::{spawn, Kind};
use kolo::prelude::*;
use kolo::{ErrorKind, Result};

const ALL: [Kind; 4] = [Kind::Local, Kind::Shm, Kind::Tcp, Kind::Hybrid];

fn cfg() -> Config {
    Config::default().with_timeout(Duration::from_secs(20))
}

#[test]
fn any_source_names_the_sender_and_keeps_each_senders_order() {
    const EACH: i32 = 5;
    for kind in ALL {
        for n in [2, 3, 4] {
            let res = spawn(kind, n, cfg(), |c| -> Result<Vec<usize>> {
                // Every rank, the last itself included, sends the last rank EACH messages
                // `[rank, i]` with tag 7, then one with tag 8.
                let last = n - 1;
                for i in 0..EACH {
                    c.send(&[c.rank() as i32, i], last, 7)?;
                }
                c.send(&[c.rank() as i32, 99], last, 8)?;
                let mut order = Vec::new();
                if c.rank() == last {
                    let mut next = vec![0i32; n];
                    for _ in 0..EACH as usize * n {
                        let mut m = [0i32; 2];
                        let src = c.recv_any(&mut m, 7)?;
                        assert_eq!(m, [src as i32, next[src]], "{kind:?} n={n}");
                        next[src] += 1;
                        order.push(src);
                    }
                    let mut tag8 = Vec::new();
                    for _ in 0..n {
                        let (src, v) = c.recv_vec_any::<i32>(8)?;
                        assert_eq!(v, [src as i32, 99], "{kind:?} n={n}");
                        tag8.push(src);
                    }
                    tag8.sort_unstable();
                    assert_eq!(tag8, (0..n).collect::<Vec<_>>(), "{kind:?} n={n}");
                }
                c.barrier()?;
                Ok(order)
            });
            for (r, out) in res.into_iter().enumerate() {
                let order = out.unwrap_or_else(|e| panic!("{kind:?} n={n} rank {r}: {e}"));
                if r == n - 1 {
                    for src in 0..n {
                        let got = order.iter().filter(|&&s| s == src).count();
                        assert_eq!(got, EACH as usize, "{kind:?} n={n}: from rank {src}");
                    }
                }
            }
        }
    }
}

#[test]
fn any_source_matches_only_its_group_and_tag() {
    for kind in ALL {
        let res = spawn(kind, 3, cfg(), |c| -> Result<Vec<(usize, i32)>> {
            let sub = c.new_group(&[1, 2])?;
            let mut got = Vec::new();
            match (c.rank(), &sub) {
                // World rank 0 to world rank 1, tag 5; world rank 2 to group rank 0 (world rank
                // 1) in the sub-group, also tag 5; and to world rank 1 with tag 6.
                (0, _) => c.send(&[10i32], 1, 5)?,
                (2, Some(sub)) => {
                    sub.send(&[20i32], 0, 5)?;
                    c.send(&[30i32], 1, 6)?;
                }
                (1, Some(sub)) => {
                    let mut v = [0i32];
                    got.push((sub.recv_any(&mut v, 5)?, v[0]));
                    got.push((c.recv_any(&mut v, 5)?, v[0]));
                    got.push((c.recv_any(&mut v, 6)?, v[0]));
                }
                _ => {}
            }
            c.barrier()?;
            Ok(got)
        });
        let got = res
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| panic!("{kind:?}: {e}")))
            .collect::<Vec<_>>();
        // In the sub-group the sender is group rank 1 (world rank 2).
        assert_eq!(got[1], [(1, 20), (0, 10), (2, 30)], "{kind:?}");
    }
}

#[test]
fn any_source_errors_are_typed_and_in_time() {
    for kind in ALL {
        let short = cfg().with_timeout(Duration::from_millis(300));
        let res = spawn(kind, 2, short, |c| -> Vec<Error> {
            let mut errs = Vec::new();
            if c.rank() == 1 {
                c.send(&[1.0f32; 3], 0, 1).ok();
                c.send(&[1i32; 2], 0, 2).ok();
                // Alive until rank 0 is done, so that its last receive times out.
                std::thread::sleep(Duration::from_millis(1500));
                return errs;
            }
            let mut two = [0.0f32; 2];
            errs.extend(c.recv_any(&mut two, 1).err());
            errs.extend(c.recv_any(&mut two, 2).err());
            let t = Instant::now();
            errs.extend(c.recv_vec_any::<f32>(3).err());
            let waited = t.elapsed();
            assert!(
                waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
                "{kind:?}: {waited:?}"
            );
            errs
        });
        let e = &res[0];
        assert!(
            matches!(
                e.first(),
                Some(Error::MessageLength {
                    op: "recv",
                    rank: 0,
                    peer: 1,
                    expected: 8,
                    actual: 12,
                })
            ),
            "{kind:?}: {e:?}"
        );
        assert!(
            matches!(e.get(1), Some(Error::Mismatch { peer: 1, .. })),
            "{kind:?}: {e:?}"
        );
        match e.get(2) {
            Some(
                t @ Error::TimeoutAnySource {
                    tag: 3, rank: 0, ..
                },
            ) => {
                assert_eq!(t.kind(), ErrorKind::Timeout);
                // Torch's tests look for " timeout " (Gloo's wording) in a timed-out call's error.
                assert!(t.to_string().contains(" timeout "), "{t}");
            }
            other => panic!("{kind:?}: {other:?}"),
        }
    }
}

#[test]
fn any_source_fails_at_once_when_a_rank_aborts() {
    for kind in ALL {
        let res = spawn(kind, 3, cfg(), |c| -> Option<(Error, Duration)> {
            match c.rank() {
                2 => {
                    std::thread::sleep(Duration::from_millis(100));
                    c.abort("stopping on purpose");
                    None
                }
                0 => {
                    let t = Instant::now();
                    let mut v = [0u8; 1];
                    c.recv_any(&mut v, 4).err().map(|e| (e, t.elapsed()))
                }
                _ => {
                    std::thread::sleep(Duration::from_millis(500));
                    None
                }
            }
        });
        match &res[0] {
            Some((e, waited)) => {
                assert!(
                    matches!(e.root_cause(), Error::Aborted { by: 2, .. }),
                    "{kind:?}: {e}"
                );
                assert!(*waited < Duration::from_secs(10), "{kind:?}: {waited:?}");
            }
            None => panic!("{kind:?}: the receive succeeded"),
        }
    }
}
