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
        let bar = shows_bar(display, terminals);
        Self::with_bar(bar, log_every, first_step, end_step, metrics)
    }

    /// [`new`](Self::new), with a bar or without.
    fn with_bar(
        bar: bool,
        log_every: u64,
        first_step: u64,
        end_step: u64,
        metrics: Option<&Path>,
    ) -> Result<Self, RunError> {
        let bar = bar.then(|| {
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
            "sec_per_batch": per_batch,
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

    #[test]
    fn the_strategy_reports_often_enough_for_the_bar() {
        let every = |bar, log_every| {
            let progress = Progress::with_bar(bar, log_every, 0, 100, None).unwrap();
            progress.report_every()
        };
        assert_eq!(every(false, 7), 7);
        assert_eq!(every(false, 0), 0);
        // With a bar: at least every 10 steps, and on every logged step.
        assert_eq!(every(true, 0), 10);
        assert_eq!(every(true, 1000), 10);
        assert_eq!(every(true, 25), 5);
        assert_eq!(every(true, 3), 1);
    }

    /// A report of step `step`, `examples` and `millis` into its segment.
    fn report(step: u64, examples: u64, millis: u64) -> StepReport {
        StepReport {
            step,
            loss: 0.25,
            learning_rate: 0.5,
            examples,
            elapsed: Duration::from_millis(millis),
            staleness: None,
        }
    }

    fn read_records(path: &Path) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(path).unwrap();
        text.lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    #[track_caller]
    fn assert_near(value: &serde_json::Value, expected: f64) {
        let value = value.as_f64().unwrap();
        assert!(
            (value - expected).abs() <= 1e-9 * expected.abs(),
            "{value} != {expected}"
        );
    }

    #[test]
    fn rates_and_times_run_on_across_segments_in_the_metrics() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let progress = Progress::with_bar(true, 2, 0, 100, Some(&path)).unwrap();
        // The first segment: 100 examples a step, 10 ms each.
        progress.on_log(&report(1, 100, 10));
        progress.on_log(&report(2, 200, 20));
        // A step reported again (a worker late to report) changes nothing.
        progress.on_log(&report(2, 250, 25));
        let segment = TrainReport {
            steps: 2,
            examples: 200,
            elapsed: Duration::from_millis(20),
            staleness: None,
            failures: Vec::new(),
            stopped: false,
        };
        progress.end_segment(&segment);
        assert_eq!(progress.training_time(), Duration::from_millis(20));
        // The second counts from zero again: 300 examples in 10 ms (over two steps), then 600
        // in 30 ms.
        progress.on_log(&report(4, 300, 10));
        progress.on_log(&report(5, 900, 40));
        progress.on_log(&report(6, 1000, 50));
        let bar = progress.bar.as_ref().unwrap();
        assert_eq!(bar.position(), 6);
        assert_eq!(bar.message(), "loss 0.2500, 10000 examples/sec");
        progress.finish();
        assert!(bar.is_finished());

        let records = read_records(&path);
        let steps: Vec<u64> = records
            .iter()
            .map(|r| r["step"].as_u64().unwrap())
            .collect();
        assert_eq!(steps, [2, 4, 6]);
        assert_near(&records[0]["wall_time"], 0.020);
        assert_near(&records[0]["examples_per_sec"], 100.0 / 0.010);
        assert_near(&records[0]["sec_per_batch"], 0.010);
        assert_near(&records[1]["wall_time"], 0.030);
        assert_near(&records[1]["examples_per_sec"], 300.0 / 0.010);
        assert_near(&records[1]["sec_per_batch"], 0.005);
        assert_near(&records[2]["wall_time"], 0.070);
        assert_near(&records[2]["examples_per_sec"], 100.0 / 0.010);
        assert_near(&records[2]["sec_per_batch"], 0.010);
        assert_eq!(records[2]["loss"], 0.25);
        assert_eq!(records[2]["learning_rate"], 0.5);
        assert_eq!(records[2]["kind"], "step");
        // Two steps later: 600 examples over 40 ms.
        progress.on_log(&report(8, 1600, 90));
        let last = read_records(&path).pop().unwrap();
        assert_near(&last["examples_per_sec"], 600.0 / 0.040);
        assert_near(&last["sec_per_batch"], 0.020);
    }

    #[test]
    fn a_metrics_file_that_fails_stops_metrics_not_the_run() {
        // Every write to /dev/full fails with "no space left on the device".
        let full = Path::new("/dev/full");
        let progress = Progress::with_bar(false, 1, 0, 10, Some(full)).unwrap();
        progress.record(json!({"kind": "step"}));
        let metrics = progress.metrics.as_ref().unwrap().lock().unwrap();
        assert!(metrics.out.is_none());
    }
}
