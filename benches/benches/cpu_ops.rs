//! Each CPU operation at the shapes of one worker's step (batch 100, 784-500-10).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tandem_benches::{random, BATCH, CLASSES, HIDDEN, INPUTS, STEP_PRODUCTS};
use tandem_tensor::cpu::{self, UpdateStep};

fn matmuls(c: &mut Criterion) {
    let mut group = c.benchmark_group("matmul");
    for (name, spec) in STEP_PRODUCTS {
        let a = random(spec.m * spec.k, 1);
        let b = random(spec.k * spec.n, 2);
        let mut out = vec![0.0; spec.m * spec.n];
        group.throughput(Throughput::Elements((2 * spec.m * spec.n * spec.k) as u64));
        group.bench_function(BenchmarkId::from_parameter(name), |bench| {
            bench.iter(|| cpu::matmul(spec, &a, &b, &mut out))
        });
    }
    group.finish();
}

fn elementwise(c: &mut Criterion) {
    let mut group = c.benchmark_group("elementwise");
    let hidden = random(BATCH * HIDDEN, 3);
    let bias = random(HIDDEN, 4);
    let mut x = hidden.clone();
    group.bench_function("bias_relu 100x500", |b| {
        b.iter(|| {
            x.copy_from_slice(&hidden);
            cpu::bias_relu(&mut x, &bias)
        })
    });
    let mut grad = hidden.clone();
    group.bench_function("relu_backward 100x500", |b| {
        b.iter(|| cpu::relu_backward(&mut grad, &x))
    });
    let mut sums = vec![0.0; HIDDEN];
    group.bench_function("column_sum 100x500", |b| {
        b.iter(|| cpu::column_sum(&hidden, &mut sums))
    });
    let logits = random(BATCH * CLASSES, 5);
    let labels: Vec<u32> = (0..BATCH as u32).map(|i| i % CLASSES as u32).collect();
    let mut dlogits = vec![0.0; BATCH * CLASSES];
    group.bench_function("softmax_cross_entropy 100x10", |b| {
        b.iter(|| cpu::softmax_cross_entropy(&logits, &labels, CLASSES, &mut dlogits))
    });
    group.bench_function("count_correct 100x10", |b| {
        b.iter(|| cpu::count_correct(&logits, &labels, CLASSES))
    });
    group.finish();
}

fn update(c: &mut Criterion) {
    let mut group = c.benchmark_group("sgd_ema_update");
    let len = INPUTS * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES;
    let grads: Vec<Vec<f32>> = (0..4).map(|s| random(len, 10 + s)).collect();
    let mut params = random(len, 6);
    let mut ema = random(len, 7);
    let step = UpdateStep {
        learning_rate: 1e-6,
        weight_decay: 1e-4,
        ema_decay: 0.99,
    };
    group.throughput(Throughput::Elements(len as u64));
    for workers in [1, 2, 4] {
        let views: Vec<&[f32]> = grads[..workers].iter().map(Vec::as_slice).collect();
        group.bench_function(
            BenchmarkId::new("all parameters, gradients averaged over", workers),
            |b| b.iter(|| cpu::sgd_ema_update(&mut params, &mut ema, &views, step)),
        );
    }
    group.finish();
}

criterion_group!(benches, matmuls, elementwise, update);
criterion_main!(benches);
