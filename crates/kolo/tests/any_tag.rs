//! Receives for any tag and any source together (`recv_matching` and its forms, MPI's
//! `MPI_ANY_TAG`) on every transport: what each matched (sender, tag, length), each sender's
//! messages in the order it sent them whatever their tags, only the communicator's own messages,
//! typed errors in time.

mod common;

use std::time::{Duration, Instant};

use common::{spawn, Kind};
use kolo::prelude::*;
use kolo::{ErrorKind, Result, Source, Status, TagMatch};

const ALL: [Kind; 4] = [Kind::Local, Kind::Shm, Kind::Tcp, Kind::Hybrid];

fn cfg() -> Config {
    Config::default().with_timeout(Duration::from_secs(20))
}

#[test]
fn any_tag_keeps_each_senders_order_and_says_what_it_matched() {
    for kind in ALL {
        for n in [2, 3] {
            let res = spawn(kind, n, cfg(), |c| -> Result<Vec<Status>> {
                let r = c.rank() as i32;
                let mut got = Vec::new();
                if c.rank() != 0 {
                    // Four messages of 1..=4 elements `[rank, i, ...]`, tags 40, 30, 20, 10.
                    for i in 0..4 {
                        let msg: Vec<i32> = (0..=i).map(|k| if k == 0 { r } else { i }).collect();
                        c.send(&msg, 0, 40 - 10 * i as u64)?;
                    }
                    c.send(&[r, 99], 0, 5)?;
                } else {
                    let mut buf = [-1i32; 8];
                    // Nothing sent to rank 0 with tag 7: an any-source receive of tag 7 waits.
                    assert_eq!(
                        c.try_recv_matching(&mut buf, Source::Any, TagMatch::Value(7))?,
                        None
                    );
                    // From each sender in turn, any tag: its messages in the order sent.
                    for src in 1..c.size() {
                        for i in 0..4 {
                            buf = [-1; 8];
                            let s = c.recv_matching(&mut buf, Source::Rank(src), TagMatch::Any)?;
                            assert_eq!(buf[0], src as i32);
                            assert!(buf[1..=i].iter().all(|&v| v == i as i32), "{buf:?}");
                            assert_eq!(buf[i + 1], -1, "past the message: untouched");
                            got.push(s);
                        }
                    }
                    // Any source, any tag: the rest (tag 5), one per sender.
                    for _ in 1..c.size() {
                        let (s, v) = c.recv_vec_matching::<i32>(Source::Any, TagMatch::Any)?;
                        assert_eq!(v, [s.source as i32, 99]);
                        got.push(s);
                    }
                }
                c.barrier()?;
                Ok(got)
            });
            let got = res
                .into_iter()
                .map(|r| r.unwrap_or_else(|e| panic!("{kind:?} n={n}: {e}")))
                .collect::<Vec<_>>();
            let mut want = Vec::new();
            for source in 1..n {
                for i in 0..4 {
                    want.push(Status {
                        source,
                        tag: 40 - 10 * i as u64,
                        count: i + 1,
                    });
                }
            }
            let (first, rest) = got[0].split_at(want.len());
            assert_eq!(first, want, "{kind:?} n={n}");
            let mut rest: Vec<_> = rest.iter().map(|s| (s.source, s.tag, s.count)).collect();
            rest.sort_unstable();
            let want_rest: Vec<_> = (1..n).map(|s| (s, 5, 2)).collect();
            assert_eq!(rest, want_rest, "{kind:?} n={n}");
        }
    }
}

#[test]
fn any_tag_matches_only_its_communicator() {
    for kind in ALL {
        let res = spawn(kind, 3, cfg(), |c| -> Result<Vec<(usize, u64, i32)>> {
            let sub = c.new_group(&[1, 2])?;
            let mut got = Vec::new();
            match (c.rank(), &sub) {
                // Into the sub-group first (group rank 1 to group rank 0), then on the world.
                (2, Some(sub)) => {
                    sub.send(&[20i32], 0, 8)?;
                    c.send(&[30i32], 1, 9)?;
                }
                (1, Some(sub)) => {
                    let mut v = [0i32];
                    let s = c.recv_matching(&mut v, Source::Any, TagMatch::Any)?;
                    got.push((s.source, s.tag, v[0]));
                    let s = sub.recv_matching(&mut v, Source::Rank(1), TagMatch::Any)?;
                    got.push((s.source, s.tag, v[0]));
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
        assert_eq!(got[1], [(2, 9, 30), (1, 8, 20)], "{kind:?}");
    }
}

#[test]
fn any_tag_errors_are_typed_and_in_time() {
    for kind in ALL {
        let short = cfg().with_timeout(Duration::from_millis(300));
        let res = spawn(kind, 2, short, |c| -> Vec<Error> {
            let mut errs = Vec::new();
            // The any-tag value is never a message's tag.
            errs.extend(c.send(&[1u8], 1 - c.rank(), u64::MAX).err());
            if c.rank() == 1 {
                c.send(&[1.0f32; 3], 0, 4).ok();
                std::thread::sleep(Duration::from_millis(1500));
                return errs;
            }
            let mut two = [0.0f32; 2];
            errs.extend(
                c.recv_matching(&mut two, Source::Rank(1), TagMatch::Any)
                    .err(),
            );
            errs.extend(
                c.recv_matching(&mut two, Source::Rank(2), TagMatch::Any)
                    .err(),
            );
            let t = Instant::now();
            errs.extend(c.recv_vec_matching::<f32>(Source::Any, TagMatch::Any).err());
            errs.extend(
                c.recv_vec_matching::<f32>(Source::Rank(1), TagMatch::Any)
                    .err(),
            );
            let waited = t.elapsed();
            assert!(
                waited >= Duration::from_millis(500) && waited < Duration::from_secs(5),
                "{kind:?}: {waited:?}"
            );
            errs
        });
        for e in &res {
            assert!(
                matches!(e.first(), Some(Error::InvalidArgument { arg: "tag", .. })),
                "{kind:?}: {e:?}"
            );
        }
        let e = &res[0];
        match e.get(1) {
            Some(Error::InvalidArgument {
                arg: "buf", reason, ..
            }) => {
                assert!(reason.contains("ERR_TRUNCATE"), "{reason}")
            }
            other => panic!("{kind:?}: {other:?}"),
        }
        assert!(
            matches!(e.get(2), Some(Error::RankOutOfRange { value: 2, .. })),
            "{kind:?}: {e:?}"
        );
        match e.get(3) {
            Some(t @ Error::TimeoutAnySource { rank: 0, .. }) => {
                assert_eq!(t.kind(), ErrorKind::Timeout);
                assert!(t.to_string().contains("any tag from any rank"), "{t}");
            }
            other => panic!("{kind:?}: {other:?}"),
        }
        assert!(
            matches!(e.get(4), Some(Error::Timeout { peer: 1, .. })),
            "{kind:?}: {e:?}"
        );
    }
}
