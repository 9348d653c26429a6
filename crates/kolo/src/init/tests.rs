//! Reading the launchers' environments and choosing the backend.

use super::*;
use std::collections::HashMap;

fn opts(vars: &[(&str, &str)]) -> Result<InitOptions> {
    let m: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    InitOptions::from_lookup(|k: &str| m.get(k).cloned())
}

fn backend(vars: &[(&str, &str)]) -> Result<Backend> {
    let m: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Backend::choose(|k: &str| m.get(k).cloned())
}

#[test]
fn the_backend_follows_kolo_backend_and_the_launcher() {
    let mpi = if cfg!(feature = "mpi") {
        Backend::Mpi
    } else {
        Backend::Kolo
    };
    assert_eq!(backend(&[]).ok(), Some(Backend::Kolo));
    assert_eq!(
        backend(&[("RANK", "0"), ("WORLD_SIZE", "2")]).ok(),
        Some(Backend::Kolo)
    );
    // Under an MPI launcher: MPI when built with it.
    for var in ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"] {
        assert_eq!(backend(&[(var, "2")]).ok(), Some(mpi), "{var}");
    }
    // ... but not for workers of `kolo run`, nor when asked for kolo's own.
    let kolo_run = [("OMPI_COMM_WORLD_SIZE", "2"), ("KOLO_AGENT_STORE", "1")];
    assert_eq!(backend(&kolo_run).ok(), Some(Backend::Kolo));
    let asked = [("OMPI_COMM_WORLD_SIZE", "2"), ("KOLO_BACKEND", "kolo")];
    assert_eq!(backend(&asked).ok(), Some(Backend::Kolo));
    assert!(matches!(
        backend(&[("KOLO_BACKEND", "gloo")]),
        Err(Error::Config { var, .. }) if var == "KOLO_BACKEND"
    ));
    // NCCL only when asked for, and in a build without it an error that says how to get it.
    let asked_nccl = backend(&[("KOLO_BACKEND", "nccl")]);
    if cfg!(feature = "nccl") {
        assert_eq!(asked_nccl.ok(), Some(Backend::Nccl));
    } else {
        let e = asked_nccl.expect_err("no NCCL in this build");
        assert!(e.to_string().contains("--features nccl"), "{e}");
    }
    // An explicit request for MPI in a build without it is an error that says how to get it.
    let asked_mpi = backend(&[("KOLO_BACKEND", "mpi")]);
    if cfg!(feature = "mpi") {
        assert_eq!(asked_mpi.ok(), Some(Backend::Mpi));
    } else {
        let e = asked_mpi.expect_err("no MPI in this build");
        assert!(e.to_string().contains("--features mpi"), "{e}");
    }
}

#[cfg(not(feature = "mpi"))]
#[test]
fn init_mpi_without_the_feature_is_a_clear_error() {
    let e = init_mpi(Config::default()).expect_err("no MPI in this build");
    assert!(
        e.to_string().contains("KOLO_BACKEND") && e.to_string().contains("--features mpi"),
        "{e}"
    );
}

#[cfg(not(feature = "nccl"))]
#[test]
fn init_nccl_without_the_feature_is_a_clear_error() {
    let e = init_nccl(opts(&[]).expect("no launcher")).expect_err("no NCCL in this build");
    assert!(e.to_string().contains("--features nccl"), "{e}");
}

/// On a machine without a GPU (CI), asking for NCCL fails on every rank at once with an error
/// that names the missing piece: no rank waits for the others to join.
#[cfg(feature = "nccl")]
#[test]
fn init_nccl_without_a_gpu_fails_on_every_rank_at_once() {
    if kolo_nccl::device_count().is_ok_and(|n| n > 0) {
        eprintln!("this machine has a GPU: the GPU checks apply instead; skipped");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let method = format!("file://{}", dir.path().join("store").display());
    let started = std::time::Instant::now();
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let method = method.clone();
                s.spawn(move || {
                    let rank = rank.to_string();
                    let vars = [
                        ("RANK", rank.as_str()),
                        ("WORLD_SIZE", "2"),
                        ("KOLO_INIT_METHOD", method.as_str()),
                        ("KOLO_TIMEOUT", "60"),
                    ];
                    let o = opts(&vars).expect("options");
                    match init_nccl(o) {
                        Ok(_) => "joined".to_owned(),
                        Err(e) => e.to_string(),
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| "panicked".into()))
            .collect()
    });
    for (rank, e) in errors.iter().enumerate() {
        assert!(
            e.contains(&format!("on rank {rank}")) && e.contains("nccl"),
            "{e}"
        );
        assert!(
            e.contains("libcuda.so.1") || e.contains("NCCL library"),
            "{e}"
        );
    }
    // Far from the 60 s timeout: rank 1 learns of rank 0's failure through the store.
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

#[test]
fn no_launcher_is_a_world_of_one() {
    let o = opts(&[]).ok();
    assert_eq!(
        o.map(|o| (o.method, o.rank, o.size)),
        Some((InitMethod::Single, 0, 1))
    );
}

#[test]
fn torchrun_openmpi_and_slurm_variables() {
    let t = opts(&[
        ("RANK", "2"),
        ("WORLD_SIZE", "4"),
        ("MASTER_ADDR", "10.1.2.3"),
        ("MASTER_PORT", "29500"),
    ]);
    let t = t.ok();
    assert_eq!(
        t.as_ref().map(|o| (o.method.clone(), o.rank, o.size)),
        Some((
            InitMethod::Tcp {
                host: "10.1.2.3".into(),
                port: 29500
            },
            2,
            4
        ))
    );
    let m = opts(&[
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "3"),
        ("MASTER_PORT", "5"),
    ])
    .ok();
    assert_eq!(m.map(|o| (o.rank, o.size)), Some((1, 3)));
    let s = opts(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
        ("MASTER_PORT", "5"),
    ])
    .ok();
    assert_eq!(s.map(|o| (o.rank, o.size)), Some((0, 2)));
}

#[test]
fn explicit_methods_and_agent_store() {
    let o = opts(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("KOLO_INIT_METHOD", "file:///tmp/x"),
        ("KOLO_AGENT_STORE", "1"),
    ])
    .ok();
    assert_eq!(
        o.as_ref().map(|o| o.method.clone()),
        Some(InitMethod::File("/tmp/x".into()))
    );
    assert_eq!(o.map(|o| o.host_store), Some(false));
    assert_eq!(
        InitMethod::parse("tcp://[::1]:80").ok(),
        Some(InitMethod::Tcp {
            host: "::1".into(),
            port: 80
        })
    );
}

#[test]
fn bad_environments_name_the_variable() {
    let e = |vars: &[(&str, &str)]| match opts(vars) {
        Err(Error::Config { var, .. }) => var,
        other => format!("unexpected {other:?}"),
    };
    assert_eq!(e(&[("RANK", "1")]), "WORLD_SIZE");
    assert_eq!(e(&[("RANK", "x"), ("WORLD_SIZE", "2")]), "RANK");
    assert_eq!(e(&[("RANK", "2"), ("WORLD_SIZE", "2")]), "RANK");
    assert_eq!(e(&[("RANK", "0"), ("WORLD_SIZE", "2")]), "MASTER_PORT");
    assert_eq!(
        e(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "99999")]),
        "MASTER_PORT"
    );
    assert_eq!(
        e(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("KOLO_INIT_METHOD", "udp://x")
        ]),
        "init method"
    );
}

#[test]
fn torchrun_with_its_agent_store() {
    let o = opts(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29400"),
        ("GROUP_RANK", "0"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ("TORCHELASTIC_RUN_ID", "none"),
        ("TORCHELASTIC_RESTART_COUNT", "3"),
    ])
    .expect("torchrun's variables");
    assert_eq!(
        o.method,
        InitMethod::C10d {
            host: "127.0.0.1".into(),
            port: 29400
        }
    );
    assert!(!o.host_store, "the agent hosts the store");
    assert_eq!(o.job_id, "none/3");
    assert_eq!(o.node_id, "node-0");
    // Without the agent store (older torchrun), rank 0 hosts kolo's own store.
    let o = opts(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_PORT", "29400"),
        ("TORCHELASTIC_USE_AGENT_STORE", "False"),
    ])
    .expect("torchrun's variables");
    assert!(matches!(o.method, InitMethod::Tcp { .. }) && o.host_store);
    // A world of one under torchrun still joins the agent's store.
    let o = opts(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_PORT", "29400"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
    ]);
    assert!(matches!(o.map(|o| o.method), Ok(InitMethod::C10d { .. })));
    assert_eq!(
        InitMethod::parse("c10d://h:5").ok(),
        Some(InitMethod::C10d {
            host: "h".into(),
            port: 5
        })
    );
}

#[test]
fn bad_torchrun_variables_name_the_variable() {
    let var = |vars: &[(&str, &str)]| match opts(vars) {
        Err(Error::Config { var, .. }) => var,
        other => format!("unexpected {other:?}"),
    };
    let base = [("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "1")];
    let with = |extra: (&'static str, &'static str)| {
        let mut v = base.to_vec();
        v.push(extra);
        v
    };
    assert_eq!(
        var(&with(("TORCHELASTIC_USE_AGENT_STORE", "maybe"))),
        "TORCHELASTIC_USE_AGENT_STORE"
    );
    assert_eq!(
        var(&with(("TORCHELASTIC_RESTART_COUNT", "x"))),
        "TORCHELASTIC_RESTART_COUNT"
    );
    assert_eq!(
        var(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True")
        ]),
        "MASTER_PORT"
    );
}

#[test]
fn srun_without_master_addr_uses_the_node_list_and_the_job_id() {
    let o = opts(&[
        ("SLURM_PROCID", "3"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NODEID", "1"),
        ("SLURM_JOB_ID", "1234567"),
        ("SLURM_STEP_NODELIST", "node[01-04,07]"),
        ("SLURM_NODELIST", "other[1-2]"),
    ])
    .expect("SLURM's variables");
    assert_eq!(
        o.method,
        InitMethod::Tcp {
            host: "node01".into(),
            port: 14567
        }
    );
    assert_eq!((o.rank, o.size), (3, 8));
    assert_eq!(o.node_id, "node-1");
    assert_eq!(o.job_id, "slurm-1234567/0");
    // MASTER_ADDR / MASTER_PORT win where set.
    let o = opts(&[
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_JOB_ID", "42"),
        ("SLURM_NODELIST", "a[1-2]"),
        ("MASTER_ADDR", "10.0.0.9"),
    ])
    .expect("SLURM's variables");
    assert_eq!(
        o.method,
        InitMethod::Tcp {
            host: "10.0.0.9".into(),
            port: 10042
        }
    );
}

#[test]
fn bad_slurm_variables_name_the_variable() {
    let err = |vars: &[(&str, &str)]| match opts(vars) {
        Err(e @ Error::Config { .. }) => e.to_string(),
        other => format!("unexpected {other:?}"),
    };
    let base = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut v = base.to_vec();
        v.extend_from_slice(extra);
        v
    };
    let e = err(&with(&[
        ("SLURM_JOB_ID", "5"),
        ("SLURM_STEP_NODELIST", "node[01-04"),
    ]));
    assert!(
        e.contains("SLURM_STEP_NODELIST") && e.contains("node[01-04"),
        "{e}"
    );
    let e = err(&with(&[("SLURM_JOB_ID", "5")]));
    assert!(
        e.contains("SLURM_STEP_NODELIST") && e.contains("MASTER_ADDR"),
        "{e}"
    );
    let e = err(&with(&[("SLURM_NODELIST", "n1")]));
    assert!(
        e.contains("SLURM_JOB_ID") && e.contains("MASTER_PORT"),
        "{e}"
    );
    let e = err(&with(&[("SLURM_NODELIST", "n1"), ("SLURM_JOB_ID", "x7")]));
    assert!(e.contains("SLURM_JOB_ID") && e.contains("x7"), "{e}");
}

#[test]
fn under_kolo_run_the_workers_use_kolos_store_though_torch_is_told_of_an_agent_store() {
    // `kolo run` sets TORCHELASTIC_USE_AGENT_STORE for PyTorch programs; kolo's own workers still
    // speak kolo's protocol to the launcher's store and do not host it.
    let o = opts(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29400"),
        ("KOLO_AGENT_STORE", "1"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ("TORCHELASTIC_RESTART_COUNT", "0"),
    ]);
    let o = o.ok();
    assert!(matches!(
        o.as_ref().map(|o| &o.method),
        Some(InitMethod::Tcp { port: 29400, .. })
    ));
    assert_eq!(o.map(|o| o.host_store), Some(false));
}

#[test]
fn a_store_the_program_brings_connects_the_ranks() {
    // InitMethod::Store: the ranks meet through a store object (here an in-memory one shared by
    // two threads; the Python package hands PyTorch's store the same way).
    let store = SharedStore(Arc::new(kolo_store::MemoryStore::new()));
    let results: Vec<Result<f32>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let store = store.clone();
                s.spawn(move || {
                    let mut o = InitOptions::new(InitMethod::Store { store, host: None }, rank, 2);
                    o.job_id = format!("store-test-{}", std::process::id());
                    o.transport = TransportChoice::Tcp;
                    o.config.timeout = std::time::Duration::from_secs(20);
                    let comm = init_with(o)?;
                    let mut x = [rank as f32 + 1.0];
                    comm.all_reduce(&mut x, kolo_core::ReduceOp::Sum)?;
                    Ok(x[0])
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::Unsupported {
                        what: "a panic".into(),
                    })
                })
            })
            .collect()
    });
    for r in results {
        assert_eq!(r.ok(), Some(3.0));
    }
}
