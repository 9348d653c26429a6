//! Conformance: every collective × element type × reduce operator, on every transport and every
//! all-reduce algorithm, for world sizes 1–5 and counts 0, 1, 7 and 1,000,003, against a sequential
//! reference. Inputs are small integers, so every result is exact and compared bit for bit.

mod common;

use common::{bytes, data, data_at, reference_at, spawn, Kind, TestElem};
use kolo::prelude::*;
use kolo::Algorithm;

const SMALL: [usize; 3] = [0, 1, 7];
const LARGE: usize = 1_000_003;
const ALGOS: [Algorithm; 4] = [
    Algorithm::Ring,
    Algorithm::RecursiveDoubling,
    Algorithm::HalvingDoubling,
    Algorithm::BinomialTree,
];

type Check = Result<(), String>;

fn expect_eq<T: TestElem>(what: &str, got: &[T], want: &[T]) -> Check {
    if bytes(got) == bytes(want) {
        return Ok(());
    }
    let i = got
        .iter()
        .zip(want)
        .position(|(a, b)| bytes(&[*a]) != bytes(&[*b]));
    Err(match i {
        Some(i) => format!(
            "{what}: element {i} is {:?}, expected {:?}",
            got[i], want[i]
        ),
        None => format!("{what}: {} elements, expected {}", got.len(), want.len()),
    })
}

/// The reductions (all-reduce, reduce, reduce-scatter) for every operator.
fn reductions<T: TestElem>(comm: &Communicator, count: usize) -> Check {
    let (n, r) = (comm.size(), comm.rank());
    let ctx =
        |op: &str, red: ReduceOp| format!("{op} {} x {count} {red} on rank {r}/{n}", T::DTYPE);
    for (salt, red) in ReduceOp::ALL.into_iter().enumerate() {
        // all_reduce
        let mut buf: Vec<T> = data(r, count, salt);
        comm.all_reduce(&mut buf, red)
            .map_err(|e| format!("{}: {e}", ctx("all_reduce", red)))?;
        expect_eq(
            &ctx("all_reduce", red),
            &buf,
            &reference_at::<T>(n, 0, count, salt, red),
        )?;

        // reduce to the last rank (a non-zero root); other ranks keep their input
        let root = n - 1;
        let mut buf: Vec<T> = data(r, count, salt);
        comm.reduce(&mut buf, red, root)
            .map_err(|e| format!("{}: {e}", ctx("reduce", red)))?;
        let want = if r == root {
            reference_at::<T>(n, 0, count, salt, red)
        } else {
            data(r, count, salt)
        };
        expect_eq(&ctx("reduce", red), &buf, &want)?;

        // reduce_scatter: each rank gets its block of the reduction (blocks of count / n elements
        // for the large count, so every collective moves about the same amount of data)
        let block = if count > 1000 { count / n } else { count };
        let send: Vec<T> = data(r, block * n, salt);
        let mut recv = vec![T::from_i(0); block];
        comm.reduce_scatter(&send, &mut recv, red)
            .map_err(|e| format!("{}: {e}", ctx("reduce_scatter", red)))?;
        let mine = reference_at::<T>(n, r * block, block, salt, red);
        expect_eq(&ctx("reduce_scatter", red), &recv, &mine)?;
    }
    Ok(())
}

/// The data movers, equal-count and variable-count forms.
fn movers<T: TestElem>(comm: &Communicator, count: usize) -> Check {
    let (n, r) = (comm.size(), comm.rank());
    let ctx = |op: &str| format!("{op} {} x {count} on rank {r}/{n}", T::DTYPE);
    let z = T::from_i(0);
    let root = n / 2;

    let mut buf = if r == root {
        data::<T>(root, count, 1)
    } else {
        vec![z; count]
    };
    comm.broadcast(&mut buf, root)
        .map_err(|e| format!("{}: {e}", ctx("broadcast")))?;
    expect_eq(&ctx("broadcast"), &buf, &data::<T>(root, count, 1))?;

    let send = if r == root {
        data::<T>(root, count * n, 2)
    } else {
        vec![]
    };
    let mut recv = vec![z; count];
    comm.scatter(&send, &mut recv, root)
        .map_err(|e| format!("{}: {e}", ctx("scatter")))?;
    expect_eq(
        &ctx("scatter"),
        &recv,
        &data_at::<T>(root, r * count, count, 2),
    )?;

    let concat: Vec<T> = (0..n).flat_map(|s| data::<T>(s, count, 3)).collect();
    let mut recv = vec![z; if r == root { count * n } else { 0 }];
    comm.gather(&data::<T>(r, count, 3), &mut recv, root)
        .map_err(|e| format!("{}: {e}", ctx("gather")))?;
    if r == root {
        expect_eq(&ctx("gather"), &recv, &concat)?;
    }

    let mut recv = vec![z; count * n];
    comm.all_gather(&data::<T>(r, count, 3), &mut recv)
        .map_err(|e| format!("{}: {e}", ctx("all_gather")))?;
    expect_eq(&ctx("all_gather"), &recv, &concat)?;

    let mut recv = vec![z; count * n];
    comm.all_to_all(&data::<T>(r, count * n, 4), &mut recv)
        .map_err(|e| format!("{}: {e}", ctx("all_to_all")))?;
    let want: Vec<T> = (0..n)
        .flat_map(|s| data_at::<T>(s, r * count, count, 4))
        .collect();
    expect_eq(&ctx("all_to_all"), &recv, &want)?;

    // Variable counts: rank s contributes count + s elements.
    let counts: Vec<usize> = (0..n).map(|s| count + s).collect();
    let total: usize = counts.iter().sum();
    let concat_v: Vec<T> = (0..n).flat_map(|s| data::<T>(s, counts[s], 5)).collect();
    let mut recv = vec![z; total];
    comm.all_gather_v(&data::<T>(r, counts[r], 5), &mut recv, &counts)
        .map_err(|e| format!("{}: {e}", ctx("all_gather_v")))?;
    expect_eq(&ctx("all_gather_v"), &recv, &concat_v)?;

    let mut recv = vec![z; if r == root { total } else { 0 }];
    comm.gather_v(&data::<T>(r, counts[r], 5), &mut recv, &counts, root)
        .map_err(|e| format!("{}: {e}", ctx("gather_v")))?;
    if r == root {
        expect_eq(&ctx("gather_v"), &recv, &concat_v)?;
    }

    let send = if r == root {
        data::<T>(root, total, 6)
    } else {
        vec![]
    };
    let mut recv = vec![z; counts[r]];
    comm.scatter_v(&send, &counts, &mut recv, root)
        .map_err(|e| format!("{}: {e}", ctx("scatter_v")))?;
    let off: usize = counts[..r].iter().sum();
    expect_eq(
        &ctx("scatter_v"),
        &recv,
        &data_at::<T>(root, off, counts[r], 6),
    )?;

    // all_to_all_v: rank s sends count + (s + d) % 3 elements to rank d.
    let sc = |s: usize, d: usize| count + (s + d) % 3;
    let send_counts: Vec<usize> = (0..n).map(|d| sc(r, d)).collect();
    let recv_counts: Vec<usize> = (0..n).map(|s| sc(s, r)).collect();
    let send_of = |s: usize| data::<T>(s, (0..n).map(|d| sc(s, d)).sum(), 7);
    let mut recv = vec![z; recv_counts.iter().sum()];
    comm.all_to_all_v(&send_of(r), &send_counts, &mut recv, &recv_counts)
        .map_err(|e| format!("{}: {e}", ctx("all_to_all_v")))?;
    let want: Vec<T> = (0..n)
        .flat_map(|s| {
            let off: usize = (0..r).map(|d| sc(s, d)).sum();
            data_at::<T>(s, off, sc(s, r), 7)
        })
        .collect();
    expect_eq(&ctx("all_to_all_v"), &recv, &want)?;

    comm.barrier()
        .map_err(|e| format!("{}: {e}", ctx("barrier")))
}

fn every_type(comm: &Communicator, f: &dyn Fn(&Communicator, DType) -> Check) -> Check {
    DType::ALL.into_iter().try_for_each(|d| f(comm, d))
}

fn typed(
    comm: &Communicator,
    d: DType,
    count: usize,
    which: fn(&Communicator, usize, DType) -> Check,
) -> Check {
    which(comm, count, d)
}

macro_rules! dispatch {
    ($f:ident, $comm:expr, $count:expr, $d:expr) => {
        match $d {
            DType::F32 => $f::<f32>($comm, $count),
            DType::F64 => $f::<f64>($comm, $count),
            DType::F16 => $f::<f16>($comm, $count),
            DType::BF16 => $f::<bf16>($comm, $count),
            DType::I32 => $f::<i32>($comm, $count),
            DType::I64 => $f::<i64>($comm, $count),
            DType::U8 => $f::<u8>($comm, $count),
        }
    };
}

fn reductions_dyn(comm: &Communicator, count: usize, d: DType) -> Check {
    dispatch!(reductions, comm, count, d)
}

fn movers_dyn(comm: &Communicator, count: usize, d: DType) -> Check {
    dispatch!(movers, comm, count, d)
}

fn report(results: Vec<Check>) {
    let errors: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    assert!(
        errors.is_empty(),
        "{} rank(s) failed:\n{}",
        errors.len(),
        errors.join("\n")
    );
}

/// One rank's part under a forced all-reduce algorithm: every type and operator at the small counts,
/// every operator on f32 at the large odd count.
fn under_algorithm(comm: &Communicator, algo: Algorithm) -> Check {
    for count in SMALL {
        every_type(comm, &|c, d| typed(c, d, count, reductions_dyn))
            .map_err(|e| format!("[{algo}] {e}"))?;
    }
    reductions::<f32>(comm, LARGE).map_err(|e| format!("[{algo}] {e}"))
}

/// One rank's part with the default algorithms: the data movers for every type at every count, and
/// the large count for every type and operator (f32 only when `with_f32`).
fn with_defaults(comm: &Communicator, with_f32: bool) -> Check {
    let n = comm.size();
    for count in SMALL {
        every_type(comm, &|c, d| typed(c, d, count, movers_dyn))?;
    }
    every_type(comm, &|c, d| match d {
        DType::F32 if !with_f32 => Ok(()), // covered under every algorithm
        _ => typed(c, d, LARGE, reductions_dyn),
    })?;
    every_type(comm, &|c, d| typed(c, d, LARGE / n.max(1), movers_dyn))
}

/// The whole matrix for one transport and world size.
fn conformance(kind: Kind, n: usize) {
    // Reductions under every all-reduce algorithm.
    for algo in ALGOS {
        let mut config = Config::default();
        config.overrides.all_reduce = Some(algo);
        report(spawn(kind, n, config, move |comm| {
            under_algorithm(&comm, algo)
        }));
    }
    // On shared memory the default all-reduce reads the peers' buffers in place (Algorithm::Shm):
    // every type and operator at the small counts, every operator on f32 at the large one.
    if kind == Kind::Shm {
        report(spawn(kind, n, Config::default(), |comm| {
            for count in SMALL {
                every_type(&comm, &|c, d| typed(c, d, count, reductions_dyn))?;
            }
            reductions::<f32>(&comm, LARGE)
        }));
    }
    // The large count for every type and operator with the algorithm the cost model picks, and the
    // data movers for every type at every count.
    report(spawn(kind, n, Config::default(), |comm| {
        with_defaults(&comm, false)
    }));
}

macro_rules! matrix {
    ($($name:ident: $kind:expr, $n:expr;)*) => {$(
        #[test]
        fn $name() {
            conformance($kind, $n);
        }
    )*};
}

matrix! {
    local_1: Kind::Local, 1;
    local_2: Kind::Local, 2;
    local_3: Kind::Local, 3;
    local_4: Kind::Local, 4;
    local_5: Kind::Local, 5;
    shm_1: Kind::Shm, 1;
    shm_2: Kind::Shm, 2;
    shm_3: Kind::Shm, 3;
    shm_4: Kind::Shm, 4;
    shm_5: Kind::Shm, 5;
    tcp_1: Kind::Tcp, 1;
    tcp_2: Kind::Tcp, 2;
    tcp_3: Kind::Tcp, 3;
    tcp_4: Kind::Tcp, 4;
    tcp_5: Kind::Tcp, 5;
}

/// The same matrix on the MPI backend, world sizes 1–5: each test starts `mpirun -n N` on this test
/// binary, whose `mpi_rank` entry point runs the matrix on MPI's own collectives (every type and
/// operator at every count) and on kolo's algorithms over MPI point-to-point.
#[cfg(feature = "mpi")]
mod mpi {
    use super::*;

    /// What each rank started by mpirun runs.
    #[test]
    #[ignore = "entry point of the ranks `mpirun` starts (see the mpi_N tests)"]
    fn mpi_rank() {
        if !kolo::launched_by_mpi(|k| std::env::var(k).ok()) {
            eprintln!("not started by mpirun: nothing to do");
            return;
        }
        let comm = kolo::init_mpi(Config::default()).expect("MPI world");
        assert_eq!(comm.backend(), "mpi");
        assert_eq!(comm.transport_kind(), "mpi");
        let r = comm.rank();
        let mut checks = vec![];
        // MPI's collectives, every type and operator at every count.
        checks.push(with_defaults(&comm, true).map_err(|e| format!("[mpi] {e}")));
        // Every type and operator at the small counts (the reductions; with_defaults ran the
        // movers).
        for count in SMALL {
            checks.push(
                every_type(&comm, &|c, d| typed(c, d, count, reductions_dyn))
                    .map_err(|e| format!("[mpi] {e}")),
            );
        }
        // kolo's algorithms over MPI point-to-point.
        for algo in ALGOS {
            let mut config = Config::default();
            config.overrides.all_reduce = Some(algo);
            let comm = kolo::init_mpi(config).expect("MPI world");
            checks.push(under_algorithm(&comm, algo));
        }
        let errors: Vec<String> = checks.into_iter().filter_map(Result::err).collect();
        assert!(errors.is_empty(), "rank {r}:\n{}", errors.join("\n"));
    }

    macro_rules! on_mpi {
        ($($name:ident: $n:expr;)*) => {$(
            #[test]
            fn $name() {
                common::mpirun::mpirun($n, "mpi::mpi_rank");
            }
        )*};
    }

    on_mpi! {
        mpi_1: 1;
        mpi_2: 2;
        mpi_3: 3;
        mpi_4: 4;
        mpi_5: 5;
    }
}

/// The matrix on the NCCL engine: the entry point of the ranks `scripts/gpu-check.sh` starts with
/// `kolo run -n <GPUs> -- <this test binary> --ignored --exact nccl::nccl_rank` on a machine with
/// NVIDIA GPUs (one rank per GPU).
#[cfg(feature = "nccl")]
mod nccl {
    use super::*;

    #[test]
    #[ignore = "entry point of the ranks scripts/gpu-check.sh starts, one per GPU"]
    fn nccl_rank() {
        if std::env::var("WORLD_SIZE").is_err() {
            eprintln!("not started by a launcher: nothing to do");
            return;
        }
        let opts = kolo::InitOptions::from_env().expect("launcher environment");
        let comm = kolo::init_nccl(opts).expect("NCCL world");
        assert_eq!(comm.backend(), "nccl");
        let r = comm.rank();
        let mut checks = vec![with_defaults(&comm, true).map_err(|e| format!("[nccl] {e}"))];
        for count in SMALL {
            checks.push(
                every_type(&comm, &|c, d| typed(c, d, count, reductions_dyn))
                    .map_err(|e| format!("[nccl] {e}")),
            );
        }
        let errors: Vec<String> = checks.into_iter().filter_map(Result::err).collect();
        assert!(errors.is_empty(), "rank {r}:\n{}", errors.join("\n"));
        println!("rank {r}: NCCL conformance ok");
    }

    /// Rank 1 all-reduces a different length: every rank must get an error naming the
    /// mismatch (the agreement step), not hang inside NCCL.
    #[test]
    #[ignore = "entry point of the ranks scripts/gpu-check.sh starts, one per GPU"]
    fn nccl_mismatch_rank() {
        if std::env::var("WORLD_SIZE").is_err() {
            eprintln!("not started by a launcher: nothing to do");
            return;
        }
        let opts = kolo::InitOptions::from_env().expect("launcher environment");
        let comm = kolo::init_nccl(opts).expect("NCCL world");
        let mut v = vec![1.0f32; if comm.rank() == 1 { 12 } else { 10 }];
        let e = comm
            .all_reduce(&mut v, ReduceOp::Sum)
            .expect_err("a mismatched call must fail");
        assert!(
            matches!(
                e,
                kolo::Error::Mismatch { .. } | kolo::Error::Aborted { .. }
            ),
            "{e}"
        );
        println!("rank {}: mismatch reported: {e}", comm.rank());
    }
}
