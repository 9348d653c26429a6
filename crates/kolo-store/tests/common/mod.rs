//! A conformance suite every `Store` implementation must pass.
#![allow(clippy::unwrap_used, dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use kolo_store::{
    CompareSet, PrefixStore, Store, StoreError, StoreExt, MAX_KEY_LEN, MAX_VALUE_LEN,
};

/// Short timeout for calls that are expected to time out.
pub const SHORT: Duration = Duration::from_millis(200);
/// Generous timeout for calls that are expected to succeed.
pub const LONG: Duration = Duration::from_secs(10);

/// Runs every conformance check against `store`.
pub fn conformance(store: Arc<dyn Store>) {
    set_get_overwrite(&*store);
    get_waits_for_later_set(&store);
    wait_timeout_names_missing_keys(&*store);
    concurrent_add(&store);
    add_semantics(&*store);
    compare_set_semantics(&*store);
    delete_and_num_keys(&*store);
    invalid_inputs(&*store);
    barrier(&store);
    prefix_isolation(&store);
}

fn set_get_overwrite(s: &dyn Store) {
    assert_eq!(s.try_get("basic/a").unwrap(), None);
    s.set("basic/a", b"one").unwrap();
    assert_eq!(s.try_get("basic/a").unwrap(), Some(b"one".to_vec()));
    assert_eq!(s.get("basic/a", SHORT).unwrap(), b"one");
    s.set("basic/a", b"two").unwrap();
    assert_eq!(s.get("basic/a", SHORT).unwrap(), b"two");
    // Empty and binary values are values like any other.
    s.set("basic/empty", b"").unwrap();
    assert_eq!(s.try_get("basic/empty").unwrap(), Some(Vec::new()));
    let binary: Vec<u8> = (0..=255).collect();
    s.set("basic/binary", &binary).unwrap();
    assert_eq!(s.get("basic/binary", SHORT).unwrap(), binary);
    // Unicode keys.
    s.set("basic/ключ/🔑", b"k").unwrap();
    assert_eq!(s.try_get("basic/ключ/🔑").unwrap(), Some(b"k".to_vec()));
    // A wait on present keys (or on none) returns at once.
    s.wait(&["basic/a", "basic/empty"], Duration::ZERO).unwrap();
    s.wait(&[], Duration::ZERO).unwrap();
}

fn get_waits_for_later_set(s: &Arc<dyn Store>) {
    let setter = {
        let s = Arc::clone(s);
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(60));
            s.set("late/key", b"finally").unwrap();
            thread::sleep(Duration::from_millis(30));
            s.set("late/other", b"x").unwrap();
        })
    };
    let start = Instant::now();
    assert_eq!(s.get("late/key", LONG).unwrap(), b"finally");
    assert!(
        start.elapsed() >= Duration::from_millis(40),
        "get returned before the set"
    );
    s.wait(&["late/key", "late/other"], LONG).unwrap();
    setter.join().unwrap();
}

fn wait_timeout_names_missing_keys(s: &dyn Store) {
    s.set("to/present", b"1").unwrap();
    let start = Instant::now();
    match s.wait(&["to/present", "to/missing"], SHORT) {
        Err(StoreError::Timeout { keys, waited }) => {
            assert_eq!(keys, vec!["to/missing".to_owned()]);
            assert!(waited >= SHORT - Duration::from_millis(5), "{waited:?}");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    let elapsed = start.elapsed();
    assert!(elapsed >= SHORT - Duration::from_millis(5), "{elapsed:?}");
    assert!(elapsed < SHORT + Duration::from_secs(2), "{elapsed:?}");

    let err = s.get("to/never", SHORT).unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(err.to_string().contains("\"to/never\""), "{err}");

    // A zero timeout checks once.
    assert!(s.get("to/never", Duration::ZERO).unwrap_err().is_timeout());
}

fn concurrent_add(s: &Arc<dyn Store>) {
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let s = Arc::clone(s);
            thread::spawn(move || {
                let mut last = 0;
                for _ in 0..100 {
                    let now = s.add("add/shared", 1).unwrap();
                    assert!(now > last, "counter went backwards: {last} -> {now}");
                    last = now;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(s.add("add/shared", 0).unwrap(), 800);
    assert_eq!(s.get("add/shared", SHORT).unwrap(), b"800");
}

fn add_semantics(s: &dyn Store) {
    assert_eq!(s.add("add/fresh", 5).unwrap(), 5);
    assert_eq!(s.add("add/fresh", -7).unwrap(), -2);
    assert_eq!(s.try_get("add/fresh").unwrap(), Some(b"-2".to_vec()));
    // A value set as decimal text is a counter.
    s.set("add/text", b"41").unwrap();
    assert_eq!(s.add("add/text", 1).unwrap(), 42);

    s.set("add/not", b"hello").unwrap();
    match s.add("add/not", 1) {
        Err(StoreError::NotACounter { key }) => assert_eq!(key, "add/not"),
        other => panic!("expected NotACounter, got {other:?}"),
    }
    assert_eq!(s.try_get("add/not").unwrap(), Some(b"hello".to_vec()));

    s.set("add/max", i64::MAX.to_string().as_bytes()).unwrap();
    assert!(matches!(
        s.add("add/max", 1),
        Err(StoreError::CounterOverflow { .. })
    ));
}

fn compare_set_semantics(s: &dyn Store) {
    let k = "cas/k";
    assert_eq!(
        s.compare_set(k, None, b"first").unwrap(),
        CompareSet::Swapped
    );
    assert_eq!(s.try_get(k).unwrap(), Some(b"first".to_vec()));
    assert_eq!(
        s.compare_set(k, None, b"second").unwrap(),
        CompareSet::Mismatch {
            current: Some(b"first".to_vec())
        }
    );
    assert_eq!(
        s.compare_set(k, Some(b"wrong"), b"second").unwrap(),
        CompareSet::Mismatch {
            current: Some(b"first".to_vec())
        }
    );
    assert_eq!(
        s.compare_set(k, Some(b"first"), b"second").unwrap(),
        CompareSet::Swapped
    );
    assert_eq!(s.try_get(k).unwrap(), Some(b"second".to_vec()));
    assert_eq!(
        s.compare_set("cas/absent", Some(b"x"), b"y").unwrap(),
        CompareSet::Mismatch { current: None }
    );
    assert_eq!(s.try_get("cas/absent").unwrap(), None);
}

fn delete_and_num_keys(s: &dyn Store) {
    let before = s.num_keys().unwrap();
    s.set("del/a", b"1").unwrap();
    s.set("del/b", b"2").unwrap();
    s.add("del/c", 1).unwrap();
    s.set("del/a", b"overwritten").unwrap();
    assert_eq!(s.num_keys().unwrap(), before + 3);
    assert!(s.delete("del/a").unwrap());
    assert!(!s.delete("del/a").unwrap());
    assert!(!s.delete("del/never").unwrap());
    assert_eq!(s.try_get("del/a").unwrap(), None);
    assert_eq!(s.num_keys().unwrap(), before + 2);
    // A deleted key can be set again.
    s.set("del/a", b"again").unwrap();
    assert_eq!(s.get("del/a", SHORT).unwrap(), b"again");
}

fn invalid_inputs(s: &dyn Store) {
    assert!(matches!(
        s.set("", b"x"),
        Err(StoreError::InvalidKey { .. })
    ));
    assert!(matches!(s.try_get(""), Err(StoreError::InvalidKey { .. })));
    assert!(matches!(
        s.wait(&["ok", ""], SHORT),
        Err(StoreError::InvalidKey { .. })
    ));
    let long = "k".repeat(MAX_KEY_LEN + 1);
    assert!(matches!(
        s.add(&long, 1),
        Err(StoreError::InvalidKey { .. })
    ));
    let longest = "k".repeat(MAX_KEY_LEN);
    s.set(&longest, b"fits").unwrap();
    assert_eq!(s.try_get(&longest).unwrap(), Some(b"fits".to_vec()));
    assert!(s.delete(&longest).unwrap());
    let huge = vec![0u8; MAX_VALUE_LEN + 1];
    match s.set("big", &huge) {
        Err(StoreError::TooLarge { what, len, max }) => {
            assert_eq!(what, "value");
            assert_eq!(len, huge.len() as u64);
            assert_eq!(max, MAX_VALUE_LEN as u64);
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_eq!(s.try_get("big").unwrap(), None);
}

fn barrier(s: &Arc<dyn Store>) {
    const WORLD: usize = 5;
    let arrived = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..WORLD)
        .map(|rank| {
            let s = Arc::clone(s);
            let arrived = Arc::clone(&arrived);
            thread::spawn(move || {
                for round in 1..=2 {
                    // Stagger arrivals so early ranks really wait.
                    thread::sleep(Duration::from_millis(10 * rank as u64));
                    arrived.fetch_add(1, Ordering::SeqCst);
                    s.barrier("barrier/start", rank, WORLD, LONG).unwrap();
                    let seen = arrived.load(Ordering::SeqCst);
                    assert!(
                        seen >= round * WORLD,
                        "rank {rank} left round {round} after only {seen} arrivals"
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }

    // A barrier that not everybody reaches times out, naming its key.
    let start = Instant::now();
    match s.barrier("barrier/lonely", 0, 2, SHORT) {
        Err(StoreError::Timeout { keys, .. }) => {
            assert_eq!(keys, vec!["barrier/lonely/done/0".to_owned()]);
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(start.elapsed() < SHORT + Duration::from_secs(2));

    assert!(matches!(
        s.barrier("barrier/bad", 3, 3, SHORT),
        Err(StoreError::InvalidArgument { .. })
    ));
    assert!(matches!(
        s.barrier("barrier/bad", 0, 0, SHORT),
        Err(StoreError::InvalidArgument { .. })
    ));
    // A world of one passes at once.
    s.barrier("barrier/solo", 0, 1, Duration::ZERO).unwrap();
}

fn prefix_isolation(s: &Arc<dyn Store>) {
    let a = PrefixStore::new(Arc::clone(s), "pa");
    let b = PrefixStore::new(Arc::clone(s), "pb");
    a.set("k", b"from a").unwrap();
    b.set("k", b"from b").unwrap();
    assert_eq!(a.get("k", SHORT).unwrap(), b"from a");
    assert_eq!(b.get("k", SHORT).unwrap(), b"from b");
    assert_eq!(s.try_get("pa/k").unwrap(), Some(b"from a".to_vec()));
    assert_eq!(s.try_get("k").unwrap(), None);

    assert_eq!(a.add("n", 2).unwrap(), 2);
    assert_eq!(b.add("n", 5).unwrap(), 5);
    assert_eq!(a.compare_set("c", None, b"1").unwrap(), CompareSet::Swapped);
    assert_eq!(b.try_get("c").unwrap(), None);
    assert!(a.delete("c").unwrap());
    assert!(!b.delete("c").unwrap());

    // Timeouts name the key as the caller knows it.
    match b.wait(&["k", "only-in-a"], SHORT) {
        Err(StoreError::Timeout { keys, .. }) => assert_eq!(keys, vec!["only-in-a".to_owned()]),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(matches!(
        a.set("", b"x"),
        Err(StoreError::InvalidKey { .. })
    ));

    // Nested prefixes and barriers through a prefix store.
    let nested: Arc<dyn Store> = Arc::new(PrefixStore::new(Arc::new(a), "inner"));
    nested.set("deep", b"1").unwrap();
    assert_eq!(s.try_get("pa/inner/deep").unwrap(), Some(b"1".to_vec()));
    nested.barrier("b", 0, 1, SHORT).unwrap();
}
