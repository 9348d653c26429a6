//! Creating the world communicator: from the environment a launcher leaves (torchrun, `kolo run`,
//! OpenMPI's `mpirun`, SLURM's `srun`), from an explicit `tcp://`, `c10d://` or `file://`
//! rendezvous, or as a world of threads in this process.
//!
//! | launcher | rank / size | local rank / size | rendezvous |
//! |---|---|---|---|
//! | `kolo run` | `RANK`, `WORLD_SIZE` | `LOCAL_RANK`, `LOCAL_WORLD_SIZE` | kolo's store at `MASTER_ADDR:MASTER_PORT` |
//! | torchrun | `RANK`, `WORLD_SIZE` | `LOCAL_RANK`, `LOCAL_WORLD_SIZE` | the agent's c10d store at `MASTER_ADDR:MASTER_PORT` (`TORCHELASTIC_USE_AGENT_STORE=True`) |
//! | OpenMPI | `OMPI_COMM_WORLD_RANK`, `_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK`, `_LOCAL_SIZE` | `MASTER_ADDR`, `MASTER_PORT` |
//! | SLURM | `SLURM_PROCID`, `SLURM_NTASKS` | `SLURM_LOCALID` | `MASTER_ADDR`, `MASTER_PORT`, else the first host of `SLURM_STEP_NODELIST` and port 10000 + the last four digits of `SLURM_JOB_ID` |
//! | explicit | `RANK`, `WORLD_SIZE` | | `KOLO_INIT_METHOD=tcp://host:port`, `c10d://host:port` or `file:///path` |
//! | none | 0, 1 | 0, 1 | none |
//!
//! In a build with the `mpi` feature, a process an MPI launcher started (`OMPI_COMM_WORLD_SIZE`,
//! `PMI_SIZE` or `PMIX_RANK` set) runs on MPI instead ([`init_mpi`]); `KOLO_BACKEND` (`auto`, `kolo`,
//! `mpi`, `nccl`) overrides the choice ([`Backend::choose`]). With `KOLO_BACKEND=nccl` (the `nccl`
//! feature) the world is connected as always and its collectives then run on NCCL, each rank on
//! its host's GPU number local rank ([`init_nccl`]).
//!
//! With a TCP rendezvous, rank 0 hosts the store at `MASTER_ADDR:MASTER_PORT` unless a launcher
//! already does: `kolo run` (`KOLO_AGENT_STORE=1`) or torchrun (`TORCHELASTIC_USE_AGENT_STORE=True`,
//! whose store kolo speaks PyTorch's c10d protocol to). The job's keys are namespaced by
//! `TORCHELASTIC_RUN_ID` and `TORCHELASTIC_RESTART_COUNT` (or kolo's own), so a restarted group
//! never reads the last attempt's. Local rank and size are computed from the ranks' node identities
//! (`KOLO_NODE_ID`, else `NODE_RANK`/`GROUP_RANK`/`SLURM_NODEID`, else the host name), so they are
//! right under every launcher.

mod backend;
mod launchers;
mod options;
#[cfg(test)]
mod tests;
mod worlds;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use kolo_core::settings::{Env, ProcessEnv};
use kolo_core::{Error, Result, Transport};
use kolo_store::{C10dStore, FileStore, Store, TcpStore, TcpStoreServer};
use kolo_transport::{
    local_world, shm_world, HybridTransport, ShmOptions, ShmTransport, TcpOptions, TcpTransport,
};

#[cfg(not(feature = "mpi"))]
use backend::no_mpi;
#[cfg(not(feature = "nccl"))]
use backend::no_nccl;
pub use backend::{launched_by_mpi, Backend};
pub use options::{InitMethod, InitOptions, SharedStore, TransportChoice};

use crate::communicator::{Communicator, Topology};
use crate::config::Config;

/// Group id of every world communicator (sub-groups derive theirs from it).
const WORLD_GROUP: u64 = crate::communicator::ARENA_GROUP;

/// The world communicator of this process, from the environment (see the module documentation); a
/// world of one when no launcher variables are set. Under `mpirun`/`srun` with the `mpi` feature
/// (or with `KOLO_BACKEND=mpi`) the world runs on MPI (see [`init_mpi`]).
pub fn init() -> Result<Communicator> {
    let get = |k: &str| ProcessEnv.lookup(k);
    match Backend::choose(get)? {
        Backend::Mpi => init_mpi(Config::from_lookup(get)?),
        Backend::Nccl => init_nccl(InitOptions::from_env()?),
        _ => init_with(InitOptions::from_env()?),
    }
}

/// The world communicator over the installed MPI library: MPI's own collectives, point-to-point
/// as MPI messages, sub-groups through `MPI_Comm_split`. MPI is initialized on first use (with
/// `MPI_THREAD_MULTIPLE`) and finalized at exit; rank and size are MPI's. Needs the `mpi` feature.
#[cfg(feature = "mpi")]
pub fn init_mpi(config: Config) -> Result<Communicator> {
    use kolo_core::Engine;
    let w = kolo_mpi::world()?;
    let (rank, size) = (w.engine.rank(), w.engine.size());
    let comm = Communicator::assemble(
        w.transport,
        Some(w.engine),
        (0..size).collect(),
        rank,
        WORLD_GROUP,
        Arc::new(Topology::from_ids(&w.node_ids)),
        config,
        None,
    );
    // mpirun and srun name the job for every rank alike.
    let job = ["PMIX_NAMESPACE", "SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .unwrap_or_else(|| "mpi".into());
    comm.watch_flight(&job);
    Ok(comm)
}

/// The world communicator over the installed MPI library; this build has no MPI backend, so it
/// is an error (build kolo with the `mpi` feature).
#[cfg(not(feature = "mpi"))]
pub fn init_mpi(config: Config) -> Result<Communicator> {
    let _ = config;
    Err(no_mpi())
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<IpAddr>()
            .map(|ip| ip.is_loopback())
            .unwrap_or(false)
}

/// The world communicator for explicit options.
pub fn init_with(opts: InitOptions) -> Result<Communicator> {
    connect(opts, false)
}

/// The world communicator for explicit options, its collectives on NCCL: kolo's transports are
/// connected as by [`init_with`] (point-to-point messages, heartbeats), rank 0 publishes NCCL's
/// unique id in the rendezvous store, and every rank joins the NCCL communicator on its host's
/// GPU number local rank (its place among the ranks of its node). Needs the `nccl` feature.
#[cfg(feature = "nccl")]
pub fn init_nccl(opts: InitOptions) -> Result<Communicator> {
    connect(opts, true)
}

/// The world communicator over NCCL; this build has no NCCL backend, so it is an error (build
/// kolo with the `nccl` feature).
#[cfg(not(feature = "nccl"))]
pub fn init_nccl(opts: InitOptions) -> Result<Communicator> {
    let _ = opts;
    Err(no_nccl())
}

/// The NCCL engine of `rank` (`local_rank` on its node), its id exchanged through `store`. Rank
/// 0 publishes the id, or why it has none (so that the others fail at once instead of waiting);
/// `watch` reports a peer's failure (kolo's heartbeats) while the ranks join and while the engine
/// waits on NCCL later.
#[cfg(feature = "nccl")]
fn nccl_engine(
    store: Option<(&dyn Store, &str)>,
    (rank, size, local_rank): (usize, usize, usize),
    node_ids: Vec<String>,
    timeout: std::time::Duration,
    watch: kolo_nccl::Watch,
) -> Result<Arc<dyn kolo_core::Engine>> {
    use kolo_nccl::{NcclEngine, NcclId, UNIQUE_ID_BYTES};
    let id = match store {
        None => NcclId::new()?,
        Some((store, prefix)) => {
            let key = format!("{prefix}/nccl/id");
            if rank == 0 {
                let id = NcclId::new();
                let published = match &id {
                    Ok(id) => id.as_bytes().to_vec(),
                    Err(e) => format!("rank 0 could not start NCCL: {e}").into_bytes(),
                };
                store.set(&key, &published)?;
                id?
            } else {
                let bytes = store.get(&key, timeout)?;
                if bytes.len() != UNIQUE_ID_BYTES {
                    return Err(Error::Backend {
                        op: "init",
                        rank,
                        backend: "nccl",
                        reason: String::from_utf8_lossy(&bytes).into_owned(),
                    });
                }
                NcclId::from_bytes(&bytes)?
            }
        }
    };
    let engine = NcclEngine::new(&id, (rank, size), local_rank, node_ids, timeout, watch)?;
    Ok(Arc::new(engine))
}

/// [`init_with`], with the collectives on NCCL when `nccl`.
fn connect(opts: InitOptions, nccl: bool) -> Result<Communicator> {
    if opts.size == 0 || opts.rank >= opts.size {
        return Err(Error::RankOutOfRange {
            op: "init",
            rank: opts.rank,
            arg: "rank",
            value: opts.rank,
            size: opts.size,
        });
    }
    let timeout = opts.config.timeout;
    let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let (store, server, listen, advertise): (
        Arc<dyn Store>,
        Option<Arc<TcpStoreServer>>,
        IpAddr,
        IpAddr,
    ) = match &opts.method {
        InitMethod::Single => {
            let t = local_world(1).pop().ok_or_else(|| Error::Unsupported {
                what: "an empty local world".into(),
            })?;
            #[cfg(feature = "nccl")]
            let engine = match nccl {
                true => Some(nccl_engine(
                    None,
                    (0, 1, 0),
                    vec![opts.node_id.clone()],
                    timeout,
                    Arc::new(|| Ok(())),
                )?),
                false => None,
            };
            #[cfg(not(feature = "nccl"))]
            let engine = {
                let _ = nccl;
                None
            };
            return Ok(Communicator::assemble(
                Arc::new(t),
                engine,
                vec![0],
                0,
                WORLD_GROUP,
                Arc::new(Topology::single_node(1)),
                opts.config,
                None,
            ));
        }
        InitMethod::Tcp { host, port } | InitMethod::C10d { host, port } => {
            let c10d = matches!(opts.method, InitMethod::C10d { .. });
            let local = is_loopback(host);
            let server = if opts.rank == 0 && opts.host_store && !c10d {
                let bind_ip = if local {
                    loopback
                } else {
                    IpAddr::V4(Ipv4Addr::UNSPECIFIED)
                };
                Some(worlds::host_store(bind_ip, *port)?)
            } else {
                None
            };
            let addr = format!("{host}:{port}");
            let store: Arc<dyn Store> = if c10d {
                Arc::new(C10dStore::connect(&addr, timeout)?)
            } else {
                Arc::new(TcpStore::connect(&addr, timeout)?)
            };
            let (listen, advertise) = if local {
                (loopback, loopback)
            } else {
                let adv = kolo_core::host::route_to(host, *port).unwrap_or(loopback);
                (IpAddr::V4(Ipv4Addr::UNSPECIFIED), adv)
            };
            (store, server, listen, advertise)
        }
        InitMethod::File(path) => (Arc::new(FileStore::open(path)?), None, loopback, loopback),
        InitMethod::Store { store, host } => {
            let (listen, advertise) = match host {
                Some(host) if !is_loopback(host) => {
                    // The store's port does not matter for the route: any port to that host.
                    let adv = kolo_core::host::route_to(host, 1).unwrap_or(loopback);
                    (IpAddr::V4(Ipv4Addr::UNSPECIFIED), adv)
                }
                _ => (loopback, loopback),
            };
            (store.0.clone(), None, listen, advertise)
        }
    };
    let prefix = worlds::next_prefix(&opts.job_id, opts.rank);
    let members: Vec<usize> = (0..opts.size).collect();

    // Learn which ranks share a node (through the store, before any connection exists).
    store.set(
        &format!("{prefix}/node/{}", opts.rank),
        opts.node_id.as_bytes(),
    )?;
    let ids = (0..opts.size)
        .map(|r| {
            store
                .get(&format!("{prefix}/node/{r}"), timeout)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        })
        .collect::<std::result::Result<Vec<String>, _>>()?;
    let topology = Arc::new(Topology::from_ids(&ids));
    let node = topology.node_of[opts.rank];
    let local: Vec<usize> = (0..opts.size)
        .filter(|&r| topology.node_of[r] == node)
        .collect();
    let one_host = local.len() == opts.size;
    if opts.transport == TransportChoice::Shm && !one_host {
        return Err(Error::Config {
            var: "KOLO_TRANSPORT".into(),
            value: "shm".into(),
            reason: format!(
                "shared memory needs every rank on one host, but the ranks are on {} nodes",
                topology.node_of.iter().max().map_or(1, |m| m + 1)
            ),
        });
    }
    let use_shm = opts.transport != TransportChoice::Tcp && local.len() > 1;
    let connect_shm = || -> Result<ShmTransport> {
        let mut shm_opts = opts.shm.clone();
        shm_opts.connect_timeout = timeout;
        shm_opts.heartbeat_timeout = opts.heartbeat_timeout;
        let local_rank = local.iter().position(|&r| r == opts.rank).unwrap_or(0);
        ShmTransport::connect(
            &*store,
            &format!("{prefix}/node{node}"),
            &shm_name_prefix(&opts.job_id),
            local_rank,
            local.len(),
            &shm_opts,
        )
    };
    let transport: Arc<dyn Transport> = if use_shm && one_host {
        Arc::new(connect_shm()?)
    } else {
        let tcp = TcpOptions {
            listen: opts.listen.unwrap_or(listen),
            advertise: opts.advertise.unwrap_or(advertise),
            connect_timeout: timeout,
            secret: kolo_store::JobSecret::from_lookup(ProcessEnv),
            heartbeat_timeout: opts.heartbeat_timeout,
            ..TcpOptions::default()
        };
        let tcp = TcpTransport::connect(&*store, &prefix, opts.rank, opts.size, &tcp)?;
        if use_shm {
            Arc::new(HybridTransport::new(
                connect_shm()?,
                local.clone(),
                Box::new(tcp),
            ))
        } else {
            Arc::new(tcp)
        }
    };
    let local_rank = local.iter().position(|&r| r == opts.rank).unwrap_or(0);
    #[cfg(feature = "nccl")]
    let engine = match nccl {
        true => {
            let (t, rank) = (transport.clone(), opts.rank);
            let watch: kolo_nccl::Watch = Arc::new(move || match t.failure() {
                Some(f) => Err(f.into_error("nccl", rank)),
                None => Ok(()),
            });
            Some(nccl_engine(
                Some((&*store, &prefix)),
                (opts.rank, opts.size, local_rank),
                ids,
                timeout,
                watch,
            )?)
        }
        false => None,
    };
    // Without the feature `init_nccl` never gets here.
    #[cfg(not(feature = "nccl"))]
    let engine = {
        let _ = (nccl, local_rank, ids);
        None
    };
    let comm = Communicator::assemble(
        transport,
        engine,
        members,
        opts.rank,
        WORLD_GROUP,
        topology,
        opts.config,
        server,
    );
    // The job without its restart count: `kolo run` looks for the records under the job's name.
    let job = opts
        .job_id
        .rsplit_once('/')
        .map_or(&*opts.job_id, |(job, _)| job);
    comm.watch_flight(job);
    Ok(comm)
}

/// Start of the names of a job's shared-memory segments (see [`kolo_transport::shm::name_prefix`]).
pub fn shm_name_prefix(job_id: &str) -> String {
    kolo_transport::shm::name_prefix(job_id)
}

/// A world of `size` ranks that are threads of this process, connected through shared memory (as
/// processes of one host are); give one communicator to each thread.
pub fn shm_communicators(size: usize, config: Config) -> Result<Vec<Communicator>> {
    Ok(thread_world(
        shm_world(size, &ShmOptions::from_env()?)?,
        config,
    ))
}

/// A world of `size` ranks that are threads of this process (the local transport); give one
/// communicator to each thread.
pub fn local_communicators(size: usize, config: Config) -> Vec<Communicator> {
    thread_world(local_world(size), config)
}

/// World communicators over `transports`, the endpoints of one world in rank order, all on one node.
fn thread_world<T: Transport + 'static>(transports: Vec<T>, config: Config) -> Vec<Communicator> {
    let size = transports.len();
    let topo = Arc::new(Topology::single_node(size));
    transports
        .into_iter()
        .enumerate()
        .map(|(rank, t)| {
            Communicator::from_parts(
                Arc::new(t),
                (0..size).collect(),
                rank,
                WORLD_GROUP,
                topo.clone(),
                config.clone(),
                None,
            )
        })
        .collect()
}

/// Runs `f` on `size` threads, each with its rank's communicator of a local world, and returns each
/// rank's result in rank order (a panicking rank gives `Err` with the panic's message; the others see
/// it as a lost peer instead of waiting).
pub fn run_local<R, F>(size: usize, config: Config, f: F) -> Vec<std::result::Result<R, String>>
where
    R: Send,
    F: Fn(Communicator) -> R + Sync,
{
    let comms = local_communicators(size, config);
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let f = &f;
                s.spawn(move || f(c))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().map_err(|p| {
                    p.downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "panicked".into())
                })
            })
            .collect()
    })
}
