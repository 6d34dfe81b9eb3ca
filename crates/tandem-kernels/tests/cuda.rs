//! Every kernel against its CPU twin in `tandem_tensor::cpu`, on a GPU.
//!
//! Where there is no CUDA device (no GPU, or the stub libcuda of CI) each test says
//! `SKIPPED: no CUDA device (...)` on stderr and returns; any other failure to open the device
//! fails the test. Outputs are filled with NaN before a kernel writes them, so an element a
//! kernel forgets shows up as NaN.
#![cfg(feature = "cuda")]

use std::io::Write;

use cust::memory::DeviceBuffer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem_kernels::{CudaBackend, KernelError};
use tandem_tensor::cpu::{self, UpdateStep};
use tandem_tensor::{Activation, Backend, ExampleSet, Gemm};

/// The largest relative error allowed against the CPU twin, in the infinity norm:
/// `max |gpu - cpu| / max |cpu|`. (Element by element would hold a sum that cancels to nearly
/// zero to a precision that neither side's summation order has.)
const TOLERANCE: f32 = 1e-5;

/// Device 0, or `None` after saying on stderr that the test is skipped.
fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(gpu) => Some(gpu),
        Err(e) if e.is_no_device() => {
            // Straight to the process's stderr, in one write: the test harness captures
            // `eprintln!` of passing tests, and a skip must never pass silently.
            let test = std::thread::current().name().unwrap_or("?").to_string();
            let line = format!("SKIPPED: {test}: no CUDA device ({e})\n");
            let _ = std::io::stderr().write_all(line.as_bytes());
            None
        }
        Err(e) => panic!("opening CUDA device 0: {e}"),
    }
}

fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

fn random(rng: &mut ChaCha8Rng, len: usize, scale: f32) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(-scale..scale)).collect()
}

/// A device buffer holding `values` from `offset` on (zeros before).
fn upload(gpu: &CudaBackend, values: &[f32], offset: usize) -> DeviceBuffer<f32> {
    let mut buf = gpu.zeros(offset + values.len()).expect("allocating");
    gpu.upload(values, &mut buf, offset).expect("uploading");
    buf
}

/// A device buffer of `len` NaNs, to be overwritten.
fn poisoned(gpu: &CudaBackend, len: usize) -> DeviceBuffer<f32> {
    upload(gpu, &vec![f32::NAN; len], 0)
}

fn download(gpu: &CudaBackend, buf: &DeviceBuffer<f32>, offset: usize, len: usize) -> Vec<f32> {
    let mut host = vec![0.0; len];
    gpu.download(buf, offset, &mut host).expect("downloading");
    host
}

fn labels(gpu: &CudaBackend, values: &[u32]) -> DeviceBuffer<u32> {
    let mut buf = gpu.zero_labels(values.len()).expect("allocating");
    gpu.upload_labels(values, &mut buf, 0)
        .expect("uploading labels");
    buf
}

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let nan = got.iter().filter(|v| v.is_nan()).count();
    assert_eq!(nan, 0, "{what}: {nan} NaN (elements left unwritten?)");
    let scale = want.iter().fold(f32::MIN_POSITIVE, |m, w| m.max(w.abs()));
    if let Some(i) = (0..got.len()).find(|&i| (got[i] - want[i]).abs() / scale > TOLERANCE) {
        panic!(
            "{what}: element {i} is {} against {} (largest expected magnitude {scale})",
            got[i], want[i]
        );
    }
}

/// Equal values everywhere (the kernels that do the CPU's arithmetic in the CPU's order).
fn assert_exact(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!("{what}: element {i} is {} against {}", got[i], want[i]);
    }
}

/// The same bits everywhere (a kernel against itself).
fn assert_bitwise(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: element {i} is {} against {}", got[i], want[i]);
    }
}

/// `(m, n, k)`: edge cases, the model's shapes (batch 100, 784-500-10) and random ones, most of
/// them not multiples of the 32-wide tile.
fn gemm_shapes(rng: &mut ChaCha8Rng) -> Vec<(usize, usize, usize)> {
    let mut shapes = vec![
        (1, 1, 1),
        (1, 7, 0),
        (32, 32, 32),
        (33, 31, 65),
        (100, 500, 784),
        (100, 10, 500),
        (784, 500, 100),
        (500, 10, 100),
        (100, 500, 10),
    ];
    shapes.extend((0..6).map(|_| {
        (
            rng.random_range(1..150),
            rng.random_range(1..150),
            rng.random_range(1..150),
        )
    }));
    shapes
}

/// The GPU's `C = op(A) . op(B)` (and bias + ReLU when `bias` is given) for random operands at
/// odd offsets, with the CPU's.
fn gemm_case(
    gpu: &CudaBackend,
    rng: &mut ChaCha8Rng,
    spec: Gemm,
    with_bias: bool,
) -> (Vec<f32>, Vec<f32>) {
    let a = random(rng, spec.m * spec.k, 1.0);
    let b = random(rng, spec.k * spec.n, 1.0);
    let bias = random(rng, spec.n, 1.0);
    let mut want = vec![0.0; spec.m * spec.n];
    cpu::matmul(spec, &a, &b, &mut want);
    let (ga, gb, gbias) = (
        upload(gpu, &a, 3),
        upload(gpu, &b, 5),
        upload(gpu, &bias, 1),
    );
    let mut gc = poisoned(gpu, spec.m * spec.n + 2);
    if with_bias {
        cpu::bias_relu(&mut want, &bias);
        gpu.matmul_bias_relu(spec, (&ga, 3), (&gb, 5), (&gbias, 1), (&mut gc, 2))
    } else {
        gpu.matmul(spec, (&ga, 3), (&gb, 5), (&mut gc, 2))
    }
    .expect("matmul");
    (download(gpu, &gc, 2, spec.m * spec.n), want)
}

#[test]
fn matmul_matches_cpu_in_every_transposition() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng(1);
    for (m, n, k) in gemm_shapes(&mut rng) {
        for (a_transposed, b_transposed) in
            [(false, false), (true, false), (false, true), (true, true)]
        {
            let spec = Gemm {
                m,
                n,
                k,
                a_transposed,
                b_transposed,
            };
            for with_bias in [false, true] {
                let (got, want) = gemm_case(&gpu, &mut rng, spec, with_bias);
                assert_close(&format!("{spec:?} bias+relu {with_bias}"), &got, &want);
            }
        }
    }
}

#[test]
fn bias_add_and_bias_relu_match_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng(2);
    for (rows, cols) in [(1, 1), (100, 500), (100, 10), (37, 301), (1000, 3)] {
        let x = random(&mut rng, rows * cols + 4, 1.0);
        let bias = random(&mut rng, cols, 1.0);
        for relu in [false, true] {
            let mut gx = upload(&gpu, &x, 0);
            let gbias = upload(&gpu, &bias, 7);
            let mut want = x.clone();
            if relu {
                cpu::bias_relu(&mut want[..rows * cols], &bias);
                gpu.bias_add(&mut gx, (&gbias, 7), rows, cols, Activation::Relu)
            } else {
                cpu::bias_add(&mut want[..rows * cols], &bias);
                gpu.bias_add(&mut gx, (&gbias, 7), rows, cols, Activation::Identity)
            }
            .expect("bias");
            // Past rows * cols nothing may change.
            assert_exact(
                &format!("{rows}x{cols} relu {relu}"),
                &download(&gpu, &gx, 0, x.len()),
                &want,
            );
        }
    }
}

#[test]
fn relu_backward_matches_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng(3);
    for len in [1, 1000, 50_000, 12_345] {
        let grad = random(&mut rng, len, 1.0);
        // A ReLU's outputs: many exact zeros, some positive; and a few NaNs, which zero the
        // gradient as on the CPU (only `a > 0` keeps it).
        let activation: Vec<f32> = random(&mut rng, len, 1.0)
            .iter()
            .enumerate()
            .map(|(i, v)| if i % 97 == 5 { f32::NAN } else { v.max(0.0) })
            .collect();
        let mut want = grad.clone();
        cpu::relu_backward(&mut want, &activation);
        let mut gg = upload(&gpu, &grad, 0);
        let ga = upload(&gpu, &activation, 0);
        gpu.relu_backward(&mut gg, &ga, len).expect("relu_backward");
        assert_exact(&format!("len {len}"), &download(&gpu, &gg, 0, len), &want);
    }
}

#[test]
fn softmax_cross_entropy_matches_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng(4);
    for (rows, classes) in [(1, 1), (100, 10), (257, 10), (3, 33), (50, 100), (10, 1000)] {
        let mut logits = random(&mut rng, rows * classes, 10.0);
        // Huge logits: a naive exp would overflow.
        logits[..classes].iter_mut().for_each(|z| *z += 1e4);
        let targets: Vec<u32> = (0..rows)
            .map(|_| rng.random_range(0..classes as u32))
            .collect();
        let mut want = vec![0.0; rows * classes];
        let want_loss = cpu::softmax_cross_entropy(&logits, &targets, classes, &mut want);
        let gl = upload(&gpu, &logits, 0);
        let gt = labels(&gpu, &targets);
        let mut gd = poisoned(&gpu, rows * classes);
        let loss = gpu
            .softmax_cross_entropy(&gl, &gt, rows, classes, &mut gd)
            .expect("softmax_cross_entropy");
        let what = format!("{rows}x{classes}");
        assert_close(&format!("{what} loss"), &[loss], &[want_loss]);
        assert_close(
            &format!("{what} dlogits"),
            &download(&gpu, &gd, 0, rows * classes),
            &want,
        );
    }
}

#[test]
fn column_sum_matches_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng(5);
    for (rows, cols) in [(1, 1), (100, 500), (100, 10), (0, 7), (1000, 33), (3, 1000)] {
        let x = random(&mut rng, rows * cols, 1.0);
        let mut want = vec![0.0; cols];
        cpu::column_sum(&x, &mut want);
        let gx = upload(&gpu, &x, 0);
        let mut out = poisoned(&gpu, cols + 3);
        gpu.column_sum(&gx, rows, cols, (&mut out, 3))
            .expect("column_sum");
        // One thread per column adds the rows in the CPU's order: exactly the same sums.
        assert_exact(
            &format!("{rows}x{cols}"),
            &download(&gpu, &out, 3, cols),
            &want,
        );
    }
}

#[test]
fn count_correct_matches_cpu_including_ties() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng(6);
    for (rows, classes) in [(1, 1), (100, 10), (10_000, 10), (333, 3)] {
        // Few distinct values, so that rows often have tied maxima (the first one wins).
        let logits: Vec<f32> = (0..rows * classes)
            .map(|_| rng.random_range(0..4) as f32)
            .collect();
        let targets: Vec<u32> = (0..rows)
            .map(|_| rng.random_range(0..classes as u32))
            .collect();
        let want = cpu::count_correct(&logits, &targets, classes);
        let got = gpu
            .count_correct(
                &upload(&gpu, &logits, 0),
                &labels(&gpu, &targets),
                rows,
                classes,
            )
            .expect("count_correct");
        assert_eq!(got, want, "{rows}x{classes}");
    }
}

#[test]
fn gather_matches_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng(7);
    for (features, examples, rows) in [(784, 300, 100), (37, 10, 25), (1, 5, 1), (300, 40, 0)] {
        let values: Vec<u8> = (0..features * examples).map(|_| rng.random()).collect();
        let classes: Vec<u8> = (0..examples).map(|_| rng.random_range(0..10)).collect();
        let set = ExampleSet::new(features, values, classes).expect("a consistent data set");
        let indices: Vec<u32> = (0..rows)
            .map(|_| rng.random_range(0..examples as u32))
            .collect();
        let mut want_x = vec![0.0; rows * features];
        let mut want_labels = vec![0; rows];
        cpu::gather(&set, &indices, &mut want_x, &mut want_labels);

        let resident = gpu.upload_examples(&set).expect("upload_examples");
        let mut x = poisoned(&gpu, rows * features);
        let mut got_labels = labels(&gpu, &vec![u32::MAX; rows]);
        gpu.gather(&resident, &indices, &mut x, &mut got_labels)
            .expect("gather");
        let what = format!("{rows} of {examples} x {features}");
        assert_exact(&what, &download(&gpu, &x, 0, rows * features), &want_x);
        let mut host = vec![0; rows];
        gpu.download_labels(&got_labels, 0, &mut host)
            .expect("download_labels");
        assert_eq!(host, want_labels, "{what}: labels");

        let bad = [examples as u32];
        assert!(matches!(
            gpu.gather(&resident, &bad, &mut x, &mut got_labels),
            Err(KernelError::Shape(_))
        ));
    }
}

/// `n` random gradient buffers of `len` values, each at its own offset.
fn gradients(
    gpu: &CudaBackend,
    rng: &mut ChaCha8Rng,
    n: usize,
    len: usize,
) -> (Vec<Vec<f32>>, Vec<DeviceBuffer<f32>>) {
    let host: Vec<Vec<f32>> = (0..n).map(|_| random(rng, len, 1.0)).collect();
    let device = host
        .iter()
        .enumerate()
        .map(|(i, g)| upload(gpu, g, i))
        .collect();
    (host, device)
}

const STEP: UpdateStep = UpdateStep {
    learning_rate: 0.8 * 0.99,
    weight_decay: 1e-4,
    ema_decay: 0.9,
};

#[test]
fn sgd_ema_update_is_exactly_the_cpu_update() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng(8);
    for (n, len) in [(1, 397_510), (2, 397_510), (3, 1001), (4, 5000), (16, 333)] {
        let params = random(&mut rng, len, 0.5);
        let ema = random(&mut rng, len, 0.5);
        let (grads, device_grads) = gradients(&gpu, &mut rng, n, len);
        let (mut want_p, mut want_e) = (params.clone(), ema.clone());
        let slices: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
        cpu::sgd_ema_update(&mut want_p, &mut want_e, &slices, STEP);

        let (mut gp, mut ge) = (upload(&gpu, &params, 1), upload(&gpu, &ema, 2));
        let spans: Vec<_> = device_grads
            .iter()
            .enumerate()
            .map(|(i, g)| (g, i))
            .collect();
        gpu.sgd_ema_update((&mut gp, 1), (&mut ge, 2), &spans, len, STEP)
            .expect("sgd_ema_update");
        let what = format!("{n} buffers of {len}");
        assert_exact(
            &format!("{what}: params"),
            &download(&gpu, &gp, 1, len),
            &want_p,
        );
        assert_exact(
            &format!("{what}: ema"),
            &download(&gpu, &ge, 2, len),
            &want_e,
        );
    }
}

#[test]
fn mean_gradients_is_exactly_the_cpu_reduction() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng(9);
    for (n, len) in [(1, 100), (2, 397_510), (4, 12_345), (16, 77)] {
        let (grads, device_grads) = gradients(&gpu, &mut rng, n, len);
        // The CPU update with lr = -1 from zero parameters and no decay leaves exactly the mean
        // gradient in the parameters: 0 - (-1) * (g + 0 * 0) = g.
        let mut want = vec![0.0; len];
        let slices: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
        let copy = UpdateStep {
            learning_rate: -1.0,
            weight_decay: 0.0,
            ema_decay: 0.0,
        };
        cpu::sgd_ema_update(&mut want, &mut vec![0.0; len], &slices, copy);

        let mut out = poisoned(&gpu, len + 1);
        let spans: Vec<_> = device_grads
            .iter()
            .enumerate()
            .map(|(i, g)| (g, i))
            .collect();
        gpu.mean_gradients(&spans, (&mut out, 1), len)
            .expect("mean_gradients");
        assert_exact(
            &format!("{n} buffers of {len}"),
            &download(&gpu, &out, 1, len),
            &want,
        );
    }
}

#[test]
fn gradient_buffer_counts_are_checked() {
    let Some(gpu) = gpu() else { return };
    let mut out = gpu.zeros(4).expect("allocating");
    let grad = gpu.zeros(4).expect("allocating");
    for count in [0, 17] {
        let spans = vec![(&grad, 0); count];
        assert!(matches!(
            gpu.mean_gradients(&spans, (&mut out, 0), 4),
            Err(KernelError::GradientCount { given, .. }) if given == count
        ));
    }
    assert!(matches!(
        gpu.mean_gradients(&[(&grad, 1)], (&mut out, 0), 4),
        Err(KernelError::Shape(_))
    ));
}

/// Runs the deterministic kernels on fixed inputs and returns every output, concatenated.
fn deterministic_outputs(gpu: &CudaBackend) -> Vec<f32> {
    let mut rng = rng(10);
    let (m, n, k) = (784, 500, 100); // the first layer's weight gradient: X^T . dH
    let spec = Gemm {
        m,
        n,
        k,
        a_transposed: true,
        b_transposed: false,
    };
    let (got, _) = gemm_case(gpu, &mut rng, spec, false);
    let mut outputs = got;

    let (rows, classes) = (100, 10);
    let logits = upload(gpu, &random(&mut rng, rows * classes, 5.0), 0);
    let targets: Vec<u32> = (0..rows)
        .map(|_| rng.random_range(0..classes as u32))
        .collect();
    let mut dlogits = poisoned(gpu, rows * classes);
    let loss = gpu
        .softmax_cross_entropy(&logits, &labels(gpu, &targets), rows, classes, &mut dlogits)
        .expect("softmax_cross_entropy");
    outputs.push(loss);
    outputs.extend(download(gpu, &dlogits, 0, rows * classes));

    let mut sums = poisoned(gpu, classes);
    gpu.column_sum(&dlogits, rows, classes, (&mut sums, 0))
        .expect("column_sum");
    outputs.extend(download(gpu, &sums, 0, classes));
    let correct = gpu
        .count_correct(&logits, &labels(gpu, &targets), rows, classes)
        .expect("count_correct");
    outputs.push(correct as f32);

    let len = 10_000;
    let (_, grads) = gradients(gpu, &mut rng, 4, len);
    let spans: Vec<_> = grads.iter().enumerate().map(|(i, g)| (g, i)).collect();
    let (mut p, mut e) = (
        upload(gpu, &random(&mut rng, len, 1.0), 0),
        gpu.zeros(len).expect("zeros"),
    );
    gpu.sgd_ema_update((&mut p, 0), (&mut e, 0), &spans, len, STEP)
        .expect("sgd_ema_update");
    outputs.extend(download(gpu, &p, 0, len));
    outputs.extend(download(gpu, &e, 0, len));
    outputs
}

#[test]
fn deterministic_kernels_repeat_bitwise() {
    let Some(gpu) = gpu() else { return };
    let first = deterministic_outputs(&gpu);
    for run in 1..3 {
        assert_bitwise(&format!("run {run}"), &deterministic_outputs(&gpu), &first);
    }
}

#[test]
fn staging_and_shape_errors() {
    let Some(gpu) = gpu() else { return };
    let mut buf = gpu.zeros(5).expect("zeros");
    gpu.write_with(&mut buf, &mut |host| {
        host.iter_mut().zip(1..).for_each(|(v, i)| *v = i as f32)
    })
    .expect("write_with");
    let mut seen = Vec::new();
    gpu.read_with(&buf, &mut |host| seen.extend_from_slice(host))
        .expect("read_with");
    assert_eq!(seen, [1.0, 2.0, 3.0, 4.0, 5.0]);
    assert!(matches!(
        gpu.upload(&[1.0; 3], &mut buf, 3),
        Err(KernelError::Shape(_))
    ));
    let mut grad = gpu.zeros(6).expect("zeros");
    assert!(matches!(
        gpu.relu_backward(&mut grad, &buf, 6),
        Err(KernelError::Shape(_))
    ));
}
