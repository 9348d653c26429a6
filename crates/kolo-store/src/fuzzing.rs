//! Entry points for kolo's fuzz targets (the `kolo-fuzz` crate): the store's real decoders run on
//! untrusted bytes, and seed inputs made by its real encoders. Not a stable API.
//!
//! Each entry point returns whether the input was accepted and panics only on a broken invariant
//! (a decoded frame that does not survive re-encoding), which the fuzzer reports as a crash.

use std::borrow::Cow;
use std::io::{self, Read, Write};
use std::path::Path;
use std::time::Duration;

use crate::auth::{self, JobSecret};
use crate::wire::{self, Reply, Request, Response};
use crate::{FileStore, Store};

/// A stream whose reads come from a byte slice and whose writes are discarded.
#[derive(Debug)]
struct Replay<'a>(&'a [u8]);

impl Read for Replay<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Replay<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Decodes c10d (PyTorch `TCPStore`) requests as kolo's c10d server reads them, until the first
/// error or the end; every decoded request must encode and decode back to itself. Returns how many
/// were decoded.
pub fn c10d_requests(data: &[u8]) -> usize {
    crate::c10d::decode_requests(data)
}

/// Decodes request frames until the first error or the end; every decoded request must encode and
/// decode back to itself. Returns how many frames were decoded.
pub fn requests(mut data: &[u8]) -> usize {
    let mut n = 0;
    while let Ok(Some(req)) = wire::read_request(&mut data) {
        let mut out = Vec::new();
        if let Err(e) = wire::encode_request(&req, &mut out) {
            panic!("decoded request {req:?} does not encode: {e:?}");
        }
        match wire::read_request(&mut out.as_slice()) {
            Ok(Some(again)) => assert_eq!(again, req, "request changed in a round trip"),
            other => panic!("re-encoded request {req:?} does not decode: {other:?}"),
        }
        n += 1;
    }
    n
}

/// Decodes response frames until the first error; every decoded response must encode and decode
/// back to itself. Returns how many frames were decoded.
pub fn responses(mut data: &[u8]) -> usize {
    let mut n = 0;
    while let Ok(resp) = wire::read_response(&mut data) {
        let mut out = Vec::new();
        if let Err(e) = wire::encode_response(&resp, &mut out) {
            panic!("decoded response {resp:?} does not encode: {e:?}");
        }
        match wire::read_response(&mut out.as_slice()) {
            Ok(again) => assert_eq!(again, resp, "response changed in a round trip"),
            other => panic!("re-encoded response {resp:?} does not decode: {other:?}"),
        }
        n += 1;
    }
    n
}

/// The server's side of the protocol handshake reading `data` from a client.
pub fn server_handshake(data: &[u8]) -> bool {
    wire::server_handshake(&mut Replay(data)).is_ok()
}

/// The client's side of the protocol handshake reading `data` from a server.
pub fn client_handshake(data: &[u8]) -> bool {
    wire::client_handshake(&mut Replay(data)).is_ok()
}

/// The secret exchange's accepting side reading `data` from a client.
pub fn auth_server(data: &[u8]) -> bool {
    auth::server(&mut Replay(data), &JobSecret::new(*b"fuzz secret")).is_ok()
}

/// The secret exchange's connecting side reading `data` from a server.
pub fn auth_client(data: &[u8]) -> bool {
    auth::client(&mut Replay(data), &JobSecret::new(*b"fuzz secret")).is_ok()
}

/// Opens `data`, written to `path`, as a [`FileStore`] log (replaying every record) and counts its
/// keys. `None` when the store refuses the file.
pub fn file_log(path: &Path, data: &[u8]) -> Option<usize> {
    // A failure to write the scratch file is the harness's problem, not the decoder's.
    if let Err(e) = std::fs::write(path, data) {
        panic!(
            "cannot write the scratch store file {}: {e}",
            path.display()
        );
    }
    let store = FileStore::open(path).ok()?;
    let keys = store.num_keys().ok()?;
    // Every value the log replayed must be readable.
    let _ = store.try_get("k");
    Some(keys)
}

/// Valid inputs from the real encoders, by name: request and response frames, both handshakes'
/// hellos, and a store file with a few records (in `dir`).
pub fn seeds(dir: &Path) -> io::Result<Vec<(&'static str, Vec<u8>)>> {
    let key = |s: &'static str| Cow::Borrowed(s);
    let requests = [
        Request::Set {
            key: key("addr/0"),
            value: Cow::Borrowed(b"127.0.0.1:29500"),
        },
        Request::Get {
            key: key("k"),
            timeout_ms: 1000,
        },
        Request::TryGet { key: key("k") },
        Request::Wait {
            keys: vec![key("a"), key("b")],
            timeout_ms: 5,
        },
        Request::Add {
            key: key("n"),
            delta: -3,
        },
        Request::CompareSet {
            key: key("k"),
            expected: Some(Cow::Borrowed(b"old")),
            desired: Cow::Borrowed(b"new"),
        },
        Request::Delete { key: key("k") },
        Request::NumKeys,
    ];
    let mut all_requests = Vec::new();
    for r in &requests {
        wire::encode_request(r, &mut all_requests)
            .map_err(|e| io::Error::other(format!("{e:?}")))?;
    }
    let responses = [
        Response::Ok(Reply::Done),
        Response::Ok(Reply::Value(b"v".to_vec())),
        Response::Ok(Reply::MaybeValue(None)),
        Response::Ok(Reply::Counter(7)),
        Response::Ok(Reply::Mismatch(Some(b"x".to_vec()))),
        Response::Ok(Reply::Existed(true)),
        Response::Ok(Reply::Count(2)),
        Response::Err(wire::RemoteError::Timeout {
            keys: vec!["a".into()],
            waited_ms: 9,
        }),
        Response::Err(wire::RemoteError::CounterOverflow {
            key: "n".into(),
            current: i64::MAX,
            delta: 1,
        }),
        Response::Err(wire::RemoteError::TooLarge {
            what: "value".into(),
            len: 9,
            max: 8,
        }),
    ];
    let mut all_responses = Vec::new();
    for r in &responses {
        wire::encode_response(r, &mut all_responses)
            .map_err(|e| io::Error::other(format!("{e:?}")))?;
    }
    let mut hello = Vec::new();
    wire::client_handshake(&mut Capture(&mut hello)).ok();
    let path = dir.join("seed.store");
    let _ = std::fs::remove_file(&path);
    {
        let store = FileStore::open(&path).map_err(|e| io::Error::other(format!("{e:?}")))?;
        store.set("k", b"value").map_err(io::Error::other)?;
        store
            .add("n", 5)
            .map_err(|e| io::Error::other(format!("{e:?}")))?;
        store
            .delete("k")
            .map_err(|e| io::Error::other(format!("{e:?}")))?;
        store
            .wait(&["n"], Duration::from_millis(1))
            .map_err(|e| io::Error::other(format!("{e:?}")))?;
    }
    let file = std::fs::read(&path)?;
    std::fs::remove_file(&path)?;
    Ok(vec![
        ("requests", all_requests),
        ("responses", all_responses),
        ("hello", hello),
        ("auth", vec![0x5a; 48]),
        ("file", file),
        ("c10d", crate::c10d::request_seed()),
    ])
}

/// Records what is written; reads see end of stream.
#[derive(Debug)]
struct Capture<'a>(&'a mut Vec<u8>);

impl Read for Capture<'_> {
    fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
        Ok(0)
    }
}

impl Write for Capture<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_accepted_and_garbage_refused() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let seeds: std::collections::HashMap<_, _> = seeds(dir.path())?.into_iter().collect();
        assert_eq!(requests(&seeds["requests"]), 8);
        assert_eq!(responses(&seeds["responses"]), 10);
        assert!(server_handshake(&seeds["hello"]));
        assert!(client_handshake(&seeds["hello"]));
        assert!(!auth_server(&seeds["auth"]));
        assert!(!auth_client(&seeds["auth"]));
        let path = dir.path().join("replayed.store");
        assert_eq!(file_log(&path, &seeds["file"]), Some(1));
        assert_eq!(file_log(&path, b"KOLF\x02\0\0\0"), None);
        assert!(server_handshake(b"SLOK\x02\0"));
        assert!(!server_handshake(b"KOLS\x02\0"));
        Ok(())
    }
}
