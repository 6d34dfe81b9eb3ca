//! What the user sees while a run trains: a progress bar on a terminal or the reference's plain
//! lines, and a JSON-lines metrics file.

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use tandem_strategy::{StepReport, TrainReport};

use crate::{output, RunError};

/// How often a run reports progress unless told otherwise (the reference's cadence).
pub const DEFAULT_LOG_EVERY: u64 = 1000;

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Display {
    /// A progress bar when stdout and stderr are terminals, plain lines otherwise.
    #[default]
    Auto,
    /// The reference's plain lines: `step N, loss = L (E examples/sec; S sec/batch)`.
    Plain,
}

/// Whether `display` shows a bar, given whether stdout and stderr are terminals. The bar and
/// the lines printed above it draw on stderr, and a bar hides itself where that is no
/// terminal: under `mpirun`, whose ranks' stdout is a terminal but stderr a pipe, a bar would
/// show nothing at all, so both must be.
fn shows_bar(display: Display, [stdout, stderr]: [bool; 2]) -> bool {
    display == Display::Auto && stdout && stderr
}

/// Totals of the segments before the current one, so rates and times run on across them.
#[derive(Default, Clone, Copy)]
struct Base {
    examples: u64,
    elapsed: Duration,
}

struct Last {
    step: u64,
    examples: u64,
    elapsed: Duration,
}

/// The metrics file. A failed write is reported once, naming the file, and metrics stop there:
/// losing the rest of a metrics file must not cost the training run.
struct Metrics {
    path: PathBuf,
    out: Option<BufWriter<File>>,
}

/// What the user sees of a training run: the bar or plain lines, and the metrics file.
pub struct Progress {
    log_every: u64,
    bar: Option<ProgressBar>,
    metrics: Option<Mutex<Metrics>>,
    base: Mutex<Base>,
    last: Mutex<Last>,
}

impl Progress {
    /// `first_step..end_step` is the run; `log_every` the plain-line and metrics interval;
    /// `metrics` a file that JSON-lines records are appended to.
    pub fn new(
        display: Display,
        log_every: u64,
        first_step: u64,
        end_step: u64,
        metrics: Option<&Path>,
    ) -> Result<Self, RunError> {
        let terminals = [
            std::io::stdout().is_terminal(),
            std::io::stderr().is_terminal(),
        ];
        let bar = shows_bar(display, terminals).then(|| {
            let bar = ProgressBar::new(end_step).with_position(first_step);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:30} step {pos}/{len} {msg} [{elapsed_precise}, ETA {eta}]",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar
        });
        let metrics = metrics
            .map(|path| {
                let file = File::options()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|source| RunError::Metrics {
                        path: path.to_owned(),
                        source,
                    })?;
                Ok::<_, RunError>(Mutex::new(Metrics {
                    path: path.to_owned(),
                    out: Some(BufWriter::new(file)),
                }))
            })
            .transpose()?;
        Ok(Self {
            log_every,
            bar,
            metrics,
            base: Mutex::new(Base::default()),
            last: Mutex::new(Last {
                step: first_step,
                examples: 0,
                elapsed: Duration::ZERO,
            }),
        })
    }

    /// How often the strategy should report: often enough for a smooth bar.
    pub fn report_every(&self) -> u64 {
        match (&self.bar, self.log_every) {
            (Some(_), 0) => 10,
            (Some(_), n) => gcd(n, 10),
            (None, n) => n,
        }
    }

    /// Prints a line without breaking the bar.
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => output::line(line),
        }
    }

    /// Folds a finished segment into the totals.
    pub fn end_segment(&self, report: &TrainReport) {
        let mut base = self.base.lock().unwrap_or_else(|p| p.into_inner());
        base.examples += report.examples;
        base.elapsed += report.elapsed;
    }

    /// Writes one metrics record (a JSON object on one line).
    pub fn record(&self, value: serde_json::Value) {
        let Some(metrics) = &self.metrics else {
            return;
        };
        let mut metrics = metrics.lock().unwrap_or_else(|p| p.into_inner());
        let Metrics { path, out } = &mut *metrics;
        if let Some(writer) = out {
            if let Err(e) = writeln!(writer, "{value}").and_then(|()| writer.flush()) {
                output::warn(format!(
                    "warning: cannot write the metrics file {}: {e}; training goes on without metrics",
                    path.display()
                ));
                *out = None;
            }
        }
    }

    /// Training time so far, over all segments.
    pub fn training_time(&self) -> Duration {
        self.base.lock().unwrap_or_else(|p| p.into_inner()).elapsed
    }

    /// Clears the bar, before the summary is printed.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Progress {
    /// Shows a strategy's report: the bar, a plain line every `log_every` steps, and a metrics
    /// record with it.
    pub fn on_log(&self, r: &StepReport) {
        let base = *self.base.lock().unwrap_or_else(|p| p.into_inner());
        let (examples, elapsed) = (base.examples + r.examples, base.elapsed + r.elapsed);
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if r.step <= last.step {
            return;
        }
        let seconds = elapsed.saturating_sub(last.elapsed).as_secs_f64().max(1e-9);
        let rate = examples.saturating_sub(last.examples) as f64 / seconds;
        let per_batch = seconds / (r.step - last.step) as f64;
        *last = Last {
            step: r.step,
            examples,
            elapsed,
        };
        drop(last);
        let staleness = r
            .staleness
            .map(|s| format!(", staleness {s}"))
            .unwrap_or_default();
        if let Some(bar) = &self.bar {
            bar.set_position(r.step);
            bar.set_message(format!(
                "loss {:.4}, {rate:.0} examples/sec{staleness}",
                r.loss
            ));
        }
        if self.log_every == 0 || !r.step.is_multiple_of(self.log_every) {
            return;
        }
        if self.bar.is_none() {
            output::line(format_args!(
                "step {}, loss = {:.4} ({rate:.0} examples/sec; {per_batch:.4} sec/batch{staleness})",
                r.step, r.loss
            ));
        }
        let record = json!({
            "kind": "step",
            "step": r.step,
            "wall_time": elapsed.as_secs_f64(),
            "loss": r.loss,
            "learning_rate": r.learning_rate,
            "examples_per_sec": rate,
            "staleness": r.staleness,
        });
        self.record(record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_is_chosen_only_where_both_streams_are_terminals() {
        // [stdout, stderr]; under mpirun: a terminal and a pipe.
        assert!(shows_bar(Display::Auto, [true, true]));
        for streams in [[true, false], [false, true], [false, false]] {
            assert!(!shows_bar(Display::Auto, streams), "{streams:?}");
        }
        assert!(!shows_bar(Display::Plain, [true, true]));
    }
}
