//! The whole model and the sync strategy on the GPU against the CPU (needs `--features cuda`
//! and a GPU or the driver stand-in; without one every test prints `SKIPPED: ...` on stderr and
//! returns, or fails under `TANDEM_REQUIRE_GPU=1`: see `tandem_testkit`).
#![cfg(feature = "cuda")]

use rand::SeedableRng;
use tandem_core::{Replica, StepLoss, TrainState};
use tandem_kernels::{CudaBackend, KernelError};
use tandem_mnist::Mnist;
use tandem_model::{Mlp, MlpReplica, Network};
use tandem_optim::Sgd;
use tandem_pool::{Device, WorkerPool};
use tandem_strategy::{train, BatchScaling, Batches, Mode, NoObserver, Strategy};
use tandem_tensor::{CpuBackend, ExampleSet};

/// `count` replicas on GPU 0, or `None` after saying on stderr that the test is skipped.
fn gpu_replicas(
    count: usize,
    train: &ExampleSet,
    batch: usize,
) -> Option<Vec<MlpReplica<CudaBackend>>> {
    let mut replicas = Vec::new();
    for _ in 0..count {
        let gpu = tandem_testkit::or_skip(CudaBackend::new(0), KernelError::is_no_device)?;
        replicas.push(MlpReplica::new(Mlp::mnist(), gpu, train, batch).expect("GPU replica"));
    }
    Some(replicas)
}

/// The MNIST data: `$TANDEM_MNIST_DIR` (set by the GPU bundle, which runs far from this
/// checkout), else the repository's copy ([`tandem_testkit::mnist_dir`]).
fn train_set() -> ExampleSet {
    let dir = tandem_testkit::mnist_dir();
    let mnist = Mnist::load(&dir).expect("the repository's MNIST copy");
    mnist.train.into_examples().expect("consistent split")
}

// Shapes are small (batches of 12 to 40, a few steps), non-multiples of the kernels' 32-wide
// tiles: CI runs these on the driver stand-in, which interprets every kernel on the CPU.

/// Examples per replica in the two-replica runs; the single replica gets twice as many.
const HALF_BATCH: usize = 12;
/// Steps of the sync runs: issue 11's "after 20 steps".
const STEPS: u64 = 20;

fn initial() -> TrainState {
    TrainState::new(
        Mlp::mnist().init(0.1, &mut rand_chacha::ChaCha8Rng::seed_from_u64(4)),
        &Sgd::default(),
    )
}

/// The moving average of the parameters ([`Sgd::AVERAGE`]).
fn ema(state: &TrainState) -> &[f32] {
    state
        .slot(Sgd::AVERAGE)
        .expect("a state trained by Sgd holds its moving average")
}

fn max_relative_difference(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

fn sync_run(replicas: Vec<MlpReplica<CudaBackend>>, batch: usize, steps: u64) -> TrainState {
    let gpu = Device::Cuda { ordinal: 0 };
    sync_run_scaled(replicas, gpu, batch, steps, BatchScaling::Auto)
}

/// [`sync_run`] with `scaling` of the learning rate, on any backend's replicas, all on
/// `device`.
fn sync_run_scaled<B: tandem_tensor::Backend>(
    replicas: Vec<MlpReplica<B>>,
    device: Device,
    batch: usize,
    steps: u64,
    scaling: BatchScaling,
) -> TrainState {
    let devices = (0..replicas.len()).map(|_| device).collect();
    let mut replicas = replicas.into_iter();
    let mut pool =
        WorkerPool::new(devices, |_| replicas.next().ok_or("one replica per device")).unwrap();
    let mut state = initial();
    let batches = Batches {
        batch_size: batch,
        ..Batches::default()
    };
    let strategy = Strategy {
        batch_scaling: scaling,
        exchange: tandem_strategy::Exchange::F32,
        ..Strategy::from(Mode::Sync)
    };
    train(
        strategy,
        &mut pool,
        &mut state,
        &Sgd::default(),
        &batches,
        steps,
        &NoObserver,
    )
    .expect("GPU training");
    state
}

/// The reference's network, a deeper one and a softmax classifier (no hidden layer): every
/// layer of the layer library on the GPU, against the CPU, forward and backward.
#[test]
fn whole_model_gradients_on_the_gpu_match_the_cpu() {
    let train = train_set();
    let networks = [
        Mlp::mnist(),
        Mlp::mnist_with(&[64, 32]).unwrap(),
        Mlp::mnist_with(&[]).unwrap(),
    ];
    for mlp in networks {
        let Some(gpu) = tandem_testkit::or_skip(CudaBackend::new(0), KernelError::is_no_device)
        else {
            return;
        };
        let mut gpu = MlpReplica::new(mlp.clone(), gpu, &train, 40).expect("GPU replica");
        let mut cpu = MlpReplica::new(mlp.clone(), CpuBackend, &train, 40).unwrap();
        let params = mlp.init(0.1, &mut rand_chacha::ChaCha8Rng::seed_from_u64(4));
        let batch: Vec<u32> = (0..40).map(|i| i * 37 % 55_000).collect();
        let mut grads = Vec::new();
        let mut losses = Vec::new();
        for replica in [&mut gpu as &mut dyn Replica, &mut cpu] {
            replica.bind_thread().unwrap();
            replica
                .set_params(&mut |p| p.copy_from_slice(&params))
                .unwrap();
            let loss = match replica.compute_gradients(&batch).unwrap() {
                StepLoss::Known(loss) => loss,
                StepLoss::OnDevice => {
                    let mut taken = Vec::new();
                    replica.take_losses(&mut taken).unwrap();
                    assert_eq!(taken.len(), 1, "one step, one loss");
                    taken[0]
                }
            };
            losses.push(loss);
            let mut g = Vec::new();
            replica.read_gradients(&mut |r| g = r.to_vec()).unwrap();
            grads.push(g);
        }
        let name = mlp.name();
        assert!(grads[0].iter().all(|g| g.is_finite()), "{name}");
        assert!(grads[0].iter().any(|&g| g != 0.0), "{name}: no gradient");
        assert!(
            (losses[0] - losses[1]).abs() <= 1e-5 * losses[1].abs(),
            "{name}: loss {losses:?}"
        );
        let error = max_relative_difference(&grads[0], &grads[1]);
        assert!(error <= 1e-5, "{name}: gradients differ by {error}");
    }
}

#[test]
fn sync_with_two_replicas_on_one_gpu_equals_one_replica_with_twice_the_batch() {
    let train = train_set();
    let Some(pair) = gpu_replicas(2, &train, HALF_BATCH) else {
        return;
    };
    let Some(single) = gpu_replicas(1, &train, 2 * HALF_BATCH) else {
        return;
    };
    let (a, b) = (
        sync_run(pair, HALF_BATCH, STEPS),
        sync_run(single, 2 * HALF_BATCH, STEPS),
    );
    assert!(
        max_relative_difference(&b.params, &initial().params) > 1e-3,
        "training did not move"
    );
    let (params, ema) = (
        max_relative_difference(&a.params, &b.params),
        max_relative_difference(ema(&a), ema(&b)),
    );
    assert!(params <= 1e-5 && ema <= 1e-5, "params {params}, ema {ema}");
}

/// A synchronous run's learning-rate scaling reaches the update on the device: scaled, the GPU
/// run moves away from the unscaled one, and stays with the CPU's scaled run.
#[test]
fn a_scaled_sync_rate_is_the_same_on_the_gpu_as_on_the_cpu() {
    let train = train_set();
    let Some(scaled) = gpu_replicas(1, &train, HALF_BATCH) else {
        return;
    };
    let Some(plain) = gpu_replicas(1, &train, HALF_BATCH) else {
        return;
    };
    let (triple, none) = (BatchScaling::Factor(3.0), BatchScaling::Factor(1.0));
    let device = Device::Cuda { ordinal: 0 };
    let gpu = sync_run_scaled(scaled, device, HALF_BATCH, STEPS, triple);
    let gpu_plain = sync_run_scaled(plain, device, HALF_BATCH, STEPS, none);
    let cpu_replica = MlpReplica::new(Mlp::mnist(), CpuBackend, &train, HALF_BATCH).unwrap();
    let on_cpu = Device::Cpu { worker: 0 };
    let cpu = sync_run_scaled(vec![cpu_replica], on_cpu, HALF_BATCH, STEPS, triple);
    let apart = max_relative_difference(&gpu.params, &gpu_plain.params);
    let error = max_relative_difference(&gpu.params, &cpu.params);
    assert!(apart > 1e-4, "the scaling changed nothing: {apart}");
    assert!(
        error <= 1e-5 && error * 10.0 < apart,
        "GPU {error} from the CPU, {apart} from unscaled"
    );
}

#[test]
fn repeated_sync_runs_on_the_gpu_are_bitwise_identical() {
    let train = train_set();
    let Some(first) = gpu_replicas(2, &train, HALF_BATCH) else {
        return;
    };
    let Some(second) = gpu_replicas(2, &train, HALF_BATCH) else {
        return;
    };
    let (a, b) = (
        sync_run(first, HALF_BATCH, STEPS),
        sync_run(second, HALF_BATCH, STEPS),
    );
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a.params), bits(&b.params));
    assert_eq!(bits(ema(&a)), bits(ema(&b)));
}
