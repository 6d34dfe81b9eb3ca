//! The whole model and the sync strategy on the GPU against the CPU (needs `--features cuda`
//! and a GPU or the driver stand-in; without one every test prints `SKIPPED: ...` on stderr and
//! returns, or fails under `TANDEM_REQUIRE_GPU=1`: see `tandem_testkit`).
#![cfg(feature = "cuda")]

mod common;

use common::{ema, gradients, initial_state, largest_logit, mnist, relative_error};
use rand::SeedableRng;
use tandem_core::DType;
use tandem_core::{Replica, StepLoss, TrainState};
use tandem_kernels::{CudaBackend, KernelError};
use tandem_model::{Mlp, MlpReplica, Network};
use tandem_optim::Sgd;
use tandem_pool::{Device, WorkerPool};
use tandem_strategy::{train, BatchScaling, Batches, Mode, NoObserver, Strategy};
use tandem_tensor::{CpuBackend, ExampleSet, NarrowCpuBackend};

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
    mnist().train.clone()
}

// Shapes are small (batches of 12 to 40, a few steps), non-multiples of the kernels' 32-wide
// tiles: CI runs these on the driver stand-in, which interprets every kernel on the CPU.

/// Examples per replica in the two-replica runs; the single replica gets twice as many.
const HALF_BATCH: usize = 12;
/// Steps of the sync runs: issue 11's "after 20 steps".
const STEPS: u64 = 20;

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
    sync_train(&mut pool_on(replicas, device), batch, steps, scaling)
}

/// A pool of `replicas`, all on `device`.
fn pool_on<B: tandem_tensor::Backend>(
    replicas: Vec<MlpReplica<B>>,
    device: Device,
) -> WorkerPool<MlpReplica<B>> {
    let devices = (0..replicas.len()).map(|_| device).collect();
    let mut replicas = replicas.into_iter();
    WorkerPool::new(devices, |_| replicas.next().ok_or("one replica per device")).unwrap()
}

/// `steps` synchronous steps of `pool` from [`initial_state`] with `scaling` of the learning
/// rate.
fn sync_train<B: tandem_tensor::Backend>(
    pool: &mut WorkerPool<MlpReplica<B>>,
    batch: usize,
    steps: u64,
    scaling: BatchScaling,
) -> TrainState {
    let mut state = initial_state(4);
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
        pool,
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

/// A label past the network's classes is refused when a GPU replica opens, with the CPU's
/// error: a GPU step leaves its loss on the device, so it could only have made the loss NaN.
#[test]
fn a_label_past_the_classes_is_refused_on_the_gpu_as_on_the_cpu() {
    let Some(gpu) = tandem_testkit::or_skip(CudaBackend::new(0), KernelError::is_no_device) else {
        return;
    };
    let mlp = Mlp::new(3, &[4], 2).unwrap();
    let pixels: Vec<u8> = (0..30).map(|v| (v * 37 % 256) as u8).collect();
    let bad = ExampleSet::new(3, pixels, vec![0, 1, 0, 1, 1, 0, 0, 2, 1, 0]).unwrap();
    let cpu = match MlpReplica::new(mlp.clone(), CpuBackend, &bad, 4) {
        Err(e) => e,
        Ok(_) => panic!("the CPU replica took a label past the classes"),
    };
    match MlpReplica::new(mlp, gpu, &bad, 4) {
        Err(KernelError::Shape(e)) => assert_eq!(e, cpu),
        Err(e) => panic!("the GPU replica refused with another error: {e}"),
        Ok(_) => panic!("the GPU replica took a label past the classes"),
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
        max_relative_difference(&b.params, &initial_state(4).params) > 1e-3,
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

/// A replica of the MNIST network on GPU 0 computing in `dtype` (loss-scaled from 2^10 in
/// f16), or `None` after saying that the test is skipped.
fn narrow_gpu_replica(
    dtype: DType,
    train: &ExampleSet,
    batch: usize,
) -> Option<MlpReplica<CudaBackend>> {
    let gpu = CudaBackend::with_dtype(0, dtype);
    let gpu = tandem_testkit::or_skip(gpu, KernelError::is_no_device)?;
    let replica = MlpReplica::new(Mlp::mnist(), gpu, train, batch).expect("GPU replica");
    Some(replica.with_initial_loss_scale(NARROW_SCALE))
}

/// Its CPU twin.
fn narrow_cpu_replica(
    dtype: DType,
    train: &ExampleSet,
    batch: usize,
) -> MlpReplica<NarrowCpuBackend> {
    let cpu = NarrowCpuBackend::new(dtype).expect("a 16-bit type");
    let replica = MlpReplica::new(Mlp::mnist(), cpu, train, batch).expect("CPU replica");
    replica.with_initial_loss_scale(NARROW_SCALE)
}

/// The f16 replicas' loss scale here: small gradients survive, nothing overflows.
const NARROW_SCALE: f32 = 1024.0;

/// Issue 29's acceptance on the GPU, one pass: the 16-bit pass on the GPU (tensor-core
/// products, every value rounded once) against its CPU twin, from the same parameters on the
/// same batch. Both make the same roundings of f32 values that differ only in the last bits of
/// their sums: the twin sums in its own order and rounds to nearest, the tensor cores cut
/// and truncate each 16-term step (the stand-in as the H200: the same gradients, bit for bit,
/// by the digest printed below). They part only where such a value lies within those bits of
/// a rounding boundary, each by one step of the type, and a flipped activation reaches a row
/// of gradients. Hence three bounds. Against f32 each
/// is within (8 + L) u in norm (derived in `mixed_precision.rs`), so they are within
/// 2 (8 + L) u of each other; at least 95% of the gradients are equal; and they are at least
/// 4 times closer to each other than either is to f32, which differs at every rounding.
/// Measured, the same on the H200 and on the stand-in: bf16 0, all 397,510 gradients equal
/// (its products' sums are mostly exact in f32), against 3.7e-3 from f32; f16 7.6e-5, all but
/// 7,024 equal (98.2%), against 5.9e-4 (7.8 times farther). Every gradient (times the loss
/// scale it was computed at) is a value of the type.
#[test]
fn sixteen_bit_gradients_on_the_gpu_equal_the_cpu_twin() {
    let train = train_set();
    let params = initial_state(4).params;
    let batch: Vec<u32> = (0..HALF_BATCH as u32).map(|i| i * 37 % 55_000).collect();
    let mut f32_replica = MlpReplica::new(Mlp::mnist(), CpuBackend, &train, HALF_BATCH).unwrap();
    let exact = gradients(&mut f32_replica, &params, &batch);
    let logit = largest_logit(&params, &batch);
    for (dtype, significant_bits) in [(DType::BF16, 8), (DType::F16, 11)] {
        let Some(mut gpu) = narrow_gpu_replica(dtype, &train, HALF_BATCH) else {
            return;
        };
        let mut cpu = narrow_cpu_replica(dtype, &train, HALF_BATCH);
        let on_gpu = gradients(&mut gpu, &params, &batch);
        let on_cpu = gradients(&mut cpu, &params, &batch);
        let twin = relative_error(&on_gpu, &on_cpu);
        let from_f32 = relative_error(&on_gpu, &exact);
        let bound = 2.0 * (8.0 + logit) * 2f64.powi(-(significant_bits + 1));
        let equal = on_gpu.iter().zip(&on_cpu).filter(|(a, b)| a == b).count();
        // FNV-1a of the gradients' bits: the stand-in and a GPU compared in one line.
        let digest = on_gpu.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, g| {
            (h ^ u64::from(g.to_bits())).wrapping_mul(0x0100_0000_01b3)
        });
        eprintln!(
            "{dtype}: from the twin {twin:.2e} (bound {bound:.2e}), from f32 {from_f32:.2e}; \
             {equal} of {} gradients equal; digest {digest:016x}",
            on_gpu.len()
        );
        assert!(
            twin <= bound && twin * 4.0 <= from_f32 && equal * 20 >= on_gpu.len() * 19,
            "{dtype}"
        );
        let scale = gpu.loss_scaling().map_or(1.0, |s| s.scale());
        let mut held: Vec<f32> = on_gpu.iter().map(|g| g * scale).collect();
        let stored = held.clone();
        tandem_tensor::round_to(dtype, &mut held);
        assert_eq!(
            held, stored,
            "{dtype}: a gradient that is not a {dtype} value"
        );
    }
}

/// Issue 29's acceptance on the GPU, training: `cuda:0x2` synchronous in bf16 and f16 is
/// bitwise reproducible, and its first step equals the CPU twin's (`cpu:2`) within the
/// bounds of the test above, carried through the update: the step's parameters are at least
/// 10 times closer to the twin's than to the f32 step's (measured: bf16 3.8e-8 against
/// 2.0e-2, f16 1.7e-4 against 1.7e-2). Over 20 steps (measured, not asserted), bf16 stays
/// there (2.5e-5 against 5.8e-2), while f16 parts from its twin as fast as from f32: at this rate (0.8 on 24 examples the parameters
/// grow to ten times their initial size within 10 steps) a rounding that lands on the other
/// side of a boundary is amplified at every later step, as it is between any two orders of
/// summation in 16 bits.
#[test]
fn sixteen_bit_sync_on_two_gpu_replicas_is_reproducible_and_equals_the_twin() {
    let train = train_set();
    let (cpu, gpu) = (Device::Cpu { worker: 0 }, Device::Cuda { ordinal: 0 });
    let auto = BatchScaling::Auto;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for dtype in [DType::BF16, DType::F16] {
        let mut runs = Vec::new();
        // Long enough to run, capture and replay the step's graph (the stand-in interprets it).
        for steps in [1, 8, 8] {
            let replicas: Option<Vec<_>> = (0..2)
                .map(|_| narrow_gpu_replica(dtype, &train, HALF_BATCH))
                .collect();
            let Some(replicas) = replicas else { return };
            runs.push(sync_run_scaled(replicas, gpu, HALF_BATCH, steps, auto));
        }
        assert_eq!(bits(&runs[1].params), bits(&runs[2].params), "{dtype}");
        assert_eq!(bits(ema(&runs[1])), bits(ema(&runs[2])), "{dtype}");
        let twin: Vec<_> = (0..2)
            .map(|_| narrow_cpu_replica(dtype, &train, HALF_BATCH))
            .collect();
        let on_cpu = sync_run_scaled(twin, cpu, HALF_BATCH, 1, auto);
        let f32_replicas = (0..2)
            .map(|_| MlpReplica::new(Mlp::mnist(), CpuBackend, &train, HALF_BATCH).unwrap())
            .collect();
        let on_f32 = sync_run_scaled(f32_replicas, cpu, HALF_BATCH, 1, auto);
        let twin = max_relative_difference(&runs[0].params, &on_cpu.params);
        let from_f32 = max_relative_difference(&runs[0].params, &on_f32.params);
        eprintln!("{dtype}: one step from the twin {twin:.2e}, from f32 {from_f32:.2e}");
        assert!(twin * 10.0 <= from_f32, "{dtype}");
    }
}

/// An f16 pass that overflows is computed again at half the scale, on the GPU as on the CPU:
/// started far too high, the GPU replica halves as often as its twin, hands out the gradients
/// of the pass that held, and leaves one loss for the step (not one per pass).
#[test]
fn an_overflowing_f16_pass_on_the_gpu_is_computed_again_leaving_one_loss() {
    let train = train_set();
    let params = initial_state(4).params;
    let batch: Vec<u32> = (0..HALF_BATCH as u32).map(|i| i * 41 % 55_000).collect();
    let Some(gpu) = narrow_gpu_replica(DType::F16, &train, HALF_BATCH) else {
        return;
    };
    let mut gpu = gpu.with_initial_loss_scale(2f32.powi(40));
    let mut cpu =
        narrow_cpu_replica(DType::F16, &train, HALF_BATCH).with_initial_loss_scale(2f32.powi(40));
    let on_gpu = gradients(&mut gpu, &params, &batch);
    let on_cpu = gradients(&mut cpu, &params, &batch);
    let (g, c) = (gpu.loss_scaling().unwrap(), cpu.loss_scaling().unwrap());
    assert!(g.overflows() > 0, "2^40 did not overflow");
    assert_eq!((g.overflows(), g.scale()), (c.overflows(), c.scale()));
    assert!(relative_error(&on_gpu, &on_cpu) < 1e-3);
    let mut losses = Vec::new();
    gpu.take_losses(&mut losses).unwrap();
    assert_eq!(losses.len(), 1, "{losses:?}");
    assert!(losses[0].is_finite());
}

/// Each replica's loss scaling: its overflows and its scale.
fn scalers(replicas: &[impl Replica]) -> Vec<(u64, f32)> {
    (replicas.iter())
        .map(|r| r.loss_scaling().expect("f16 scales"))
        .map(|s| (s.overflows(), s.scale()))
        .collect()
}

/// An f16 pass that overflows inside `cuda:0x2` sync training, where the device store keeps
/// the parameters of record and copies each replica's gradients to its outbox after the step
/// (the replicas unscale their gradients on the device, inside the step): the pass computed
/// again at half the scale runs the store's work after the step again, so the step hands on
/// the gradients of the pass that held. Started at 2^40, the GPU replicas halve as often as
/// their CPU twins (`cpu:2`, through the host store), and the steps' parameters are finite and
/// at least 10 times closer to the twin's than to f32's.
#[test]
fn an_overflowing_f16_pass_in_device_sync_training_hands_on_the_pass_that_held() {
    const STEPS: u64 = 2;
    let train = train_set();
    let (cpu, gpu) = (Device::Cpu { worker: 0 }, Device::Cuda { ordinal: 0 });
    let too_high = 2f32.powi(40);
    let replicas: Option<Vec<_>> = (0..2)
        .map(|_| narrow_gpu_replica(DType::F16, &train, HALF_BATCH))
        .collect();
    let Some(replicas) = replicas else { return };
    let replicas = replicas
        .into_iter()
        .map(|r| r.with_initial_loss_scale(too_high))
        .collect();
    let mut on_gpu = pool_on(replicas, gpu);
    let state = sync_train(&mut on_gpu, HALF_BATCH, STEPS, BatchScaling::Auto);
    let twins = (0..2)
        .map(|_| {
            narrow_cpu_replica(DType::F16, &train, HALF_BATCH).with_initial_loss_scale(too_high)
        })
        .collect();
    let mut on_cpu = pool_on(twins, cpu);
    let twin = sync_train(&mut on_cpu, HALF_BATCH, STEPS, BatchScaling::Auto);
    let halved = scalers(on_gpu.replicas());
    assert!(
        halved.iter().all(|&(overflows, _)| overflows > 0),
        "{halved:?}"
    );
    assert_eq!(halved, scalers(on_cpu.replicas()));
    assert!(state.params.iter().all(|p| p.is_finite()));
    let f32_replicas = (0..2)
        .map(|_| MlpReplica::new(Mlp::mnist(), CpuBackend, &train, HALF_BATCH).unwrap())
        .collect();
    let on_f32 = sync_run_scaled(f32_replicas, cpu, HALF_BATCH, STEPS, BatchScaling::Auto);
    let from_twin = max_relative_difference(&state.params, &twin.params);
    let from_f32 = max_relative_difference(&state.params, &on_f32.params);
    eprintln!("{STEPS} steps from 2^40: from the twin {from_twin:.2e}, from f32 {from_f32:.2e}");
    assert!(
        from_twin * 10.0 <= from_f32,
        "{from_twin} against {from_f32}"
    );
}
