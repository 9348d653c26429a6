//! A non-finite loss stops every rank with an error — and, like any failure, leaves each rank's
//! flight record (what the ranks were doing) for `kolo diagnose`.

use kolo::Config;
use kolo_ddp::distributed::check_loss;

#[test]
fn a_non_finite_loss_leaves_every_ranks_flight_record() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    // nextest runs each test in its own process: the variable is this test's.
    std::env::set_var("KOLO_TRACE_DIR", dir.path());
    let results = kolo::run_local(2, Config::default(), |comm| {
        let loss = if comm.rank() == 1 { f64::NAN } else { 0.5 };
        check_loss(&comm, 7, loss).is_err()
    });
    assert!(results.iter().all(|r| matches!(r, Ok(true))), "{results:?}");
    for rank in 0..2 {
        let path = dir.path().join(format!("rank-{rank}.json"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        let dump: kolo::flight::FlightDump = serde_json::from_str(&text).expect("a record");
        assert!(
            dump.reason.starts_with("non-finite loss at step 7"),
            "{}",
            dump.reason
        );
        let last = dump.groups[0].collectives.last();
        assert_eq!(last.map(|o| o.op.as_str()), Some("all_gather"));
        // The line that called check_loss, not check_loss's own.
        let at = last.and_then(|o| o.location.as_deref()).unwrap_or("");
        assert!(at.contains("tests/nonfinite_record.rs"), "{at}");
    }
}
