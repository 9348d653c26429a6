//! The membership agreement of a fault-tolerant world, over the rendezvous store (which outlives
//! the workers: `kolo run`'s launcher hosts it).
//!
//! Every process (every incarnation of a worker) takes a member number `n` and keeps a heartbeat
//! counter moving. A generation is one agreed list of members; generation `k` is formed when every
//! process still alive asks to be in it, or, after a settling time, when a majority of generation
//! `k - 1` has asked (so that a half cut off from the others cannot go on alone). The first process
//! to see the generation ready writes its list once (compare-and-set); every asker reads the same
//! list. Keys, under `kolo/<job>/ft`:
//!
//! | key | what |
//! |---|---|
//! | `next` | counter: the last member number given out |
//! | `slot/<n>` | member `n`'s launch rank (orders the first generation and joiners) |
//! | `beat/<n>` | member `n`'s heartbeat counter |
//! | `proc/<n>` | member `n`'s process, `NODE_RANK:pid` |
//! | `exited/<node>:<pid>` | that process exited (its launcher says so: `kolo run`) |
//! | `gone/<n>` | member `n` left, exited, or its heartbeat stood still for `dead_after` |
//! | `g<k>/join/<n>` | member `n` asks to be in generation `k` |
//! | `g<k>/asked` | counter: how many asked to be in generation `k` (a joiner's signal) |
//! | `g<k>/members` | generation `k`'s members in rank order, `n,n,n` (written once) |
//! | `latest` | the highest generation agreed |

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kolo_core::{Error, Result};
use kolo_store::{CompareSet, Store};

/// How often a process bumps its heartbeat counter.
pub(crate) const BEAT: Duration = Duration::from_millis(250);

/// How often an asker looks at the store while a generation forms.
const POLL: Duration = Duration::from_millis(20);

/// The store keys of one fault-tolerant job.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(job: &str) -> Keys {
        Keys {
            prefix: format!("kolo/{job}/ft"),
        }
    }

    fn key(&self, rest: std::fmt::Arguments<'_>) -> String {
        format!("{}/{rest}", self.prefix)
    }
}

/// When a generation may form, and how long to wait for it.
#[derive(Clone, Debug)]
pub(crate) struct Rules {
    /// Size of generation 0 (the launch).
    pub first_size: usize,
    /// The fewest members a generation may have.
    pub min_size: usize,
    /// A heartbeat standing still this long means its process is dead.
    pub dead_after: Duration,
    /// After this, a generation forms without the live processes that have not asked, if a
    /// majority of the previous generation has.
    pub settle: Duration,
    /// The longest an asker waits for its generation.
    pub timeout: Duration,
}

/// An agreed generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Agreed {
    pub generation: u64,
    /// Member numbers in rank order.
    pub members: Vec<u64>,
}

fn store_err(generation: u64, what: &str, e: impl std::fmt::Display) -> Error {
    Error::Membership {
        generation,
        reason: format!(
            "the rendezvous store failed ({what}): {e}; a worker cut off from the store cannot \
             go on"
        ),
    }
}

/// Gives this process its member number and records its launch rank and `process` (`NODE_RANK:pid`,
/// the name under which a launcher reports its exit).
pub(crate) fn register(store: &dyn Store, keys: &Keys, slot: usize, process: &str) -> Result<u64> {
    let n = store
        .add(&keys.key(format_args!("next")), 1)
        .map_err(|e| store_err(0, "register", e))?;
    let n = u64::try_from(n).unwrap_or(0);
    store
        .set(
            &keys.key(format_args!("slot/{n}")),
            slot.to_string().as_bytes(),
        )
        .map_err(|e| store_err(0, "register", e))?;
    store
        .set(&keys.key(format_args!("proc/{n}")), process.as_bytes())
        .map_err(|e| store_err(0, "register", e))?;
    Ok(n)
}

/// The highest generation agreed so far (`None` before the first).
pub(crate) fn latest(store: &dyn Store, keys: &Keys) -> Result<Option<u64>> {
    let v = store
        .try_get(&keys.key(format_args!("latest")))
        .map_err(|e| store_err(0, "latest generation", e))?;
    Ok(v.and_then(|b| String::from_utf8_lossy(&b).trim().parse().ok()))
}

/// The members of agreed generation `k`, if it is agreed.
pub(crate) fn members(store: &dyn Store, keys: &Keys, k: u64) -> Result<Option<Vec<u64>>> {
    let v = store
        .try_get(&keys.key(format_args!("g{k}/members")))
        .map_err(|e| store_err(k, "members", e))?;
    Ok(v.map(|b| parse_list(&b)))
}

/// How many processes asked to be in generation `k` (non-zero: a reconfiguration is wanted).
pub(crate) fn asked(store: &dyn Store, keys: &Keys, k: u64) -> Result<i64> {
    store
        .add(&keys.key(format_args!("g{k}/asked")), 0)
        .map_err(|e| store_err(k, "join requests", e))
}

fn parse_list(b: &[u8]) -> Vec<u64> {
    String::from_utf8_lossy(b)
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

/// Marks member `n` as gone (it left, or its heartbeat stopped).
pub(crate) fn mark_gone(store: &dyn Store, keys: &Keys, n: u64) {
    let _ = store.set(&keys.key(format_args!("gone/{n}")), b"1");
}

/// Asks for member `me` to be in generation `k` (whose predecessor had `previous`) and waits until
/// generation `k` is agreed; returns it (`me` may not be in it: it asked too late).
pub(crate) fn agree(
    store: &dyn Store,
    keys: &Keys,
    me: u64,
    k: u64,
    previous: &[u64],
    rules: &Rules,
) -> Result<Agreed> {
    let err = |what: &str, e: kolo_store::StoreError| store_err(k, what, e);
    store
        .set(&keys.key(format_args!("g{k}/join/{me}")), b"1")
        .map_err(|e| err("asking to join", e))?;
    store
        .add(&keys.key(format_args!("g{k}/asked")), 1)
        .map_err(|e| err("asking to join", e))?;
    let start = Instant::now();
    let mut beats: HashMap<u64, (i64, Instant)> = HashMap::new();
    let mut gone: Vec<u64> = Vec::new();
    loop {
        if let Some(members) = members(store, keys, k)? {
            return Ok(Agreed {
                generation: k,
                members,
            });
        }
        let total = store
            .add(&keys.key(format_args!("next")), 0)
            .map_err(|e| err("members", e))?;
        let mut joined = Vec::new();
        let mut waiting = Vec::new();
        for c in 1..=u64::try_from(total).unwrap_or(0) {
            if gone.contains(&c) {
                continue;
            }
            let asked = store
                .try_get(&keys.key(format_args!("g{k}/join/{c}")))
                .map_err(|e| err("join requests", e))?;
            if asked.is_some() {
                joined.push(c);
                continue;
            }
            let left = store
                .try_get(&keys.key(format_args!("gone/{c}")))
                .map_err(|e| err("departures", e))?;
            // Its launcher saw its process exit.
            let exited = match store
                .try_get(&keys.key(format_args!("proc/{c}")))
                .map_err(|e| err("departures", e))?
            {
                Some(p) => store
                    .try_get(&keys.key(format_args!("exited/{}", String::from_utf8_lossy(&p))))
                    .map_err(|e| err("departures", e))?
                    .is_some(),
                None => false,
            };
            if left.is_some() || exited {
                if exited {
                    mark_gone(store, keys, c);
                }
                gone.push(c);
                continue;
            }
            let beat = store
                .add(&keys.key(format_args!("beat/{c}")), 0)
                .map_err(|e| err("heartbeats", e))?;
            match beats.get(&c) {
                Some(&(b, since)) if b == beat => {
                    if since.elapsed() >= rules.dead_after {
                        mark_gone(store, keys, c);
                        gone.push(c);
                        continue;
                    }
                }
                _ => {
                    beats.insert(c, (beat, Instant::now()));
                }
            }
            waiting.push(c);
        }
        let from_previous = previous.iter().filter(|p| joined.contains(p)).count();
        if k > 0 && !previous.is_empty() && previous.iter().all(|p| gone.contains(p)) {
            return Err(Error::JobOver { generation: k - 1 });
        }
        let majority = 2 * from_previous > previous.len();
        let ready = if k == 0 {
            joined.len() >= rules.first_size
        } else {
            !joined.is_empty()
                && (waiting.is_empty() || (start.elapsed() >= rules.settle && majority))
                && (from_previous > 0 || previous.is_empty())
        };
        if ready {
            let list = order(store, keys, &joined, previous)?;
            let text = list
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(",");
            let key = keys.key(format_args!("g{k}/members"));
            let agreed = match store
                .compare_set(&key, None, text.as_bytes())
                .map_err(|e| err("agreeing", e))?
            {
                CompareSet::Swapped => {
                    raise_latest(store, keys, k)?;
                    list
                }
                CompareSet::Mismatch { current } => parse_list(&current.unwrap_or_default()),
            };
            return Ok(Agreed {
                generation: k,
                members: agreed,
            });
        }
        if start.elapsed() >= rules.timeout {
            return Err(Error::Membership {
                generation: k,
                reason: format!(
                    "no agreement within {:?}: {} of the {} members of the previous generation \
                     asked to go on (a majority is needed once live workers stop answering); still \
                     waiting for members {waiting:?}",
                    rules.timeout,
                    from_previous,
                    previous.len()
                ),
            });
        }
        std::thread::sleep(POLL);
    }
}

/// Generation order: the previous generation's members keep their order, joiners follow by launch
/// rank (then member number).
fn order(store: &dyn Store, keys: &Keys, joined: &[u64], previous: &[u64]) -> Result<Vec<u64>> {
    let mut keyed = Vec::with_capacity(joined.len());
    for &n in joined {
        let key = match previous.iter().position(|&p| p == n) {
            Some(i) => (0, i as u64, n),
            None => {
                let slot = store
                    .try_get(&keys.key(format_args!("slot/{n}")))
                    .map_err(|e| store_err(0, "launch ranks", e))?
                    .and_then(|b| String::from_utf8_lossy(&b).trim().parse::<u64>().ok())
                    .unwrap_or(u64::MAX);
                (1, slot, n)
            }
        };
        keyed.push(key);
    }
    keyed.sort_unstable();
    Ok(keyed.into_iter().map(|(_, _, n)| n).collect())
}

/// Sets `latest` to `k` unless it is already higher.
fn raise_latest(store: &dyn Store, keys: &Keys, k: u64) -> Result<()> {
    let key = keys.key(format_args!("latest"));
    let mut current = store
        .try_get(&key)
        .map_err(|e| store_err(k, "latest generation", e))?;
    loop {
        let have: Option<u64> = current
            .as_deref()
            .and_then(|b| String::from_utf8_lossy(b).trim().parse().ok());
        if have.is_some_and(|h| h >= k) {
            return Ok(());
        }
        match store
            .compare_set(&key, current.as_deref(), k.to_string().as_bytes())
            .map_err(|e| store_err(k, "latest generation", e))?
        {
            CompareSet::Swapped => return Ok(()),
            CompareSet::Mismatch { current: c } => current = c,
        }
    }
}

/// A thread that keeps member `n`'s heartbeat counter moving; dropping it marks `n` gone.
pub(crate) struct Heartbeat {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    store: Arc<dyn Store>,
    keys: Keys,
    n: u64,
}

impl Heartbeat {
    pub(crate) fn start(store: Arc<dyn Store>, keys: Keys, n: u64) -> Heartbeat {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (store, stop) = (store.clone(), stop.clone());
            let key = keys.key(format_args!("beat/{n}"));
            std::thread::Builder::new()
                .name("kolo-ft-heartbeat".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        // A store that stopped answering shows as this process's death to the
                        // others, which is what it is to them.
                        let _ = store.add(&key, 1);
                        std::thread::sleep(BEAT);
                    }
                })
                .ok()
        };
        Heartbeat {
            stop,
            thread,
            store,
            keys,
            n,
        }
    }

    /// Stops the heartbeat without saying goodbye: to the others this process died (tests).
    pub(crate) fn stop_silently(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop_silently();
            mark_gone(&*self.store, &self.keys, self.n);
        }
    }
}
