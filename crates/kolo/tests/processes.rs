//! Multi-process tests over TCP: `kolo::init()` from the variables torchrun, OpenMPI and SLURM set and
//! from explicit init methods, and a worker killed with SIGKILL in the middle of a collective.
//!
//! The workers are this test binary itself, re-run with `--ignored --exact worker_entry` and told what
//! to do through `KOLO_TEST_ROLE`.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kolo::prelude::*;
use kolo::store::TcpStoreServer;
use rustix::process::{kill_process, Pid, Signal};

/// Entry point of the worker processes (ignored in normal runs).
#[test]
#[ignore = "entry point of the worker processes that the other tests start"]
fn worker_entry() {
    let Ok(role) = std::env::var("KOLO_TEST_ROLE") else {
        return;
    };
    let code = match worker(&role) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("worker error: {e}");
            3
        }
    };
    std::process::exit(code);
}

fn worker(role: &str) -> kolo::Result<()> {
    if role == "worlds" {
        return worlds();
    }
    let comm = kolo::init()?;
    match role {
        "check" => {
            let n = comm.size();
            let mut v = vec![comm.rank() as f64 + 1.0; 100_003];
            comm.all_reduce(&mut v, ReduceOp::Sum)?;
            let want = (n * (n + 1) / 2) as f64;
            if v.iter().any(|&x| x != want) {
                return Err(Error::Unsupported {
                    what: "wrong all_reduce result".into(),
                });
            }
            println!(
                "ok rank={} size={} local_rank={} local_size={} node_rank={}",
                comm.rank(),
                comm.size(),
                comm.local_rank(),
                comm.local_size(),
                comm.node_rank()
            );
            Ok(())
        }
        "hosts" => {
            // Ranks on several (pretend) hosts: shm inside a host, TCP across, hierarchical
            // all-reduce for large buffers when every host has the same number of ranks.
            let (n, r) = (comm.size() as i64, comm.rank() as i64);
            let want = n * (n + 1) / 2;
            for count in [10usize, 100_003] {
                let mut v = vec![(r + 1) as f64; count];
                comm.all_reduce(&mut v, ReduceOp::Sum)?;
                let mut w: Vec<i32> = (0..count)
                    .map(|i| (r * 1000 + i as i64 % 7) as i32)
                    .collect();
                comm.all_reduce(&mut w, ReduceOp::Avg)?;
                let avg =
                    |i: usize| ((0..n).map(|k| k * 1000 + i as i64 % 7).sum::<i64>() / n) as i32;
                if v.iter().any(|&x| x != want as f64) || (0..count).any(|i| w[i] != avg(i)) {
                    return Err(Error::Unsupported {
                        what: format!("wrong all_reduce result at count {count}"),
                    });
                }
            }
            println!(
                "ok rank={} transport={} local_size={} nodes={}",
                comm.rank(),
                comm.transport_kind(),
                comm.local_size(),
                comm.num_nodes()
            );
            Ok(())
        }
        "loop" => {
            let mut v = vec![1.0f32; 1 << 20];
            let t = Instant::now();
            println!("looping");
            while t.elapsed() < Duration::from_secs(60) {
                comm.all_reduce(&mut v, ReduceOp::Avg)?;
            }
            Ok(())
        }
        other => Err(Error::Unsupported {
            what: format!("role {other}"),
        }),
    }
}

/// 50 worlds in one process, one after another, each overlapping the one before it (both used in
/// between), each checked with an all-reduce whose result names the world.
fn worlds() -> kolo::Result<()> {
    let mut prev: Option<Communicator> = None;
    for k in 0..50 {
        let comm = kolo::init()?;
        for (c, w) in [(Some(&comm), k), (prev.as_ref(), k.max(1) - 1)] {
            let Some(c) = c else { continue };
            let mut v = vec![(c.rank() + w) as f64; 1000];
            c.all_reduce(&mut v, ReduceOp::Sum)?;
            let n = c.size();
            let want = (n * (n - 1) / 2 + n * w) as f64;
            if v.iter().any(|&x| x != want) {
                return Err(Error::Unsupported {
                    what: format!("world {w}: wrong all_reduce result {} != {want}", v[0]),
                });
            }
        }
        prev = Some(comm);
    }
    println!("ok worlds");
    Ok(())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn start(role: &str, env: &[(String, String)]) -> Child {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--ignored",
        "--exact",
        "worker_entry",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env("KOLO_TEST_ROLE", role)
    .env("KOLO_TIMEOUT", "30")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for v in [
        "RANK",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "LOCAL_RANK",
        "KOLO_AGENT_STORE",
    ] {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("start worker")
}

struct Exit {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn finish(mut c: Child, limit: Duration) -> Exit {
    let t = Instant::now();
    loop {
        if let Ok(Some(_)) = c.try_wait() {
            break;
        }
        if t.elapsed() > limit {
            let _ = c.kill();
            let _ = c.wait();
            panic!("worker {} did not exit within {limit:?}", c.id());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = c.wait().expect("wait");
    let (mut stdout, mut stderr) = (String::new(), String::new());
    if let Some(mut o) = c.stdout.take() {
        let _ = o.read_to_string(&mut stdout);
    }
    if let Some(mut e) = c.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    Exit {
        code: status.code(),
        stdout,
        stderr,
    }
}

fn vars(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn run_world(n: usize, env_of: impl Fn(usize) -> Vec<(String, String)>) {
    let children: Vec<Child> = (0..n).map(|r| start("check", &env_of(r))).collect();
    for (r, c) in children.into_iter().enumerate() {
        let e = finish(c, Duration::from_secs(60));
        assert_eq!(e.code, Some(0), "rank {r}: {}\n{}", e.stdout, e.stderr);
        assert!(
            e.stdout.contains(&format!(
                "ok rank={r} size={n} local_rank={r} local_size={n} node_rank=0"
            )),
            "rank {r}: {}",
            e.stdout
        );
    }
}

/// `n` ranks; rank r on pretend host `node_of(r)`.
fn run_hosts(n: usize, node_of: impl Fn(usize) -> usize, nodes: usize) {
    let port = free_port().to_string();
    let children: Vec<Child> = (0..n)
        .map(|r| {
            start(
                "hosts",
                &vars(&[
                    ("RANK", r.to_string()),
                    ("WORLD_SIZE", n.to_string()),
                    ("MASTER_ADDR", "127.0.0.1".into()),
                    ("MASTER_PORT", port.clone()),
                    ("KOLO_JOB_ID", format!("hosts-{}-{n}", std::process::id())),
                    ("KOLO_NODE_ID", format!("host-{}", node_of(r))),
                ]),
            )
        })
        .collect();
    for (r, c) in children.into_iter().enumerate() {
        let e = finish(c, Duration::from_secs(60));
        assert_eq!(e.code, Some(0), "rank {r}: {}\n{}", e.stdout, e.stderr);
        let local = (0..n).filter(|&k| node_of(k) == node_of(r)).count();
        let kind = if local == 1 { "tcp" } else { "shm+tcp" };
        assert!(
            e.stdout.contains(&format!(
                "ok rank={r} transport={kind} local_size={local} nodes={nodes}"
            )),
            "rank {r}: {}",
            e.stdout
        );
    }
}

#[test]
fn two_hosts_of_two_ranks_use_shm_inside_and_hierarchical_all_reduce() {
    run_hosts(4, |r| r / 2, 2);
}

#[test]
fn uneven_hosts_mix_shm_and_tcp() {
    run_hosts(3, |r| usize::from(r == 2), 2);
}

/// `kolo::init()` again in a process gives a new working world every time: over shared memory with
/// the launcher's store, and over TCP with rank 0 hosting the store (once, for every world).
#[test]
fn fifty_worlds_in_one_process() {
    for (transport, agent) in [("shm", true), ("tcp", false)] {
        let server = TcpStoreServer::bind("127.0.0.1:0").expect("store server");
        let port = match agent {
            true => server.local_addr().port().to_string(),
            false => free_port().to_string(),
        };
        let job = format!("worlds-{transport}-{}", std::process::id());
        let children: Vec<Child> = (0..2)
            .map(|r| {
                let mut env = vars(&[
                    ("RANK", r.to_string()),
                    ("WORLD_SIZE", "2".into()),
                    ("MASTER_ADDR", "127.0.0.1".into()),
                    ("MASTER_PORT", port.clone()),
                    ("KOLO_JOB_ID", job.clone()),
                    ("KOLO_TRANSPORT", transport.into()),
                ]);
                if agent {
                    env.push(("KOLO_AGENT_STORE".into(), "1".into()));
                }
                start("worlds", &env)
            })
            .collect();
        for (r, c) in children.into_iter().enumerate() {
            let e = finish(c, Duration::from_secs(120));
            assert_eq!(
                e.code,
                Some(0),
                "{transport} rank {r}: {}\n{}",
                e.stdout,
                e.stderr
            );
            assert!(
                e.stdout.contains("ok worlds"),
                "{transport} rank {r}: {}",
                e.stdout
            );
        }
    }
}

#[test]
fn torchrun_variables_with_rank_0_hosting_the_store() {
    let port = free_port().to_string();
    run_world(3, |r| {
        vars(&[
            ("RANK", r.to_string()),
            ("WORLD_SIZE", "3".into()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.clone()),
            ("KOLO_JOB_ID", "torchrun-test".into()),
        ])
    });
}

#[test]
fn openmpi_and_slurm_variables() {
    let port = free_port().to_string();
    run_world(2, |r| {
        vars(&[
            ("OMPI_COMM_WORLD_RANK", r.to_string()),
            ("OMPI_COMM_WORLD_SIZE", "2".into()),
            ("OMPI_COMM_WORLD_LOCAL_RANK", r.to_string()),
            // A build with the MPI backend would use MPI under these variables.
            ("KOLO_BACKEND", "kolo".into()),
            ("MASTER_ADDR", "localhost".into()),
            ("MASTER_PORT", port.clone()),
        ])
    });
    let port = free_port().to_string();
    run_world(2, |r| {
        vars(&[
            ("SLURM_PROCID", r.to_string()),
            ("SLURM_NTASKS", "2".into()),
            ("SLURM_LOCALID", r.to_string()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.clone()),
        ])
    });
}

#[test]
fn explicit_tcp_and_file_init_methods() {
    let port = free_port();
    run_world(2, |r| {
        vars(&[
            ("RANK", r.to_string()),
            ("WORLD_SIZE", "2".into()),
            ("KOLO_INIT_METHOD", format!("tcp://127.0.0.1:{port}")),
        ])
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("rendezvous");
    run_world(3, |r| {
        vars(&[
            ("RANK", r.to_string()),
            ("WORLD_SIZE", "3".into()),
            ("KOLO_INIT_METHOD", format!("file://{}", path.display())),
        ])
    });
}

#[test]
fn no_launcher_is_a_world_of_one() {
    let e = finish(start("check", &[]), Duration::from_secs(30));
    assert_eq!(e.code, Some(0), "{}", e.stderr);
    assert!(e.stdout.contains("ok rank=0 size=1"), "{}", e.stdout);
}

#[test]
fn killed_worker_fails_the_others_within_seconds_over_shm() {
    killed_worker("shm");
}

#[test]
fn killed_worker_fails_the_others_within_seconds_over_tcp() {
    killed_worker("tcp");
}

#[test]
fn stopped_worker_fails_the_others_within_seconds_over_tcp() {
    stopped_worker("tcp");
}

#[test]
fn stopped_worker_fails_the_others_within_seconds_over_shm() {
    stopped_worker("shm");
}

/// Three workers in a long all-reduce loop over `transport`, with their store server and job id.
fn loop_workers(what: &str, transport: &str) -> (TcpStoreServer, String, Vec<Child>) {
    let job = format!("{what}-{transport}-{}", std::process::id());
    let server = TcpStoreServer::bind("127.0.0.1:0").expect("store server");
    let port = server.local_addr().port().to_string();
    let n = 3;
    let children: Vec<Child> = (0..n)
        .map(|r| {
            start(
                "loop",
                &vars(&[
                    ("RANK", r.to_string()),
                    ("WORLD_SIZE", n.to_string()),
                    ("MASTER_ADDR", "127.0.0.1".into()),
                    ("MASTER_PORT", port.clone()),
                    ("KOLO_AGENT_STORE", "1".into()),
                    ("KOLO_JOB_ID", job.clone()),
                    ("KOLO_TRANSPORT", transport.into()),
                ]),
            )
        })
        .collect();
    (server, job, children)
}

/// A worker that stops responding (SIGSTOP: alive, connections open, but silent) is found by the
/// heartbeats: the others fail naming it within 10 s.
fn stopped_worker(transport: &str) {
    let (_server, _job, mut children) = loop_workers("stop-test", transport);
    std::thread::sleep(Duration::from_millis(1500));
    let victim = children.pop().expect("three workers");
    let pid = Pid::from_child(&victim);
    kill_process(pid, Signal::STOP).expect("stop the victim");
    let stopped_at = Instant::now();
    for (r, c) in children.into_iter().enumerate() {
        let e = finish(c, Duration::from_secs(15));
        assert!(
            stopped_at.elapsed() < Duration::from_secs(10),
            "took {:?}",
            stopped_at.elapsed()
        );
        assert_eq!(e.code, Some(3), "rank {r}: {}", e.stderr);
        assert!(
            e.stderr.contains("rank 2") && e.stderr.contains("heartbeat"),
            "rank {r} should name the silent rank: {}",
            e.stderr
        );
    }
    // The stopped worker is killed so it does not linger.
    let _ = kill_process(pid, Signal::KILL);
    let _ = finish(victim, Duration::from_secs(10));
}

fn killed_worker(transport: &str) {
    let (_server, job, mut children) = loop_workers("kill-test", transport);
    // Let them get into the loop.
    std::thread::sleep(Duration::from_millis(1500));
    let victim = children.pop().expect("three workers");
    kill_process(Pid::from_child(&victim), Signal::KILL).expect("kill the victim");
    let killed_at = Instant::now();
    let v = finish(victim, Duration::from_secs(10));
    assert_eq!(v.code, None, "killed by a signal");
    for (r, c) in children.into_iter().enumerate() {
        let e = finish(c, Duration::from_secs(10));
        assert!(killed_at.elapsed() < Duration::from_secs(10));
        assert_eq!(e.code, Some(3), "rank {r}: {}", e.stderr);
        assert!(
            e.stderr.contains("rank 2"),
            "rank {r} should name the lost rank: {}",
            e.stderr
        );
    }
    // The segment's name was removed as soon as all three had mapped it: nothing is left behind,
    // even without a launcher to clean up.
    let prefix = kolo::shm_name_prefix(&job);
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "leftover segments: {left:?}");
}
