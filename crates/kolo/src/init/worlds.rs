//! Several worlds in one process: each [`init`](super::init) of a process gets keys of its own in the
//! rendezvous store, and a rank that hosts the store hosts it once.
//!
//! The ranks of a job call `init` the same number of times (as they make the same collective calls),
//! so the `k`-th world of every rank (counted per rank: ranks may be threads of one process) meets
//! under the same store prefix, `kolo/<job>` for the first
//! and `kolo/<job>/world<k>` after it — and never reads what an earlier world left there (the name of
//! a shared-memory segment already removed, say).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};

use kolo_core::Result;
use kolo_store::TcpStoreServer;

static WORLDS: Mutex<Vec<(String, usize, u64)>> = Mutex::new(Vec::new());
static SERVERS: Mutex<Option<HashMap<u16, Weak<TcpStoreServer>>>> = Mutex::new(None);

/// The store prefix of rank `rank`'s next world of job `job_id` in this process.
pub(crate) fn next_prefix(job_id: &str, rank: usize) -> String {
    let mut worlds = WORLDS.lock().unwrap_or_else(|p| p.into_inner());
    let k = match worlds
        .iter_mut()
        .find(|(job, r, _)| job == job_id && *r == rank)
    {
        Some((_, _, k)) => {
            *k += 1;
            *k
        }
        None => {
            worlds.push((job_id.to_string(), rank, 0));
            0
        }
    };
    match k {
        0 => format!("kolo/{job_id}"),
        k => format!("kolo/{job_id}/world{k}"),
    }
}

/// The rendezvous server on `port`: the one this process already hosts there for a world still
/// alive, or a new one bound to `ip`.
pub(crate) fn host_store(ip: IpAddr, port: u16) -> Result<Arc<TcpStoreServer>> {
    let mut servers = SERVERS.lock().unwrap_or_else(|p| p.into_inner());
    let servers = servers.get_or_insert_with(HashMap::new);
    if let Some(live) = servers.get(&port).and_then(Weak::upgrade) {
        return Ok(live);
    }
    let server = Arc::new(TcpStoreServer::bind((ip, port))?);
    // Port 0 asks for any port: file the server under the one it got.
    servers.insert(server.local_addr().port(), Arc::downgrade(&server));
    servers.retain(|_, s| s.strong_count() > 0);
    Ok(server)
}
