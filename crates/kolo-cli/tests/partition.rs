//! Two `kolo run --nnodes 2` launchers on loopback, node 1 reaching the store on node 0 through a
//! proxy that is then cut: bytes stop flowing both ways and nothing is reset, as in a network
//! partition. Both launchers must stop their workers and exit non-zero within 10 s, naming what they
//! lost.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Copies bytes from `from` to `to` until either side closes; once `cut` is set, what arrives is
/// dropped.
fn pump(mut from: TcpStream, mut to: TcpStream, cut: Arc<AtomicBool>) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 {
            break;
        }
        if !cut.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
}

/// A TCP proxy to `target` on a free port of 127.0.0.1, and the switch that cuts it.
fn proxy(target: SocketAddr) -> (u16, Arc<AtomicBool>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binds a proxy port");
    let port = listener.local_addr().expect("proxy address").port();
    let cut = Arc::new(AtomicBool::new(false));
    let switch = cut.clone();
    thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { break };
            // Node 0's launcher may not be listening yet: node 1 retries.
            let Ok(server) = TcpStream::connect(target) else {
                continue;
            };
            let (c2, s2) = match (client.try_clone(), server.try_clone()) {
                (Ok(c), Ok(s)) => (c, s),
                _ => break,
            };
            let (up, down) = (cut.clone(), cut.clone());
            thread::spawn(move || pump(client, server, up));
            thread::spawn(move || pump(s2, c2, down));
        }
    });
    (port, switch)
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binds a free port");
    listener.local_addr().expect("local addr").port()
}

/// Starts node `rank`'s launcher with one worker that writes its pid to `dir/pid.RANK` and then runs
/// `then` (a shell command).
fn launcher(rank: usize, port: u16, dir: &Path, then: &str) -> Child {
    let script = format!(
        "echo $$ > \"$DIR/pid.$RANK.tmp\" && mv \"$DIR/pid.$RANK.tmp\" \"$DIR/pid.$RANK\" && {then}"
    );
    Command::new(env!("CARGO_BIN_EXE_kolo"))
        .args(["run", "-n", "1", "--nnodes", "2", "--node-rank"])
        .arg(rank.to_string())
        .args(["--master-addr", "127.0.0.1", "--master-port"])
        .arg(port.to_string())
        .args(["--", "sh", "-c", &script])
        .env("DIR", dir)
        .env("KOLO_JOB_SECRET", "partition-test")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the kolo binary starts")
}

/// Waits up to `timeout` for `child` to exit; kills it otherwise.
fn exit_within(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

fn stderr_of(child: &mut Child) -> String {
    let mut text = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut text);
    }
    text
}

fn is_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
        Err(_) => false,
    }
}

/// Runs two launchers whose workers run `then`, cuts the link between them once both workers run
/// (creating `DIR/cut`), and checks that both launchers exit non-zero within 10 s of the cut, naming
/// what they lost, with no worker left. Returns how long each took.
fn partition(then: &str) -> [Duration; 2] {
    let dir = tempfile::tempdir().expect("a temp dir");
    let port = free_port();
    let (proxy_port, cut) = proxy(SocketAddr::from(([127, 0, 0, 1], port)));
    let mut node0 = launcher(0, port, dir.path(), then);
    let mut node1 = launcher(1, proxy_port, dir.path(), then);
    let pid_file = |rank: usize| dir.path().join(format!("pid.{rank}"));
    let started = Instant::now();
    while !(pid_file(0).exists() && pid_file(1).exists()) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the workers did not start"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let pids: Vec<i32> = (0..2)
        .map(|r| {
            std::fs::read_to_string(pid_file(r))
                .expect("a pid file")
                .trim()
                .parse()
                .expect("a pid")
        })
        .collect();
    // Let a few heartbeats through first.
    thread::sleep(Duration::from_secs(1));
    cut.store(true, Ordering::SeqCst);
    let cut_at = Instant::now();
    std::fs::write(dir.path().join("cut"), b"").expect("writes the cut mark");

    let status1 = exit_within(&mut node1, Duration::from_secs(10));
    let took1 = cut_at.elapsed();
    let status0 = exit_within(&mut node0, Duration::from_secs(10).saturating_sub(took1));
    let took0 = cut_at.elapsed();
    let (err0, err1) = (stderr_of(&mut node0), stderr_of(&mut node1));
    let status1 = status1.unwrap_or_else(|| panic!("node 1 still ran 10 s after the cut:\n{err1}"));
    let status0 = status0.unwrap_or_else(|| panic!("node 0 still ran 10 s after the cut:\n{err0}"));
    assert!(!status1.success(), "node 1 exited 0 ({took1:?}):\n{err1}");
    assert!(!status0.success(), "node 0 exited 0 ({took0:?}):\n{err0}");
    assert!(
        err1.contains(&format!(
            "lost the rendezvous store at 127.0.0.1:{proxy_port} (node 0): "
        )),
        "node 1 did not name the store it lost:\n{err1}"
    );
    assert!(
        err0.contains("kolo run: the job failed first at node 1 (")
            && err0.contains("stopped responding"),
        "node 0 did not name node 1:\n{err0}"
    );
    for pid in pids {
        assert!(!is_alive(pid), "worker pid {pid} outlived its launcher");
    }
    [took0, took1]
}

#[test]
fn both_launchers_stop_within_10_s_of_a_partition_naming_what_they_lost() {
    // Workers that never notice: the launchers' own watch stops them.
    let [took0, took1] = partition("exec sleep 60");
    eprintln!("after the cut: node 0 exited in {took0:?}, node 1 in {took1:?}");
}

#[test]
fn workers_failing_first_still_name_the_lost_store_and_node() {
    // Workers that notice their lost peer 4 s after the cut (kolo's own do so after 6 s), before
    // the launchers' watch: node 0 blames the silent node 1, node 1 still names the store it lost.
    let [took0, took1] = partition(
        "while [ ! -e \"$DIR/cut\" ]; do sleep 0.05; done; sleep 4; echo lost my peer >&2; exit 1",
    );
    eprintln!("after the cut: node 0 exited in {took0:?}, node 1 in {took1:?}");
}
