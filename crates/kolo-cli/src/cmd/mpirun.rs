//! `--backend mpi`: the workers are started by the MPI library's own launcher (`mpirun -n N`), which
//! places and supervises them, and they run kolo on MPI.

use std::ffi::OsString;
use std::process::{Command, ExitCode};

use clap::ValueEnum;

use super::launch_args::LaunchArgs;

/// Who starts the workers and runs their collectives (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum LaunchBackend {
    /// kolo's launcher and transports (shared memory, TCP)
    #[default]
    Kolo,
    /// `mpirun -n N` starts the workers, which run on the installed MPI library
    Mpi,
}

/// The `mpirun` command line for `nproc` workers running `program args`: `KOLO_MPIRUN` (default
/// `mpirun`), `--allow-run-as-root` when running as root, `--oversubscribe` when there are more
/// workers than CPUs, the words of `KOLO_MPIRUN_ARGS`, and `-x` for each variable the workers need.
pub fn command_line(
    nproc: usize,
    program: OsString,
    args: &[OsString],
    env: &[(&str, String)],
    get: impl Fn(&str) -> Option<String>,
    is_root: bool,
    cpus: usize,
) -> Vec<OsString> {
    let mut line: Vec<OsString> = vec![get("KOLO_MPIRUN")
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "mpirun".into())
        .into()];
    if is_root {
        line.push("--allow-run-as-root".into());
    }
    if nproc > cpus {
        line.push("--oversubscribe".into());
    }
    if let Some(extra) = get("KOLO_MPIRUN_ARGS") {
        line.extend(extra.split_whitespace().map(OsString::from));
    }
    for (k, _) in env {
        line.push("-x".into());
        line.push((*k).into());
    }
    line.push("-n".into());
    line.push(nproc.to_string().into());
    line.push(program);
    line.extend(args.iter().cloned());
    line
}

/// Starts the job through mpirun and returns its exit code. `defaults` are set for the workers
/// unless this process's environment already has them.
pub fn launch(
    command: &str,
    nproc: usize,
    launch: &LaunchArgs,
    program: OsString,
    args: &[OsString],
    defaults: &[(&str, String)],
) -> ExitCode {
    if !cfg!(feature = "mpi") {
        eprintln!(
            "kolo {command}: --backend mpi: this kolo was built without the MPI backend; build it \
             with `cargo build --release --features mpi` (needs an MPI library, e.g. Debian's \
             libopenmpi-dev openmpi-bin libclang-dev)"
        );
        return ExitCode::from(2);
    }
    let unsupported = [
        (
            launch.on_hosts(),
            "--hosts/--hostfile (give mpirun its hosts in KOLO_MPIRUN_ARGS)",
        ),
        (launch.nnodes != (1, 1), "--nnodes"),
        (launch.node_rank.is_some(), "--node-rank"),
        (launch.max_restarts > 0, "--max-restarts"),
    ];
    if let Some((_, what)) = unsupported.iter().find(|(set, _)| *set) {
        eprintln!(
            "kolo {command}: --backend mpi: mpirun places and supervises the workers, so {what} \
             does not apply"
        );
        return ExitCode::from(2);
    }
    let get = |k: &str| std::env::var(k).ok();
    let mut env: Vec<(&str, String)> = vec![("KOLO_BACKEND", "mpi".into())];
    for (k, v) in defaults {
        if get(k).is_none() {
            env.push((k, v.clone()));
        }
    }
    // SAFETY: geteuid has no preconditions.
    let is_root = unsafe { libc::geteuid() } == 0;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let line = command_line(nproc, program, args, &env, get, is_root, cpus);
    let mut cmd = Command::new(&line[0]);
    cmd.args(&line[1..]);
    for (k, v) in &env {
        cmd.env(k, v);
    }
    match cmd.status() {
        Ok(status) => match status.code() {
            Some(code) => super::exit_code(code),
            None => ExitCode::FAILURE,
        },
        Err(e) => {
            eprintln!(
                "kolo {command}: --backend mpi: cannot start {:?}: {e} (install OpenMPI or MPICH, \
                 or name the launcher in KOLO_MPIRUN)",
                line[0]
            );
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(v: &[OsString]) -> Vec<String> {
        v.iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn the_mpirun_line() {
        let env = [("KOLO_BACKEND", "mpi".to_string())];
        let none = |_: &str| None;
        let line = command_line(4, "prog".into(), &["a".into()], &env, none, false, 8);
        assert_eq!(
            words(&line),
            ["mpirun", "-x", "KOLO_BACKEND", "-n", "4", "prog", "a"]
        );
        let get = |k: &str| match k {
            "KOLO_MPIRUN" => Some("/opt/mpi/bin/mpiexec".to_string()),
            "KOLO_MPIRUN_ARGS" => Some(" --bind-to core  --map-by socket".to_string()),
            _ => None,
        };
        let line = command_line(4, "prog".into(), &[], &env, get, true, 2);
        assert_eq!(
            words(&line),
            [
                "/opt/mpi/bin/mpiexec",
                "--allow-run-as-root",
                "--oversubscribe",
                "--bind-to",
                "core",
                "--map-by",
                "socket",
                "-x",
                "KOLO_BACKEND",
                "-n",
                "4",
                "prog"
            ]
        );
    }
}
