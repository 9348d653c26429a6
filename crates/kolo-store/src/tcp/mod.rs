//! [`TcpStoreServer`] and [`TcpStore`]: the store over TCP (kolo's own protocol, [`crate::wire`]).

mod client;
mod server;

use std::fmt;
use std::io::{self, Write};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

pub use client::TcpStore;
pub use server::TcpStoreServer;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code path panics while holding these locks; recover from poison.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Writes one line to stderr, ignoring failures (never panics, unlike `eprintln!`).
fn log(args: fmt::Arguments<'_>) {
    let _ = writeln!(io::stderr().lock(), "kolo-store: {args}");
}

/// Whether an I/O error means the peer went away.
fn is_disconnect(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::NotConnected
    )
}

/// Milliseconds for the wire, rounded up so a short non-zero timeout is not 0.
fn duration_to_ms(d: Duration) -> u64 {
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(ms).unwrap_or(u64::MAX)
}

use crate::pool::socket_timeout;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ms_rounding() {
        assert_eq!(duration_to_ms(Duration::ZERO), 0);
        assert_eq!(duration_to_ms(Duration::from_micros(1)), 1);
        assert_eq!(duration_to_ms(Duration::from_millis(200)), 200);
        assert_eq!(duration_to_ms(Duration::MAX), u64::MAX);
    }

    #[test]
    fn socket_timeouts() {
        assert_eq!(socket_timeout(Duration::MAX), None);
        assert_eq!(
            socket_timeout(Duration::ZERO),
            Some(Duration::from_millis(1))
        );
    }
}
