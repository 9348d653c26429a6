//! The per-epoch progress line shown by rank 0.

use std::fmt;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

/// How many plain lines a non-interactive epoch prints (one every 10 %).
const PLAIN_REPORTS: u64 = 10;

const TEMPLATE: &str = "{prefix:.bold} [{bar:30.cyan/blue}] {pos}/{len} \
                        loss {loss} | {sps} samples/s | ETA {eta}";
const FINISHED_TEMPLATE: &str = "{prefix:.bold} [{bar:30.green}] {pos}/{len} \
                                 loss {loss} | {sps} samples/s | done in {elapsed}";

/// A progress display for one epoch.
///
/// On a terminal it is an [`indicatif`] bar on stderr, redrawn at most about
/// 20 times a second. When stderr is not a terminal (logs of batch jobs) it
/// prints a plain line every ~10 % of the epoch instead, so the log still
/// shows progress without carriage-return noise.
///
/// [`update`](Progress::update) is meant to be called every step: it stores
/// two numbers in atomics and, at most every few milliseconds, lets indicatif
/// redraw; in plain mode it only compares the step with the next threshold.
pub struct Progress {
    mode: Mode,
    total: u64,
    epoch: u64,
    epochs: u64,
    start: Instant,
    last_loss: f64,
    last_step: u64,
    finished: bool,
}

enum Mode {
    Bar {
        bar: ProgressBar,
        loss_bits: Arc<AtomicU64>,
        sps_bits: Arc<AtomicU64>,
    },
    Plain {
        out: Box<dyn Write + Send>,
        next_report: u64,
    },
}

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Progress")
            .field(
                "mode",
                &match self.mode {
                    Mode::Bar { .. } => "bar",
                    Mode::Plain { .. } => "plain",
                },
            )
            .field("total", &self.total)
            .field("epoch", &self.epoch)
            .field("epochs", &self.epochs)
            .field("last_step", &self.last_step)
            .finish()
    }
}

impl Progress {
    /// Starts the display for epoch `epoch` of `epochs` (1-based, shown as
    /// `epoch k/K`), which has `total_steps_in_epoch` steps.
    ///
    /// Draws a bar on stderr if it is a terminal (and `TERM` is not `dumb`),
    /// otherwise prints plain lines to stderr.
    pub fn new(total_steps_in_epoch: u64, epoch: u64, epochs: u64) -> Progress {
        use kolo_core::settings::Env;
        let term = kolo_core::settings::ProcessEnv.lookup_os("TERM");
        let interactive = std::io::stderr().is_terminal() && term.is_none_or(|t| t != "dumb");
        if interactive {
            Self::with_bar(
                total_steps_in_epoch,
                epoch,
                epochs,
                ProgressDrawTarget::stderr(),
            )
        } else {
            Self::with_plain_writer(
                total_steps_in_epoch,
                epoch,
                epochs,
                Box::new(std::io::stderr()),
            )
        }
    }

    /// Like [`new`](Progress::new) but always prints plain lines (every ~10 %
    /// and at [`finish`](Progress::finish)) to `out`, e.g. a log file.
    pub fn with_plain_writer(
        total_steps_in_epoch: u64,
        epoch: u64,
        epochs: u64,
        out: Box<dyn Write + Send>,
    ) -> Progress {
        let mut p = Self::base(
            Mode::Plain {
                out,
                next_report: 0,
            },
            total_steps_in_epoch,
            epoch,
            epochs,
        );
        p.advance_plain_threshold();
        p
    }

    fn with_bar(total: u64, epoch: u64, epochs: u64, target: ProgressDrawTarget) -> Progress {
        let loss_bits = Arc::new(AtomicU64::new(f64::NAN.to_bits()));
        let sps_bits = Arc::new(AtomicU64::new(f64::NAN.to_bits()));
        let bar = ProgressBar::with_draw_target(Some(total), target);
        if let Some(style) = bar_style(TEMPLATE, &loss_bits, &sps_bits) {
            bar.set_style(style);
        }
        bar.set_prefix(format!("epoch {epoch}/{epochs}"));
        Self::base(
            Mode::Bar {
                bar,
                loss_bits,
                sps_bits,
            },
            total,
            epoch,
            epochs,
        )
    }

    fn base(mode: Mode, total: u64, epoch: u64, epochs: u64) -> Progress {
        Progress {
            mode,
            total,
            epoch,
            epochs,
            start: Instant::now(),
            last_loss: f64::NAN,
            last_step: 0,
            finished: false,
        }
    }

    /// Reports that `step` steps of this epoch are done (1 after the first
    /// step, `total_steps_in_epoch` after the last), with the latest loss and
    /// throughput.
    pub fn update(&mut self, step: u64, loss: f64, samples_per_sec: f64) {
        self.last_step = step;
        self.last_loss = loss;
        match &mut self.mode {
            Mode::Bar {
                bar,
                loss_bits,
                sps_bits,
            } => {
                loss_bits.store(loss.to_bits(), Ordering::Relaxed);
                sps_bits.store(samples_per_sec.to_bits(), Ordering::Relaxed);
                bar.set_position(step);
            }
            Mode::Plain { next_report, .. } => {
                if step >= *next_report && step < self.total {
                    self.plain_line(step, loss, samples_per_sec);
                    self.advance_plain_threshold();
                }
            }
        }
    }

    /// Ends the epoch's display: the bar is left in its final state, or a
    /// plain summary line is printed. Calling it again does nothing.
    pub fn finish(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        let elapsed = self.start.elapsed();
        match &mut self.mode {
            Mode::Bar {
                bar,
                loss_bits,
                sps_bits,
            } => {
                if let Some(style) = bar_style(FINISHED_TEMPLATE, loss_bits, sps_bits) {
                    bar.set_style(style);
                }
                bar.finish();
            }
            Mode::Plain { out, .. } => {
                let _ = writeln!(
                    out,
                    "epoch {}/{}: {} steps in {}, loss {}",
                    self.epoch,
                    self.epochs,
                    self.last_step,
                    Dur(elapsed),
                    Loss(self.last_loss),
                );
                let _ = out.flush();
            }
        }
    }

    fn plain_line(&mut self, step: u64, loss: f64, samples_per_sec: f64) {
        let elapsed = self.start.elapsed();
        let eta = if step > 0 && self.total > step {
            Some(elapsed.mul_f64((self.total - step) as f64 / step as f64))
        } else {
            None
        };
        let pct = (step * 100).checked_div(self.total).unwrap_or(0);
        if let Mode::Plain { out, .. } = &mut self.mode {
            let eta = eta.map_or_else(|| "-".to_string(), |d| Dur(d).to_string());
            let _ = writeln!(
                out,
                "epoch {}/{} step {}/{} ({pct:>3}%) loss {} | {} samples/s | ETA {eta}",
                self.epoch,
                self.epochs,
                step,
                self.total,
                Loss(loss),
                Rate(samples_per_sec),
            );
            let _ = out.flush();
        }
    }

    /// Moves the plain-mode threshold to the first 10 % mark after the
    /// current step.
    fn advance_plain_threshold(&mut self) {
        let (total, step) = (u128::from(self.total), u128::from(self.last_step));
        if let Mode::Plain { next_report, .. } = &mut self.mode {
            if total == 0 {
                *next_report = u64::MAX;
                return;
            }
            let reports = u128::from(PLAIN_REPORTS);
            let mut k = step * reports / total + 1;
            let mut mark = (total * k).div_ceil(reports);
            while mark <= step {
                k += 1;
                mark = (total * k).div_ceil(reports);
            }
            *next_report = u64::try_from(mark).unwrap_or(u64::MAX);
        }
    }
}

/// The bar style for `template`, with `{loss}` and `{sps}` read from the
/// atomics that [`Progress::update`] stores into. `None` if indicatif rejects
/// the (constant) template, in which case its default style is kept rather
/// than failing training.
fn bar_style(
    template: &str,
    loss_bits: &Arc<AtomicU64>,
    sps_bits: &Arc<AtomicU64>,
) -> Option<ProgressStyle> {
    let loss_key = Arc::clone(loss_bits);
    let sps_key = Arc::clone(sps_bits);
    let style = ProgressStyle::with_template(template).ok()?;
    Some(
        style
            .progress_chars("=> ")
            .with_key("loss", move |_: &ProgressState, w: &mut dyn fmt::Write| {
                let v = f64::from_bits(loss_key.load(Ordering::Relaxed));
                let _ = write!(w, "{}", Loss(v));
            })
            .with_key("sps", move |_: &ProgressState, w: &mut dyn fmt::Write| {
                let v = f64::from_bits(sps_key.load(Ordering::Relaxed));
                let _ = write!(w, "{}", Rate(v));
            }),
    )
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Mode::Bar { bar, .. } = &self.mode {
            if !self.finished {
                bar.abandon();
            }
        }
    }
}

struct Loss(f64);

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        if v.is_nan() {
            f.write_str("-")
        } else if v != 0.0 && (v.abs() >= 1e4 || v.abs() < 1e-3) {
            write!(f, "{v:.3e}")
        } else {
            write!(f, "{v:.4}")
        }
    }
}

struct Rate(f64);

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        if !v.is_finite() || v < 0.0 {
            f.write_str("-")
        } else if v >= 1e6 {
            write!(f, "{:.2}M", v / 1e6)
        } else if v >= 100.0 {
            write!(f, "{v:.0}")
        } else {
            write!(f, "{v:.1}")
        }
    }
}

struct Dur(Duration);

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0.as_secs();
        if s >= 3600 {
            write!(f, "{}h{:02}m", s / 3600, (s % 3600) / 60)
        } else if s >= 60 {
            write!(f, "{}m{:02}s", s / 60, s % 60)
        } else {
            write!(f, "{:.1}s", self.0.as_secs_f64())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn text(&self) -> String {
            let buf = self.0.lock().expect("lock");
            String::from_utf8_lossy(&buf).into_owned()
        }
    }

    #[test]
    fn plain_mode_prints_every_ten_percent() {
        let sink = Sink::default();
        let mut p = Progress::with_plain_writer(1000, 2, 5, Box::new(sink.clone()));
        for step in 1..=1000 {
            p.update(step, 0.5, 1234.0);
        }
        p.finish();
        p.finish();
        let text = sink.text();
        let lines: Vec<&str> = text.lines().collect();
        // 10 %, 20 %, ..., 90 % progress lines, then one summary line.
        assert_eq!(lines.len(), 10, "{text}");
        assert!(lines[0].starts_with("epoch 2/5 step 100/1000 ( 10%) loss 0.5000 | 1234 samples/s"));
        assert!(lines[8].contains("step 900/1000 ( 90%)"), "{}", lines[8]);
        assert!(
            lines[9].starts_with("epoch 2/5: 1000 steps in "),
            "{}",
            lines[9]
        );
    }

    #[test]
    fn plain_mode_small_and_sparse_epochs() {
        let sink = Sink::default();
        let mut p = Progress::with_plain_writer(3, 1, 1, Box::new(sink.clone()));
        for step in 1..=3 {
            p.update(step, 1.0, 10.0);
        }
        p.finish();
        // Steps 1 and 2 reported, step 3 is the summary.
        assert_eq!(sink.text().lines().count(), 3, "{}", sink.text());

        // Updates that jump over several marks print once per update.
        let sink = Sink::default();
        let mut p = Progress::with_plain_writer(100, 1, 1, Box::new(sink.clone()));
        p.update(55, 1.0, 10.0);
        p.update(56, 1.0, 10.0);
        p.update(60, 1.0, 10.0);
        assert_eq!(sink.text().lines().count(), 2, "{}", sink.text());
    }

    #[test]
    fn zero_total_does_not_panic() {
        let sink = Sink::default();
        let mut p = Progress::with_plain_writer(0, 1, 1, Box::new(sink.clone()));
        p.update(5, f64::NAN, f64::INFINITY);
        p.finish();
        assert!(sink.text().contains("5 steps"));
    }

    #[test]
    fn hidden_bar_updates_are_cheap() {
        let mut p = Progress::with_bar(1_000_000, 1, 1, ProgressDrawTarget::hidden());
        let t = Instant::now();
        for step in 1..=1_000_000 {
            p.update(step, 0.1, 100.0);
        }
        p.finish();
        // ~tens of ns per update; allow a generous bound for slow CI.
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }

    #[test]
    fn templates_are_valid() {
        let a = Arc::new(AtomicU64::new(0));
        assert!(bar_style(TEMPLATE, &a, &a).is_some());
        assert!(bar_style(FINISHED_TEMPLATE, &a, &a).is_some());
    }

    #[test]
    fn formatting() {
        assert_eq!(Loss(0.123456).to_string(), "0.1235");
        assert_eq!(Loss(f64::NAN).to_string(), "-");
        assert_eq!(Loss(1.5e-5).to_string(), "1.500e-5");
        assert_eq!(Rate(12.34).to_string(), "12.3");
        assert_eq!(Rate(5_432.1).to_string(), "5432");
        assert_eq!(Rate(2_500_000.0).to_string(), "2.50M");
        assert_eq!(Dur(Duration::from_secs(3725)).to_string(), "1h02m");
        assert_eq!(Dur(Duration::from_secs(65)).to_string(), "1m05s");
        assert_eq!(Dur(Duration::from_millis(2500)).to_string(), "2.5s");
    }
}
