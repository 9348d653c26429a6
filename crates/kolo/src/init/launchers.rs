//! What launchers leave in the environment beyond rank and size: torchrun's agent store and
//! restart count (`TORCHELASTIC_*`), SLURM's node list and job id.

use kolo_core::{Error, Result};

fn config_error(var: &str, value: &str, reason: impl Into<String>) -> Error {
    Error::Config {
        var: var.into(),
        value: value.into(),
        reason: reason.into(),
    }
}

/// What torchrun (torch's elastic agent) tells its workers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Torchelastic {
    /// The workers use the store the agent hosts at `MASTER_ADDR:MASTER_PORT`
    /// (`TORCHELASTIC_USE_AGENT_STORE=True`) instead of rank 0 hosting one.
    pub agent_store: bool,
    /// `TORCHELASTIC_RESTART_COUNT`: how many times the agent restarted the worker group.
    pub restart_count: Option<u64>,
    /// `TORCHELASTIC_RUN_ID`.
    pub run_id: Option<String>,
}

/// Reads torchrun's variables; `None` when none is set (not under torchrun).
pub(crate) fn torchelastic(get: &impl Fn(&str) -> Option<String>) -> Result<Option<Torchelastic>> {
    let agent = get("TORCHELASTIC_USE_AGENT_STORE");
    let restart = get("TORCHELASTIC_RESTART_COUNT");
    let run_id = get("TORCHELASTIC_RUN_ID");
    if agent.is_none() && restart.is_none() && run_id.is_none() {
        return Ok(None);
    }
    let agent_store = match agent.as_deref().map(str::trim) {
        None => false,
        Some("True" | "true" | "1") => true,
        Some("False" | "false" | "0") => false,
        Some(v) => {
            return Err(config_error(
                "TORCHELASTIC_USE_AGENT_STORE",
                v,
                "expected True or False (as torchrun sets it)",
            ))
        }
    };
    let restart_count = restart
        .map(|v| {
            v.trim().parse::<u64>().map_err(|_| {
                config_error(
                    "TORCHELASTIC_RESTART_COUNT",
                    &v,
                    "expected a non-negative integer",
                )
            })
        })
        .transpose()?;
    if let Some(id) = &run_id {
        if id.trim().is_empty() || id.contains('/') {
            return Err(config_error(
                "TORCHELASTIC_RUN_ID",
                id,
                "expected a non-empty id without '/'",
            ));
        }
    }
    Ok(Some(Torchelastic {
        agent_store,
        restart_count,
        run_id,
    }))
}

/// The variables that may hold the job's node list, in the order they are consulted.
pub(crate) const SLURM_NODELIST_VARS: [&str; 3] = [
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
];

/// The first host of a SLURM host list, as `scontrol show hostnames` would print it first:
/// `node[01-04,07]` → `node01`, `gpu[3-4]-ib,cpu1` → `gpu3-ib`. The whole list is checked (balanced
/// brackets, numeric ranges with start ≤ end, no empty entries), so a malformed list is an error
/// even where the first host could be read.
pub fn first_slurm_host(list: &str) -> std::result::Result<String, String> {
    let list = list.trim();
    if list.is_empty() {
        return Err("the node list is empty".into());
    }
    let mut first: Option<String> = None;
    for entry in split_top_level(list)? {
        let host = first_of_pattern(entry)?;
        first.get_or_insert(host);
    }
    first.ok_or_else(|| "the node list is empty".into())
}

/// Splits a host list at the commas outside brackets.
fn split_top_level(list: &str) -> std::result::Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(format!("nested '[' at byte {i}")),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(format!("unmatched ']' at byte {i}")),
            ',' if depth == 0 => {
                out.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unclosed '['".into());
    }
    out.push(&list[start..]);
    if let Some(pos) = out.iter().position(|e| e.trim().is_empty()) {
        return Err(format!("entry {} is empty", pos + 1));
    }
    Ok(out)
}

/// The first host a pattern such as `rack[1-2]-n[01-04,9]` expands to, checking every bracket.
fn first_of_pattern(pattern: &str) -> std::result::Result<String, String> {
    let mut host = String::new();
    let mut rest = pattern.trim();
    while let Some(open) = rest.find('[') {
        host.push_str(&rest[..open]);
        let close = rest[open..]
            .find(']')
            .map(|c| open + c)
            .ok_or_else(|| format!("unclosed '[' in {pattern:?}"))?;
        let ranges = &rest[open + 1..close];
        host.push_str(&first_of_ranges(ranges, pattern)?);
        rest = &rest[close + 1..];
    }
    host.push_str(rest);
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(format!("{pattern:?} is not a host name"));
    }
    Ok(host)
}

/// Checks `01-04,07` and returns its first number as written (`01`).
fn first_of_ranges(ranges: &str, pattern: &str) -> std::result::Result<String, String> {
    let mut first = None;
    for part in ranges.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let num = |s: &str| -> std::result::Result<u64, String> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.len() > 18 {
                return Err(format!(
                    "{part:?} in {pattern:?} is not a number or a range N-M"
                ));
            }
            s.parse::<u64>().map_err(|e| e.to_string())
        };
        if num(lo)? > num(hi)? {
            return Err(format!("the range {part:?} in {pattern:?} runs backwards"));
        }
        first.get_or_insert_with(|| lo.to_string());
    }
    first.ok_or_else(|| format!("empty brackets in {pattern:?}"))
}

/// The rendezvous port of a SLURM job without `MASTER_PORT`: 10000 plus the job id's last four
/// digits (`SLURM_JOB_ID` 1234567 → 14567), the formula torch users put in their batch scripts.
/// Every task of a job derives the same port; jobs sharing a first node differ unless their ids
/// agree in their last four digits.
pub fn slurm_port(job_id: &str) -> std::result::Result<u16, String> {
    let id: u64 = job_id
        .trim()
        .parse()
        .map_err(|_| "expected a numeric job id".to_string())?;
    // 10000 + (id % 10000) <= 19999.
    Ok(10_000 + (id % 10_000) as u16)
}

/// The rendezvous host and port under SLURM without `MASTER_ADDR`/`MASTER_PORT`: the first host of
/// the step's node list and [`slurm_port`] of the job id. `master_addr` and `master_port` are used
/// where set.
pub(crate) fn slurm_rendezvous(
    get: &impl Fn(&str) -> Option<String>,
    master_addr: Option<String>,
    master_port: Option<u16>,
) -> Result<(String, u16)> {
    let host = match master_addr {
        Some(h) => h,
        None => {
            let (var, list) = SLURM_NODELIST_VARS
                .iter()
                .find_map(|v| get(v).map(|l| (*v, l)))
                .ok_or_else(|| {
                    config_error(
                        "SLURM_STEP_NODELIST",
                        "",
                        "not set (nor SLURM_JOB_NODELIST, SLURM_NODELIST): set MASTER_ADDR to \
                         the host of rank 0",
                    )
                })?;
            first_slurm_host(&list).map_err(|reason| config_error(var, &list, reason))?
        }
    };
    let port = match master_port {
        Some(p) => p,
        None => {
            let id = get("SLURM_JOB_ID").ok_or_else(|| {
                config_error(
                    "SLURM_JOB_ID",
                    "",
                    "not set: set MASTER_PORT for the rendezvous",
                )
            })?;
            slurm_port(&id).map_err(|reason| config_error("SLURM_JOB_ID", &id, reason))?
        }
    };
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_hosts_of_slurm_lists() {
        let ok = |l: &str| first_slurm_host(l).unwrap_or_else(|e| format!("error: {e}"));
        assert_eq!(ok("node[01-04,07]"), "node01");
        assert_eq!(ok("node07"), "node07");
        assert_eq!(ok("a1,b[2-3]"), "a1");
        assert_eq!(ok("node[7,01-04]"), "node7");
        assert_eq!(ok("rack[2-3]-n[009-010]"), "rack2-n009");
        assert_eq!(ok("gpu[3-4]-ib,cpu1"), "gpu3-ib");
        assert_eq!(ok("127.0.0.[1-2]"), "127.0.0.1");
        assert_eq!(ok(" host "), "host");
        for bad in [
            "",
            "node[01-04",
            "node01-04]",
            "node[]",
            "node[4-1]",
            "node[a-b]",
            "a,,b",
            "a,",
            "n[1-2],m[x]",
            "n[[1]]",
            "node[1 -2]",
        ] {
            assert!(first_slurm_host(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn ports_from_job_ids() {
        assert_eq!(slurm_port("1234567"), Ok(14567));
        assert_eq!(slurm_port("42"), Ok(10042));
        assert_eq!(slurm_port("9999"), Ok(19999));
        assert!(slurm_port("12_3").is_err());
        assert!(slurm_port("").is_err());
    }

    #[test]
    fn torchelastic_variables() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(torchelastic(&env(&[])).ok(), Some(None));
        let t = torchelastic(&env(&[
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("TORCHELASTIC_RESTART_COUNT", "2"),
            ("TORCHELASTIC_RUN_ID", "job7"),
        ]));
        assert_eq!(
            t.ok().flatten(),
            Some(Torchelastic {
                agent_store: true,
                restart_count: Some(2),
                run_id: Some("job7".into()),
            })
        );
        let var_of = |r: Result<Option<Torchelastic>>| match r {
            Err(Error::Config { var, .. }) => var,
            other => format!("{other:?}"),
        };
        assert_eq!(
            var_of(torchelastic(&env(&[(
                "TORCHELASTIC_USE_AGENT_STORE",
                "yes"
            )]))),
            "TORCHELASTIC_USE_AGENT_STORE"
        );
        assert_eq!(
            var_of(torchelastic(&env(&[("TORCHELASTIC_RESTART_COUNT", "-1")]))),
            "TORCHELASTIC_RESTART_COUNT"
        );
        assert_eq!(
            var_of(torchelastic(&env(&[("TORCHELASTIC_RUN_ID", "a/b")]))),
            "TORCHELASTIC_RUN_ID"
        );
    }
}
