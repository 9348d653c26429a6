//! `check_loss` compares the ranks' steps as well as their losses: a rank that skipped a batch is
//! caught at the next step, not when the collectives run out of step at the end of an epoch.

use kolo::Config;
use kolo_ddp::distributed::check_loss;
use kolo_ddp::TrainError;

#[test]
fn a_rank_a_step_ahead_is_reported_on_every_rank() {
    let results = kolo::run_local(3, Config::default(), |comm| {
        // Rank 2 skipped a batch: it is one step ahead; the steps pass 2^32 (sent as two halves).
        let step = (1u64 << 32) + 10 + u64::from(comm.rank() == 2);
        check_loss(&comm, step, 0.5)
    });
    for (rank, r) in results.iter().enumerate() {
        let e = match r {
            Ok(Err(e)) => e,
            other => panic!("rank {rank}: {other:?}"),
        };
        let TrainError::StepsDiffer { steps } = e else {
            panic!("rank {rank}: {e}");
        };
        let s = 1u64 << 32;
        assert_eq!(steps, &[s + 10, s + 10, s + 11]);
        let text = e.to_string();
        assert_eq!(format!("{e:?}"), text, "Debug is the message");
        assert!(
            text.starts_with(&format!(
                "ranks are at different steps: rank 0 at step {}, rank 2 at step {}",
                s + 10,
                s + 11
            )),
            "{text}"
        );
    }
}

#[test]
fn ranks_at_one_step_get_the_mean_loss() {
    let results = kolo::run_local(2, Config::default(), |comm| {
        check_loss(&comm, 5, if comm.rank() == 0 { 1.0 } else { 3.0 })
    });
    for r in results {
        assert!(matches!(r, Ok(Ok(m)) if m == 2.0), "{r:?}");
    }
}

/// A loop written as the book writes it, in a function returning kolo-ddp's `Result`, loads its
/// data with `?`: a data error is a `TrainError::Data`, its message kept.
#[test]
fn a_data_error_converts_into_a_train_error() {
    fn load_from(dir: &std::path::Path) -> kolo_ddp::Result<usize> {
        use kolo_data::{load, DatasetKind, Split};
        Ok(load(DatasetKind::Cifar10, Split::Train, Some(dir))?.len())
    }
    let empty = tempfile::tempdir().expect("a temporary directory");
    let e = load_from(empty.path()).expect_err("no data there");
    assert!(matches!(e, TrainError::Data(_)), "{e:?}");
    assert!(e.to_string().contains("cifar"), "{e}");
}
