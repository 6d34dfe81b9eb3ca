//! The synchronous reduction, bit for bit: with 3 and 4 workers (where, unlike with 2, the order
//! of an f32 sum shows in its result) a run equals a trajectory computed here step by step with
//! the fused update applied to the workers' gradients summed in worker order, and the same run
//! twice is identical, however the workers' timing varies.
//!
//! The replica's gradients are pseudo-random values of widely different magnitudes, determined
//! by the batch and the parameters, so that any other summation order, or one that depends on
//! which worker finished first, changes the bits of the very first update.

mod common;

use common::{async_train, sync_train};

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::fake_device::{Kind, Resident};
use common::{across, ema, pool_of, weights_and_bias, within, Loss, Model, TestReplica};
use tandem_collectives::{Collectives, Transport};
use tandem_core::{DType, Helpers, ParamSpan, TrainState};
use tandem_optim::Sgd;
use tandem_pool::WorkerPool;
use tandem_strategy::{
    train_across, Batches, EpochOrder, Exchange, Mode, NoObserver, Observer, StepReport, Strategy,
};
use tandem_tensor::cpu::{sgd_ema_update, UpdateStep};

/// Training examples the batch indices address.
const EXAMPLES: usize = 60;

/// splitmix64's finaliser: a well-mixed 64-bit function of `z`.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A weight span of several store shards (16K values each) and a small bias span.
fn layout() -> Vec<ParamSpan> {
    weights_and_bias(vec![3, 16 * 1024 + 7], 19)
}

/// The flat ranges of the layout's spans, with whether each is regularised.
fn spans(layout: &[ParamSpan]) -> Vec<(Range<usize>, bool)> {
    let mut offset = 0;
    layout
        .iter()
        .map(|span| {
            let range = offset..offset + span.len();
            offset = range.end;
            (range, span.weight_decay)
        })
        .collect()
}

fn num_params() -> usize {
    layout().iter().map(ParamSpan::len).sum()
}

/// The seed of a gradient: a function of the batch (in order) and of every parameter's bits.
fn seed_of(batch: &[u32], params: &[f32]) -> u64 {
    let from_batch = batch
        .iter()
        .fold(0x1234_5678u64, |h, &i| mix(h ^ u64::from(i)));
    params
        .iter()
        .fold(from_batch, |h, p| h.rotate_left(5) ^ u64::from(p.to_bits()))
}

/// The replica's gradients and loss for `batch` at `params`: each value `+-(1 + u) * 2^e`
/// with `e` in -12..=4, so that sums of three or four of them round differently in another
/// order.
fn noisy_gradients(batch: &[u32], params: &[f32], grads: &mut [f32]) -> f32 {
    let seed = mix(seed_of(batch, params));
    noisy_values(seed, 0, grads);
    1.0 + (seed % 1000) as f32 / 1000.0
}

/// The values of [`noisy_gradients`] from index `first` on, for the gradient seed `seed`.
fn noisy_values(seed: u64, first: usize, grads: &mut [f32]) {
    for (i, g) in (first..).zip(grads.iter_mut()) {
        let r = mix(seed ^ i as u64);
        let magnitude = 1.0 + (r >> 40) as f32 / (1u64 << 24) as f32;
        let exponent = (r % 17) as i32 - 12;
        let sign = if r & (1 << 20) == 0 { 1.0 } else { -1.0 };
        *g = sign * magnitude * 2f32.powi(exponent);
    }
}

/// [`noisy_gradients`] in [`SHARED_TASKS`] tasks that the other workers may take part in. The
/// slow worker's tasks each take a millisecond, so the others, done first, take some of them;
/// `helped` counts the tasks run on another thread than their owner's.
struct Shared {
    slow: bool,
    helped: Arc<AtomicUsize>,
}

const SHARED_TASKS: usize = 8;

impl Model for Shared {
    fn gradients(&mut self, _call: u64, batch: &[u32], params: &[f32], grads: &mut [f32]) -> Loss {
        Ok(noisy_gradients(batch, params, grads))
    }

    fn gradients_helped(
        &mut self,
        _call: u64,
        batch: &[u32],
        params: &[f32],
        grads: &mut [f32],
        helpers: &dyn Helpers,
    ) -> Loss {
        let seed = mix(seed_of(batch, params));
        let per_task = grads.len().div_ceil(SHARED_TASKS);
        let tasks: Vec<Mutex<&mut [f32]>> = grads.chunks_mut(per_task).map(Mutex::new).collect();
        let owner = std::thread::current().id();
        helpers.share(tasks.len(), &|task| {
            if self.slow {
                std::thread::sleep(Duration::from_millis(1));
            }
            if std::thread::current().id() != owner {
                self.helped.fetch_add(1, Ordering::Relaxed);
            }
            noisy_values(seed, task * per_task, &mut tasks[task].lock().unwrap());
        });
        Ok(1.0 + (seed % 1000) as f32 / 1000.0)
    }
}

/// A model whose gradients are [`noisy_gradients`]; with `jitter`, it also takes a
/// pseudo-random time over each step (up to 0.4 ms), so that workers finish in varying orders.
struct Noisy {
    jitter: bool,
}

impl Model for Noisy {
    fn gradients(&mut self, _call: u64, batch: &[u32], params: &[f32], grads: &mut [f32]) -> Loss {
        let loss = noisy_gradients(batch, params, grads);
        if self.jitter {
            let wait = mix(u64::from(batch[0]) ^ 0xABCD) % 400;
            std::thread::sleep(Duration::from_micros(wait));
        }
        Ok(loss)
    }
}

fn pool(workers: usize, jitter: bool) -> WorkerPool<TestReplica<Noisy>> {
    pool_of(workers, layout(), EXAMPLES, |_| Noisy { jitter })
}

/// [`pool`] of replicas that compute from the parameters the store lends them.
fn borrowing_pool(workers: usize, jitter: bool) -> WorkerPool<TestReplica<Noisy>> {
    let mut pool = pool(workers, jitter);
    for replica in pool.replicas_mut() {
        replica.borrows = true;
    }
    pool
}

fn sgd() -> Sgd {
    Sgd {
        learning_rate: 0.05,
        lr_decay: 0.9,
        weight_decay: 0.01,
        ema_decay: 0.99,
    }
}

fn batches() -> Batches {
    Batches {
        batch_size: 3,
        seed: 7,
    }
}

fn initial_state() -> TrainState {
    TrainState::new(
        (0..num_params())
            .map(|i| (mix(i as u64) % 2001) as f32 / 1000.0 - 1.0)
            .collect(),
        &sgd(),
    )
}

/// The parameters and the moving average of `state`, to update together.
fn params_and_ema(state: &mut TrainState) -> (&mut [f32], &mut [f32]) {
    let TrainState { params, slots, .. } = state;
    let ema = slots
        .iter_mut()
        .find(|s| s.name == "ema")
        .expect("the state has a moving average");
    (params, &mut ema.values)
}

/// The learning rate of `step`, as documented: `learning_rate * lr_decay ^ (step /
/// steps_per_epoch)`, computed in f64 and rounded once.
fn learning_rate(sgd: &Sgd, step: u64, steps_per_epoch: f64) -> f32 {
    (f64::from(sgd.learning_rate) * f64::from(sgd.lr_decay).powf(step as f64 / steps_per_epoch))
        as f32
}

/// The moving-average decay of `step`: `min(ema_decay, (1 + step) / (10 + step))`.
fn ema_decay(sgd: &Sgd, step: u64) -> f32 {
    (((1 + step) as f64 / (10 + step) as f64) as f32).min(sgd.ema_decay)
}

/// What `workers` synchronous workers must compute in `steps` steps from `state`: at each step,
/// every worker's gradients at the current parameters on its part of the global batch, then one
/// fused update per span with the gradients in worker order.
fn expected_sync(state: &TrainState, workers: usize, steps: u64) -> TrainState {
    expected_sync_exchanging(state, workers, steps, None)
}

/// bf16 by bit manipulation (round to nearest, ties to even), independently of the code under
/// test.
fn bf16_by_bits(x: f32) -> f32 {
    let bits = x.to_bits();
    f32::from_bits(bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000)
}

/// [`expected_sync`] with the gradients exchanged in bf16 where `bf16` is `Some`: each
/// worker's divided by the worker count and rounded, their f32 sum in worker order the one
/// gradient of the update; `Some(true)`: the replicas compute from the parameters rounded to
/// bf16 too.
fn expected_sync_exchanging(
    state: &TrainState,
    workers: usize,
    steps: u64,
    bf16: Option<bool>,
) -> TrainState {
    let (sgd, batches) = (sgd(), batches());
    let global = (workers * batches.batch_size) as u64;
    let steps_per_epoch = EXAMPLES as f64 / global as f64;
    let mut order = EpochOrder::new(batches.seed, EXAMPLES);
    let mut state = state.clone();
    let mut grads = vec![vec![0.0f32; num_params()]; workers];
    let mut batch = vec![0u32; batches.batch_size];
    for step in state.step..state.step + steps {
        let seen: Vec<f32> = match bf16 {
            Some(true) => state.params.iter().map(|&p| bf16_by_bits(p)).collect(),
            _ => state.params.clone(),
        };
        for (worker, g) in grads.iter_mut().enumerate() {
            order.fill(
                step * global + (worker * batches.batch_size) as u64,
                &mut batch,
            );
            noisy_gradients(&batch, &seen, g);
        }
        let mean: Vec<f32> = match bf16 {
            None => Vec::new(),
            Some(_) => (0..num_params())
                .map(|i| {
                    (grads.iter()).fold(0.0f32, |sum, g| sum + bf16_by_bits(g[i] / workers as f32))
                })
                .collect(),
        };
        for (range, decayed) in spans(&layout()) {
            let parts: Vec<&[f32]> = match bf16 {
                None => grads.iter().map(|g| &g[range.clone()]).collect(),
                Some(_) => vec![&mean[range.clone()]],
            };
            let update = UpdateStep {
                learning_rate: learning_rate(&sgd, step, steps_per_epoch),
                weight_decay: if decayed { sgd.weight_decay } else { 0.0 },
                ema_decay: ema_decay(&sgd, step),
            };
            let (params, ema) = params_and_ema(&mut state);
            sgd_ema_update(&mut params[range.clone()], &mut ema[range], &parts, update);
        }
    }
    state.step += steps;
    state
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Fails naming the first value whose bits differ.
fn assert_bitwise(what: &str, found: &TrainState, expected: &TrainState) {
    assert_eq!(found.step, expected.step, "{what}: step");
    let names = |s: &TrainState| s.slots.iter().map(|s| s.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(found), names(expected), "{what}: optimiser state");
    for (name, f, e) in [
        (
            "params",
            found.params.as_slice(),
            expected.params.as_slice(),
        ),
        ("ema", ema(found), ema(expected)),
    ] {
        if let Some(i) = (0..e.len()).find(|&i| f[i].to_bits() != e[i].to_bits()) {
            panic!(
                "{what}: {name}[{i}] is {} where the update of the gradients summed in worker \
                 order gives {}",
                f[i], e[i]
            );
        }
        assert_eq!(bits(f), bits(e), "{what}: {name}");
    }
}

/// The state after `steps` steps of sync training on `pool` from [`initial_state`].
fn sync_from_the_start<M: Model>(pool: &mut WorkerPool<TestReplica<M>>, steps: u64) -> TrainState {
    let mut state = initial_state();
    let report = sync_train(pool, &mut state, &sgd(), &batches(), steps, &NoObserver).unwrap();
    assert_eq!(report.steps, steps);
    state
}

/// `steps` steps of sync training on `workers` replicas that borrow the store's parameters or
/// have them copied in; fails if a borrowing replica was ever loaded, or a copying one not
/// every step.
fn train_sync(workers: usize, jitter: bool, borrows: bool, steps: u64) -> TrainState {
    within(
        &format!("sync training with {workers} workers"),
        move || {
            let mut pool = match borrows {
                true => borrowing_pool(workers, jitter),
                false => pool(workers, jitter),
            };
            let state = sync_from_the_start(&mut pool, steps);
            let loads: Vec<u64> = pool.replicas().iter().map(|r| r.loads).collect();
            let expected = if borrows { 0 } else { steps };
            assert_eq!(
                loads,
                vec![expected; workers],
                "parameter loads per replica"
            );
            state
        },
    )
}

/// The premise of the test: with three or four of these gradients, the order of the sum shows
/// in its bits (with two it cannot: a + b == b + a).
#[test]
fn the_order_of_the_gradients_shows_in_the_update() {
    let params = initial_state().params;
    let g: Vec<Vec<f32>> = (0..4u32)
        .map(|w| {
            let mut g = vec![0.0; params.len()];
            noisy_gradients(&[w, w + 10, w + 20], &params, &mut g);
            g
        })
        .collect();
    let update = |grads: &[&[f32]]| {
        let mut state = initial_state();
        let step = UpdateStep {
            learning_rate: 0.05,
            weight_decay: 0.0,
            ema_decay: 0.5,
        };
        let (params, ema) = params_and_ema(&mut state);
        sgd_ema_update(params, ema, grads, step);
        bits(&state.params)
    };
    for n in [3, 4] {
        let forward: Vec<&[f32]> = g[..n].iter().map(Vec::as_slice).collect();
        let mut reversed = forward.clone();
        reversed.reverse();
        let mut rotated = forward.clone();
        rotated.rotate_left(1);
        assert_ne!(update(&forward), update(&reversed), "{n} workers reversed");
        assert_ne!(update(&forward), update(&rotated), "{n} workers rotated");
    }
}

#[test]
fn sync_equals_the_fused_update_of_the_gradients_in_worker_order() {
    const STEPS: u64 = 25;
    for workers in [1, 2, 3, 4] {
        let expected = expected_sync(&initial_state(), workers, STEPS);
        for borrows in [false, true] {
            let found = train_sync(workers, false, borrows, STEPS);
            let what = format!("{workers} workers, borrowing {borrows}");
            assert_bitwise(&what, &found, &expected);
        }
    }
}

/// Workers finish their gradients in a different order from step to step; the result must not
/// depend on it.
#[test]
fn sync_with_3_and_4_workers_is_bitwise_reproducible_whatever_the_timing() {
    const STEPS: u64 = 30;
    for workers in [3, 4] {
        let expected = expected_sync(&initial_state(), workers, STEPS);
        // The first run copies the parameters into the replicas, the second lends them.
        let first = train_sync(workers, true, false, STEPS);
        let second = train_sync(workers, true, true, STEPS);
        assert_bitwise(&format!("{workers} workers, first run"), &first, &expected);
        assert_bitwise(
            &format!("{workers} workers, second run"),
            &second,
            &expected,
        );
    }
}

/// A worker slowed down (a busy core) shares out its gradients' tasks: the others, done first,
/// run some of them while they wait at the barrier, where each has a core of its own, and the
/// run is still the trajectory.
#[test]
fn workers_done_first_help_a_slow_one_and_the_run_is_unchanged() {
    const STEPS: u64 = 12;
    for workers in [2, 3] {
        let expected = expected_sync(&initial_state(), workers, STEPS);
        let helped = Arc::new(AtomicUsize::new(0));
        let counter = helped.clone();
        let found = within(
            &format!("sync training with {workers} workers"),
            move || {
                let mut pool = pool_of(workers, layout(), EXAMPLES, |w| Shared {
                    slow: w == workers - 1,
                    helped: counter.clone(),
                });
                for replica in pool.replicas_mut() {
                    replica.borrows = true;
                }
                sync_from_the_start(&mut pool, STEPS)
            },
        );
        assert_bitwise(&format!("{workers} workers, helped"), &found, &expected);
        let helped = helped.load(Ordering::Relaxed);
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        if workers > cores {
            // Waiting busy would take a working worker's core: nobody waits for work.
            assert_eq!(helped, 0, "{workers} workers on {cores} cores");
            continue;
        }
        // The slow worker's 8 tasks take 8 ms a step; the others are done at once (from the
        // second step: the first shows that the workers share work out).
        assert!(
            helped as u64 >= STEPS,
            "{workers} workers: {helped} tasks helped in {STEPS} steps"
        );
    }
}

/// Resuming is part of the trajectory too: two segments equal one run.
#[test]
fn sync_in_two_segments_equals_the_trajectory() {
    let expected = expected_sync(&initial_state(), 3, 20);
    let found = within("sync training in two segments", || {
        let mut pool = pool(3, false);
        let mut state = initial_state();
        sync_train(&mut pool, &mut state, &sgd(), &batches(), 8, &NoObserver).unwrap();
        sync_train(&mut pool, &mut state, &sgd(), &batches(), 20, &NoObserver).unwrap();
        state
    });
    assert_bitwise("3 workers, 8 + 12 steps", &found, &expected);
}

/// One asynchronous worker applies exactly the updates one synchronous worker does: whether it
/// copies the parameters in before every step, or (a replica in host memory) its update leaves
/// them in it for the next step, which must then be exactly the latest.
#[test]
fn async_with_one_worker_equals_sync_with_one_worker_bitwise() {
    const STEPS: u64 = 25;
    let expected = expected_sync(&initial_state(), 1, STEPS);
    // Parameters set: before every step, or when the run starts and by every update.
    for (in_host_memory, loads) in [(false, STEPS), (true, 1 + STEPS)] {
        let what = format!("async, 1 worker, in host memory: {in_host_memory}");
        let found = within(&what.clone(), move || {
            // Replicas that could borrow: async does not lend the parameters, since they
            // change under a worker's step.
            let mut pool = borrowing_pool(1, false);
            pool.replicas_mut()[0].exchanges = in_host_memory;
            let mut state = initial_state();
            let report = async_train(
                &mut pool,
                &mut state,
                &sgd(),
                &batches(),
                STEPS,
                &NoObserver,
            )
            .unwrap();
            assert_eq!(report.steps, STEPS, "{what}");
            assert!(report.failures.is_empty(), "{what}: {:?}", report.failures);
            assert_eq!(report.staleness.map(|s| s.max), Some(0), "{what}");
            assert_eq!(pool.replicas()[0].loads, loads, "{what}: parameter loads");
            state
        });
        assert_bitwise(
            &format!("async, 1 worker, in host memory: {in_host_memory}"),
            &found,
            &expected,
        );
    }
    let sync = train_sync(1, false, true, STEPS);
    assert_bitwise("sync, 1 worker", &sync, &expected);
}

/// A run over ranks (threads standing in for MPI processes, [`common::ranks`]) is the run of
/// one process with all their workers, bitwise, on every rank, across segments too: 2 x 1,
/// 2 x 2 and 3 x 1 ranks x workers, over the collectives alone (a synchronous run needs no
/// messages).
#[test]
fn sync_across_ranks_equals_one_process_of_all_their_workers() {
    const STEPS: u64 = 20;
    for (ranks, local) in [(2, 1), (2, 2), (3, 1)] {
        let expected = expected_sync(&initial_state(), ranks * local, STEPS);
        let what = format!("sync on {ranks} ranks x {local} workers");
        let states = within(&what, move || {
            across(ranks, |rank| {
                let mut pool = pool(local, true);
                let mut state = initial_state();
                for (start, end) in [(0, 8), (8, STEPS)] {
                    let mode = Mode::Sync;
                    let (sgd, batches) = (sgd(), batches());
                    let report = train_across(
                        Transport::Collectives(rank),
                        mode,
                        &mut pool,
                        &mut state,
                        &sgd,
                        &batches,
                        end,
                        &NoObserver,
                    )
                    .unwrap();
                    // Every rank counts the examples of all ranks' workers (batches of 3).
                    assert_eq!(report.examples, (end - start) * (ranks * local * 3) as u64);
                }
                state
            })
        });
        for (rank, state) in states.iter().enumerate() {
            assert_bitwise(&format!("{what}, rank {rank}"), state, &expected);
        }
    }
}

/// Every step's reported loss and learning rate.
#[derive(Default)]
struct Losses(Mutex<Vec<(u64, f32, f32)>>);

impl Observer for Losses {
    fn log_every(&self) -> u64 {
        1
    }
    fn on_log(&self, report: &StepReport) {
        let seen = (report.step, report.loss, report.learning_rate);
        self.0.lock().unwrap().push(seen);
    }
}

/// Across ranks the loss a step reports is that of every rank's workers at that step, as in
/// one process with all of them, though only rank 0 watches the run (as `mnist-train` under
/// `mpirun` has it): the other ranks take their losses when rank 0 logs.
#[test]
fn sync_across_ranks_reports_the_losses_of_one_process() {
    const STEPS: u64 = 12;
    let one = Losses::default();
    let mut state = initial_state();
    sync_train(
        &mut pool(2, false),
        &mut state,
        &sgd(),
        &batches(),
        STEPS,
        &one,
    )
    .unwrap();
    let expected = one.0.into_inner().unwrap();
    let reported = within("sync on 2 ranks x 1 worker, rank 0 watching", || {
        across(2, |rank| {
            let watching = Losses::default();
            let observer: &dyn Observer = match rank.rank() {
                0 => &watching,
                _ => &NoObserver,
            };
            let mut state = initial_state();
            let (sgd, batches) = (sgd(), batches());
            train_across(
                Transport::Ranks(rank),
                Mode::Sync,
                &mut pool(1, false),
                &mut state,
                &sgd,
                &batches,
                STEPS,
                observer,
            )
            .unwrap();
            watching.0.into_inner().unwrap()
        })
    });
    assert!(reported[1].is_empty(), "rank 1 watches nothing");
    assert_eq!(reported[0].len(), expected.len());
    for (&(step, loss, rate), &(one_step, one_loss, one_rate)) in reported[0].iter().zip(&expected)
    {
        assert_eq!((step, rate), (one_step, one_rate));
        assert!(
            (loss - one_loss).abs() <= 1e-6 * one_loss.abs(),
            "step {step}: loss {loss} across ranks, {one_loss} in one process"
        );
    }
}

/// `--exchange bf16` across ranks, bit for bit: every worker's gradients divided by the worker
/// count and rounded to bf16 before they travel, summed in f32 in worker order on arrival,
/// whatever the ranks' timing; the replicas' parameters rounded to bf16 too where they compute
/// in it. The bytes sent for the gradients halve; with bf16 replicas, so do those of the
/// parameters, and the whole exchange is half of f32's.
#[test]
fn a_bf16_exchange_sends_half_the_bytes_and_sums_the_rounded_means_in_worker_order() {
    // Enough steps that the one f32 gather of the parameters before the save weighs little.
    const STEPS: u64 = 60;
    let (ranks, local) = (2, 2);
    let run = |exchange: Exchange, dtype: DType| {
        within("sync across 2 ranks x 2 workers", move || {
            across(ranks, |rank| {
                let mut pool = pool(local, true);
                for replica in pool.replicas_mut() {
                    replica.dtype = dtype;
                }
                let mut state = initial_state();
                let strategy = Strategy {
                    exchange,
                    ..Strategy::from(Mode::Sync)
                };
                let (sgd, batches) = (sgd(), batches());
                let before = rank.sent_bytes();
                train_across(
                    Transport::Collectives(rank),
                    strategy,
                    &mut pool,
                    &mut state,
                    &sgd,
                    &batches,
                    STEPS,
                    &NoObserver,
                )
                .unwrap();
                (state, rank.sent_bytes() - before)
            })
        })
    };
    let plain = run(Exchange::F32, DType::F32);
    for (dtype, rounded) in [(DType::F32, false), (DType::BF16, true)] {
        let expected =
            expected_sync_exchanging(&initial_state(), ranks * local, STEPS, Some(rounded));
        let what = format!("bf16 exchange, {dtype} replicas");
        let compressed = run(Exchange::Bf16, dtype);
        for (rank, (state, sent)) in compressed.iter().enumerate() {
            assert_bitwise(&format!("{what}, rank {rank}"), state, &expected);
            let ratio = *sent as f64 / plain[rank].1 as f64;
            eprintln!("{what}, rank {rank}: {sent} bytes sent, {ratio:.3} of f32's");
            match rounded {
                // Gradients halved, parameters not: between a half and the whole.
                false => assert!(ratio > 0.55 && ratio < 0.95, "{what}: {ratio}"),
                // Both halved; what stays is the per-step loss and stop sums (16 bytes) and the
                // owners' f32 parameters gathered once for the save: about 1% at 60 steps.
                true => assert!((0.5..0.515).contains(&ratio), "{what}: {ratio}"),
            }
        }
    }
    // An f32 exchange is the plain reduction, as before.
    let expected = expected_sync(&initial_state(), ranks * local, STEPS);
    for (state, _) in &plain {
        assert_bitwise("f32 exchange", state, &expected);
    }
}

/// `--exchange bf16` between replicas on (fake) devices in one process: the device store
/// compresses each replica's gradients at the end of its step (divided by the worker count,
/// rounded to bf16, stored in 16 bits) and every replica's update sums them in f32 in worker
/// order: bitwise the exchange across ranks (the same expectation), the replicas computing in
/// f32 or bf16, on one device or a device each (the staging copies then move bf16).
#[test]
fn a_bf16_exchange_between_device_replicas_is_the_exchange_across_ranks() {
    const STEPS: u64 = 20;
    let workers = 3;
    let one_device: fn(usize) -> usize = |_| 0;
    let own_devices: fn(usize) -> usize = |worker| worker;
    for (dtype, rounded) in [(DType::F32, false), (DType::BF16, true)] {
        let expected = expected_sync_exchanging(&initial_state(), workers, STEPS, Some(rounded));
        for memory in [one_device, own_devices] {
            let mut pool = pool(workers, false);
            let kind = Kind {
                precision: dtype,
                ..Kind::F32
            };
            for (worker, replica) in pool.replicas_mut().iter_mut().enumerate() {
                replica.dtype = dtype;
                replica.device = Some(Resident::new(memory(worker), num_params(), kind));
            }
            let strategy = Strategy {
                exchange: Exchange::Bf16,
                ..Strategy::from(Mode::Sync)
            };
            let mut state = initial_state();
            let (sgd, batches) = (sgd(), batches());
            tandem_strategy::train(
                strategy,
                &mut pool,
                &mut state,
                &sgd,
                &batches,
                STEPS,
                &NoObserver,
            )
            .unwrap();
            let what = format!("bf16 exchange between {dtype} device replicas");
            assert!(
                pool.replicas().iter().all(|r| r.loads == 0),
                "{what}: the device store"
            );
            assert_bitwise(&what, &state, &expected);
        }
    }
}

/// A bf16 exchange where no gradients travel (host replicas in one process), or in an
/// asynchronous run, is refused.
#[test]
fn a_bf16_exchange_without_ranks_or_in_async_is_refused() {
    for mode in [Mode::Sync, Mode::Async] {
        let strategy = Strategy {
            exchange: Exchange::Bf16,
            ..Strategy::from(mode)
        };
        let mut state = initial_state();
        let (sgd, batches) = (sgd(), batches());
        let err = tandem_strategy::train(
            strategy,
            &mut pool(2, false),
            &mut state,
            &sgd,
            &batches,
            2,
            &NoObserver,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("--exchange bf16"),
            "{mode:?}: {err}"
        );
        assert_eq!(state.step, 0);
    }
}
