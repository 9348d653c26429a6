//! Every connection of a job proves the job secret: strangers on the store or on a data port are
//! refused (and logged) while the job itself runs to a correct end.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use kolo::store::auth::{self, AuthError};
use kolo::store::{JobSecret, Store, TcpStore, TcpStoreServer};
use kolo::transport::{TcpOptions, TcpTransport};
use kolo::{Communicator, Config, ReduceOp};

const TIMEOUT: Duration = Duration::from_secs(20);

/// True when the peer closes the connection (or resets it) within a few seconds.
fn closed_by_peer(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(12))).ok();
    let mut buf = [0u8; 64];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => {
                return matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
                )
            }
        }
    }
}

#[test]
fn strangers_are_refused_on_the_store_and_the_data_ports_while_the_job_runs() {
    let secret = JobSecret::new("4f7e0c1d2b3a5968");
    let server = TcpStoreServer::bind_with_secret("127.0.0.1:0", secret.clone()).expect("bind");
    let addr = server.local_addr().to_string();
    let n = 3;

    // The job: rank 2 joins late, so rank 0 is still accepting while the strangers call.
    let ranks: Vec<_> = (0..n)
        .map(|r| {
            let (addr, secret) = (addr.clone(), secret.clone());
            thread::spawn(move || -> Result<Vec<f64>, String> {
                if r == 2 {
                    thread::sleep(Duration::from_millis(1500));
                }
                let store = TcpStore::connect_with_secret(&addr, TIMEOUT, secret.clone())
                    .map_err(|e| e.to_string())?;
                let opts = TcpOptions {
                    secret,
                    connect_timeout: TIMEOUT,
                    ..TcpOptions::default()
                };
                let t =
                    TcpTransport::connect(&store, "job", r, n, &opts).map_err(|e| e.to_string())?;
                let comm = Communicator::with_transport(Arc::new(t), Config::default());
                let mut v: Vec<f64> = (0..1000).map(|i| (i * (r + 1)) as f64).collect();
                comm.all_reduce(&mut v, ReduceOp::Sum)
                    .map_err(|e| e.to_string())?;
                comm.barrier().map_err(|e| e.to_string())?;
                Ok(v)
            })
        })
        .collect();

    // Strangers on the store: a wrong secret, none, random bytes.
    for wrong in [JobSecret::new("guess"), JobSecret::default()] {
        let err = TcpStore::connect_with_secret(&addr, TIMEOUT, wrong).expect_err("refused");
        assert!(err.to_string().contains("KOLO_JOB_SECRET"), "{err}");
    }
    let mut noise = TcpStream::connect(&addr).expect("connect");
    noise.write_all(&[0xA5; 300]).expect("write");
    assert!(
        closed_by_peer(&mut noise),
        "the store kept a random-bytes client"
    );

    // Strangers on rank 0's data port, learnt from the store (as the job's own ranks do).
    let insider = TcpStore::connect_with_secret(&addr, TIMEOUT, secret.clone()).expect("store");
    let port0 = String::from_utf8(insider.get("job/tcp/0", TIMEOUT).expect("rank 0's port"))
        .expect("utf-8");
    let mut s = TcpStream::connect(&port0).expect("connect to rank 0");
    s.set_read_timeout(Some(Duration::from_secs(12))).ok();
    match auth::client(&mut s, &JobSecret::new("guess")) {
        Err(AuthError::Unproven) => {}
        other => panic!("a wrong secret got {other:?} from a data port"),
    }
    let mut s = TcpStream::connect(&port0).expect("connect to rank 0");
    s.set_read_timeout(Some(Duration::from_secs(12))).ok();
    assert!(auth::client(&mut s, &JobSecret::default()).is_err());
    let mut noise = TcpStream::connect(&port0).expect("connect to rank 0");
    noise.write_all(&[0x3C; 100]).expect("write");
    assert!(
        closed_by_peer(&mut noise),
        "rank 0 kept a random-bytes connection"
    );

    // The job finished, and correctly.
    let want: Vec<f64> = (0..1000).map(|i| (i * 6) as f64).collect();
    for (r, h) in ranks.into_iter().enumerate() {
        let got = h
            .join()
            .expect("rank thread")
            .unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert_eq!(got, want, "rank {r}");
    }
}
