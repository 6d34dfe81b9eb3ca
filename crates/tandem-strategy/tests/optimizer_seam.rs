//! The optimiser seam (`tandem_core::Optimizer`): an optimiser that is not tandem's `Sgd`,
//! defined here, trained by both strategies and checked against a recurrence computed here in
//! f64; its named state carried across segments and through checkpoints bit for bit; an
//! optimiser without state; checkpoints written before the seam (no `optimizer_state`), read as
//! SGD's moving average; states that do not fit the optimiser refused before any work; and
//! hostile `optimizer_state` metadata refused as damage, never a panic.

mod common;

use common::{async_train, sync_train};

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::Duration;

use common::{batches, within, LeastSquares, Loss, Model, Quirks, EXAMPLES};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use tandem_checkpoint::{self as checkpoint, CheckpointDir, CheckpointError};
use tandem_core::{Optimizer, ParamSpan, Piece, Replica, ReplicaError, Slot, TrainState};
use tandem_optim::Sgd;
use tandem_pool::WorkerPool;
use tandem_strategy::{
    Batches, ConfigError, EpochOrder, NoObserver, Observer, StepReport, TrainError, TrainReport,
};

/// The schedule both optimisers here share: `learning_rate * lr_decay ^ epoch`, and L2 with
/// `weight_decay` on the spans that take it.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    learning_rate: f32,
    lr_decay: f32,
    weight_decay: f32,
}

impl Schedule {
    fn learning_rate(&self, epoch: f64) -> f32 {
        (f64::from(self.learning_rate) * f64::from(self.lr_decay).powf(epoch)) as f32
    }
}

/// SGD with heavy-ball momentum: `v = momentum * v + g`, `p -= lr * v`, where `g` is the mean
/// gradient plus the L2 term. Its one state vector is the velocity, which starts at zero.
#[derive(Debug, Clone, Copy)]
struct Momentum {
    schedule: Schedule,
    momentum: f32,
}

/// The mean of `grads` at `i`, summed in their order, plus the L2 term of `p` if `decayed`.
fn gradient(piece_grads: &[&[f32]], i: usize, p: f32, decayed: bool, weight_decay: f32) -> f32 {
    let n = piece_grads.len() as f32;
    let mean = piece_grads.iter().map(|g| g[i]).sum::<f32>() / n;
    if decayed {
        mean + weight_decay * p
    } else {
        mean
    }
}

impl Optimizer for Momentum {
    fn state_names(&self) -> &[&'static str] {
        &["velocity"]
    }
    fn initial_state(&self, name: &str, params: &[f32]) -> Vec<f32> {
        assert_eq!(name, "velocity", "asked for a state it does not name");
        vec![0.0; params.len()]
    }
    fn update(&self, piece: Piece<'_, '_>, _step: u64, epoch: f64) {
        let lr = self.schedule.learning_rate(epoch);
        let [velocity] = piece.state else {
            panic!("Momentum got {} state vectors", piece.state.len());
        };
        for (i, p) in piece.params.iter_mut().enumerate() {
            let g = gradient(
                piece.grads,
                i,
                *p,
                piece.weight_decay,
                self.schedule.weight_decay,
            );
            velocity[i] = self.momentum * velocity[i] + g;
            *p -= lr * velocity[i];
        }
    }
    fn learning_rate(&self, epoch: f64) -> f32 {
        self.schedule.learning_rate(epoch)
    }
    fn weight_decay(&self) -> f32 {
        self.schedule.weight_decay
    }
}

/// Plain gradient descent: no state at all.
#[derive(Debug, Clone, Copy)]
struct Descent(Schedule);

impl Optimizer for Descent {
    fn state_names(&self) -> &[&'static str] {
        &[]
    }
    fn initial_state(&self, name: &str, _: &[f32]) -> Vec<f32> {
        panic!("Descent keeps no state, asked for {name:?}")
    }
    fn update(&self, piece: Piece<'_, '_>, _step: u64, epoch: f64) {
        assert!(piece.state.is_empty(), "Descent got state vectors");
        let lr = self.0.learning_rate(epoch);
        for (i, p) in piece.params.iter_mut().enumerate() {
            *p -= lr * gradient(piece.grads, i, *p, piece.weight_decay, self.0.weight_decay);
        }
    }
    fn learning_rate(&self, epoch: f64) -> f32 {
        self.0.learning_rate(epoch)
    }
    fn weight_decay(&self) -> f32 {
        self.0.weight_decay
    }
}

/// Two state vectors, `m` then `v` (Adam's names); only its state's shape matters here.
struct TwoSlots;

impl Optimizer for TwoSlots {
    fn state_names(&self) -> &[&'static str] {
        &["m", "v"]
    }
    fn initial_state(&self, _: &str, params: &[f32]) -> Vec<f32> {
        vec![0.0; params.len()]
    }
    fn update(&self, piece: Piece<'_, '_>, _step: u64, _epoch: f64) {
        for (i, p) in piece.params.iter_mut().enumerate() {
            *p -= 0.1 * gradient(piece.grads, i, *p, false, 0.0);
        }
    }
    fn learning_rate(&self, _: f64) -> f32 {
        0.1
    }
}

const SCHEDULE: Schedule = Schedule {
    learning_rate: 0.3,
    lr_decay: 0.8,
    weight_decay: 0.01,
};

const MOMENTUM: Momentum = Momentum {
    schedule: SCHEDULE,
    momentum: 0.8,
};

/// Where the fit starts: away from its optimum (2, 0).
const INITIAL: [f32; 2] = [-0.5, 0.7];

/// No quirk: the plain least-squares fit of `common`.
struct Plain;

impl Quirks for Plain {
    fn before_gradients(&mut self, _call: u64) -> Result<Option<f32>, ReplicaError> {
        Ok(None)
    }
}

fn pool(workers: usize) -> WorkerPool<LeastSquares<Plain>> {
    common::pool(workers, |_| Plain)
}

/// The fit's layout, as its replicas give it.
fn layout() -> Vec<ParamSpan> {
    pool(1).replicas()[0].layout().to_vec()
}

/// One step of the reference: what its report says, and the state after it.
#[derive(Debug, Clone, Copy)]
struct RefStep {
    loss: f64,
    learning_rate: f64,
    params: [f64; 2],
    velocity: [f64; 2],
}

/// The trajectory of `steps` steps of heavy-ball momentum `momentum` (0: plain descent) with
/// `schedule` from [`INITIAL`], in f64, from the documented formulas: step `s` trains on stream
/// positions `s * G .. (s + 1) * G` of the data order (`G` the examples of one update), at epoch
/// `s * G / EXAMPLES`; the fit's one span `w` takes L2. The report of a step has the batch's
/// mean data loss plus the L2 term of the parameters the step left.
fn reference(
    schedule: Schedule,
    momentum: f64,
    examples_per_update: usize,
    steps: u64,
) -> Vec<RefStep> {
    reference_resetting(schedule, momentum, examples_per_update, steps, None)
}

/// [`reference`], but with the velocity set back to 0 before step `reset` (what a strategy or
/// a checkpoint that lost it would do on resuming).
fn reference_resetting(
    schedule: Schedule,
    momentum: f64,
    examples_per_update: usize,
    steps: u64,
    reset: Option<u64>,
) -> Vec<RefStep> {
    let mut order = EpochOrder::new(batches().seed, EXAMPLES);
    let mut batch = vec![0u32; examples_per_update];
    let (mut p, mut v) = (INITIAL.map(f64::from), [0.0f64; 2]);
    let wd = f64::from(schedule.weight_decay);
    let mut out = Vec::new();
    for step in 0..steps {
        if reset == Some(step) {
            v = [0.0; 2];
        }
        order.fill(step * examples_per_update as u64, &mut batch);
        let n = batch.len() as f64;
        let (mut data_loss, mut g) = (0.0f64, [0.0f64; 2]);
        for &i in &batch {
            let x = [f64::from(i % 7) / 7.0, 1.0];
            let err = p[0] * x[0] + p[1] * x[1] - 2.0 * x[0];
            data_loss += 0.5 * err * err / n;
            g[0] += err * x[0] / n;
            g[1] += err / n;
        }
        let epoch = step as f64 * examples_per_update as f64 / EXAMPLES as f64;
        let lr = f64::from(schedule.learning_rate) * f64::from(schedule.lr_decay).powf(epoch);
        for j in 0..2 {
            v[j] = momentum * v[j] + g[j] + wd * p[j];
            p[j] -= lr * v[j];
        }
        out.push(RefStep {
            loss: data_loss + wd / 2.0 * (p[0] * p[0] + p[1] * p[1]),
            learning_rate: lr,
            params: p,
            velocity: v,
        });
    }
    out
}

/// `found` agrees with `expected` to the f32 rounding a few dozen steps accumulate (momentum
/// carries rounding along, so a little more than plain SGD).
fn close(found: f32, expected: f64) -> bool {
    (f64::from(found) - expected).abs() <= 1e-5 * (1.0 + expected.abs())
}

#[track_caller]
fn check_state(what: &str, state: &TrainState, expected: &RefStep, velocity: bool) {
    let mut compared = vec![("params", state.params.as_slice(), expected.params)];
    if velocity {
        let found = state.slot("velocity").expect("a velocity");
        compared.push(("velocity", found, expected.velocity));
    }
    for (name, found, exp) in compared {
        assert_eq!(found.len(), 2, "{what}: {name}");
        for (j, (&f, &e)) in found.iter().zip(&exp).enumerate() {
            assert!(
                close(f, e),
                "{what}: {name}[{j}] is {f}, the recurrence gives {e}"
            );
        }
    }
}

/// Asks for every step's report and keeps them.
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

#[derive(Debug, Clone, Copy)]
enum Mode {
    Sync { workers: usize },
    Async,
}

type Train<O> = fn(
    &mut WorkerPool<LeastSquares<Plain>>,
    &mut TrainState,
    &O,
    &Batches,
    u64,
    &dyn Observer,
) -> Result<TrainReport, TrainError>;

impl Mode {
    fn workers(self) -> usize {
        match self {
            Mode::Sync { workers } => workers,
            Mode::Async => 1,
        }
    }
    fn train<O: Optimizer>(self) -> Train<O> {
        match self {
            Mode::Sync { .. } => sync_train,
            Mode::Async => async_train,
        }
    }
}

/// Saves `state` in `dir` (no rotation) and loads it back, checking that what comes back is
/// `state` bit for bit with the caller's metadata; returns the file's tensor names and its
/// `optimizer_state`.
fn round_trip(dir: &CheckpointDir, state: &TrainState) -> (Vec<String>, Option<String>) {
    let metadata = BTreeMap::from([("optimiser".to_string(), "test".to_string())]);
    let path = dir.save(state, &layout(), &metadata, 0, &[]).unwrap();
    let loaded = checkpoint::load(&path, &layout()).unwrap();
    assert_eq!(loaded.state, *state);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&loaded.state.params), bits(&state.params));
    assert_eq!(loaded.state.slots.len(), state.slots.len());
    for (found, saved) in loaded.state.slots.iter().zip(&state.slots) {
        assert_eq!(found.name, saved.name);
        assert_eq!(bits(&found.values), bits(&saved.values), "{}", saved.name);
    }
    assert_eq!(
        loaded.metadata, metadata,
        "step and optimizer_state are not metadata"
    );
    let bytes = fs::read(&path).unwrap();
    let mut names: Vec<String> = SafeTensors::deserialize(&bytes)
        .unwrap()
        .names()
        .into_iter()
        .map(str::to_string)
        .collect();
    names.sort();
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    let slots = header
        .metadata()
        .as_ref()
        .and_then(|m| m.get("optimizer_state").cloned());
    (names, slots)
}

/// Trains [`MOMENTUM`] in `mode` to step `split`, saves and loads the state through a
/// checkpoint, trains on from the loaded state with a fresh pool to `steps`, and checks both
/// ends and every report against the reference.
fn check_momentum(mode: Mode, split: u64, steps: u64) {
    let workers = mode.workers();
    let per_update = workers * batches().batch_size;
    let what = format!("momentum, {mode:?}");
    let expected = reference(
        MOMENTUM.schedule,
        f64::from(MOMENTUM.momentum),
        per_update,
        steps,
    );
    let train = mode.train::<Momentum>();
    let tmp = tempfile::tempdir().unwrap();
    let dir_path = tmp.path().to_owned();
    let (middle, checkpointed, last, reports) = within(&what, move || {
        let dir = CheckpointDir::open(&dir_path).unwrap();
        let mut state = TrainState::new(INITIAL.to_vec(), &MOMENTUM);
        assert_eq!(
            state.slots,
            [Slot {
                name: "velocity".into(),
                values: vec![0.0; 2]
            }]
        );
        let reports = Reports::default();
        let batches = batches();
        train(
            &mut pool(workers),
            &mut state,
            &MOMENTUM,
            &batches,
            split,
            &reports,
        )
        .unwrap();
        let middle = state.clone();
        let checkpointed = round_trip(&dir, &state);
        let (_, loaded, _) = dir.load_newest(&layout(), |_| Ok::<_, String>(())).unwrap();
        let mut state = loaded.state;
        train(
            &mut pool(workers),
            &mut state,
            &MOMENTUM,
            &batches,
            steps,
            &reports,
        )
        .unwrap();
        (middle, checkpointed, state, reports.0.into_inner().unwrap())
    });
    assert_eq!((middle.step, last.step), (split, steps), "{what}");
    let (names, slots) = checkpointed;
    assert_eq!(names, ["params/w", "velocity/w"], "{what}");
    assert_eq!(slots.as_deref(), Some("velocity"), "{what}");
    check_state(
        &format!("{what}, after step {split}"),
        &middle,
        &expected[split as usize - 1],
        true,
    );
    check_state(
        &format!("{what}, after step {steps}, resumed from a checkpoint"),
        &last,
        &expected[steps as usize - 1],
        true,
    );
    let reported: Vec<u64> = reports.iter().map(|r| r.step).collect();
    assert_eq!(reported, (1..=steps).collect::<Vec<_>>(), "{what}");
    for report in &reports {
        let exp = &expected[report.step as usize - 1];
        assert!(
            close(report.learning_rate, exp.learning_rate),
            "{what}: step {} reports learning rate {}, the schedule gives {}",
            report.step,
            report.learning_rate,
            exp.learning_rate
        );
        assert!(
            close(report.loss, exp.loss),
            "{what}: step {} reports loss {}, the data loss plus the optimiser's L2 term is {}",
            report.step,
            report.loss,
            exp.loss
        );
    }
}

/// The premise: momentum, the schedule and L2 each move the trajectory by far more than the
/// tolerance, so the checks below see an optimiser that drops the velocity (or resets it on
/// resuming), ignores the epoch or the span's L2 flag.
#[test]
fn the_reference_is_sensitive_to_what_it_checks() {
    let with = reference(SCHEDULE, 0.8, 10, 30);
    let without_momentum = reference(SCHEDULE, 0.0, 10, 30);
    let constant = Schedule {
        lr_decay: 1.0,
        ..SCHEDULE
    };
    let without_decay = reference(constant, 0.8, 10, 30);
    let no_l2 = Schedule {
        weight_decay: 0.0,
        ..SCHEDULE
    };
    let without_l2 = reference(no_l2, 0.8, 10, 30);
    let reset_on_resuming = reference_resetting(SCHEDULE, 0.8, 10, 30, Some(11));
    for other in [
        &without_momentum,
        &without_decay,
        &without_l2,
        &reset_on_resuming,
    ] {
        let apart = (0..2)
            .map(|j| (with[29].params[j] - other[29].params[j]).abs())
            .fold(0.0, f64::max);
        assert!(apart > 1e-3, "{apart}");
    }
    assert!(with[29].velocity.iter().any(|v| v.abs() > 1e-3));
    assert!(with[29].learning_rate < 0.5 * f64::from(SCHEDULE.learning_rate));
}

#[test]
fn momentum_in_sync_with_one_worker_follows_the_recurrence_across_a_checkpoint() {
    check_momentum(Mode::Sync { workers: 1 }, 11, 30);
}

#[test]
fn momentum_in_sync_with_two_workers_follows_the_recurrence_across_a_checkpoint() {
    check_momentum(Mode::Sync { workers: 2 }, 11, 30);
}

#[test]
fn momentum_in_async_with_one_worker_follows_the_recurrence_across_a_checkpoint() {
    check_momentum(Mode::Async, 11, 30);
}

/// A gradient of 1 everywhere, whatever the batch and the parameters, over a layout of several
/// store shards (16K values each), so that asynchronous workers start their updates at
/// different shards; each computation takes a little time that varies, so that updates
/// interleave differently.
struct Constant {
    worker: usize,
}

impl Model for Constant {
    fn gradients(&mut self, call: u64, _: &[u32], _: &[f32], grads: &mut [f32]) -> Loss {
        let wait = (call * 7 + self.worker as u64 * 13) % 5;
        std::thread::sleep(Duration::from_micros(50 * wait));
        grads.fill(1.0);
        Ok(0.5)
    }
}

/// Several asynchronous workers, exactly: with a constant gradient and learning rate, every
/// update is the same whichever worker applies it and whenever, so after N updates in any
/// interleaving every parameter and its velocity must be what N updates of the optimiser
/// give, replayed here one value at a time in the same f32 operations. An update lost on some
/// shard, applied twice, or applied with another shard's state shows as a value off.
#[test]
fn momentum_in_async_with_several_workers_updates_every_value_with_its_own_velocity() {
    let layout = common::weights_and_bias(vec![5, 16 * 1024 + 3], 37);
    let len: usize = layout.iter().map(ParamSpan::len).sum();
    let initial: Vec<f32> = (0..len)
        .map(|i| ((i * 37) % 64) as f32 / 8.0 - 4.0)
        .collect();
    let momentum = Momentum {
        schedule: Schedule {
            learning_rate: 1.0 / 1024.0,
            lr_decay: 1.0,
            weight_decay: 0.0,
        },
        momentum: 0.75,
    };
    const UPDATES: u64 = 90;
    // The replay: every value's velocity is the same, its parameter starts where it does.
    let mut velocity = 0.0f32;
    let mut expected = initial.clone();
    let lr = momentum.schedule.learning_rate(0.0);
    for _ in 0..UPDATES {
        velocity = momentum.momentum * velocity + 1.0;
        for p in &mut expected {
            *p -= lr * velocity;
        }
    }
    for workers in [3, 4] {
        let what = format!("momentum, async, {workers} workers");
        let (layout, initial) = (layout.clone(), initial.clone());
        let state = within(&what, move || {
            let mut pool = common::pool_of(workers, layout, 1000, |worker| Constant { worker });
            let mut state = TrainState::new(initial, &momentum);
            // Two segments on the same pool: the second goes on with the first's velocity.
            for end in [UPDATES / 3, UPDATES] {
                let report = async_train(
                    &mut pool,
                    &mut state,
                    &momentum,
                    &batches(),
                    end,
                    &NoObserver,
                )
                .unwrap();
                assert!(report.failures.is_empty(), "{:?}", report.failures);
            }
            state
        });
        assert_eq!(state.step, UPDATES, "{what}");
        let found = state.slot("velocity").expect("the velocity");
        if let Some(i) = (0..len).find(|&i| found[i].to_bits() != velocity.to_bits()) {
            panic!(
                "{what}: velocity[{i}] is {}, {UPDATES} updates give {velocity}",
                found[i]
            );
        }
        if let Some(i) = (0..len).find(|&i| state.params[i].to_bits() != expected[i].to_bits()) {
            panic!(
                "{what}: parameter {i} (store shard {}) is {}, {UPDATES} updates give {}",
                i / (16 * 1024),
                state.params[i],
                expected[i]
            );
        }
    }
}

/// An optimiser with no state trains in both strategies (against the recurrence without
/// momentum) and its checkpoint holds the parameters alone, with an empty `optimizer_state`.
#[test]
fn an_optimiser_without_state_trains_and_round_trips() {
    let descent = Descent(SCHEDULE);
    for mode in [
        Mode::Sync { workers: 1 },
        Mode::Sync { workers: 2 },
        Mode::Async,
    ] {
        let what = format!("descent, {mode:?}");
        let workers = mode.workers();
        let expected = reference(SCHEDULE, 0.0, workers * batches().batch_size, 20);
        let train = mode.train::<Descent>();
        let tmp = tempfile::tempdir().unwrap();
        let dir_path = tmp.path().to_owned();
        let (state, checkpointed) = within(&what, move || {
            let mut state = TrainState::new(INITIAL.to_vec(), &descent);
            assert!(state.slots.is_empty());
            let batches = batches();
            train(
                &mut pool(workers),
                &mut state,
                &descent,
                &batches,
                20,
                &NoObserver,
            )
            .unwrap();
            let dir = CheckpointDir::open(&dir_path).unwrap();
            let checkpointed = round_trip(&dir, &state);
            (state, checkpointed)
        });
        assert_eq!(state.step, 20, "{what}");
        assert!(state.slots.is_empty(), "{what}: {:?}", state.slots);
        check_state(&what, &state, &expected[19], false);
        let (names, slots) = checkpointed;
        assert_eq!(names, ["params/w"], "{what}");
        assert_eq!(slots.as_deref(), Some(""), "{what}");
    }
}

/// A checkpoint file with tensors `params/NAME` and `SLOT/NAME` for each of `slots` (in
/// the spans of `weights_and_bias(vec![2, 3], 3)`, distinct values for each tensor) and `metadata`.
/// Returns the bytes and the values written, flat in the layout's order, params first.
fn file(slots: &[&str], metadata: HashMap<String, String>) -> (Vec<u8>, Vec<Vec<f32>>) {
    let layout = common::weights_and_bias(vec![2, 3], 3);
    let prefixes: Vec<&str> = std::iter::once("params")
        .chain(slots.iter().copied())
        .collect();
    let mut values = vec![Vec::new(); prefixes.len()];
    let mut tensors = Vec::new();
    for (which, prefix) in prefixes.iter().enumerate() {
        for span in &layout {
            let start = values[which].len();
            let data: Vec<f32> = (start..start + span.len())
                .map(|i| which as f32 * 10.0 + i as f32 * 0.25 - 1.0)
                .collect();
            values[which].extend(&data);
            let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
            tensors.push((format!("{prefix}/{}", span.name), span.shape.clone(), bytes));
        }
    }
    let views = tensors.iter().map(|(name, shape, bytes)| {
        (
            name.as_str(),
            TensorView::new(Dtype::F32, shape.clone(), bytes).unwrap(),
        )
    });
    (
        safetensors::serialize(views, Some(metadata)).unwrap(),
        values,
    )
}

fn strings(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A checkpoint as tandem wrote them before the optimiser seam: `params/` and `ema/` tensors,
/// metadata with the step and the caller's keys, no `optimizer_state`. It loads as SGD's state,
/// the moving average in the slot "ema", and saved again it loads the same.
#[test]
fn a_checkpoint_from_before_the_seam_loads_its_ema_as_sgds_average() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("step-0000000007.safetensors");
    let metadata = strings(&[("step", "7"), ("mode", "sync"), ("batch_size", "100")]);
    let (bytes, values) = file(&["ema"], metadata);
    fs::write(&path, bytes).unwrap();
    let layout = common::weights_and_bias(vec![2, 3], 3);
    let loaded = checkpoint::load(&path, &layout).unwrap();
    assert_eq!(loaded.state.step, 7);
    assert_eq!(loaded.state.params, values[0]);
    assert_eq!(
        loaded.state.slots,
        [Slot {
            name: Sgd::AVERAGE.into(),
            values: values[1].clone()
        }]
    );
    assert_eq!(loaded.state.slot("ema"), Some(values[1].as_slice()));
    assert!(loaded.state.fits(&Sgd::default()));
    let caller = BTreeMap::from([
        ("batch_size".to_string(), "100".to_string()),
        ("mode".to_string(), "sync".to_string()),
    ]);
    assert_eq!(loaded.metadata, caller);
    assert_eq!(checkpoint::read_header(&path).unwrap(), (7, caller.clone()));

    let dir = CheckpointDir::open(&tmp.path().join("again")).unwrap();
    let saved = dir
        .save(&loaded.state, &layout, &loaded.metadata, 0, &[])
        .unwrap();
    assert_eq!(checkpoint::load(&saved, &layout).unwrap(), loaded);
}

/// The files that pass the name checks load, with their slots in the file's order: the
/// controls of the hostile cases below.
#[test]
fn optimizer_state_names_the_slots_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("step-0000000001.safetensors");
    let layout = common::weights_and_bias(vec![2, 3], 3);
    for slots in [&[][..], &["ema"], &["velocity", "ema"], &["v", "m"]] {
        let list = slots.join(",");
        let (bytes, values) = file(slots, strings(&[("step", "1"), ("optimizer_state", &list)]));
        fs::write(&path, bytes).unwrap();
        let loaded = checkpoint::load(&path, &layout).unwrap();
        let expected: Vec<Slot> = slots
            .iter()
            .zip(&values[1..])
            .map(|(name, values)| Slot {
                name: name.to_string(),
                values: values.clone(),
            })
            .collect();
        assert_eq!(loaded.state.slots, expected, "{list:?}");
        assert_eq!(loaded.state.params, values[0], "{list:?}");
        assert!(
            loaded.metadata.is_empty(),
            "{list:?}: {:?}",
            loaded.metadata
        );
    }
}

/// `optimizer_state` metadata that is not a short list of distinct, well-formed names is
/// damage, whatever tensors the file holds: loading, reading the header and looking for the
/// newest checkpoint refuse it without panicking.
#[test]
fn hostile_optimizer_state_is_refused_as_damage() {
    let long = "x".repeat(10_000);
    let hundred: Vec<String> = (0..100).map(|i| format!("s{i}")).collect();
    let hundred_list = hundred.join(",");
    let hundred_refs: Vec<&str> = hundred.iter().map(String::as_str).collect();
    // The list, and the slots the file has tensors for: what would otherwise make it load (or
    // fail as a mismatch rather than as damage).
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("ema,ema", vec!["ema"]),
        // With params/ and ema/ tensors, "params" as a slot would load the parameters twice.
        ("params", vec!["ema"]),
        ("ema,params", vec!["ema"]),
        (&long, vec![&long]),
        (&hundred_list, hundred_refs),
        ("ema,,x", vec!["ema", "", "x"]),
        (",ema", vec!["", "ema"]),
        ("ema,", vec!["ema", ""]),
        (",", vec![""]),
        ("EMA", vec!["EMA"]),
        (" ema", vec![" ema"]),
        ("ema/w", vec!["ema/w"]),
        ("\u{e9}ma", vec!["\u{e9}ma"]),
    ];
    let layout = common::weights_and_bias(vec![2, 3], 3);
    let tmp = tempfile::tempdir().unwrap();
    for (index, (list, slots)) in cases.into_iter().enumerate() {
        let shown: String = list.chars().take(40).collect();
        let case = format!("optimizer_state {shown:?} ({} bytes)", list.len());
        let dir = tmp.path().join(format!("case{index}"));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("step-0000000001.safetensors");
        let (bytes, _) = file(&slots, strings(&[("step", "1"), ("optimizer_state", list)]));
        fs::write(&path, bytes).unwrap();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            (
                checkpoint::load(&path, &layout).map(|c| c.state.slots.len()),
                checkpoint::read_header(&path).map(|(step, _)| step),
                checkpoint::load_newest(&dir, &layout, |_| Ok::<_, String>(())).map(|(p, _, _)| p),
            )
        }));
        let Ok((loaded, header, newest)) = outcome else {
            panic!("{case}: reading it panicked");
        };
        for err in [
            loaded.map(|_| ()).expect_err(&format!("{case}: loaded")),
            header
                .map(|_| ())
                .expect_err(&format!("{case}: header read")),
        ] {
            assert!(
                matches!(err, CheckpointError::Corrupt { .. }),
                "{case}: {err}"
            );
            let message = err.to_string();
            assert!(message.starts_with(&path.display().to_string()), "{case}");
            assert!(message.contains("optimizer_state"), "{case}: {message}");
        }
        assert!(
            matches!(newest, Err(CheckpointError::NoneFound { ref skipped, .. }) if skipped.len() == 1),
            "{case}: {newest:?}"
        );
    }
}

/// Runs `optimizer` on `state` in both strategies, each on a fresh pool: both must refuse it as
/// a configuration error before any work, leaving the state as it was.
#[track_caller]
fn refused<O: Optimizer>(what: &str, optimizer: &O, state: &TrainState) {
    for (strategy, train) in [("sync", sync_train as Train<O>), ("async", async_train)] {
        let mut pool = pool(2);
        let mut trained = state.clone();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            train(
                &mut pool,
                &mut trained,
                optimizer,
                &batches(),
                10,
                &NoObserver,
            )
        }));
        let Ok(result) = outcome else {
            panic!("{what}, {strategy}: panicked instead of refusing the state");
        };
        match result {
            Err(TrainError::Config(ConfigError::OtherOptimizerState { .. })) => {}
            other => panic!("{what}, {strategy}: {other:?}"),
        }
        assert_eq!(trained, *state, "{what}, {strategy}: the state was touched");
        assert!(
            pool.replicas().iter().all(|r| r.calls == 0),
            "{what}, {strategy}: a replica computed gradients"
        );
    }
}

#[test]
fn a_state_that_does_not_fit_the_optimiser_is_refused_before_any_work() {
    let params = INITIAL.to_vec();
    let sgd = Sgd::default();
    let descent = Descent(SCHEDULE);
    let with_slots = |slots: &[(&str, usize)]| TrainState {
        params: params.clone(),
        slots: slots
            .iter()
            .map(|&(name, len)| Slot {
                name: name.into(),
                values: vec![0.25; len],
            })
            .collect(),
        step: 0,
    };
    refused(
        "momentum on SGD's state",
        &MOMENTUM,
        &TrainState::new(params.clone(), &sgd),
    );
    refused(
        "SGD on momentum's state",
        &sgd,
        &TrainState::new(params.clone(), &MOMENTUM),
    );
    refused(
        "SGD on a state without its average",
        &sgd,
        &TrainState::new(params.clone(), &descent),
    );
    refused(
        "descent on SGD's state",
        &descent,
        &TrainState::new(params.clone(), &sgd),
    );
    refused(
        "a short velocity",
        &MOMENTUM,
        &with_slots(&[("velocity", 1)]),
    );
    refused(
        "a long velocity",
        &MOMENTUM,
        &with_slots(&[("velocity", 3)]),
    );
    refused(
        "an empty velocity",
        &MOMENTUM,
        &with_slots(&[("velocity", 0)]),
    );
    refused(
        "a velocity and an extra slot",
        &MOMENTUM,
        &with_slots(&[("velocity", 2), ("ema", 2)]),
    );
    refused(
        "the average twice",
        &sgd,
        &with_slots(&[("ema", 2), ("ema", 2)]),
    );
    refused(
        "two slots in the other order",
        &TwoSlots,
        &with_slots(&[("v", 2), ("m", 2)]),
    );
    refused("one of two slots", &TwoSlots, &with_slots(&[("m", 2)]));
    // The controls: the same optimisers on states that fit them train.
    let mut fits = with_slots(&[("m", 2), ("v", 2)]);
    sync_train(
        &mut pool(2),
        &mut fits,
        &TwoSlots,
        &batches(),
        3,
        &NoObserver,
    )
    .unwrap();
    let mut fits = with_slots(&[("velocity", 2)]);
    async_train(
        &mut pool(2),
        &mut fits,
        &MOMENTUM,
        &batches(),
        3,
        &NoObserver,
    )
    .unwrap();
    assert_eq!(fits.step, 3);
}
