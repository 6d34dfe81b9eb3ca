//! One mode's curve for a report: a run trained in equal segments of its budget, its test
//! accuracy measured between them (outside the training time) and its loss averaged over each.

use tandem_core::TrainState;
use tandem_strategy::Epochs;

use super::{Point, Run};
use crate::{EvaluateError, Interrupt, Model, Plan, RecordedOptimizer, RunError, Trainer, Watch};

/// The global steps at which a run of `count` epochs stops to evaluate, `per_epoch` times an
/// epoch: equal shares of the budget of examples, each ending at the first step by which its
/// examples are drawn ([`Epochs::steps_for`]; the last at [`Epochs::end_step`]), without
/// repeats (a tiny budget may have fewer segments).
pub fn segment_ends(epochs: Epochs, count: u64, per_epoch: u64) -> Vec<u64> {
    let budget = count * epochs.examples();
    let segments = count * per_epoch;
    let end = epochs.steps_for(budget);
    let mut ends: Vec<u64> = (1..=segments)
        .map(|i| epochs.steps_for(budget * i / segments).min(end))
        .collect();
    ends.dedup();
    ends.retain(|&s| s > 0);
    ends
}

/// Trains `trainer`, a fresh run of `count` epochs, to its end in `per_epoch` segments an
/// epoch, measuring `accuracy` at its start and after every segment; prints a line for every
/// whole epoch. An interrupt is an error: a curve cut short is no comparison.
pub fn measure<M: Model, O: RecordedOptimizer>(
    trainer: &mut Trainer<M, O>,
    count: u64,
    per_epoch: u64,
    interrupt: &Interrupt,
    accuracy: &dyn Fn(&TrainState) -> Result<f64, EvaluateError>,
) -> Result<Run, RunError> {
    let config = trainer.config.clone();
    let epochs = trainer.epochs();
    let plan = Plan {
        evaluate_at: segment_ends(epochs, count, per_epoch),
        ..Plan::to(config.end_step)
    };
    out!(
        "{}: {} worker(s) [{}], batch {} per worker, {} steps ({} examples)",
        config.mode.name(),
        config.workers,
        trainer.devices(),
        config.batches.batch_size,
        config.end_step,
        config.end_step * config.examples_per_step()
    );
    let first =
        accuracy(&trainer.state).map_err(|source| RunError::Evaluate { step: 0, source })?;
    let mut points = vec![Point {
        seconds: 0.0,
        examples: 0,
        accuracy: first,
        loss: None,
    }];
    // About 20 loss samples per segment, but never a sum of squares over all parameters (the
    // L2 term of a logged loss, for which a GPU run waits for the device) more often than
    // every 10th step: it would slow training down. A short segment still logs once.
    let per_segment = config.end_step / plan.evaluate_at.len().max(1) as u64;
    let watch = Watch {
        log_every: (per_segment / 20).max(10).min(per_segment.max(1)),
        ..Watch::quiet(interrupt)
    };
    let summary = trainer.train(&plan, &watch, &mut |segment| {
        let point = Point {
            seconds: segment.totals.seconds,
            examples: segment.totals.examples,
            accuracy: accuracy(segment.state)?,
            loss: segment.mean_loss,
        };
        points.push(point);
        let evaluations = (points.len() - 1) as u64;
        if segment.state.step == plan.end_step || evaluations.is_multiple_of(per_epoch) {
            out!(
                "  epoch {:>5.2}: test accuracy {:.4}, loss {}, {:.1} s",
                epochs.epoch_at(segment.state.step),
                point.accuracy,
                point.loss.map_or("-".into(), |l| format!("{l:.4}")),
                point.seconds
            );
        }
        Ok(())
    })?;
    if summary.stopped {
        return Err(RunError::Interrupted {
            step: trainer.state.step,
        });
    }
    Ok(Run {
        mode: config.mode,
        points,
        staleness: summary.totals.staleness().map(|s| (s.mean, s.max)),
        failures: summary.totals.failures,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_split_the_budget_into_whole_steps() {
        assert_eq!(segment_ends(Epochs::new(1000, 100), 1, 4), [3, 5, 8, 10]);
        assert_eq!(segment_ends(Epochs::new(1000, 300), 1, 4), [1, 2, 3, 4]);
        // More segments than steps: no repeats, no empty segment.
        assert_eq!(segment_ends(Epochs::new(200, 100), 1, 5), [1, 2]);
        assert_eq!(segment_ends(Epochs::new(55_000, 200), 10, 5).len(), 50);
        // A non-dividing batch: whole epochs end where Epochs says they do.
        let odd = Epochs::new(55_000, 192);
        let ends = segment_ends(odd, 3, 2);
        assert_eq!(ends[1], odd.end_step(1).unwrap());
        assert_eq!(ends[3], odd.end_step(2).unwrap());
        assert_eq!(ends[5], odd.end_step(3).unwrap());
    }
}
