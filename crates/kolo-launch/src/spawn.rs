//! Starting worker processes with the torchrun environment and piped output.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::process::isolate_child;
use crate::{bind, env, error_record};
use crate::{LaunchConfig, LaunchError, Termination};

/// A started worker.
#[derive(Debug)]
pub(crate) struct Worker {
    pub(crate) rank: usize,
    /// Process id, which is also the id of the worker's process group.
    pub(crate) pid: u32,
    pub(crate) child: Child,
    /// Set once the worker has been reaped.
    pub(crate) exit: Option<Termination>,
    /// When the worker exited (as seen by its exit watcher, or by the poll
    /// that reaped it); set together with `exit`.
    pub(crate) exited_at: Option<Instant>,
    /// Whether a thread is blocked waiting for this worker's exit (see
    /// [`crate::supervise::watch`]); otherwise the supervisor polls it.
    pub(crate) watched: bool,
    /// A fault-tolerant worker that failed and was not restarted: its peers go on without it,
    /// so its failure does not stop the job.
    pub(crate) left_out: bool,
    /// Where the worker records its first error (`TORCHELASTIC_ERROR_FILE`), if it has a file.
    pub(crate) error_file: Option<std::path::PathBuf>,
}

/// What every worker of one launch shares.
#[derive(Debug, Clone)]
pub(crate) struct JobEnv {
    pub(crate) master_port: u16,
    pub(crate) job_id: String,
    /// The CPUs of each rank, when workers are bound.
    pub(crate) cpus: Option<Vec<Vec<usize>>>,
    /// The job secret (`KOLO_JOB_SECRET`).
    pub(crate) secret: String,
    /// How many times the worker group has been restarted (`KOLO_RESTART_COUNT`).
    pub(crate) restart: usize,
    /// How many workers this launcher has restarted alone so far, the one started now included
    /// (`KOLO_WORKER_RESTART`, with [`LaunchConfig::restart_workers`]).
    pub(crate) worker_restart: usize,
    /// This node's rank and the number of nodes.
    pub(crate) node_rank: usize,
    pub(crate) nnodes: usize,
    /// The address workers listen on and advertise (`--iface`), if chosen.
    pub(crate) addr: Option<std::net::IpAddr>,
}

impl JobEnv {
    /// The global rank of local worker `local`.
    pub(crate) fn rank(&self, cfg: &LaunchConfig, local: usize) -> usize {
        self.node_rank * cfg.nproc + local
    }
}

/// The environment variables the launcher sets for local worker `local`, before `extra_env`.
pub(crate) fn worker_env(
    cfg: &LaunchConfig,
    job: &JobEnv,
    local: usize,
) -> Vec<(&'static str, String)> {
    let mut vars = vec![
        (env::RANK, job.rank(cfg, local).to_string()),
        (env::WORLD_SIZE, (job.nnodes * cfg.nproc).to_string()),
        (env::LOCAL_RANK, local.to_string()),
        (env::LOCAL_WORLD_SIZE, cfg.nproc.to_string()),
        (env::GROUP_RANK, job.node_rank.to_string()),
        (env::NODE_RANK, job.node_rank.to_string()),
        (env::MASTER_ADDR, cfg.master_addr.clone()),
        (env::MASTER_PORT, job.master_port.to_string()),
        (env::KOLO_AGENT_STORE, "1".to_owned()),
        (env::KOLO_JOB_ID, job.job_id.clone()),
        (env::KOLO_JOB_SECRET, job.secret.clone()),
        (env::KOLO_RESTART_COUNT, job.restart.to_string()),
        // For PyTorch programs: the store at MASTER_ADDR:MASTER_PORT is the launcher's (it answers
        // TCPStore clients), so torch.distributed's env:// rendezvous connects instead of binding
        // it; the restart count names the attempt's keys, as under torchrun.
        ("TORCHELASTIC_USE_AGENT_STORE", "True".to_owned()),
        ("TORCHELASTIC_RESTART_COUNT", job.restart.to_string()),
    ];
    if job.worker_restart > 0 {
        vars.push((env::KOLO_WORKER_RESTART, job.worker_restart.to_string()));
    }
    if let Some(addr) = job.addr {
        vars.push(("KOLO_LISTEN_ADDR", addr.to_string()));
        vars.push(("KOLO_ADVERTISE_ADDR", addr.to_string()));
    }
    vars
}

/// Starts `rank` in its own process group, stdin from /dev/null (a worker in
/// a background process group reading the terminal would be stopped), stdout
/// and stderr piped.
pub(crate) fn spawn_worker(
    cfg: &LaunchConfig,
    job: &JobEnv,
    local: usize,
) -> Result<Worker, LaunchError> {
    let rank = job.rank(cfg, local);
    let error_file = error_record::file_for(job, rank);
    let mut cmd = Command::new(&cfg.program);
    cmd.args(&cfg.args).envs(worker_env(cfg, job, local));
    if let Some(path) = &error_file {
        cmd.env(error_record::ERROR_FILE_ENV, path);
    }
    cmd.envs(cfg.extra_env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    if cfg.direct_output_rank == Some(rank) {
        cmd.stdout(Stdio::inherit()).stderr(Stdio::inherit());
    } else {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    isolate_child(&mut cmd);
    let mine = job.cpus.as_ref().and_then(|c| c.get(local));
    let threads = bind::threads_per_worker(
        cfg.nproc,
        bind::allowed_cpus().len(),
        mine.map(Vec::as_slice),
    );
    if let Some(n) = threads {
        let given = |var: &str| {
            std::env::var_os(var).is_some() || cfg.extra_env.iter().any(|(k, _)| k == var)
        };
        for var in bind::THREAD_VARS.into_iter().filter(|v| !given(v)) {
            cmd.env(var, n.to_string());
        }
    }
    if let Some(cpus) = mine {
        cmd.env(env::KOLO_CPUS, bind::cpu_list(cpus));
        let set = bind::CpuSet::new(cpus);
        // SAFETY: the hook makes one async-signal-safe system call and does not allocate.
        unsafe {
            cmd.pre_exec(move || set.apply());
        }
    }
    let child = cmd.spawn().map_err(|source| LaunchError::Spawn {
        rank,
        program: cfg.program.clone(),
        source,
    })?;
    Ok(Worker {
        rank,
        pid: child.id(),
        child,
        exit: None,
        exited_at: None,
        watched: false,
        left_out: false,
        error_file,
    })
}

/// A fresh random job id: 16 hex digits from the kernel's random source, or from the clock
/// and the process id where that is unavailable.
pub(crate) fn new_job_id() -> String {
    let mut bytes = [0u8; 8];
    let random = getrandom::fill(&mut bytes);
    if random.is_err() {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        // Truncation is fine: this only needs to differ between launches.
        let mixed = (nanos as u64) ^ (u64::from(std::process::id()) << 40).rotate_left(17);
        bytes = mixed.to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    #[test]
    fn job_ids_are_hex_and_differ() {
        let a = new_job_id();
        let b = new_job_id();
        assert_eq!(a.len(), 16);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn torchrun_environment() {
        let cfg = LaunchConfig::new(4, "true", Vec::<OsString>::new());
        let job = JobEnv {
            master_port: 29500,
            job_id: "abc".to_owned(),
            cpus: None,
            secret: "s".to_owned(),
            restart: 0,
            worker_restart: 0,
            node_rank: 0,
            nnodes: 1,
            addr: None,
        };
        let env = worker_env(&cfg, &job, 2);
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("RANK"), Some("2"));
        assert_eq!(get("WORLD_SIZE"), Some("4"));
        assert_eq!(get("LOCAL_RANK"), Some("2"));
        assert_eq!(get("LOCAL_WORLD_SIZE"), Some("4"));
        assert_eq!(get("GROUP_RANK"), Some("0"));
        assert_eq!(get("NODE_RANK"), Some("0"));
        assert_eq!(get("MASTER_ADDR"), Some("127.0.0.1"));
        assert_eq!(get("MASTER_PORT"), Some("29500"));
        assert_eq!(get("KOLO_AGENT_STORE"), Some("1"));
        assert_eq!(get("TORCHELASTIC_USE_AGENT_STORE"), Some("True"));
        assert_eq!(get("KOLO_JOB_ID"), Some("abc"));
    }
}
