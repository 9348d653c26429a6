//! NCCL's C API, loaded at run time from `libnccl.so.2` (or `$KOLO_NCCL_LIBRARY`): the dozen
//! functions kolo calls, resolved once per process. A missing library or symbol is an error naming
//! it, never a panic or a link failure, so builds with the `nccl` feature run everywhere and fail
//! only when NCCL is asked for.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use kolo_core::{Error, Result};

/// `ncclComm_t`.
pub(crate) type Comm = *mut c_void;
/// `cudaStream_t` (the driver's `CUstream`: the same handle).
pub(crate) type Stream = *mut c_void;
/// `ncclResult_t`.
pub(crate) type Status = c_int;
/// `ncclSuccess`.
pub(crate) const SUCCESS: Status = 0;
/// `ncclInProgress`: a call on a non-blocking communicator (kolo's are) is still running; poll
/// `ncclCommGetAsyncError` until it is not.
pub(crate) const IN_PROGRESS: Status = 7;
/// `NCCL_SPLIT_NOCOLOR`.
pub(crate) const SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: what rank 0 creates and every rank passes to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RawId {
    pub(crate) internal: [c_char; UNIQUE_ID_BYTES],
}

/// `ncclConfig_t` as NCCL 2.17 laid it out (NCCL reads the fields its `size` and `version`
/// cover and gives later ones their defaults).
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Config {
    size: usize,
    magic: u32,
    version: u32,
    pub(crate) blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
    split_share: c_int,
}

/// `NCCL_CONFIG_UNDEF_INT`.
const UNDEF: c_int = c_int::MIN;

impl Config {
    /// `NCCL_CONFIG_INITIALIZER` of NCCL 2.18 with `blocking = 0`: calls on the communicator
    /// return `ncclInProgress` instead of blocking, so that every wait can have a deadline and
    /// end in `ncclCommAbort`.
    pub(crate) fn non_blocking() -> Config {
        Config {
            size: std::mem::size_of::<Config>(),
            magic: 0xcafe_beef,
            version: 21800,
            blocking: 0,
            cga_cluster_size: UNDEF,
            min_ctas: UNDEF,
            max_ctas: UNDEF,
            net_name: std::ptr::null(),
            split_share: UNDEF,
        }
    }
}

/// The NCCL entry points kolo uses.
pub(crate) struct Nccl {
    // Kept loaded for the function pointers' lifetime (the whole process).
    _lib: libloading::Library,
    /// Where it was loaded from (the name passed to `dlopen`).
    pub(crate) name: String,
    pub(crate) get_version: unsafe extern "C" fn(*mut c_int) -> Status,
    pub(crate) get_error_string: unsafe extern "C" fn(Status) -> *const c_char,
    pub(crate) get_unique_id: unsafe extern "C" fn(*mut RawId) -> Status,
    pub(crate) comm_init_rank_config:
        unsafe extern "C" fn(*mut Comm, c_int, RawId, c_int, *mut Config) -> Status,
    pub(crate) comm_abort: unsafe extern "C" fn(Comm) -> Status,
    pub(crate) comm_finalize: unsafe extern "C" fn(Comm) -> Status,
    pub(crate) comm_destroy: unsafe extern "C" fn(Comm) -> Status,
    pub(crate) comm_get_async_error: unsafe extern "C" fn(Comm, *mut Status) -> Status,
    pub(crate) comm_split:
        unsafe extern "C" fn(Comm, c_int, c_int, *mut Comm, *mut Config) -> Status,
    #[allow(clippy::type_complexity)]
    pub(crate) all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        Stream,
    ) -> Status,
    #[allow(clippy::type_complexity)]
    pub(crate) broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        Stream,
    ) -> Status,
    #[allow(clippy::type_complexity)]
    pub(crate) reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        c_int,
        Comm,
        Stream,
    ) -> Status,
    #[allow(clippy::type_complexity)]
    pub(crate) reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        Stream,
    ) -> Status,
    pub(crate) all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> Status,
    pub(crate) send:
        unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, Stream) -> Status,
    pub(crate) recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> Status,
    pub(crate) group_start: unsafe extern "C" fn() -> Status,
    pub(crate) group_end: unsafe extern "C" fn() -> Status,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl").field("name", &self.name).finish()
    }
}

/// The names tried, in order: `KOLO_NCCL_LIBRARY` of `env` if set, then NCCL's soname and the
/// development link.
pub(crate) fn candidates(env: impl kolo_core::settings::Env) -> Vec<String> {
    let mut names = Vec::new();
    if let Some(path) = env.lookup("KOLO_NCCL_LIBRARY") {
        if !path.is_empty() {
            names.push(path);
        }
    }
    names.extend(["libnccl.so.2".to_owned(), "libnccl.so".to_owned()]);
    names
}

/// Resolves `name` in `lib` as a value of type `F` (a function pointer type).
///
/// # Safety
/// `F` must be the symbol's C signature.
unsafe fn symbol<F: Copy>(lib: &libloading::Library, lib_name: &str, name: &str) -> Result<F> {
    // SAFETY: the caller vouches for the signature.
    let sym = unsafe { lib.get::<F>(name.as_bytes()) };
    sym.map(|s| *s).map_err(|e| {
        unavailable(format!(
            "{lib_name} has no {name} ({e}): NCCL 2.18 or later is needed"
        ))
    })
}

/// The error for a missing or unusable NCCL library.
pub(crate) fn unavailable(reason: String) -> Error {
    Error::Backend {
        op: "init",
        rank: 0,
        backend: "nccl",
        reason,
    }
}

impl Nccl {
    fn load() -> Result<Nccl> {
        Nccl::load_from(&candidates(kolo_core::settings::ProcessEnv))
    }

    /// The first of `names` that loads and has every entry point.
    pub(crate) fn load_from(names: &[String]) -> Result<Nccl> {
        let mut errors = Vec::new();
        for name in names {
            // SAFETY: loading NCCL runs its (and CUDA runtime's) initializers, which have no
            // preconditions.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => return Nccl::resolve(lib, name.clone()),
                Err(e) => errors.push(format!("{name}: {e}")),
            }
        }
        Err(unavailable(format!(
            "the NCCL library could not be loaded ({}); install NCCL (NVIDIA's libnccl2, or \
             PyPI's nvidia-nccl-cu12) and put its lib directory on LD_LIBRARY_PATH, or set \
             KOLO_NCCL_LIBRARY to its path",
            errors.join("; ")
        )))
    }

    fn resolve(lib: libloading::Library, name: String) -> Result<Nccl> {
        let n = name.as_str();
        // SAFETY: each type below is the C prototype of the symbol in nccl.h (2.18 and later).
        unsafe {
            Ok(Nccl {
                get_version: symbol(&lib, n, "ncclGetVersion")?,
                get_error_string: symbol(&lib, n, "ncclGetErrorString")?,
                get_unique_id: symbol(&lib, n, "ncclGetUniqueId")?,
                comm_init_rank_config: symbol(&lib, n, "ncclCommInitRankConfig")?,
                comm_abort: symbol(&lib, n, "ncclCommAbort")?,
                comm_finalize: symbol(&lib, n, "ncclCommFinalize")?,
                comm_destroy: symbol(&lib, n, "ncclCommDestroy")?,
                comm_get_async_error: symbol(&lib, n, "ncclCommGetAsyncError")?,
                comm_split: symbol(&lib, n, "ncclCommSplit")?,
                all_reduce: symbol(&lib, n, "ncclAllReduce")?,
                broadcast: symbol(&lib, n, "ncclBroadcast")?,
                reduce: symbol(&lib, n, "ncclReduce")?,
                reduce_scatter: symbol(&lib, n, "ncclReduceScatter")?,
                all_gather: symbol(&lib, n, "ncclAllGather")?,
                send: symbol(&lib, n, "ncclSend")?,
                recv: symbol(&lib, n, "ncclRecv")?,
                group_start: symbol(&lib, n, "ncclGroupStart")?,
                group_end: symbol(&lib, n, "ncclGroupEnd")?,
                _lib: lib,
                name,
            })
        }
    }

    /// NCCL's description of `status`.
    pub(crate) fn describe(&self, status: Status) -> String {
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any value.
        let s = unsafe { (self.get_error_string)(status) };
        if s.is_null() {
            return format!("NCCL error {status}");
        }
        // SAFETY: non-null, NUL-terminated, static.
        let text = unsafe { CStr::from_ptr(s) }.to_string_lossy();
        format!("{text} (ncclResult {status})")
    }
}

/// The process's NCCL, loaded on first use.
pub(crate) fn nccl() -> Result<&'static Nccl> {
    static NCCL: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();
    let loaded = NCCL.get_or_init(|| {
        Nccl::load().map_err(|e| match e {
            Error::Backend { reason, .. } => reason,
            e => e.to_string(),
        })
    });
    match loaded {
        Ok(n) => Ok(n),
        Err(reason) => Err(unavailable(reason.clone())),
    }
}

/// The loaded NCCL's version (`2.21.5`) and where it was loaded from.
pub fn version() -> Result<(String, String)> {
    let n = nccl()?;
    let mut code: c_int = 0;
    // SAFETY: `code` is a valid out-pointer.
    let rc = unsafe { (n.get_version)(&mut code) };
    if rc != SUCCESS {
        return Err(unavailable(format!("ncclGetVersion: {}", n.describe(rc))));
    }
    // NCCL_VERSION_CODE: major·10000 + minor·100 + patch since 2.9 (major·1000 + ... before).
    let (major, minor, patch) = if code >= 10000 {
        (code / 10000, code % 10000 / 100, code % 100)
    } else {
        (code / 1000, code % 1000 / 100, code % 100)
    };
    Ok((format!("{major}.{minor}.{patch}"), n.name.clone()))
}
