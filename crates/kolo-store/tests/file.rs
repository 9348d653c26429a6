//! Behaviour specific to the file store: sharing between handles and processes, damage.
#![allow(clippy::unwrap_used)]

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::process::Command;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use kolo_store::{FileStore, Store, StoreError, StoreExt};

const TIMEOUT: Duration = Duration::from_secs(10);
const CHILD_ENV: &str = "KOLO_STORE_TEST_CHILD_PATH";

#[test]
fn two_handles_share_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let a = Arc::new(FileStore::open(&path).unwrap());
    let b = Arc::new(FileStore::open(&path).unwrap());

    a.set("k", b"from a").unwrap();
    assert_eq!(b.try_get("k").unwrap(), Some(b"from a".to_vec()));

    let waiter = {
        let b = Arc::clone(&b);
        thread::spawn(move || b.get("later", TIMEOUT))
    };
    thread::sleep(Duration::from_millis(50));
    a.set("later", b"now").unwrap();
    assert_eq!(waiter.join().unwrap().unwrap(), b"now");

    // Counters stay atomic across handles.
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let s = if i % 2 == 0 {
                Arc::clone(&a)
            } else {
                Arc::clone(&b)
            };
            thread::spawn(move || {
                for _ in 0..100 {
                    s.add("count", 1).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(a.get("count", TIMEOUT).unwrap(), b"800");
    assert_eq!(b.get("count", TIMEOUT).unwrap(), b"800");
    assert!(b.delete("k").unwrap());
    assert_eq!(a.try_get("k").unwrap(), None);
    assert_eq!(a.num_keys().unwrap(), b.num_keys().unwrap());
}

/// The body of the child process started by `shared_with_another_process`;
/// does nothing when run as an ordinary test.
#[test]
fn child_process_helper() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let store = FileStore::open(path).unwrap();
    store.set("child/ready", b"1").unwrap();
    for _ in 0..100 {
        store.add("procs/count", 1).unwrap();
    }
    store.barrier("procs/barrier", 1, 2, TIMEOUT).unwrap();
    store
        .set("child/done", std::process::id().to_string().as_bytes())
        .unwrap();
}

#[test]
fn shared_with_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = FileStore::open(&path).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_helper",
            "--test-threads=1",
            "--quiet",
        ])
        .env(CHILD_ENV, &path)
        .spawn()
        .unwrap();
    store.get("child/ready", TIMEOUT).unwrap();
    for _ in 0..100 {
        store.add("procs/count", 1).unwrap();
    }
    store.barrier("procs/barrier", 0, 2, TIMEOUT).unwrap();
    let child_pid = store.get("child/done", TIMEOUT).unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(child_pid, child.id().to_string().into_bytes());
    assert_eq!(store.get("procs/count", TIMEOUT).unwrap(), b"200");
}

#[test]
fn corrupt_file_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    fs::write(&path, b"\x00\x01 this is not a kolo store file").unwrap();
    match FileStore::open(&path) {
        Err(StoreError::Corrupt {
            path: p, offset, ..
        }) => {
            assert_eq!(p, path);
            assert_eq!(offset, 0);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn garbage_appended_by_someone_else_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = FileStore::open(&path).unwrap();
    store.set("good", b"value").unwrap();
    let end = fs::metadata(&path).unwrap().len();
    OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(&[0xAB; 40])
        .unwrap();
    for result in [
        store.try_get("good").map(|_| ()),
        store.set("x", b"y"),
        store.wait(&["good"], Duration::from_millis(50)),
    ] {
        match result {
            Err(err @ StoreError::Corrupt { offset, .. }) => {
                assert_eq!(offset, end);
                assert!(err.to_string().contains(&path.display().to_string()));
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }
    // The damage was not "repaired" by the failed write.
    assert!(matches!(
        FileStore::open(&path),
        Err(StoreError::Corrupt { .. })
    ));
}

#[test]
fn missing_directory_is_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = FileStore::open(dir.path().join("no/such/dir/store")).unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err:?}");
}
