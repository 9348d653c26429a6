//! What runs without a GPU: loading NCCL (the real library where one is installed, e.g. by PyTorch's
//! wheels), its errors, the unique id, and the errors of asking a machine without a GPU for NCCL.

use std::path::PathBuf;
use std::time::Duration;

use crate::ffi::Nccl;
use crate::{NcclEngine, NcclId};

/// A `libnccl.so.2` on this machine: `$KOLO_TEST_NCCL`, the path `$KOLO_NCCL_LIBRARY` names (as
/// `scripts/gpu-check.sh` sets it), or the one PyTorch's wheels installed in kolo's torch venv
/// (scripts/install-torch.sh).
fn installed_nccl() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("KOLO_TEST_NCCL") {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = std::env::var_os("KOLO_NCCL_LIBRARY")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
    {
        return Some(p);
    }
    let home = std::env::var("HOME").ok()?;
    let cache = PathBuf::from(home).join(".cache/kolo");
    for venv in std::fs::read_dir(cache).ok()?.flatten() {
        let lib = venv.path().join("lib");
        for py in std::fs::read_dir(&lib).ok()?.flatten() {
            let p = py.path().join("site-packages/nvidia/nccl/lib/libnccl.so.2");
            if p.exists() {
                return Some(p);
            }
        }
    }
    None
}

#[test]
fn a_missing_library_is_an_error_naming_it_and_the_fix() {
    let err = Nccl::load_from(&["/nonexistent/libnccl.so.2".into()])
        .map(|_| ())
        .expect_err("no such file");
    let msg = err.to_string();
    assert!(msg.contains("/nonexistent/libnccl.so.2"), "{msg}");
    assert!(
        msg.contains("LD_LIBRARY_PATH") && msg.contains("KOLO_NCCL_LIBRARY"),
        "{msg}"
    );
}

#[test]
fn a_library_that_is_not_nccl_is_an_error_naming_the_symbol() {
    let err = Nccl::load_from(&["libm.so.6".into()])
        .map(|_| ())
        .expect_err("libm is not NCCL");
    let msg = err.to_string();
    assert!(msg.contains("libm.so.6 has no ncclGetVersion"), "{msg}");
}

#[test]
fn a_unique_id_of_the_wrong_length_is_refused() {
    let err = NcclId::from_bytes(&[0u8; 12]).expect_err("12 bytes");
    assert!(err.to_string().contains("128 bytes"), "{err}");
    let id = NcclId::from_bytes(&[7u8; 128]).expect("128 bytes");
    assert_eq!(id.as_bytes(), &[7u8; 128]);
}

#[test]
fn the_installed_nccl_loads_and_reports_its_version() {
    let Some(path) = installed_nccl() else {
        eprintln!("no libnccl.so.2 here (run scripts/install-torch.sh); skipped");
        return;
    };
    let n = Nccl::load_from(&[path.display().to_string()]).expect("NCCL loads");
    let mut code = 0;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { (n.get_version)(&mut code) }, 0);
    assert!(code >= 21800, "NCCL {code}: kolo needs 2.18 or later");
    // Error strings come from the library itself.
    assert!(
        n.describe(1).contains("unhandled cuda error"),
        "{}",
        n.describe(1)
    );
    let mut raw = crate::ffi::RawId { internal: [0; 128] };
    // SAFETY: a valid out-parameter.
    let rc = unsafe { (n.get_unique_id)(&mut raw) };
    // NCCL's bootstrap address (this host's, no GPU involved): what rank 0 publishes.
    assert_eq!(rc, 0, "ncclGetUniqueId: {}", n.describe(rc));
    assert!(raw.internal.iter().any(|&b| b != 0));
}

#[test]
fn a_bad_rank_or_node_list_is_refused_before_anything_loads() {
    let id = NcclId::from_bytes(&[0u8; 128]).expect("id");
    let one = Duration::from_secs(1);
    let e = NcclEngine::new(
        &id,
        (2, 2),
        0,
        vec!["a".into(); 2],
        one,
        std::sync::Arc::new(|| Ok(())),
    )
    .expect_err("rank 2 of 2");
    assert!(
        matches!(
            e,
            kolo_core::Error::RankOutOfRange {
                value: 2,
                size: 2,
                ..
            }
        ),
        "{e}"
    );
    let e = NcclEngine::new(
        &id,
        (0, 2),
        0,
        vec!["a".into()],
        one,
        std::sync::Arc::new(|| Ok(())),
    )
    .expect_err("one node id for two ranks");
    assert!(e.to_string().contains("1 node ids for 2 ranks"), "{e}");
}

#[test]
fn without_a_gpu_the_engine_is_an_error_naming_what_is_missing() {
    if crate::driver_present().is_ok() {
        eprintln!("a CUDA driver is present: the GPU tests apply instead; skipped");
        return;
    }
    let id = NcclId::from_bytes(&[0u8; 128]).expect("id");
    let names = vec!["a".to_owned(); 2];
    let err = NcclEngine::new(
        &id,
        (1, 2),
        0,
        names,
        Duration::from_secs(1),
        std::sync::Arc::new(|| Ok(())),
    )
    .expect_err("no GPU here");
    let msg = err.to_string();
    // Either library may be the first missing one, and the error names the rank.
    assert!(msg.contains("on rank 1"), "{msg}");
    assert!(
        msg.contains("libcuda.so.1") || msg.contains("NCCL library"),
        "{msg}"
    );
    assert!(crate::device_count().is_err());
}

/// With a GPU and NCCL (`scripts/gpu-check.sh`): a world of one process joins through the
/// non-blocking init, reduces device memory (`NcclEngine::all_reduce_device`, the queued
/// `DeviceCollectives` form and its deadline-bounded wait), runs a host collective, splits, and
/// closes both communicators (finalize, then destroy). Prints `nccl engine gpu ok` for the
/// script to count; skipped (no line) without a GPU.
#[test]
fn on_a_gpu_a_world_of_one_reduces_device_memory() {
    use kolo_core::{DType, DeviceBuffer, DeviceCollectives, Engine, ReduceOp};
    if crate::device_count().map_or(true, |n| n == 0) || crate::ffi::nccl().is_err() {
        eprintln!("no GPU or no NCCL here: skipped");
        return;
    }
    let id = NcclId::new().expect("unique id");
    let watch: crate::Watch = std::sync::Arc::new(|| Ok(()));
    let engine = NcclEngine::new(
        &id,
        (0, 1),
        0,
        vec!["h".into()],
        Duration::from_secs(60),
        watch,
    )
    .expect("a world of one joins");
    let stream = engine.gpu.stream.clone();
    let host = [1.5f32, -2.0, 3.25, 7.0];
    let mut dev = stream.clone_htod(&host).expect("upload");
    engine
        .all_reduce_device(&mut dev, DType::F32, ReduceOp::Sum)
        .expect("all_reduce_device");
    engine
        .all_reduce_device(&mut dev, DType::F32, ReduceOp::Avg)
        .expect("all_reduce_device avg");
    assert_eq!(stream.clone_dtoh(&dev).expect("download"), host);
    let e = engine
        .all_reduce_device(&mut dev, DType::F64, ReduceOp::Sum)
        .expect_err("f64 on an f32 buffer");
    assert!(e.to_string().contains("bytes per element"), "{e}");
    // The queued form: a ticket, waited for once.
    let (ptr, _sync) = cudarc::driver::DevicePtr::device_ptr(&dev, &stream);
    let buf = DeviceBuffer {
        ptr,
        count: host.len(),
        dtype: DType::F32,
        ready: 0,
    };
    let t = engine.all_reduce_async(buf, ReduceOp::Max).expect("queued");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    engine.wait(t, deadline, &|| Ok(())).expect("waited");
    let e = engine
        .wait(t, deadline, &|| Ok(()))
        .expect_err("a ticket is waited for once");
    assert!(e.to_string().contains("not queued"), "{e}");
    drop(_sync);
    assert_eq!(stream.clone_dtoh(&dev).expect("download"), host);
    // A staged host collective and a split (non-blocking, polled), then both close.
    let mut bytes = 5.0f64.to_le_bytes();
    Engine::all_reduce(&engine, &mut bytes, DType::F64, ReduceOp::Sum).expect("host all-reduce");
    assert_eq!(f64::from_le_bytes(bytes), 5.0);
    let child = engine
        .split(Some(0), 0)
        .expect("split")
        .expect("in the new group");
    let mut one = [3u8];
    child
        .all_reduce(&mut one, DType::U8, ReduceOp::Max)
        .expect("child all-reduce");
    assert_eq!(one, [3]);
    drop(child);
    drop(engine);
    println!("nccl engine gpu ok");
}

/// `ncclConfig_t` as NCCL 2.17+ lays it out (nccl.h): a wrong offset would hand NCCL a blocking
/// communicator, or garbage, without any error.
#[test]
fn the_config_struct_has_ncclconfig_ts_layout() {
    use crate::ffi::Config;
    use std::mem::{offset_of, size_of};
    assert_eq!(size_of::<Config>(), 48);
    assert_eq!(offset_of!(Config, blocking), 16);
    let c = Config::non_blocking();
    assert_eq!(c.blocking, 0);
    // SAFETY: reading the first 16 bytes of a live, initialized repr(C) value.
    let head = unsafe { std::slice::from_raw_parts((&c as *const Config).cast::<u8>(), 16) };
    assert_eq!(&head[..8], &48usize.to_ne_bytes(), "size");
    assert_eq!(&head[8..12], &0xcafe_beefu32.to_ne_bytes(), "magic");
    assert_eq!(&head[12..16], &21800u32.to_ne_bytes(), "version 2.18.0");
}

#[test]
fn kolo_nccl_library_goes_first_when_set() {
    use kolo_core::settings::MapEnv;
    let set: MapEnv = [("KOLO_NCCL_LIBRARY", "/opt/nccl/libnccl.so.2")]
        .into_iter()
        .collect();
    assert_eq!(
        crate::ffi::candidates(set),
        ["/opt/nccl/libnccl.so.2", "libnccl.so.2", "libnccl.so"]
    );
    let empty: MapEnv = [("KOLO_NCCL_LIBRARY", "")].into_iter().collect();
    assert_eq!(
        crate::ffi::candidates(empty),
        ["libnccl.so.2", "libnccl.so"]
    );
}
