//! Runs the conformance suite against every store implementation.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use kolo_store::{
    C10dStore, C10dStoreServer, FileStore, MemoryStore, Store, TcpStore, TcpStoreServer,
};

#[test]
fn memory_store_conformance() {
    common::conformance(Arc::new(MemoryStore::new()));
}

#[test]
fn c10d_store_conformance() {
    // kolo's c10d client against kolo's c10d server (PyTorch's own server is checked by the
    // torchrun end-to-end checks).
    let server = C10dStoreServer::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().to_string();
    let store = C10dStore::connect(&addr, Duration::from_secs(5)).unwrap();
    common::conformance(Arc::new(store));
    server.shutdown();
}

#[test]
fn file_store_conformance() {
    let dir = tempfile::tempdir().unwrap();
    common::conformance(Arc::new(FileStore::open(dir.path().join("store")).unwrap()));
}

#[test]
fn file_store_conformance_across_handles() {
    // Every call alternates between two handles, as two processes would.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = TwoHandles {
        a: FileStore::open(&path).unwrap(),
        b: FileStore::open(&path).unwrap(),
        flip: std::sync::atomic::AtomicBool::new(false),
    };
    common::conformance(Arc::new(store));
}

#[test]
fn tcp_store_conformance() {
    let server = TcpStoreServer::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().to_string();
    let store = TcpStore::connect(&addr, Duration::from_secs(5)).unwrap();
    common::conformance(Arc::new(store));
    server.shutdown();
}

/// A store that sends each call to one of two `FileStore` handles in turn.
#[derive(Debug)]
struct TwoHandles {
    a: FileStore,
    b: FileStore,
    flip: std::sync::atomic::AtomicBool,
}

impl TwoHandles {
    fn pick(&self) -> &FileStore {
        if self
            .flip
            .fetch_xor(true, std::sync::atomic::Ordering::Relaxed)
        {
            &self.a
        } else {
            &self.b
        }
    }
}

impl Store for TwoHandles {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), kolo_store::StoreError> {
        self.pick().set(key, value)
    }
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, kolo_store::StoreError> {
        self.pick().get(key, timeout)
    }
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, kolo_store::StoreError> {
        self.pick().try_get(key)
    }
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), kolo_store::StoreError> {
        self.pick().wait(keys, timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64, kolo_store::StoreError> {
        self.pick().add(key, delta)
    }
    fn compare_set(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        desired: &[u8],
    ) -> Result<kolo_store::CompareSet, kolo_store::StoreError> {
        self.pick().compare_set(key, expected, desired)
    }
    fn delete(&self, key: &str) -> Result<bool, kolo_store::StoreError> {
        self.pick().delete(key)
    }
    fn num_keys(&self) -> Result<usize, kolo_store::StoreError> {
        self.pick().num_keys()
    }
}
