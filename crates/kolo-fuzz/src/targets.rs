//! The targets: the first byte of an input picks a decoder (modulo the number of decoders), the
//! rest is what that decoder reads. Seeds carry the selector byte of their decoder.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kolo_data::fuzzing as data_fz;
use kolo_store::fuzzing as store_fz;
use kolo_transport::fuzzing as transport_fz;

/// Splits off the selector byte: `(decoder index, rest)`.
fn select(data: &[u8], decoders: u8) -> Option<(u8, &[u8])> {
    let (&first, rest) = data.split_first()?;
    Some((first % decoders, rest))
}

/// Prefixes each named input with the selector byte `selector`.
fn tagged(
    selector: u8,
    seeds: impl IntoIterator<Item = (&'static str, Vec<u8>)>,
) -> Vec<(String, Vec<u8>)> {
    seeds
        .into_iter()
        .map(|(name, data)| {
            let mut v = vec![selector];
            v.extend_from_slice(&data);
            (name.to_string(), v)
        })
        .collect()
}

/// Where the store target writes the store files it opens: one per process.
fn scratch_store() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("kolo-fuzz-{}.store", std::process::id()))
    })
}

/// `store`: 0 requests, 1 responses, 2 server hello, 3 client hello, 4 secret exchange (server),
/// 5 secret exchange (client), 6 store file, 7 c10d (PyTorch `TCPStore`) requests.
pub fn store(data: &[u8]) {
    let Some((which, rest)) = select(data, 8) else {
        return;
    };
    match which {
        0 => {
            store_fz::requests(rest);
        }
        1 => {
            store_fz::responses(rest);
        }
        2 => {
            store_fz::server_handshake(rest);
        }
        3 => {
            store_fz::client_handshake(rest);
        }
        4 => {
            store_fz::auth_server(rest);
        }
        5 => {
            store_fz::auth_client(rest);
        }
        6 => {
            store_fz::file_log(scratch_store(), rest);
        }
        _ => {
            store_fz::c10d_requests(rest);
        }
    }
}

/// Seeds of [`store`].
pub fn store_seeds(dir: &Path) -> Result<Vec<(String, Vec<u8>)>, String> {
    let seeds = store_fz::seeds(dir).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for (name, data) in seeds {
        let selectors: &[u8] = match name {
            "requests" => &[0],
            "responses" => &[1],
            "hello" => &[2, 3],
            "auth" => &[4, 5],
            "c10d" => &[7],
            _ => &[6],
        };
        for &s in selectors {
            let mut v = tagged(s, [(name, data.clone())]);
            if selectors.len() > 1 {
                v[0].0 = format!("{name}-{s}");
            }
            out.extend(v);
        }
    }
    Ok(out)
}

/// `transport`: 0 TCP hello, 1 TCP frames, 2 shared-memory prefix (then an 8-byte limit).
pub fn transport(data: &[u8]) {
    let Some((which, rest)) = select(data, 3) else {
        return;
    };
    match which {
        0 => {
            transport_fz::tcp_hello(rest);
        }
        1 => {
            transport_fz::tcp_frames(rest);
        }
        _ => {
            transport_fz::shm_prefix(rest);
        }
    }
}

/// Seeds of [`transport`].
pub fn transport_seeds(_: &Path) -> Result<Vec<(String, Vec<u8>)>, String> {
    Ok(transport_fz::seeds()
        .into_iter()
        .flat_map(|(name, data)| {
            let s = match name {
                "hello" => 0,
                "frames" => 1,
                _ => 2,
            };
            tagged(s, [(name, data)])
        })
        .collect())
}

/// `data`: 0 gzip, 1 idx pair, 2 CIFAR-10, 3 digits CSV.
pub fn data(data: &[u8]) {
    let Some((which, rest)) = select(data, 4) else {
        return;
    };
    match which {
        0 => data_fz::gzip(rest),
        1 => data_fz::idx(rest),
        2 => data_fz::cifar(rest),
        _ => data_fz::csv(rest),
    };
}

/// Seeds of [`data`]: every file also as a gzip seed.
pub fn data_seeds(_: &Path) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut out = Vec::new();
    for (name, data) in data_fz::seeds() {
        let s = match name {
            "idx" | "idx-gz" => 1,
            "cifar" | "cifar-gz" => 2,
            _ => 3,
        };
        if name.ends_with("-gz") && s != 1 {
            out.extend(
                tagged(0, [(name, data.clone())])
                    .into_iter()
                    .map(|(n, d)| (format!("gzip-{n}"), d)),
            );
        }
        out.extend(tagged(s, [(name, data)]));
    }
    Ok(out)
}

/// `checkpoint`: 0 `latest`, 1 safetensors, 2 `state.json`.
#[cfg(feature = "train")]
pub fn checkpoint(data: &[u8]) {
    use kolo_ddp::fuzzing as train_fz;
    let Some((which, rest)) = select(data, 3) else {
        return;
    };
    match which {
        0 => {
            train_fz::latest(rest);
        }
        1 => {
            train_fz::tensors(rest);
        }
        _ => {
            train_fz::state(rest);
        }
    }
}

/// Seeds of [`checkpoint`].
#[cfg(feature = "train")]
pub fn checkpoint_seeds(dir: &Path) -> Result<Vec<(String, Vec<u8>)>, String> {
    let seeds = kolo_ddp::fuzzing::seeds(dir).map_err(|e| e.to_string())?;
    Ok(seeds
        .into_iter()
        .flat_map(|(name, data)| {
            let s = match name {
                "latest" => 0,
                "safetensors" => 1,
                _ => 2,
            };
            tagged(s, [(name, data)])
        })
        .collect())
}
