//! The optimiser's recurrence, against a trajectory computed here in f64 from the documented
//! formulas alone: exponential learning-rate decay per epoch, L2 on the weights and never on the
//! biases (`ParamSpan::weight_decay`), the moving average with its warm-up
//! `min(ema_decay, (1 + step) / (10 + step))`, and the loss each step reports (the batch's
//! mean data loss plus `weight_decay / 2 * sum w^2`), for sync with 1 and 2 workers and async
//! with 1 worker, over a few dozen steps in two segments (a resumed run continues the same
//! schedules).
//!
//! The model is a linear least-squares fit `y = w . x + b` on 40 fixed examples; the replica
//! computes in f32, the reference in f64, so they agree to f32 rounding and no closer.

mod common;

use common::{async_train, sync_train};

use std::sync::Mutex;

use common::{ema, pool_of, weights_and_bias, within, Loss, Model, TestReplica};
use tandem_core::TrainState;
use tandem_optim::Sgd;
use tandem_pool::WorkerPool;
use tandem_strategy::{Batches, EpochOrder, Observer, StepReport};

const EXAMPLES: usize = 40;
const FEATURES: usize = 3;

/// Example `i`: features in [-0.5, 0.5) and a target from a linear rule with a bias of 0.8
/// (which L2 on the bias would visibly pull towards 0) plus a little noise.
fn example(i: usize) -> ([f32; FEATURES], f32) {
    let x = [
        ((i * 7 + 1) % 11) as f32 / 11.0 - 0.5,
        ((i * 5 + 3) % 13) as f32 / 13.0 - 0.5,
        ((i * 3 + 2) % 7) as f32 / 7.0 - 0.5,
    ];
    let y = 1.5 * x[0] - 2.0 * x[1] + 0.75 * x[2] + 0.8 + ((i * 11) % 5) as f32 / 50.0;
    (x, y)
}

/// `w` then `b`.
const INITIAL: [f32; FEATURES + 1] = [0.5, -0.3, 0.9, -0.4];

/// Loss `0.5 * mean (w . x + b - y)^2` and its gradients, in f32.
struct Linear;

impl Model for Linear {
    fn gradients(&mut self, _call: u64, batch: &[u32], p: &[f32], grads: &mut [f32]) -> Loss {
        let n = batch.len() as f32;
        let (mut loss, mut g) = (0.0f32, [0.0f32; FEATURES + 1]);
        for &i in batch {
            let (x, y) = example(i as usize);
            let err = p[0] * x[0] + p[1] * x[1] + p[2] * x[2] + p[3] - y;
            loss += 0.5 * err * err / n;
            for j in 0..FEATURES {
                g[j] += err * x[j] / n;
            }
            g[FEATURES] += err / n;
        }
        grads.copy_from_slice(&g);
        Ok(loss)
    }
}

fn pool(workers: usize) -> WorkerPool<TestReplica<Linear>> {
    let layout = weights_and_bias(vec![FEATURES], 1);
    pool_of(workers, layout, EXAMPLES, |_| Linear)
}

fn sgd(ema_decay: f32) -> Sgd {
    Sgd {
        learning_rate: 0.3,
        lr_decay: 0.6,
        weight_decay: 0.05,
        ema_decay,
    }
}

const BATCHES: Batches = Batches {
    batch_size: 4,
    seed: 11,
};

/// Collects every report.
#[derive(Default)]
struct Reports(Mutex<Vec<StepReport>>);

impl Observer for Reports {
    fn log_every(&self) -> u64 {
        1
    }
    fn on_log(&self, report: &StepReport) {
        self.0.lock().unwrap().push(report.clone());
    }
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    Sync { workers: usize },
    Async,
}

/// One step of the reference: what a report says, and the state after it.
struct RefStep {
    loss: f64,
    learning_rate: f64,
    params: [f64; FEATURES + 1],
    ema: [f64; FEATURES + 1],
}

/// The trajectory of `steps` steps from [`INITIAL`], in f64. Each step's global batch is
/// stream positions `step * G .. (step + 1) * G` of the data order, `G` the examples per
/// update (sync: its workers' batches side by side; async: one worker's batch).
fn reference(sgd: &Sgd, examples_per_update: usize, steps: u64) -> Vec<RefStep> {
    let steps_per_epoch = EXAMPLES as f64 / examples_per_update as f64;
    let mut order = EpochOrder::new(BATCHES.seed, EXAMPLES);
    let mut batch = vec![0u32; examples_per_update];
    let mut p = INITIAL.map(f64::from);
    let mut ema = p;
    let wd = f64::from(sgd.weight_decay);
    let mut out = Vec::new();
    for step in 0..steps {
        order.fill(step * examples_per_update as u64, &mut batch);
        let n = batch.len() as f64;
        let (mut data_loss, mut g) = (0.0f64, [0.0f64; FEATURES + 1]);
        for &i in &batch {
            let (x, y) = example(i as usize);
            let x = x.map(f64::from);
            let err = p[0] * x[0] + p[1] * x[1] + p[2] * x[2] + p[3] - f64::from(y);
            data_loss += 0.5 * err * err / n;
            for j in 0..FEATURES {
                g[j] += err * x[j] / n;
            }
            g[FEATURES] += err / n;
        }
        let lr = f64::from(sgd.learning_rate)
            * f64::from(sgd.lr_decay).powf(step as f64 / steps_per_epoch);
        // L2 on the weights only.
        for j in 0..FEATURES {
            p[j] -= lr * (g[j] + wd * p[j]);
        }
        p[FEATURES] -= lr * g[FEATURES];
        let warmup = (1.0 + step as f64) / (10.0 + step as f64);
        let d = warmup.min(f64::from(sgd.ema_decay));
        for j in 0..=FEATURES {
            ema[j] = d * ema[j] + (1.0 - d) * p[j];
        }
        // The report follows the update: its L2 term is of the weights the step left.
        let l2 = wd / 2.0 * p[..FEATURES].iter().map(|w| w * w).sum::<f64>();
        out.push(RefStep {
            loss: data_loss + l2,
            learning_rate: lr,
            params: p,
            ema,
        });
    }
    out
}

/// `found` agrees with `expected` to f32 rounding accumulated over a few dozen steps.
fn close(found: f32, expected: f64) -> bool {
    (f64::from(found) - expected).abs() <= 2e-6 * (1.0 + expected.abs())
}

fn check_state(what: &str, state: &TrainState, expected: &RefStep) {
    for (name, found, exp) in [
        ("params", state.params.as_slice(), &expected.params),
        ("ema", ema(state), &expected.ema),
    ] {
        for (j, (&f, &e)) in found.iter().zip(exp).enumerate() {
            assert!(
                close(f, e),
                "{what}: {name}[{j}] is {f}, the recurrence gives {e}"
            );
        }
    }
}

/// Trains `mode` to step `split`, then on to `steps`, and checks the state at both ends and
/// every step's report against the reference.
fn check(mode: Mode, ema_decay: f32, split: u64, steps: u64) {
    let sgd = sgd(ema_decay);
    let (examples_per_update, workers) = match mode {
        Mode::Sync { workers } => (workers * BATCHES.batch_size, workers),
        Mode::Async => (BATCHES.batch_size, 1),
    };
    let what = format!("{mode:?}, ema_decay {ema_decay}");
    let expected = reference(&sgd, examples_per_update, steps);
    let (middle, last, reports) = within(&what, move || {
        let mut pool = pool(workers);
        let mut state = TrainState::new(INITIAL.to_vec(), &sgd);
        let reports = Reports::default();
        let mut segment = |state: &mut TrainState, end: u64| match mode {
            Mode::Sync { .. } => {
                sync_train(&mut pool, state, &sgd, &BATCHES, end, &reports).unwrap()
            }
            Mode::Async => async_train(&mut pool, state, &sgd, &BATCHES, end, &reports).unwrap(),
        };
        segment(&mut state, split);
        let middle = state.clone();
        segment(&mut state, steps);
        (middle, state, reports.0.into_inner().unwrap())
    });
    assert_eq!((middle.step, last.step), (split, steps), "{what}");
    check_state(
        &format!("{what}, after step {split}"),
        &middle,
        &expected[split as usize - 1],
    );
    check_state(
        &format!("{what}, after step {steps}"),
        &last,
        &expected[steps as usize - 1],
    );
    let steps_reported: Vec<u64> = reports.iter().map(|r| r.step).collect();
    assert_eq!(steps_reported, (1..=steps).collect::<Vec<_>>(), "{what}");
    for report in &reports {
        let exp = &expected[report.step as usize - 1];
        for (name, found, expected, by) in [
            (
                "learning rate",
                report.learning_rate,
                exp.learning_rate,
                "the schedule gives",
            ),
            (
                "loss",
                report.loss,
                exp.loss,
                "the batch's data loss plus the L2 term is",
            ),
        ] {
            assert!(
                close(found, expected),
                "{what}: step {} reports {name} {found}, {by} {expected}",
                report.step
            );
        }
    }
}

/// The premise: over these steps the learning rate decays several-fold, the L2 term and its
/// pull are far above the tolerance, and the warm-up keeps the average far from where a fixed
/// decay would leave it.
#[test]
fn the_reference_is_sensitive_to_what_it_checks() {
    let sgd = sgd(0.99);
    let reference = reference(&sgd, 4, 36);
    let last = reference.last().unwrap();
    assert!(last.learning_rate < 0.3 * f64::from(sgd.learning_rate));
    let l2 = last.params[..FEATURES].iter().map(|w| w * w).sum::<f64>() * 0.025;
    assert!(l2 > 1e-2, "L2 term {l2}");
    // The average has followed the parameters away from the start: the warm-up's decay is 0.1
    // at step 0, so a fixed 0.99 would have left it within a third of the way.
    let moved = |j: usize| (last.ema[j] - f64::from(INITIAL[j])).abs();
    let travelled = |j: usize| (last.params[j] - f64::from(INITIAL[j])).abs();
    assert!((0..=FEATURES).any(|j| moved(j) > 0.5 * travelled(j) && travelled(j) > 0.3));
}

#[test]
fn sync_with_one_worker_follows_the_recurrence() {
    check(Mode::Sync { workers: 1 }, 0.99, 13, 36);
    check(Mode::Sync { workers: 1 }, 0.6, 13, 36);
}

#[test]
fn sync_with_two_workers_follows_the_recurrence() {
    check(Mode::Sync { workers: 2 }, 0.99, 13, 36);
    check(Mode::Sync { workers: 2 }, 0.6, 13, 36);
}

#[test]
fn async_with_one_worker_follows_the_recurrence() {
    check(Mode::Async, 0.99, 13, 36);
    check(Mode::Async, 0.6, 13, 36);
}
