//! Shared test harness: run a closure on every rank of a world built on a given transport (gloo's
//! `spawn(transport, size, fn)`), plus data generators and a sequential reference.
#![allow(dead_code)]

pub mod checks;
#[cfg(feature = "mpi")]
pub mod mpirun;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kolo::prelude::*;
use kolo::store::{MemoryStore, Store};
use kolo::transport::{
    shm_world, HybridTransport, ShmOptions, ShmTransport, TcpOptions, TcpTransport,
};
use kolo::Transport;

/// The transports every test runs on (and `Hybrid`, for the tests that name it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Local,
    Shm,
    Tcp,
    /// Two pretend hosts: shared memory among the ranks of each, TCP between them.
    Hybrid,
}

pub const KINDS: [Kind; 3] = [Kind::Local, Kind::Shm, Kind::Tcp];

static NEXT_JOB: AtomicU64 = AtomicU64::new(0);

/// Communicators of a world of `n` ranks on transport `kind`.
pub fn world(kind: Kind, n: usize, config: Config) -> Vec<Communicator> {
    if kind == Kind::Shm {
        return kolo::shm_communicators(n, config).expect("shared-memory world");
    }
    let shm = ShmOptions::from_env().expect("shared-memory settings");
    world_with(kind, n, config, &shm)
}

/// Shared-memory settings with sends in place from 8 KiB, for the tests of sends in place (whose
/// messages are 64 KiB – 2 MiB; by default they start at 16 MiB).
pub fn in_place_shm() -> ShmOptions {
    ShmOptions {
        single_copy_bytes: 8 << 10,
        ..ShmOptions::from_env().expect("shared-memory settings")
    }
}

/// [`world`] with the shared-memory settings `shm` (of the shared-memory and hybrid worlds).
pub fn world_with(kind: Kind, n: usize, config: Config, shm: &ShmOptions) -> Vec<Communicator> {
    let over = |ts: Vec<Arc<dyn Transport>>| -> Vec<Communicator> {
        ts.into_iter()
            .map(|t| Communicator::with_transport(t, config.clone()))
            .collect()
    };
    match kind {
        Kind::Local => kolo::local_communicators(n, config),
        Kind::Shm => over(shared(shm_world(n, shm).expect("shared-memory world"))),
        Kind::Tcp => over(shared(tcp_world(n))),
        Kind::Hybrid => over(hybrid_world(n, shm)),
    }
}

/// A world's endpoints as the transports communicators take.
fn shared<T: Transport + 'static>(ts: Vec<T>) -> Vec<Arc<dyn Transport>> {
    ts.into_iter()
        .map(|t| Arc::new(t) as Arc<dyn Transport>)
        .collect()
}

/// The endpoints of a TCP world of `n` ranks on this host.
fn tcp_world(n: usize) -> Vec<TcpTransport> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let prefix = format!(
        "test/{}/{}",
        std::process::id(),
        NEXT_JOB.fetch_add(1, Ordering::SeqCst)
    );
    let opts = TcpOptions {
        connect_timeout: Duration::from_secs(30),
        ..TcpOptions::default()
    };
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (store, prefix, opts) = (store.clone(), prefix.clone(), opts.clone());
                s.spawn(move || TcpTransport::connect(&*store, &prefix, r, n, &opts))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("connect thread").expect("tcp connect"))
            .collect()
    })
}

/// A world of `n` ranks on two pretend hosts (the even ranks, and the odd ones: a rank's place on
/// its host is not its world rank), each rank a hybrid transport: shared memory to the ranks of its
/// host, TCP to the others.
fn hybrid_world(n: usize, opts: &ShmOptions) -> Vec<Arc<dyn Transport>> {
    let hosts: [Vec<usize>; 2] = [(0..n).step_by(2).collect(), (1..n).step_by(2).collect()];
    let mut shm: Vec<Option<ShmTransport>> = (0..n).map(|_| None).collect();
    for host in hosts.iter().filter(|h| !h.is_empty()) {
        let world = shm_world(host.len(), opts).expect("shared-memory world");
        for (t, &r) in world.into_iter().zip(host) {
            shm[r] = Some(t);
        }
    }
    tcp_world(n)
        .into_iter()
        .zip(shm)
        .enumerate()
        .map(|(r, (tcp, shm))| {
            let local = hosts
                .iter()
                .find(|h| h.contains(&r))
                .cloned()
                .unwrap_or_default();
            let shm = shm.expect("every rank is on a host");
            Arc::new(HybridTransport::new(shm, local, Box::new(tcp))) as Arc<dyn Transport>
        })
        .collect()
}

/// Runs `f` on every rank of a world of `n` on `kind`, returning each rank's result.
pub fn spawn<R: Send>(
    kind: Kind,
    n: usize,
    config: Config,
    f: impl Fn(Communicator) -> R + Sync,
) -> Vec<R> {
    run_on(world(kind, n, config), f)
}

/// [`spawn`] with the shared-memory settings `shm`.
pub fn spawn_with<R: Send>(
    kind: Kind,
    n: usize,
    config: Config,
    shm: &ShmOptions,
    f: impl Fn(Communicator) -> R + Sync,
) -> Vec<R> {
    run_on(world_with(kind, n, config, shm), f)
}

/// Runs `f` on each of `comms` on a thread of its own, returning each rank's result.
fn run_on<R: Send>(comms: Vec<Communicator>, f: impl Fn(Communicator) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let f = &f;
                s.spawn(move || f(c))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// Element types with a lossless conversion from small integers, for exact reference checks.
pub trait TestElem: Element + PartialEq {
    fn from_i(v: i64) -> Self;
    fn to_f(self) -> f64;
}

macro_rules! test_elem {
    ($($t:ty: $from:expr, $to:expr);* $(;)?) => {$(
        impl TestElem for $t {
            fn from_i(v: i64) -> Self { $from(v) }
            fn to_f(self) -> f64 { $to(self) }
        }
    )*};
}
test_elem! {
    f32: |v| v as f32, |x: f32| x as f64;
    f64: |v| v as f64, |x: f64| x;
    f16: |v| f16::from_f32(v as f32), |x: f16| x.to_f64();
    bf16: |v| bf16::from_f32(v as f32), |x: bf16| x.to_f64();
    i32: |v| v as i32, |x: i32| x as f64;
    i64: |v| v, |x: i64| x as f64;
    u8: |v| v as u8, |x: u8| x as f64;
}

/// Deterministic small values (1..=3), so sums and products of five ranks are exact in every type.
pub fn data<T: TestElem>(rank: usize, count: usize, salt: usize) -> Vec<T> {
    data_at(rank, 0, count, salt)
}

/// How often `data` repeats: a prime, so that no chunk or block size of an algorithm is a multiple
/// of it, and an element that lands at the wrong offset (unless a multiple of 1,021 away) or in
/// another rank's block shows.
const PERIOD: usize = 1021;

/// Element `i` of `data(rank, …, salt)`: 1, 2 or 3, mixed from the three numbers.
fn value(rank: usize, i: usize, salt: usize) -> i64 {
    let j = (i % PERIOD) as u64;
    let h = (j ^ ((rank as u64) << 10) ^ ((salt as u64) << 14)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    1 + (h >> 40) as i64 % 3
}

/// Elements `start..start + len` of `data(rank, …, salt)`, without making the ones before: one
/// period converted, then copies. (The conformance matrix checks millions of elements per call; made
/// element by element, its inputs and expected results took most of its time rather than kolo.)
pub fn data_at<T: TestElem>(rank: usize, start: usize, len: usize, salt: usize) -> Vec<T> {
    let period: Vec<T> = (start..start + len.min(PERIOD))
        .map(|i| T::from_i(value(rank, i, salt)))
        .collect();
    repeat(&period, len)
}

/// `reference` of `data_at(r, start, len, salt)` over ranks `0..n`: the reduction of one period
/// (computed by `reference`), repeated, as the inputs repeat.
pub fn reference_at<T: TestElem>(
    n: usize,
    start: usize,
    len: usize,
    salt: usize,
    op: ReduceOp,
) -> Vec<T> {
    let inputs: Vec<Vec<T>> = (0..n)
        .map(|r| data_at(r, start, len.min(PERIOD), salt))
        .collect();
    repeat(&reference(&inputs, op), len)
}

/// `len` elements of `period` (at most `PERIOD` long) repeated.
fn repeat<T: Copy>(period: &[T], len: usize) -> Vec<T> {
    (0..len).map(|i| period[i % PERIOD]).collect()
}

/// Sequential reference reduction of `inputs` (one vector per rank), written independently of kolo's
/// kernels: exact integer arithmetic, converted once at the end.
pub fn reference<T: TestElem>(inputs: &[Vec<T>], op: ReduceOp) -> Vec<T> {
    let n = inputs.len();
    let count = inputs.first().map_or(0, Vec::len);
    (0..count)
        .map(|i| {
            let vals = inputs.iter().map(|v| v[i].to_f().round() as i64);
            let r = match op {
                ReduceOp::Sum => vals.sum(),
                ReduceOp::Prod => vals.product(),
                ReduceOp::Min => vals.min().unwrap_or(0),
                ReduceOp::Max => vals.max().unwrap_or(0),
                ReduceOp::Avg => return avg::<T>(vals.sum(), n),
            };
            T::from_i(r)
        })
        .collect()
}

/// The average the way each type computes it: integer division for integers, a division in the
/// type's own precision for floats (through f32 for the half types).
fn avg<T: TestElem>(sum: i64, n: usize) -> T {
    match T::DTYPE {
        DType::I32 | DType::I64 | DType::U8 => T::from_i(sum / n as i64),
        DType::F64 => from_f64::<T>(sum as f64 / n as f64),
        _ => from_f64::<T>(f64::from(sum as f32 / n as f32)),
    }
}

fn from_f64<T: TestElem>(v: f64) -> T {
    // Only called for float types.
    let bytes: Vec<u8> = match T::DTYPE {
        DType::F32 => (v as f32).to_le_bytes().to_vec(),
        DType::F64 => v.to_le_bytes().to_vec(),
        DType::F16 => f16::from_f64(v).to_le_bytes().to_vec(),
        DType::BF16 => bf16::from_f64(v).to_le_bytes().to_vec(),
        _ => unreachable!("from_f64 on an integer type"),
    };
    kolo_core::dtype::vec_from_bytes::<T>(&bytes)[0]
}

/// Byte view, for exact (bitwise) comparison of float results.
pub fn bytes<T: Element>(v: &[T]) -> &[u8] {
    kolo_core::dtype::as_bytes(v)
}
