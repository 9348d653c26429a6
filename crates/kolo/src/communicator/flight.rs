//! The communicator's side of the flight record (`crate::flight`): the world watched for its
//! failures, and the record written on demand.

use std::path::PathBuf;
use std::sync::Arc;

use super::{Communicator, Inner};
use crate::flight::{self, FlightRecorder, Watched};

fn offsets_of(offsets: &[f64], rank: usize) -> f64 {
    offsets.get(rank).copied().unwrap_or(0.0)
}

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

    /// Pauses (`false`) or resumes this communicator's flight recording, for measuring what it
    /// costs (`examples/flight_cost.rs`); operations run while paused are not in the record.
    #[doc(hidden)]
    pub fn set_flight_recording(&self, on: bool) {
        self.inner.recorder.pause(!on);
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
    ///     comm.all_reduce(&mut v, kolo::ReduceOp::Sum).expect("all_reduce");
    ///     comm.dump_flight_record("example").expect("a record")
    /// });
    /// let text = std::fs::read_to_string(dir.path().join("rank-1.json")).unwrap();
    /// let dump: kolo::flight::FlightDump = serde_json::from_str(&text).unwrap();
    /// assert_eq!(dump.groups[0].collectives[0].op, "all_reduce");
    /// # let _ = paths;
    /// ```
    pub fn dump_flight_record(&self, reason: &str) -> std::io::Result<PathBuf> {
        flight::write_dump(&self.inner.recorder, reason)
    }

    /// Which ranks arrive last at this communicator's collectives, and by how much: from the
    /// arrival times in the ranks' flight records of the timed ones (one in
    /// [`flight::TIMED_EVERY`]) among the last `last` collectives that every rank completed
    /// (clocks of several hosts aligned to rank 0's by three barrier rounds; on one host they are
    /// one clock). Collective; every rank gets the same answer.
    ///
    /// ```
    /// let got = kolo::run_local(3, kolo::Config::default(), |comm| {
    ///     for i in 0..20 {
    ///         if comm.rank() == 2 {
    ///             std::thread::sleep(std::time::Duration::from_millis(2));
    ///         }
    ///         comm.barrier()?;
    ///     }
    ///     comm.stragglers(1000)
    /// });
    /// let s = got[0].as_ref().unwrap().as_ref().unwrap();
    /// assert_eq!(s.ranks[0].rank, 2, "{s:?}");
    /// ```
    pub fn stragglers(&self, last: usize) -> kolo_core::Result<flight::analysis::Stragglers> {
        let n = self.size();
        let rec = self.inner.recorder.record();
        let done: Vec<&flight::OpRecord> = rec
            .collectives
            .iter()
            .filter(|o| o.state == "completed" && o.started.is_some() && !o.start_coarse)
            .collect();
        // The ids every rank holds: from the latest first one to the earliest last one.
        let id = |o: &&flight::OpRecord| i64::try_from(o.id).unwrap_or(i64::MAX);
        let mut bounds = [
            done.first().map_or(i64::MIN, |o| -id(o)),
            done.last().map_or(-1, id),
        ];
        self.all_reduce(&mut bounds, kolo_core::ReduceOp::Min)?;
        if bounds[1] < 0 || bounds[0] == i64::MIN {
            // Some rank has completed none: nothing to compare (the gathers below keep the ranks
            // in step all the same).
            bounds = [0, -1];
        }
        let (first, end) = ((-bounds[0]) as u64, bounds[1].max(0) as u64);
        let lo = first.max(end.saturating_sub(last.max(1) as u64 - 1));
        let count = if bounds[1] < 0 || lo > end {
            0
        } else {
            (end - lo + 1) as usize
        };
        let mine: Vec<f64> = (0..count as u64)
            .map(|i| {
                done.iter()
                    .find(|o| o.id == lo + i)
                    .and_then(|o| o.started)
                    .unwrap_or(f64::NAN)
            })
            .collect();
        let offset = self.clock_offset_to_rank0()?;
        let mut all = vec![0f64; count * n];
        self.all_gather(&mine, &mut all)?;
        let arrivals: Vec<Vec<f64>> = (0..count)
            .map(|k| {
                (0..n)
                    .map(|r| all[r * count + k] + offsets_of(&offset, r))
                    .collect()
            })
            .filter(|row: &Vec<f64>| row.iter().all(|t| t.is_finite()))
            .collect();
        Ok(flight::analysis::stragglers(&arrivals))
    }

    /// Each rank's clock offset to rank 0's (seconds to add), the same on every rank: zero on one
    /// host; across hosts the median of three barrier rounds (each rank reads its clock as it
    /// leaves the barrier).
    fn clock_offset_to_rank0(&self) -> kolo_core::Result<Vec<f64>> {
        let n = self.size();
        if self.local_size() == n {
            return Ok(vec![0.0; n]);
        }
        let mut rounds = Vec::new();
        for _ in 0..3 {
            self.barrier()?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let mut all = vec![0f64; n];
            self.all_gather(&[now], &mut all)?;
            rounds.push(all.iter().map(|t| all[0] - t).collect::<Vec<f64>>());
        }
        Ok((0..n)
            .map(|r| {
                let mut v: Vec<f64> = rounds.iter().map(|o| o[r]).collect();
                v.sort_by(f64::total_cmp);
                v[1]
            })
            .collect())
    }

    /// Writes this rank's flight record as its world's first failure does, for a failure kolo
    /// cannot see (a non-finite loss, say): once per world, for a world `kolo::init` made (or
    /// anywhere with `KOLO_TRACE_DIR` set), and with the Python stacks where the program is
    /// Python.
    pub fn dump_flight_record_on_failure(&self, reason: &str) {
        self.inner.recorder.note_error(reason);
        flight::on_failure(&self.inner.recorder, reason);
    }

    /// This rank's flight record as [`Communicator::dump_flight_record`] would write it, without
    /// writing it (`kolo::flight::analysis` reads a set of them).
    pub fn flight_record(&self, reason: &str) -> flight::FlightDump {
        flight::collect(&self.inner.recorder, reason)
    }
}
