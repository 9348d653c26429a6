//! `kolo diagnose`: read the ranks' flight records together and say what happened.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use clap::Args;
use kolo::flight::{analysis, FlightDump};

use super::error::CliError;

pub const LONG_ABOUT: &str = "\
Read the flight records of a job's ranks (rank-R.json, one per rank) and say in one screen what \
happened: the collective the job stopped in, which ranks never entered it and where they were \
instead (their last operation and its source line), which waited and how long, calls the ranks \
disagree on, ranks that left no record (a dead process or host), and which ranks arrive last at \
the collectives they all entered (stragglers: p50/p99 arrival skew).

Every rank keeps a record of its last operations (KOLO_FLIGHT_RECORDS, 2,048 of each kind) and \
writes it to KOLO_TRACE_DIR (default: $TMPDIR/kolo-trace-<job id>) when its job fails, on \
SIGUSR1, and when the program asks (Communicator::dump_flight_record, \
kolo.torch.dump_flight_record()). After a failure `kolo run` prints the directory.

With --live PID (a running `kolo run`, or one worker), kolo diagnose sends it SIGUSR1 (kolo run \
passes it to its workers), waits for the fresh records and reads them: a job that hangs can be \
looked at without stopping it.";

/// `kolo diagnose` options.
#[derive(Debug, Args)]
pub struct DiagnoseArgs {
    /// The directory of the records (default: KOLO_TRACE_DIR; with --live, the job's)
    dir: Option<PathBuf>,
    /// Ask a running job for its records first: the pid of its `kolo run` (or of a worker)
    #[arg(long, value_name = "PID")]
    live: Option<u32>,
    /// Seconds to wait for the records with --live
    #[arg(long, default_value = "5")]
    wait: f64,
}

pub fn execute(args: DiagnoseArgs) -> ExitCode {
    super::finish("diagnose", run(&args))
}

fn run(args: &DiagnoseArgs) -> Result<ExitCode, CliError> {
    let asked = SystemTime::now();
    let dir =
        match (&args.dir, args.live) {
            (Some(d), _) => d.clone(),
            (None, Some(pid)) => job_dir(pid)?,
            (None, None) => match std::env::var_os("KOLO_TRACE_DIR") {
                Some(d) if !d.is_empty() => PathBuf::from(d),
                _ => return Err(CliError::Failed(
                    "which records? give their directory (kolo run prints it after a failure), \
                     set KOLO_TRACE_DIR, or ask a running job with --live PID"
                        .into(),
                )),
            },
        };
    if let Some(pid) = args.live {
        let expect = workers_of(pid).len().max(1);
        // SAFETY: kill with a checked pid and a valid signal number has no memory effects.
        if unsafe { libc::kill(pid as libc::pid_t, libc::SIGUSR1) } != 0 {
            return Err(CliError::Failed(format!(
                "cannot signal process {pid}: {}",
                std::io::Error::last_os_error()
            )));
        }
        let deadline = Instant::now() + Duration::from_secs_f64(args.wait.max(0.1));
        while kolo_core::settings::fresh_flight_records(&dir, asked) < expect
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let (dumps, bad) = read_dir(&dir)?;
    for (path, why) in &bad {
        eprintln!("kolo diagnose: skipping {}: {why}", path.display());
    }
    if dumps.is_empty() {
        return Err(CliError::Failed(format!(
            "no flight records (rank-R.json) in {}",
            dir.display()
        )));
    }
    println!("Flight records in {}", dir.display());
    print!("{}", analysis::diagnose(&dumps));
    Ok(ExitCode::SUCCESS)
}

/// Files that look like records but do not read as one, with why.
type Unread = Vec<(PathBuf, String)>;

/// Every record in `dir`, and the files that are not records.
fn read_dir(dir: &Path) -> Result<(Vec<FlightDump>, Unread), CliError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| CliError::Failed(format!("cannot read {}: {e}", dir.display())))?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| is_record(p))
        .collect();
    paths.sort();
    let mut dumps = Vec::new();
    let mut bad = Vec::new();
    for p in paths {
        match std::fs::read_to_string(&p)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<FlightDump>(&t).map_err(|e| e.to_string()))
        {
            Ok(mut d) => {
                // A Python program's stacks, written by faulthandler on SIGUSR1 beside the record.
                let py = p.with_file_name(format!("rank-{}.py.txt", d.rank));
                if let Ok(text) = std::fs::read_to_string(py) {
                    d.python_stack = analysis::python_main_stack(&text);
                }
                dumps.push(d)
            }
            Err(why) => bad.push((p, why)),
        }
    }
    Ok((dumps, bad))
}

fn is_record(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(kolo_core::settings::is_flight_record)
}

/// The children of `pid` (a `kolo run`'s workers), or none.
fn workers_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// Variable `name` of process `pid`.
fn env_of(pid: u32, name: &str) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|b| *b == 0).find_map(|kv| {
        let kv = String::from_utf8_lossy(kv);
        kv.strip_prefix(name)
            .and_then(|r| r.strip_prefix('='))
            .map(str::to_string)
    })
}

/// Where the job of `pid` (a `kolo run` or a worker) writes its records: its workers' (or its own)
/// KOLO_TRACE_DIR, else the default for their KOLO_JOB_ID.
fn job_dir(pid: u32) -> Result<PathBuf, CliError> {
    if !Path::new(&format!("/proc/{pid}")).exists() {
        return Err(CliError::Failed(format!(
            "--live {pid}: no such process (give the pid of the job's `kolo run` or of a worker)"
        )));
    }
    let mut procs = workers_of(pid);
    procs.push(pid);
    for p in procs {
        if let Some(d) = env_of(p, "KOLO_TRACE_DIR").filter(|d| !d.is_empty()) {
            return Ok(PathBuf::from(d));
        }
        if let Some(job) = env_of(p, "KOLO_JOB_ID") {
            let none: kolo_core::settings::MapEnv =
                std::iter::empty::<(String, String)>().collect();
            return Ok(kolo_core::settings::trace_dir(&none, &job));
        }
    }
    Err(CliError::Failed(format!(
        "cannot tell where the job of process {pid} writes its records (no KOLO_JOB_ID or \
         KOLO_TRACE_DIR in its or its children's environment): give the directory"
    )))
}
