//! Starting a job on several hosts from one command (horovodrun's shape): `kolo run -n 8
//! --hosts a:4,b:4 -- PROGRAM` starts `kolo run --nnodes 2 --node-rank R ...` on every host over
//! `ssh` (or `KOLO_SSH`), the first host's launcher hosting the store, and waits for them.
//!
//! The job secret goes to each remote launcher on its standard input, never on a command line. Each
//! remote launcher also watches its standard input: when this process ends or closes it (Ctrl-C,
//! a failure elsewhere), the ssh connection closes and the remote launcher stops its workers.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kolo_core::settings::{Env, ProcessEnv};

use crate::process::SignalFlags;
use crate::LaunchError;

/// One host and how many workers it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSpec {
    /// Host name or address, as `ssh` takes it.
    pub host: String,
    /// Workers on it.
    pub slots: usize,
}

/// Parses `a:4,b:4` (a host without `:N` has one slot).
pub fn parse_hosts(s: &str) -> Result<Vec<HostSpec>, String> {
    let hosts: Vec<HostSpec> = s
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| parse_one(p.trim(), ':'))
        .collect::<Result<_, _>>()?;
    if hosts.is_empty() {
        return Err("no hosts given".into());
    }
    Ok(hosts)
}

/// Parses a host file: one host per line as `host`, `host:N` or `host slots=N`; `#` starts a
/// comment.
pub fn parse_hostfile(text: &str) -> Result<Vec<HostSpec>, String> {
    let mut hosts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let spec = if let Some((h, rest)) = line.split_once(char::is_whitespace) {
            let n = rest
                .trim()
                .strip_prefix("slots=")
                .ok_or_else(|| format!("line {}: expected `host slots=N`, got {line:?}", i + 1))?;
            parse_one(&format!("{h}:{n}"), ':')
        } else {
            parse_one(line, ':')
        };
        hosts.push(spec.map_err(|e| format!("line {}: {e}", i + 1))?);
    }
    if hosts.is_empty() {
        return Err("the host file lists no hosts".into());
    }
    Ok(hosts)
}

fn parse_one(p: &str, sep: char) -> Result<HostSpec, String> {
    let (host, slots) = match p.rsplit_once(sep) {
        Some((h, n)) if !h.is_empty() && !h.ends_with(':') => (
            h,
            n.trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("bad slot count in {p:?}"))?,
        ),
        _ => (p, 1),
    };
    if host.is_empty() || host.starts_with('-') {
        return Err(format!("bad host name {host:?}"));
    }
    Ok(HostSpec {
        host: host.to_owned(),
        slots,
    })
}

/// Why the hosts given with `--hosts`/`--hostfile` cannot run a job.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostsError {
    /// The host file could not be read.
    #[error("--hosts/--hostfile: cannot read {}: {source}", .path.display())]
    Read {
        /// The host file.
        path: PathBuf,
        /// Why reading it failed.
        #[source]
        source: std::io::Error,
    },

    /// The host list or file is malformed (or there is none).
    #[error("--hosts/--hostfile: {0}")]
    Parse(String),

    /// The hosts do not all run the same number of workers.
    #[error("every host must run the same number of workers (got {listed})")]
    UnevenSlots {
        /// The hosts as `host:slots,...`.
        listed: String,
    },

    /// The hosts' slots do not add up to the number of workers.
    #[error("-n {nproc} must equal the hosts' slots, {total} in all ({listed})")]
    SlotCount {
        /// Workers asked for.
        nproc: usize,
        /// The hosts' slots together.
        total: usize,
        /// The hosts as `host:slots,...`.
        listed: String,
    },

    /// `--nnodes` or `--node-rank` was given too; the host list sets them.
    #[error("--hosts chooses --nnodes and --node-rank itself; give one or the other")]
    NodeOptions,
}

/// The hosts of a job of `nproc` workers, from a `--hosts` list or else a `--hostfile`, checked:
/// every host runs the same number of workers, their slots add up to `nproc`, and neither
/// `nnodes` (other than 1) nor `node_rank` is given. The list is never empty.
pub fn job_hosts(
    hosts: Option<&str>,
    hostfile: Option<&Path>,
    nproc: usize,
    nnodes: (usize, usize),
    node_rank: Option<usize>,
) -> Result<Vec<HostSpec>, HostsError> {
    let hosts = match (hosts, hostfile) {
        (Some(list), _) => parse_hosts(list).map_err(HostsError::Parse)?,
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|source| HostsError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            parse_hostfile(&text).map_err(HostsError::Parse)?
        }
        (None, None) => return Err(HostsError::Parse("no hosts".into())),
    };
    let Some(per) = hosts.first().map(|h| h.slots) else {
        return Err(HostsError::Parse("no hosts".into()));
    };
    let total: usize = hosts.iter().map(|h| h.slots).sum();
    let listed = || {
        hosts
            .iter()
            .map(|h| format!("{}:{}", h.host, h.slots))
            .collect::<Vec<_>>()
            .join(",")
    };
    if hosts.iter().any(|h| h.slots != per) {
        return Err(HostsError::UnevenSlots { listed: listed() });
    }
    if total != nproc {
        return Err(HostsError::SlotCount {
            nproc,
            total,
            listed: listed(),
        });
    }
    if nnodes != (1, 1) || node_rank.is_some() {
        return Err(HostsError::NodeOptions);
    }
    Ok(hosts)
}

/// Quotes `s` for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Whether `host` names this machine (then no ssh is needed).
pub fn is_local(host: &str) -> bool {
    matches!(host, "localhost" | "127.0.0.1" | "::1") || host == crate::net::hostname()
}

/// Runs `node_command(i)` (a `kolo run` argument list for node i) on every host, over `ssh` (the
/// command in `KOLO_SSH`, split on spaces, default `ssh -o BatchMode=yes`), passing `secret` on
/// standard input; returns the exit code of the job (the first non-zero one, or 0).
pub fn run_hosts(
    hosts: &[HostSpec],
    node_command: &dyn Fn(usize) -> Vec<OsString>,
    secret: &str,
    grace: Duration,
) -> Result<i32, LaunchError> {
    let signals = SignalFlags::register().map_err(|source| LaunchError::Signals { source })?;
    let ssh: Vec<String> = ProcessEnv
        .lookup("KOLO_SSH")
        .unwrap_or_else(|| "ssh -o BatchMode=yes".into())
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let cwd = std::env::current_dir()
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_else(|_| ".".into());
    let mut children: Vec<(String, Child)> = Vec::new();
    for (i, h) in hosts.iter().enumerate() {
        let args: Vec<String> = node_command(i)
            .iter()
            .map(|a| shell_quote(&a.to_string_lossy()))
            .collect();
        let script = format!(
            "cd {} 2>/dev/null; IFS= read -r KOLO_JOB_SECRET && export KOLO_JOB_SECRET && exec {}",
            shell_quote(&cwd),
            args.join(" ")
        );
        let (program, mut cmd) = if is_local(&h.host) && ProcessEnv.lookup_os("KOLO_SSH").is_none()
        {
            let mut c = Command::new("sh");
            c.arg("-c").arg(&script);
            ("sh", c)
        } else {
            let (prog, opts) = ssh.split_first().ok_or_else(|| LaunchError::Config {
                reason: "KOLO_SSH is empty".into(),
            })?;
            let mut c = Command::new(prog);
            c.args(opts).arg(&h.host).arg(&script);
            (prog.as_str(), c)
        };
        cmd.stdin(Stdio::piped());
        let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn {
            rank: i,
            program: OsString::from(program),
            source,
        })?;
        if let Some(stdin) = child.stdin.as_mut() {
            let _ = writeln!(stdin, "{secret}");
            let _ = stdin.flush();
        }
        children.push((h.host.clone(), child));
    }
    let mut codes: Vec<Option<i32>> = vec![None; children.len()];
    let mut first_bad: Option<i32> = None;
    let mut stop_at: Option<Instant> = None;
    loop {
        for (i, (host, child)) in children.iter_mut().enumerate() {
            if codes[i].is_some() {
                continue;
            }
            if let Ok(Some(status)) = child.try_wait() {
                let code = status.code().unwrap_or(1);
                codes[i] = Some(code);
                if code != 0 && first_bad.is_none() {
                    crate::supervise::report(format_args!(
                        "node {i} ({host}) exited with code {code}"
                    ));
                    first_bad = Some(code);
                    // The others learn of it through the store; give them time to stop.
                    stop_at.get_or_insert(Instant::now() + grace + Duration::from_secs(15));
                }
            }
        }
        if codes.iter().all(Option::is_some) {
            break;
        }
        if let Some(sig) = signals.take() {
            crate::supervise::report(format_args!("received signal {sig}, stopping every node"));
            first_bad.get_or_insert(128 + sig);
            // Closing their standard input makes the launchers stop their workers.
            for (_, child) in children.iter_mut() {
                drop(child.stdin.take());
            }
            stop_at.get_or_insert(Instant::now() + grace + Duration::from_secs(5));
        }
        if stop_at.is_some_and(|t| Instant::now() >= t) {
            for (i, (_, child)) in children.iter_mut().enumerate() {
                if codes[i].is_none() {
                    drop(child.stdin.take());
                    let _ = child.kill();
                    let _ = child.wait();
                    codes[i] = Some(1);
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(first_bad.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_hosts_are_checked_against_the_job() {
        let hosts = job_hosts(Some("a:2,b:2"), None, 4, (1, 1), None).expect("valid hosts");
        assert_eq!(hosts.len(), 2);
        let err = |r: Result<Vec<HostSpec>, HostsError>| r.expect_err("invalid").to_string();
        assert_eq!(
            err(job_hosts(Some("a:2,b:1"), None, 3, (1, 1), None)),
            "every host must run the same number of workers (got a:2,b:1)"
        );
        assert_eq!(
            err(job_hosts(Some("a:2,b:2"), None, 8, (1, 1), None)),
            "-n 8 must equal the hosts' slots, 4 in all (a:2,b:2)"
        );
        assert_eq!(
            err(job_hosts(Some("a:2,b:2"), None, 4, (2, 2), None)),
            "--hosts chooses --nnodes and --node-rank itself; give one or the other"
        );
        assert_eq!(
            err(job_hosts(None, None, 4, (1, 1), None)),
            "--hosts/--hostfile: no hosts"
        );
        let missing = Path::new("/nonexistent/kolo-hostfile");
        let e = err(job_hosts(None, Some(missing), 4, (1, 1), None));
        assert!(
            e.starts_with("--hosts/--hostfile: cannot read /nonexistent/kolo-hostfile: "),
            "{e}"
        );
    }

    #[test]
    fn host_lists_and_files() {
        assert_eq!(
            parse_hosts("a:4,b:2,c").expect("hosts"),
            vec![
                HostSpec {
                    host: "a".into(),
                    slots: 4
                },
                HostSpec {
                    host: "b".into(),
                    slots: 2
                },
                HostSpec {
                    host: "c".into(),
                    slots: 1
                },
            ]
        );
        assert!(parse_hosts("a:0").is_err());
        assert!(parse_hosts("a:x").is_err());
        assert!(parse_hosts("").is_err());
        let file = "# cluster\nnode1 slots=4\nnode2:4\n\nnode3 # one slot\n";
        let hosts = parse_hostfile(file).expect("file");
        assert_eq!(hosts.len(), 3);
        assert_eq!((hosts[0].slots, hosts[1].slots, hosts[2].slots), (4, 4, 1));
        let err = parse_hostfile("node1 cpus=4").expect_err("bad line");
        assert!(err.contains("line 1"), "{err}");
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
