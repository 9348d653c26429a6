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

static WATCHED: Mutex<Vec<Weak<dyn Watched>>> = Mutex::new(Vec::new());
static START: Once = Once::new();
static JOB: Mutex<Option<String>> = Mutex::new(None);

/// Where the records go: `KOLO_TRACE_DIR`, else `$TMPDIR/kolo-trace-<job>` (the job id of the
/// first world made by `kolo::init`, else the process id).
pub fn trace_dir() -> PathBuf {
    let job = JOB
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .unwrap_or_else(|| format!("pid{}", std::process::id()));
    kolo_core::settings::trace_dir(&kolo_core::settings::ProcessEnv, &job)
}

/// Watches `world` (made by `kolo::init` for job `job`): its record is written on its first
/// failure and on `SIGUSR1`.
pub(crate) fn watch(world: Weak<dyn Watched>, job: &str) {
    JOB.lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(|| job.to_string());
    {
        let mut w = WATCHED.lock().unwrap_or_else(|p| p.into_inner());
        w.retain(|w| w.strong_count() > 0);
        w.push(world);
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

fn watched() -> Vec<Arc<dyn Watched>> {
    let mut w = WATCHED.lock().unwrap_or_else(|p| p.into_inner());
    w.retain(|w| w.strong_count() > 0);
    w.iter().filter_map(Weak::upgrade).collect()
}

fn watcher(usr1: &AtomicBool) {
    loop {
        std::thread::sleep(Duration::from_millis(100));
        if usr1.swap(false, Ordering::AcqRel) {
            for w in watched() {
                report(write_dump(w.recorder(), "SIGUSR1"));
            }
        }
        for w in watched() {
            if let Some(f) = w.transport_failure() {
                if w.recorder().claim_failure_dump() {
                    w.recorder().note_error(&f);
                    report(write_dump(w.recorder(), &f));
                }
            }
        }
    }
}

/// Called by a communicator on its first failure: writes its world's record (once), if the world
/// is watched or `KOLO_TRACE_DIR` is set (worlds of threads in tests write nothing unasked).
pub(crate) fn on_failure(rec: &Arc<FlightRecorder>, reason: &str) {
    let asked = std::env::var_os("KOLO_TRACE_DIR").is_some_and(|d| !d.is_empty());
    let watched = watched()
        .iter()
        .find(|w| w.recorder().world == rec.world)
        .cloned();
    let world = match &watched {
        Some(w) => w.recorder(),
        None if asked => rec,
        None => return,
    };
    if world.claim_failure_dump() {
        report(write_dump(world, reason));
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
    let tmp = dir.join(format!(".rank-{}.json.{}", dump.rank, std::process::id()));
    let text = serde_json::to_string_pretty(&dump).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// The record of `world`'s rank now.
pub(crate) fn collect(world: &Arc<FlightRecorder>, reason: &str) -> FlightDump {
    let mut recs = registry::of(Some(world.world));
    // The world first (the largest group), then the sub-groups in creation order.
    recs.sort_by_key(|r| std::cmp::Reverse(r.members.len()));
    let size = recs.iter().map(|r| r.members.len()).max().unwrap_or(1);
    FlightDump {
        version: 1,
        rank: world.world_rank,
        size,
        host: kolo_core::host::hostname().unwrap_or_default(),
        pid: std::process::id(),
        reason: reason.to_string(),
        dumped_at: clock::unix(clock::now()).unwrap_or(0.0),
        groups: recs.iter().map(|r| r.record()).collect(),
    }
}
