//! [`LaunchError`]: why a job could not be launched.

use std::ffi::OsString;
use std::io;

/// Why [`launch`](crate::launch) could not run the job.
///
/// A worker that fails is not an error: it is reported in the
/// [`LaunchOutcome`](crate::LaunchOutcome). The `Display` text does not repeat
/// the source error; walk [`std::error::Error::source`] for the full story.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// `nproc` was 0.
    #[error("the number of workers must be at least 1")]
    NoWorkers,

    /// The rendezvous store could not be hosted, e.g. because the port is in use.
    #[error("cannot host the rendezvous store on {addr}")]
    Store {
        /// The `host:port` the store tried to bind.
        addr: String,
        /// What the store reported.
        #[source]
        source: kolo_store::StoreError,
    },

    /// A worker's program could not be started (not found, not executable, ...).
    /// Workers started before it have been stopped.
    #[error("cannot start rank {rank}: {}", .program.to_string_lossy())]
    Spawn {
        /// The rank that could not be started.
        rank: usize,
        /// The program that was to be executed.
        program: OsString,
        /// Why starting it failed.
        #[source]
        source: io::Error,
    },

    /// A thread forwarding a worker's output could not be started.
    /// Workers already started have been stopped.
    #[error("cannot start the output thread of rank {rank}")]
    OutputThread {
        /// The rank whose output could not be forwarded.
        rank: usize,
        /// Why the thread could not be started.
        #[source]
        source: io::Error,
    },

    /// Waiting for a worker failed. All workers have been SIGKILLed.
    #[error("cannot wait for rank {rank} (pid {pid})")]
    Wait {
        /// The rank being waited for.
        rank: usize,
        /// Its process id.
        pid: u32,
        /// Why waiting failed.
        #[source]
        source: io::Error,
    },

    /// The launch options contradict each other.
    #[error("{reason}")]
    Config {
        /// What is wrong.
        reason: String,
    },

    /// The launchers of a multi-node job could not agree (or lost their store).
    #[error("multi-node rendezvous: {reason}")]
    Rendezvous {
        /// What went wrong.
        reason: String,
    },

    /// The launchers' rendezvous store failed or could not be reached.
    #[error("multi-node rendezvous: {what}: {source}")]
    RendezvousStore {
        /// What the launcher was doing (`joining the round`, `cannot reach the store at ...`).
        what: String,
        /// What the store reported.
        #[source]
        source: kolo_store::StoreError,
    },

    /// mpirun (or the launcher `KOLO_MPIRUN` names) could not be started.
    #[error(
        "cannot start {program:?}: {source} (install OpenMPI or MPICH, or name the launcher in \
         KOLO_MPIRUN)"
    )]
    Mpirun {
        /// The launcher's program.
        program: OsString,
        /// Why starting it failed.
        #[source]
        source: io::Error,
    },

    /// No random job secret could be generated.
    #[error("cannot generate the job secret (the system random source, getrandom(2), failed)")]
    Secret {
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The launcher's SIGINT/SIGTERM/SIGHUP handlers could not be installed.
    #[error("cannot install the launcher's signal handlers")]
    Signals {
        /// Why the handlers could not be installed.
        #[source]
        source: io::Error,
    },
}
