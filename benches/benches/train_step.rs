//! One worker's forward + backward pass on a batch of 100 real MNIST examples, and one whole
//! synchronous step of two workers (gradients, reduction, update).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rand::SeedableRng;
use tandem_benches::mnist_train;
use tandem_core::{Replica, TrainState};
use tandem_model::{Mlp, MlpReplica, Network};
use tandem_optim::Sgd;
use tandem_pool::{Device, WorkerPool};
use tandem_strategy::{Batches, Mode, NoObserver};
use tandem_tensor::CpuBackend;

fn step(c: &mut Criterion) {
    let train = mnist_train();
    let params = Mlp::mnist().init(0.1, &mut rand_chacha::ChaCha8Rng::seed_from_u64(1));
    let mut group = c.benchmark_group("train_step");
    group.throughput(Throughput::Elements(100));

    let mut replica = MlpReplica::new(Mlp::mnist(), CpuBackend, &train, 100).expect("replica");
    replica
        .set_params(&mut |p| p.copy_from_slice(&params))
        .expect("params");
    let batch: Vec<u32> = (0..100).collect();
    group.bench_function("forward+backward, 1 worker, batch 100", |b| {
        b.iter(|| replica.compute_gradients(&batch).expect("step"))
    });

    let devices = (0..2).map(|worker| Device::Cpu { worker }).collect();
    let mut pool = WorkerPool::new(devices, |_| {
        MlpReplica::new(Mlp::mnist(), CpuBackend, &train, 100)
    })
    .expect("pool");
    // NoObserver asks for no reports (its log_every is 0).
    let (sgd, batches) = (Sgd::default(), Batches::default());
    let mut state = TrainState::new(params, &sgd);
    group.throughput(Throughput::Elements(200 * 10));
    group.bench_function("sync, 2 workers x batch 100, 10 steps", |b| {
        b.iter(|| {
            let end = state.step + 10;
            tandem_strategy::train(
                Mode::Sync,
                &mut pool,
                &mut state,
                &sgd,
                &batches,
                end,
                &NoObserver,
            )
            .expect("train")
        })
    });
    group.finish();
}

criterion_group!(benches, step);
criterion_main!(benches);
