//! Which backend runs the collectives: kolo's own, an installed MPI library or NCCL on GPUs.

use kolo_core::Error;
use kolo_core::Result;

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
    /// NCCL on this host's GPUs, one process per GPU (needs the `nccl` feature); kolo's
    /// transports still carry point-to-point messages.
    Nccl,
}

impl Backend {
    /// Parses `auto`, `kolo` (or `native`), `mpi` or `nccl`.
    pub fn parse(value: &str) -> Result<Backend> {
        match value.trim() {
            "" | "auto" => Ok(Backend::Auto),
            "kolo" | "native" => Ok(Backend::Kolo),
            "mpi" => Ok(Backend::Mpi),
            "nccl" => Ok(Backend::Nccl),
            _ => Err(Error::Config {
                var: "KOLO_BACKEND".into(),
                value: value.into(),
                reason: "expected auto, kolo, mpi or nccl".into(),
            }),
        }
    }

    /// The backend `KOLO_BACKEND` and the launcher's variables choose (read from `env`):
    /// [`Backend::Kolo`], [`Backend::Mpi`] or [`Backend::Nccl`], never `Auto` (NCCL only when
    /// asked for). Asking for MPI or NCCL in a build without it is an error.
    pub fn choose(env: impl kolo_core::settings::Env) -> Result<Backend> {
        let get = |k: &str| env.lookup(k);
        let asked = Backend::parse(&get("KOLO_BACKEND").unwrap_or_default())?;
        // Under `kolo run` (which hosts the store) the workers are kolo's even if an MPI launcher
        // started the launcher itself.
        let under_mpi = launched_by_mpi(get) && get("KOLO_AGENT_STORE").is_none();
        match asked {
            Backend::Kolo => Ok(Backend::Kolo),
            Backend::Mpi if !cfg!(feature = "mpi") => Err(no_mpi()),
            Backend::Mpi => Ok(Backend::Mpi),
            Backend::Nccl if !cfg!(feature = "nccl") => Err(no_nccl()),
            Backend::Nccl => Ok(Backend::Nccl),
            Backend::Auto if under_mpi && cfg!(feature = "mpi") => Ok(Backend::Mpi),
            Backend::Auto => Ok(Backend::Kolo),
        }
    }
}

/// The error for asking a build without the `mpi` feature for MPI.
pub(super) fn no_mpi() -> Error {
    Error::Config {
        var: "KOLO_BACKEND".into(),
        value: "mpi".into(),
        reason: "this build of kolo has no MPI backend: build it with `--features mpi` (which \
                 needs an MPI library, e.g. Debian's libopenmpi-dev openmpi-bin libclang-dev)"
            .into(),
    }
}

/// The error for asking a build without the `nccl` feature for NCCL.
pub(super) fn no_nccl() -> Error {
    Error::Config {
        var: "KOLO_BACKEND".into(),
        value: "nccl".into(),
        reason: "this build of kolo has no NCCL backend: build it with `--features nccl` (no CUDA \
                 is needed to build; running needs NVIDIA GPUs, their driver and NCCL 2.18+)"
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
