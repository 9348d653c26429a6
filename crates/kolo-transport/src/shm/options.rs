//! Settings of the shared-memory transport, and reading them from the environment.

use std::time::Duration;

use kolo_core::settings::{Env, ProcessEnv};
use kolo_core::Error;

/// Settings of the shared-memory transport.
#[derive(Clone, Debug)]
pub struct ShmOptions {
    /// Bytes of each pair's ring (rounded up to 64; at least 4 KiB); 0: chosen by the number of
    /// ranks on the host ([`ShmOptions::ring_for`]).
    pub ring_bytes: usize,
    /// Bytes of each of a rank's two arena buffers (rounded up to 64; at least 4 KiB).
    pub buffer_bytes: usize,
    /// How long a waiting thread spins before it sleeps.
    pub spin: Duration,
    /// Sends in place ([`ShmTransport::send_in_place`](super::ShmTransport)) of at least this many
    /// bytes are copied once, by the receiver straight from the sender's memory, where the receiver
    /// can read it (`process_vm_readv`); shorter ones go through the ring. 0: never. By default
    /// [`SINGLE_COPY_BYTES`].
    pub single_copy_bytes: usize,
    /// How often a sleeping thread checks that its peers are alive.
    pub poll: Duration,
    /// Largest payload accepted from a peer.
    pub max_message: u64,
    /// How long connecting waits for the other ranks.
    pub connect_timeout: Duration,
    /// A peer process whose heartbeat (bumped twice a second) stands still this long is lost: it
    /// is stopped or hung. `None`: no heartbeats.
    pub heartbeat_timeout: Option<Duration>,
}

/// The default [`ShmOptions::single_copy_bytes`]: 16 MiB. Through 1 MiB rings a message streams
/// faster than one copy out of the sender's memory at every size up to that (the sender copies
/// into the ring while the receiver copies out, and `process_vm_readv` pays the kernel's access
/// check and page pinning): kolo.MPI's `osu_bw` 2.4–3.8× the bandwidth at 8 KiB–4 MiB, a 16–256
/// MiB ping-pong 1.05–1.25×, all-gather and all-to-all 1.1–2.3× faster at 256 KiB–4 MiB blocks
/// (2 ranks, AMD EPYC). From 16 MiB, in place keeps two ranks that send to each other before
/// either receives from copying both messages twice (into the ring, then out of it into the
/// receiver's mailbox): about 1.5× faster at 16–128 MiB. A collective's segments (1 MiB at
/// most) stay under it, so collectives go in place only where the threshold is set lower.
pub const SINGLE_COPY_BYTES: usize = 16 << 20;

impl Default for ShmOptions {
    fn default() -> Self {
        ShmOptions {
            ring_bytes: 0,
            buffer_bytes: 1 << 20,
            spin: Duration::from_micros(1000),
            single_copy_bytes: SINGLE_COPY_BYTES,
            poll: Duration::from_millis(20),
            max_message: 1 << 40,
            connect_timeout: Duration::from_secs(300),
            heartbeat_timeout: Some(Duration::from_secs(6)),
        }
    }
}

/// The largest ring chosen by default: 1 MiB. A message streams through a larger ring
/// two to three times as fast as through a 256 KiB one (ping-pong between two ranks, 1–16 MiB:
/// the two cores copy in and out with more slack between them), and no faster through 2 MiB.
const RING_MAX: usize = 1 << 20;
/// The smallest ring chosen by default: 256 KiB.
const RING_MIN: usize = 256 << 10;
/// What the rings of a host's segment take together at most, where that leaves each at least
/// [`RING_MIN`]: 16 MiB (a segment is reserved whole, and `/dev/shm` is small in containers).
const RINGS_BUDGET: usize = 16 << 20;

impl ShmOptions {
    /// The ring size of a segment of `n` ranks: `ring_bytes` where it is set, else 1 MiB for up
    /// to 4 ranks, less from 5 (the `n·(n−1)` rings within 16 MiB together) and 256 KiB from 9.
    /// Every rank computes the same from the same `n` and settings (a rank whose settings give
    /// another layout than the segment's creator is refused at connect).
    pub fn ring_for(&self, n: usize) -> usize {
        if self.ring_bytes > 0 {
            return self.ring_bytes;
        }
        let rings = (n * n.saturating_sub(1)).max(1);
        (RINGS_BUDGET / rings).clamp(RING_MIN, RING_MAX) / 64 * 64
    }

    /// Defaults, overridden by `KOLO_SHM_RING_BYTES`, `KOLO_SHM_BUFFER_BYTES`, `KOLO_SHM_SPIN_US` and
    /// `KOLO_SHM_SINGLE_COPY_BYTES`.
    pub fn from_env() -> Result<ShmOptions, Error> {
        ShmOptions::from_lookup(ProcessEnv)
    }

    /// Like [`ShmOptions::from_env`], reading variables from `env`.
    pub fn from_lookup(env: impl Env) -> Result<ShmOptions, Error> {
        let mut o = ShmOptions::default();
        let num = |var: &'static str| -> Result<Option<u64>, Error> {
            match env.lookup(var) {
                None => Ok(None),
                Some(v) => v
                    .trim()
                    .parse::<u64>()
                    .map(Some)
                    .map_err(|_| Error::Config {
                        var: var.to_string(),
                        value: v.clone(),
                        reason: "expected a non-negative integer".into(),
                    }),
            }
        };
        if let Some(v) = num("KOLO_SHM_RING_BYTES")? {
            o.ring_bytes = v as usize;
        }
        if let Some(v) = num("KOLO_SHM_BUFFER_BYTES")? {
            o.buffer_bytes = v as usize;
        }
        if let Some(v) = num("KOLO_SHM_SPIN_US")? {
            o.spin = Duration::from_micros(v);
        }
        if let Some(v) = num("KOLO_SHM_SINGLE_COPY_BYTES")? {
            o.single_copy_bytes = usize::try_from(v).unwrap_or(usize::MAX);
        }
        Ok(o)
    }
}
