//! End-to-end tests of `kolo run` with `sh -c` workers.

use std::collections::BTreeSet;
use std::fs;
use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

mod common;

use common::{kolo, run, stderr, stdout};
fn is_alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => match stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
        {
            Some(state) => state != "Z" && state != "X",
            None => true,
        },
        Err(_) => {
            // SAFETY: signal 0 only checks for existence.
            let rc = unsafe { libc::kill(pid, 0) };
            rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
        }
    }
}

/// Reads the pids the workers wrote to `dir/pid.RANK`.
fn worker_pids(dir: &Path) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in fs::read_dir(dir).expect("tempdir is readable") {
        let path = entry.expect("dir entry").path();
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("pid."))
        {
            let text = fs::read_to_string(&path).expect("pid file is readable");
            pids.push(text.trim().parse().expect("pid file holds a pid"));
        }
    }
    pids
}

fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `child` to exit within `timeout`, killing it (and failing) otherwise.
fn wait_with_timeout(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kolo run did not exit within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn assert_all_gone(pids: &[i32]) {
    for &pid in pids {
        assert!(!is_alive(pid), "worker pid {pid} is still alive");
    }
}

#[test]
fn four_workers_get_the_torchrun_environment() {
    let (out, _) = run(&[
        "-n",
        "4",
        "--",
        "sh",
        "-c",
        r#"echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT""#,
    ]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "stdout: {text}");
    let mut ranks = BTreeSet::new();
    let mut ports = BTreeSet::new();
    for line in lines {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields.len(), 8, "line: {line}");
        assert_eq!(fields[0], "[rank");
        let rank: usize = fields[1]
            .trim_end_matches(']')
            .parse()
            .expect("rank in prefix");
        assert_eq!(fields[2], rank.to_string(), "RANK in line {line}");
        assert_eq!(fields[3], "4", "WORLD_SIZE in line {line}");
        assert_eq!(fields[4], rank.to_string(), "LOCAL_RANK in line {line}");
        assert_eq!(fields[5], "4", "LOCAL_WORLD_SIZE in line {line}");
        assert_eq!(fields[6], "127.0.0.1", "MASTER_ADDR in line {line}");
        let port: u16 = fields[7].parse().expect("MASTER_PORT is a port");
        assert!(port > 0);
        ranks.insert(rank);
        ports.insert(port);
    }
    assert_eq!(ranks, (0..4).collect());
    assert_eq!(ports.len(), 1, "all workers see the same port");
}

#[test]
fn kolo_variables_and_extra_node_ranks() {
    let (out, _) = run(&[
        "-n",
        "2",
        "--no-prefix",
        "--",
        "sh",
        "-c",
        r#"echo "$GROUP_RANK $NODE_RANK $KOLO_AGENT_STORE $KOLO_JOB_ID""#,
    ]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "stdout: {text}");
    assert_eq!(lines[0], lines[1], "same job id for both ranks");
    let fields: Vec<&str> = lines[0].split(' ').collect();
    assert_eq!(fields[..3], ["0", "0", "1"]);
    assert_eq!(fields[3].len(), 16);
    assert!(fields[3].chars().all(|c| c.is_ascii_hexdigit()));
}

#[test]
fn output_goes_to_matching_stream_and_keeps_unterminated_lines() {
    let (out, _) = run(&[
        "-n",
        "1",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; printf 'no newline'",
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stdout(&out), "[rank 0] out\n[rank 0] no newline\n");
    assert_eq!(stderr(&out), "[rank 0] err\n");
}

#[test]
fn program_arguments_are_passed_through() {
    let (out, _) = run(&[
        "-n",
        "1",
        "--no-prefix",
        "--",
        "echo",
        "-n",
        "--flag",
        "a b",
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stdout(&out), "--flag a b\n");
}

#[test]
fn failing_worker_stops_the_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = r#"
        echo $$ > "$DIR/pid.$RANK"
        if [ "$RANK" = 2 ]; then
            while [ "$(ls "$DIR" | wc -l)" -lt 4 ]; do sleep 0.02; done
            exit 3
        fi
        sleep 30
    "#;
    let start = Instant::now();
    let out = kolo()
        .args(["run", "-n", "4", "--", "sh", "-c", script])
        .env("DIR", dir.path())
        .output()
        .expect("the kolo binary starts");
    let elapsed = start.elapsed();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "stderr: {err}");
    // Well under the default 5 s grace period: the others obeyed SIGTERM.
    assert!(elapsed < Duration::from_secs(4), "took {elapsed:?}");
    assert!(err.contains("rank 2 (pid "), "stderr: {err}");
    assert!(err.contains("failed: exit code 3"), "stderr: {err}");
    let pids = worker_pids(dir.path());
    assert_eq!(pids.len(), 4);
    assert_all_gone(&pids);
}

#[test]
fn worker_killed_by_sigkill() {
    let (out, elapsed) = run(&[
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        r#"[ "$RANK" = 1 ] && kill -9 $$; sleep 30"#,
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(137), "stderr: {err}");
    assert!(err.contains("rank 1 (pid "), "stderr: {err}");
    assert!(
        err.contains("killed by signal 9 (SIGKILL)"),
        "stderr: {err}"
    );
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
}

#[test]
fn killed_worker_is_blamed_not_the_peers_that_exit_after_it() {
    // Rank 2 is SIGKILLed; ranks 0 and 1 exit 1 as soon as it is gone, as
    // workers that lose a peer do. They ignore SIGTERM so that, however slow
    // the machine, they exit on their own rather than by the launcher's hand.
    let dir = tempfile::tempdir().expect("tempdir");
    let script = r#"
        pidfile="$DIR/rank2.pid"
        if [ "$RANK" = 2 ]; then
            echo $$ > "$pidfile.tmp" && mv "$pidfile.tmp" "$pidfile"
            sleep 0.3
            kill -9 $$
        fi
        trap '' TERM
        while [ ! -s "$pidfile" ]; do sleep 0.005; done
        while kill -0 "$(cat "$pidfile")" 2>/dev/null; do sleep 0.001; done
        exit 1
    "#;
    let start = Instant::now();
    let out = kolo()
        .args(["run", "-n", "3", "--", "sh", "-c", script])
        .env("DIR", dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("the kolo binary starts");
    let elapsed = start.elapsed();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(137), "stderr: {err}");
    let failed: Vec<&str> = err.lines().filter(|l| l.contains(") failed: ")).collect();
    assert_eq!(failed.len(), 1, "one root cause, stderr: {err}");
    assert!(
        failed[0].starts_with("kolo run: rank 2 (pid ")
            && failed[0].ends_with("failed: killed by signal 9 (SIGKILL)"),
        "stderr: {err}"
    );
    let also: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("kolo run: also failed: "))
        .collect();
    assert_eq!(
        also,
        ["kolo run: also failed: rank 0 (exit code 1), rank 1 (exit code 1)"],
        "stderr: {err}"
    );
    assert!(elapsed < Duration::from_secs(4), "took {elapsed:?}");
}

/// `kolo run -n 2 --grace-period GRACE -- sh -c SCRIPT` with `DIR` set to `dir`: its output and
/// how long it took.
fn run_sh_with_grace(script: &str, grace: &str, dir: &Path) -> (Output, Duration) {
    let start = Instant::now();
    let out = kolo()
        .args([
            "run",
            "-n",
            "2",
            "--grace-period",
            grace,
            "--",
            "sh",
            "-c",
            script,
        ])
        .env("DIR", dir)
        .output()
        .expect("the kolo binary starts");
    (out, start.elapsed())
}

#[test]
fn worker_ignoring_sigterm_is_killed_after_grace_period() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = r#"
        if [ "$RANK" = 0 ]; then
            trap '' TERM
            echo $$ > "$DIR/pid.0"
            sleep 30
        fi
        while [ ! -e "$DIR/pid.0" ]; do sleep 0.02; done
        exit 1
    "#;
    let (out, elapsed) = run_sh_with_grace(script, "1", dir.path());
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(err.contains("rank 1 (pid "), "stderr: {err}");
    assert!(
        err.contains("rank 0 (pid ") && err.contains("SIGKILL"),
        "stderr: {err}"
    );
    assert!(
        elapsed >= Duration::from_millis(900),
        "grace period not honoured: {elapsed:?}"
    );
    assert!(elapsed < Duration::from_secs(4), "took {elapsed:?}");
    assert_all_gone(&worker_pids(dir.path()));
}

#[test]
fn a_stopped_worker_is_continued_to_take_its_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Rank 0 stops itself (as SIGSTOP or ^Z would); rank 1 then fails.
    let script = r#"
        if [ "$RANK" = 0 ]; then
            echo $$ > "$DIR/pid.0"
            kill -STOP $$
            sleep 30
        fi
        while [ ! -e "$DIR/pid.0" ]; do sleep 0.02; done
        sleep 0.2
        exit 1
    "#;
    let (out, elapsed) = run_sh_with_grace(script, "10", dir.path());
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    // SIGTERM reached it at once, not SIGKILL after the grace period.
    assert!(!err.contains("SIGKILL"), "stderr: {err}");
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}: {err}");
    assert_all_gone(&worker_pids(dir.path()));
}

#[test]
fn sigterm_to_launcher_stops_workers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = kolo()
        .args([
            "run",
            "-n",
            "3",
            "--",
            "sh",
            "-c",
            r#"echo $$ > "$DIR/pid.$RANK"; sleep 30"#,
        ])
        .env("DIR", dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the kolo binary starts");
    wait_for("3 pid files", Duration::from_secs(10), || {
        worker_pids(dir.path()).len() == 3
    });
    let pid = i32::try_from(child.id()).expect("pid fits in i32");
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = wait_with_timeout(&mut child, Duration::from_secs(10));
    let mut err = String::new();
    if let Some(stderr) = child.stderr.take() {
        for line in BufReader::new(stderr).lines() {
            err.push_str(&line.expect("utf-8 stderr"));
            err.push('\n');
        }
    }
    assert_eq!(status.code(), Some(143), "stderr: {err}");
    assert!(err.contains("SIGTERM"), "stderr: {err}");
    assert_all_gone(&worker_pids(dir.path()));
}

#[test]
fn workers_die_with_a_sigkilled_launcher() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = kolo()
        .args([
            "run",
            "-n",
            "2",
            "--",
            "sh",
            "-c",
            r#"echo $$ > "$DIR/pid.$RANK"; exec sleep 30"#,
        ])
        .env("DIR", dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the kolo binary starts");
    wait_for("2 pid files", Duration::from_secs(10), || {
        worker_pids(dir.path()).len() == 2
    });
    child.kill().expect("SIGKILLs the launcher");
    let status = wait_with_timeout(&mut child, Duration::from_secs(5));
    assert_eq!(status.code(), None, "the launcher was killed");
    let pids = worker_pids(dir.path());
    wait_for("workers to die", Duration::from_secs(5), || {
        pids.iter().all(|&pid| !is_alive(pid))
    });
}

#[test]
fn program_not_found() {
    let (out, _) = run(&["-n", "2", "--", "/nonexistent/kolo-test-program"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(err.starts_with("kolo run: "), "stderr: {err}");
    assert!(
        err.contains("/nonexistent/kolo-test-program"),
        "stderr: {err}"
    );
    assert!(err.contains("No such file"), "stderr: {err}");
}

#[test]
fn usage_errors_exit_2() {
    let (out, _) = run(&["-n", "0", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    let (out, _) = run(&["-n", "2"]);
    assert_eq!(out.status.code(), Some(2));
    let (out, _) = run(&["--", "true"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn launcher_hosts_the_store_while_workers_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let go = dir.path().join("go");
    let mut child = kolo()
        .args(["run", "-n", "1", "--no-prefix", "--", "sh", "-c"])
        .arg(r#"echo $MASTER_PORT; while [ ! -e "$GO" ]; do sleep 0.02; done"#)
        .env("GO", &go)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the kolo binary starts");
    let mut line = String::new();
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    stdout.read_line(&mut line).expect("reads the port");
    let port: u16 = line.trim().parse().expect("MASTER_PORT is a port");
    assert!(port > 0);
    let bind = TcpListener::bind(("127.0.0.1", port));
    let connect = TcpStream::connect(("127.0.0.1", port));
    fs::write(&go, b"").expect("creates the go file");
    let status = wait_with_timeout(&mut child, Duration::from_secs(10));
    assert!(bind.is_err(), "port {port} should be taken by the store");
    assert!(
        connect.is_ok(),
        "store on port {port} should accept connections"
    );
    assert_eq!(status.code(), Some(0));
}

#[test]
fn master_port_in_use_is_a_clear_error() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("binds a free port");
    let port = taken.local_addr().expect("local addr").port();
    let (out, _) = run(&["-n", "1", "--master-port", &port.to_string(), "--", "true"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(err.starts_with("kolo run: "), "stderr: {err}");
    assert!(err.contains(&format!("127.0.0.1:{port}")), "stderr: {err}");
    drop(taken);
}

#[test]
fn help_describes_the_environment() {
    let out = kolo()
        .args(["run", "--help"])
        .output()
        .expect("the kolo binary starts");
    assert_eq!(out.status.code(), Some(0));
    let help = stdout(&out);
    for var in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "KOLO_JOB_ID",
        "--nproc-per-node",
    ] {
        assert!(help.contains(var), "help lacks {var}: {help}");
    }
    let out = kolo()
        .arg("--help")
        .output()
        .expect("the kolo binary starts");
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("run"));
}
