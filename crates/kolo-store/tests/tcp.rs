//! Behaviour specific to the TCP store: connection handling, failures, hostile peers.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use kolo_store::{
    JobSecret, Store, StoreError, TcpStore, TcpStoreServer, MAGIC, MAX_VALUE_LEN, PROTOCOL_VERSION,
};

const TIMEOUT: Duration = Duration::from_secs(5);

fn server_and_client() -> (TcpStoreServer, TcpStore) {
    let server = TcpStoreServer::bind("127.0.0.1:0").unwrap();
    let client = TcpStore::connect(&server.local_addr().to_string(), TIMEOUT).unwrap();
    (server, client)
}

/// A port on 127.0.0.1 with (very likely) nothing listening on it.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Reads until EOF or error; returns whether the server closed the connection in time.
fn closed_by_server(stream: &mut TcpStream) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 64];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

fn handshake(stream: &mut TcpStream) {
    let mut hello = MAGIC.to_le_bytes().to_vec();
    hello.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    stream.write_all(&hello).unwrap();
    let mut reply = [0u8; 6];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(reply.to_vec(), hello);
    kolo_store::auth::client(stream, &JobSecret::default()).unwrap();
}

#[test]
fn two_clients_share_state() {
    let (server, a) = server_and_client();
    let b = TcpStore::connect(&server.local_addr().to_string(), TIMEOUT).unwrap();
    a.set("from/a", b"hello").unwrap();
    assert_eq!(b.get("from/a", TIMEOUT).unwrap(), b"hello");

    let waiter = thread::spawn(move || b.get("from/a/later", TIMEOUT));
    thread::sleep(Duration::from_millis(50));
    a.set("from/a/later", b"later").unwrap();
    assert_eq!(waiter.join().unwrap().unwrap(), b"later");
    assert_eq!(a.add("n", 1).unwrap(), 1);
}

#[test]
fn client_connects_before_server_is_up() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let starter = thread::spawn(move || {
        thread::sleep(Duration::from_millis(150));
        TcpStoreServer::bind(("127.0.0.1", port)).unwrap()
    });
    let start = Instant::now();
    let client = TcpStore::connect(&addr, TIMEOUT).unwrap();
    assert!(start.elapsed() >= Duration::from_millis(100));
    client.set("k", b"v").unwrap();
    let server = starter.join().unwrap();
    assert_eq!(client.try_get("k").unwrap(), Some(b"v".to_vec()));
    drop(server);
}

#[test]
fn connect_without_server_times_out() {
    let addr = format!("127.0.0.1:{}", free_port());
    let start = Instant::now();
    match TcpStore::connect(&addr, Duration::from_millis(300)) {
        Err(StoreError::Connect {
            addr: got, waited, ..
        }) => {
            assert_eq!(got, addr);
            assert!(waited >= Duration::from_millis(300), "{waited:?}");
        }
        other => panic!("expected Connect, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[test]
fn connect_to_bad_address_is_an_error() {
    let err = TcpStore::connect("not an address", Duration::from_millis(50)).unwrap_err();
    assert!(matches!(err, StoreError::Connect { .. }), "{err:?}");
}

#[test]
fn bind_to_port_in_use() {
    let server = TcpStoreServer::bind("127.0.0.1:0").unwrap();
    match TcpStoreServer::bind(server.local_addr()) {
        Err(StoreError::Bind { addr, source }) => {
            assert_eq!(addr, server.local_addr().to_string());
            assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse);
        }
        other => panic!("expected Bind, got {other:?}"),
    }
}

#[test]
fn server_dropped_mid_wait_is_an_error_not_a_hang() {
    let (server, client) = server_and_client();
    let client = Arc::new(client);
    let waiter = {
        let client = Arc::clone(&client);
        thread::spawn(move || {
            let start = Instant::now();
            (
                client.get("never", Duration::from_secs(60)),
                start.elapsed(),
            )
        })
    };
    thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    drop(server);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "shutdown was slow"
    );
    let (result, waited) = waiter.join().unwrap();
    assert!(
        matches!(result, Err(StoreError::Disconnected { .. })),
        "{result:?}"
    );
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    // Later calls fail too (the server is gone), quickly.
    let start = Instant::now();
    assert!(client.try_get("k").is_err());
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[test]
fn shutdown_with_idle_clients_is_prompt() {
    let (server, client) = server_and_client();
    let _raw = TcpStream::connect(server.local_addr()).unwrap(); // never shakes hands
    client.set("k", b"v").unwrap();
    let start = Instant::now();
    server.shutdown();
    server.shutdown(); // idempotent
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(client.try_get("k").is_err());
}

#[test]
fn garbage_client_is_dropped_others_keep_working() {
    let (server, client) = server_and_client();
    client.set("k", b"before").unwrap();

    let mut garbage = TcpStream::connect(server.local_addr()).unwrap();
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    assert!(closed_by_server(&mut garbage));

    client.set("k", b"after").unwrap();
    assert_eq!(client.get("k", TIMEOUT).unwrap(), b"after");
}

#[test]
fn bad_frames_after_handshake_are_dropped() {
    let (server, client) = server_and_client();
    let frames: Vec<Vec<u8>> = vec![
        // Unknown opcode.
        vec![0xEE],
        // A set announcing a value over the limit.
        {
            let mut f = vec![1u8];
            f.extend_from_slice(&1u32.to_le_bytes());
            f.push(b'k');
            f.extend_from_slice(&(MAX_VALUE_LEN as u64 + 1).to_le_bytes());
            f
        },
        // A key over the limit.
        {
            let mut f = vec![3u8];
            f.extend_from_slice(&u32::MAX.to_le_bytes());
            f
        },
        // A non-UTF-8 key.
        {
            let mut f = vec![3u8];
            f.extend_from_slice(&2u32.to_le_bytes());
            f.extend_from_slice(&[0xC3, 0x28]);
            f
        },
    ];
    for frame in frames {
        let mut raw = TcpStream::connect(server.local_addr()).unwrap();
        handshake(&mut raw);
        raw.write_all(&frame).unwrap();
        assert!(
            closed_by_server(&mut raw),
            "frame {frame:?} was not rejected"
        );
        client.set("still", b"working").unwrap();
    }
    assert_eq!(client.try_get("still").unwrap(), Some(b"working".to_vec()));
}

#[test]
fn wrong_protocol_version_is_rejected() {
    let server = TcpStoreServer::bind("127.0.0.1:0").unwrap();
    let mut raw = TcpStream::connect(server.local_addr()).unwrap();
    let mut hello = MAGIC.to_le_bytes().to_vec();
    hello.extend_from_slice(&(PROTOCOL_VERSION + 7).to_le_bytes());
    raw.write_all(&hello).unwrap();
    let mut reply = [0u8; 6];
    raw.read_exact(&mut reply).unwrap();
    assert_eq!(reply[4..], PROTOCOL_VERSION.to_le_bytes());
    assert!(closed_by_server(&mut raw));
}

#[test]
fn oversize_value_rejected() {
    let (_server, client) = server_and_client();
    let huge = vec![7u8; MAX_VALUE_LEN + 1];
    assert!(matches!(
        client.set("big", &huge),
        Err(StoreError::TooLarge { what: "value", .. })
    ));
    assert!(matches!(
        client.compare_set("big", Some(&huge), b"x"),
        Err(StoreError::TooLarge { .. })
    ));
    // The connection is still fine.
    client.set("small", b"ok").unwrap();
    assert_eq!(client.try_get("big").unwrap(), None);
}

#[test]
fn large_value_round_trips() {
    let (_server, client) = server_and_client();
    let value: Vec<u8> = (0..4 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    client.set("large", &value).unwrap();
    assert_eq!(client.get("large", TIMEOUT).unwrap(), value);
}

#[test]
fn not_a_store_server_is_a_protocol_error() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let fake = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let _ = s.write_all(b"SSH-2.0-OpenSSH\r\n");
        thread::sleep(Duration::from_millis(200));
    });
    let start = Instant::now();
    let err = TcpStore::connect(&addr, TIMEOUT).unwrap_err();
    assert!(matches!(err, StoreError::Protocol { .. }), "{err:?}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "retried a fatal error"
    );
    fake.join().unwrap();
}

#[test]
fn silent_server_is_an_error_not_a_hang() {
    // A server that shakes hands, then never answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let fake = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut hello = [0u8; 6];
        s.read_exact(&mut hello).unwrap();
        s.write_all(&hello).unwrap();
        kolo_store::auth::server(&mut s, &JobSecret::default()).unwrap();
        let mut sink = [0u8; 1024];
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
    });
    let client = TcpStore::connect(&addr, TIMEOUT)
        .unwrap()
        .with_io_timeout(Duration::from_millis(200));
    let start = Instant::now();
    let err = client.get("k", Duration::from_millis(100)).unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err:?}");
    assert!(start.elapsed() < Duration::from_secs(2));
    drop(client);
    fake.join().unwrap();
}

#[test]
fn client_recovers_after_timeouts() {
    let (_server, client) = server_and_client();
    for _ in 0..3 {
        assert!(client
            .get("missing", Duration::from_millis(20))
            .unwrap_err()
            .is_timeout());
    }
    client.set("k", b"v").unwrap();
    assert_eq!(client.get("k", TIMEOUT).unwrap(), b"v");
}

#[test]
fn many_clients_in_parallel() {
    let server = TcpStoreServer::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().to_string();
    let threads: Vec<_> = (0..16)
        .map(|rank| {
            let addr = addr.clone();
            thread::spawn(move || {
                let store = TcpStore::connect(&addr, TIMEOUT).unwrap();
                store
                    .set(&format!("rank/{rank}"), rank.to_string().as_bytes())
                    .unwrap();
                let keys: Vec<String> = (0..16).map(|r| format!("rank/{r}")).collect();
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                store.wait(&refs, TIMEOUT).unwrap();
                store.add("sum", rank).unwrap()
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let store = TcpStore::connect(&addr, TIMEOUT).unwrap();
    assert_eq!(store.get("sum", TIMEOUT).unwrap(), b"120");
    assert_eq!(store.num_keys().unwrap(), 17);
}

#[test]
fn a_client_with_a_wrong_or_missing_secret_is_refused_and_the_job_goes_on() {
    let secret = JobSecret::new("the job's secret");
    let server = TcpStoreServer::bind_with_secret("127.0.0.1:0", secret.clone()).unwrap();
    let addr = server.local_addr().to_string();
    let good = TcpStore::connect_with_secret(&addr, TIMEOUT, secret.clone()).unwrap();
    good.set("k", b"v").unwrap();
    for wrong in [JobSecret::new("a guess"), JobSecret::default()] {
        let start = Instant::now();
        let err = TcpStore::connect_with_secret(&addr, TIMEOUT, wrong).unwrap_err();
        match &err {
            StoreError::Protocol { reason, .. } => {
                assert!(reason.contains("KOLO_JOB_SECRET"), "{reason}")
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "retried a refusal"
        );
    }
    // A client that knows the protocol but not the secret, speaking the exchange by hand.
    let mut raw = TcpStream::connect(server.local_addr()).unwrap();
    let mut hello = MAGIC.to_le_bytes().to_vec();
    hello.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    raw.write_all(&hello).unwrap();
    let mut reply = [0u8; 6];
    raw.read_exact(&mut reply).unwrap();
    raw.write_all(&[0u8; 16]).unwrap();
    let mut challenge = [0u8; 48];
    raw.read_exact(&mut challenge).unwrap();
    raw.write_all(&[0u8; 32]).unwrap(); // not the proof
    raw.write_all(&[3u8, 1, 0, 0, 0, b'k']).unwrap(); // a get, which must never be served
    assert!(closed_by_server(&mut raw));
    // Random bytes after the hello.
    let mut noise = TcpStream::connect(server.local_addr()).unwrap();
    noise.write_all(&hello).unwrap();
    noise.write_all(&[0x5a; 200]).unwrap();
    assert!(closed_by_server(&mut noise));
    // The job's own client never noticed.
    assert_eq!(good.get("k", TIMEOUT).unwrap(), b"v");
    good.set("k2", b"w").unwrap();
    assert_eq!(good.try_get("k2").unwrap(), Some(b"w".to_vec()));
}

#[test]
fn a_server_without_the_secret_is_not_trusted() {
    let server = TcpStoreServer::bind_with_secret("127.0.0.1:0", JobSecret::new("other")).unwrap();
    let err = TcpStore::connect_with_secret(
        &server.local_addr().to_string(),
        TIMEOUT,
        JobSecret::new("mine"),
    )
    .unwrap_err();
    assert!(
        matches!(&err, StoreError::Protocol { reason, .. } if reason.contains("did not prove")),
        "{err:?}"
    );
}
