//! A named shared-memory segment in `/dev/shm`, mapped read-write.
//!
//! The creator makes the file with `O_EXCL` and reserves its pages (`posix_fallocate`, so a full
//! `/dev/shm` is an error now rather than a `SIGBUS` later); the others open it by name. The name is
//! removed as soon as every rank has mapped it (see the transport), so a crash afterwards leaves
//! nothing behind: the memory lives exactly as long as some process maps it.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::{fallocate, FallocateFlags};

/// Directory of the segments.
pub const SHM_DIR: &str = "/dev/shm";

/// A mapped segment. Unmapped on drop; the file is removed separately with [`Segment::unlink`].
#[derive(Debug)]
pub struct Segment {
    map: MmapRaw,
    len: usize,
    path: PathBuf,
}

impl Segment {
    /// Path of the segment called `name`.
    pub fn path_of(name: &str) -> PathBuf {
        Path::new(SHM_DIR).join(name)
    }

    /// Creates segment `name` of `len` bytes (zero-filled); fails if it exists.
    pub fn create(name: &str, len: usize) -> io::Result<Segment> {
        let path = Segment::path_of(name);
        // std opens with O_CLOEXEC; `create_new` is O_CREAT | O_EXCL.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        // Reserve the pages now (tmpfs supports fallocate), like posix_fallocate.
        if let Err(e) = fallocate(&file, FallocateFlags::empty(), 0, len as u64) {
            let _ = std::fs::remove_file(&path);
            return Err(e.into());
        }
        let seg = Segment::map(&file, len, path.clone());
        if seg.is_err() {
            let _ = std::fs::remove_file(&path);
        }
        seg
    }

    /// Opens existing segment `name`, mapping all of it (the caller checks its layout).
    pub fn open(name: &str) -> io::Result<Segment> {
        let path = Segment::path_of(name);
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        let len = usize::try_from(file.metadata()?.len()).unwrap_or(usize::MAX);
        if len < 4096 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is {len} bytes, too short for a kolo segment",
                    path.display()
                ),
            ));
        }
        Segment::map(&file, len, path)
    }

    /// Maps `file` shared and read-write; the mapping keeps its own reference to the file, which
    /// the caller closes.
    fn map(file: &File, len: usize, path: PathBuf) -> io::Result<Segment> {
        let map = MmapOptions::new().len(len).map_raw(file)?;
        Ok(Segment { map, len, path })
    }

    /// Removes the segment's name (the mapping stays valid). Errors other than "already gone" are
    /// returned.
    pub fn unlink(&self) -> io::Result<()> {
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Start of the mapping.
    #[inline]
    pub fn ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never, for a segment that was created).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Path of the segment.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Removes every segment whose name starts with `prefix` (the launcher's clean-up for a job whose
/// workers died before they could remove their own); returns how many were removed.
pub fn remove_with_prefix(prefix: &str) -> usize {
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}
