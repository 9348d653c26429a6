//! Proof that a connection belongs to the job: a mutual HMAC-SHA256 challenge over a per-job secret.
//!
//! `kolo run` generates a random secret per job and hands it to its workers in `KOLO_JOB_SECRET`; the
//! store and the TCP transport run this exchange on every connection before anything else, so a
//! process without the secret learns nothing and can change nothing. The secret itself never
//! crosses the wire:
//!
//! ```text
//! client -> server   nonce_c                                        (16 random bytes)
//! server -> client   nonce_s, HMAC(secret, "kolo server" | nonce_c | nonce_s)
//! client -> server   HMAC(secret, "kolo client" | nonce_s | nonce_c)   (after checking the server)
//! server -> client   1 (accepted)
//! ```
//!
//! Fresh nonces on both sides make a recorded exchange useless for another connection. A job started
//! without a secret (not by `kolo run`, and `KOLO_JOB_SECRET` unset) runs the same exchange with an
//! empty secret: it still keeps apart jobs that do set one, but anyone can join it — set
//! `KOLO_JOB_SECRET` yourself where the network is shared.

use std::fmt;
use std::io::{self, Read, Write};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Environment variable holding the job secret.
pub const SECRET_ENV: &str = "KOLO_JOB_SECRET";

const NONCE: usize = 16;
const MAC: usize = 32;

/// A job's shared secret (never printed).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct JobSecret(Vec<u8>);

impl fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("JobSecret(none)")
        } else {
            f.write_str("JobSecret(..)")
        }
    }
}

impl JobSecret {
    /// A secret from its bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> JobSecret {
        JobSecret(bytes.into())
    }

    /// The secret in `KOLO_JOB_SECRET`, or none.
    pub fn from_env() -> JobSecret {
        JobSecret::from_lookup(kolo_core::settings::ProcessEnv)
    }

    /// The secret in `KOLO_JOB_SECRET` as `env` has it, or none.
    pub fn from_lookup(env: impl kolo_core::settings::Env) -> JobSecret {
        env.lookup_os(SECRET_ENV)
            .map(|v| JobSecret(v.into_encoded_bytes()))
            .unwrap_or_default()
    }

    /// A fresh random secret, as 64 hex digits (what `kolo run` puts in `KOLO_JOB_SECRET`).
    pub fn generate_hex() -> io::Result<String> {
        let mut b = [0u8; 32];
        random(&mut b)?;
        Ok(b.iter().map(|x| format!("{x:02x}")).collect())
    }

    /// Whether a secret is set.
    pub fn is_set(&self) -> bool {
        !self.0.is_empty()
    }

    fn mac(&self, role: &[u8], first: &[u8], second: &[u8]) -> Hmac<Sha256> {
        // HMAC takes keys of any length.
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        m.update(role);
        m.update(first);
        m.update(second);
        m
    }
}

/// Why an authentication exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The other side did not prove it knows the secret.
    #[error("the peer did not prove it knows the job secret ({SECRET_ENV} differs, or it is not part of this job)")]
    Unproven,
    /// The server rejected this side's proof.
    #[error("the peer rejected this process's proof of the job secret ({SECRET_ENV} differs)")]
    Rejected,
    /// The connection failed during the exchange.
    #[error("authentication exchange: {0}")]
    Io(#[from] io::Error),
}

fn nonce() -> io::Result<[u8; NONCE]> {
    let mut b = [0u8; NONCE];
    random(&mut b)?;
    Ok(b)
}

/// Fills `out` from the kernel's random source.
fn random(out: &mut [u8]) -> io::Result<()> {
    crate::sys::random(out)
}

/// The connecting side's half of the exchange.
pub fn client<S: Read + Write>(stream: &mut S, secret: &JobSecret) -> Result<(), AuthError> {
    let nc = nonce()?;
    stream.write_all(&nc)?;
    stream.flush()?;
    let mut reply = [0u8; NONCE + MAC];
    stream.read_exact(&mut reply)?;
    let (ns, proof) = reply.split_at(NONCE);
    secret
        .mac(b"kolo server", &nc, ns)
        .verify_slice(proof)
        .map_err(|_| AuthError::Unproven)?;
    let mine = secret.mac(b"kolo client", ns, &nc).finalize().into_bytes();
    stream.write_all(&mine)?;
    stream.flush()?;
    let mut ok = [0u8; 1];
    match stream.read_exact(&mut ok) {
        Ok(()) if ok[0] == 1 => Ok(()),
        Ok(()) => Err(AuthError::Rejected),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(AuthError::Rejected),
        Err(e) => Err(e.into()),
    }
}

/// The accepting side's half of the exchange (reads exactly 16 + 32 bytes from the client, whatever
/// it sends).
pub fn server<S: Read + Write>(stream: &mut S, secret: &JobSecret) -> Result<(), AuthError> {
    let mut nc = [0u8; NONCE];
    stream.read_exact(&mut nc)?;
    let ns = nonce()?;
    let proof = secret.mac(b"kolo server", &nc, &ns).finalize().into_bytes();
    let mut reply = [0u8; NONCE + MAC];
    reply[..NONCE].copy_from_slice(&ns);
    reply[NONCE..].copy_from_slice(&proof);
    stream.write_all(&reply)?;
    stream.flush()?;
    let mut theirs = [0u8; MAC];
    stream.read_exact(&mut theirs)?;
    if secret
        .mac(b"kolo client", &ns, &nc)
        .verify_slice(&theirs)
        .is_err()
    {
        let _ = stream.write_all(&[0]);
        return Err(AuthError::Unproven);
    }
    stream.write_all(&[1])?;
    stream.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::thread;

    fn exchange(
        server_secret: &str,
        client_secret: &str,
    ) -> (Result<(), AuthError>, Result<(), AuthError>) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let s = JobSecret::new(server_secret.as_bytes());
        let h = thread::spawn(move || {
            let (mut c, _) = l.accept().expect("accept");
            server(&mut c, &s)
        });
        let mut c = TcpStream::connect(addr).expect("connect");
        let r = client(&mut c, &JobSecret::new(client_secret.as_bytes()));
        drop(c);
        (h.join().expect("server thread"), r)
    }

    #[test]
    fn same_secret_is_accepted_both_ways() {
        let (s, c) = exchange("abc", "abc");
        assert!(s.is_ok() && c.is_ok(), "{s:?} {c:?}");
        let (s, c) = exchange("", "");
        assert!(s.is_ok() && c.is_ok(), "{s:?} {c:?}");
    }

    #[test]
    fn a_wrong_secret_fails_on_both_sides() {
        let (s, c) = exchange("right", "wrong");
        assert!(matches!(c, Err(AuthError::Unproven)), "{c:?}");
        // The client stops at the server's bad proof: the server sees the connection close.
        assert!(matches!(s, Err(AuthError::Io(_))), "{s:?}");
        let (s, c) = exchange("right", "");
        assert!(c.is_err() && s.is_err());
    }

    #[test]
    fn a_client_without_the_secret_cannot_forge_a_proof() {
        // A client that answers with a proof made from the wrong key is told no.
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let h = thread::spawn(move || {
            let (mut c, _) = l.accept().expect("accept");
            server(&mut c, &JobSecret::new("right"))
        });
        let mut c = TcpStream::connect(addr).expect("connect");
        c.write_all(&[7u8; NONCE]).expect("nonce");
        let mut reply = [0u8; NONCE + MAC];
        c.read_exact(&mut reply).expect("reply");
        let forged = JobSecret::new("guess")
            .mac(b"kolo client", &reply[..NONCE], &[7u8; NONCE])
            .finalize()
            .into_bytes();
        c.write_all(&forged).expect("proof");
        let mut ok = [9u8; 1];
        c.read_exact(&mut ok).expect("verdict");
        assert_eq!(ok[0], 0);
        assert!(matches!(
            h.join().expect("server"),
            Err(AuthError::Unproven)
        ));
    }

    #[test]
    fn the_secret_is_not_printed() {
        assert_eq!(format!("{:?}", JobSecret::new("hunter2")), "JobSecret(..)");
    }

    #[test]
    fn generated_secrets_are_hex_and_fresh() {
        let a = JobSecret::generate_hex().expect("random");
        let b = JobSecret::generate_hex().expect("random");
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
