use std::io::Write as _;

use super::*;
use crate::mnist::tests::{images_bytes, labels_bytes, write};

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[test]
fn kinds_parse_and_display() -> TestResult {
    for kind in DatasetKind::ALL {
        assert_eq!(kind.name().parse::<DatasetKind>()?, kind);
        assert_eq!(kind.to_string(), kind.name());
    }
    assert_eq!(
        "Fashion_MNIST".parse::<DatasetKind>()?,
        DatasetKind::FashionMnist
    );
    assert_eq!("cifar-10".parse::<DatasetKind>()?, DatasetKind::Cifar10);
    match "imagenet".parse::<DatasetKind>() {
        Err(DataError::InvalidArgument { arg, reason }) => {
            assert_eq!(arg, "dataset");
            assert!(reason.contains("fashion-mnist"), "{reason}");
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    Ok(())
}

#[test]
fn search_order() {
    let dirs = candidate_dirs(
        DatasetKind::FashionMnist,
        Some(Path::new("/explicit")),
        Some(OsString::from("/from-env")),
    );
    let expect_prefix: Vec<PathBuf> = [
        "/explicit",
        "/explicit/fashion-mnist",
        "/from-env",
        "/from-env/fashion-mnist",
        FASHION_MNIST_SYSTEM_DIR,
        "data/fashion-mnist",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    assert_eq!(dirs[..expect_prefix.len()], expect_prefix[..]);
    // An empty variable is ignored; MNIST has no system directory.
    let dirs = candidate_dirs(DatasetKind::Mnist, None, Some(OsString::new()));
    assert_eq!(dirs[0], PathBuf::from("data/mnist"));
    assert!(candidate_dirs(DatasetKind::Synthetic, None, None).is_empty());
}

fn write_mnist(dir: &Path, split: Split, n: u8) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let p = match split {
        Split::Train => "train",
        Split::Test => "t10k",
    };
    let labels: Vec<u8> = (0..n).map(|i| i % 10).collect();
    write(
        &dir.join(format!("{p}-images-idx3-ubyte.gz")),
        &images_bytes(u32::from(n), 2, 2, &vec![9; usize::from(n) * 4]),
        true,
    )?;
    write(
        &dir.join(format!("{p}-labels-idx1-ubyte.gz")),
        &labels_bytes(&labels),
        true,
    )
}

#[test]
fn explicit_dir_then_env_then_defaults() -> TestResult {
    let explicit = tempfile::tempdir()?;
    let env = tempfile::tempdir()?;
    // The explicit dir has MNIST in its mnist/ sub-directory, the env dir
    // at top level.
    write_mnist(&explicit.path().join("mnist"), Split::Test, 3)?;
    write_mnist(env.path(), Split::Test, 4)?;
    write_mnist(env.path(), Split::Train, 5)?;

    let env_var = Some(env.path().as_os_str().to_owned());
    let d = load_with_env(
        DatasetKind::Mnist,
        Split::Test,
        Some(explicit.path()),
        env_var.clone(),
    )?;
    assert_eq!((d.len(), d.name.as_str()), (3, "mnist/test"));
    // The explicit dir lacks the train split: the env dir supplies it.
    let d = load_with_env(
        DatasetKind::Mnist,
        Split::Train,
        Some(explicit.path()),
        env_var.clone(),
    )?;
    assert_eq!(d.len(), 5);
    let d = load_with_env(DatasetKind::Mnist, Split::Test, None, env_var)?;
    assert_eq!(d.len(), 4);
    Ok(())
}

#[test]
fn nonexistent_explicit_dir_is_an_error() {
    let missing = Path::new("/nonexistent/kolo-data-test");
    match load_with_env(DatasetKind::Mnist, Split::Train, Some(missing), None) {
        Err(DataError::NotFound { searched, hint, .. }) => {
            assert_eq!(searched, vec![missing.to_path_buf()]);
            assert!(hint.contains("does not exist"), "{hint}");
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    let env = Some(OsString::from("/nonexistent/env-dir"));
    assert!(matches!(
        load_with_env(DatasetKind::Digits, Split::Train, None, env),
        Err(DataError::NotFound { .. })
    ));
}

#[test]
fn cifar_not_found_says_where_and_how() -> TestResult {
    let empty = tempfile::tempdir()?;
    match load_with_env(DatasetKind::Cifar10, Split::Train, Some(empty.path()), None) {
        Err(e @ DataError::NotFound { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&empty.path().display().to_string()), "{msg}");
            assert!(msg.contains("cifar-10-batches-bin"), "{msg}");
            assert!(msg.contains("binary version"), "{msg}");
            assert!(msg.contains("--data-dir"), "{msg}");
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    Ok(())
}

#[test]
fn digits_accepts_a_file_path() -> TestResult {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("mine.csv");
    let row = |l: u32| {
        let mut f = vec!["3".to_owned(); 64];
        f.push(l.to_string());
        f.join(",")
    };
    let text: Vec<String> = (0..10).map(row).collect();
    write(&file, text.join("\n").as_bytes(), false)?;
    let d = load_with_env(DatasetKind::Digits, Split::Test, Some(&file), None)?;
    assert_eq!((d.len(), d.name.as_str()), (2, "digits/test"));
    Ok(())
}

#[test]
fn synthetic_needs_no_files() -> TestResult {
    let d = load_with_env(DatasetKind::Synthetic, Split::Train, None, None)?;
    assert_eq!(d.len(), SyntheticSpec::default().train_samples);
    Ok(())
}

// ---- Real data: present after scripts/fetch-data.sh. ----

/// Loads a real split, or prints why the check is skipped.
fn real(kind: DatasetKind, split: Split) -> Result<Option<Dataset>, DataError> {
    match load_with_env(kind, split, None, None) {
        Ok(d) => Ok(Some(d)),
        Err(e @ DataError::NotFound { .. }) => {
            // Written to the real stderr, not the test harness's capture, so
            // the skip is visible even when the test passes.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED real-data check for {kind}/{split}: {e}"
            );
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn check_idx_dataset(kind: DatasetKind) -> TestResult {
    for (split, n) in [(Split::Train, 60_000), (Split::Test, 10_000)] {
        let Some(d) = real(kind, split)? else {
            continue;
        };
        assert_eq!(d.len(), n, "{kind}/{split}");
        assert_eq!(d.shape, [1, 28, 28]);
        assert_eq!(d.name, format!("{kind}/{split}"));
        let hist = d.class_histogram();
        assert_eq!(hist.iter().sum::<usize>(), n);
        if kind == DatasetKind::FashionMnist {
            assert_eq!(hist, vec![n / 10; 10], "{kind}/{split}");
        } else {
            // MNIST is nearly but not exactly balanced.
            assert!(hist.iter().all(|&c| c > n / 12 && c < n / 8), "{hist:?}");
        }
        let (mut x, mut y) = (Vec::new(), Vec::new());
        d.gather(&[0, n - 1], &mut x, &mut y)?;
        assert_eq!(x.len(), 2 * 784);
        assert!(x.iter().all(|v| (0.0..=1.0).contains(v)));
        assert!(x.iter().any(|&v| v > 0.9), "no bright pixel");
    }
    Ok(())
}

#[test]
fn real_fashion_mnist() -> TestResult {
    check_idx_dataset(DatasetKind::FashionMnist)
}

#[test]
fn real_mnist() -> TestResult {
    check_idx_dataset(DatasetKind::Mnist)?;
    if let Some(d) = real(DatasetKind::Mnist, Split::Train)? {
        // The well-known first training labels: 5 0 4 1 9 2 1 3 1 4.
        assert_eq!(&d.labels()[..10], &[5, 0, 4, 1, 9, 2, 1, 3, 1, 4]);
    }
    Ok(())
}

#[test]
fn real_digits() -> TestResult {
    let (Some(train), Some(test)) = (
        real(DatasetKind::Digits, Split::Train)?,
        real(DatasetKind::Digits, Split::Test)?,
    ) else {
        return Ok(());
    };
    assert_eq!(train.len() + test.len(), digits::EXPECTED_ROWS);
    assert_eq!((train.len(), test.len()), (1437, 360));
    assert_eq!(train.shape, [1, 8, 8]);
    let hist: Vec<usize> = train
        .class_histogram()
        .iter()
        .zip(test.class_histogram())
        .map(|(a, b)| a + b)
        .collect();
    // scikit-learn's documented class counts.
    assert_eq!(hist, vec![178, 182, 177, 183, 181, 182, 181, 179, 174, 180]);
    // Every class appears in the test split.
    assert!(test.class_histogram().iter().all(|&c| c > 0));
    Ok(())
}
