//! How the launchers of a multi-node job agree, through the rendezvous store, on who takes part in
//! each run of the worker group (a *round*), and tell each other when a round has failed.
//!
//! Keys, under `kolo-launch/`:
//!
//! - `job`: the job id (the first launcher to arrive sets it);
//! - `r{R}/joined`: how many launchers have joined round R; `r{R}/node/{i}`: the i-th to join
//!   (`{node rank hint} {workers per node} {host name}`);
//! - `r{R}/closed`: the number of nodes round R runs with, decided once (all `MAX` nodes joined, or at
//!   least `MIN` and nobody new for [`SETTLE`]);
//! - `r{R}/failed`: the first failure anyone saw in round R (set once); `r{R}/alive/{node}`: a counter
//!   each launcher bumps twice a second (see [`crate::watch`]); `r{R}/finished/{node}` and
//!   `r{R}/done`: the launchers whose workers all succeeded.
//!
//! The node hosting the store keeps it until every node is done, so no worker loses the store early.

use std::thread;
use std::time::{Duration, Instant};

use kolo_store::{CompareSet, Store, StoreError};

use crate::LaunchError;

/// How long a round stays open for more nodes once `MIN` have joined (elastic jobs).
pub const SETTLE: Duration = Duration::from_secs(3);
const POLL: Duration = Duration::from_millis(50);

pub(crate) fn key(s: String) -> String {
    format!("kolo-launch/{s}")
}

fn store_err(what: &str) -> impl FnOnce(StoreError) -> LaunchError + '_ {
    move |source| LaunchError::RendezvousStore {
        what: what.to_string(),
        source,
    }
}

/// This node's place in one round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    /// Round number (0 first, then one per restart).
    pub number: usize,
    /// This node's rank among the round's nodes.
    pub node_rank: usize,
    /// Number of nodes in the round.
    pub nnodes: usize,
    /// The job id shared by every node.
    pub job_id: String,
    /// Each node's host name, by node rank.
    pub hosts: Vec<String>,
}

impl Round {
    /// `node N (host)`, naming node `node` of this round in messages.
    pub fn node_name(&self, node: usize) -> String {
        match self.hosts.get(node) {
            Some(host) if !host.is_empty() => format!("node {node} ({host})"),
            _ => format!("node {node}"),
        }
    }
}

/// The job id: the first launcher's `proposal` wins.
pub fn job_id(store: &dyn Store, proposal: &str) -> Result<String, LaunchError> {
    match store
        .compare_set(&key("job".into()), None, proposal.as_bytes())
        .map_err(store_err("agreeing on the job id"))?
    {
        CompareSet::Swapped => Ok(proposal.to_owned()),
        CompareSet::Mismatch { current } => Ok(String::from_utf8_lossy(
            current.as_deref().unwrap_or(proposal.as_bytes()),
        )
        .into_owned()),
    }
}

/// What this launcher brings to a round.
#[derive(Debug, Clone)]
pub struct Joining<'a> {
    /// `--node-rank`, if given (the rank in a fixed-size job; an ordering hint in an elastic one).
    pub hint: Option<usize>,
    /// Workers this node starts.
    pub nproc: usize,
    /// Minimum and maximum number of nodes.
    pub nnodes: (usize, usize),
    /// How long to wait for the round to fill.
    pub timeout: Duration,
    /// This host's name, for messages.
    pub host: &'a str,
}

/// Joins round `number` and waits until it is closed; returns this node's place in it.
pub fn join(
    store: &dyn Store,
    number: usize,
    job_id: &str,
    me: &Joining<'_>,
) -> Result<Round, LaunchError> {
    let (min, max) = me.nnodes;
    let r = |s: &str| key(format!("r{number}/{s}"));
    let idx = store
        .add(&r("joined"), 1)
        .map_err(store_err("joining the round"))? as usize
        - 1;
    let hint = me.hint.map_or("-".to_owned(), |h| h.to_string());
    store
        .set(
            &r(&format!("node/{idx}")),
            format!("{hint} {} {}", me.nproc, me.host).as_bytes(),
        )
        .map_err(store_err("joining the round"))?;
    let started = Instant::now();
    let mut seen = 0usize;
    let mut last_change = Instant::now();
    let closed = loop {
        if let Some(v) = store
            .try_get(&r("closed"))
            .map_err(store_err("waiting for the other nodes"))?
        {
            break String::from_utf8_lossy(&v)
                .trim()
                .parse::<usize>()
                .map_err(|_| LaunchError::Rendezvous {
                    reason: "the store holds a bad node count".into(),
                })?;
        }
        let count = store
            .add(&r("joined"), 0)
            .map_err(store_err("waiting for the other nodes"))? as usize;
        if count != seen {
            seen = count;
            last_change = Instant::now();
        }
        let decide = if count >= max {
            Some(max)
        } else if min < max && count >= min && last_change.elapsed() >= SETTLE {
            Some(count)
        } else {
            None
        };
        if let Some(n) = decide {
            // Whoever sees it first closes the round; everyone reads the same value back.
            let _ = store
                .compare_set(&r("closed"), None, n.to_string().as_bytes())
                .map_err(store_err("closing the round"))?;
            continue;
        }
        if started.elapsed() >= me.timeout {
            return Err(LaunchError::Rendezvous {
                reason: format!(
                    "only {count} of {} nodes joined within {:.0} s (round {number})",
                    if min == max {
                        max.to_string()
                    } else {
                        format!("at least {min}")
                    },
                    me.timeout.as_secs_f64()
                ),
            });
        }
        thread::sleep(POLL);
    };
    if idx >= closed {
        return Err(LaunchError::Rendezvous {
            reason: format!(
                "round {number} started with {closed} nodes before this one ({}) joined",
                me.host
            ),
        });
    }
    // Everyone's entry, to check the nodes agree and to rank them.
    let mut nodes = Vec::with_capacity(closed);
    for i in 0..closed {
        let v = store
            .get(&r(&format!("node/{i}")), me.timeout)
            .map_err(store_err("reading the round's nodes"))?;
        let text = String::from_utf8_lossy(&v).into_owned();
        let mut parts = text.splitn(3, ' ');
        let hint = parts.next().and_then(|h| h.parse::<usize>().ok());
        let nproc = parts.next().and_then(|n| n.parse::<usize>().ok());
        let host = parts.next().unwrap_or("?").to_owned();
        nodes.push((hint, nproc, host, i));
    }
    for (_, nproc, host, _) in &nodes {
        if *nproc != Some(me.nproc) {
            return Err(LaunchError::Rendezvous {
                reason: format!(
                    "node {host} starts {} workers, this node ({}) {}: every node must start the same number",
                    nproc.map_or("?".into(), |n| n.to_string()),
                    me.host,
                    me.nproc
                ),
            });
        }
    }
    let mut taken = vec![None; closed];
    if min == max {
        for (hint, _, host, _) in &nodes {
            if let Some(h) = hint {
                if *h >= closed {
                    return Err(LaunchError::Rendezvous {
                        reason: format!(
                            "node {host} has --node-rank {h}, but the job has {closed} nodes"
                        ),
                    });
                }
                if let Some(other) = &taken[*h] {
                    return Err(LaunchError::Rendezvous {
                        reason: format!("nodes {other} and {host} both have --node-rank {h}"),
                    });
                }
                taken[*h] = Some(host.clone());
            }
        }
    }
    // The rank of the i-th node to join.
    let rank_of = |i: usize| -> usize {
        if min == max {
            // Fixed size: the ranks given, or the order of arrival where none was given.
            match nodes[i].0 {
                Some(h) => h,
                None => {
                    // The free ranks, handed out in order of arrival.
                    let free: Vec<usize> = (0..closed).filter(|&k| taken[k].is_none()).collect();
                    let pos = nodes
                        .iter()
                        .filter(|(h, ..)| h.is_none())
                        .position(|(.., j)| *j == i)
                        .unwrap_or(0);
                    free.get(pos.min(free.len().saturating_sub(1)))
                        .copied()
                        .unwrap_or(0)
                }
            }
        } else {
            // Elastic: the survivors ranked by their hints, then by arrival.
            let mut order: Vec<(usize, usize)> = nodes
                .iter()
                .map(|(h, .., j)| (h.unwrap_or(usize::MAX), *j))
                .collect();
            order.sort_unstable();
            order.iter().position(|&(_, j)| j == i).unwrap_or(0)
        }
    };
    let node_rank = rank_of(idx);
    let mut hosts = vec![String::new(); closed];
    for (i, (_, _, host, _)) in nodes.iter().enumerate() {
        if let Some(slot) = hosts.get_mut(rank_of(i)) {
            slot.clone_from(host);
        }
    }
    Ok(Round {
        number,
        node_rank,
        nnodes: closed,
        job_id: job_id.to_owned(),
        hosts,
    })
}

/// Records the round's first failure (if none is recorded yet) and returns the one recorded.
pub fn fail(store: &dyn Store, round: usize, what: &str) -> Option<String> {
    let k = key(format!("r{round}/failed"));
    match store.compare_set(&k, None, what.as_bytes()) {
        Ok(CompareSet::Swapped) => Some(what.to_owned()),
        Ok(CompareSet::Mismatch { current }) => {
            current.map(|c| String::from_utf8_lossy(&c).into_owned())
        }
        Err(_) => None,
    }
}

/// The first failure recorded for `round`, if any.
pub fn failure(store: &dyn Store, round: usize) -> Result<Option<String>, StoreError> {
    Ok(store
        .try_get(&key(format!("r{round}/failed")))?
        .map(|v| String::from_utf8_lossy(&v).into_owned()))
}

/// Counts node `node` as done with round `round` (its workers all succeeded) and returns how many
/// are.
pub fn done(store: &dyn Store, round: usize, node: usize) -> Result<usize, StoreError> {
    store.set(&key(format!("r{round}/finished/{node}")), b"1")?;
    store
        .add(&key(format!("r{round}/done")), 1)
        .map(|n| n as usize)
}

/// Why [`wait_all_done`] stopped waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waited {
    /// Every node is done, or the round failed (someone else reports that).
    AllDone,
    /// These nodes (by node rank) neither finished nor bumped their heartbeat for
    /// `HEARTBEAT_TIMEOUT`: their launchers are gone.
    Silent(Vec<usize>),
    /// `stop` said so (a signal came).
    Stopped,
    /// `timeout` passed with nodes still running.
    TimedOut,
}

/// Waits until `nnodes` nodes are done with `round`, the round fails, every node not done has
/// stood still for `heartbeat_timeout` (its launcher died after this node's workers finished: no
/// point keeping the store for it), `stop()` is true, or `timeout` passes.
pub fn wait_all_done(
    store: &dyn Store,
    round: usize,
    nnodes: usize,
    timeout: Duration,
    heartbeat_timeout: Duration,
    stop: &dyn Fn() -> bool,
) -> Waited {
    let started = Instant::now();
    // Each node's last heartbeat value and when it last moved.
    let mut seen: Vec<(i64, Instant)> = vec![(i64::MIN, started); nnodes];
    loop {
        let n = store
            .add(&key(format!("r{round}/done")), 0)
            .unwrap_or(i64::MAX) as usize;
        let failed = failure(store, round).map_or(true, |f| f.is_some());
        if n >= nnodes || failed {
            return Waited::AllDone;
        }
        let mut silent = Vec::new();
        for (node, (last, since)) in seen.iter_mut().enumerate() {
            let finished = store
                .try_get(&key(format!("r{round}/finished/{node}")))
                .map_or(true, |v| v.is_some());
            if finished {
                continue;
            }
            let beat = store
                .add(&key(format!("r{round}/alive/{node}")), 0)
                .unwrap_or(i64::MIN);
            if beat != *last {
                (*last, *since) = (beat, Instant::now());
            } else if since.elapsed() >= heartbeat_timeout {
                silent.push(node);
                continue;
            }
            silent.clear();
            break;
        }
        if !silent.is_empty() {
            return Waited::Silent(silent);
        }
        if stop() {
            return Waited::Stopped;
        }
        if started.elapsed() >= timeout {
            return Waited::TimedOut;
        }
        thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_store::MemoryStore;
    use std::sync::Arc;

    fn joining(
        hint: Option<usize>,
        nproc: usize,
        nnodes: (usize, usize),
        host: &str,
    ) -> Joining<'_> {
        Joining {
            hint,
            nproc,
            nnodes,
            timeout: Duration::from_secs(10),
            host,
        }
    }

    /// Every node of `nodes` joins round 0 on its own thread.
    fn round(
        nodes: Vec<(Option<usize>, usize)>,
        nnodes: (usize, usize),
    ) -> Vec<Result<Round, String>> {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let handles: Vec<_> = nodes
            .into_iter()
            .enumerate()
            .map(|(i, (hint, nproc))| {
                let store = store.clone();
                thread::spawn(move || {
                    let host = format!("h{i}");
                    join(&*store, 0, "job", &joining(hint, nproc, nnodes, &host))
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("join thread"))
            .collect()
    }

    #[test]
    fn fixed_size_uses_the_given_node_ranks() {
        let got = round(vec![(Some(2), 4), (Some(0), 4), (Some(1), 4)], (3, 3));
        let ranks: Vec<usize> = got
            .iter()
            .map(|r| r.as_ref().expect("joined").node_rank)
            .collect();
        assert_eq!(ranks, vec![2, 0, 1]);
        assert!(got.iter().all(|r| r.as_ref().map(|r| r.nnodes) == Ok(3)));
        // Every node knows every node's host, by node rank.
        for r in &got {
            let r = r.as_ref().expect("joined");
            assert_eq!(r.hosts, ["h1", "h2", "h0"]);
            assert_eq!(r.node_name(2), "node 2 (h0)");
        }
    }

    #[test]
    fn nodes_without_a_rank_take_the_free_ones() {
        let got = round(vec![(None, 1), (Some(0), 1)], (2, 2));
        let ranks: Vec<usize> = got
            .iter()
            .map(|r| r.as_ref().expect("joined").node_rank)
            .collect();
        assert_eq!(ranks, vec![1, 0]);
        assert!(got
            .iter()
            .all(|r| r.as_ref().map(|r| r.hosts.clone()) == Ok(vec!["h1".into(), "h0".into()])));
    }

    #[test]
    fn duplicate_ranks_and_uneven_nodes_are_errors() {
        let got = round(vec![(Some(0), 2), (Some(0), 2)], (2, 2));
        assert!(
            got.iter()
                .all(|r| matches!(r, Err(e) if e.contains("both have --node-rank 0"))),
            "{got:?}"
        );
        let got = round(vec![(Some(0), 2), (Some(1), 3)], (2, 2));
        assert!(
            got.iter()
                .all(|r| matches!(r, Err(e) if e.contains("same number"))),
            "{got:?}"
        );
    }

    #[test]
    fn elastic_rounds_close_with_the_nodes_that_came() {
        // Two of at most three nodes: the round closes after the settle time, ranked by hint.
        let got = round(vec![(Some(5), 1), (Some(2), 1)], (1, 3));
        let ranks: Vec<usize> = got
            .iter()
            .map(|r| r.as_ref().expect("joined").node_rank)
            .collect();
        assert_eq!(ranks, vec![1, 0]);
        assert!(got.iter().all(|r| r.as_ref().map(|r| r.nnodes) == Ok(2)));
        assert!(got
            .iter()
            .all(|r| r.as_ref().map(|r| r.hosts.clone()) == Ok(vec!["h1".into(), "h0".into()])));
    }

    #[test]
    fn a_round_that_does_not_fill_times_out_naming_the_count() {
        let store = MemoryStore::new();
        let mut me = joining(Some(0), 1, (2, 2), "h0");
        me.timeout = Duration::from_millis(200);
        let err = join(&store, 0, "job", &me).expect_err("alone").to_string();
        assert!(err.contains("only 1 of 2 nodes joined"), "{err}");
    }

    #[test]
    fn the_first_failure_sticks() {
        let store = MemoryStore::new();
        assert_eq!(fail(&store, 0, "a").as_deref(), Some("a"));
        assert_eq!(fail(&store, 0, "b").as_deref(), Some("a"));
        assert_eq!(fail(&store, 1, "c").as_deref(), Some("c"));
        assert_eq!(job_id(&store, "x").expect("id"), "x");
        assert_eq!(job_id(&store, "y").expect("id"), "x");
    }

    const BEAT_TIMEOUT: Duration = Duration::from_millis(300);

    /// Node `node` of round 0 beats for four heartbeat timeouts on a thread of its own, then
    /// does `then`.
    fn beat(
        store: Arc<MemoryStore>,
        node: usize,
        then: impl FnOnce(&MemoryStore) + Send + 'static,
    ) -> thread::JoinHandle<()> {
        thread::spawn(move || {
            let until = Instant::now() + BEAT_TIMEOUT * 4;
            while Instant::now() < until {
                store
                    .add(&key(format!("r0/alive/{node}")), 1)
                    .expect("beat");
                thread::sleep(BEAT_TIMEOUT / 6);
            }
            then(&store);
        })
    }

    #[test]
    fn the_host_stops_waiting_for_a_node_whose_launcher_died() {
        // Node 0 (hosting) finished; node 1 beat once and went silent without finishing.
        let store = MemoryStore::new();
        done(&store, 0, 0).expect("done");
        store.add(&key("r0/alive/1".into()), 1).expect("beat");
        let started = Instant::now();
        let waited = wait_all_done(&store, 0, 2, Duration::from_secs(30), BEAT_TIMEOUT, &|| {
            false
        });
        assert_eq!(waited, Waited::Silent(vec![1]));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn the_host_keeps_waiting_for_a_node_that_beats_until_it_is_done() {
        let store = Arc::new(MemoryStore::new());
        done(&*store, 0, 0).expect("done");
        // Node 1 beats for four heartbeat timeouts, then says it is done.
        let beating = beat(store.clone(), 1, move |store| {
            done(store, 0, 1).expect("done");
        });
        let started = Instant::now();
        let waited = wait_all_done(
            &*store,
            0,
            2,
            Duration::from_secs(30),
            BEAT_TIMEOUT,
            &|| false,
        );
        beating.join().expect("beating thread");
        assert_eq!(waited, Waited::AllDone);
        assert!(
            started.elapsed() >= BEAT_TIMEOUT * 4,
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_signal_ends_the_wait_and_a_live_node_is_not_silent() {
        // Node 2 finished, node 1 silent, node 3 beating: not all silent, so only `stop` ends it.
        let store = Arc::new(MemoryStore::new());
        done(&*store, 0, 0).expect("done");
        done(&*store, 0, 2).expect("done");
        let asked = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let beating = {
            let asked = asked.clone();
            beat(store.clone(), 3, move |_| {
                asked.store(true, std::sync::atomic::Ordering::SeqCst)
            })
        };
        let stop = || asked.load(std::sync::atomic::Ordering::SeqCst);
        let waited = wait_all_done(&*store, 0, 4, Duration::from_secs(30), BEAT_TIMEOUT, &stop);
        beating.join().expect("beating thread");
        assert_eq!(waited, Waited::Stopped);
    }

    #[test]
    fn the_wait_times_out() {
        let store = MemoryStore::new();
        let waited = wait_all_done(
            &store,
            0,
            2,
            Duration::from_millis(200),
            Duration::from_secs(60),
            &|| false,
        );
        assert_eq!(waited, Waited::TimedOut);
    }
}
