//! The MPI backend beyond the conformance matrix: point-to-point, asynchronous, sub-group and object
//! collectives on MPI, and the failures that must end a job with an error naming the rank instead of
//! a hang (a mismatched call, a bad argument on one rank, a rank that leaves, a rank that is late).
//!
//! Each test starts `mpirun` on this test binary; the ranks run one of the ignored `rank_*` entry
//! points. Needs the `mpi` feature and OpenMPI (`scripts/test.sh` installs it).
#![cfg(feature = "mpi")]

mod common;

use std::time::Duration;

use common::checks;
use common::mpirun::{mpirun, mpirun_with};
use kolo::prelude::*;

/// The world on MPI, for an entry point (`None` when not started by mpirun).
fn world() -> Option<Communicator> {
    if !kolo::launched_by_mpi(|k| std::env::var(k).ok()) {
        eprintln!("not started by mpirun: nothing to do");
        return None;
    }
    // `kolo::init()` chooses MPI by itself under mpirun in a build with the feature.
    let comm = kolo::init().expect("MPI world");
    assert_eq!(comm.backend(), "mpi");
    Some(comm)
}

/// Prints this rank's outcome for the test that started mpirun to read.
fn report(comm: &Communicator, r: kolo::Result<()>) {
    match r {
        Ok(()) => println!("rank {} ok", comm.rank()),
        Err(e) => println!("rank {} error: {e}", comm.rank()),
    }
}

#[test]
#[ignore = "entry point of the ranks `mpirun` starts"]
fn rank_api() {
    let Some(c) = world() else { return };
    assert_eq!(c.size(), 5);
    assert_eq!((c.local_size(), c.num_nodes()), (5, 1));
    assert_eq!(c.local_rank(), c.rank());
    checks::p2p_in_order(&c).expect("p2p");
    checks::async_in_order(&c).expect("async collectives");
    checks::split_and_new_group(&c).expect("sub-groups");
    checks::all_gather_in_place(&c, false).expect("all-gather in place");
    if let Some(three) = c.new_group(&[0, 1, 2]).expect("new_group") {
        assert_eq!(three.backend(), "mpi");
        checks::object_collectives(&three).expect("object collectives");
    }
    c.monitored_barrier(Duration::from_secs(30))
        .expect("monitored barrier");
}

#[test]
fn api_on_mpi() {
    mpirun(5, "rank_api");
}

/// kolo's own halving-doubling over MPI point-to-point (messages of several pieces under one tag),
/// run asynchronously while this thread polls a point-to-point receive: two threads
/// draining MPI's messages at once (as with the flight recorder's watcher too) must still deliver
/// every piece in the order it was sent.
#[test]
#[ignore = "entry point of the ranks `mpirun` starts"]
fn rank_watched_while_busy() {
    let Some(_world) = world() else { return };
    let mut config = Config::default();
    config.overrides.all_reduce = Some(kolo::Algorithm::HalvingDoubling);
    let c = kolo::init_mpi(config).expect("MPI world");
    let (r, size, n) = (c.rank(), c.size(), 1_000_003);
    let peer = r ^ 1;
    // The peer sends this note only after its last round.
    let mut last = c.irecv::<i64>(peer, 7, Some(1));
    let result = (|| {
        for round in 0..50u64 {
            let v: Vec<f32> = (0..n).map(|i| ((i + r) % 7) as f32).collect();
            let work = c.all_reduce_async(v, ReduceOp::Sum);
            // Every test() drains MPI's messages on this thread while the collective's thread
            // drains them too.
            while !work.is_completed() {
                // The note can come during the last round: the peer may finish it first.
                let noted = last.test();
                assert!(
                    round == 49 || !noted,
                    "the peer's last note came before the last round"
                );
            }
            let v = work.wait()?;
            let want = |i: usize| (0..size).map(|s| ((i + s) % 7) as f32).sum::<f32>();
            if let Some(i) = (0..n).find(|&i| v[i] != want(i)) {
                panic!("round {round}: element {i} is {}, not {}", v[i], want(i));
            }
        }
        c.send(&[1i64], peer, 7)?;
        last.wait().map(drop)
    })();
    report(&c, result);
}

#[test]
fn a_watched_world_keeps_message_order() {
    let run = mpirun_with(4, "rank_watched_while_busy", &[]);
    for r in 0..4 {
        assert!(
            run.text.contains(&format!("rank {r} ok")),
            "rank {r}:\n{}",
            run.text
        );
    }
    assert!(run.success, "{}", run.text);
}

/// A rank whose main thread returns while another thread still polls the world's messages and a
/// third drops a second world (its last owner): MPI is finalized at exit, and neither thread may
/// call MPI under or after that (OpenMPI ends such a process with an error or a segfault).
#[test]
#[ignore = "entry point of the ranks `mpirun` starts"]
fn rank_exits_while_threads_use_mpi() {
    let Some(c) = world() else { return };
    let second = kolo::init_mpi(Config::default()).expect("second MPI world");
    c.barrier().expect("barrier");
    let poller = c.clone();
    std::thread::spawn(move || loop {
        let _ = poller.failure();
        let _ = poller.try_recv_vec_matching::<u8>(kolo::Source::Any, kolo::TagMatch::Any);
    });
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(5));
        drop(second);
    });
    report(&c, Ok(()));
}

#[test]
fn a_rank_exits_cleanly_while_other_threads_use_mpi() {
    for round in 0..3 {
        let run = mpirun_with(3, "rank_exits_while_threads_use_mpi", &[]);
        for r in 0..3 {
            assert!(
                run.text.contains(&format!("rank {r} ok")),
                "round {round}, rank {r}:\n{}",
                run.text
            );
        }
        assert!(run.success, "round {round}:\n{}", run.text);
    }
}

#[test]
#[ignore = "entry point of the ranks `mpirun` starts"]
fn rank_mismatch() {
    let Some(c) = world() else { return };
    let mut v = vec![1.0f32; if c.rank() == 1 { 12 } else { 10 }];
    report(&c, c.all_reduce(&mut v, ReduceOp::Sum));
}

#[test]
#[ignore = "entry point of the ranks `mpirun` starts"]
fn rank_bad_argument() {
    let Some(c) = world() else { return };
    // Rank 1 passes a receive buffer of the wrong length: it fails its own check at once and the
    // others, already waiting for it in MPI, learn of it from its abort.
    let n = c.size() * if c.rank() == 1 { 3 } else { 2 };
    let mut recv = vec![0i32; n];
    report(&c, c.all_gather(&[7, 7], &mut recv));
}

#[test]
#[ignore = "entry point of the ranks `mpirun` starts"]
fn rank_leaves() {
    let Some(c) = world() else { return };
    if c.rank() == 1 {
        println!("rank 1 leaves");
        return;
    }
    report(&c, c.barrier());
}

#[test]
#[ignore = "entry point of the ranks `mpirun` starts"]
fn rank_late() {
    let Some(c) = world() else { return };
    if c.rank() == 1 {
        std::thread::sleep(Duration::from_secs(20));
    }
    report(&c, c.barrier());
}

/// Runs `entry` on 3 ranks and returns its output after checking the job failed within `limit`.
fn fails_within(entry: &str, env: &[(&str, &str)], limit: Duration) -> String {
    let run = mpirun_with(3, entry, env);
    assert!(!run.timed_out, "{entry}: the job hung:\n{}", run.text);
    assert!(!run.success, "{entry}: the job should fail:\n{}", run.text);
    assert!(
        run.elapsed < limit,
        "{entry}: took {:?}:\n{}",
        run.elapsed,
        run.text
    );
    run.text
}

#[test]
fn a_mismatch_fails_every_rank_naming_the_calls() {
    let text = fails_within("rank_mismatch", &[], Duration::from_secs(20));
    for r in 0..3 {
        assert!(
            text.contains(&format!("rank {r} error: collective mismatch")),
            "rank {r}:\n{text}"
        );
    }
    assert!(
        text.contains("f32 x 12") && text.contains("f32 x 10"),
        "{text}"
    );
}

#[test]
fn a_bad_argument_on_one_rank_aborts_the_others() {
    let text = fails_within("rank_bad_argument", &[], Duration::from_secs(20));
    assert!(
        text.contains("rank 1 error: all_gather on rank 1: buffer `recv`"),
        "{text}"
    );
    for r in [0, 2] {
        assert!(
            text.contains(&format!(
                "rank {r} error: all_gather on rank {r}: aborted by rank 1"
            )),
            "rank {r}:\n{text}"
        );
    }
}

#[test]
fn a_rank_that_leaves_is_named() {
    let text = fails_within("rank_leaves", &[], Duration::from_secs(20));
    // Each of the others names rank 1, itself or through the first one to notice. The ranks'
    // outputs share mpirun's stream, so a message may begin in the middle of another rank's line.
    for r in [0, 2] {
        let prefix = format!("rank {r} error: barrier on rank {r}:");
        assert!(
            text.lines().any(|l| l
                .find(&prefix)
                .is_some_and(|at| l[at..].contains("rank 1 has closed its communicator"))),
            "rank {r}:\n{text}"
        );
    }
}

#[test]
fn a_late_rank_is_a_timeout_not_a_hang() {
    let text = fails_within(
        "rank_late",
        &[("KOLO_TIMEOUT", "2")],
        Duration::from_secs(15),
    );
    // Ranks 0 and 2 time out together; the first to exit ends the job, perhaps before the other
    // has printed.
    assert!(
        [0, 2].iter().any(|r| text.contains(&format!(
            "rank {r} error: barrier on rank {r}: not every rank entered barrier"
        ))),
        "{text}"
    );
}

#[test]
fn the_mpirun_harness_sees_ranks_that_exited_unreaped() {
    // A parent that never reaps its child (what a hung mpirun leaves): the harness reads the
    // child's exit code from /proc; a live child, or none, reads as None.
    let mut parent = std::process::Command::new("sh")
        .args(["-c", "(exit 3) & exec sleep 5"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("sh");
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let mut seen = None;
    while seen.is_none() && std::time::Instant::now() < deadline {
        seen = common::mpirun::exited_children(parent.id());
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = parent.kill();
    let _ = parent.wait();
    assert_eq!(seen, Some(vec![3 << 8]), "exit 3 as waitpid gives it");
    let mut busy = std::process::Command::new("sh")
        .args(["-c", "sleep 1 & exec sleep 5"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("sh");
    std::thread::sleep(Duration::from_millis(200));
    let live = common::mpirun::exited_children(busy.id());
    let _ = busy.kill();
    let _ = busy.wait();
    assert_eq!(live, None);
}
