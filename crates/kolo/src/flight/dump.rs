//! Writing the flight record: where (`KOLO_TRACE_DIR`), when (a world's first failure, `SIGUSR1`,
//! on demand) and how (one JSON file per rank, written whole: a temporary file renamed).
//!
//! The worlds made by `kolo::init` are watched by one thread per process, started with the first:
//! it writes every watched world's record on `SIGUSR1`, and a world's record once its transport
//! reports a failure that no call has seen yet — a rank stuck in its own code when its peers
//! abort still leaves its record (its last operation and where it was called from).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once, Weak};
use std::time::Duration;

use super::{clock, registry, FlightDump, FlightRecorder};

/// A world the watcher looks after (implemented by the world communicator).
pub(crate) trait Watched: Send + Sync {
    /// The world's recorder.
    fn recorder(&self) -> &Arc<FlightRecorder>;
    /// A failure of the world's transport, if it has one.
    fn transport_failure(&self) -> Option<String>;
}

/// A watched world: the communicator and its job.
struct Entry {
    world: Weak<dyn Watched>,
    job: String,
}

static WATCHED: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
static START: Once = Once::new();
/// Whether another SIGUSR1 handler writes more of the record (Python's stacks, by faulthandler):
/// then a record written for a failure raises SIGUSR1 too, and the watcher does not write the
/// record again for that signal.
static SIGNAL_ON_FAILURE: AtomicBool = AtomicBool::new(false);
static SELF_RAISED: AtomicBool = AtomicBool::new(false);

/// Has every record written for a failure raise SIGUSR1 in this process too, for another handler
/// that writes more of it (the Python package's, which has faulthandler write Python's stacks).
pub fn signal_on_failure(on: bool) {
    SIGNAL_ON_FAILURE.store(on, Ordering::Release);
}

/// After a record written for a failure: SIGUSR1 for the other handlers, if asked.
fn raise_for_others() {
    if SIGNAL_ON_FAILURE.load(Ordering::Acquire) {
        SELF_RAISED.store(true, Ordering::Release);
        // SAFETY: raise has no memory effects; the handlers registered for SIGUSR1 are
        // signal-hook's (a flag) and faulthandler's (async-signal-safe writes).
        unsafe { libc::raise(libc::SIGUSR1) };
    }
}

/// Where the records go: `KOLO_TRACE_DIR`, else `$TMPDIR/kolo-trace-<job>`, the job being the
/// launcher's (`KOLO_JOB_ID` from `kolo run`, `TORCHELASTIC_RUN_ID` from torchrun), else that of
/// the first world `kolo::init` made, else the process id.
pub fn trace_dir() -> PathBuf {
    let env = kolo_core::settings::ProcessEnv;
    let job = ["KOLO_JOB_ID", "TORCHELASTIC_RUN_ID"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|j| !j.is_empty()))
        .or_else(|| {
            let w = WATCHED.lock().unwrap_or_else(|p| p.into_inner());
            w.first().map(|e| e.job.clone())
        })
        .unwrap_or_else(|| format!("pid{}", std::process::id()));
    kolo_core::settings::trace_dir(&env, &job)
}

/// Watches `world` (made by `kolo::init` for job `job`): its record is written on its first
/// failure and on `SIGUSR1`.
pub(crate) fn watch(world: Weak<dyn Watched>, job: &str) {
    {
        let mut w = WATCHED.lock().unwrap_or_else(|p| p.into_inner());
        w.retain(|e| e.world.strong_count() > 0);
        w.push(Entry {
            world,
            job: job.to_string(),
        });
    }
    START.call_once(|| {
        let usr1 = Arc::new(AtomicBool::new(false));
        // Without the handler, SIGUSR1 keeps its default action; the watcher still writes failures.
        let _ = signal_hook::flag::register(libc::SIGUSR1, usr1.clone());
        let _ = std::thread::Builder::new()
            .name("kolo-flight".into())
            .spawn(move || watcher(&usr1));
    });
}

/// The live watched worlds, in the order they were made, with their jobs.
fn watched_jobs() -> Vec<(Arc<dyn Watched>, String)> {
    let mut w = WATCHED.lock().unwrap_or_else(|p| p.into_inner());
    w.retain(|e| e.world.strong_count() > 0);
    w.iter()
        .filter_map(|e| e.world.upgrade().map(|a| (a, e.job.clone())))
        .collect()
}

fn watched() -> Vec<Arc<dyn Watched>> {
    watched_jobs().into_iter().map(|(w, _)| w).collect()
}

fn watcher(usr1: &AtomicBool) {
    loop {
        std::thread::sleep(Duration::from_millis(100));
        if usr1.swap(false, Ordering::AcqRel) && !SELF_RAISED.swap(false, Ordering::AcqRel) {
            // One record holds every watched world of the process.
            if let Some(w) = watched().first() {
                report(write_dump(w.recorder(), "SIGUSR1"));
            }
        }
        for w in watched() {
            for rec in registry::of(Some(w.recorder().world)) {
                rec.stamp_running();
            }
            if let Some(f) = w.transport_failure() {
                if w.recorder().claim_failure_dump() {
                    w.recorder().note_error(&f);
                    report(write_dump(w.recorder(), &f));
                    raise_for_others();
                }
            }
        }
    }
}

/// Called by a communicator on its first failure: writes its world's record (once), if the world
/// is watched or `KOLO_TRACE_DIR` is set (worlds of threads in tests write nothing unasked).
pub(crate) fn on_failure(rec: &Arc<FlightRecorder>, reason: &str) {
    if let Some(world) = failure_world(rec) {
        if world.claim_failure_dump() {
            report(write_dump(&world, reason));
            raise_for_others();
        }
    }
}

/// The recorder whose dump holds `rec`'s world on a failure: the watched world's, else `rec`'s
/// own where `KOLO_TRACE_DIR` asks for records, else none.
fn failure_world(rec: &FlightRecorder) -> Option<Arc<FlightRecorder>> {
    let asked = std::env::var_os("KOLO_TRACE_DIR").is_some_and(|d| !d.is_empty());
    match watched().iter().find(|w| w.recorder().world == rec.world) {
        Some(w) => Some(w.recorder().clone()),
        None if asked => registry::of(Some(rec.world))
            .into_iter()
            .find(|r| std::ptr::eq(&**r, rec)),
        None => None,
    }
}

/// Called when a failed collective has been recorded as such (its exact start, its end): the
/// record written at the failure, which saw it running, is written once more, complete.
pub(crate) fn after_failed_op(rec: &FlightRecorder) {
    if let Some(world) = failure_world(rec) {
        if world.claim_redump() {
            let reason = world.first_error().unwrap_or_else(|| "failure".into());
            if let Err(e) = write_dump(&world, &reason) {
                eprintln!("kolo: could not write the flight record: {e}");
            }
        }
    }
}

fn report(r: std::io::Result<PathBuf>) {
    static ONCE: AtomicBool = AtomicBool::new(false);
    match r {
        Ok(path) => {
            if !ONCE.swap(true, Ordering::AcqRel) {
                let dir = path.parent().unwrap_or(Path::new("."));
                eprintln!(
                    "kolo: flight record written to {}; `kolo diagnose {}` tells which rank stopped where",
                    path.display(),
                    dir.display()
                );
            }
        }
        Err(e) => eprintln!("kolo: could not write the flight record: {e}"),
    }
}

/// Writes the record of `world`'s rank (the world's communicators: `world` and its sub-groups)
/// as `rank-R.json` in [`trace_dir`]; returns the file's path.
pub(crate) fn write_dump(world: &Arc<FlightRecorder>, reason: &str) -> std::io::Result<PathBuf> {
    let dump = collect(world, reason);
    let dir = trace_dir();
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("rank-{}.json", dump.rank));
    // A name of its own per write: two threads of a process may write the record at once (the
    // failed collective's rewrite and a SIGUSR1 request, say); the last rename wins, whole.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(
        ".rank-{}.json.{}.{n}",
        dump.rank,
        std::process::id()
    ));
    let text = serde_json::to_string_pretty(&dump).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// The record of `world`'s rank now: `world` and its groups; for a world made by `kolo::init`,
/// every such world of the process (torch's process groups, a second `init`), under the first
/// one's rank.
pub(crate) fn collect(world: &Arc<FlightRecorder>, reason: &str) -> FlightDump {
    let watched = watched_jobs();
    let worlds: Vec<(usize, String)> = if watched
        .iter()
        .any(|(w, _)| w.recorder().world == world.world)
    {
        watched
            .iter()
            .map(|(w, job)| (w.recorder().world, job.clone()))
            .collect()
    } else {
        vec![(world.world, String::new())]
    };
    let head = watched
        .iter()
        .map(|(w, _)| w.recorder().clone())
        .find(|r| worlds.first().is_some_and(|(k, _)| *k == r.world))
        .unwrap_or_else(|| world.clone());
    let mut recs: Vec<(usize, Arc<FlightRecorder>)> = registry::of(None)
        .into_iter()
        .filter_map(|r| {
            worlds
                .iter()
                .position(|(k, _)| *k == r.world)
                .map(|i| (i, r))
        })
        .collect();
    // World by world; in each the world first (the largest group), then its sub-groups.
    recs.sort_by_key(|(i, r)| (*i, std::cmp::Reverse(r.members.len())));
    let size = recs
        .iter()
        .filter(|(i, _)| *i == 0)
        .map(|(_, r)| r.members.len())
        .max()
        .unwrap_or(1);
    FlightDump {
        version: 1,
        rank: head.world_rank,
        size,
        host: kolo_core::host::hostname().unwrap_or_default(),
        pid: std::process::id(),
        reason: reason.to_string(),
        dumped_at: clock::unix(clock::now()).unwrap_or(0.0),
        python_stack: None,
        groups: recs
            .iter()
            .map(|(i, r)| {
                let mut g = r.record();
                g.world = worlds[*i].1.clone();
                g
            })
            .collect(),
    }
}
