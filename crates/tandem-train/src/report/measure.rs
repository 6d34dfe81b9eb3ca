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

/// How often a measured run of `end_step` steps in `segments` segments logs its loss: about
/// 20 samples a segment, but never a sum of squares over all parameters (the L2 term of a
/// logged loss, for which a GPU run waits for the device) more often than every 10th step: it
/// would slow training down. A short segment still logs once.
fn log_every(end_step: u64, segments: usize) -> u64 {
    let per_segment = end_step / segments.max(1) as u64;
    (per_segment / 20).max(10).min(per_segment.max(1))
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
    let watch = Watch {
        log_every: log_every(config.end_step, plan.evaluate_at.len()),
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
    use tandem_optim::Sgd;
    use tandem_pool::DeviceSpec;
    use tandem_strategy::Mode;

    use super::*;
    use crate::scalar::{fresh, ScalarModel, SCALAR};
    use crate::Setup;

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

    #[test]
    fn segments_never_end_at_step_0() {
        // A first share of no whole example: 3 examples in 5 segments.
        assert_eq!(segment_ends(Epochs::new(3, 1), 1, 5), [1, 2, 3]);
    }

    #[test]
    fn losses_are_logged_about_20_times_a_segment_at_most_every_10th_step() {
        assert_eq!(log_every(10_000, 10), 50);
        assert_eq!(log_every(1_000, 10), 10);
        assert_eq!(log_every(50, 10), 5);
        assert_eq!(log_every(5, 10), 1);
        assert_eq!(log_every(400, 0), 20);
    }

    fn scalar_trainer(steps: u64) -> Trainer<ScalarModel, Sgd> {
        let setup = Setup::new(DeviceSpec::Cpu(1));
        Trainer::open(SCALAR, fresh(Mode::Sync, steps), &setup, None).unwrap()
    }

    /// One epoch of the test model (40 examples, 5 a step) in 4 segments: a point at the start
    /// and after each, the accuracy measured on each segment's end state.
    #[test]
    fn a_measured_run_has_a_point_per_segment() {
        let mut trainer = scalar_trainer(8);
        let accuracy = |state: &TrainState| Ok(state.step as f64 / 10.0);
        let run = measure(&mut trainer, 1, 4, &Interrupt::new(), &accuracy).unwrap();
        let seen = |f: fn(&Point) -> f64| run.points.iter().map(f).collect::<Vec<_>>();
        assert_eq!(seen(|p| p.accuracy), [0.0, 0.2, 0.4, 0.6, 0.8]);
        assert_eq!(seen(|p| p.examples as f64), [0.0, 10.0, 20.0, 30.0, 40.0]);
        assert_eq!(run.points[0].loss, None);
        assert!(run.points[1..].iter().all(|p| p.loss.is_some()));
        assert_eq!(run.mode, Mode::Sync);

        let mut trainer = scalar_trainer(8);
        let interrupt = Interrupt::new();
        interrupt.request();
        let cut = measure(&mut trainer, 1, 4, &interrupt, &accuracy);
        assert!(
            matches!(cut, Err(RunError::Interrupted { step: 1 })),
            "{cut:?}"
        );
    }
}
