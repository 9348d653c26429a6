//! A named shared-memory segment in `/dev/shm`, mapped read-write.
//!
//! The creator makes the file with `O_EXCL` and reserves its pages (`posix_fallocate`, so a full
//! `/dev/shm` is an error now rather than a `SIGBUS` later); the others open it by name. The name is
//! removed as soon as every rank has mapped it (see the transport), so a crash afterwards leaves
//! nothing behind: the memory lives exactly as long as some process maps it.

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};

/// Directory of the segments.
pub const SHM_DIR: &str = "/dev/shm";

/// A mapped segment. Unmapped on drop; the file is removed separately with [`Segment::unlink`].
#[derive(Debug)]
pub struct Segment {
    ptr: *mut u8,
    len: usize,
    path: PathBuf,
}

// SAFETY: the mapping is plain memory shared by design; all access goes through atomics or through
// regions the transport's protocol gives to one writer at a time.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment name contains NUL"))
}

impl Segment {
    /// Path of the segment called `name`.
    pub fn path_of(name: &str) -> PathBuf {
        Path::new(SHM_DIR).join(name)
    }

    /// Creates segment `name` of `len` bytes (zero-filled); fails if it exists.
    pub fn create(name: &str, len: usize) -> io::Result<Segment> {
        let path = Segment::path_of(name);
        let c = cpath(&path)?;
        // SAFETY: a valid NUL-terminated path; the returned descriptor is checked.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is ours.
        let r = unsafe { libc::posix_fallocate(fd, 0, len as libc::off_t) };
        if r != 0 {
            // SAFETY: fd is ours; the path was created above.
            unsafe {
                libc::close(fd);
                libc::unlink(c.as_ptr());
            }
            return Err(io::Error::from_raw_os_error(r));
        }
        let seg = Segment::map(fd, len, path.clone());
        if seg.is_err() {
            // SAFETY: the path was created above.
            unsafe { libc::unlink(c.as_ptr()) };
        }
        seg
    }

    /// Opens existing segment `name`, which must be `len` bytes long.
    pub fn open(name: &str, len: usize) -> io::Result<Segment> {
        let path = Segment::path_of(name);
        let c = cpath(&path)?;
        // SAFETY: a valid NUL-terminated path; the returned descriptor is checked.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is ours; `st` is written by fstat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: fd is ours.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        if st.st_size as u64 != len as u64 {
            // SAFETY: fd is ours.
            unsafe { libc::close(fd) };
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is {} bytes, expected {len} (a different kolo version or settings?)",
                    path.display(),
                    st.st_size
                ),
            ));
        }
        Segment::map(fd, len, path)
    }

    fn map(fd: libc::c_int, len: usize, path: PathBuf) -> io::Result<Segment> {
        // SAFETY: mapping a regular file we opened read-write; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        let err = io::Error::last_os_error();
        // SAFETY: the mapping keeps its own reference to the file.
        unsafe { libc::close(fd) };
        if ptr == libc::MAP_FAILED {
            return Err(err);
        }
        Ok(Segment {
            ptr: ptr.cast(),
            len,
            path,
        })
    }

    /// Removes the segment's name (the mapping stays valid). Errors other than "already gone" are
    /// returned.
    pub fn unlink(&self) -> io::Result<()> {
        let c = cpath(&self.path)?;
        // SAFETY: a valid NUL-terminated path.
        if unsafe { libc::unlink(c.as_ptr()) } != 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::NotFound {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Start of the mapping.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
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

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped; nothing refers to it after the owner drops.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
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
