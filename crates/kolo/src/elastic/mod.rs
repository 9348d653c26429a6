//! Fault-tolerant worlds: training that goes on when a worker is lost, at the size of the workers
//! left, and takes a restarted worker back at a step boundary — without restarting the job.
//!
//! An [`ElasticWorld`] holds the current generation's [`Communicator`]. When a collective fails
//! because a peer died ([`Error::PeerLost`], a timeout, an abort), every
//! survivor calls [`ElasticWorld::reconfigure`]: the survivors agree through the rendezvous store
//! on the next generation's members (those still alive: each process keeps a heartbeat in the
//! store), get new ranks (survivors keep their order) and connect a new communicator over them.
//! A worker started later (the launcher restarting the dead one) asks to join; the members see it
//! at a step boundary ([`ElasticWorld::grow_requested`], agreed by all) and reconfigure with it.
//! What the new generation needs of the old — parameters, optimizer state, the place in the epoch —
//! is the training loop's to hand over (kolo-ddp's `elastic` module does it for DDP).
//!
//! A generation forms when every live process has asked to be in it, or, after a settling time,
//! when a majority of the previous generation has: of a world cut in two, only the side that
//! reaches the store (and, when both do, the majority) goes on. Fewer members than the floor
//! (`min_size`) ends every survivor with [`Error::Membership`].
//!
//! The store must outlive every worker: `kolo run` hosts it in the launcher (so rank 0 may die
//! too), as does torchrun's agent; a rendezvous whose store rank 0 would host is refused. A
//! launcher that reaps a worker says so in the store (`kolo run`), so the others need not wait
//! for its heartbeat to stop.
//!
//! The generations connect kolo's own transports (shared memory, TCP); an MPI world cannot
//! change its members (that needs ULFM's `MPI_Comm_shrink`, which the Open MPI builds kolo is
//! tested with do not enable), and a world of threads ([`crate::run_local`]) has no members that
//! can die alone.
//!
//! ```
//! use std::sync::Arc;
//! use kolo::elastic::{ElasticOptions, ElasticWorld};
//! use kolo::{InitMethod, InitOptions, ReduceOp, SharedStore, TransportChoice};
//!
//! let store: Arc<dyn kolo::store::Store> = Arc::new(kolo::store::MemoryStore::new());
//! let worlds: Vec<_> = (0..2)
//!     .map(|rank| {
//!         let store = store.clone();
//!         std::thread::spawn(move || {
//!             let method = InitMethod::Store { store: SharedStore(store), host: None };
//!             let mut opts = InitOptions::new(method, rank, 2);
//!             opts.transport = TransportChoice::Tcp;
//!             let world = ElasticWorld::new(opts, "doc", ElasticOptions::default())?;
//!             let mut v = [1.0f32];
//!             world.comm().all_reduce(&mut v, ReduceOp::Sum)?;
//!             Ok::<_, kolo::Error>((world.generation(), v[0]))
//!         })
//!     })
//!     .collect();
//! for w in worlds {
//!     assert_eq!(w.join().unwrap().unwrap(), (0, 2.0));
//! }
//! ```

mod quorum;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kolo_core::{Error, ReduceOp, Result};
use kolo_store::{C10dStore, FileStore, Store, TcpStore};

use crate::communicator::Communicator;
use crate::init::{init_with, InitMethod, InitOptions, SharedStore};
use quorum::{Agreed, Heartbeat, Keys, Rules};

/// How a fault-tolerant world behaves.
#[derive(Clone, Debug)]
pub struct ElasticOptions {
    /// The fewest workers training may go on with (`kolo train --min-workers`); fewer ends every
    /// survivor with an error.
    pub min_size: usize,
    /// A worker whose heartbeat in the store stood still this long is dead.
    pub dead_after: Duration,
    /// How long a forming generation waits for live workers that have not asked to be in it
    /// before it goes on without them (with a majority of the previous generation).
    pub settle: Duration,
    /// The longest a worker waits for a generation to form (and for its peers to connect).
    pub timeout: Duration,
    /// The least time between two looks at the store for workers waiting to join.
    pub join_poll: Duration,
}

impl Default for ElasticOptions {
    fn default() -> Self {
        ElasticOptions {
            min_size: 1,
            dead_after: Duration::from_secs(3),
            settle: Duration::from_secs(10),
            timeout: Duration::from_secs(300),
            join_poll: Duration::from_secs(1),
        }
    }
}

/// What a reconfiguration changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reconfigured {
    /// The new generation.
    pub generation: u64,
    /// This worker's rank in it.
    pub rank: usize,
    /// Its size.
    pub size: usize,
    /// Member numbers of the previous generation that are not in this one.
    pub lost: Vec<u64>,
    /// Member numbers new in this one.
    pub joined: Vec<u64>,
    /// Whether this worker was a member of the previous generation (false for a worker that
    /// has just joined: it must receive the training state).
    pub was_member: bool,
}

/// A world that survives the loss of workers (see the [module documentation](self)).
pub struct ElasticWorld {
    store: Arc<dyn Store>,
    host: Option<String>,
    keys: Keys,
    job: String,
    me: u64,
    template: InitOptions,
    rules: Rules,
    options: ElasticOptions,
    agreed: Agreed,
    comm: Communicator,
    last_join_look: Option<Instant>,
    heartbeat: Heartbeat,
}

impl std::fmt::Debug for ElasticWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElasticWorld")
            .field("job", &self.job)
            .field("member", &self.me)
            .field("generation", &self.agreed.generation)
            .field("members", &self.agreed.members)
            .finish()
    }
}

/// The store a fault-tolerant world agrees through, for `opts`'s rendezvous.
fn open_store(opts: &InitOptions) -> Result<(Arc<dyn Store>, Option<String>)> {
    let timeout = opts.config.timeout;
    match &opts.method {
        InitMethod::Tcp { host, port } => {
            if opts.host_store {
                return Err(Error::Unsupported {
                    what: format!(
                        "a fault-tolerant world whose rendezvous store rank 0 would host (at \
                         {host}:{port}): the job could not outlive rank 0; start the workers \
                         with `kolo run` (its launcher hosts the store), torchrun, or a store of \
                         their own (KOLO_INIT_METHOD=file:///shared/path)"
                    ),
                });
            }
            let store = TcpStore::connect(&format!("{host}:{port}"), timeout)?;
            Ok((Arc::new(store), Some(host.clone())))
        }
        InitMethod::C10d { host, port } => {
            let store = C10dStore::connect(&format!("{host}:{port}"), timeout)?;
            Ok((Arc::new(store), Some(host.clone())))
        }
        InitMethod::File(path) => Ok((Arc::new(FileStore::open(path)?), None)),
        InitMethod::Store { store, host } => Ok((store.0.clone(), host.clone())),
        InitMethod::Single => Ok((Arc::new(kolo_store::MemoryStore::new()), None)),
    }
}

impl ElasticWorld {
    /// The fault-tolerant world of this process, from the environment as [`crate::init`] reads it
    /// (under `kolo run`: its launcher's store); a restarted worker joins the running generation.
    pub fn from_env(options: ElasticOptions) -> Result<ElasticWorld> {
        ElasticWorld::from_lookup(kolo_core::settings::ProcessEnv, options)
    }

    /// [`ElasticWorld::from_env`], reading the variables from `env` (a map in tests).
    pub fn from_lookup(
        env: impl kolo_core::settings::Env + Copy,
        options: ElasticOptions,
    ) -> Result<ElasticWorld> {
        let get = |k: &str| env.lookup(k);
        match crate::init::Backend::choose(get)? {
            crate::init::Backend::Mpi => {
                return Err(Error::Unsupported {
                    what: "a fault-tolerant world on MPI: an MPI world cannot change its members \
                           (that needs ULFM's MPI_Comm_shrink); start the workers with `kolo run \
                           --restart-workers` (or KOLO_BACKEND=kolo under mpirun) to use kolo's \
                           own transports"
                        .into(),
                })
            }
            crate::init::Backend::Nccl => {
                return Err(Error::Unsupported {
                    what: "a fault-tolerant world on NCCL (not built yet: training on the CPU \
                           only)"
                        .into(),
                })
            }
            _ => {}
        }
        let opts = InitOptions::from_lookup(env)?;
        // The job without its restart count: every incarnation of a worker meets under one name.
        let job = opts
            .job_id
            .rsplit_once('/')
            .map_or(opts.job_id.clone(), |(job, _)| job.to_string());
        ElasticWorld::new(opts, &job, options)
    }

    /// The fault-tolerant world for explicit options: `opts.rank` orders the first generation
    /// (`opts.size` workers); `job` names the job's keys in the store (every incarnation of every
    /// worker passes the same).
    pub fn new(opts: InitOptions, job: &str, options: ElasticOptions) -> Result<ElasticWorld> {
        let (store, host) = open_store(&opts)?;
        let keys = Keys::new(job);
        let node = std::env::var("NODE_RANK").unwrap_or_else(|_| "0".into());
        let process = format!("{}:{}", node.trim(), std::process::id());
        let me = quorum::register(&*store, &keys, opts.rank, &process)?;
        let heartbeat = Heartbeat::start(store.clone(), keys.clone(), me);
        let rules = Rules {
            first_size: opts.size,
            min_size: options.min_size.max(1),
            dead_after: options.dead_after,
            settle: options.settle,
            timeout: options.timeout,
        };
        // The first generation, or (a restarted worker) the one after the latest.
        let agreed = match quorum::latest(&*store, &keys)? {
            None => quorum::agree(&*store, &keys, me, 0, &[], &rules)?,
            Some(_) => join_later(&*store, &keys, me, &rules)?.0,
        };
        check_agreed(&agreed, me, &rules)?;
        let comm = connect(&opts, &store, &host, job, &agreed, me)?;
        Ok(ElasticWorld {
            store,
            host,
            keys,
            job: job.to_string(),
            me,
            template: opts,
            rules,
            options,
            agreed,
            comm,
            last_join_look: None,
            heartbeat,
        })
    }

    /// The current generation's communicator.
    pub fn comm(&self) -> &Communicator {
        &self.comm
    }

    /// The current generation (0 at launch, one more for each reconfiguration).
    pub fn generation(&self) -> u64 {
        self.agreed.generation
    }

    /// This worker's member number (unique to this incarnation of the worker in the job).
    pub fn member(&self) -> u64 {
        self.me
    }

    /// The members of the current generation, in rank order.
    pub fn members(&self) -> &[u64] {
        &self.agreed.members
    }

    /// Whether a worker has asked to join the next generation (this worker's own look at the
    /// store, at most every [`ElasticOptions::join_poll`]; other members may not have seen it
    /// yet — [`ElasticWorld::grow_requested`] is the agreed answer).
    pub fn joiners_waiting(&mut self) -> Result<bool> {
        let due = self
            .last_join_look
            .is_none_or(|t| t.elapsed() >= self.options.join_poll);
        if !due {
            return Ok(false);
        }
        self.last_join_look = Some(Instant::now());
        Ok(quorum::asked(&*self.store, &self.keys, self.agreed.generation + 1)? > 0)
    }

    /// Collective over the current generation: whether any member saw a worker waiting to join
    /// (then every member calls [`ElasticWorld::reconfigure`] now). Call it at step boundaries.
    pub fn grow_requested(&mut self) -> Result<bool> {
        let mut flag = [u8::from(self.joiners_waiting()?)];
        self.comm.all_reduce(&mut flag, ReduceOp::Max)?;
        Ok(flag[0] != 0)
    }

    /// Forms the next generation with the workers alive now (and those waiting to join), and
    /// connects its communicator. Every live member calls it: after a collective failed (a peer
    /// lost), or when [`ElasticWorld::grow_requested`] says so. A worker left out (it asked too
    /// late) joins the generation after; fewer members than the floor is an error on every one.
    pub fn reconfigure(&mut self) -> Result<Reconfigured> {
        let previous = self.agreed.clone();
        let k = previous.generation + 1;
        let mut agreed = quorum::agree(
            &*self.store,
            &self.keys,
            self.me,
            k,
            &previous.members,
            &self.rules,
        )?;
        if !agreed.members.contains(&self.me) {
            agreed = join_later(&*self.store, &self.keys, self.me, &self.rules)?.0;
        }
        check_agreed(&agreed, self.me, &self.rules)?;
        let comm = connect(
            &self.template,
            &self.store,
            &self.host,
            &self.job,
            &agreed,
            self.me,
        )?;
        self.comm = comm;
        self.agreed = agreed;
        let now = &self.agreed.members;
        Ok(Reconfigured {
            generation: self.agreed.generation,
            rank: self.comm.rank(),
            size: self.comm.size(),
            lost: previous
                .members
                .iter()
                .copied()
                .filter(|m| !now.contains(m))
                .collect(),
            joined: now
                .iter()
                .copied()
                .filter(|m| !previous.members.contains(m))
                .collect(),
            was_member: previous.members.contains(&self.me),
        })
    }

    /// Stops this worker's heartbeat without leaving: to the others it died (for tests of the
    /// survivors; the process goes on and its communicator is aborted).
    #[doc(hidden)]
    pub fn crash_for_test(&mut self) {
        self.heartbeat.stop_silently();
        self.comm.abort("simulated crash");
    }
}

/// Joins the first generation after the latest that takes this worker.
fn join_later(store: &dyn Store, keys: &Keys, me: u64, rules: &Rules) -> Result<(Agreed, u64)> {
    let start = Instant::now();
    loop {
        let latest = quorum::latest(store, keys)?.unwrap_or(0);
        let previous = quorum::members(store, keys, latest)?.unwrap_or_default();
        let agreed = quorum::agree(store, keys, me, latest + 1, &previous, rules)?;
        if agreed.members.contains(&me) {
            return Ok((agreed, latest));
        }
        if start.elapsed() >= rules.timeout {
            return Err(Error::Membership {
                generation: latest + 1,
                reason: format!(
                    "member {me} was not taken into a generation within {:?}",
                    rules.timeout
                ),
            });
        }
    }
}

fn check_agreed(agreed: &Agreed, me: u64, rules: &Rules) -> Result<()> {
    if agreed.members.len() < rules.min_size {
        return Err(Error::Membership {
            generation: agreed.generation,
            reason: format!(
                "only {} live worker(s) (members {:?}), fewer than the floor of {} \
                 (--min-workers): the job stops here; its last checkpoint, if any, resumes it",
                agreed.members.len(),
                agreed.members,
                rules.min_size
            ),
        });
    }
    if !agreed.members.contains(&me) {
        return Err(Error::Membership {
            generation: agreed.generation,
            reason: format!(
                "member {me} is not in the agreed members {:?}",
                agreed.members
            ),
        });
    }
    Ok(())
}

/// The communicator of generation `agreed` for member `me`.
fn connect(
    template: &InitOptions,
    store: &Arc<dyn Store>,
    host: &Option<String>,
    job: &str,
    agreed: &Agreed,
    me: u64,
) -> Result<Communicator> {
    let rank = agreed
        .members
        .iter()
        .position(|&m| m == me)
        .unwrap_or(usize::MAX);
    let mut opts = template.clone();
    opts.method = InitMethod::Store {
        store: SharedStore(store.clone()),
        host: host.clone(),
    };
    opts.rank = rank;
    opts.size = agreed.members.len();
    opts.host_store = false;
    opts.job_id = format!("{job}/ft/world{}", agreed.generation);
    init_with(opts)
}

#[cfg(test)]
mod tests;
