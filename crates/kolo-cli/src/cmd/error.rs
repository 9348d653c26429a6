//! [`CliError`]: why a `kolo` command stopped before or instead of running its job, and the exit
//! code that says so.

use std::process::ExitCode;

use kolo_launch::remote::HostsError;
use kolo_launch::LaunchError;
use kolo_train::simulate::SimError;

/// Why a command could not run its job.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The command line or the environment asks for something this kolo cannot do.
    #[error("{0}")]
    Usage(String),

    /// The hosts of `--hosts`/`--hostfile` cannot run the job.
    #[error(transparent)]
    Hosts(#[from] HostsError),

    /// The job could not be launched.
    #[error(transparent)]
    Launch(#[from] LaunchError),

    /// `--backend mpi`: mpirun could not be started.
    #[error("--backend mpi: {0}")]
    Mpirun(#[source] LaunchError),

    /// `kolo simulate`: the profile, the cluster description or a flag is unusable.
    #[error(transparent)]
    Simulate(#[from] SimError),

    /// Anything else that stopped the command or its job.
    #[error("{0}")]
    Failed(String),
}

impl CliError {
    /// The process's exit code for this error: 2 for a usage error (bad hosts and simulator inputs
    /// included), else 1.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            CliError::Usage(_) | CliError::Hosts(_) | CliError::Simulate(_) => ExitCode::from(2),
            CliError::Launch(_) | CliError::Mpirun(_) | CliError::Failed(_) => ExitCode::FAILURE,
        }
    }
}

/// The exit code of a command's outcome; an error is reported first as `kolo COMMAND: ...`.
pub fn finish(command: &str, outcome: Result<ExitCode, CliError>) -> ExitCode {
    match outcome {
        Ok(code) => code,
        Err(err) => {
            super::report_error(command, &err);
            err.exit_code()
        }
    }
}
