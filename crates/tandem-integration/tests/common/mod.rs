//! Shared set-up for the training tests (`training.rs`, `async_accuracy.rs`, the mixed-precision
//! tests of `mixed_precision.rs` and `model_gpu.rs`).

use std::sync::OnceLock;

use rand::SeedableRng;
use tandem_core::{Replica, TrainState};
use tandem_mnist::Mnist;
use tandem_model::{Mlp, MlpReplica, Network};
use tandem_optim::Sgd;
use tandem_pool::{Device, WorkerPool};
use tandem_tensor::{CpuBackend, ExampleSet};

pub struct Data {
    pub train: ExampleSet,
    #[allow(dead_code)] // The GPU tests train only.
    pub test: ExampleSet,
}

/// The real MNIST data ([`tandem_testkit::mnist_dir`]), loaded once per test binary.
pub fn mnist() -> &'static Data {
    static DATA: OnceLock<Data> = OnceLock::new();
    DATA.get_or_init(|| {
        let dir = tandem_testkit::mnist_dir();
        let mnist = Mnist::load(&dir).expect("the repository's MNIST copy loads");
        let set = |s: tandem_mnist::Split| s.into_examples().unwrap();
        Data {
            train: set(mnist.train),
            test: set(mnist.test),
        }
    })
}

pub fn cpu_pool(workers: usize, batch: usize) -> WorkerPool<MlpReplica<CpuBackend>> {
    pool_on(
        (0..workers).map(|worker| Device::Cpu { worker }).collect(),
        batch,
    )
}

/// `workers` simulated workers ([`Device::Sim`]) of the MLP on the CPU.
#[allow(dead_code)] // Not every test binary simulates.
pub fn sim_pool(workers: usize, batch: usize) -> WorkerPool<MlpReplica<CpuBackend>> {
    pool_on(
        (0..workers).map(|worker| Device::Sim { worker }).collect(),
        batch,
    )
}

fn pool_on(devices: Vec<Device>, batch: usize) -> WorkerPool<MlpReplica<CpuBackend>> {
    WorkerPool::new(devices, |_| {
        MlpReplica::new(Mlp::mnist(), CpuBackend, &mnist().train, batch)
    })
    .unwrap()
}

/// A fresh run of [`Sgd`] from the model's initialisation with `seed`.
pub fn initial_state(seed: u64) -> TrainState {
    TrainState::new(
        Mlp::mnist().init(0.1, &mut rand_chacha::ChaCha8Rng::seed_from_u64(seed)),
        &Sgd::default(),
    )
}

/// The moving average of the parameters ([`Sgd::AVERAGE`]) of a state trained by [`Sgd`].
pub fn ema(state: &TrainState) -> &[f32] {
    state
        .slot(Sgd::AVERAGE)
        .expect("a state trained by Sgd holds its moving average")
}

/// Test accuracy of the averaged and the raw parameters.
#[allow(dead_code)] // The GPU tests train only.
pub fn test_accuracy(state: &TrainState) -> (f64, f64) {
    let evaluate = |params: &[f32]| {
        Mlp::mnist()
            .evaluate(&CpuBackend, params, &mnist().test)
            .unwrap()
    };
    (evaluate(ema(state)), evaluate(&state.params))
}

#[allow(dead_code)] // Not every test binary trains on two CPU workers.
/// Trains `state` in `mode` on two fresh CPU workers of batches of 100 with the reference's
/// optimiser, in `batches`' order, until `end_step` (or until `observer` stops it).
pub fn train_on_two_cpus(
    mode: tandem_strategy::Mode,
    state: &mut TrainState,
    batches: &tandem_strategy::Batches,
    end_step: u64,
    observer: &dyn tandem_strategy::Observer,
) -> tandem_strategy::TrainReport {
    let mut pool = cpu_pool(2, 100);
    tandem_strategy::train(
        mode,
        &mut pool,
        state,
        &Sgd::default(),
        batches,
        end_step,
        observer,
    )
    .expect("training")
}

#[allow(dead_code)] // Only the mixed-precision tests compare passes.
/// The gradients of `replica` on `batch` from `params`, as it hands them out.
pub fn gradients(replica: &mut dyn Replica, params: &[f32], batch: &[u32]) -> Vec<f32> {
    replica.bind_thread().unwrap();
    replica
        .set_params(&mut |p| p.copy_from_slice(params))
        .unwrap();
    replica.compute_gradients(batch).unwrap();
    let mut out = Vec::new();
    replica.read_gradients(&mut |g| out = g.to_vec()).unwrap();
    out
}

#[allow(dead_code)] // Only the mixed-precision tests compare passes.
/// ||a - b|| / ||b|| in f64.
pub fn relative_error(a: &[f32], b: &[f32]) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        diff += (f64::from(x) - f64::from(y)).powi(2);
        norm += f64::from(y).powi(2);
    }
    (diff / norm).sqrt()
}

#[allow(dead_code)] // Only the mixed-precision tests compare passes.
/// The largest |logit| of `params` on `batch`, in f32.
pub fn largest_logit(params: &[f32], batch: &[u32]) -> f64 {
    let train = &mnist().train;
    let x: Vec<f32> = (batch.iter())
        .flat_map(|&i| {
            train
                .features_of(i as usize)
                .iter()
                .map(|&v| f32::from(v) / 255.0)
        })
        .collect();
    let logits = Mlp::mnist().logits(&CpuBackend, params, &x).unwrap();
    logits
        .iter()
        .fold(0.0f64, |m, &l| m.max(f64::from(l).abs()))
}
