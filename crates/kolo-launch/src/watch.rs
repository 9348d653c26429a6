//! While a round runs: this node's heartbeat in the store, and a watch on the other nodes'
//! heartbeats, on the round's failure key and on the store itself.
//!
//! Every launcher bumps `r{R}/alive/{node}` twice a second. A node whose counter stands still for
//! [`HEARTBEAT_TIMEOUT`] is taken as lost. The store is reached with calls bounded by
//! [`STORE_TIMEOUT`] (see [`connect`]), so a launcher cut off from the node hosting it (a network
//! partition: packets vanish, nothing is reset) learns within that time that it lost the store.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use kolo_store::{JobSecret, Store, StoreError, TcpStore};

use crate::rendezvous::{self, key, Round};
use crate::LaunchError;

/// A node whose heartbeat stands still this long is taken as lost (the workers' own heartbeat
/// timeout, `KOLO_HEARTBEAT_TIMEOUT`, is 6 s by default too).
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(6);
/// How long a launcher waits for the store to answer one call before it takes the store (and the
/// node hosting it) as lost: about the workers' own heartbeat timeout, so that a launcher cut off
/// from the store stops its workers about when they notice their lost peers.
pub const STORE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a launcher bumps its heartbeat.
const HEARTBEAT: Duration = Duration::from_millis(500);
/// How often the round's failure key is read between heartbeats.
const POLL: Duration = Duration::from_millis(100);

/// Connects to the store at `endpoint` (waiting up to `timeout` for it to come up), with every later
/// call bounded by [`STORE_TIMEOUT`].
pub fn connect(endpoint: &str, timeout: Duration, secret: &str) -> Result<TcpStore, LaunchError> {
    TcpStore::connect_with_secret(endpoint, timeout, JobSecret::new(secret.as_bytes()))
        .map(|store| store.with_io_timeout(STORE_TIMEOUT))
        .map_err(|source| LaunchError::RendezvousStore {
            what: format!("cannot reach the store at {endpoint}"),
            source,
        })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding it; recover from poison.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug, Default)]
struct State {
    /// Why the round must stop, once something says so.
    reason: Option<String>,
    /// Set when a call to the store failed: the store (or the way to it) is gone.
    store_lost: Option<String>,
    /// Per node: since when its heartbeat has stood still, while it does (`None` for this node,
    /// nodes that finished, and nodes whose heartbeat moves).
    still_since: Vec<Option<Instant>>,
}

/// A thread that keeps this node's heartbeat going during a round and watches the others: it sets
/// the stop reason when the round fails elsewhere, a node stops responding, or the store is lost.
#[derive(Debug)]
pub struct Watch {
    stop: Arc<AtomicBool>,
    state: Arc<Mutex<State>>,
    thread: Option<JoinHandle<()>>,
}

impl Watch {
    /// Starts watching `round` as its node `round.node_rank`. `store_at` names the store in
    /// messages (`10.0.0.1:29500 (node 0)`).
    pub fn start(store: Arc<dyn Store>, round: &Round, store_at: &str) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(Mutex::new(State {
            still_since: vec![None; round.nnodes],
            ..State::default()
        }));
        let thread = {
            let (stop, state) = (stop.clone(), state.clone());
            let (round, store_at) = (round.clone(), store_at.to_owned());
            thread::Builder::new()
                .name("kolo-launch-watch".into())
                .spawn(move || {
                    let stopped = watch(&*store, &round, &stop, &state);
                    let mut s = lock(&state);
                    match stopped {
                        Stopped::Asked => {}
                        Stopped::Because(why) => {
                            s.reason.get_or_insert(why);
                        }
                        Stopped::StoreLost(e) => {
                            let why = format!("lost the rendezvous store at {store_at}: {e}");
                            s.reason.get_or_insert_with(|| why.clone());
                            s.store_lost = Some(why);
                        }
                    }
                })
                .ok()
        };
        Watch {
            stop,
            state,
            thread,
        }
    }

    /// Why the round must stop, once something says so.
    pub fn reason(&self) -> Option<String> {
        lock(&self.state).reason.clone()
    }

    /// Whether (and how) the store was lost, so far.
    pub fn store_lost(&self) -> Option<String> {
        lock(&self.state).store_lost.clone()
    }

    /// Stops watching and says whether the store was lost (and how). Waits for the store call in
    /// progress, if any, which takes at most [`STORE_TIMEOUT`].
    pub fn finish(mut self) -> Option<String> {
        self.halt();
        lock(&self.state).store_lost.clone()
    }

    /// The other nodes whose heartbeat has stood still for at least `at_least`, with how long, in
    /// node order.
    pub fn silent_nodes(&self, at_least: Duration) -> Vec<(usize, Duration)> {
        lock(&self.state)
            .still_since
            .iter()
            .enumerate()
            .filter_map(|(node, since)| {
                let still = since.map(|t| t.elapsed())?;
                (still >= at_least).then_some((node, still))
            })
            .collect()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Why the watch ended.
enum Stopped {
    /// [`Watch`] was dropped or finished.
    Asked,
    /// The round must stop for this reason (a failure recorded in the store, a lost node).
    Because(String),
    /// A call to the store failed.
    StoreLost(StoreError),
}

/// The watch's loop: a heartbeat every [`HEARTBEAT`], the round's failure key every [`POLL`].
fn watch(store: &dyn Store, round: &Round, stop: &AtomicBool, state: &Mutex<State>) -> Stopped {
    let (number, me) = (round.number, round.node_rank);
    // Each node's last counter value and when it last moved.
    let mut last: Vec<(i64, Instant)> = vec![(-1, Instant::now()); round.nnodes];
    let mut next_beat = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        if Instant::now() >= next_beat {
            // After a slow call, beat again at once but do not try to catch up.
            next_beat = (next_beat + HEARTBEAT).max(Instant::now());
            if let Err(e) = store.add(&key(format!("r{number}/alive/{me}")), 1) {
                return Stopped::StoreLost(e);
            }
            for (node, seen) in last.iter_mut().enumerate() {
                if node == me {
                    continue;
                }
                let finished = match store.try_get(&key(format!("r{number}/finished/{node}"))) {
                    Ok(v) => v.is_some(),
                    Err(e) => return Stopped::StoreLost(e),
                };
                if finished {
                    lock(state).still_since[node] = None;
                    continue;
                }
                let v = match store.add(&key(format!("r{number}/alive/{node}")), 0) {
                    Ok(v) => v,
                    Err(e) => return Stopped::StoreLost(e),
                };
                if v != seen.0 {
                    *seen = (v, Instant::now());
                    lock(state).still_since[node] = None;
                    continue;
                }
                lock(state).still_since[node] = Some(seen.1);
                if seen.1.elapsed() >= HEARTBEAT_TIMEOUT {
                    let why = lost_node(round, node, seen.1.elapsed());
                    return Stopped::Because(rendezvous::fail(store, number, &why).unwrap_or(why));
                }
            }
        }
        match rendezvous::failure(store, number) {
            Ok(Some(why)) => return Stopped::Because(why),
            Ok(None) => {}
            Err(e) => return Stopped::StoreLost(e),
        }
        thread::sleep(POLL);
    }
    Stopped::Asked
}

/// What a launcher records when `node` stopped responding: `node 1 (host): stopped responding (no
/// heartbeat for 6.0 s)`.
pub fn lost_node(round: &Round, node: usize, silent: Duration) -> String {
    format!(
        "{}: stopped responding (no heartbeat for {:.1} s)",
        round.node_name(node),
        silent.as_secs_f64()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kolo_store::{MemoryStore, TcpStoreServer};
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    fn round(node_rank: usize, nnodes: usize) -> Round {
        Round {
            number: 0,
            node_rank,
            nnodes,
            job_id: "job".into(),
            hosts: (0..nnodes).map(|i| format!("h{i}")).collect(),
        }
    }

    /// Waits up to `timeout` for `watch` to give a reason to stop.
    fn reason_within(watch: &Watch, timeout: Duration) -> Option<String> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(why) = watch.reason() {
                return Some(why);
            }
            thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Copies bytes from `from` to `to` until either side closes; once `cut` is set, what arrives
    /// is dropped (a partition: nothing gets through, nothing is reset).
    fn pump(mut from: TcpStream, mut to: TcpStream, cut: Arc<AtomicBool>) {
        let mut buf = [0u8; 4096];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            if !cut.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    }

    /// A TCP proxy to `target` on a free port of 127.0.0.1, and the switch that cuts it.
    fn proxy(target: std::net::SocketAddr) -> (String, Arc<AtomicBool>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binds a proxy port");
        let addr = listener.local_addr().expect("proxy address").to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let switch = cut.clone();
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { break };
                let Ok(server) = TcpStream::connect(target) else {
                    break;
                };
                let (c2, s2) = match (client.try_clone(), server.try_clone()) {
                    (Ok(c), Ok(s)) => (c, s),
                    _ => break,
                };
                let (up, down) = (cut.clone(), cut.clone());
                thread::spawn(move || pump(client, server, up));
                thread::spawn(move || pump(s2, c2, down));
            }
        });
        (addr, switch)
    }

    #[test]
    fn a_store_that_falls_silent_is_lost_within_the_client_timeout() {
        let server = TcpStoreServer::bind_with_secret("127.0.0.1:0", JobSecret::new(b"s"))
            .expect("binds a store");
        let (addr, cut) = proxy(server.local_addr());
        let store: Arc<dyn Store> = Arc::new(
            TcpStore::connect_with_secret(&addr, Duration::from_secs(5), JobSecret::new(b"s"))
                .expect("connects through the proxy")
                .with_io_timeout(Duration::from_millis(400)),
        );
        let watch = Watch::start(store, &round(1, 2), &format!("{addr} (node 0)"));
        // Node 0 beats too (through the server directly), so only the store can be lost.
        let beat = TcpStore::connect_with_secret(
            &server.local_addr().to_string(),
            Duration::from_secs(5),
            JobSecret::new(b"s"),
        )
        .expect("connects");
        for _ in 0..6 {
            beat.add("kolo-launch/r0/alive/0", 1).expect("beats");
            thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(watch.reason(), None);
        cut.store(true, Ordering::SeqCst);
        let cut_at = Instant::now();
        let why = reason_within(&watch, Duration::from_secs(3)).expect("the store is lost");
        // One call's timeout, plus at most one poll interval before it.
        assert!(
            cut_at.elapsed() < Duration::from_millis(1200),
            "{:?}",
            cut_at.elapsed()
        );
        assert!(
            why.starts_with(&format!("lost the rendezvous store at {addr} (node 0): ")),
            "{why}"
        );
        assert_eq!(watch.finish(), Some(why));
    }

    #[test]
    fn silent_nodes_are_told_apart_from_beating_and_finished_ones() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        // Node 0 watches; node 1 beats; node 2 finished; node 3 is silent.
        let me = Watch::start(store.clone(), &round(0, 4), "x (node 0)");
        let beating = Watch::start(store.clone(), &round(1, 4), "x (node 0)");
        store
            .set("kolo-launch/r0/finished/2", b"1")
            .expect("sets in memory");
        // Beats come every 500 ms; a threshold of three beats keeps a busy machine's late beat
        // from looking like silence, while node 3 has said nothing for the whole 2.6 s.
        thread::sleep(Duration::from_millis(2600));
        let silent = me.silent_nodes(Duration::from_millis(1500));
        assert_eq!(
            silent.iter().map(|&(n, _)| n).collect::<Vec<_>>(),
            [3],
            "{silent:?}"
        );
        assert!(me.silent_nodes(Duration::from_secs(5)).is_empty());
        assert_eq!(me.reason(), None);
        assert_eq!(
            lost_node(&round(0, 4), 3, Duration::from_millis(6040)),
            "node 3 (h3): stopped responding (no heartbeat for 6.0 s)"
        );
        assert_eq!(beating.finish(), None);
        assert_eq!(me.finish(), None);
    }

    #[test]
    fn a_failure_recorded_elsewhere_stops_the_round() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let watch = Watch::start(store.clone(), &round(0, 2), "x (node 0)");
        rendezvous::fail(&*store, 0, "node 1 (h1): rank 3 failed");
        assert_eq!(
            reason_within(&watch, Duration::from_secs(2)).as_deref(),
            Some("node 1 (h1): rank 3 failed")
        );
        assert_eq!(watch.finish(), None);
    }
}
