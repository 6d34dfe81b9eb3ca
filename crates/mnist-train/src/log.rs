use std::sync::Mutex;
use std::time::Duration;

use tandem_strategy::{Observer, StepReport};

/// Prints the book's progress line, `step N, loss = L (E examples/sec; S sec/batch)`, with the
/// rate measured since the previous line.
pub struct ProgressLog {
    last: Mutex<(u64, u64, Duration)>,
}

impl ProgressLog {
    pub fn new(start_step: u64) -> Self {
        Self {
            last: Mutex::new((start_step, 0, Duration::ZERO)),
        }
    }
}

impl Observer for ProgressLog {
    fn on_log(&self, r: &StepReport) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let (step0, examples0, elapsed0) = *last;
        let seconds = (r.elapsed - elapsed0.min(r.elapsed))
            .as_secs_f64()
            .max(1e-9);
        let rate = r.examples.saturating_sub(examples0) as f64 / seconds;
        let per_batch = seconds / r.step.saturating_sub(step0).max(1) as f64;
        let staleness = r
            .staleness
            .map(|s| format!(", staleness {s}"))
            .unwrap_or_default();
        println!(
            "step {}, loss = {:.4} ({:.0} examples/sec; {:.4} sec/batch{staleness})",
            r.step, r.loss, rate, per_batch
        );
        *last = (r.step, r.examples, r.elapsed);
    }
}
