//! The options of [`init_with`](super::init_with) and how they are read from a launcher's
//! environment.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use kolo_core::{Error, Result};
use kolo_store::Store;
use kolo_transport::ShmOptions;

use super::launchers;
use crate::config::Config;

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
    /// A PyTorch c10d `TCPStore` at `host:port` that someone else hosts: torchrun's agent store
    /// (`TORCHELASTIC_USE_AGENT_STORE=True`), or `c10d://host:port`.
    C10d {
        /// Host of the store.
        host: String,
        /// Port of the store.
        port: u16,
    },
    /// A rendezvous file on a file system all ranks share.
    File(PathBuf),
    /// A store the program already has: another framework's (PyTorch's `Store` handed to a
    /// process-group backend), shared by all ranks. `host` is where it lives, when known: a
    /// loopback or absent host keeps the TCP transport on loopback, another host makes it listen
    /// on all interfaces and advertise the address that routes there.
    Store {
        /// The store.
        store: SharedStore,
        /// Host of the store's server, if known.
        host: Option<String>,
    },
}

/// A rendezvous store shared by the ranks' [`InitMethod::Store`]; equal when it is the same store
/// object.
#[derive(Clone)]
pub struct SharedStore(pub Arc<dyn Store>);

impl PartialEq for SharedStore {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedStore {}

impl std::fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedStore({:?})", self.0)
    }
}

impl InitMethod {
    /// Parses `tcp://host:port`, `c10d://host:port` or `file:///path`.
    pub fn parse(url: &str) -> Result<InitMethod> {
        let bad = |reason: &str| Error::Config {
            var: "init method".into(),
            value: url.into(),
            reason: reason.into(),
        };
        let tcp = url.strip_prefix("tcp://");
        let c10d = url.strip_prefix("c10d://");
        if let Some(rest) = tcp.or(c10d) {
            let (host, port) = rest
                .rsplit_once(':')
                .ok_or_else(|| bad("expected tcp://HOST:PORT or c10d://HOST:PORT"))?;
            let port: u16 = port
                .parse()
                .map_err(|_| bad("the port is not a number 0-65535"))?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            if host.is_empty() {
                return Err(bad("the host is empty"));
            }
            let host = host.to_string();
            Ok(if c10d.is_some() {
                InitMethod::C10d { host, port }
            } else {
                InitMethod::Tcp { host, port }
            })
        } else if let Some(path) = url.strip_prefix("file://") {
            if path.is_empty() {
                return Err(bad("expected file:///PATH"));
            }
            Ok(InitMethod::File(PathBuf::from(path)))
        } else {
            Err(bad(
                "expected tcp://HOST:PORT, c10d://HOST:PORT or file:///PATH",
            ))
        }
    }
}

/// Everything [`init_with`](super::init_with) needs; [`InitOptions::from_env`] reads it from the environment.
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
        InitOptions::from_lookup(kolo_core::settings::ProcessEnv)
    }

    /// Like [`InitOptions::from_env`], reading variables from `env` (a map or a closure in tests).
    pub fn from_lookup(env: impl kolo_core::settings::Env) -> Result<InitOptions> {
        let get = |k: &str| env.lookup(k);
        let config = Config::from_lookup(get)?;
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
                    found = Some((rank, size, r));
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
        let Some((rank, size, rank_var)) = found else {
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
        let torchrun = launchers::torchelastic(&get)?;
        // torchrun's agent store speaks c10d; under `kolo run` (KOLO_AGENT_STORE=1), which also
        // sets TORCHELASTIC_USE_AGENT_STORE for PyTorch programs, kolo's workers use kolo's protocol.
        let kolo_agent = get("KOLO_AGENT_STORE").as_deref() == Some("1");
        let agent_store = !kolo_agent && torchrun.as_ref().is_some_and(|t| t.agent_store);
        let slurm = rank_var == "SLURM_PROCID";
        let master_port = get("MASTER_PORT")
            .map(|text| {
                text.trim().parse::<u16>().map_err(|_| Error::Config {
                    var: "MASTER_PORT".into(),
                    value: text.clone(),
                    reason: "expected a port number 0-65535".into(),
                })
            })
            .transpose()?;
        let method = match method_var {
            Some(m) => InitMethod::parse(&m)?,
            None if size == 1 && master_port.is_none() && !agent_store => InitMethod::Single,
            // srun without MASTER_ADDR/MASTER_PORT: the node list's first host, a port from the
            // job id.
            None if slurm
                && (master_port.is_none()
                    || (get("MASTER_ADDR").is_none()
                        && launchers::SLURM_NODELIST_VARS
                            .iter()
                            .any(|v| get(v).is_some()))) =>
            {
                let (host, port) =
                    launchers::slurm_rendezvous(&get, get("MASTER_ADDR"), master_port)?;
                InitMethod::Tcp { host, port }
            }
            None => {
                let port = master_port.ok_or_else(|| Error::Config {
                    var: "MASTER_PORT".into(),
                    value: String::new(),
                    reason: if agent_store {
                        "not set: torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True) is at MASTER_ADDR:MASTER_PORT".into()
                    } else {
                        "not set: the rendezvous needs MASTER_ADDR and MASTER_PORT (or KOLO_INIT_METHOD)".into()
                    },
                })?;
                let host = get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
                if agent_store {
                    InitMethod::C10d { host, port }
                } else {
                    InitMethod::Tcp { host, port }
                }
            }
        };
        let job = get("KOLO_JOB_ID")
            .or_else(|| torchrun.as_ref().and_then(|t| t.run_id.clone()))
            .or_else(|| {
                slurm
                    .then(|| get("SLURM_JOB_ID"))
                    .flatten()
                    .map(|j| format!("slurm-{j}"))
            })
            .unwrap_or_else(|| "kolo".into());
        let restart = get("KOLO_RESTART_COUNT")
            .or_else(|| {
                torchrun
                    .as_ref()
                    .and_then(|t| t.restart_count)
                    .map(|c| c.to_string())
            })
            .unwrap_or_else(|| "0".into());
        InitOptions {
            method,
            rank,
            size,
            host_store: !kolo_agent && !agent_store,
            job_id: format!("{job}/{restart}"),
            ..InitOptions::single()
        }
        .with_settings(env)
    }

    /// These options with the settings that are not the rendezvous read from `env`: the node's
    /// identity (`KOLO_NODE_ID`, `NODE_RANK`, `GROUP_RANK`, `SLURM_NODEID`, else the host name),
    /// `KOLO_LISTEN_ADDR`, `KOLO_ADVERTISE_ADDR`, `KOLO_TRANSPORT`, the shared-memory settings,
    /// `KOLO_HEARTBEAT_TIMEOUT` and the communicator's [`Config`]. For programs that bring their
    /// own rendezvous ([`InitMethod::Store`]) but honour kolo's settings.
    pub fn with_settings(self, env: impl kolo_core::settings::Env) -> Result<InitOptions> {
        let get = |k: &str| env.lookup(k);
        let config = Config::from_lookup(get)?;
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
            .or_else(|| get("SLURM_NODEID").map(|n| format!("node-{n}")))
            .unwrap_or_else(host_name);
        Ok(InitOptions {
            node_id,
            listen: parse_ip("KOLO_LISTEN_ADDR")?,
            advertise: parse_ip("KOLO_ADVERTISE_ADDR")?,
            transport: TransportChoice::parse(&get("KOLO_TRANSPORT").unwrap_or_default())?,
            shm: ShmOptions::from_lookup(get)?,
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
                    crate::config::timeout_from_secs(secs)
                }
            },
            config,
            ..self
        })
    }
}

fn host_name() -> String {
    kolo_core::host::hostname().unwrap_or_else(|| "localhost".into())
}
