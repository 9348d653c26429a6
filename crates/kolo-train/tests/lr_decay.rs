//! `kolo train --lr-decay`: the rate each epoch ends with, from metrics.csv — StepLR's exact
//! steps, a cosine falling to `min_lr` at the end of the run (after the warm-up of the linear
//! scaling rule) — and the decay settings it refuses.

mod common;

use std::time::Duration;

use common::synthetic;
use kolo::Config;
use kolo_ddp::TrainError;
use kolo_train::trainer::{run, LrDecayKind, TrainConfig};
use kolo_train::RunError;

/// Trains `cfg` on `n` thread ranks; rank 0's per-epoch (step, learning rate) from metrics.csv.
fn rates(n: usize, cfg: &TrainConfig) -> Result<Vec<(u64, f64)>, RunError> {
    let res = kolo::run_local(
        n,
        Config::default().with_timeout(Duration::from_secs(120)),
        |comm| run(&comm, cfg),
    );
    for r in res {
        r.expect("rank thread panicked")?;
    }
    let out = cfg.out.as_ref().expect("out");
    let csv = std::fs::read_to_string(out.join("metrics.csv")).expect("metrics.csv");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).expect(name);
    let (step, lr) = (col("step"), col("learning_rate"));
    Ok(lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[step].parse().expect("step"), f[lr].parse().expect("lr"))
        })
        .collect())
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1e-3)
}

#[test]
fn step_decay_multiplies_the_rate_every_k_epochs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = TrainConfig {
        lr_decay: LrDecayKind::Step,
        lr_step_epochs: 1.0,
        lr_gamma: 0.5,
        ..synthetic(dir.path(), 3)
    };
    let got = rates(2, &cfg).expect("trains");
    let lrs: Vec<f64> = got.iter().map(|&(_, lr)| lr).collect();
    // Each epoch's last step runs at the rate of that epoch.
    let want = [0.05, 0.025, 0.0125];
    assert!(
        lrs.len() == 3 && lrs.iter().zip(want).all(|(&a, b)| close(a, b)),
        "{got:?}"
    );
}

#[test]
fn cosine_after_the_scaled_warm_up_ends_at_the_minimum() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = TrainConfig {
        lr_decay: LrDecayKind::Cosine,
        min_lr: 0.001,
        scale_lr: true,
        warmup_epochs: 1.0,
        ..synthetic(dir.path(), 4)
    };
    let got = rates(2, &cfg).expect("trains");
    let (steps, lrs): (Vec<u64>, Vec<f64>) = got.iter().copied().unzip();
    let per_epoch = steps[0] as f64;
    let total = steps[3] as f64;
    // The last step of warm-up runs at 0.05 · (1 + (steps − 1) / steps): just under 2 × 0.05.
    let warm = 0.05 * (1.0 + (per_epoch - 1.0) / per_epoch);
    assert!(close(lrs[0], warm), "{got:?}");
    // Then down from 0.1 over the three epochs after warm-up, the last step one short of the end.
    let cosine = |step: f64| {
        let t = (step - per_epoch) / (total - per_epoch);
        0.001 + (0.1 - 0.001) * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
    };
    for e in 1..4 {
        assert!(
            close(lrs[e], cosine(steps[e] as f64 - 1.0)),
            "epoch {e}: {got:?}"
        );
    }
    assert!(
        lrs[3] < 0.002 && lrs[1] > lrs[2] && lrs[2] > lrs[3],
        "{got:?}"
    );
}

#[test]
fn bad_decay_settings_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            TrainConfig {
                lr_decay: LrDecayKind::Cosine,
                min_lr: 0.5,
                ..synthetic(dir.path(), 1)
            },
            "min-lr",
        ),
        (
            TrainConfig {
                lr_decay: LrDecayKind::Step,
                lr_gamma: 0.0,
                ..synthetic(dir.path(), 1)
            },
            "lr-gamma",
        ),
        (
            TrainConfig {
                lr_decay: LrDecayKind::Step,
                lr_step_epochs: f64::NAN,
                ..synthetic(dir.path(), 1)
            },
            "lr-step-epochs",
        ),
    ];
    for (cfg, want) in cases {
        match rates(1, &cfg) {
            Err(RunError::Train(TrainError::InvalidArgument { arg, .. })) if arg == want => {}
            other => panic!("{want}: {other:?}"),
        }
    }
    assert_eq!("step".parse(), Ok(LrDecayKind::Step));
    let unknown = "linear".parse::<LrDecayKind>().expect_err("unknown");
    assert!(
        unknown.contains("expected constant, cosine or step"),
        "{unknown}"
    );
}
