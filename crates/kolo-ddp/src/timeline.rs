//! A timeline of the job (like Horovod's): what every rank did when, as one
//! [Chrome trace](https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU)
//! file that Perfetto (<https://ui.perfetto.dev>) or `chrome://tracing` loads.
//!
//! Each rank is a process (`pid` = rank) with two tracks: `main` (data loading, forward,
//! backward, waiting for gradients, optimizer step, evaluation, checkpoints) and `comm`, the
//! communicator's worker thread, where every gradient bucket's all-reduce is a complete event
//! from the moment the worker takes it up to its completion (args: `bucket`, `bytes` of f32
//! gradients, `wire_bytes` each rank put into the collective where the hook says (half of `bytes`
//! under fp16/bf16 compression), `hook`, `queued_us`, the time it waited in the queue since its
//! launch). The time from launch to
//! completion is also an async `queued → done` slice per bucket. A counter track on rank 0,
//! `arrival skew`, shows for each bucket all-reduce how long after the first rank the last one took
//! it up (`skew_us`) and which rank that was (`last_rank`).
//!
//! Clocks are aligned at [`Timeline::start`]: rank 0 plays a few ping-pongs with every rank and keeps
//! the round with the shortest round trip; every timestamp in the file is on rank 0's clock, in
//! microseconds since rank 0 started the timeline.
//!
//! A disabled timeline ([`Timeline::disabled`]) is a `None`: a span costs one branch, no clock read
//! and no allocation. An enabled one buffers events in memory; [`Timeline::flush`] (a collective:
//! rank 0 gathers every rank's new events) appends them to the file given to [`Timeline::create`],
//! which is a complete trace after every flush — `kolo train` flushes after each epoch, so a long
//! job's buffer stays small and a job that dies keeps the trace of its finished epochs.
//! [`Timeline::write`] writes all buffered events to a file of one's choice at once.
//!
//! ```no_run
//! # fn main() -> kolo_ddp::Result<()> {
//! # let comm: kolo::Communicator = todo!();
//! # let ddp: kolo_ddp::ddp::Ddp = todo!();
//! # let loss: candle_core::Tensor = todo!();
//! use kolo_ddp::timeline::Timeline;
//!
//! // Collective; fails on every rank, naming the file, if rank 0 cannot create it.
//! let timeline = Timeline::create(&comm, "trace.json")?;
//! ddp.set_timeline(timeline.clone()); // backward, gradient waits and bucket all-reduces
//! for _step in 0..10 {
//!     {
//!         let _s = timeline.span("forward");
//!         // ... build the model from ddp.var_builder(...) and run it
//!     }
//!     let grads = ddp.backward(&loss)?;
//!     let _s = timeline.span("step");
//!     // ... optimizer.step(&grads)
//! }
//! timeline.finish()?; // collective: rank 0 writes trace.json
//! # Ok(())
//! # }
//! ```

use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kolo::{Communicator, WorkTimes};

use crate::error::{Result, TrainError};

/// The p2p tag of the clock ping-pongs.
const CLOCK_TAG: u64 = 0x6b6f_6c6f_7469_6d65;
/// Ping-pong rounds per rank; the shortest round trip wins.
const CLOCK_ROUNDS: usize = 8;

/// A bucket's reduction, for the `comm` track.
#[derive(Clone, Debug)]
pub(crate) struct BucketEvent {
    pub bucket: usize,
    pub bytes: usize,
    /// Bytes each rank put into the collective (the hook's `wire_bytes`), when known.
    pub wire_bytes: Option<usize>,
    pub hook: Cow<'static, str>,
    pub launched: Instant,
    pub times: Option<WorkTimes>,
    pub waited: Instant,
}

#[derive(Debug)]
enum Event {
    Span {
        name: Cow<'static, str>,
        start: Instant,
        end: Instant,
    },
    Bucket(BucketEvent),
}

#[derive(Debug)]
struct Shared {
    rank: usize,
    /// For gathering the events at the end.
    comm: Communicator,
    /// This rank's zero.
    origin: Instant,
    /// Rank 0's clock minus this rank's, in µs since the origins.
    offset_us: f64,
    /// Set by [`Timeline::create`].
    path: Option<PathBuf>,
    events: Mutex<Vec<Event>>,
    /// What earlier flushes wrote.
    flushed: Mutex<Flushed>,
}

/// The state of incremental writing.
#[derive(Debug, Default)]
struct Flushed {
    /// This rank's metadata events (track names) are in the file.
    meta: bool,
    /// Async slice ids used so far on this rank.
    queue_id: u64,
    /// Rank 0: where the file's closing `]}` starts (`None`: nothing written yet).
    tail_at: Option<u64>,
}

/// How the trace file ends; a flush writes over it and puts it back.
const TAIL: &str = "\n]}\n";

/// A recorder of the job's timeline; cheap to clone (clones record into the same buffer). See the
/// [module documentation](self).
#[derive(Clone, Debug, Default)]
pub struct Timeline(Option<Arc<Shared>>);

/// Records a span of the `main` track when dropped (see [`Timeline::span`]).
#[must_use = "a span ends when the guard is dropped"]
#[derive(Debug)]
pub struct Span<'a> {
    on: Option<(&'a Shared, Instant)>,
    name: &'static str,
}

impl Drop for Span<'_> {
    fn drop(&mut self) {
        if let Some((s, start)) = self.on {
            s.push(Event::Span {
                name: Cow::Borrowed(self.name),
                start,
                end: Instant::now(),
            });
        }
    }
}

impl Shared {
    fn push(&self, e: Event) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(e);
    }

    /// Collective: takes this rank's buffered events out, renders them (see [`render`]) and gathers
    /// every rank's on rank 0 (`None` elsewhere).
    fn gather(&self, with_meta: bool, queue_id: &mut u64) -> Result<Option<Vec<String>>> {
        let events = std::mem::take(&mut *self.events.lock().unwrap_or_else(|p| p.into_inner()));
        let mine = render(self, &events, with_meta, queue_id);
        // When this rank arrived at each bucket's all-reduce (the worker took it up), on rank 0's
        // clock: rank 0 draws the arrival skew from them.
        let arrivals: Vec<f64> = events
            .iter()
            .filter_map(|e| match e {
                Event::Bucket(b) => {
                    Some(self.us(b.times.and_then(|t| t.started).unwrap_or(b.launched)))
                }
                Event::Span { .. } => None,
            })
            .collect();
        drop(events);
        let all = self.comm.gather_object(&(mine, arrivals), 0)?;
        Ok(all.map(|all| {
            let (mut parts, arrivals): (Vec<String>, Vec<Vec<f64>>) = all.into_iter().unzip();
            let skew = arrival_skew(&arrivals);
            if !skew.is_empty() {
                parts.push(skew);
            }
            parts
        }))
    }

    fn us(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.origin).as_secs_f64() * 1e6 + self.offset_us
    }
}

fn io_error(path: &Path, source: std::io::Error) -> TrainError {
    TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Timeline {
    /// A timeline that records nothing.
    pub fn disabled() -> Timeline {
        Timeline(None)
    }

    /// Whether events are recorded.
    pub fn is_enabled(&self) -> bool {
        self.0.is_some()
    }

    /// Starts recording on every rank of `comm` (collective): aligns the ranks' clocks to rank 0's.
    /// Write the events with [`Timeline::write`].
    pub fn start(comm: &Communicator) -> Result<Timeline> {
        Self::start_at(comm, None)
    }

    /// [`Timeline::start`], the file to be written by [`Timeline::finish`] being `path`. Rank 0
    /// creates it now, so that an unwritable path fails here, on every rank, naming the file.
    pub fn create(comm: &Communicator, path: impl AsRef<Path>) -> Result<Timeline> {
        let path = path.as_ref();
        let failed = (comm.rank() == 0).then(|| {
            std::fs::File::create(path)
                .err()
                .map(|e| (e.kind() == std::io::ErrorKind::NotFound, e.to_string()))
        });
        let failed: Option<(bool, String)> = comm.broadcast_object(failed, 0)?;
        if let Some((missing, reason)) = failed {
            let kind = if missing {
                std::io::ErrorKind::NotFound
            } else {
                std::io::ErrorKind::Other
            };
            return Err(io_error(
                path,
                std::io::Error::new(kind, format!("cannot write the timeline: {reason}")),
            ));
        }
        Self::start_at(comm, Some(path.to_path_buf()))
    }

    fn start_at(comm: &Communicator, path: Option<PathBuf>) -> Result<Timeline> {
        let origin = Instant::now();
        let offset_us = clock_offset(comm, origin)?;
        Ok(Timeline(Some(Arc::new(Shared {
            rank: comm.rank(),
            comm: comm.clone(),
            origin,
            offset_us,
            path,
            events: Mutex::new(Vec::new()),
            flushed: Mutex::new(Flushed::default()),
        }))))
    }

    /// This rank's clock offset to rank 0 found at the start, in µs (rank 0's clock minus this
    /// rank's, counted from when each started the timeline); 0 when disabled.
    pub fn clock_offset_us(&self) -> f64 {
        self.0.as_ref().map_or(0.0, |s| s.offset_us)
    }

    /// A span named `name` on the `main` track, from now until the guard is dropped. Disabled:
    /// nothing, not even a clock read.
    #[inline]
    pub fn span(&self, name: &'static str) -> Span<'_> {
        Span {
            on: self.0.as_deref().map(|s| (s, Instant::now())),
            name,
        }
    }

    /// Records a span of the `main` track that began at `start` and ends now (for a span whose
    /// name is only known at its end).
    pub fn record(&self, name: impl Into<Cow<'static, str>>, start: Instant) {
        if let Some(s) = self.0.as_deref() {
            s.push(Event::Span {
                name: name.into(),
                start,
                end: Instant::now(),
            });
        }
    }

    /// Now, if enabled (the start of a [`Timeline::record`]ed span).
    #[inline]
    pub fn now(&self) -> Option<Instant> {
        self.0.as_ref().map(|_| Instant::now())
    }

    pub(crate) fn bucket(&self, e: BucketEvent) {
        if let Some(s) = self.0.as_deref() {
            s.push(Event::Bucket(e));
        }
    }

    /// Events recorded so far on this rank.
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |s| {
            s.events.lock().unwrap_or_else(|p| p.into_inner()).len()
        })
    }

    /// Whether nothing has been recorded on this rank.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends the events recorded since the last flush to the path given to [`Timeline::create`]
    /// (collective: rank 0 gathers every rank's new events and writes them); the file is a complete
    /// trace afterwards. Nothing when disabled or started without a path.
    pub fn flush(&self) -> Result<()> {
        let Some(s) = self.0.as_deref() else {
            return Ok(());
        };
        let Some(path) = s.path.as_deref() else {
            return Ok(());
        };
        let mut f = s.flushed.lock().unwrap_or_else(|p| p.into_inner());
        let with_meta = !f.meta;
        let gathered = s.gather(with_meta, &mut f.queue_id)?;
        f.meta = true;
        let Some(all) = gathered else {
            return Ok(());
        };
        append(path, &all, &mut f.tail_at).map_err(|e| io_error(path, e))
    }

    /// Flushes the last events to the path given to [`Timeline::create`] (see [`Timeline::flush`]).
    pub fn finish(&self) -> Result<()> {
        self.flush()
    }

    /// Collective: every rank hands its buffered events (taken out of the buffer) to rank 0, which
    /// writes the Chrome trace of all ranks to `path`. Nothing when disabled.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let Some(s) = self.0.as_deref() else {
            return Ok(());
        };
        let mut queue_id = s.flushed.lock().unwrap_or_else(|p| p.into_inner()).queue_id;
        let Some(all) = s.gather(true, &mut queue_id)? else {
            return Ok(());
        };
        let path = path.as_ref();
        append(path, &all, &mut None).map_err(|e| io_error(path, e))
    }
}

/// Rank 0: adds the ranks' rendered `parts` to the trace at `path` over its closing bracket (at
/// `tail_at`; a new file when `None`) and closes it again, so the file is a complete trace after
/// every call.
fn append(path: &Path, parts: &[String], tail_at: &mut Option<u64>) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(tail_at.is_none())
        .open(path)?;
    let mut out = String::with_capacity(parts.iter().map(String::len).sum::<usize>() + 64);
    let mut first = match *tail_at {
        None => {
            out.push_str("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
            true
        }
        Some(at) => {
            file.seek(SeekFrom::Start(at))?;
            false
        }
    };
    for part in parts.iter().filter(|p| !p.is_empty()) {
        if !first {
            out.push_str(",\n");
        }
        out.push_str(part);
        first = false;
    }
    let at = tail_at.unwrap_or(0) + out.len() as u64;
    out.push_str(TAIL);
    file.write_all(out.as_bytes())?;
    *tail_at = Some(at);
    Ok(())
}

/// Rank 0's clock minus this rank's, µs since each rank's `origin`: rank 0 sends a ping, the rank
/// answers with its clock, and of [`CLOCK_ROUNDS`] rounds the one with the shortest round trip
/// gives the estimate (the answer is taken to be read halfway through the round trip).
fn clock_offset(comm: &Communicator, origin: Instant) -> Result<f64> {
    let (rank, size) = (comm.rank(), comm.size());
    let since = |t: Instant| t.saturating_duration_since(origin).as_secs_f64() * 1e6;
    let mut offsets = vec![0.0f64; size];
    if rank == 0 {
        for (peer, offset) in offsets.iter_mut().enumerate().skip(1) {
            let mut best = f64::INFINITY;
            for _ in 0..CLOCK_ROUNDS {
                let t0 = since(Instant::now());
                comm.send::<f64>(&[t0], peer, CLOCK_TAG)?;
                let mut theirs = [0.0f64];
                comm.recv(&mut theirs, peer, CLOCK_TAG)?;
                let t1 = since(Instant::now());
                if t1 - t0 < best {
                    best = t1 - t0;
                    *offset = (t0 + t1) / 2.0 - theirs[0];
                }
            }
        }
    } else {
        for _ in 0..CLOCK_ROUNDS {
            let mut ping = [0.0f64];
            comm.recv(&mut ping, 0, CLOCK_TAG)?;
            comm.send::<f64>(&[since(Instant::now())], 0, CLOCK_TAG)?;
        }
    }
    comm.broadcast(&mut offsets, 0)?;
    Ok(offsets[rank])
}

/// A counter track on rank 0 (`arrival skew`): for each bucket all-reduce, how long after the
/// first rank the last one arrived (µs), and which rank that was. `arrivals[r]` are rank r's
/// arrival times in bucket order; nothing unless every rank has the same number.
fn arrival_skew(arrivals: &[Vec<f64>]) -> String {
    let n = arrivals.first().map_or(0, Vec::len);
    if arrivals.len() < 2 || n == 0 || arrivals.iter().any(|a| a.len() != n) {
        return String::new();
    }
    let mut out = String::new();
    for k in 0..n {
        let at: Vec<f64> = arrivals.iter().map(|a| a[k]).collect();
        let first = at.iter().copied().fold(f64::INFINITY, f64::min);
        let (last_rank, last) =
            at.iter()
                .copied()
                .enumerate()
                .fold(
                    (0, f64::NEG_INFINITY),
                    |m, (r, t)| if t > m.1 { (r, t) } else { m },
                );
        if !out.is_empty() {
            out.push_str(",\n");
        }
        let _ = write!(
            out,
            "{{\"ph\":\"C\",\"name\":\"arrival skew\",\"pid\":0,\"ts\":{first:.3},\"args\":{{\"skew_us\":{:.3},\"last_rank\":{last_rank}}}}}",
            (last - first).max(0.0)
        );
    }
    out
}

fn json_str(out: &mut String, s: &str) {
    // serde_json's escaping of a string cannot fail.
    out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"?\"".into()));
}

/// This rank's events as comma-separated JSON objects.
/// This rank's `events` as trace JSON objects (comma-separated), after its track names when
/// `with_meta`; async slice ids continue from `queue_id`.
fn render(s: &Shared, events: &[Event], with_meta: bool, queue_id: &mut u64) -> String {
    let pid = s.rank;
    let mut out = String::new();
    let sep = |out: &mut String| {
        if !out.is_empty() {
            out.push_str(",\n");
        }
    };
    if with_meta {
        let _ = write!(
        out,
        "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{pid},\"tid\":0,\"args\":{{\"name\":\"rank {pid}\"}}}},\n\
         {{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":{pid},\"tid\":0,\"args\":{{\"sort_index\":{pid}}}}},\n\
         {{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{pid},\"tid\":0,\"args\":{{\"name\":\"main\"}}}},\n\
         {{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{pid},\"tid\":1,\"args\":{{\"name\":\"comm\"}}}}"
        );
    }
    for e in events {
        sep(&mut out);
        match e {
            Event::Span { name, start, end } => {
                let (ts, end) = (s.us(*start), s.us(*end));
                out.push_str("{\"ph\":\"X\",\"name\":");
                json_str(&mut out, name);
                let _ = write!(
                    out,
                    ",\"cat\":\"compute\",\"pid\":{pid},\"tid\":0,\"ts\":{ts:.3},\"dur\":{:.3}",
                    (end - ts).max(0.0)
                );
                out.push('}');
            }
            Event::Bucket(b) => {
                // A complete event on the comm track while the worker ran it (when known), and an
                // async slice from launch to completion.
                let launched = s.us(b.launched);
                let done = b
                    .times
                    .and_then(|t| t.completed)
                    .map_or(s.us(b.waited), |t| s.us(t));
                let queued = b
                    .times
                    .and_then(|t| t.started)
                    .map(|t| (s.us(t) - launched).max(0.0));
                let mut args = format!("{{\"bucket\":{},\"bytes\":{},", b.bucket, b.bytes);
                if let Some(w) = b.wire_bytes {
                    let _ = write!(args, "\"wire_bytes\":{w},");
                }
                args.push_str("\"hook\":");
                json_str(&mut args, &b.hook);
                if let Some(q) = queued {
                    let _ = write!(args, ",\"queued_us\":{q:.3}");
                }
                let _ = write!(args, ",\"wait_end_us\":{:.3}}}", s.us(b.waited));
                if let Some(WorkTimes {
                    started: Some(a),
                    completed: Some(z),
                }) = b.times
                {
                    let ts = s.us(a);
                    let _ = writeln!(
                        out,
                        "{{\"ph\":\"X\",\"name\":\"allreduce\",\"cat\":\"comm\",\"pid\":{pid},\"tid\":1,\"ts\":{ts:.3},\"dur\":{:.3},\"args\":{args}}},",
                        (s.us(z) - ts).max(0.0)
                    );
                }
                *queue_id += 1;
                let id = (pid as u64) << 32 | *queue_id;
                let _ = write!(
                    out,
                    "{{\"ph\":\"b\",\"name\":\"bucket {}\",\"cat\":\"bucket\",\"id\":{id},\"pid\":{pid},\"tid\":1,\"ts\":{launched:.3},\"args\":{args}}},\n\
                     {{\"ph\":\"e\",\"name\":\"bucket {}\",\"cat\":\"bucket\",\"id\":{id},\"pid\":{pid},\"tid\":1,\"ts\":{:.3}}}",
                    b.bucket,
                    b.bucket,
                    done.max(launched)
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::arrival_skew;

    #[test]
    fn arrival_skew_names_the_last_rank_of_each_bucket() {
        let out = arrival_skew(&[vec![10.0, 50.0], vec![13.5, 40.0], vec![11.0, 41.0]]);
        let events: Vec<serde_json::Value> = out
            .split(",\n")
            .map(|e| serde_json::from_str(e).expect("an event"))
            .collect();
        let got: Vec<(f64, f64, u64)> = events
            .iter()
            .map(|e| {
                let a = &e["args"];
                (
                    e["ts"].as_f64().unwrap_or(-1.0),
                    a["skew_us"].as_f64().unwrap_or(-1.0),
                    a["last_rank"].as_u64().unwrap_or(9),
                )
            })
            .collect();
        assert_eq!(got, [(10.0, 3.5, 1), (40.0, 10.0, 0)]);
        // Ranks that reduced different numbers of buckets (join): no track.
        assert!(arrival_skew(&[vec![1.0], vec![1.0, 2.0]]).is_empty());
        assert!(arrival_skew(&[vec![1.0]]).is_empty());
    }
}
