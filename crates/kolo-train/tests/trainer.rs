//! The training loop end to end on small data, with threads as ranks: it learns, writes its outputs,
//! resumes to the same parameters as an uninterrupted run, and fails cleanly on bad settings.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use candle_core::{Device, Tensor};
use common::synthetic;
use kolo::Config;
use kolo_data::DatasetKind;
use kolo_ddp::TrainError;
use kolo_models::ModelKind;
use kolo_train::trainer::{run, Summary, TrainConfig};
use kolo_train::RunError;

fn train(n: usize, cfg: &TrainConfig) -> Vec<Result<Summary, RunError>> {
    kolo::run_local(
        n,
        Config::default().with_timeout(Duration::from_secs(120)),
        |comm| run(&comm, cfg),
    )
    .into_iter()
    .map(|r| r.expect("rank thread panicked"))
    .collect()
}

fn final_model(dir: &Path, epoch: usize) -> HashMap<String, Tensor> {
    let p = dir.join(format!("checkpoints/epoch-{epoch:04}/model.safetensors"));
    candle_core::safetensors::load(&p, &Device::Cpu).expect("checkpoint")
}

#[test]
fn learns_and_writes_its_outputs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = synthetic(dir.path(), 3);
    let res = train(2, &cfg);
    let s = res[0].as_ref().expect("rank 0");
    assert_eq!(s.epochs.len(), 3);
    assert!(
        s.final_accuracy > 0.8,
        "synthetic blobs are easy: {:?}",
        s.epochs
    );
    assert!(s.epochs[2].train_loss < s.epochs[0].train_loss);
    // Every rank agrees on the results.
    assert_eq!(
        res[1].as_ref().map(|s| s.final_accuracy).ok(),
        Some(s.final_accuracy)
    );
    for f in [
        "metrics.csv",
        "training.png",
        "summary.json",
        "checkpoints/latest",
        "tensorboard",
    ] {
        assert!(dir.path().join(f).exists(), "{f} missing");
    }
    let csv = std::fs::read_to_string(dir.path().join("metrics.csv")).expect("csv");
    assert_eq!(csv.lines().count(), 4, "{csv}");
}

#[test]
fn resume_ends_with_the_same_parameters_as_an_uninterrupted_run() {
    let full = tempfile::tempdir().expect("tempdir");
    let cut = tempfile::tempdir().expect("tempdir");
    for r in train(2, &synthetic(full.path(), 3)) {
        r.expect("uninterrupted run");
    }
    // Stopped after epoch 1, then continued.
    let first = TrainConfig {
        stop_after: Some(1),
        ..synthetic(cut.path(), 3)
    };
    for r in train(2, &first) {
        assert_eq!(r.expect("first part").epochs.len(), 1);
    }
    let rest = TrainConfig {
        resume: true,
        ..synthetic(cut.path(), 3)
    };
    for r in train(2, &rest) {
        assert_eq!(r.expect("resumed part").epochs.len(), 2);
    }
    let a = final_model(full.path(), 3);
    let b = final_model(cut.path(), 3);
    assert_eq!(a.len(), b.len());
    for (name, ta) in &a {
        let tb = &b[name];
        let diff = (ta - tb)
            .and_then(|d| d.abs())
            .and_then(|d| d.max_all())
            .and_then(|m| m.to_scalar::<f32>());
        let diff = diff.expect("difference");
        assert!(diff <= 1e-6, "{name} differs by {diff}");
    }
    let csv = std::fs::read_to_string(cut.path().join("metrics.csv")).expect("csv");
    assert_eq!(
        csv.lines().count(),
        4,
        "one row per epoch across both parts: {csv}"
    );
}

#[test]
fn resuming_another_model_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    for r in train(
        1,
        &TrainConfig {
            stop_after: Some(1),
            ..synthetic(dir.path(), 2)
        },
    ) {
        r.expect("first part");
    }
    let other = TrainConfig {
        resume: true,
        model: ModelKind::Lenet,
        ..synthetic(dir.path(), 2)
    };
    // LeNet cannot even be built for 1×1×32 inputs, or the checkpoint is refused: either way an error.
    for r in train(1, &other) {
        assert!(r.is_err());
    }
}

#[test]
fn an_error_of_one_rank_fails_the_others_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Rank 0 cannot create its run directory (a file is in the way); the others wait for its path.
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").expect("file");
    let started = std::time::Instant::now();
    let res = train(
        3,
        &TrainConfig {
            out: Some(file),
            ..synthetic(dir.path(), 1)
        },
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the others waited"
    );
    assert!(res[0].is_err(), "{:?}", res[0]);
    for r in &res[1..] {
        let text = r.as_ref().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.contains("rank 0") && text.contains("not-a-dir"),
            "{text}"
        );
    }
}

#[test]
fn bad_settings_are_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let res = train(
        2,
        &TrainConfig {
            model: ModelKind::Resnet18,
            sync_bn: true,
            uneven: true,
            ..synthetic(dir.path(), 1)
        },
    );
    for r in &res {
        assert!(
            matches!(r, Err(RunError::Train(TrainError::InvalidArgument { arg: "sync-bn", reason }))
                if reason.contains("--uneven")),
            "{r:?}"
        );
    }
    let res = train(
        1,
        &TrainConfig {
            batch_size: 0,
            ..synthetic(dir.path(), 1)
        },
    );
    assert!(matches!(
        res[0],
        Err(RunError::Train(TrainError::InvalidArgument {
            arg: "batch size",
            ..
        }))
    ));
    let res = train(
        1,
        &TrainConfig {
            lr: f64::NAN,
            ..synthetic(dir.path(), 1)
        },
    );
    assert!(matches!(
        res[0],
        Err(RunError::Train(TrainError::InvalidArgument { .. }))
    ));
    let res = train(
        1,
        &TrainConfig {
            dataset: DatasetKind::Cifar10,
            data_dir: Some(dir.path().join("nothing-here")),
            ..synthetic(dir.path(), 1)
        },
    );
    let e = res[0].as_ref().expect_err("no CIFAR-10 here").to_string();
    assert!(e.contains("nothing-here"), "{e}");
}

#[test]
fn a_diverging_loss_stops_every_rank() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = TrainConfig {
        lr: 1e30,
        momentum: 0.0,
        ..synthetic(dir.path(), 2)
    };
    for r in train(2, &cfg) {
        match r {
            Err(RunError::Train(TrainError::NonFiniteLoss { losses, .. })) => {
                assert_eq!(losses.len(), 2)
            }
            other => panic!("expected a non-finite loss error, got {other:?}"),
        }
    }
}

/// Mixed precision with BatchNorm models: ResNet-18 (1 and 2 ranks, and with SyncBatchNorm on 2)
/// trains a few steps of Fashion-MNIST under `--precision bf16` — the
/// layers normalize bf16 activations in f32 — with finite losses, f32 running statistics, and
/// every rank agreeing on the result.
#[test]
fn bf16_trains_batch_norm_models() {
    use kolo_ddp::precision::Precision;
    if !Path::new("/usr/share/datasets/fashion-mnist").exists() {
        panic!("Fashion-MNIST is not installed (scripts/fetch-data.sh installs it)");
    }
    for (model, sync_bn, ranks) in [
        (ModelKind::Resnet18, false, 1),
        (ModelKind::Resnet18, false, 2),
        (ModelKind::Resnet18, true, 2),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = TrainConfig {
            model,
            dataset: DatasetKind::FashionMnist,
            train_limit: Some(32),
            test_limit: Some(16),
            batch_size: 16,
            precision: Precision::Bf16,
            sync_bn,
            ..synthetic(dir.path(), 1)
        };
        let case = format!("{model:?} sync_bn {sync_bn} on {ranks} rank(s)");
        let res = train(ranks, &cfg);
        let s = res[0].as_ref().unwrap_or_else(|e| panic!("{case}: {e}"));
        assert!(s.epochs[0].train_loss.is_finite(), "{case}: {:?}", s.epochs);
        // The running statistics the checkpoint holds are f32 and finite.
        let buffers: Vec<(String, Vec<f32>)> = final_model(dir.path(), 1)
            .into_iter()
            .filter(|(k, _)| kolo_nn::batch_norm::is_buffer_name(k))
            .map(|(k, t)| (k, t.to_vec1::<f32>().expect("f32 running statistics")))
            .collect();
        assert!(!buffers.is_empty(), "{case}: no running statistics saved");
        for (k, v) in &buffers {
            assert!(v.iter().all(|x| x.is_finite()), "{case}: {k} = {v:?}");
        }
        for r in &res[1..] {
            assert_eq!(
                r.as_ref().map(|s| s.final_accuracy).ok(),
                Some(s.final_accuracy),
                "{case}"
            );
        }
    }
}

/// `--precision bf16` computes in bf16 only where that is faster: on a CPU whose bf16 unit is
/// slower than its f32 FMAs (AVX512-BF16 without AMX on an Intel Xeon), or that has none (AVX2
/// only), it trains exactly as f32 does; where a bf16 unit pays its losses differ from f32's.
#[test]
fn bf16_computes_in_f32_exactly_where_no_bf16_unit_pays() {
    use kolo_ddp::precision::Precision;
    let losses = |precision| {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = TrainConfig {
            train_limit: Some(256),
            test_limit: Some(64),
            precision,
            ..synthetic(dir.path(), 1)
        };
        let s = train(1, &cfg).remove(0).expect("a run");
        (s.epochs[0].train_loss, s.epochs[0].test_loss)
    };
    let (f32_run, bf16_run) = (losses(Precision::F32), losses(Precision::Bf16));
    let in_f32 = kolo_nn::ops::bf16_computes_in_f32();
    eprintln!(
        "bf16 in f32 here: {in_f32} (no unit: {}, AVX512-BF16 {:?}); f32 {f32_run:?}, bf16 \
         {bf16_run:?}",
        kolo_nn::ops::bf16_without_a_unit(),
        kolo_nn::ops::avx512_bf16_speed()
    );
    assert_eq!(
        f32_run == bf16_run,
        in_f32,
        "f32 {f32_run:?}, bf16 {bf16_run:?}"
    );
}
