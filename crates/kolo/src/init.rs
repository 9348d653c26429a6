//! Creating the world communicator: from the environment a launcher leaves (torchrun, `kolo run`,
//! OpenMPI's `mpirun`, SLURM's `srun`), from an explicit `tcp://` or `file://` rendezvous, or as a world
//! of threads in this process.
//!
//! | launcher | rank / size | local rank / size | rendezvous |
//! |---|---|---|---|
//! | torchrun, `kolo run` | `RANK`, `WORLD_SIZE` | `LOCAL_RANK`, `LOCAL_WORLD_SIZE` | `MASTER_ADDR`, `MASTER_PORT` |
//! | OpenMPI | `OMPI_COMM_WORLD_RANK`, `_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK`, `_LOCAL_SIZE` | `MASTER_ADDR`, `MASTER_PORT` |
//! | SLURM | `SLURM_PROCID`, `SLURM_NTASKS` | `SLURM_LOCALID` | `MASTER_ADDR`, `MASTER_PORT` |
//! | explicit | `RANK`, `WORLD_SIZE` | | `KOLO_INIT_METHOD=tcp://host:port` or `file:///path` |
//! | none | 0, 1 | 0, 1 | none |
//!
//! In a build with the `mpi` feature, a process an MPI launcher started (`OMPI_COMM_WORLD_SIZE`,
//! `PMI_SIZE` or `PMIX_RANK` set) runs on MPI instead ([`init_mpi`]); `KOLO_BACKEND` (`auto`, `kolo`,
//! `mpi`) overrides the choice ([`Backend::choose`]).
//!
//! With a TCP rendezvous, rank 0 hosts the store at `MASTER_ADDR:MASTER_PORT` unless the launcher
//! already does (`KOLO_AGENT_STORE=1`, set by `kolo run`). Local rank and size are computed from the
//! ranks' node identities (`KOLO_NODE_ID`, else `NODE_RANK`/`GROUP_RANK`, else the host name), so they
//! are right under every launcher.

use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;

use kolo_core::{Error, Result, Transport};
use kolo_store::{FileStore, Store, TcpStore, TcpStoreServer};
use kolo_transport::{
    local_world, shm_world, HybridTransport, ShmOptions, ShmTransport, TcpOptions, TcpTransport,
};

use crate::communicator::{Communicator, Topology};
use crate::config::Config;

/// Group id of every world communicator (sub-groups derive theirs from it).
const WORLD_GROUP: u64 = crate::communicator::ARENA_GROUP;

/// How ranks find each other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InitMethod {
    /// A world of one process (what an MPI program started without `mpiexec` gets).
    Single,
    /// A TCP rendezvous store at `host:port`.
    Tcp {
        /// Host of the store (rank 0's host, or the launcher's).
        host: String,
        /// Port of the store.
        port: u16,
    },
    /// A rendezvous file on a file system all ranks share.
    File(PathBuf),
}

impl InitMethod {
    /// Parses `tcp://host:port` or `file:///path`.
    pub fn parse(url: &str) -> Result<InitMethod> {
        let bad = |reason: &str| Error::Config {
            var: "init method".into(),
            value: url.into(),
            reason: reason.into(),
        };
        if let Some(rest) = url.strip_prefix("tcp://") {
            let (host, port) = rest
                .rsplit_once(':')
                .ok_or_else(|| bad("expected tcp://HOST:PORT"))?;
            let port: u16 = port
                .parse()
                .map_err(|_| bad("the port is not a number 0-65535"))?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            if host.is_empty() {
                return Err(bad("the host is empty"));
            }
            Ok(InitMethod::Tcp {
                host: host.to_string(),
                port,
            })
        } else if let Some(path) = url.strip_prefix("file://") {
            if path.is_empty() {
                return Err(bad("expected file:///PATH"));
            }
            Ok(InitMethod::File(PathBuf::from(path)))
        } else {
            Err(bad("expected tcp://HOST:PORT or file:///PATH"))
        }
    }
}

/// Everything [`init_with`] needs; [`InitOptions::from_env`] reads it from the environment.
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// Rendezvous.
    pub method: InitMethod,
    /// This process's rank.
    pub rank: usize,
    /// Number of processes.
    pub size: usize,
    /// Whether rank 0 hosts the TCP store (false when a launcher hosts it).
    pub host_store: bool,
    /// Namespace of this job's keys in the store.
    pub job_id: String,
    /// Identity of this process's node (ranks with equal ids share a host).
    pub node_id: String,
    /// Address the TCP transport listens on; `None` chooses (loopback for a loopback rendezvous,
    /// all interfaces otherwise).
    pub listen: Option<IpAddr>,
    /// Address peers use to reach this rank; `None` chooses the one that routes to the store.
    pub advertise: Option<IpAddr>,
    /// Which transports connect the ranks.
    pub transport: TransportChoice,
    /// Shared-memory settings.
    pub shm: ShmOptions,
    /// A peer process silent this long (no data, no heartbeat) is lost: stopped, hung or its host
    /// unreachable (`KOLO_HEARTBEAT_TIMEOUT` seconds, default 6; 0 turns heartbeats off).
    pub heartbeat_timeout: Option<std::time::Duration>,
    /// Communicator settings.
    pub config: Config,
}

/// Which transports connect the ranks (`KOLO_TRANSPORT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportChoice {
    /// Shared memory between the ranks of a host, TCP between hosts (the default).
    Auto,
    /// TCP between every pair, even on one host.
    Tcp,
    /// Shared memory only: every rank must be on this host.
    Shm,
}

impl TransportChoice {
    /// Parses `auto`, `tcp` or `shm`.
    pub fn parse(value: &str) -> Result<TransportChoice> {
        match value.trim() {
            "" | "auto" => Ok(TransportChoice::Auto),
            "tcp" => Ok(TransportChoice::Tcp),
            "shm" => Ok(TransportChoice::Shm),
            _ => Err(Error::Config {
                var: "KOLO_TRANSPORT".into(),
                value: value.into(),
                reason: "expected auto, tcp or shm".into(),
            }),
        }
    }
}

impl InitOptions {
    /// A world of one.
    pub fn single() -> Self {
        InitOptions {
            method: InitMethod::Single,
            rank: 0,
            size: 1,
            host_store: true,
            job_id: "kolo".into(),
            node_id: host_name(),
            listen: None,
            advertise: None,
            transport: TransportChoice::Auto,
            shm: ShmOptions::default(),
            heartbeat_timeout: Some(std::time::Duration::from_secs(6)),
            config: Config::default(),
        }
    }

    /// An explicit rendezvous for rank `rank` of `size`.
    pub fn new(method: InitMethod, rank: usize, size: usize) -> Self {
        InitOptions {
            method,
            rank,
            size,
            ..InitOptions::single()
        }
    }

    /// Reads the options from the process environment (see the module documentation).
    pub fn from_env() -> Result<InitOptions> {
        InitOptions::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`InitOptions::from_env`], reading variables through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<InitOptions> {
        let config = Config::from_lookup(&get)?;
        let num = |var: &str| -> Result<Option<usize>> {
            match get(var) {
                None => Ok(None),
                Some(v) => v
                    .trim()
                    .parse::<usize>()
                    .map(Some)
                    .map_err(|_| Error::Config {
                        var: var.into(),
                        value: v,
                        reason: "expected a non-negative integer".into(),
                    }),
            }
        };
        // Rank and size: the first launcher convention that sets both.
        let mut found = None;
        for (r, s) in [
            ("RANK", "WORLD_SIZE"),
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
            ("PMI_RANK", "PMI_SIZE"),
            ("SLURM_PROCID", "SLURM_NTASKS"),
        ] {
            match (num(r)?, num(s)?) {
                (Some(rank), Some(size)) => {
                    found = Some((rank, size));
                    break;
                }
                (Some(_), None) | (None, Some(_)) => {
                    let missing = if get(r).is_none() { r } else { s };
                    return Err(Error::Config {
                        var: missing.into(),
                        value: String::new(),
                        reason: format!("{r} and {s} must be set together"),
                    });
                }
                (None, None) => {}
            }
        }
        let method_var = get("KOLO_INIT_METHOD");
        let Some((rank, size)) = found else {
            if let Some(m) = method_var {
                return Err(Error::Config {
                    var: "KOLO_INIT_METHOD".into(),
                    value: m,
                    reason: "RANK and WORLD_SIZE must be set too".into(),
                });
            }
            return Ok(InitOptions {
                config,
                ..InitOptions::single()
            });
        };
        if size == 0 || rank >= size {
            return Err(Error::Config {
                var: "RANK".into(),
                value: rank.to_string(),
                reason: format!("must be below the world size {size}"),
            });
        }
        let method = match method_var {
            Some(m) => InitMethod::parse(&m)?,
            None if size == 1 && get("MASTER_PORT").is_none() => InitMethod::Single,
            None => {
                let port_text = get("MASTER_PORT").ok_or_else(|| Error::Config {
                    var: "MASTER_PORT".into(),
                    value: String::new(),
                    reason: "not set: the rendezvous needs MASTER_ADDR and MASTER_PORT (or KOLO_INIT_METHOD)".into(),
                })?;
                let port = port_text.trim().parse::<u16>().map_err(|_| Error::Config {
                    var: "MASTER_PORT".into(),
                    value: port_text.clone(),
                    reason: "expected a port number 0-65535".into(),
                })?;
                InitMethod::Tcp {
                    host: get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into()),
                    port,
                }
            }
        };
        let parse_ip = |var: &str| -> Result<Option<IpAddr>> {
            get(var)
                .map(|v| {
                    v.trim().parse::<IpAddr>().map_err(|_| Error::Config {
                        var: var.into(),
                        value: v.clone(),
                        reason: "expected an IP address".into(),
                    })
                })
                .transpose()
        };
        let node_id = get("KOLO_NODE_ID")
            .or_else(|| get("NODE_RANK").map(|n| format!("node-{n}")))
            .or_else(|| get("GROUP_RANK").map(|n| format!("node-{n}")))
            .unwrap_or_else(host_name);
        let job = get("KOLO_JOB_ID")
            .or_else(|| get("TORCHELASTIC_RUN_ID"))
            .unwrap_or_else(|| "kolo".into());
        let restart = get("KOLO_RESTART_COUNT").unwrap_or_else(|| "0".into());
        Ok(InitOptions {
            method,
            rank,
            size,
            host_store: get("KOLO_AGENT_STORE").as_deref() != Some("1"),
            job_id: format!("{job}/{restart}"),
            node_id,
            listen: parse_ip("KOLO_LISTEN_ADDR")?,
            advertise: parse_ip("KOLO_ADVERTISE_ADDR")?,
            transport: TransportChoice::parse(&get("KOLO_TRANSPORT").unwrap_or_default())?,
            shm: ShmOptions::from_env()?,
            heartbeat_timeout: match get("KOLO_HEARTBEAT_TIMEOUT") {
                None => Some(std::time::Duration::from_secs(6)),
                Some(v) => {
                    let secs: f64 = v
                        .trim()
                        .parse()
                        .ok()
                        .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                        .ok_or_else(|| Error::Config {
                            var: "KOLO_HEARTBEAT_TIMEOUT".into(),
                            value: v.clone(),
                            reason: "expected a non-negative number of seconds (0: no heartbeats)"
                                .into(),
                        })?;
                    (secs > 0.0).then(|| std::time::Duration::from_secs_f64(secs))
                }
            },
            config,
        })
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Who runs the collectives (`KOLO_BACKEND`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// MPI when the process was started by an MPI launcher and kolo was built with the `mpi`
    /// feature; kolo's own otherwise (the default).
    Auto,
    /// kolo's algorithms over its own transports (threads, shared memory, TCP).
    Kolo,
    /// The installed MPI library (needs the `mpi` feature).
    Mpi,
}

impl Backend {
    /// Parses `auto`, `kolo` (or `native`) or `mpi`.
    pub fn parse(value: &str) -> Result<Backend> {
        match value.trim() {
            "" | "auto" => Ok(Backend::Auto),
            "kolo" | "native" => Ok(Backend::Kolo),
            "mpi" => Ok(Backend::Mpi),
            _ => Err(Error::Config {
                var: "KOLO_BACKEND".into(),
                value: value.into(),
                reason: "expected auto, kolo or mpi".into(),
            }),
        }
    }

    /// The backend `KOLO_BACKEND` and the launcher's variables choose (read through `get`):
    /// [`Backend::Kolo`] or [`Backend::Mpi`], never `Auto`. Asking for MPI in a build without it
    /// is an error.
    pub fn choose(get: impl Fn(&str) -> Option<String>) -> Result<Backend> {
        let asked = Backend::parse(&get("KOLO_BACKEND").unwrap_or_default())?;
        // Under `kolo run` (which hosts the store) the workers are kolo's even if an MPI launcher
        // started the launcher itself.
        let under_mpi = launched_by_mpi(&get) && get("KOLO_AGENT_STORE").is_none();
        match asked {
            Backend::Kolo => Ok(Backend::Kolo),
            Backend::Mpi if !cfg!(feature = "mpi") => Err(no_mpi()),
            Backend::Mpi => Ok(Backend::Mpi),
            Backend::Auto if under_mpi && cfg!(feature = "mpi") => Ok(Backend::Mpi),
            Backend::Auto => Ok(Backend::Kolo),
        }
    }
}

/// The error for asking a build without the `mpi` feature for MPI.
fn no_mpi() -> Error {
    Error::Config {
        var: "KOLO_BACKEND".into(),
        value: "mpi".into(),
        reason: "this build of kolo has no MPI backend: build it with `--features mpi` (which \
                 needs an MPI library, e.g. Debian's libopenmpi-dev openmpi-bin libclang-dev)"
            .into(),
    }
}

/// Whether an MPI launcher started this process: OpenMPI's `mpirun` (`OMPI_COMM_WORLD_SIZE`),
/// MPICH's Hydra (`PMI_SIZE`), or a PMIx launcher such as `srun --mpi=pmix` (`PMIX_RANK`).
pub fn launched_by_mpi(get: impl Fn(&str) -> Option<String>) -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
        .iter()
        .any(|v| get(v).is_some())
}

/// The world communicator of this process, from the environment (see the module documentation); a
/// world of one when no launcher variables are set. Under `mpirun`/`srun` with the `mpi` feature
/// (or with `KOLO_BACKEND=mpi`) the world runs on MPI (see [`init_mpi`]).
pub fn init() -> Result<Communicator> {
    let get = |k: &str| std::env::var(k).ok();
    match Backend::choose(get)? {
        Backend::Mpi => init_mpi(Config::from_lookup(get)?),
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
    Ok(Communicator::assemble(
        w.transport,
        Some(w.engine),
        (0..size).collect(),
        rank,
        WORLD_GROUP,
        Arc::new(Topology::from_ids(&w.node_ids)),
        config,
        None,
    ))
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

/// The local address that routes to `host:port` (no packet is sent: a UDP `connect` only picks a route).
fn route_to(host: &str, port: u16) -> Option<IpAddr> {
    let target = (host, port).to_socket_addrs().ok()?.next()?;
    let bind = if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let s = UdpSocket::bind(bind).ok()?;
    s.connect(target).ok()?;
    Some(s.local_addr().ok()?.ip())
}

/// The world communicator for explicit options.
pub fn init_with(opts: InitOptions) -> Result<Communicator> {
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
        Option<TcpStoreServer>,
        IpAddr,
        IpAddr,
    ) = match &opts.method {
        InitMethod::Single => {
            let t = local_world(1).pop().ok_or_else(|| Error::Unsupported {
                what: "an empty local world".into(),
            })?;
            return Ok(Communicator::from_parts(
                Arc::new(t),
                vec![0],
                0,
                WORLD_GROUP,
                Arc::new(Topology::single_node(1)),
                opts.config,
                None,
            ));
        }
        InitMethod::Tcp { host, port } => {
            let local = is_loopback(host);
            let server = if opts.rank == 0 && opts.host_store {
                let bind_ip = if local {
                    loopback
                } else {
                    IpAddr::V4(Ipv4Addr::UNSPECIFIED)
                };
                Some(TcpStoreServer::bind((bind_ip, *port))?)
            } else {
                None
            };
            let store = TcpStore::connect(&format!("{host}:{port}"), timeout)?;
            let (listen, advertise) = if local {
                (loopback, loopback)
            } else {
                let adv = route_to(host, *port).unwrap_or(loopback);
                (IpAddr::V4(Ipv4Addr::UNSPECIFIED), adv)
            };
            (Arc::new(store), server, listen, advertise)
        }
        InitMethod::File(path) => (Arc::new(FileStore::open(path)?), None, loopback, loopback),
    };
    let prefix = format!("kolo/{}", opts.job_id);
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
            secret: kolo_store::JobSecret::from_env(),
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
    Ok(Communicator::from_parts(
        transport,
        members,
        opts.rank,
        WORLD_GROUP,
        topology,
        opts.config,
        server,
    ))
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn opts(vars: &[(&str, &str)]) -> Result<InitOptions> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        InitOptions::from_lookup(|k| m.get(k).cloned())
    }

    fn backend(vars: &[(&str, &str)]) -> Result<Backend> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Backend::choose(|k| m.get(k).cloned())
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
            backend(&[("KOLO_BACKEND", "nccl")]),
            Err(Error::Config { var, .. }) if var == "KOLO_BACKEND"
        ));
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
}
