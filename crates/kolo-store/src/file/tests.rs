//! Tests of the store file: replay, and every kind of damage reported as corruption.

#![allow(clippy::unwrap_used)]

use super::record::{encode_record, RECORD_HEADER_LEN, RECORD_TRAILER_LEN};
use super::*;
use std::fs;

fn store_file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    (dir, path)
}

fn append_raw(path: &Path, bytes: &[u8]) {
    let mut f = OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
}

fn expect_corrupt(result: Result<impl std::fmt::Debug, StoreError>, offset: u64, needle: &str) {
    match result {
        Err(StoreError::Corrupt {
            offset: at, reason, ..
        }) => {
            assert_eq!(at, offset, "{reason}");
            assert!(reason.contains(needle), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn record_layout() {
    let rec = encode_record(OP_SET, "k", b"vv");
    assert_eq!(rec.len(), RECORD_HEADER_LEN + 1 + 2 + RECORD_TRAILER_LEN);
    assert_eq!(rec[0], OP_SET);
}

#[test]
fn reopen_replays_log() {
    let (_dir, path) = store_file();
    {
        let s = FileStore::open(&path).unwrap();
        s.set("a", b"1").unwrap();
        s.set("b", b"2").unwrap();
        s.add("c", 5).unwrap();
        assert!(s.delete("a").unwrap());
    }
    let s = FileStore::open(&path).unwrap();
    assert_eq!(s.try_get("a").unwrap(), None);
    assert_eq!(s.try_get("b").unwrap(), Some(b"2".to_vec()));
    assert_eq!(s.try_get("c").unwrap(), Some(b"5".to_vec()));
    assert_eq!(s.num_keys().unwrap(), 2);
}

#[test]
fn not_a_store_file() {
    let (_dir, path) = store_file();
    fs::write(&path, b"hello world, not a store").unwrap();
    expect_corrupt(FileStore::open(&path), 0, "KOLF");
}

#[test]
fn short_header() {
    let (_dir, path) = store_file();
    fs::write(&path, b"KOL").unwrap();
    expect_corrupt(FileStore::open(&path), 0, "header");
}

#[test]
fn incomplete_tail_is_corrupt() {
    let (_dir, path) = store_file();
    let s = FileStore::open(&path).unwrap();
    s.set("a", b"1").unwrap();
    let good_end = fs::metadata(&path).unwrap().len();
    let rec = encode_record(OP_SET, "b", b"2222");
    append_raw(&path, &rec[..rec.len() - 3]);
    expect_corrupt(s.try_get("a"), good_end, "crashed");
    // A fresh handle sees the same.
    expect_corrupt(FileStore::open(&path), good_end, "crashed");
}

#[test]
fn tiny_tail_is_corrupt() {
    let (_dir, path) = store_file();
    let s = FileStore::open(&path).unwrap();
    let end = fs::metadata(&path).unwrap().len();
    append_raw(&path, &[OP_SET, 1]);
    expect_corrupt(s.num_keys(), end, "incomplete");
}

#[test]
fn bad_checksum_is_corrupt() {
    let (_dir, path) = store_file();
    let s = FileStore::open(&path).unwrap();
    let end = fs::metadata(&path).unwrap().len();
    let mut rec = encode_record(OP_SET, "b", b"value");
    rec[RECORD_HEADER_LEN + 2] ^= 0x40;
    append_raw(&path, &rec);
    expect_corrupt(s.try_get("b"), end, "checksum");
}

#[test]
fn huge_length_is_corrupt_without_allocating() {
    let (_dir, path) = store_file();
    let s = FileStore::open(&path).unwrap();
    let end = fs::metadata(&path).unwrap().len();
    let mut rec = vec![OP_SET];
    rec.extend_from_slice(&1u32.to_le_bytes());
    rec.extend_from_slice(&u64::MAX.to_le_bytes());
    rec.extend_from_slice(b"k....");
    append_raw(&path, &rec);
    expect_corrupt(s.try_get("k"), end, "value length");

    let (_dir2, path2) = store_file();
    let s2 = FileStore::open(&path2).unwrap();
    let mut rec = vec![OP_SET];
    rec.extend_from_slice(&1u32.to_le_bytes());
    rec.extend_from_slice(&1000u64.to_le_bytes());
    rec.extend_from_slice(b"k....");
    append_raw(&path2, &rec);
    expect_corrupt(s2.try_get("k"), end, "past the end");
}

#[test]
fn unknown_op_is_corrupt() {
    let (_dir, path) = store_file();
    let s = FileStore::open(&path).unwrap();
    let end = fs::metadata(&path).unwrap().len();
    let mut rec = encode_record(OP_SET, "k", b"v");
    rec[0] = 9;
    append_raw(&path, &rec);
    expect_corrupt(s.try_get("k"), end, "op");
}

#[test]
fn shrunk_file_is_corrupt() {
    let (_dir, path) = store_file();
    let s = FileStore::open(&path).unwrap();
    s.set("a", b"1").unwrap();
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(HEADER_LEN)
        .unwrap();
    expect_corrupt(s.try_get("a"), HEADER_LEN, "shrank");
}

#[test]
fn corruption_after_valid_records_keeps_offset() {
    let (_dir, path) = store_file();
    let a = FileStore::open(&path).unwrap();
    let b = FileStore::open(&path).unwrap();
    a.set("x", b"1").unwrap();
    assert_eq!(b.try_get("x").unwrap(), Some(b"1".to_vec()));
    a.set("y", b"2").unwrap();
    let end = fs::metadata(&path).unwrap().len();
    append_raw(&path, b"garbage garbage garbage");
    // `b` has not seen "y" yet: it applies it, then reports the garbage.
    expect_corrupt(b.try_get("y"), end, "");
    expect_corrupt(b.try_get("y"), end, "");
}
