//! Checks that run on one rank of any world, shared by the transport tests (`api.rs`) and the MPI
//! backend's tests (`mpi.rs`).

use kolo::prelude::*;
use serde::{Deserialize, Serialize};

/// Typed point-to-point between ranks 0 and 1 (other ranks do nothing): per-tag order, isend,
/// irecv with test, a message to self.
pub fn p2p_in_order(c: &Communicator) -> kolo::Result<()> {
    if c.rank() > 1 {
        return Ok(());
    }
    if c.rank() == 0 {
        for i in 0..50i32 {
            c.send(&[i], 1, 7)?;
        }
        c.send(&[1.5f64, 2.5], 1, 8)?;
        let req = c.isend(&[9u8; 1000], 1, 9);
        req.wait()?;
        // A message to self.
        c.send(&[42i64], 0, 1)?;
        assert_eq!(c.recv_vec::<i64>(0, 1)?, vec![42]);
    } else {
        // Tag 8 first: tags are independent queues.
        let mut two = [0.0f64; 2];
        c.recv(&mut two, 0, 8)?;
        assert_eq!(two, [1.5, 2.5]);
        for i in 0..50i32 {
            let mut one = [0i32];
            c.recv(&mut one, 0, 7)?;
            assert_eq!(one[0], i, "messages with one tag arrive in order");
        }
        let mut req = c.irecv::<u8>(0, 9, Some(1000));
        while !req.test() {
            std::thread::yield_now();
        }
        assert_eq!(req.wait()?, vec![9u8; 1000]);
    }
    Ok(())
}

/// Asynchronous collectives of every kind complete in issue order, before a later blocking one.
pub fn async_in_order(c: &Communicator) -> kolo::Result<()> {
    let n = c.size();
    let r = c.rank();
    let works: Vec<Work<Vec<f32>>> = (0..8)
        .map(|i| c.all_reduce_async(vec![(r + i) as f32; 1000 * (i + 1)], ReduceOp::Sum))
        .collect();
    let b = c.broadcast_async(vec![r as i32; 5], n - 1);
    let g = c.all_gather_async(vec![r as u8; 3]);
    // A blocking collective after async ones waits for them.
    let mut x = [1i64];
    c.all_reduce(&mut x, ReduceOp::Sum)?;
    assert!(works.iter().all(Work::is_completed));
    let base: usize = (0..n).sum();
    for (i, w) in works.into_iter().enumerate().rev() {
        let v = w.wait()?;
        assert_eq!(v.len(), 1000 * (i + 1));
        assert!(v.iter().all(|&e| e == (base + n * i) as f32));
    }
    assert_eq!(b.wait()?, vec![(n - 1) as i32; 5]);
    let all = g.wait()?;
    assert_eq!(all, (0..n).flat_map(|s| [s as u8; 3]).collect::<Vec<_>>());
    for (w, want) in [
        (
            c.reduce_scatter_async(vec![1.0f64; 4 * n], ReduceOp::Sum),
            vec![n as f64; 4],
        ),
        (
            c.all_to_all_async(vec![r as f64; 2 * n]),
            (0..n).flat_map(|s| [s as f64; 2]).collect(),
        ),
        (
            c.scatter_async(
                if r == 0 {
                    (0..n).map(|s| s as f64).collect()
                } else {
                    vec![]
                },
                1,
                0,
            ),
            vec![r as f64],
        ),
        (
            c.gather_async(vec![r as f64], 0),
            if r == 0 {
                (0..n).map(|s| s as f64).collect()
            } else {
                vec![]
            },
        ),
        (
            c.reduce_async(vec![2.0f64], ReduceOp::Prod, 0),
            vec![if r == 0 { 2f64.powi(n as i32) } else { 2.0 }],
        ),
    ] {
        assert_eq!(w.wait()?, want);
    }
    // Variable-count forms: rank s contributes s + 1 elements.
    let counts: Vec<usize> = (1..=n).collect();
    let concat: Vec<i32> = (0..n).flat_map(|s| vec![s as i32; s + 1]).collect();
    assert_eq!(
        c.all_gather_v_async(vec![r as i32; r + 1], counts.clone())
            .wait()?,
        concat
    );
    let g = c
        .gather_v_async(vec![r as i32; r + 1], counts.clone(), 0)
        .wait()?;
    assert_eq!(g, if r == 0 { concat.clone() } else { vec![] });
    let send = if r == 0 { concat.clone() } else { vec![] };
    assert_eq!(
        c.scatter_v_async(send, counts.clone(), 0).wait()?,
        vec![r as i32; r + 1]
    );
    let a2a = c
        .all_to_all_v_async(vec![r as i32; n], vec![1; n], vec![1; n])
        .wait()?;
    assert_eq!(a2a, (0..n as i32).collect::<Vec<_>>());
    c.barrier_async().wait()
}

/// `split` and `new_group` on a world of 5.
pub fn split_and_new_group(c: &Communicator) -> kolo::Result<()> {
    let r = c.rank();
    // Even and odd ranks, odd ones in reverse order.
    let key = if r % 2 == 1 { -(r as i64) } else { r as i64 };
    let sub = c
        .split(Some((r % 2) as u32), key)?
        .expect("every rank has a color");
    let members: Vec<usize> = if r.is_multiple_of(2) {
        vec![0, 2, 4]
    } else {
        vec![3, 1]
    };
    assert_eq!(sub.size(), members.len());
    assert_eq!(members[sub.rank()], r);
    let mut v = [r as i32];
    sub.all_reduce(&mut v, ReduceOp::Sum)?;
    assert_eq!(v[0], members.iter().sum::<usize>() as i32);
    // Collectives on the parent still work between group collectives.
    let mut w = [1i32];
    c.all_reduce(&mut w, ReduceOp::Sum)?;
    assert_eq!(w[0], 5);
    // A rank opting out gets no communicator.
    let none = c.split(if r == 4 { None } else { Some(0) }, 0)?;
    assert_eq!(none.is_none(), r == 4);
    // new_group in the listed order; ranks not listed get None.
    let g = c.new_group(&[3, 0, 4])?;
    match g {
        Some(g) => {
            assert_eq!([3, 0, 4][g.rank()], r);
            let mut b = [if g.rank() == 0 { 77u8 } else { 0 }];
            g.broadcast(&mut b, 0)?;
            assert_eq!(b[0], 77);
            // Nested: a group of the group.
            let gg = g.new_group(&[1, 2])?;
            if let Some(gg) = gg {
                let mut x = [gg.rank() as f32 + 1.0];
                gg.all_reduce(&mut x, ReduceOp::Max)?;
                assert_eq!(x[0], 2.0);
            }
        }
        None => assert!(r == 1 || r == 2),
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Meta {
    name: String,
    shape: Vec<usize>,
    lr: f64,
}

/// Object collectives on a world of 3.
pub fn object_collectives(c: &Communicator) -> kolo::Result<()> {
    let r = c.rank();
    let cfg = (r == 1).then(|| Meta {
        name: "lenet".into(),
        shape: vec![1, 28, 28],
        lr: 0.1,
    });
    let got: Meta = c.broadcast_object(cfg, 1)?;
    assert_eq!(got.name, "lenet");
    let names: Vec<String> = c.all_gather_object(&format!("worker-{}", "x".repeat(r)))?;
    assert_eq!(names, vec!["worker-", "worker-x", "worker-xx"]);
    let g = c.gather_object(&(r, vec![r; r]), 2)?;
    if r == 2 {
        assert_eq!(g, Some(vec![(0, vec![]), (1, vec![1]), (2, vec![2, 2])]));
    } else {
        assert!(g.is_none());
    }
    Ok(())
}

/// All-gather in place (MPI's `IN_PLACE`), equal and variable counts, blocking and asynchronous,
/// small and in blocks large enough to go in place on shared memory — with the last rank
/// calling the ordinary all-gather instead (MPI lets ranks mix the two). With `bad_input`, last
/// (it fails the communicator): a buffer that does not split into one block per rank.
pub fn all_gather_in_place(c: &Communicator, bad_input: bool) -> kolo::Result<()> {
    let (r, n) = (c.rank(), c.size());
    let value = |from: usize, i: usize| ((from * 131 + i * 7) % 251) as u8;
    for len in [5, 700_000] {
        let want: Vec<u8> = (0..n)
            .flat_map(|s| (0..len).map(move |i| value(s, i)))
            .collect();
        let mine: Vec<u8> = (0..len).map(|i| value(r, i)).collect();
        let mut buf = vec![0xAAu8; n * len];
        buf[r * len..(r + 1) * len].copy_from_slice(&mine);
        if r == n - 1 {
            c.all_gather(&mine, &mut buf)?;
        } else {
            c.all_gather_in_place(&mut buf)?;
        }
        assert!(
            buf == want,
            "rank {r}: all_gather_in_place of {len} bytes a rank"
        );
        let mut again = vec![0u8; n * len];
        again[r * len..(r + 1) * len].copy_from_slice(&mine);
        assert!(c.all_gather_in_place_async(again, None).wait()? == want);
    }
    // Variable counts: rank s has s + 1 elements.
    let counts: Vec<usize> = (1..=n).collect();
    let start: usize = counts[..r].iter().sum();
    let concat: Vec<i32> = (0..n).flat_map(|s| vec![s as i32; s + 1]).collect();
    let mut buf = vec![-1i32; concat.len()];
    buf[start..start + r + 1].fill(r as i32);
    c.all_gather_v_in_place(&mut buf, &counts)?;
    assert_eq!(buf, concat, "rank {r}: all_gather_v_in_place");
    let mut buf = vec![-1i32; concat.len()];
    buf[start..start + r + 1].fill(r as i32);
    assert_eq!(
        c.all_gather_in_place_async(buf, Some(counts.clone()))
            .wait()?,
        concat
    );
    if !bad_input {
        return Ok(());
    }
    // Bad input, refused before anything is sent: each rank names its own buffer, unless the
    // abort of a faster rank, naming that rank's, comes first — in this call or in the barrier
    // before it (the communicator fails either way).
    let expected = format!("buffer `buf` has {} bytes, expected {}", n * 3 + 1, n * 3);
    let mut odd = vec![0u8; n * 3 + 1];
    match c.barrier().and_then(|()| c.all_gather_in_place(&mut odd)) {
        Err(e) if e.to_string().contains(&expected) => Ok(()),
        other => panic!(
            "rank {r}: a buffer of {} bytes for {n} ranks: {other:?}",
            odd.len()
        ),
    }
}
