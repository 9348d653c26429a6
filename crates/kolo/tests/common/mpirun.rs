//! Running this test binary's ignored entry points as the ranks of an `mpirun` job (also included
//! by kolo-ddp's DDP test).
#![allow(dead_code)]

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The longest one `mpirun` job of these tests may take. Past it the job is ended — SIGTERM to
/// its process group (mpirun and the ranks it started), SIGKILL 5 s later — and reported as
/// timed out with what it printed, so a hung job fails its test at once instead of hanging it.
pub const JOB_LIMIT: Duration = Duration::from_secs(120);

/// What `mpirun` printed and how it ended.
pub struct MpiRun {
    pub success: bool,
    pub text: String,
    pub elapsed: Duration,
    /// Ended for running past [`JOB_LIMIT`].
    pub timed_out: bool,
}

/// Runs the ignored test `test` of this test binary as `n` ranks under `mpirun`, with `env` set.
pub fn mpirun_with(n: usize, test: &str, env: &[(&str, &str)]) -> MpiRun {
    let exe = std::env::current_exe().expect("test binary");
    let started = Instant::now();
    let mut cmd = std::process::Command::new("mpirun");
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-n",
        &n.to_string(),
    ])
    .arg(&exe)
    .args([
        test,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env_remove("RANK")
    .env_remove("WORLD_SIZE")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .process_group(0);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .expect("mpirun (Debian: apt-get install openmpi-bin libopenmpi-dev)");
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    // The job's process group (mpirun's id), signalled with kill(1): no libc in every test
    // crate that includes this file.
    let group = format!("-{}", child.id());
    let signal = |sig: &str| {
        let _ = std::process::Command::new("kill")
            .args([sig, "--", &group])
            .status();
    };
    let mut timed_out = false;
    let mut ranks_gone = None;
    let success = loop {
        if let Some(status) = child.try_wait().expect("wait for mpirun") {
            break status.success();
        }
        let waited = started.elapsed();
        // Open MPI 4.1's mpirun can hang after its ranks have exited, their processes unreaped
        // (seen once in the suite: all ranks zombies, mpirun in a futex wait). Their own exit
        // codes say how the job went; give mpirun 3 s to reap them, then end it.
        match exited_children(child.id()) {
            Some(codes) => {
                let since = *ranks_gone.get_or_insert(waited);
                if waited - since > Duration::from_secs(3) {
                    signal("-KILL");
                    let _ = child.wait();
                    break codes.iter().all(|&c| c == 0);
                }
            }
            None => ranks_gone = None,
        }
        if waited > JOB_LIMIT + Duration::from_secs(5) {
            signal("-KILL");
        } else if waited > JOB_LIMIT && !timed_out {
            timed_out = true;
            signal("-TERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut text = format!(
        "{}{}",
        String::from_utf8_lossy(&stdout.join().unwrap_or_default()),
        String::from_utf8_lossy(&stderr.join().unwrap_or_default())
    );
    if timed_out {
        text.push_str(&format!(
            "\n[mpirun -n {n} {test} ended after {JOB_LIMIT:?}: hung]\n"
        ));
    }
    MpiRun {
        success: success && !timed_out,
        text,
        elapsed: started.elapsed(),
        timed_out,
    }
}

/// The exit codes (as `waitpid` gives them) of the children of process `pid` where it has some and
/// every one has exited without being reaped (a zombie); `None` otherwise.
pub fn exited_children(pid: u32) -> Option<Vec<i64>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut children = Vec::new();
    for task in tasks.flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).ok()?;
        children.extend(list.split_whitespace().map(str::to_owned));
    }
    if children.is_empty() {
        return None;
    }
    let mut codes = Vec::new();
    for c in children {
        let stat = std::fs::read_to_string(format!("/proc/{c}/stat")).ok()?;
        // After the command's closing parenthesis: the state, then fields 4 to 52 (exit_code).
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        if fields.first() != Some(&"Z") {
            return None;
        }
        codes.push(fields.last()?.parse().ok()?);
    }
    Some(codes)
}

/// Runs the ignored test `test` of this test binary as `n` ranks under `mpirun` and fails with its
/// output unless every rank passes.
pub fn mpirun(n: usize, test: &str) {
    let run = mpirun_with(n, test, &[]);
    assert!(run.success, "mpirun -n {n} {test} failed:\n{}", run.text);
    // The ranks share one pipe and libtest writes "test result: ", "ok" and ". 1 passed; 0
    // failed; ..." separately, so another rank's output may land in between: count the part that
    // is written at once.
    let passed = run.text.matches("1 passed; 0 failed").count();
    assert_eq!(
        passed, n,
        "mpirun -n {n} {test}: expected {n} ranks to pass:\n{}",
        run.text
    );
}
