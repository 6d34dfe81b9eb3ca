//! The device-resident stores ([`tandem_strategy::DeviceSyncStore`],
//! [`tandem_strategy::DeviceAsyncStore`]) in the default suite: replicas
//! whose parameters and gradients live in a fake device's memory (host memory behind a
//! [`tandem_core::DeviceQueue`], `common::fake_device`) make the strategies keep the parameters
//! of record beside them, and every step then goes through the store's device protocol: the
//! copies into each replica, the gradients' outboxes, the staging between devices, the updates'
//! spans and uploaded hyper-parameters. It must train as the host store does, bit for bit.

mod common;

use common::fake_device::{Kind, Resident};
use common::{pool_on, weights_and_bias, Loss, Model, TestReplica, EXAMPLES};
use std::sync::Mutex;
use tandem_core::{DType, Optimizer, ParamSpan, Piece, TrainState};
use tandem_pool::{Device, WorkerPool};

use tandem_optim::{Adam, Sgd};
use tandem_strategy::{Batches, Mode, Observer, Staleness, StepReport, Strategy};

/// Parameters pulled towards targets that depend on the batch: every gradient depends on the
/// parameters and the examples, so a wrong buffer, span or order shows in the result.
/// Fails its `fails`-th computation, where set (counted from 1), as a device fault would.
#[derive(Default)]
struct Pull {
    fails: Option<u64>,
}

impl Model for Pull {
    fn gradients(&mut self, call: u64, batch: &[u32], params: &[f32], grads: &mut [f32]) -> Loss {
        if self.fails == Some(call) {
            return Err("a fault of the device".into());
        }
        let mean = batch.iter().map(|&i| i as f32).sum::<f32>() / batch.len() as f32;
        let mut loss = 0.0;
        for (i, (g, p)) in grads.iter_mut().zip(params).enumerate() {
            *g = p - mean / EXAMPLES as f32 * (i as f32 + 1.0);
            loss += 0.5 * *g * *g;
        }
        Ok(loss)
    }
}

/// Two spans, one regularised: the store's updates treat each with its own hyper-parameters.
fn layout() -> Vec<ParamSpan> {
    weights_and_bias(vec![2, 3], 3)
}

fn len() -> usize {
    layout().iter().map(ParamSpan::len).sum()
}

/// `workers` replicas of [`Pull`] (simulated workers where `simulated`: their asynchronous
/// updates are exactly as stale on any machine), in host memory or (`memory`: which device
/// each is on) on fake devices whose update kernels average up to 16 replicas' gradients.
fn pool(
    workers: usize,
    simulated: bool,
    memory: Option<fn(usize) -> usize>,
) -> WorkerPool<TestReplica<Pull>> {
    pool_with(workers, simulated, memory, Kind::F32)
}

/// [`pool`], the replicas computing in `kind.precision` (their parameters rounded to it when
/// set) and, on devices, their buffers and queues as `kind` says.
fn pool_with(
    workers: usize,
    simulated: bool,
    memory: Option<fn(usize) -> usize>,
    kind: Kind,
) -> WorkerPool<TestReplica<Pull>> {
    let devices = (0..workers)
        .map(|worker| match simulated {
            true => Device::Sim { worker },
            false => Device::Cpu { worker },
        })
        .collect();
    let mut pool = pool_on(devices, layout(), EXAMPLES, |_| Pull::default());
    for (worker, replica) in pool.replicas_mut().iter_mut().enumerate() {
        replica.dtype = kind.precision;
        replica.device = memory.map(|memory| Resident::new(memory(worker), len(), kind));
    }
    pool
}

/// Replicas that compute in `precision`, on queues that write rounded copies.
fn narrow(precision: DType) -> Kind {
    Kind {
        precision,
        ..Kind::F32
    }
}

fn sgd() -> Sgd {
    Sgd {
        learning_rate: 0.3,
        lr_decay: 0.9,
        weight_decay: 0.01,
        ema_decay: 0.9,
    }
}

/// What a run ends with: its state, asynchronous, the staleness it measured, and every step's
/// logged loss by step (its L2 term read from the store).
type Trained = (TrainState, Option<Staleness>, Vec<(u64, u32)>);

/// Logs the loss every `every` steps.
struct Losses {
    every: u64,
    seen: Mutex<Vec<(u64, u32)>>,
}

impl Observer for Losses {
    fn log_every(&self) -> u64 {
        self.every
    }
    fn on_log(&self, report: &StepReport) {
        let mut losses = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        losses.push((report.step, report.loss.to_bits()));
    }
}

/// Trains `pool` for `steps` from parameters 0.5, logging every step.
fn train(
    strategy: impl Into<Strategy>,
    pool: &mut WorkerPool<TestReplica<Pull>>,
    steps: u64,
) -> Trained {
    train_with(strategy, pool, steps, &sgd(), 1)
}

/// [`train`] with `optimizer`, logging every `log_every` steps (an asynchronous device store
/// runs a worker's update inside its next step, or on its own before the worker's L2 term).
fn train_with(
    strategy: impl Into<Strategy>,
    pool: &mut WorkerPool<TestReplica<Pull>>,
    steps: u64,
    sgd: &dyn Optimizer,
    log_every: u64,
) -> Trained {
    let mut state = TrainState::new(vec![0.5; len()], sgd);
    let batches = Batches {
        batch_size: 7,
        seed: 3,
    };
    let losses = Losses {
        every: log_every,
        seen: Mutex::new(Vec::new()),
    };
    let report = tandem_strategy::train(strategy, pool, &mut state, sgd, &batches, steps, &losses)
        .expect("training runs");
    let mut losses = losses.seen.into_inner().unwrap_or_else(|p| p.into_inner());
    losses.sort_unstable();
    assert_eq!(losses.len() as u64, steps / log_every, "a loss a log");
    (state, report.staleness, losses)
}

/// Whether the strategy kept the parameters of record on the devices: a device-resident store
/// writes them there and never sets a replica's parameters through the host (a host store
/// sets them every step).
fn resident_store_used(pool: &WorkerPool<TestReplica<Pull>>) -> bool {
    pool.replicas().iter().all(|r| r.loads == 0)
}

#[test]
fn sync_on_device_replicas_trains_as_in_host_memory_bitwise() {
    let one_device: fn(usize) -> usize = |_| 0;
    let own_devices: fn(usize) -> usize = |worker| worker;
    for workers in [1, 2, 3] {
        let mut host = pool(workers, false, None);
        let expected = train(Mode::Sync, &mut host, 23);
        assert!(!resident_store_used(&host));
        for (what, memory) in [("one device", one_device), ("a device each", own_devices)] {
            let mut resident = pool(workers, false, Some(memory));
            let state = train(Mode::Sync, &mut resident, 23);
            assert!(resident_store_used(&resident), "{workers} workers, {what}");
            assert_eq!(state, expected, "{workers} workers, {what}");
        }
    }
}

#[test]
fn async_on_device_replicas_trains_as_in_host_memory_bitwise() {
    let one_device: fn(usize) -> usize = |_| 0;
    // One worker, and three simulated ones (their updates 2 stale, at half the rate by the
    // scaled rule, on any machine).
    for (workers, simulated) in [(1, false), (3, true)] {
        let mut host = pool(workers, simulated, None);
        let expected = train(Mode::Async, &mut host, 41);
        assert!(!resident_store_used(&host));
        let staleness = expected.1.expect("async measures staleness");
        assert_eq!(staleness.max, workers as u64 - 1, "{workers} workers");
        let mut resident = pool(workers, simulated, Some(one_device));
        let state = train(Mode::Async, &mut resident, 41);
        assert!(resident_store_used(&resident), "{workers} workers");
        assert_eq!(state, expected, "{workers} workers");
    }
}

/// A worker that fails in a step that took its update from the store ends; the others train
/// on, and the run saves what they did, as in host memory (the failed step's update, which ran
/// before the step's fault, is the record's in both).
#[test]
fn async_on_device_replicas_save_the_run_when_a_worker_fails_in_a_step() {
    let one_device: fn(usize) -> usize = |_| 0;
    let run = |memory| {
        let mut pool = pool(3, true, memory);
        pool.replicas_mut()[1].model.fails = Some(5);
        let mut state = TrainState::new(vec![0.5; len()], &sgd());
        let batches = Batches {
            batch_size: 7,
            seed: 3,
        };
        let report = tandem_strategy::train(
            Mode::Async,
            &mut pool,
            &mut state,
            &sgd(),
            &batches,
            41,
            &Losses {
                every: 100,
                seen: Mutex::new(Vec::new()),
            },
        )
        .expect("the others train on");
        assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
        assert_eq!(report.failures[0].worker, 1);
        (state, resident_store_used(&pool))
    };
    let (expected, _) = run(None);
    let (state, resident) = run(Some(one_device));
    assert!(resident);
    assert_eq!(state, expected);
    assert!(state.step >= 40, "{}", state.step);
}

/// Logging rarely, an asynchronous run on one device runs nearly every update inside its
/// worker's next step (put there by the worker's load, the step then computing from what it
/// left), not on its own before a log's L2 term: it trains, logs and measures staleness as in
/// host memory all the same.
#[test]
fn async_on_device_replicas_logging_rarely_train_as_in_host_memory() {
    let one_device: fn(usize) -> usize = |_| 0;
    let (steps, log_every) = (2 * 2 * 1024 + 37, 700);
    let expected = train_with(
        Mode::Async,
        &mut pool(2, true, None),
        steps,
        &sgd(),
        log_every,
    );
    let mut resident = pool(2, true, Some(one_device));
    let state = train_with(Mode::Async, &mut resident, steps, &sgd(), log_every);
    assert!(resident_store_used(&resident));
    assert_eq!(state, expected);
}

/// Another optimiser's device update is the store's as much as SGD's: Adam, with its two
/// moments and with or without the moving average, stays on the devices in both modes (one
/// device and, sync, a device each) and trains bitwise as in host memory, L2 term and staleness
/// included.
#[test]
fn adam_on_device_replicas_trains_as_in_host_memory_bitwise() {
    let one_device: fn(usize) -> usize = |_| 0;
    let own_devices: fn(usize) -> usize = |worker| worker;
    for ema_decay in [Some(0.9), None] {
        let adam = Adam {
            learning_rate: 0.05,
            weight_decay: 0.01,
            ema_decay,
            ..Adam::DEFAULT
        };
        for (mode, memory, steps) in [
            (Mode::Sync, one_device, 23),
            (Mode::Sync, own_devices, 23),
            (Mode::Async, one_device, 41),
        ] {
            let expected = train_with(mode, &mut pool(3, true, None), steps, &adam, 1);
            assert_eq!(expected.0.slots.len(), adam.state_names().len());
            let mut resident = pool(3, true, Some(memory));
            let state = train_with(mode, &mut resident, steps, &adam, 1);
            assert!(resident_store_used(&resident), "{mode:?} {ema_decay:?}");
            assert_eq!(state, expected, "{mode:?} {ema_decay:?}");
        }
    }
}

/// SGD in all but name: the same arithmetic, with no fused kernel to give the store.
struct Unfused(Sgd);

impl Optimizer for Unfused {
    fn state_names(&self) -> &[&'static str] {
        self.0.state_names()
    }
    fn initial_state(&self, name: &str, params: &[f32]) -> Vec<f32> {
        self.0.initial_state(name, params)
    }
    fn update(&self, piece: Piece<'_, '_>, step: u64, epoch: f64) {
        self.0.update(piece, step, epoch)
    }
    fn learning_rate(&self, epoch: f64) -> f32 {
        self.0.learning_rate(epoch)
    }
    fn weight_decay(&self) -> f32 {
        self.0.weight_decay()
    }
}

/// How many values the stores wrote to `pool`'s replicas' queues from the host.
fn host_writes(pool: &WorkerPool<TestReplica<Pull>>) -> usize {
    let resident = pool.replicas().iter().filter_map(|r| r.device.as_ref());
    resident.map(Resident::host_writes).sum()
}

/// Replicas that compute in bf16 or f16 (16-bit values in f32 buffers) train on the devices:
/// the store keeps f32 master weights there, and each update writes them and the replicas'
/// rounded copy in one pass. Bitwise as through the host store, where each replica rounds the
/// f32 parameters of record it is given; and not as in f32 (the rounding shows). An
/// asynchronous store writes to the devices from the host only the record and the optimiser's
/// state, once, whatever the replicas' type: a copy of the record into a replica (a worker's
/// first step) is made, and rounded, on the device.
#[test]
fn narrow_replicas_on_devices_keep_f32_master_weights_there_and_train_as_in_host_memory() {
    let one_device: fn(usize) -> usize = |_| 0;
    let own_devices: fn(usize) -> usize = |worker| worker;
    for (mode, memory, workers, steps) in [
        (Mode::Sync, one_device, 2, 23),
        (Mode::Sync, own_devices, 3, 23),
        (Mode::Async, one_device, 3, 41),
    ] {
        let wide = train(mode, &mut pool(workers, true, None), steps);
        let mut wide_resident = pool(workers, true, Some(memory));
        train(mode, &mut wide_resident, steps);
        let wide_writes = host_writes(&wide_resident);
        if mode == Mode::Async {
            // The record and the optimiser's state, once: each worker's first step copies the
            // record into its replica on the device.
            let slots = wide.0.slots.len();
            assert_eq!(wide_writes, (1 + slots) * len(), "async f32: from the host");
        }
        for dtype in [DType::BF16, DType::F16] {
            let expected = train(
                mode,
                &mut pool_with(workers, true, None, narrow(dtype)),
                steps,
            );
            assert_ne!(
                expected.0.params, wide.0.params,
                "{mode:?} {dtype}: rounded"
            );
            let mut resident = pool_with(workers, true, Some(memory), narrow(dtype));
            let state = train(mode, &mut resident, steps);
            assert!(resident_store_used(&resident), "{mode:?} {dtype}");
            assert_eq!(state, expected, "{mode:?} {dtype} {workers} workers");
            if mode == Mode::Async {
                assert_eq!(
                    host_writes(&resident),
                    wide_writes,
                    "{dtype}: from the host"
                );
            }
        }
    }
}

/// Where the device cannot hold the run's updates, the parameters of record stay on the host,
/// and the run trains exactly as with host replicas: a sync update over more replicas than
/// one kernel averages, async replicas on different devices (each update runs on its worker's
/// device), an optimiser with no fused kernel, replicas that compute in a narrower type on
/// queues whose updates write no rounded copy, replicas whose buffers are not f32.
#[test]
fn replicas_on_devices_that_cannot_hold_the_update_train_through_the_host() {
    let one_device: fn(usize) -> usize = |_| 0;
    let own_devices: fn(usize) -> usize = |worker| worker;
    let expected = train(Mode::Sync, &mut pool(3, false, None), 23);
    for (max_gradients, resident) in [(2, false), (3, true)] {
        let kind = Kind {
            max_gradients,
            ..Kind::F32
        };
        let mut pool = pool_with(3, false, Some(one_device), kind);
        assert_eq!(train(Mode::Sync, &mut pool, 23), expected);
        assert_eq!(
            resident_store_used(&pool),
            resident,
            "{max_gradients} gradients a kernel"
        );
    }

    let expected = train(Mode::Async, &mut pool(3, true, None), 41);
    let mut apart = pool(3, true, Some(own_devices));
    assert_eq!(train(Mode::Async, &mut apart, 41), expected);
    assert!(
        !resident_store_used(&apart),
        "async replicas on different devices"
    );

    let unfused = Unfused(sgd());
    for mode in [Mode::Sync, Mode::Async] {
        let expected = train_with(mode, &mut pool(2, true, None), 19, &unfused, 1);
        let mut device = pool(2, true, Some(one_device));
        assert_eq!(
            train_with(mode, &mut device, 19, &unfused, 1),
            expected,
            "{mode:?}"
        );
        assert!(!resident_store_used(&device), "{mode:?}: no fused kernel");
    }

    for mode in [Mode::Sync, Mode::Async] {
        for dtype in [DType::BF16, DType::F16] {
            let expected = train(mode, &mut pool_with(2, true, None, narrow(dtype)), 19);
            let no_copies = Kind {
                rounds: false,
                ..narrow(dtype)
            };
            let narrow_buffers = Kind {
                dtype,
                ..narrow(dtype)
            };
            for (what, kind) in [("no copies", no_copies), ("16-bit buffers", narrow_buffers)] {
                let mut device = pool_with(2, true, Some(one_device), kind);
                assert_eq!(train(mode, &mut device, 19), expected, "{mode:?} {dtype}");
                assert!(!resident_store_used(&device), "{mode:?} {dtype}: {what}");
            }
        }
    }
}
