//! Asynchronous training, exactly: with a constant gradient, a constant learning rate that is
//! a power of two and no L2, every update moves every parameter by the same exactly
//! representable amount, whatever the order in which updates reach the shards. So after N
//! updates every parameter must have moved by exactly N steps: one update lost on some shard
//! (a worker that skips part of the store) or applied twice shows as a parameter off by one
//! step. The model spans many store shards (16K values each) and several workers run at once.
//! A non-finite loss must never reach the stored parameters.

use std::sync::mpsc;
use std::time::Duration;

use tandem_pool::{Device, ParamSpan, Replica, ReplicaError, WorkerPool};
use tandem_strategy::{asynchronous, sync, Hyper, NoObserver, TrainError, TrainState};

/// A run that takes longer than this hangs: the test fails rather than waits forever.
const DEADLINE: Duration = Duration::from_secs(120);

/// The learning rate, and so the step of every parameter: 2^-10.
const LR: f32 = 1.0 / 1024.0;

/// Runs `f` on its own thread and fails the test, naming `what`, if it has not returned within
/// [`DEADLINE`] (or if it panicked).
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(value) => value,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what} did not finish within {DEADLINE:?}: a worker hangs")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked (see above)"),
    }
}

/// About 5 shards of weights and one of biases: 7 shards in all, so that workers start their
/// updates at different shards.
fn layout() -> Vec<ParamSpan> {
    vec![
        ParamSpan {
            name: "w".into(),
            shape: vec![5, 16 * 1024 + 3],
            weight_decay: true,
        },
        ParamSpan {
            name: "b".into(),
            shape: vec![37],
            weight_decay: false,
        },
    ]
}

fn num_params() -> usize {
    layout().iter().map(ParamSpan::len).sum()
}

/// Multiples of 1/8 in [-4, 4): minus any whole number of steps of 2^-10 stays exact.
fn initial_state() -> TrainState {
    TrainState::new(
        (0..num_params())
            .map(|i| ((i * 37) % 64) as f32 / 8.0 - 4.0)
            .collect(),
    )
}

/// Gradient 1 everywhere and a constant loss; `poison_at`: on that gradient computation (counted
/// from 1) the loss and every gradient are NaN, as after a divergence.
struct Constant {
    layout: Vec<ParamSpan>,
    grads: Vec<f32>,
    calls: u64,
    poison_at: Option<u64>,
    worker: usize,
}

impl Replica for Constant {
    fn layout(&self) -> &[ParamSpan] {
        &self.layout
    }
    fn set_params(&mut self, fill: &mut dyn FnMut(&mut [f32])) -> Result<(), ReplicaError> {
        let mut params = vec![0.0; self.grads.len()];
        fill(&mut params);
        Ok(())
    }
    fn compute_gradients(&mut self, _batch: &[u32]) -> Result<f32, ReplicaError> {
        self.calls += 1;
        // A little time that differs from worker to worker and call to call, so that updates
        // interleave differently.
        let wait = (self.calls * 7 + self.worker as u64 * 13) % 5;
        std::thread::sleep(Duration::from_micros(50 * wait));
        if self.poison_at == Some(self.calls) {
            self.grads.fill(f32::NAN);
            return Ok(f32::NAN);
        }
        self.grads.fill(1.0);
        Ok(0.5)
    }
    fn read_gradients(&mut self, read: &mut dyn FnMut(&[f32])) -> Result<(), ReplicaError> {
        read(&self.grads);
        Ok(())
    }
    fn training_examples(&self) -> usize {
        1000
    }
}

/// `workers` replicas; worker `poisoned.0` has a NaN loss on its `poisoned.1`-th computation.
fn pool(workers: usize, poisoned: Option<(usize, u64)>) -> WorkerPool<Constant> {
    let devices = (0..workers).map(|worker| Device::Cpu { worker }).collect();
    WorkerPool::new(devices, |device| {
        let Device::Cpu { worker } = *device else {
            unreachable!("CPU devices only")
        };
        Ok::<_, ReplicaError>(Constant {
            layout: layout(),
            grads: vec![0.0; num_params()],
            calls: 0,
            poison_at: poisoned.and_then(|(w, at)| (w == worker).then_some(at)),
            worker,
        })
    })
    .unwrap()
}

/// A constant learning rate of [`LR`], no L2.
fn hyper() -> Hyper {
    Hyper {
        batch_size: 2,
        learning_rate: LR,
        lr_decay: 1.0,
        weight_decay: 0.0,
        ema_decay: 0.99,
        seed: 3,
        log_every: 0,
    }
}

/// Every parameter is its initial value moved by exactly `updates` steps; fails naming the
/// first one that is not, and how many updates it got.
fn assert_moved_by(what: &str, state: &TrainState, updates: u64) {
    let initial = initial_state();
    assert_eq!(state.params.len(), initial.params.len(), "{what}");
    let shift = updates as f32 * LR;
    for (i, (&p, &p0)) in state.params.iter().zip(&initial.params).enumerate() {
        if p.to_bits() != (p0 - shift).to_bits() {
            panic!(
                "{what}: parameter {i} (store shard {}) received {} updates where {updates} \
                 were applied: it is {p}, expected {}",
                i / (16 * 1024),
                (p0 - p) / LR,
                p0 - shift
            );
        }
    }
    assert!(state.ema.iter().all(|e| e.is_finite()), "{what}: ema");
}

#[test]
fn every_async_update_reaches_every_shard_exactly_once() {
    const UPDATES: u64 = 120;
    for workers in [2, 3, 4] {
        let what = format!("async, {workers} workers");
        let (state, report) = within(&what, move || {
            let mut pool = pool(workers, None);
            let mut state = initial_state();
            let report =
                asynchronous::train(&mut pool, &mut state, &hyper(), UPDATES, &NoObserver).unwrap();
            (state, report)
        });
        assert!(report.failures.is_empty(), "{what}: {:?}", report.failures);
        assert_eq!((report.steps, state.step), (UPDATES, UPDATES), "{what}");
        assert_moved_by(&what, &state, UPDATES);
    }
}

/// A second segment on the same pool continues where the first stopped, losing nothing.
#[test]
fn async_segments_lose_no_update() {
    let (state, steps) = within("async in three segments", || {
        let mut pool = pool(4, None);
        let mut state = initial_state();
        let mut steps = 0;
        for end in [30, 31, 90] {
            steps += asynchronous::train(&mut pool, &mut state, &hyper(), end, &NoObserver)
                .unwrap()
                .steps;
        }
        (state, steps)
    });
    assert_eq!((steps, state.step), (90, 90));
    assert_moved_by("async in three segments", &state, 90);
}

#[test]
fn an_async_nan_loss_never_reaches_the_stored_parameters() {
    const UPDATES: u64 = 60;
    let (state, report) = within("async with a NaN loss", || {
        let mut pool = pool(3, Some((1, 4)));
        let mut state = initial_state();
        let report =
            asynchronous::train(&mut pool, &mut state, &hyper(), UPDATES, &NoObserver).unwrap();
        (state, report)
    });
    assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
    assert_eq!(report.failures[0].worker, 1, "{:?}", report.failures);
    assert!(
        report.failures[0].to_string().contains("NaN"),
        "{}",
        report.failures[0]
    );
    assert_eq!(report.steps, state.step);
    // The failed worker's batch is not applied; every other one is, once.
    assert!(
        (UPDATES - 1..=UPDATES).contains(&state.step),
        "{}",
        state.step
    );
    assert!(state.params.iter().all(|p| p.is_finite()));
    assert_moved_by("async with a NaN loss", &state, state.step);

    // With one worker the run fails, and the state it leaves holds no NaN either.
    let (state, result) = within("async with one worker and a NaN loss", || {
        let mut pool = pool(1, Some((0, 5)));
        let mut state = initial_state();
        let result = asynchronous::train(&mut pool, &mut state, &hyper(), UPDATES, &NoObserver);
        (state, result)
    });
    assert!(
        matches!(result, Err(TrainError::Worker(ref f)) if f.to_string().contains("NaN")),
        "{result:?}"
    );
    assert!(state.params.iter().all(|p| p.is_finite()));
    assert!(state.ema.iter().all(|e| e.is_finite()));
}

#[test]
fn a_sync_nan_loss_never_reaches_the_stored_parameters() {
    let (state, result) = within("sync with a NaN loss", || {
        let mut pool = pool(3, Some((2, 6)));
        let mut state = initial_state();
        let result = sync::train(&mut pool, &mut state, &hyper(), 40, &NoObserver);
        (state, result)
    });
    assert!(
        matches!(result, Err(TrainError::Worker(ref f)) if f.to_string().contains("NaN")),
        "{result:?}"
    );
    assert!(state.params.iter().all(|p| p.is_finite()));
    assert!(state.ema.iter().all(|e| e.is_finite()));
    // Whatever the state holds, it is a whole number of the steps before the failure.
    let moved = (initial_state().params[0] - state.params[0]) / LR;
    assert!(moved <= 5.0, "{moved}");
    assert_moved_by("sync with a NaN loss", &state, moved as u64);
}
