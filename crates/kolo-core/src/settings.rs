//! kolo's settings: the one table of every `KOLO_*` variable (name, default, meaning) and the one
//! way they are read, an [`Env`] that is either the process environment ([`ProcessEnv`]) or, in
//! tests, a map ([`MapEnv`]) or a closure.
//!
//! The constructors that read settings (`Config::from_lookup`, `InitOptions::from_lookup`,
//! `ShmOptions::from_lookup`, …) take an [`Env`]; their `from_env` forms pass [`ProcessEnv`].
//! The book's settings chapter (`docs/src/settings.md`) shows [`markdown_table`] of [`SETTINGS`]
//! (a test checks it).

use std::collections::HashMap;
use std::ffi::OsString;

/// Where settings are read from.
pub trait Env {
    /// The value of variable `name`, or `None` where it is unset (or, in the process environment,
    /// not Unicode).
    fn lookup(&self, name: &str) -> Option<String>;

    /// The value of variable `name` as the operating system has it (for paths and secrets).
    fn lookup_os(&self, name: &str) -> Option<OsString> {
        self.lookup(name).map(OsString::from)
    }
}

/// The process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn lookup(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }

    fn lookup_os(&self, name: &str) -> Option<OsString> {
        std::env::var_os(name)
    }
}

/// Variables from a map, for tests.
#[derive(Debug, Clone, Default)]
pub struct MapEnv(pub HashMap<String, String>);

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for MapEnv {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        MapEnv(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
}

impl Env for MapEnv {
    fn lookup(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned()
    }
}

impl<F: Fn(&str) -> Option<String>> Env for F {
    fn lookup(&self, name: &str) -> Option<String> {
        self(name)
    }
}

/// One setting: its variable, its default and what it means (as the book's settings table shows
/// them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The environment variable.
    pub name: &'static str,
    /// The default, as the table shows it.
    pub default: &'static str,
    /// What it does.
    pub meaning: &'static str,
}

const fn s(name: &'static str, default: &'static str, meaning: &'static str) -> Setting {
    Setting {
        name,
        default,
        meaning,
    }
}

/// `s` with anything but ASCII letters, digits, `-` and `_` replaced by `_`: a job id made fit for
/// a file or segment name.
pub fn file_name_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Where the ranks of job `job` write their flight records: `KOLO_TRACE_DIR` if set, else
/// `kolo-trace-<job>` in the temporary directory (the job id with anything but letters, digits,
/// `-` and `_` replaced by `_`). The launcher looks there too.
pub fn trace_dir(env: &dyn Env, job: &str) -> std::path::PathBuf {
    if let Some(d) = env.lookup_os("KOLO_TRACE_DIR").filter(|d| !d.is_empty()) {
        return d.into();
    }
    let safe = file_name_safe(job);
    std::env::temp_dir().join(format!("kolo-trace-{safe}"))
}

/// Whether a file name is a rank's flight record (`rank-R.json`).
pub fn is_flight_record(name: &str) -> bool {
    name.starts_with("rank-") && name.ends_with(".json")
}

/// How many flight records in `dir` were written at or after `since` (0 if `dir` cannot be read).
pub fn fresh_flight_records(dir: &std::path::Path, since: std::time::SystemTime) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .filter(|e| is_flight_record(&e.file_name().to_string_lossy()))
            .filter(|e| {
                e.metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t >= since)
            })
            .count()
    })
}

/// Every `KOLO_*` variable kolo reads (or, for `KOLO_CPUS`, sets for its workers).
pub const SETTINGS: &[Setting] = &[
    s("KOLO_TIMEOUT", "`300`", "seconds an operation may wait for a peer before it fails with `Error::Timeout`"),
    s("KOLO_FLIGHT_RECORDS", "`2048`", "operations of each kind (collective, point-to-point) every communicator's flight recorder keeps, rounded up to a power of two (`0`: none)"),
    s("KOLO_TRACE_DIR", "`$TMPDIR/kolo-trace-<job>`", "where each rank writes its flight record (`rank-R.json`) on a failure, on `SIGUSR1` and on demand; `kolo diagnose DIR` reads them"),
    s("KOLO_ALGO_ALLREDUCE", "cost model", "force `ring`, `recursive_doubling`, `halving_doubling` or `tree`"),
    s("KOLO_CONFIRM_CALLS", "`1`", "`0` skips the fingerprint step every collective on shared memory (and on MPI) starts with; only for measuring what it costs"),
    s("KOLO_LISTEN_ADDR", "chosen", "the address the TCP transport listens on"),
    s("KOLO_ADVERTISE_ADDR", "chosen", "the address the TCP transport tells peers"),
    s("KOLO_NODE_ID", "`NODE_RANK` or host name", "ranks with the same id count as one node (`local_rank`, shared memory)"),
    s("KOLO_TRANSPORT", "`auto`", "`auto`: shared memory between ranks of a node, TCP between nodes; `tcp`: TCP everywhere; `shm`: shared memory only (all ranks on one node, else an error)"),
    s("KOLO_SHM_RING_BYTES", "1 MiB to 256 KiB", "bytes of each pair's shared-memory ring; by default 1 MiB for up to 4 ranks on a host, less from 5 (the n(n−1) rings within 16 MiB together), 256 KiB from 9; every rank must use the same"),
    s("KOLO_SHM_BUFFER_BYTES", "1 MiB", "bytes of each of a rank's two shared buffers (the all-reduce chunk)"),
    s("KOLO_SHM_SPIN_US", "1000", "how long a waiting rank polls (yielding its core after the first microseconds) before it sleeps on its futex, at least: doubled, up to 16 times, while its sleeps turn out short"),
    s("KOLO_SHM_SINGLE_COPY_BYTES", "16777216", "sends of at least this many bytes to a rank of the same host (kolo.MPI's `Send`/`Isend`, `Communicator::send_in_place`, collectives' segments from their own thresholds) are copied once, by the receiver straight from the sender's memory (process_vm_readv), and complete when it has; smaller ones stream through the ring, which two ranks with a core each copy through faster; 0: every send goes through the ring"),
    s("KOLO_HEARTBEAT_TIMEOUT", "`6`", "seconds a shared-memory peer's heartbeat may stand still before the peer counts as lost (`0`: no heartbeats)"),
    s("KOLO_INIT_METHOD", "from the launcher's variables", "explicit rendezvous: `tcp://HOST:PORT`, `c10d://HOST:PORT` or `file:///PATH`, with `RANK` and `WORLD_SIZE`"),
    s("KOLO_AGENT_STORE", "unset", "`1`: the launcher hosts the rendezvous store (rank 0 must not start one); set by `kolo run`"),
    s("KOLO_JOB_ID", "torchrun's or Slurm's job id, else `kolo`", "the job's id (`kolo run` sets a fresh random one per launch)"),
    s("KOLO_RESTART_COUNT", "`0`", "how often the launcher restarted the worker group (set by `kolo run`)"),
    s("KOLO_WORKER_RESTART", "unset", "`kolo run --restart-workers`: how many workers the launcher had restarted alone when it started this one"),
    s("KOLO_JOB_SECRET", "none", "the job's shared secret for authenticating connections (`kolo run` generates one per job)"),
    s("KOLO_BIND", "`cores`", "`kolo run`/`train`/`bench`: `cores` binds each worker to its own block of CPUs, `none` does not"),
    s("KOLO_CPUS", "set by `kolo run`", "the CPUs a bound worker may run on"),
    s("KOLO_SSH", "`ssh -o BatchMode=yes`", "the command `kolo run` starts the other hosts' launchers with"),
    s("KOLO_BACKEND", "`auto`", "`auto`: MPI under `mpirun`/`srun` when built with the `mpi` feature, else kolo's; `kolo`; `mpi`; `nccl` (collectives on NCCL, one process per GPU; `mpi` and `nccl` are errors in a build without their feature)"),
    s("KOLO_CUDA_DEVICE", "the local rank (GPU 0 for a rank that sees one GPU through `CUDA_VISIBLE_DEVICES`)", "the GPU this rank uses with `KOLO_BACKEND=nccl` and `kolo train --device cuda`"),
    s("KOLO_NCCL_LIBRARY", "`libnccl.so.2` from the loader's path", "the NCCL library `KOLO_BACKEND=nccl` loads (a path or a name)"),
    s("KOLO_MPI_HALF", "`op`", "f16/bf16 reductions on MPI: `op` (user-defined MPI operators on the 16-bit values) or `convert` (to f32 and back)"),
    s("KOLO_MPIRUN", "`mpirun`", "the launcher `--backend mpi` runs"),
    s("KOLO_MPIRUN_ARGS", "none", "options added to that launcher (hosts, binding)"),
    s("KOLO_BF16_GEMM", "`amx` where the CPU has AMX, else `avx512bf16` where that unit multiplies at least 1.25× as fast as the f32 FMAs (timed once per process), else `f32` (and `--precision bf16` then computes in f32)", "the unit of the bf16 matrix product (`kolo_nn::ops::matmul_bf16`, and f32 products under `set_matmul_precision(Bf16)` / `--precision bf16`): `amx`, `avx512bf16` or `f32` (`f32`: `--precision bf16` computes on bf16 tensors in f32 around conversions); one the CPU lacks is an error at the first product"),
    s("KOLO_DATA_DIR", "none", "a directory holding the training data sets, searched after `--data-dir` and before the default places"),
    s("KOLO_TRAIN_RUN_DIR", "set by `kolo train`", "the run directory the launching `kolo train` hands its workers"),
    s("KOLO_PLOT_FONT", "system fonts", "a TTF/OTF file to use for plot text"),
];

/// The setting called `name`, if kolo has one.
pub fn setting(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.name == name)
}

/// [`SETTINGS`] as a Markdown table (the book's settings chapter, `docs/src/settings.md`, shows
/// exactly this).
pub fn markdown_table() -> String {
    let mut t = String::from("| variable | default | meaning |\n|---|---|---|\n");
    for s in SETTINGS {
        t.push_str(&format!(
            "| `{}` | {} | {} |\n",
            s.name, s.default, s.meaning
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table after the marker in the book's settings chapter is exactly [`markdown_table`].
    #[test]
    fn book_settings_table_matches_the_code() {
        const MARKER: &str = "<!-- the settings table: kolo_core::settings::markdown_table() -->\n";
        let chapter = include_str!("../../../docs/src/settings.md");
        let section = chapter
            .split_once(MARKER)
            .map(|(_, rest)| rest)
            .expect("docs/src/settings.md has the settings table's marker");
        let table: String = section
            .lines()
            .take_while(|l| l.starts_with('|'))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            table,
            markdown_table(),
            "docs/src/settings.md's table differs from kolo_core::settings::SETTINGS"
        );
    }

    /// Every `"KOLO_…"` string literal in the crates' sources (tests' own names aside) is a row
    /// of [`SETTINGS`], so a variable cannot be added without its row (and the book's).
    #[test]
    fn every_variable_in_the_sources_is_in_the_table() {
        const TEST_ONLY: &[&str] = &["KOLO_TEST_VAR", "KOLO_NO_SUCH", "KOLO_TEST_NCCL"];
        fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    sources(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for krate in std::fs::read_dir(&crates).into_iter().flatten().flatten() {
            sources(&krate.path().join("src"), &mut files);
        }
        assert!(files.len() > 20, "found the crates' sources");
        let mut unknown = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            for (i, _) in text.match_indices("\"KOLO_") {
                let rest = &text[i + 1..];
                let len = rest
                    .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                    .unwrap_or(rest.len());
                let name = &rest[..len];
                if rest[len..].starts_with('"')
                    && name.len() > "KOLO_".len()
                    && !TEST_ONLY.contains(&name)
                    && setting(name).is_none()
                {
                    unknown.push(format!("{name} ({})", file.display()));
                }
            }
        }
        assert!(
            unknown.is_empty(),
            "variables missing from kolo_core::settings::SETTINGS: {unknown:?}"
        );
    }

    #[test]
    fn names_are_unique_kolo_variables() {
        let mut names: Vec<&str> = SETTINGS.iter().map(|s| s.name).collect();
        assert!(names.iter().all(|n| n.starts_with("KOLO_")));
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "a setting is listed twice");
        assert!(setting("KOLO_TIMEOUT").is_some());
        assert!(setting("KOLO_NO_SUCH").is_none());
    }

    #[test]
    fn lookups_from_a_map_a_closure_and_the_process() {
        let map: MapEnv = [("KOLO_TIMEOUT", "5")].into_iter().collect();
        assert_eq!(map.lookup("KOLO_TIMEOUT").as_deref(), Some("5"));
        assert_eq!(map.lookup_os("KOLO_TIMEOUT"), Some(OsString::from("5")));
        assert_eq!(map.lookup("KOLO_TRANSPORT"), None);
        let f = |k: &str| (k == "KOLO_TRANSPORT").then(|| "tcp".to_string());
        assert_eq!(f.lookup("KOLO_TRANSPORT").as_deref(), Some("tcp"));
        assert_eq!(
            ProcessEnv.lookup("PATH"),
            std::env::var("PATH").ok(),
            "ProcessEnv reads the process environment"
        );
    }
}
