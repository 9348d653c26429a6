//! One module per `kolo` subcommand.

pub mod bench;
pub mod diagnose;
pub mod error;
pub mod launch_args;
pub mod plot;
pub mod run;
pub mod scaling;
pub mod simulate;
pub mod train;

use std::error::Error;
use std::process::ExitCode;

pub use error::finish;
use error::CliError;

/// Prints `kolo <command>: <error>: <source>: ...` to stderr, leaving out
/// sources whose text the message already contains.
/// glibc's malloc settings `kolo train` gives its workers: glibc hands large tensor buffers back to
/// the OS after every step and page-faults them in again (a third of LeNet's step time); keep them.
/// And back the heap with transparent huge pages where the kernel offers them on request
/// (`madvise` mode): the convolutions' multi-MiB work buffers and transformed kernels then take
/// far fewer TLB misses (ResNet-18's 3×3 layers: about 5 % less time per step).
pub const TRAIN_MALLOC_TUNABLES: &str = "glibc.malloc.mmap_threshold=4294967295:\
glibc.malloc.trim_threshold=4294967295:glibc.malloc.hugetlb=1";

pub fn report_error(command: &str, err: &dyn Error) {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !text.is_empty() && !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    eprintln!("kolo {command}: {message}");
}

/// Converts an exit code to an [`ExitCode`], mapping codes outside 0..=255 to 1.
pub fn exit_code(code: i32) -> ExitCode {
    match u8::try_from(code) {
        Ok(code) => ExitCode::from(code),
        Err(_) => ExitCode::FAILURE,
    }
}

/// Starts `nproc` workers running `kolo COMMAND --worker` with this process's arguments after
/// `COMMAND` (through mpirun with `--backend mpi`) and returns the job's exit code. `defaults` are
/// set for the workers unless this process's environment already has them.
pub fn launch_workers(
    command: &str,
    nproc: usize,
    launch: &launch_args::LaunchArgs,
    defaults: &[(&str, String)],
) -> Result<ExitCode, CliError> {
    let exe = std::env::current_exe().map_err(|e| {
        CliError::Failed(format!(
            "cannot find the kolo executable to start workers: {e}"
        ))
    })?;
    let mut worker_args: Vec<std::ffi::OsString> = vec![command.into(), "--worker".into()];
    worker_args.extend(std::env::args_os().skip_while(|a| a != command).skip(1));
    if launch.backend == launch_args::LaunchBackend::Mpi {
        return launch_args::launch_mpi(nproc, launch, exe.into(), &worker_args, defaults);
    }
    let mut cfg = kolo_launch::LaunchConfig::new(nproc, exe, worker_args);
    cfg.direct_output_rank = Some(0);
    launch.apply(&mut cfg)?;
    for (k, v) in defaults {
        if kolo_core::settings::Env::lookup_os(&kolo_core::settings::ProcessEnv, k).is_none() {
            cfg.extra_env.push(((*k).into(), v.into()));
        }
    }
    let outcome = kolo_launch::launch(&cfg)?;
    Ok(exit_code(outcome.exit_code()))
}
