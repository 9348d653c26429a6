//! The learning rate step by step: the linear scaling rule's warm-up (Goyal et al.), then a decay
//! as PyTorch's `lr_scheduler` has them (`CosineAnnealingLR`, `StepLR`). Set on a
//! [`DistributedOptimizer`](crate::distributed::DistributedOptimizer) with `with_schedule`, it is
//! a function of the optimizer's step count alone, which every rank shares and a checkpoint
//! restores: every rank steps with the same rate, and a resumed run goes on where it stopped.

/// The learning rate at every optimizer step: from `base_lr` up to `base_lr · scale` over
/// `warmup_steps` (linear; `scale` 1 and no warm-up hold `base_lr`), then [`LrDecay`] from there.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrSchedule {
    /// Learning rate of one worker.
    pub base_lr: f64,
    /// Factor reached after warm-up (the number of workers for the linear scaling rule; 1
    /// disables scaling).
    pub scale: f64,
    /// Steps of linear warm-up (0: scaled from the first step).
    pub warmup_steps: u64,
    /// What the rate does after warm-up.
    pub decay: LrDecay,
}

/// The rate after warm-up, as a function of the steps since warm-up ended.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum LrDecay {
    /// It stays at its peak.
    #[default]
    Constant,
    /// Half a cosine from the peak down to `min_lr` over `steps` steps, then `min_lr`
    /// (PyTorch's `CosineAnnealingLR` with `T_max = steps`, `eta_min = min_lr`).
    Cosine {
        /// Steps of the descent (the run's steps after warm-up).
        steps: u64,
        /// The rate at the end.
        min_lr: f64,
    },
    /// The peak times `gamma` after every `every` steps (PyTorch's `StepLR`).
    Step {
        /// Steps between decays (at least 1).
        every: u64,
        /// Factor of each decay.
        gamma: f64,
    },
}

impl LrSchedule {
    /// `base_lr` at every step: no scaling, no warm-up, no decay.
    pub fn constant(base_lr: f64) -> LrSchedule {
        LrSchedule {
            base_lr,
            scale: 1.0,
            warmup_steps: 0,
            decay: LrDecay::Constant,
        }
    }

    /// The same schedule with `decay` after warm-up.
    pub fn with_decay(self, decay: LrDecay) -> LrSchedule {
        LrSchedule { decay, ..self }
    }

    /// The learning rate at optimizer step `step` (0-based).
    pub fn lr(&self, step: u64) -> f64 {
        let progress = if self.warmup_steps == 0 {
            1.0
        } else {
            (step as f64 / self.warmup_steps as f64).min(1.0)
        };
        let peak = self.base_lr * (1.0 + (self.scale - 1.0) * progress);
        let after = step.saturating_sub(self.warmup_steps);
        match self.decay {
            LrDecay::Constant => peak,
            LrDecay::Cosine { steps, min_lr } => {
                let t = if steps == 0 {
                    1.0
                } else {
                    (after as f64 / steps as f64).min(1.0)
                };
                min_lr + (peak - min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
            }
            LrDecay::Step { every, gamma } => {
                // An `i32` exponent: past 2³¹ decays the rate is 0 or ∞ whatever the exponent.
                let decays = (after / every.max(1)).min(i32::MAX as u64) as i32;
                peak * gamma.powi(decays)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    #[test]
    fn warm_up_then_cosine_down_to_the_minimum() {
        let s = LrSchedule {
            base_lr: 0.1,
            scale: 4.0,
            warmup_steps: 10,
            decay: LrDecay::Cosine {
                steps: 100,
                min_lr: 0.001,
            },
        };
        assert!(close(s.lr(0), 0.1));
        assert!(close(s.lr(5), 0.25));
        assert!(close(s.lr(10), 0.4), "the peak as warm-up ends");
        assert!(
            close(s.lr(60), 0.001 + (0.4 - 0.001) / 2.0),
            "half way down"
        );
        assert!(close(s.lr(110), 0.001));
        assert!(close(s.lr(1_000), 0.001), "stays at the minimum");
        let falling: Vec<f64> = (10..=110).map(|t| s.lr(t)).collect();
        assert!(falling.windows(2).all(|w| w[1] < w[0]), "{falling:?}");
    }

    #[test]
    fn warmup_reaches_the_scaled_rate_and_stays() {
        let s = LrSchedule {
            base_lr: 0.1,
            scale: 4.0,
            warmup_steps: 10,
            decay: LrDecay::Constant,
        };
        assert!(close(s.lr(0), 0.1));
        assert!(close(s.lr(5), 0.25));
        assert!(close(s.lr(10), 0.4));
        assert!(close(s.lr(1000), 0.4));
        assert!(close(LrSchedule::constant(0.1).lr(7), 0.1));
    }

    #[test]
    fn step_decay_and_constant() {
        let s = LrSchedule::constant(0.5).with_decay(LrDecay::Step {
            every: 3,
            gamma: 0.1,
        });
        let lrs: Vec<f64> = (0..7).map(|t| s.lr(t)).collect();
        let want = [0.5, 0.5, 0.5, 0.05, 0.05, 0.05, 0.005];
        assert!(lrs.iter().zip(want).all(|(&a, b)| close(a, b)), "{lrs:?}");
        assert!(close(LrSchedule::constant(0.5).lr(1 << 40), 0.5));
        let every_zero = LrSchedule::constant(1.0).with_decay(LrDecay::Step {
            every: 0,
            gamma: 0.5,
        });
        assert!(
            close(every_zero.lr(2), 0.25),
            "every 0 counts as every step"
        );
        assert_eq!(
            LrSchedule::constant(1.0)
                .with_decay(LrDecay::Step {
                    every: 1,
                    gamma: 0.5
                })
                .lr(u64::MAX),
            0.0
        );
    }
}
