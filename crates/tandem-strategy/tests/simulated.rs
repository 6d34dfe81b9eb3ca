//! Simulated workers (`Device::Sim`): asynchronous training exactly as N equally fast, truly
//! parallel workers make it, checked against an independent sequential model of that process
//! (every worker reads the initial parameters, then each update is followed by its worker's next
//! read); the staleness that makes; synchronous training on simulated workers bitwise as on
//! CPU workers; and the turns surviving failures and stops.

mod common;

use std::collections::VecDeque;
use std::sync::Mutex;

use common::{
    batches, ema, pool, sgd, sim_pool, sync_train, within, LeastSquaresFit, Model, Quirks, EXAMPLES,
};
use tandem_core::{Optimizer, Piece, ReplicaError, TrainState};
use tandem_optim::Sgd;
use tandem_pool::{Device, WorkerPool};
use tandem_strategy::{
    train, AsyncRule, BatchScaling, ConfigError, EpochOrder, Epochs, Mode, NoObserver, Observer,
    StalenessBound, StepReport, Strategy, TrainError, TrainReport, Warmup,
};

/// Nothing added to the least-squares fit.
struct Healthy;

impl Quirks for Healthy {
    fn before_gradients(&mut self, _: u64) -> Result<Option<f32>, ReplicaError> {
        Ok(None)
    }
}

fn initial_state() -> TrainState {
    TrainState::new(vec![0.5, -0.25], &sgd())
}

fn asynchronous(rule: AsyncRule, warmup: u64) -> Strategy {
    Strategy {
        mode: Mode::Async,
        rule,
        warmup: Warmup::Epochs(warmup),
        bound: StalenessBound::Unbounded,
        batch_scaling: BatchScaling::Auto,
        exchange: tandem_strategy::Exchange::F32,
    }
}

/// The version of the parameters (updates applied) that equally fast parallel workers read
/// for ticket `t`, `workers` of them after a warm-up of `warmup` steps on the first: during
/// the warm-up each ticket after the update before it; then the others join, reading what
/// is there while the first's last warm-up update is under way; then each worker reads just
/// after its own update, `workers - 1` updates after the ones it has not seen.
fn read_version(t: u64, workers: u64, warmup: u64) -> u64 {
    if t < warmup {
        t
    } else {
        (t + 1)
            .saturating_sub(workers)
            .max(warmup.saturating_sub(1))
    }
}

/// Update `step` of `state` with `grads`, at `rate_scale` times the rate.
fn update(state: &mut TrainState, grads: &[f32], rate_scale: f32, step: u64, epoch: f64) {
    let [ema] = &mut state.slots[..] else {
        unreachable!("Sgd keeps one state vector")
    };
    sgd().update(
        Piece {
            params: &mut state.params,
            state: &mut [&mut ema.values],
            grads: &[grads],
            weight_decay: true,
            rate_scale,
        },
        step,
        epoch,
    );
}

/// `steps` asynchronous updates of `workers` equally fast parallel workers, computed one after
/// another: update t applies the gradient of ticket t's batch computed from the parameters of
/// [`read_version`], at the rate `rule` gives for its staleness.
fn reference(workers: usize, rule: AsyncRule, warmup_epochs: u64, steps: u64) -> TrainState {
    let batches = batches();
    let epochs = Epochs::new(EXAMPLES, batches.batch_size as u64);
    let warmup = epochs.end_step(warmup_epochs).unwrap();
    let read = |t: u64| read_version(t, workers as u64, warmup);
    let mut order = EpochOrder::new(batches.seed, EXAMPLES);
    let mut fit = LeastSquaresFit { quirks: Healthy };
    let mut state = initial_state();
    let mut batch = vec![0u32; batches.batch_size];
    let mut computed: VecDeque<Vec<f32>> = VecDeque::new();
    let mut next_ticket = 0;
    for step in 0..steps {
        // Every ticket read at this version is computed from it.
        while next_ticket < steps && read(next_ticket) == step {
            order.fill(epochs.position(next_ticket), &mut batch);
            let mut grads = vec![0.0; state.params.len()];
            fit.gradients(next_ticket + 1, &batch, &state.params, &mut grads)
                .expect("the fit computes");
            computed.push_back(grads);
            next_ticket += 1;
        }
        let grads = computed.pop_front().expect("a gradient per update");
        let rate_scale = rule.rate_scale(step - read(step));
        update(&mut state, &grads, rate_scale, step, epochs.epoch_at(step));
    }
    state.step = steps;
    state
}

/// `steps` asynchronous updates of `workers` equally fast parallel workers under a dropping
/// bound of `limit`, computed one after another, as events in time: each worker's gradient is
/// ready one computation after its read, so the oldest read lands next; one more than `limit`
/// stale is dropped, its worker reading the parameters there are and computing its batch again.
/// Returns the state and how many were dropped.
fn dropping_reference(workers: usize, limit: u64, steps: u64) -> (TrainState, u64) {
    let batches = batches();
    let epochs = Epochs::new(EXAMPLES, batches.batch_size as u64);
    let mut order = EpochOrder::new(batches.seed, EXAMPLES);
    let mut fit = LeastSquaresFit { quirks: Healthy };
    let mut state = initial_state();
    let mut compute = |ticket: u64, params: &[f32]| {
        let mut batch = vec![0u32; batches.batch_size];
        order.fill(epochs.position(ticket), &mut batch);
        let mut grads = vec![0.0; params.len()];
        fit.gradients(ticket + 1, &batch, params, &mut grads)
            .expect("the fit computes");
        grads
    };
    // In the order of their reads: (ticket, version read, gradient).
    let mut computing: VecDeque<(u64, u64, Vec<f32>)> = (0..(workers as u64).min(steps))
        .map(|t| (t, 0, compute(t, &state.params)))
        .collect();
    let (mut version, mut next_ticket, mut dropped) = (0, workers as u64, 0);
    while let Some((ticket, read, grads)) = computing.pop_front() {
        if version - read > limit {
            dropped += 1;
            computing.push_back((ticket, version, compute(ticket, &state.params)));
            continue;
        }
        let rate_scale = AsyncRule::Scaled.rate_scale(version - read);
        update(
            &mut state,
            &grads,
            rate_scale,
            version,
            epochs.epoch_at(version),
        );
        version += 1;
        if next_ticket < steps {
            computing.push_back((next_ticket, version, compute(next_ticket, &state.params)));
            next_ticket += 1;
        }
    }
    state.step = version;
    (state, dropped)
}

/// Every step's staleness, as the workers report them.
#[derive(Default)]
struct Staleness(Mutex<Vec<(u64, u64)>>);

impl Observer for Staleness {
    fn log_every(&self) -> u64 {
        1
    }
    fn on_log(&self, report: &StepReport) {
        let staleness = report.staleness.expect("async reports staleness");
        self.0.lock().unwrap().push((report.step, staleness));
    }
}

fn run_sim(
    workers: usize,
    strategy: Strategy,
    steps: u64,
    observer: &dyn Observer,
) -> (TrainState, TrainReport) {
    let mut pool = sim_pool(workers, |_| Healthy);
    let mut state = initial_state();
    let report = train(
        strategy,
        &mut pool,
        &mut state,
        &sgd(),
        &batches(),
        steps,
        observer,
    )
    .unwrap();
    (state, report)
}

#[test]
fn simulated_async_is_the_parallel_workers_order_bitwise_for_every_rule() {
    // 7 steps an epoch (70 examples, batches of 10): warm-ups of 0 and 14 steps.
    for workers in [1, 2, 3, 5, 8] {
        for rule in AsyncRule::ALL {
            for warmup in [0, 2] {
                let what = format!("sim:{workers}, {rule}, warm-up {warmup}");
                let strategy = asynchronous(rule, warmup);
                let (state, report) = within(&what.clone(), move || {
                    run_sim(workers, strategy, 60, &NoObserver)
                });
                let expected = reference(workers, rule, warmup, 60);
                assert_eq!(report.steps, 60, "{what}");
                assert_eq!(state.params, expected.params, "{what}: parameters");
                assert_eq!(ema(&state), ema(&expected), "{what}: moving average");
                // And again: the same bits.
                let (again, _) = run_sim(workers, strategy, 60, &NoObserver);
                assert_eq!(again.params, state.params, "{what}: a second run");
            }
        }
    }
    // The reference can tell the rules, and warm-ups, apart.
    let plain = reference(3, AsyncRule::Plain, 0, 60).params;
    assert_ne!(plain, reference(3, AsyncRule::Scaled, 0, 60).params);
    assert_ne!(plain, reference(3, AsyncRule::Plain, 2, 60).params);
}

#[test]
fn simulated_updates_are_as_stale_as_parallel_workers_make_them() {
    for (workers, warmup) in [(1, 0), (4, 0), (7, 0), (4, 2)] {
        let observer = Staleness::default();
        let strategy = asynchronous(AsyncRule::Plain, warmup);
        let (_, report) = run_sim(workers, strategy, 50, &observer);
        let mut seen = observer.0.into_inner().unwrap();
        seen.sort();
        let warmup = Epochs::new(EXAMPLES, batches().batch_size as u64)
            .end_step(warmup)
            .unwrap();
        let expected: Vec<(u64, u64)> = (0..50u64)
            .map(|step| (step + 1, step - read_version(step, workers as u64, warmup)))
            .collect();
        assert_eq!(seen, expected, "sim:{workers}, warm-up {warmup} steps");
        let staleness = report.staleness.expect("async");
        assert_eq!(staleness.max, workers as u64 - 1, "sim:{workers}");
        // In steady state, every update is workers - 1 stale; in a warm-up, none is.
        assert!(seen[warmup as usize + workers..]
            .iter()
            .all(|&(_, s)| s == workers as u64 - 1));
        assert!(seen[..warmup as usize].iter().all(|&(_, s)| s == 0));
    }
}

/// `wait:S` lets S + 1 workers compute: the others never read, and the run is that of S + 1
/// workers, warm-up and all.
#[test]
fn a_waiting_bound_trains_as_that_many_parallel_workers_bitwise() {
    for (workers, limit) in [(5, 1), (8, 2), (3, 0), (4, 7)] {
        for warmup in [0, 2] {
            let what = format!("sim:{workers}, wait:{limit}, warm-up {warmup}");
            let strategy = Strategy {
                bound: StalenessBound::Wait(limit),
                ..asynchronous(AsyncRule::Scaled, warmup)
            };
            let (state, report) = within(&what.clone(), move || {
                run_sim(workers, strategy, 60, &NoObserver)
            });
            let computing = workers.min(limit as usize + 1);
            let expected = reference(computing, AsyncRule::Scaled, warmup, 60);
            assert_eq!(state.params, expected.params, "{what}: parameters");
            assert_eq!(ema(&state), ema(&expected), "{what}: moving average");
            let staleness = report.staleness.expect("async");
            assert_eq!(staleness.max, computing as u64 - 1, "{what}");
            assert_eq!(staleness.dropped, 0, "{what}");
        }
    }
}

/// `drop:S` lands every batch once, none more than S stale, as equally fast parallel workers
/// that drop too stale gradients would.
#[test]
fn a_dropping_bound_lands_every_batch_at_most_that_stale_bitwise() {
    for (workers, limit) in [(5, 1), (8, 2), (4, 0), (3, 2), (6, 9)] {
        let what = format!("sim:{workers}, drop:{limit}");
        let strategy = Strategy {
            bound: StalenessBound::Drop(limit),
            ..asynchronous(AsyncRule::Scaled, 0)
        };
        let (state, report, seen) = within(&what.clone(), move || {
            let observer = Staleness::default();
            let (state, report) = run_sim(workers, strategy, 60, &observer);
            (state, report, observer.0.into_inner().unwrap())
        });
        let (expected, dropped) = dropping_reference(workers, limit, 60);
        assert_eq!(state.params, expected.params, "{what}: parameters");
        assert_eq!(ema(&state), ema(&expected), "{what}: moving average");
        assert_eq!((state.step, report.steps), (60, 60), "{what}");
        let staleness = report.staleness.expect("async");
        assert_eq!(staleness.dropped, dropped, "{what}");
        assert_eq!(
            dropped > 0,
            workers as u64 - 1 > limit,
            "{what}: {dropped} dropped"
        );
        let mut seen = seen;
        seen.sort();
        assert_eq!(
            seen.iter().map(|&(step, _)| step).collect::<Vec<_>>(),
            (1..=60).collect::<Vec<_>>(),
            "{what}: every step once"
        );
        assert!(seen.iter().all(|&(_, s)| s <= limit), "{what}: {seen:?}");
    }
    // A bound no update reaches changes nothing; the reference can tell the bounds apart.
    let (loose, _) = dropping_reference(4, 3, 60);
    assert_eq!(loose.params, reference(4, AsyncRule::Scaled, 0, 60).params);
    assert_ne!(loose.params, dropping_reference(4, 1, 60).0.params);
}

#[test]
fn sync_on_simulated_workers_is_sync_on_cpu_workers_bitwise() {
    for workers in [1, 2, 3, 4] {
        let trained = |mut pool: WorkerPool<_>| {
            let mut state = initial_state();
            sync_train(&mut pool, &mut state, &sgd(), &batches(), 40, &NoObserver).unwrap();
            state
        };
        let sim = trained(sim_pool(workers, |_| Healthy));
        let cpu = trained(pool(workers, |_| Healthy));
        assert_eq!(sim.params, cpu.params, "{workers} workers");
        assert_eq!(ema(&sim), ema(&cpu), "{workers} workers");
    }
}

/// Fails its `at`-th gradient computation, by an error or a panic.
struct FailsAt {
    at: Option<u64>,
    panics: bool,
}

impl Quirks for FailsAt {
    fn before_gradients(&mut self, call: u64) -> Result<Option<f32>, ReplicaError> {
        if self.at == Some(call) {
            if self.panics {
                panic!("injected fault");
            }
            return Err("injected fault".into());
        }
        Ok(None)
    }
}

#[test]
fn simulated_workers_take_their_turns_past_a_failed_one() {
    // The default warm-up: 5 epochs of 7 steps on worker 0 alone. Worker 1 fails after it;
    // worker 0 fails during it, and the others join at once.
    for (failing, panics) in [(1, false), (1, true), (0, false)] {
        let report = within("sim:4 with a failing worker", move || {
            let mut pool = sim_pool(4, |w| FailsAt {
                at: (w == failing).then_some(5),
                panics,
            });
            let mut state = initial_state();
            let sgd = sgd();
            let mut run = |end| {
                train(
                    Mode::Async,
                    &mut pool,
                    &mut state,
                    &sgd,
                    &batches(),
                    end,
                    &NoObserver,
                )
                .unwrap()
            };
            let first = run(60);
            // The retired worker never runs again, and nobody waits for its turn.
            let second = run(100);
            (first, second)
        });
        assert_eq!(
            report.0.failures.len(),
            1,
            "worker {failing}, panics: {panics}"
        );
        assert_eq!(report.0.failures[0].worker, failing);
        // The failed worker's ticket is used up, as on real workers: 59 updates.
        assert_eq!(report.0.steps, 59);
        assert!(report.1.failures.is_empty());
        assert_eq!(report.1.steps, 41);
        assert_eq!(
            report.1.staleness.expect("async").max,
            2,
            "three workers left"
        );
    }
}

/// Asks to stop once `at` steps are reported.
struct StopAt(u64, Mutex<u64>);

impl Observer for StopAt {
    fn log_every(&self) -> u64 {
        1
    }
    fn on_log(&self, report: &StepReport) {
        let mut seen = self.1.lock().unwrap();
        *seen = (*seen).max(report.step);
    }
    fn should_stop(&self) -> bool {
        *self.1.lock().unwrap() >= self.0
    }
}

#[test]
fn a_stop_ends_simulated_workers_after_the_updates_they_hold() {
    let (state, report) = within("sim:5 stopped at step 20", || {
        let observer = StopAt(20, Mutex::new(0));
        let (state, report) = run_sim(5, Strategy::from(Mode::Async), 1_000, &observer);
        (state.step, report)
    });
    assert!(report.stopped);
    // Those holding tickets apply them: at most one round more.
    assert!((20..=25).contains(&state), "stopped at {state}");
}

#[test]
fn simulated_and_real_workers_do_not_train_together() {
    let devices = vec![Device::Cpu { worker: 0 }, Device::Sim { worker: 1 }];
    let mut pool = common::pool_on(devices, common::least_squares_layout(), EXAMPLES, |_| {
        LeastSquaresFit { quirks: Healthy }
    });
    let mut state = initial_state();
    for mode in [Mode::Sync, Mode::Async] {
        let err = train(
            mode,
            &mut pool,
            &mut state,
            &sgd(),
            &batches(),
            10,
            &NoObserver,
        )
        .unwrap_err();
        assert!(
            matches!(
                &err,
                TrainError::Config(
                    ConfigError::SimulatedBesideReal | ConfigError::SimulatedAcrossRanks
                )
            ),
            "{err}"
        );
    }
}

/// The learning-rate scaling is the synchronous runs': there a factor changes the result;
/// asynchronous runs, whose steps are one worker's batch, ignore it (its arithmetic has unit
/// tests of its own).
#[test]
fn batch_scaling_scales_sync_runs_only() {
    let run = |mode: Mode, batch_scaling: BatchScaling, sgd: Sgd| {
        let mut pool = sim_pool(3, |_| Healthy);
        let mut state = initial_state();
        let strategy = Strategy {
            batch_scaling,
            ..asynchronous(AsyncRule::Scaled, 0)
        };
        let strategy = Strategy { mode, ..strategy };
        train(
            strategy,
            &mut pool,
            &mut state,
            &sgd,
            &batches(),
            40,
            &NoObserver,
        )
        .unwrap();
        state.params
    };
    let sgd = sgd();
    for mode in [Mode::Sync, Mode::Async] {
        let plain = run(mode, BatchScaling::Factor(1.0), sgd);
        // A global batch of 30 is no large batch to `auto`.
        assert_eq!(run(mode, BatchScaling::Auto, sgd), plain, "{mode:?}");
        let doubled = run(mode, BatchScaling::Factor(2.0), sgd);
        assert_eq!(doubled == plain, mode == Mode::Async, "{mode:?}");
    }
}
