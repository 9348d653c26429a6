//! The c10d (PyTorch `TCPStore`) protocol: the exact bytes on the wire, waits canceled at their
//! deadline, servers that are not c10d stores, and servers that go away.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use kolo_store::{C10dStore, C10dStoreServer, Store, StoreError, TcpStoreServer};

const TIMEOUT: Duration = Duration::from_secs(5);

fn pair() -> (C10dStoreServer, C10dStore) {
    let server = C10dStoreServer::bind("127.0.0.1:0").unwrap();
    let client = C10dStore::connect(&server.local_addr().to_string(), TIMEOUT).unwrap();
    (server, client)
}

fn string(s: &[u8]) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s);
    v
}

fn read_n(stream: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    stream.read_exact(&mut buf).unwrap();
    buf
}

/// Requests written byte by byte from the protocol's description (query byte, u64 lengths,
/// little-endian integers), not with kolo's encoder.
#[test]
fn the_server_speaks_the_documented_bytes() {
    let server = C10dStoreServer::bind("127.0.0.1:0").unwrap();
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut req = vec![0u8, 0xCE, 0xF7, 0x85, 0x3C]; // VALIDATE, magic 0x3C85F7CE
    req.push(1); // SET "key" = "value"
    req.extend(string(b"key"));
    req.extend(string(b"value"));
    req.push(3); // GET "key"
    req.extend(string(b"key"));
    s.write_all(&req).unwrap();
    assert_eq!(read_n(&mut s, 13), string(b"value"));
    // ADD "n" 5 twice: i64 replies; the value is decimal text.
    let mut add = vec![4u8];
    add.extend(string(b"n"));
    add.extend(5i64.to_le_bytes());
    s.write_all(&add).unwrap();
    s.write_all(&add).unwrap();
    assert_eq!(read_n(&mut s, 8), 5i64.to_le_bytes());
    assert_eq!(read_n(&mut s, 8), 10i64.to_le_bytes());
    let mut get = vec![3u8];
    get.extend(string(b"n"));
    s.write_all(&get).unwrap();
    assert_eq!(read_n(&mut s, 10), string(b"10"));
    // CHECK ["key", "nope"] → NOT_READY (1); CHECK ["key"] → READY (0).
    let mut check = vec![5u8];
    check.extend(2u64.to_le_bytes());
    check.extend(string(b"key"));
    check.extend(string(b"nope"));
    check.push(5);
    check.extend(1u64.to_le_bytes());
    check.extend(string(b"key"));
    s.write_all(&check).unwrap();
    assert_eq!(read_n(&mut s, 2), [1, 0]);
    // COMPARE_SET: absent key with empty expected sets; a wrong expected returns the current.
    let mut cas = vec![2u8];
    cas.extend(string(b"c"));
    cas.extend(string(b""));
    cas.extend(string(b"one"));
    cas.push(2);
    cas.extend(string(b"c"));
    cas.extend(string(b"zzz"));
    cas.extend(string(b"two"));
    s.write_all(&cas).unwrap();
    assert_eq!(read_n(&mut s, 11), string(b"one"));
    assert_eq!(read_n(&mut s, 11), string(b"one"));
    // APPEND, MULTI_SET, MULTI_GET, GETNUMKEYS, DELETE_KEY, PING.
    let mut more = vec![9u8];
    more.extend(string(b"key"));
    more.extend(string(b"!"));
    more.push(11);
    more.extend(1u64.to_le_bytes());
    more.extend(string(b"m"));
    more.extend(string(b"mv"));
    more.push(10);
    more.extend(2u64.to_le_bytes());
    more.extend(string(b"key"));
    more.extend(string(b"m"));
    more.push(7);
    more.push(8);
    more.extend(string(b"m"));
    more.push(13);
    more.extend(0xDEAD_BEEFu32.to_le_bytes());
    s.write_all(&more).unwrap();
    assert_eq!(read_n(&mut s, 14), string(b"value!"));
    assert_eq!(read_n(&mut s, 10), string(b"mv"));
    assert_eq!(read_n(&mut s, 8), 4i64.to_le_bytes()); // key, n, c, m
    assert_eq!(read_n(&mut s, 8), 1i64.to_le_bytes());
    assert_eq!(read_n(&mut s, 4), 0xDEAD_BEEFu32.to_le_bytes());
    // WAIT on a missing key, then CANCEL_WAIT → WAIT_CANCELED (1).
    let mut wait = vec![6u8];
    wait.extend(1u64.to_le_bytes());
    wait.extend(string(b"later"));
    s.write_all(&wait).unwrap();
    std::thread::sleep(Duration::from_millis(120));
    s.write_all(&[12]).unwrap();
    assert_eq!(read_n(&mut s, 1), [1]);
    // A WAIT that another client satisfies → STOP_WAITING (0).
    s.write_all(&wait).unwrap();
    let other = C10dStore::connect(&server.local_addr().to_string(), TIMEOUT).unwrap();
    other.set("later", b"x").unwrap();
    assert_eq!(read_n(&mut s, 1), [0]);
}

#[test]
fn a_client_that_does_not_validate_is_dropped() {
    let server = C10dStoreServer::bind("127.0.0.1:0").unwrap();
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.write_all(&[0, 1, 2, 3, 4]).unwrap(); // VALIDATE with a wrong magic
    let mut buf = [0u8; 8];
    assert_eq!(s.read(&mut buf).unwrap_or(0), 0, "the server closes it");
    // The server still serves others.
    let c = C10dStore::connect(&server.local_addr().to_string(), TIMEOUT).unwrap();
    c.set("k", b"v").unwrap();
    assert_eq!(c.get("k", TIMEOUT).unwrap(), b"v");
}

#[test]
fn a_wait_canceled_at_its_deadline_names_the_missing_keys_and_the_client_goes_on() {
    let (_server, c) = pair();
    c.set("here", b"1").unwrap();
    let t = Instant::now();
    match c.wait(&["here", "missing"], Duration::from_millis(300)) {
        Err(StoreError::Timeout { keys, .. }) => assert_eq!(keys, vec!["missing".to_string()]),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    match c.get("missing", Duration::from_millis(100)) {
        Err(StoreError::Timeout { keys, .. }) => assert_eq!(keys, vec!["missing".to_string()]),
        other => panic!("expected a timeout, got {other:?}"),
    }
    // The same (pooled) connection still works.
    c.set("missing", b"now").unwrap();
    assert_eq!(c.get("missing", TIMEOUT).unwrap(), b"now");
    assert_eq!(c.try_get("missing").unwrap(), Some(b"now".to_vec()));
}

#[test]
fn a_store_that_is_not_c10d_is_named() {
    // kolo's own store server answers the c10d handshake with an error and hangs up.
    let kolo = TcpStoreServer::bind("127.0.0.1:0").unwrap();
    let addr = kolo.local_addr().to_string();
    let t = Instant::now();
    let err = C10dStore::connect(&addr, Duration::from_secs(1)).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(&addr), "{msg}");
    assert!(msg.contains("c10d") || msg.contains("TCPStore"), "{msg}");
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
}

#[test]
fn nothing_listening_is_a_connect_error_naming_the_address() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let t = Instant::now();
    match C10dStore::connect(&addr, Duration::from_millis(400)) {
        Err(StoreError::Connect { addr: a, .. }) => assert_eq!(a, addr),
        other => panic!("expected Connect, got {other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(3));
}

#[test]
fn a_server_that_goes_away_ends_a_blocked_get() {
    let (server, c) = pair();
    let t = Instant::now();
    let waiter = std::thread::spawn(move || c.get("never", Duration::from_secs(30)));
    std::thread::sleep(Duration::from_millis(200));
    server.shutdown();
    let r = waiter.join().unwrap();
    assert!(
        matches!(r, Err(StoreError::Disconnected { .. })),
        "expected Disconnected, got {r:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
fn counters_are_checked_before_they_reach_the_server() {
    let (_server, c) = pair();
    c.set("text", b"hello").unwrap();
    assert!(matches!(
        c.add("text", 1),
        Err(StoreError::NotACounter { .. })
    ));
    c.set("max", i64::MAX.to_string().as_bytes()).unwrap();
    assert!(matches!(
        c.add("max", 1),
        Err(StoreError::CounterOverflow { .. })
    ));
    assert_eq!(c.add("fresh", 3).unwrap(), 3);
}

/// A kolo store server that also answers PyTorch's clients: both protocols on one port, each in
/// its own key space; the job secret still guards kolo's.
#[test]
fn a_kolo_server_with_torch_clients_serves_both_protocols_apart() {
    use kolo_store::{JobSecret, TcpStore};
    let server =
        TcpStoreServer::bind_with_secret_and_torch("127.0.0.1:0", JobSecret::new(b"s3cret"))
            .unwrap();
    let addr = server.local_addr().to_string();
    let torch = C10dStore::connect(&addr, TIMEOUT).unwrap();
    let kolo = TcpStore::connect_with_secret(&addr, TIMEOUT, JobSecret::new(b"s3cret")).unwrap();
    torch.set("k", b"torch").unwrap();
    kolo.set("k", b"kolo").unwrap();
    assert_eq!(torch.get("k", TIMEOUT).unwrap(), b"torch");
    assert_eq!(kolo.get("k", TIMEOUT).unwrap(), b"kolo");
    assert_eq!(torch.add("n", 2).unwrap(), 2);
    assert_eq!(kolo.try_get("n").unwrap(), None);
    // A kolo client without the secret is still refused.
    let stranger = TcpStore::connect_with_secret(&addr, TIMEOUT, JobSecret::new(b"wrong"));
    assert!(stranger.and_then(|s| s.set("x", b"y")).is_err());
    // Shutting down ends a torch client's blocked get.
    let t = std::thread::spawn(move || torch.get("never", Duration::from_secs(30)));
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    server.shutdown();
    assert!(t.join().unwrap().is_err());
    assert!(start.elapsed() < Duration::from_secs(5));
}

/// Without `bind_with_secret_and_torch` a c10d client is refused, as before.
#[test]
fn a_plain_kolo_server_refuses_torch_clients() {
    let server = TcpStoreServer::bind("127.0.0.1:0").unwrap();
    let r = C10dStore::connect(&server.local_addr().to_string(), Duration::from_secs(2))
        .and_then(|c| c.set("k", b"v"));
    assert!(r.is_err());
}
