//! Asynchronous training, exactly: with a constant gradient, a constant learning rate that is
//! a power of two and no L2, every update moves every parameter by the same exactly
//! representable amount, whatever the order in which updates reach the shards. So after N
//! updates every parameter must have moved by exactly N steps: one update lost on some shard
//! (a worker that skips part of the store) or applied twice shows as a parameter off by one
//! step. The model spans many store shards (16K values each) and several workers run at once.
//! A non-finite loss must never reach the stored parameters.

mod common;

use common::{async_train, sync_train, PLAIN_ASYNC};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{across, ema, pool_of, weights_and_bias, within, Loss, Model, TestReplica};
use tandem_collectives::Transport;
use tandem_core::{ParamSpan, TrainState};
use tandem_optim::Sgd;
use tandem_pool::WorkerPool;
use tandem_strategy::{
    train, train_across, Batches, ConfigError, NoObserver, Observer, StalenessBound, Strategy,
    TrainError, TrainReport,
};

/// The learning rate, and so the step of every parameter: 2^-10.
const LR: f32 = 1.0 / 1024.0;

/// About 5 shards of weights and one of biases: 7 shards in all, so that workers start their
/// updates at different shards.
fn layout() -> Vec<ParamSpan> {
    weights_and_bias(vec![5, 16 * 1024 + 3], 37)
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
        &sgd(),
    )
}

/// Gradient 1 everywhere and a constant loss; `poison_at`: on that gradient computation (counted
/// from 1) the loss and every gradient are NaN, as after a divergence.
struct Constant {
    poison_at: Option<u64>,
    worker: usize,
    /// The fewest steps that the parameters a step computes from may have moved by (the state a
    /// run starts from), where the test sets it.
    moved_at_least: Option<Arc<AtomicU64>>,
}

impl Model for Constant {
    fn gradients(&mut self, call: u64, _batch: &[u32], params: &[f32], grads: &mut [f32]) -> Loss {
        if let Some(least) = &self.moved_at_least {
            let moved = (initial_state().params[0] - params[0]) / LR;
            let least = least.load(Ordering::Acquire);
            if moved < least as f32 {
                return Err(format!(
                    "a step computed from parameters {moved} steps from the start, \
                                    where the run started from {least}"
                )
                .into());
            }
        }
        // A little time that differs from worker to worker and call to call, so that updates
        // interleave differently.
        let wait = (call * 7 + self.worker as u64 * 13) % 5;
        std::thread::sleep(Duration::from_micros(50 * wait));
        if self.poison_at == Some(call) {
            grads.fill(f32::NAN);
            return Ok(f32::NAN);
        }
        grads.fill(1.0);
        Ok(0.5)
    }
}

/// `workers` replicas; worker `poisoned.0` has a NaN loss on its `poisoned.1`-th computation.
fn pool(workers: usize, poisoned: Option<(usize, u64)>) -> WorkerPool<TestReplica<Constant>> {
    pool_of(workers, layout(), 1000, |worker| Constant {
        poison_at: poisoned.and_then(|(w, at)| (w == worker).then_some(at)),
        worker,
        moved_at_least: None,
    })
}

/// [`pool`] of replicas whose gradients are host memory, as CPU replicas' are: a store takes
/// them in exchange for a buffer of its own, and its update leaves the parameters in them.
fn host_pool(workers: usize) -> WorkerPool<TestReplica<Constant>> {
    let mut pool = pool(workers, None);
    pool.replicas_mut()
        .iter_mut()
        .for_each(|r| r.exchanges = true);
    pool
}

/// A constant learning rate of [`LR`], no L2.
fn sgd() -> Sgd {
    Sgd {
        learning_rate: LR,
        lr_decay: 1.0,
        weight_decay: 0.0,
        ema_decay: 0.99,
    }
}

fn batches() -> Batches {
    Batches {
        batch_size: 2,
        seed: 3,
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
    assert!(ema(state).iter().all(|e| e.is_finite()), "{what}: ema");
}

/// A strategy's `train`.
type Train = fn(
    &mut WorkerPool<TestReplica<Constant>>,
    &mut TrainState,
    &Sgd,
    &Batches,
    u64,
    &dyn Observer,
) -> Result<TrainReport, TrainError>;

/// Trains `workers` replicas (worker `poisoned.0` with a NaN loss on its `poisoned.1`-th
/// computation) from the initial state to step `end` with `train`, within the [`DEADLINE`].
fn run(
    what: &str,
    train: Train,
    workers: usize,
    poisoned: Option<(usize, u64)>,
    end: u64,
) -> (TrainState, Result<TrainReport, TrainError>) {
    within(what, move || {
        let mut pool = pool(workers, poisoned);
        let mut state = initial_state();
        let result = train(&mut pool, &mut state, &sgd(), &batches(), end, &NoObserver);
        (state, result)
    })
}

/// [`run`], which must fail naming the NaN and leave a state that holds none; returns that
/// state.
fn fails_on_nan(
    what: &str,
    train: Train,
    workers: usize,
    poisoned: (usize, u64),
    end: u64,
) -> TrainState {
    let (state, result) = run(what, train, workers, Some(poisoned), end);
    assert!(
        matches!(result, Err(TrainError::Worker(ref f)) if f.to_string().contains("NaN")),
        "{result:?}"
    );
    assert!(state.params.iter().all(|p| p.is_finite()));
    assert!(ema(&state).iter().all(|e| e.is_finite()));
    state
}

#[test]
fn every_async_update_reaches_every_shard_exactly_once() {
    const UPDATES: u64 = 120;
    for workers in [2, 3, 4] {
        let what = format!("async, {workers} workers");
        let (state, report) = run(&what, async_train, workers, None, UPDATES);
        let report = report.unwrap();
        assert!(report.failures.is_empty(), "{what}: {:?}", report.failures);
        assert_eq!((report.steps, state.step), (UPDATES, UPDATES), "{what}");
        assert_moved_by(&what, &state, UPDATES);
    }
}

/// Replicas in host memory, whose updates leave the parameters in them for their next step:
/// every update still reaches every parameter once, and a worker loads the parameters only at
/// the start of a run (its parameters are set once then and once by each of its updates).
#[test]
fn async_updates_that_leave_the_parameters_in_the_replica_lose_nothing() {
    const UPDATES: u64 = 120;
    for workers in [2, 3] {
        let what = format!("async, {workers} workers in host memory");
        let (state, report, loads) = within(&what, move || {
            let mut pool = host_pool(workers);
            let (mut state, sgd, batches) = (initial_state(), sgd(), batches());
            let report = async_train(&mut pool, &mut state, &sgd, &batches, UPDATES, &NoObserver);
            // Parameters set per replica, and what they would be with one load when the run
            // starts and one as each of its updates goes.
            let loads: Vec<(u64, u64)> = pool
                .replicas()
                .iter()
                .map(|r| (r.loads, r.calls + 1))
                .collect();
            (state, report, loads)
        });
        let report = report.unwrap();
        assert!(report.failures.is_empty(), "{what}: {:?}", report.failures);
        for (loads, expected) in loads {
            assert_eq!(loads, expected, "{what}: parameter loads");
        }
        assert_eq!(state.step, UPDATES, "{what}");
        assert_moved_by(&what, &state, UPDATES);
    }
}

/// A second segment on the same pool continues where the first stopped, losing nothing, with
/// replicas that copy the parameters in before every step and with replicas in host memory
/// (which must load them again when a run starts: the state may have changed in between).
#[test]
fn async_segments_lose_no_update() {
    for in_host_memory in [false, true] {
        let what = format!("async in three segments, in host memory: {in_host_memory}");
        let (state, steps) = within(&what.clone(), move || {
            let mut pool = match in_host_memory {
                true => host_pool(4),
                false => pool(4, None),
            };
            let moved = Arc::new(AtomicU64::new(0));
            for replica in pool.replicas_mut() {
                replica.model.moved_at_least = Some(Arc::clone(&moved));
            }
            let mut state = initial_state();
            let mut steps = 0;
            for end in [30, 31, 90] {
                let start = (initial_state().params[0] - state.params[0]) / LR;
                moved.store(start as u64, Ordering::Release);
                steps += async_train(&mut pool, &mut state, &sgd(), &batches(), end, &NoObserver)
                    .unwrap()
                    .steps;
                // What another run does to the state between segments (a resume from another
                // checkpoint) must reach the next segment's first steps.
                state.params.iter_mut().for_each(|p| *p -= LR);
            }
            (state, steps)
        });
        assert_eq!((steps, state.step), (90, 90), "{what}");
        assert_moved_by(&what, &state, 90 + 3);
    }
}

#[test]
fn an_async_nan_loss_never_reaches_the_stored_parameters() {
    const UPDATES: u64 = 60;
    let what = "async with a NaN loss";
    let (state, report) = run(what, async_train, 3, Some((1, 4)), UPDATES);
    let report = report.unwrap();
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
    assert_moved_by(what, &state, state.step);

    // With one worker the run fails, and the state it leaves holds no NaN either.
    let what = "async with one worker and a NaN loss";
    fails_on_nan(what, async_train, 1, (0, 5), UPDATES);
}

#[test]
fn a_sync_nan_loss_never_reaches_the_stored_parameters() {
    let state = fails_on_nan("sync with a NaN loss", sync_train, 3, (2, 6), 40);
    // Whatever the state holds, it is a whole number of the steps before the failure.
    let moved = (initial_state().params[0] - state.params[0]) / LR;
    assert!(moved <= 5.0, "{moved}");
    assert_moved_by("sync with a NaN loss", &state, moved as u64);
}

/// Across ranks (threads standing in for MPI processes, [`common::ranks`]), each rank owning a
/// part of the store: after 2 x 2 workers' updates, in two segments, every parameter on every
/// rank has received each update exactly once, and staleness is measured across ranks.
#[test]
fn async_across_ranks_applies_every_update_to_every_part_exactly_once() {
    const END: u64 = 80;
    let results = within("async on 2 ranks x 2 workers", || {
        across(2, |rank| {
            let mut pool = pool(2, None);
            let mut state = initial_state();
            let mut staleness = Vec::new();
            for end in [30, END] {
                let report = train_across(
                    Transport::Ranks(rank),
                    PLAIN_ASYNC,
                    &mut pool,
                    &mut state,
                    &sgd(),
                    &batches(),
                    end,
                    &NoObserver,
                )
                .unwrap();
                assert!(report.failures.is_empty(), "{:?}", report.failures);
                assert_eq!(state.step, end);
                staleness.push(report.staleness.expect("async measures staleness"));
            }
            (state, staleness)
        })
    });
    for (rank, (state, staleness)) in results.iter().enumerate() {
        assert_moved_by(&format!("rank {rank}"), state, END);
        // Every rank counts its own workers' updates; some of them waited for others'.
        assert!(
            staleness.iter().all(|s| s.mean.is_finite()),
            "{staleness:?}"
        );
    }
    let most = results
        .iter()
        .flat_map(|(_, s)| s.iter().map(|s| s.max))
        .max();
    assert!(most >= Some(1), "no update was ever stale across 4 workers");
}

/// Bounds on real, truly parallel workers: under `wait:0` one worker computes at a time, so no
/// update is stale; under `drop:1` none lands more than one update stale. Either way every
/// batch lands exactly once (a dropped gradient is computed again, never applied), in replicas
/// that load the parameters and in those that updates leave them in.
#[test]
fn bounded_async_on_parallel_workers_keeps_its_bound_and_loses_no_update() {
    const UPDATES: u64 = 120;
    for (bound, most) in [(StalenessBound::Wait(0), 0), (StalenessBound::Drop(1), 1)] {
        for exchanges in [false, true] {
            let what = format!("async {bound}, 4 workers, replicas exchange: {exchanges}");
            let (state, report) = within(&what.clone(), move || {
                let mut pool = if exchanges {
                    host_pool(4)
                } else {
                    pool(4, None)
                };
                let mut state = initial_state();
                let strategy = Strategy {
                    bound,
                    ..PLAIN_ASYNC
                };
                let report = train(
                    strategy,
                    &mut pool,
                    &mut state,
                    &sgd(),
                    &batches(),
                    UPDATES,
                    &NoObserver,
                );
                (state, report)
            });
            let report = report.unwrap();
            assert_eq!((report.steps, state.step), (UPDATES, UPDATES), "{what}");
            let staleness = report.staleness.expect("async");
            assert!(staleness.max <= most, "{what}: {staleness:?}");
            assert_moved_by(&what, &state, UPDATES);
        }
    }
}

/// One rank is one process: on a cluster of one, `train_across` trains as `train` does, with
/// what is refused across ranks (a warm-up on one worker, a staleness bound), and applies every
/// update exactly once.
#[test]
fn across_one_rank_trains_as_one_process_with_a_warmup_and_a_bound() {
    const UPDATES: u64 = 20;
    let strategy = Strategy {
        warmup: tandem_strategy::Warmup::Epochs(1),
        bound: StalenessBound::Wait(1),
        ..PLAIN_ASYNC
    };
    let mut trained = within("async on a cluster of one rank", move || {
        across(1, |rank| {
            let mut state = initial_state();
            let report = train_across(
                Transport::Ranks(rank),
                strategy,
                &mut pool(2, None),
                &mut state,
                &sgd(),
                &batches(),
                UPDATES,
                &NoObserver,
            );
            (report.map(|r| r.steps).map_err(|e| e.to_string()), state)
        })
    });
    let (steps, state) = trained.remove(0);
    assert_eq!(steps, Ok(UPDATES));
    assert_moved_by("one rank", &state, UPDATES);
}

/// What the turns of one process do is not built across ranks: a warm-up on one worker and a
/// staleness bound are refused there, on every rank, before any update; so is an asynchronous
/// run over a transport with collectives only (its parameter service needs messages). The
/// automatic warm-up counts every rank's workers: 2 ranks of 2 are the 4 it warms up.
#[test]
fn across_ranks_a_warmup_a_bound_or_no_messages_is_refused_before_training() {
    let refused = [
        Strategy {
            warmup: tandem_strategy::Warmup::Epochs(1),
            ..PLAIN_ASYNC
        },
        Strategy {
            warmup: tandem_strategy::Warmup::Auto,
            ..PLAIN_ASYNC
        },
        Strategy {
            bound: StalenessBound::Wait(1),
            ..PLAIN_ASYNC
        },
        Strategy {
            bound: StalenessBound::Drop(3),
            ..PLAIN_ASYNC
        },
    ];
    let refused = refused
        .map(|strategy| (strategy, true))
        .into_iter()
        .chain([(PLAIN_ASYNC, false)]);
    for (strategy, messages) in refused {
        let results = within("refused on 2 ranks", move || {
            across(2, |rank| {
                let mut state = initial_state();
                let transport = match messages {
                    true => Transport::Ranks(rank),
                    false => Transport::Collectives(rank),
                };
                let result = train_across(
                    transport,
                    strategy,
                    &mut pool(2, None),
                    &mut state,
                    &sgd(),
                    &batches(),
                    20,
                    &NoObserver,
                );
                (result.map(|r| r.steps), state.step)
            })
        });
        for (result, step) in results {
            let refusal = match &result {
                Err(TrainError::Config(refusal)) => refusal,
                _ => panic!("{strategy:?}: {result:?}"),
            };
            assert!(
                match messages {
                    true => matches!(
                        refusal,
                        ConfigError::WarmupAcrossRanks | ConfigError::BoundAcrossRanks(_)
                    ),
                    false => matches!(refusal, ConfigError::AsyncWithoutMessages),
                },
                "{strategy:?}: {result:?}"
            );
            assert_eq!(step, 0, "{strategy:?}");
        }
    }
}
