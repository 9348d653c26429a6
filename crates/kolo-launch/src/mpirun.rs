//! Jobs started by the MPI library's own launcher (`mpirun -n N`), which places and supervises the
//! workers; they run kolo on MPI (`kolo run/train/bench --backend mpi`).

use std::ffi::OsString;
use std::process::Command;

use kolo_core::settings::{Env, ProcessEnv};

use crate::LaunchError;

/// The first launch option that does not apply when mpirun places and supervises the workers, in
/// the words of the command line, or `None` if every option given applies.
pub fn unsupported_option(
    on_hosts: bool,
    nnodes: (usize, usize),
    node_rank: Option<usize>,
    max_restarts: usize,
) -> Option<&'static str> {
    let unsupported = [
        (
            on_hosts,
            "--hosts/--hostfile (give mpirun its hosts in KOLO_MPIRUN_ARGS)",
        ),
        (nnodes != (1, 1), "--nnodes"),
        (node_rank.is_some(), "--node-rank"),
        (max_restarts > 0, "--max-restarts"),
    ];
    unsupported
        .iter()
        .find(|(set, _)| *set)
        .map(|(_, what)| *what)
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

/// Runs `program args` on `nproc` workers through mpirun and returns mpirun's exit code (`None`
/// when a signal ended it). The workers get `KOLO_BACKEND=mpi` and `defaults`, except those this
/// process's environment already has.
pub fn run(
    nproc: usize,
    program: OsString,
    args: &[OsString],
    defaults: &[(&str, String)],
) -> Result<Option<i32>, LaunchError> {
    let get = |k: &str| ProcessEnv.lookup(k);
    let mut env: Vec<(&str, String)> = vec![("KOLO_BACKEND", "mpi".into())];
    for (k, v) in defaults {
        if get(k).is_none() {
            env.push((k, v.clone()));
        }
    }
    let is_root = rustix::process::geteuid().is_root();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let line = command_line(nproc, program, args, &env, get, is_root, cpus);
    let mut cmd = Command::new(&line[0]);
    cmd.args(&line[1..]);
    for (k, v) in &env {
        cmd.env(k, v);
    }
    match cmd.status() {
        Ok(status) => Ok(status.code()),
        Err(source) => Err(LaunchError::Mpirun {
            program: line[0].clone(),
            source,
        }),
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

    #[test]
    fn a_missing_mpirun_is_named_with_a_hint() {
        let err = LaunchError::Mpirun {
            program: "mpirun".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert_eq!(
            err.to_string(),
            "cannot start \"mpirun\": entity not found (install OpenMPI or MPICH, or name the \
             launcher in KOLO_MPIRUN)"
        );
    }

    #[test]
    fn options_mpirun_does_not_take() {
        assert_eq!(unsupported_option(false, (1, 1), None, 0), None);
        assert_eq!(
            unsupported_option(false, (1, 2), Some(0), 1),
            Some("--nnodes")
        );
        assert_eq!(
            unsupported_option(false, (1, 1), Some(0), 1),
            Some("--node-rank")
        );
        assert_eq!(
            unsupported_option(false, (1, 1), None, 1),
            Some("--max-restarts")
        );
        assert!(unsupported_option(true, (1, 1), None, 0).is_some_and(|w| w.starts_with("--hosts")));
    }
}
