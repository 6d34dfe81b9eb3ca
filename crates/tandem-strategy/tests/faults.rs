//! Failures, stops and divergence, on a tiny least-squares model (the strategies know nothing
//! of MNIST).

mod common;

use common::{async_train, sync_train};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{batches, sgd, within, LeastSquares, Quirks, PLAIN_ASYNC};
use tandem_core::{ReplicaError, Slot, TrainState};
use tandem_optim::Sgd;
use tandem_pool::WorkerPool;
use tandem_strategy::{
    train, ConfigError, NoObserver, Observer, StepReport, Strategy, TrainError, Warmup,
};

#[derive(Clone, Copy)]
enum Fault {
    None,
    Error,
    Panic,
    NanLoss,
}

/// Fails the replica's `fail_at`-th gradient computation when told to.
struct Faulty {
    fault: Fault,
    fail_at: u64,
    /// When set, healthy replicas wait until the faulty one has failed (so it surely fails in
    /// the first run) and the faulty one sets it when it fails.
    gate: Option<Arc<AtomicBool>>,
}

/// How long a gated replica waits for the faulty one before failing: a test must fail, not
/// hang, when the fault never comes.
const GATE_LIMIT: Duration = Duration::from_secs(60);

impl Quirks for Faulty {
    fn before_gradients(&mut self, call: u64) -> Result<Option<f32>, ReplicaError> {
        // Healthy workers take a little time, so that a faulty one surely gets its turn.
        if matches!(self.fault, Fault::None) {
            std::thread::sleep(Duration::from_micros(100));
            if let Some(gate) = &self.gate {
                let started = Instant::now();
                while !gate.load(Ordering::SeqCst) {
                    if started.elapsed() > GATE_LIMIT {
                        return Err("the faulty replica never failed".into());
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        if call == self.fail_at {
            if let Some(gate) = &self.gate {
                gate.store(true, Ordering::SeqCst);
            }
            match self.fault {
                Fault::Error => return Err("injected fault".into()),
                Fault::Panic => panic!("injected fault"),
                Fault::NanLoss => return Ok(Some(f32::NAN)),
                Fault::None => {}
            }
        }
        Ok(None)
    }
}

/// `workers` replicas; worker `faulty` has `fault` on its `fail_at`-th step.
fn pool(
    workers: usize,
    faulty: usize,
    fault: Fault,
    fail_at: u64,
) -> WorkerPool<LeastSquares<Faulty>> {
    common::pool(workers, |worker| Faulty {
        fault: if worker == faulty { fault } else { Fault::None },
        fail_at,
        gate: None,
    })
}

/// The fit reached w = (2, 0), to within 0.05.
#[track_caller]
fn assert_fitted(state: &TrainState) {
    assert!(
        (state.params[0] - 2.0).abs() < 0.05 && state.params[1].abs() < 0.05,
        "{:?}",
        state.params
    );
}

#[test]
fn sync_stops_promptly_naming_the_failed_worker_and_step() {
    for fault in [Fault::Error, Fault::Panic] {
        let mut state = TrainState::new(vec![0.0; 2], &sgd());
        let before = state.clone();
        let started = Instant::now();
        let err = sync_train(
            &mut pool(3, 1, fault, 7),
            &mut state,
            &sgd(),
            &batches(),
            1_000_000,
            &NoObserver,
        )
        .unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the run did not stop promptly"
        );
        let TrainError::Worker(failure) = &err else {
            panic!("unexpected error {err}")
        };
        assert_eq!((failure.worker, failure.step), (1, Some(7)));
        assert!(
            err.to_string()
                .contains("worker 1 (cpu:1) failed at step 7"),
            "{err}"
        );
        assert!(err.to_string().contains("injected fault"), "{err}");
        assert_eq!(state, before, "a failed run leaves the state as it was");
    }
}

#[test]
fn async_carries_on_without_the_failed_worker_and_reports_it() {
    for fault in [Fault::Error, Fault::Panic] {
        let mut state = TrainState::new(vec![0.0; 2], &sgd());
        let report = async_train(
            &mut pool(2, 0, fault, 1),
            &mut state,
            &sgd(),
            &batches(),
            300,
            &NoObserver,
        )
        .unwrap();
        assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
        assert_eq!(report.failures[0].worker, 0);
        assert!(report.failures[0].to_string().contains("injected fault"));
        // Every ticket but the failed worker's lost one was applied by someone.
        assert_eq!((report.steps, state.step), (299, 299));
        assert_fitted(&state);
    }
}

#[test]
fn async_fails_when_every_worker_fails() {
    let mut state = TrainState::new(vec![0.0; 2], &sgd());
    let err = async_train(
        &mut pool(1, 0, Fault::Error, 3),
        &mut state,
        &sgd(),
        &batches(),
        100,
        &NoObserver,
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("worker 0 (cpu:0) failed at step"),
        "{err}"
    );
}

#[test]
fn a_non_finite_loss_stops_the_run_naming_the_step() {
    let mut state = TrainState::new(vec![0.0; 2], &sgd());
    let err = sync_train(
        &mut pool(2, 0, Fault::NanLoss, 4),
        &mut state,
        &sgd(),
        &batches(),
        100,
        &NoObserver,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("failed at step 4: the loss is NaN"),
        "{err}"
    );
    assert_eq!(state.step, 0);
}

/// Hears of every `every`-th step and asks to stop once `after` steps have been logged.
struct StopAfter {
    logged: AtomicU64,
    after: u64,
    every: u64,
}

impl Observer for StopAfter {
    fn log_every(&self) -> u64 {
        self.every
    }
    fn on_log(&self, _: &StepReport) {
        self.logged.fetch_add(1, Ordering::SeqCst);
    }
    fn should_stop(&self) -> bool {
        self.logged.load(Ordering::SeqCst) >= self.after
    }
}

#[test]
fn an_observer_stops_every_sync_worker_after_the_same_step() {
    let mut state = TrainState::new(vec![0.0; 2], &sgd());
    let observer = StopAfter {
        logged: AtomicU64::new(0),
        after: 3,
        every: 5,
    };
    let report = sync_train(
        &mut pool(3, 9, Fault::None, 0),
        &mut state,
        &sgd(),
        &batches(),
        1000,
        &observer,
    )
    .unwrap();
    assert!(report.stopped);
    // The third log happens after step 15; the stop is seen when step 16 ends.
    assert_eq!((report.steps, state.step), (16, 16));
}

#[test]
fn an_async_worker_that_failed_stays_out_of_later_segments() {
    let mut pool = pool(2, 0, Fault::Error, 3);
    let gate = Arc::new(AtomicBool::new(false));
    for replica in pool.replicas_mut() {
        replica.model.quirks.gate = Some(gate.clone());
    }
    let mut state = TrainState::new(vec![0.0; 2], &sgd());
    let mut reported = Vec::new();
    // Three segments on one pool, as the binary trains between checkpoints.
    for (segment, end) in [100, 200, 300].into_iter().enumerate() {
        let report =
            async_train(&mut pool, &mut state, &sgd(), &batches(), end, &NoObserver).unwrap();
        reported.extend(report.failures.iter().cloned());
        assert_eq!(
            pool.replicas()[0].calls,
            3,
            "segment {segment}: the failed replica was called again"
        );
        assert_eq!(state.step, if segment == 0 { 99 } else { end });
    }
    assert_eq!(reported.len(), 1, "reported once: {reported:?}");
    assert_eq!(reported[0].worker, 0);
    assert!(reported[0].step.is_some(), "{:?}", reported[0]);
    assert!(reported[0].to_string().contains("injected fault"));
    assert_eq!(pool.retired(), reported.as_slice());
    // Every update but the faulty worker's first two was the healthy worker's.
    assert_eq!(pool.replicas()[1].calls, 300 - 2);
    assert_fitted(&state);
}

/// A warm-up on one worker falls to the first worker still in the pool: here worker 1, since
/// worker 0 failed in an earlier segment (the warm-up waiting for worker 0 would never end).
#[test]
fn an_async_warmup_is_led_by_the_first_worker_not_retired() {
    let (pool, state) = within("async training, then a warm-up", || {
        let mut pool = pool(2, 0, Fault::Error, 1);
        let gate = Arc::new(AtomicBool::new(false));
        for replica in pool.replicas_mut() {
            replica.model.quirks.gate = Some(gate.clone());
        }
        let mut state = TrainState::new(vec![0.0; 2], &sgd());
        async_train(&mut pool, &mut state, &sgd(), &batches(), 3, &NoObserver).unwrap();
        assert_eq!(pool.retired().len(), 1);
        // 5 epochs of the fit's 70 examples in batches of 10: on one worker until step 35.
        let warmup = Strategy {
            warmup: Warmup::Epochs(5),
            ..PLAIN_ASYNC
        };
        train(
            warmup,
            &mut pool,
            &mut state,
            &sgd(),
            &batches(),
            300,
            &NoObserver,
        )
        .unwrap();
        (pool, state)
    });
    assert_eq!(state.step, 300);
    assert_eq!(
        pool.replicas()[0].calls,
        1,
        "the retired worker was called again"
    );
    assert_eq!(pool.replicas()[1].calls, 300);
    assert_fitted(&state);
}

#[test]
fn async_fails_at_once_when_every_worker_is_retired() {
    let mut pool = pool(1, 0, Fault::Error, 3);
    let mut state = TrainState::new(vec![0.0; 2], &sgd());
    let first =
        async_train(&mut pool, &mut state, &sgd(), &batches(), 100, &NoObserver).unwrap_err();
    let again =
        async_train(&mut pool, &mut state, &sgd(), &batches(), 200, &NoObserver).unwrap_err();
    assert_eq!(first.to_string(), again.to_string());
    assert!(
        again
            .to_string()
            .contains("worker 0 (cpu:0) failed at step 3"),
        "{again}"
    );
    assert_eq!(
        pool.replicas()[0].calls,
        3,
        "a retired worker is not started"
    );
}

#[test]
fn sync_refuses_a_pool_with_a_retired_worker() {
    let mut pool = pool(2, 1, Fault::Error, 1);
    let mut state = TrainState::new(vec![0.0; 2], &sgd());
    async_train(&mut pool, &mut state, &sgd(), &batches(), 50, &NoObserver).unwrap();
    assert_eq!(pool.retired().len(), 1);
    let before = state.clone();
    let err = sync_train(&mut pool, &mut state, &sgd(), &batches(), 100, &NoObserver).unwrap_err();
    assert!(err.to_string().contains("worker 1 (cpu:1) failed"), "{err}");
    assert_eq!(state, before);
}

#[test]
fn a_state_that_does_not_fit_the_model_is_refused_before_any_work() {
    // The fit has 2 parameters: too few or too many of either the parameters or their average.
    // Parameters that do not fit the model are a mismatch; an average that does not fit the
    // parameters is a state that is not the optimiser's.
    for (params, ema) in [(3, 2), (2, 3), (1, 2), (2, 1)] {
        let fresh = || TrainState {
            params: vec![0.0; params],
            slots: vec![Slot {
                name: Sgd::AVERAGE.into(),
                values: vec![0.0; ema],
            }],
            step: 0,
        };
        let mut state = fresh();
        let synchronous = sync_train(
            &mut pool(2, 9, Fault::None, 0),
            &mut state,
            &sgd(),
            &batches(),
            5,
            &NoObserver,
        );
        assert_eq!(state, fresh(), "the state was touched");
        let mut state = fresh();
        let asynchronous = async_train(
            &mut pool(2, 9, Fault::None, 0),
            &mut state,
            &sgd(),
            &batches(),
            5,
            &NoObserver,
        );
        for result in [synchronous.map(|_| ()), asynchronous.map(|_| ())] {
            let refused = if params != 2 {
                matches!(result, Err(TrainError::StateMismatch { model: 2, .. }))
            } else {
                matches!(
                    &result,
                    Err(TrainError::Config(ConfigError::OtherOptimizerState { .. }))
                )
            };
            assert!(refused, "{params} parameters, {ema} averages: {result:?}");
        }
        assert_eq!(state, fresh(), "the state was touched");
    }
}

#[test]
fn a_lone_sync_worker_stops_when_asked() {
    for (end, stopped) in [(5, true), (1, false)] {
        let mut state = TrainState::new(vec![0.0; 2], &sgd());
        let stop_now = StopAfter {
            logged: AtomicU64::new(0),
            after: 0,
            every: 0,
        };
        let report = sync_train(
            &mut pool(1, 9, Fault::None, 0),
            &mut state,
            &sgd(),
            &batches(),
            end,
            &stop_now,
        )
        .unwrap();
        assert_eq!((state.step, report.stopped), (1, stopped), "end {end}");
    }
}
