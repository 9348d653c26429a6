//! Reading the ranks' flight records together (`kolo diagnose`): which collective the job stopped
//! in, who never entered it and who waited, calls the ranks disagree on, records that are missing,
//! and which ranks arrive last at the collectives they all completed (stragglers).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::record::thousands;
use super::{FlightDump, GroupRecord, OpRecord};

/// How late the ranks arrive at collectives that every rank entered.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stragglers {
    /// Collectives counted.
    pub collectives: usize,
    /// Arrival skew (last arrival − first), seconds: the median.
    pub skew_p50_s: f64,
    /// Arrival skew, seconds: the 99th percentile.
    pub skew_p99_s: f64,
    /// Per rank, most often last first.
    pub ranks: Vec<Lateness>,
}

/// One rank's lateness.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Lateness {
    /// The rank (in the communicator).
    pub rank: usize,
    /// How many of the collectives this rank entered last.
    pub last: usize,
    /// `last` as a share of the collectives counted.
    pub share: f64,
    /// Median of how long after the first rank it arrived (all collectives), seconds.
    pub behind_p50_s: f64,
    /// 99th percentile of the same, seconds.
    pub behind_p99_s: f64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Stragglers from arrival times: `arrivals[k][r]` is when rank `r` entered collective `k` (any
/// clock the ranks share). Ties go to the lower rank.
pub fn stragglers(arrivals: &[Vec<f64>]) -> Stragglers {
    let n = arrivals.iter().map(Vec::len).max().unwrap_or(0);
    let rows: Vec<&Vec<f64>> = arrivals.iter().filter(|a| a.len() == n && n > 1).collect();
    let mut last = vec![0usize; n];
    let mut behind: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut skews = Vec::with_capacity(rows.len());
    for a in &rows {
        let first = a.iter().copied().fold(f64::INFINITY, f64::min);
        let mut late = 0;
        for (r, &t) in a.iter().enumerate() {
            if t > a[late] {
                late = r;
            }
            behind[r].push(t - first);
        }
        last[late] += 1;
        skews.push(a[late] - first);
    }
    let sort = |v: &mut Vec<f64>| v.sort_by(f64::total_cmp);
    sort(&mut skews);
    let mut ranks: Vec<Lateness> = (0..n)
        .map(|r| {
            sort(&mut behind[r]);
            Lateness {
                rank: r,
                last: last[r],
                share: last[r] as f64 / rows.len().max(1) as f64,
                behind_p50_s: percentile(&behind[r], 0.5),
                behind_p99_s: percentile(&behind[r], 0.99),
            }
        })
        .collect();
    ranks.sort_by(|a, b| b.last.cmp(&a.last).then(a.rank.cmp(&b.rank)));
    Stragglers {
        collectives: rows.len(),
        skew_p50_s: percentile(&skews, 0.5),
        skew_p99_s: percentile(&skews, 0.99),
        ranks,
    }
}

/// `0-2, 5`.
fn ranges(ranks: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if j > i + 1 {
            format!("{}–{}", ranks[i], ranks[j])
        } else if j == i + 1 {
            format!("{}, {}", ranks[i], ranks[j])
        } else {
            ranks[i].to_string()
        });
        i = j + 1;
    }
    out.join(", ")
}

fn plural(ranks: &[usize]) -> String {
    match ranks {
        [r] => format!("rank {r}"),
        _ => format!("ranks {}", ranges(ranks)),
    }
}

/// Where rank `m` made call `o`: the program's own frame for a Python program (the Rust location
/// of a call from Python is the binding's), else the call's source line.
fn at_in(m: &Member, o: &OpRecord) -> String {
    let binding = o
        .location
        .as_deref()
        .is_some_and(|l| l.contains("kolo-py/src/"));
    match (binding, m.dump.python_stack.as_deref().and_then(user_frame)) {
        (true, Some(f)) => format!(" at {f}"),
        _ => at(o),
    }
}

/// Where a finished call was made; nothing for a call from Python (the Rust location is the
/// binding's, and Python's stack is of now).
fn at_done(o: &OpRecord) -> String {
    if o.location
        .as_deref()
        .is_some_and(|l| l.contains("kolo-py/src/"))
    {
        String::new()
    } else {
        at(o)
    }
}

fn at(o: &OpRecord) -> String {
    o.location
        .as_deref()
        .map_or(String::new(), |l| format!(" at {}", short(l)))
}

/// A source path without the build machine's prefix (`…/src/main.rs:3:5` → `src/main.rs:3:5`).
fn short(loc: &str) -> &str {
    match loc.rfind("/src/") {
        Some(i) => match loc[..i].rfind('/') {
            Some(j) => &loc[j + 1..],
            None => loc,
        },
        None => loc,
    }
}

fn secs(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.1} s")
    } else {
        format!("{:.2} ms", s * 1e3)
    }
}

/// What one rank shows of one group.
struct Member<'a> {
    dump: &'a FlightDump,
    group: &'a GroupRecord,
}

impl Member<'_> {
    fn last_completed(&self) -> Option<&OpRecord> {
        self.group
            .collectives
            .iter()
            .rev()
            .find(|o| o.state == "completed")
    }

    fn get(&self, id: u64) -> Option<&OpRecord> {
        self.group.collectives.iter().find(|o| o.id == id)
    }

    /// The operation this rank was last seen calling (collective or point-to-point).
    fn last_call(&self) -> Option<&OpRecord> {
        let c = self.group.collectives.last();
        let p = self.group.p2p.last();
        match (c, p) {
            // A collective without a start time (not timed) counts as the later one.
            (Some(c), Some(p)) if c.started.is_some() && p.started > c.started => Some(p),
            (Some(c), _) => Some(c),
            (None, p) => p,
        }
    }
}

/// Two failures that differ only in the rank that saw them (`on rank 0` / `on rank 1`).
fn same_error(a: &str, b: &str) -> bool {
    let strip = |s: &str| {
        let mut out = String::with_capacity(s.len());
        let mut rest = s;
        while let Some(i) = rest.find("on rank ") {
            out.push_str(&rest[..i + 8]);
            rest = rest[i + 8..].trim_start_matches(|c: char| c.is_ascii_digit());
        }
        out.push_str(rest);
        out
    };
    strip(a) == strip(b)
}

fn same_call(a: &OpRecord, b: &OpRecord) -> bool {
    (&a.op, &a.dtype, a.count, &a.reduce, a.root) == (&b.op, &b.dtype, b.count, &b.reduce, b.root)
}

/// The one-screen report of what the records say.
pub fn diagnose(dumps: &[FlightDump]) -> String {
    let mut out = String::new();
    let size = dumps.iter().map(|d| d.size).max().unwrap_or(0);
    let mut by_rank: BTreeMap<usize, &FlightDump> = BTreeMap::new();
    for d in dumps {
        by_rank.entry(d.rank).or_insert(d);
    }
    let missing: Vec<usize> = (0..size).filter(|r| !by_rank.contains_key(r)).collect();
    let _ = writeln!(
        out,
        "{} of {size} ranks left a flight record.",
        by_rank.len()
    );
    // A rank the others saw close its communicator finished (returned, exited) before they failed.
    let closed = |r: usize| {
        let words = format!("rank {r} has closed its communicator");
        by_rank.values().any(|d| d.reason.contains(&words))
    };
    let (finished, lost): (Vec<usize>, Vec<usize>) = missing.iter().partition(|&&r| closed(r));
    if !finished.is_empty() {
        let _ = writeln!(
            out,
            "No record from {}: it closed its communicator (returned or exited) while the others still called it, and left none.",
            plural(&finished)
        );
    }
    if !lost.is_empty() {
        let _ = writeln!(
            out,
            "No record from {}: the process died before writing it (killed, crashed) or its host is unreachable.",
            plural(&lost)
        );
    }
    let who: Vec<String> = by_rank
        .values()
        .map(|d| format!("rank {} {} pid {}", d.rank, d.host, d.pid))
        .collect();
    let _ = writeln!(out, "({})", who.join("; "));
    // Groups by world and id, in the order of the lowest rank's record.
    let mut groups: Vec<GroupKey> = Vec::new();
    for d in by_rank.values() {
        for g in &d.groups {
            let k = GroupKey::of(g);
            if !groups.contains(&k) {
                groups.push(k);
            }
        }
    }
    for (i, k) in groups.iter().enumerate() {
        group_report(&mut out, k, i == 0, &by_rank);
    }
    let Some(first) = groups.first() else {
        return out;
    };
    let s = stragglers_of(dumps, first);
    if s.collectives > 0 {
        let _ = writeln!(out, "\n{}", straggler_text(&s));
    }
    out
}

/// Which communicator a group record belongs to: its world's job and its group id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupKey {
    /// The job of the world ([`GroupRecord::world`]).
    pub world: String,
    /// The group id ([`GroupRecord::group`]).
    pub group: String,
}

impl GroupKey {
    /// The key of `g`.
    pub fn of(g: &GroupRecord) -> GroupKey {
        GroupKey {
            world: g.world.clone(),
            group: g.group.clone(),
        }
    }

    fn matches(&self, g: &GroupRecord) -> bool {
        g.world == self.world && g.group == self.group
    }
}

/// The report of the group `key` (`first`: the first world's world communicator).
fn group_report(
    out: &mut String,
    key: &GroupKey,
    first: bool,
    by_rank: &BTreeMap<usize, &FlightDump>,
) {
    let mut members: Vec<(usize, Member)> = Vec::new();
    let mut size = 0;
    for d in by_rank.values() {
        if let Some(g) = d.groups.iter().find(|g| key.matches(g)) {
            size = size.max(g.size);
            members.push((g.rank, Member { dump: d, group: g }));
        }
    }
    let name = match (first, key.world.is_empty()) {
        (true, _) => "world".to_string(),
        (false, true) => format!("group {}", key.group),
        (false, false) => format!("group {} of job {}", key.group, key.world),
    };
    let _ = writeln!(out, "\n{name} ({size} ranks):");
    // The first collective some rank has not completed.
    let done = |m: &Member| m.last_completed().map_or(0, |o| o.id + 1);
    let Some(k) = members.iter().map(|(_, m)| done(m)).min() else {
        return;
    };
    let pending: Vec<&(usize, Member)> = members
        .iter()
        .filter(|(_, m)| m.group.collectives.iter().any(|o| o.id >= k))
        .collect();
    if pending.is_empty() {
        let _ = writeln!(
            out,
            "  every rank completed its last collective (#{})",
            k.saturating_sub(1)
        );
    } else {
        let entered: Vec<(usize, &Member, &OpRecord)> = members
            .iter()
            .filter_map(|(r, m)| m.get(k).filter(|o| o.op != "?").map(|o| (*r, m, o)))
            .collect();
        let first = entered.first().map(|e| e.2);
        let title = first.map_or_else(|| "?".to_string(), OpRecord::describe);
        let _ = writeln!(out, "  collective #{k}: {title}");
        // Ranks that called something else at #k.
        if let Some(first) = first {
            for (r, m, o) in &entered {
                if !same_call(first, o) {
                    let _ = writeln!(
                        out,
                        "  MISMATCH: rank {} called {}{}, rank {r} called {}{}",
                        entered[0].0,
                        first.describe(),
                        at_in(entered[0].1, first),
                        o.describe(),
                        at_in(m, o)
                    );
                }
            }
        }
        let waited: Vec<usize> = entered.iter().map(|e| e.0).collect();
        if !waited.is_empty() {
            // Not known where no rank timed it (a record written by hand, say).
            let longest = entered
                .iter()
                .filter_map(|(_, m, o)| {
                    let end = o.ended.unwrap_or(m.dump.dumped_at);
                    o.started.map(|s| end - s)
                })
                .reduce(f64::max)
                .map(|s| format!(", up to {}", secs(s)))
                .unwrap_or_default();
            let states: Vec<&str> = entered.iter().map(|e| e.2.state.as_str()).collect();
            let how = if states.iter().all(|s| *s == "failed") {
                "waited in it and failed"
            } else {
                "waited in it"
            };
            let _ = writeln!(
                out,
                "  {} {how}{longest}{}",
                plural(&waited),
                entered
                    .first()
                    .map(|(_, m, o)| at_in(m, o))
                    .unwrap_or_default()
            );
        }
        let absent: Vec<usize> = members
            .iter()
            .filter(|(_, m)| m.get(k).is_none_or(|o| o.op == "?"))
            .map(|(r, _)| *r)
            .collect();
        for (r, m) in members.iter().filter(|(r, _)| absent.contains(r)) {
            let last = m.last_completed().map_or_else(
                || "it completed none".to_string(),
                |o| {
                    format!(
                        "its last completed collective was #{} ({}){}",
                        o.id,
                        o.describe(),
                        at_done(o)
                    )
                },
            );
            let now = m
                .last_call()
                .filter(|o| o.state == "started" || o.state == "queued")
                .map(|o| format!("; it is in {} #{}{}", o.describe(), o.id, at_in(m, o)))
                .unwrap_or_default();
            let py = m
                .dump
                .python_stack
                .as_deref()
                .and_then(user_frame)
                .map(|f| format!("; its Python main thread is at {f}"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  rank {r} never entered collective #{k}: {last}{now}{py}"
            );
        }
    }
    let mut errors: Vec<(&str, Vec<usize>)> = Vec::new();
    for (r, m) in &members {
        for o in m.group.p2p.iter().filter(|o| o.state == "started") {
            let waited = o.started.map(|s| m.dump.dumped_at - s).unwrap_or(0.0);
            let _ = writeln!(
                out,
                "  rank {r} waits in {} for {}{}",
                o.describe(),
                secs(waited),
                at_in(m, o)
            );
        }
        if let Some(e) = &m.group.error {
            // The same failure on several ranks reads once (a rank's own number aside).
            match errors.iter_mut().find(|(k, _)| same_error(k, e)) {
                Some((_, ranks)) => ranks.push(*r),
                None => errors.push((e.as_str(), vec![*r])),
            }
        }
    }
    for (e, ranks) in errors {
        let _ = writeln!(out, "  {} failed: {e}", plural(&ranks));
    }
    let in_group: Vec<usize> = members.iter().map(|(r, _)| *r).collect();
    let lost: Vec<usize> = (0..size).filter(|r| !in_group.contains(r)).collect();
    if !lost.is_empty() {
        let _ = writeln!(
            out,
            "  no record of this group from {} (group ranks)",
            plural(&lost)
        );
    }
}

/// The Python main thread's frames (innermost first, `file:line in function`) of the last dump
/// in a file `faulthandler` wrote (one dump per `SIGUSR1`, appended; the main thread is listed
/// last).
pub fn python_main_stack(text: &str) -> Option<Vec<String>> {
    let mut dumps: Vec<Vec<(String, Vec<String>)>> = Vec::new();
    for line in text.lines() {
        let header = line
            .strip_prefix("Current thread ")
            .or_else(|| line.strip_prefix("Thread "))
            .and_then(|rest| rest.split_whitespace().next());
        if let Some(id) = header {
            let new_dump = dumps.last().is_none_or(|d| d.iter().any(|(t, _)| t == id));
            if new_dump {
                dumps.push(Vec::new());
            }
            if let Some(d) = dumps.last_mut() {
                d.push((id.to_string(), Vec::new()));
            }
        } else if let Some(frame) = line.trim_start().strip_prefix("File \"") {
            // `File "path", line N in func` → `path:N in func`.
            let f = frame.replacen("\", line ", ":", 1);
            if let Some((_, frames)) = dumps.last_mut().and_then(|d| d.last_mut()) {
                frames.push(f);
            }
        }
    }
    dumps.pop()?.pop().map(|(_, frames)| frames)
}

/// The innermost frame of the program itself: not kolo's, torch.distributed's or the standard
/// library's threading.
fn user_frame(frames: &[String]) -> Option<String> {
    let ours = |f: &&String| {
        f.contains("/kolo/_")
            || f.contains("/kolo/torch.py")
            || f.contains("/kolo/MPI.py")
            || f.contains("/torch/distributed/")
            || f.contains("/threading.py")
    };
    frames.iter().find(|f| !ours(f)).or(frames.first()).cloned()
}

/// Arrival times of the collectives of group `key` that every rank entered, from the records.
pub fn stragglers_of(dumps: &[FlightDump], key: &GroupKey) -> Stragglers {
    let mut per_rank: BTreeMap<usize, BTreeMap<u64, f64>> = BTreeMap::new();
    let mut size = 0;
    for d in dumps {
        if let Some(g) = d.groups.iter().find(|g| key.matches(g)) {
            size = size.max(g.size);
            let m = per_rank.entry(g.rank).or_default();
            for o in g.collectives.iter().filter(|o| !o.start_coarse) {
                if let Some(s) = o.started {
                    m.insert(o.id, s);
                }
            }
        }
    }
    if per_rank.len() != size || size < 2 {
        return Stragglers::default();
    }
    let Some(ids) = per_rank
        .values()
        .next()
        .map(|m| m.keys().copied().collect::<Vec<u64>>())
    else {
        return Stragglers::default();
    };
    let arrivals: Vec<Vec<f64>> = ids
        .iter()
        .filter_map(|id| per_rank.values().map(|m| m.get(id).copied()).collect())
        .collect();
    stragglers(&arrivals)
}

/// The straggler report in words.
pub fn straggler_text(s: &Stragglers) -> String {
    let mut out = format!(
        "Arrival at the {} collectives every rank entered: skew (last − first) p50 {}, p99 {}.",
        thousands(s.collectives as u64),
        secs(s.skew_p50_s),
        secs(s.skew_p99_s)
    );
    let n = s.ranks.len().max(1) as f64;
    for l in s.ranks.iter().filter(|l| l.last > 0).take(3) {
        let _ = write!(
            out,
            "\n  rank {} arrived last at {} ({:.0} %; even would be {:.0} %), behind the first by p50 {}, p99 {}",
            l.rank,
            thousands(l.last as u64),
            l.share * 100.0,
            100.0 / n,
            secs(l.behind_p50_s),
            secs(l.behind_p99_s)
        );
    }
    out
}
