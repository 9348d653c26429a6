//! Connecting over shared memory: the rings' size from the number of ranks, and ranks whose
//! settings lay the segment out differently refused by name.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kolo_core::{Error, Transport};
use kolo_store::MemoryStore;

use super::tests::{bytes, header};
use super::{ShmOptions, ShmTransport};

static JOB: AtomicU64 = AtomicU64::new(0);

#[test]
fn rings_are_one_mib_for_few_ranks_and_shrink_to_256_kib_within_16_mib() {
    let auto = ShmOptions::default();
    for n in [1, 2, 3, 4] {
        assert_eq!(auto.ring_for(n), 1 << 20, "{n} ranks");
    }
    assert_eq!(auto.ring_for(5), (16 << 20) / 20 / 64 * 64);
    assert_eq!(auto.ring_for(8), (16 << 20) / 56 / 64 * 64);
    for n in [9, 16, 64, 1000] {
        assert_eq!(auto.ring_for(n), 256 << 10, "{n} ranks");
    }
    for n in 2..64 {
        assert!(n * (n - 1) * auto.ring_for(n) <= (16 << 20) || auto.ring_for(n) == 256 << 10);
    }
    let set = ShmOptions {
        ring_bytes: 64 << 10,
        ..ShmOptions::default()
    };
    assert_eq!(set.ring_for(2), 64 << 10);
}

/// Connects ranks 0 and 1 of a new job with `opts0` and `opts1`.
fn connect(
    opts0: &ShmOptions,
    opts1: &ShmOptions,
) -> (Result<ShmTransport, Error>, Result<ShmTransport, Error>) {
    let store = MemoryStore::new();
    let prefix = format!("shm-connect/{}", JOB.fetch_add(1, Ordering::SeqCst));
    let name = format!("kolo-test-connect-{}-", std::process::id());
    std::thread::scope(|s| {
        let a = s.spawn(|| ShmTransport::connect(&store, &prefix, &name, 0, 2, opts0));
        let b = ShmTransport::connect(&store, &prefix, &name, 1, 2, opts1);
        let a = a.join().unwrap_or_else(|_| {
            Err(Error::Io {
                context: "rank 0's thread panicked".into(),
                source: std::io::Error::other("panic").into(),
            })
        });
        (a, b)
    })
}

#[test]
fn a_message_four_times_the_ring_arrives_whole() {
    let opts = ShmOptions::default();
    let (a, b) = connect(&opts, &opts);
    let (a, b) = (a.expect("rank 0 connects"), b.expect("rank 1 connects"));
    let msg = bytes(4 << 20, 7);
    std::thread::scope(|s| {
        s.spawn(|| a.send(1, &header(3), &msg).expect("rank 0 sends"));
        let got = b.recv(0, &header(3).tag, None).expect("rank 1 receives");
        assert!(got.payload == msg, "the 4 MiB message arrived changed");
    });
}

#[test]
fn a_rank_whose_ring_setting_differs_is_refused_naming_the_variable() {
    let mine = ShmOptions {
        connect_timeout: Duration::from_secs(2),
        ..ShmOptions::default()
    };
    let other = ShmOptions {
        ring_bytes: 256 << 10,
        ..mine.clone()
    };
    let (a, b) = connect(&mine, &other);
    match b {
        Err(Error::Config { var, value, reason }) => {
            assert_eq!(var, "KOLO_SHM_RING_BYTES");
            assert_eq!(value, (256 << 10).to_string());
            assert!(
                reason.contains("rank 1") && reason.contains(&(1 << 20).to_string()),
                "{reason}"
            );
        }
        other => panic!("expected a settings error naming the ring, got {other:?}"),
    }
    // Rank 0 waits for a rank that never attaches: its connect times out.
    assert!(matches!(a, Err(Error::Timeout { .. })), "{a:?}");
}
