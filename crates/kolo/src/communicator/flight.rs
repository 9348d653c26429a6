//! The communicator's side of the flight record (`crate::flight`): the world watched for its
//! failures, and the record written on demand.

use std::path::PathBuf;
use std::sync::Arc;

use super::{Communicator, Inner};
use crate::flight::{self, FlightRecorder, Watched};

impl Watched for Inner {
    fn recorder(&self) -> &Arc<FlightRecorder> {
        &self.recorder
    }

    fn transport_failure(&self) -> Option<String> {
        self.transport
            .failure()
            .map(|f| f.into_error("between calls", self.rank).to_string())
    }
}

impl Communicator {
    /// Has the flight recorder write this world's record (this rank's file) on its first failure
    /// and on `SIGUSR1`, into [`flight::trace_dir`] (`job` names the default directory).
    pub(crate) fn watch_flight(&self, job: &str) {
        let world: Arc<dyn Watched> = self.inner.clone();
        flight::watch(Arc::downgrade(&world), job);
    }

    /// Writes this rank's flight record now — the last operations of this communicator's world and
    /// of every group made from it, with `reason` — as `rank-R.json` in `KOLO_TRACE_DIR` (else
    /// `$TMPDIR/kolo-trace-<job>`); returns the file's path. Not collective: each rank writes its
    /// own; `kolo diagnose DIR` reads them together.
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// std::env::set_var("KOLO_TRACE_DIR", dir.path());
    /// let paths = kolo::run_local(2, kolo::Config::default(), |comm| {
    ///     let mut v = [comm.rank() as f32];
    ///     comm.all_reduce(&mut v, kolo::ReduceOp::Sum)?;
    ///     comm.dump_flight_record("example")
    /// });
    /// let text = std::fs::read_to_string(dir.path().join("rank-1.json")).unwrap();
    /// let dump: kolo::flight::FlightDump = serde_json::from_str(&text).unwrap();
    /// assert_eq!(dump.groups[0].collectives[0].op, "all_reduce");
    /// # let _ = paths;
    /// ```
    pub fn dump_flight_record(&self, reason: &str) -> std::io::Result<PathBuf> {
        flight::write_dump(&self.inner.recorder, reason)
    }

    /// This rank's flight record as [`Communicator::dump_flight_record`] would write it, without
    /// writing it (`kolo::flight::analysis` reads a set of them).
    pub fn flight_record(&self, reason: &str) -> flight::FlightDump {
        flight::collect(&self.inner.recorder, reason)
    }
}
