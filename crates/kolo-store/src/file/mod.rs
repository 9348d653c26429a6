//! [`FileStore`]: a store shared through an append-only log file.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::deadline::{Backoff, Deadline};
use crate::sys::{self, LockKind};
use crate::{
    add_to_counter, validate_key, validate_value, validate_wait_keys, CompareSet, Store, StoreError,
};

mod record;
#[cfg(test)]
mod tests;

use record::{encode_record, OP_DELETE, OP_SET};

/// First bytes of a store file.
const FILE_MAGIC: [u8; 4] = *b"KOLF";
/// Version of the file format.
const FILE_VERSION: u16 = 1;
/// Header: magic, `u16` version, `u16` reserved (zero).
const HEADER_LEN: u64 = 8;
/// How long to wait for another process to release the file lock. Locks
/// are held only for the duration of one small read or append, so hitting
/// this means the holder is stuck (e.g. a stopped process).
const LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// A store shared by processes on one host (or on a shared file system
/// with working `flock`) through one file, like torch's `FileStore`.
///
/// # Format
///
/// The file is an 8-byte header (`"KOLF"`, `u16` version, `u16` zero)
/// followed by an append-only log of records
/// `[u8 op][u32 key_len][u64 value_len][key][value][u32 FNV-1a checksum]`
/// (little-endian), where op 1 sets a key and op 2 deletes it. Counters
/// from `add` are set records holding the decimal text of the new value.
///
/// # Concurrency
///
/// Every write (`set`, `add`, `compare_set`, `delete`) takes an exclusive
/// `flock` on the file, replays the records appended since this handle last
/// looked, decides, and appends one record, so read-modify-write operations
/// are atomic across processes and appends never interleave. Reads take a
/// shared lock and replay only the new bytes (the parsed state is cached).
/// `get` and `wait` poll with a 1 ms to 10 ms backoff until their deadline.
/// Separate handles (in one process or several) are independent, as
/// separate processes are.
///
/// # Damage and crashed writers
///
/// Since readers only look at the file under a lock, they never see a
/// record that is being written. A record that is incomplete at the end of
/// the file can therefore only come from a writer that crashed mid-append
/// (or from outside damage); it is reported as [`StoreError::Corrupt`], like
/// any record with a bad checksum, an unknown op, a length over the limits
/// or one that runs past the end of the file. This crate never silently
/// drops or truncates data it cannot account for. The one exception: a
/// writer whose own append fails part-way (e.g. disk full) truncates the
/// file back to where its record began before reporting the I/O error.
///
/// The log is never compacted; it is meant for the short rendezvous phase
/// of a job. Use a fresh file per job.
///
/// ```
/// use std::time::Duration;
/// use kolo_store::{FileStore, Store};
///
/// let dir = tempfile::tempdir().expect("tempdir");
/// let path = dir.path().join("rendezvous");
/// let a = FileStore::open(&path)?;
/// let b = FileStore::open(&path)?; // e.g. in another process
/// a.set("addr/0", b"10.0.0.1:2900")?;
/// assert_eq!(b.get("addr/0", Duration::from_secs(1))?, b"10.0.0.1:2900");
/// # Ok::<(), kolo_store::StoreError>(())
/// ```
#[derive(Debug)]
pub struct FileStore {
    path: PathBuf,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    file: File,
    state: LogState,
}

/// The replayed contents of the log.
#[derive(Debug)]
struct LogState {
    /// Byte offset up to which the log has been replayed into `map`.
    offset: u64,
    map: HashMap<String, Vec<u8>>,
}

/// Holds a `flock` lock until dropped.
struct FlockGuard<'a> {
    file: &'a File,
}

impl Drop for FlockGuard<'_> {
    fn drop(&mut self) {
        // Closing the descriptor would release it too; an error here leaves
        // nothing to recover.
        let _ = sys::unlock(self.file);
    }
}

impl FileStore {
    /// Opens (creating if needed) the store file at `path`.
    ///
    /// A file that exists but does not start with a valid store header is
    /// [`StoreError::Corrupt`].
    pub fn open(path: impl AsRef<Path>) -> Result<FileStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(|e| StoreError::io(format!("opening store file {}", path.display()), e))?;
        let store = FileStore {
            path,
            inner: Mutex::new(Inner {
                file,
                state: LogState {
                    offset: HEADER_LEN,
                    map: HashMap::new(),
                },
            }),
        };
        {
            let mut guard = store.lock_inner();
            let Inner { file, state } = &mut *guard;
            let _flock = store.flock(file, LockKind::Exclusive)?;
            store.init_header(file)?;
            store.catch_up(file, state)?;
        }
        Ok(store)
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock_inner(&self) -> MutexGuard<'_, Inner> {
        // No code path panics while holding the lock and `offset`/`map` are
        // updated together per record, so a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn corrupt(&self, offset: u64, reason: impl Into<String>) -> StoreError {
        StoreError::Corrupt {
            path: self.path.clone(),
            offset,
            reason: reason.into(),
        }
    }

    fn io_err(&self, what: &str, e: io::Error) -> StoreError {
        StoreError::io(format!("{what} store file {}", self.path.display()), e)
    }

    /// Takes a `flock` lock, polling up to [`LOCK_TIMEOUT`].
    fn flock<'a>(&self, file: &'a File, kind: LockKind) -> Result<FlockGuard<'a>, StoreError> {
        let deadline = Deadline::after(LOCK_TIMEOUT);
        let mut backoff = Backoff::new(Duration::from_micros(200), Duration::from_millis(10));
        loop {
            if sys::try_flock(file, kind).map_err(|e| self.io_err("locking", e))? {
                return Ok(FlockGuard { file });
            }
            if deadline.expired() {
                return Err(self.io_err(
                    "waiting for the lock on",
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("another process held the lock for more than {LOCK_TIMEOUT:?}"),
                    ),
                ));
            }
            backoff.sleep(&deadline);
        }
    }

    /// Writes the header of a new file or checks an existing one.
    /// Called with the exclusive lock held.
    fn init_header(&self, mut file: &File) -> Result<(), StoreError> {
        let len = file
            .metadata()
            .map_err(|e| self.io_err("reading the size of", e))?
            .len();
        if len == 0 {
            let mut header = [0u8; HEADER_LEN as usize];
            header[..4].copy_from_slice(&FILE_MAGIC);
            header[4..6].copy_from_slice(&FILE_VERSION.to_le_bytes());
            if let Err(e) = file.write_all(&header) {
                let _ = file.set_len(0);
                return Err(self.io_err("writing the header of", e));
            }
            return Ok(());
        }
        if len < HEADER_LEN {
            return Err(self.corrupt(
                0,
                format!("the file has {len} bytes, fewer than its {HEADER_LEN}-byte header"),
            ));
        }
        let mut header = [0u8; HEADER_LEN as usize];
        file.read_exact_at(&mut header, 0)
            .map_err(|e| self.io_err("reading the header of", e))?;
        if header[..4] != FILE_MAGIC {
            return Err(self.corrupt(
                0,
                "the file does not start with \"KOLF\": not a kolo store file",
            ));
        }
        let version = u16::from_le_bytes([header[4], header[5]]);
        if version != FILE_VERSION {
            return Err(self.corrupt(
                4,
                format!(
                    "unsupported file format version {version} (this build reads {FILE_VERSION})"
                ),
            ));
        }
        Ok(())
    }

    /// Replays the records appended since `inner.offset`. Called with a
    /// lock (shared or exclusive) held.
    fn catch_up(&self, file: &File, inner: &mut LogState) -> Result<(), StoreError> {
        let len = file
            .metadata()
            .map_err(|e| self.io_err("reading the size of", e))?
            .len();
        if len < inner.offset {
            return Err(self.corrupt(
                len,
                format!(
                    "the file shrank from {} to {len} bytes: it was truncated or replaced",
                    inner.offset
                ),
            ));
        }
        if len == inner.offset {
            return Ok(());
        }
        let new_bytes = usize::try_from(len - inner.offset).map_err(|_| {
            self.corrupt(
                inner.offset,
                "the unread part of the file does not fit in memory",
            )
        })?;
        let mut buf = vec![0u8; new_bytes];
        file.read_exact_at(&mut buf, inner.offset)
            .map_err(|e| self.io_err("reading", e))?;
        let mut pos = 0usize;
        while pos < buf.len() {
            let at = inner.offset;
            let used = self.apply_record(&buf[pos..], at, &mut inner.map)?;
            pos += used;
            inner.offset += used as u64;
        }
        Ok(())
    }

    /// Appends one record and applies it. Called with the exclusive lock
    /// held, right after `catch_up`, so the file ends at `inner.offset`.
    fn append(
        &self,
        mut file: &File,
        inner: &mut LogState,
        op: u8,
        key: &str,
        value: &[u8],
    ) -> Result<(), StoreError> {
        let record = encode_record(op, key, value);
        if let Err(e) = file.write_all(&record) {
            // Roll back our own partial append so the log stays parseable.
            let _ = file.set_len(inner.offset);
            return Err(self.io_err("appending to", e));
        }
        inner.offset += record.len() as u64;
        if op == OP_SET {
            inner.map.insert(key.to_owned(), value.to_vec());
        } else {
            inner.map.remove(key);
        }
        Ok(())
    }

    /// Runs `f` on the up-to-date state under a `flock` of the given kind.
    fn with_state<T>(
        &self,
        kind: LockKind,
        f: impl FnOnce(&Self, &File, &mut LogState) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut guard = self.lock_inner();
        let Inner { file, state } = &mut *guard;
        let _flock = self.flock(file, kind)?;
        self.catch_up(file, state)?;
        f(self, file, state)
    }

    /// Polls until `check` returns `Some`, or the deadline passes.
    fn poll<T>(
        &self,
        timeout: Duration,
        mut check: impl FnMut(&HashMap<String, Vec<u8>>) -> Result<T, Vec<String>>,
    ) -> Result<T, StoreError> {
        let deadline = Deadline::after(timeout);
        let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(10));
        loop {
            let outcome = self.with_state(LockKind::Shared, |_, _, state| Ok(check(&state.map)))?;
            match outcome {
                Ok(value) => return Ok(value),
                Err(missing) if deadline.expired() => {
                    return Err(StoreError::Timeout {
                        keys: missing,
                        waited: deadline.elapsed(),
                    })
                }
                Err(_) => backoff.sleep(&deadline),
            }
        }
    }
}

impl Store for FileStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        validate_key(key)?;
        validate_value(value)?;
        self.with_state(LockKind::Exclusive, |s, file, state| {
            s.append(file, state, OP_SET, key, value)
        })
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        validate_key(key)?;
        self.poll(timeout, |map| {
            map.get(key).cloned().ok_or_else(|| vec![key.to_owned()])
        })
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        validate_key(key)?;
        self.with_state(LockKind::Shared, |_, _, state| {
            Ok(state.map.get(key).cloned())
        })
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        validate_wait_keys(keys)?;
        self.poll(timeout, |map| {
            let missing: Vec<String> = keys
                .iter()
                .filter(|k| !map.contains_key(**k))
                .map(|k| (*k).to_owned())
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(missing)
            }
        })
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        validate_key(key)?;
        self.with_state(LockKind::Exclusive, |s, file, state| {
            let new = add_to_counter(key, state.map.get(key).map(Vec::as_slice), delta)?;
            s.append(file, state, OP_SET, key, new.to_string().as_bytes())?;
            Ok(new)
        })
    }

    fn compare_set(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        desired: &[u8],
    ) -> Result<CompareSet, StoreError> {
        validate_key(key)?;
        validate_value(desired)?;
        self.with_state(LockKind::Exclusive, |s, file, state| {
            let current = state.map.get(key).map(Vec::as_slice);
            if current != expected {
                return Ok(CompareSet::Mismatch {
                    current: current.map(<[u8]>::to_vec),
                });
            }
            s.append(file, state, OP_SET, key, desired)?;
            Ok(CompareSet::Swapped)
        })
    }

    fn delete(&self, key: &str) -> Result<bool, StoreError> {
        validate_key(key)?;
        self.with_state(LockKind::Exclusive, |s, file, state| {
            if !state.map.contains_key(key) {
                return Ok(false);
            }
            s.append(file, state, OP_DELETE, key, &[])?;
            Ok(true)
        })
    }

    fn num_keys(&self) -> Result<usize, StoreError> {
        self.with_state(LockKind::Shared, |_, _, state| Ok(state.map.len()))
    }
}
