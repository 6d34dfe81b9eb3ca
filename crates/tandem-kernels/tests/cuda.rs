//! Every kernel against its CPU twin in `tandem_tensor::cpu`, on a GPU.
//!
//! Where there is no CUDA device (no GPU, or the stand-in with `TANDEM_EMU_DEVICES=0`) each
//! test says `SKIPPED: <test>: no CUDA device (...)` on stderr and returns, or fails under
//! `TANDEM_REQUIRE_GPU=1` (see `tandem_testkit`); any other failure to open the device fails the test.
//! Outputs are filled with NaN before a kernel writes them, so an element a kernel forgets
//! shows up as NaN.
#![cfg(feature = "cuda")]

mod common;

use common::{download, gemm_shapes, labels, poisoned, random, rng, upload};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tandem_core::Alone;
use tandem_kernels::{CudaBackend, DeviceBuffer, KernelError};
use tandem_tensor::cpu::{self, UpdateStep};
use tandem_tensor::{Activation, Backend, CpuBackend, ExampleSet, Gemm};

/// The largest relative error allowed against the CPU twin, in the infinity norm:
/// `max |gpu - cpu| / max |cpu|`. (Element by element would hold a sum that cancels to nearly
/// zero to a precision that neither side's summation order has.)
const TOLERANCE: f32 = 1e-5;

/// Device 0, or `None` after saying on stderr that the test is skipped (see `tandem_testkit`).
fn gpu() -> Option<CudaBackend> {
    tandem_testkit::or_skip(CudaBackend::new(0), KernelError::is_no_device)
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

/// What a product does as it stores its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Epilogue {
    None,
    /// `matmul_bias`, then a ReLU.
    BiasRelu,
    /// `matmul_bias`, no activation.
    Bias,
    /// `matmul_relu_backward`.
    ReluBackward,
}

/// The GPU's `C = op(A) . op(B)` with `epilogue` for random operands at odd offsets (the masked
/// product writes from the start of C), with the CPU's: the product, then `bias_relu` or
/// `relu_backward` (against a ReLU's output: zeros, positives and a few NaNs, which zero the
/// gradient as on the CPU).
fn gemm_case(
    gpu: &CudaBackend,
    rng: &mut ChaCha8Rng,
    spec: Gemm,
    epilogue: Epilogue,
) -> (Vec<f32>, Vec<f32>) {
    let a = random(rng, spec.m * spec.k, 1.0);
    let b = random(rng, spec.k * spec.n, 1.0);
    let bias = random(rng, spec.n, 1.0);
    let mask: Vec<f32> = (random(rng, spec.m * spec.n, 1.0).iter().enumerate())
        .map(|(i, v)| if i % 97 == 5 { f32::NAN } else { v.max(0.0) })
        .collect();
    let mut want = vec![0.0; spec.m * spec.n];
    cpu::matmul(spec, &a, &b, &mut want);
    let (ga, gb, gbias, gmask) = (
        upload(gpu, &a, 3),
        upload(gpu, &b, 5),
        upload(gpu, &bias, 1),
        upload(gpu, &mask, 0),
    );
    let mut gc = poisoned(gpu, spec.m * spec.n + 2);
    let at = match epilogue {
        Epilogue::None => {
            gpu.matmul(spec, (&ga, 3), (&gb, 5), (&mut gc, 2))
                .expect("matmul");
            2
        }
        Epilogue::BiasRelu => {
            cpu::bias_relu(&mut want, &bias);
            let relu = Activation::Relu;
            (gpu.matmul_bias(spec, (&ga, 3), (&gb, 5), (&gbias, 1), (&mut gc, 2), relu))
                .expect("matmul_bias");
            2
        }
        Epilogue::Bias => {
            cpu::bias_add(&mut want, &bias);
            let identity = Activation::Identity;
            (gpu.matmul_bias(
                spec,
                (&ga, 3),
                (&gb, 5),
                (&gbias, 1),
                (&mut gc, 2),
                identity,
            ))
            .expect("matmul_bias");
            2
        }
        Epilogue::ReluBackward => {
            cpu::relu_backward(&mut want, &mask);
            (gpu.matmul_relu_backward(spec, (&ga, 3), (&gb, 5), &gmask, &mut gc))
                .expect("matmul_relu_backward");
            0
        }
    };
    (download(gpu, &gc, at, spec.m * spec.n), want)
}

/// A device copy moves as many bytes as its values' type takes: two `f32`s, then two `bf16`s
/// (one `f32`'s bytes), leaving the last value alone.
#[test]
fn a_device_copy_moves_the_bytes_of_its_values_type() {
    use tandem_core::{DType, DeviceOp};
    let Some(gpu) = gpu() else { return };
    let from = upload(&gpu, &[1.0, 2.0, 3.0, 4.0], 0);
    let to = poisoned(&gpu, 4);
    let residence = gpu.residence(&from, &to).expect("device memory");
    assert_eq!(residence.dtype, gpu.dtype());
    let (src, dst) = (residence.params, residence.grads);
    let ops = [
        DeviceOp::Copy {
            dst,
            src,
            len: 2,
            dtype: DType::F32,
        },
        DeviceOp::Copy {
            dst: DType::F32.at(dst, 2),
            src: DType::F32.at(src, 2),
            len: 2,
            dtype: DType::BF16,
        },
    ];
    // SAFETY: both copies lie inside the two buffers of four values, which outlive the read.
    unsafe { residence.queue.run(&ops) }.expect("copies");
    let got = download(&gpu, &to, 0, 4);
    assert_eq!(got[..3], [1.0, 2.0, 3.0]);
    assert!(got[3].is_nan(), "{got:?}");
}

#[test]
fn matmul_matches_cpu_in_every_transposition() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng(1);
    for (m, n, k) in gemm_shapes(&mut rng) {
        for (a_transposed, b_transposed) in
            [(false, false), (true, false), (false, true), (true, true)]
        {
            let spec = Gemm::new(m, n, k, a_transposed, b_transposed);
            for epilogue in [
                Epilogue::None,
                Epilogue::BiasRelu,
                Epilogue::Bias,
                Epilogue::ReluBackward,
            ] {
                let (got, want) = gemm_case(&gpu, &mut rng, spec, epilogue);
                assert_close(&format!("{spec:?} {epilogue:?}"), &got, &want);
            }
        }
    }
}

/// A layer's weight and bias gradients in one product (the biases' as the product with a row of
/// ones) against the CPU's product and column sums, at an offset in a poisoned gradient
/// vector: the model's two layers (split over k), an odd shape, and no rows (zero sums).
#[test]
fn weight_and_bias_gradients_match_the_cpus_product_and_column_sums() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng(12);
    for (ins, outs, rows) in [(784, 500, 100), (500, 10, 100), (37, 45, 70), (5, 3, 0)] {
        let x = random(&mut rng, rows * ins, 1.0);
        let delta = random(&mut rng, rows * outs, 1.0);
        let (offset, len) = (7, ins * outs + outs);
        let mut want = vec![f32::NAN; offset + len + 3];
        CpuBackend
            .weight_and_bias_gradients((ins, outs, rows), &x, &delta, (&mut want, offset), &Alone)
            .expect("cpu");
        let (gx, gdelta) = (upload(&gpu, &x, 0), upload(&gpu, &delta, 0));
        let mut grads = poisoned(&gpu, want.len());
        gpu.weight_and_bias_gradients(
            (ins, outs, rows),
            &gx,
            &gdelta,
            (&mut grads, offset),
            &Alone,
        )
        .expect("gpu");
        let got = download(&gpu, &grads, 0, want.len());
        let what = format!("{ins}x{outs} over {rows} rows");
        let (weights, biases) = (offset + ins * outs, offset + len);
        assert_close(
            &format!("{what}: weights"),
            &got[offset..weights],
            &want[offset..weights],
        );
        assert_close(
            &format!("{what}: biases"),
            &got[weights..biases],
            &want[weights..biases],
        );
        assert!(
            got[..offset]
                .iter()
                .chain(&got[biases..])
                .all(|v| v.is_nan()),
            "{what}"
        );
    }
}

/// A layer's backward products at once (`layer_gradients`: one `matmul_pair` launch where
/// neither splits, as the model's second layer) give the bits of the two products launched one
/// after the other, and the CPU's values: with and without the input's ReLU mask, the model's
/// layers (the first's weight gradient over 784 inputs as well), an odd shape, no rows.
#[test]
fn layer_gradients_at_once_are_the_two_products_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng(13);
    for (ins, outs, rows) in [(500, 10, 100), (784, 500, 100), (37, 45, 70), (5, 3, 0)] {
        for masked in [true, false] {
            let what = format!("{ins}x{outs} over {rows} rows, masked {masked}");
            let x = random(&mut rng, rows * ins, 1.0);
            // A ReLU's output: about half the mask is zero.
            let x: Vec<f32> = x.iter().map(|v| v.max(0.0)).collect();
            let delta = random(&mut rng, rows * outs, 1.0);
            let weights = random(&mut rng, ins * outs + 5, 1.0);
            let (offset, len) = (7, ins * outs + outs);
            let shape = (ins, outs, rows);
            let mut want = vec![f32::NAN; offset + len + 3];
            let mut want_input = vec![f32::NAN; rows * ins];
            let mask = masked.then_some(&x);
            CpuBackend
                .layer_gradients(
                    shape,
                    (&x, &delta),
                    (&weights, 5),
                    (&mut want, offset),
                    (&mut want_input, mask),
                    &Alone,
                )
                .expect("cpu");
            let (gx, gdelta) = (upload(&gpu, &x, 0), upload(&gpu, &delta, 0));
            let gweights = upload(&gpu, &weights, 0);
            let mut grads = poisoned(&gpu, want.len());
            let mut input = poisoned(&gpu, want_input.len().max(1));
            let mask = masked.then_some(&gx);
            gpu.layer_gradients(
                shape,
                (&gx, &gdelta),
                (&gweights, 5),
                (&mut grads, offset),
                (&mut input, mask),
                &Alone,
            )
            .expect("gpu");
            let got = download(&gpu, &grads, 0, want.len());
            let got_input = download(&gpu, &input, 0, want_input.len());
            let end = offset + len;
            assert_close(&what, &got[offset..end], &want[offset..end]);
            assert_close(&format!("{what}: input"), &got_input, &want_input);
            assert!(got[..offset].iter().chain(&got[end..]).all(|v| v.is_nan()));
            // The same products, one launch each.
            let mut apart = poisoned(&gpu, want.len());
            gpu.weight_and_bias_gradients(shape, &gx, &gdelta, (&mut apart, offset), &Alone)
                .expect("gpu");
            let mut apart_input = poisoned(&gpu, want_input.len().max(1));
            let product = Gemm::nt(rows, ins, outs);
            match mask {
                Some(mask) => gpu.matmul_relu_backward(
                    product,
                    (&gdelta, 0),
                    (&gweights, 5),
                    mask,
                    &mut apart_input,
                ),
                None => gpu.matmul(product, (&gdelta, 0), (&gweights, 5), (&mut apart_input, 0)),
            }
            .expect("gpu");
            let apart_values = download(&gpu, &apart, 0, want.len());
            assert_bitwise(&what, &got[offset..end], &apart_values[offset..end]);
            let apart_input = download(&gpu, &apart_input, 0, want_input.len());
            assert_bitwise(&format!("{what}: input"), &got_input, &apart_input);
        }
    }
}

/// A last layer's product and its loss at once (`matmul_bias_softmax_cross_entropy_into`: one
/// `matmul_softmax_cross_entropy` launch with at most 32 classes) give the bits of the product
/// and `softmax_cross_entropy` launched apart, and the CPU's values: the model's head (split
/// over k, 4 tiles of rows), more rows than the mean's threads (each adds several), one
/// unsplit tile, and 33 classes (two launches).
#[test]
fn a_last_product_and_its_loss_at_once_are_the_two_kernels_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng(14);
    for (rows, classes, ins) in [(100, 10, 500), (300, 7, 64), (5, 3, 20), (40, 33, 50)] {
        let what = format!("{rows} rows of {classes} classes from {ins}");
        let x = random(&mut rng, rows * ins, 1.0);
        let w = random(&mut rng, ins * classes + classes, 0.3);
        let targets: Vec<u32> = (0..rows)
            .map(|_| rng.random_range(0..classes as u32))
            .collect();
        let spec = Gemm::nn(rows, classes, ins);
        let bias = ins * classes;
        let mut want_logits = vec![0.0; rows * classes];
        cpu::matmul(spec, &x, &w[..bias], &mut want_logits);
        cpu::bias_add(&mut want_logits, &w[bias..]);
        let mut want_d = vec![0.0; rows * classes];
        let want_loss = cpu::softmax_cross_entropy(&want_logits, &targets, classes, &mut want_d);
        let (gx, gw, glabels) = (
            upload(&gpu, &x, 0),
            upload(&gpu, &w, 0),
            labels(&gpu, &targets),
        );
        let run = |fused: bool| {
            let mut logits = poisoned(&gpu, rows * classes);
            let mut dlogits = poisoned(&gpu, rows * classes);
            let mut ring = poisoned(&gpu, 4);
            let operands = ((&gx, 0), (&gw, 0), (&gw, bias));
            let loss = (&mut ring, 2);
            match fused {
                true => gpu.matmul_bias_softmax_cross_entropy_into(
                    spec,
                    operands,
                    (&mut logits, &glabels),
                    &mut dlogits,
                    loss,
                ),
                false => {
                    let (a, b, bias) = operands;
                    let c = (&mut logits, 0);
                    gpu.matmul_bias(spec, a, b, bias, c, Activation::Identity)
                        .expect("gpu");
                    let shape = (rows, classes);
                    gpu.softmax_cross_entropy_into(&logits, &glabels, shape, &mut dlogits, loss)
                }
            }
            .expect("gpu");
            let n = rows * classes;
            let ring = download(&gpu, &ring, 0, 4);
            assert!(ring[..2].iter().chain(&ring[3..]).all(|v| v.is_nan()));
            let values = |buf: &DeviceBuffer<f32>| download(&gpu, buf, 0, n);
            (values(&logits), values(&dlogits), ring[2])
        };
        let (logits, d, loss) = run(true);
        assert_close(&format!("{what}: logits"), &logits, &want_logits);
        assert_close(&format!("{what}: gradient"), &d, &want_d);
        assert_close(&format!("{what}: loss"), &[loss], &[want_loss]);
        let (apart_logits, apart_d, apart_loss) = run(false);
        assert_bitwise(&format!("{what}: logits"), &logits, &apart_logits);
        assert_bitwise(&format!("{what}: gradient"), &d, &apart_d);
        assert_bitwise(&format!("{what}: loss"), &[loss], &[apart_loss]);
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

/// A batch of `rows` random indices into `set`, with what the CPU gathers for it: the
/// indices, the features and the labels.
fn random_batch(
    rng: &mut ChaCha8Rng,
    set: &ExampleSet,
    rows: usize,
) -> (Vec<u32>, Vec<f32>, Vec<u32>) {
    let indices: Vec<u32> = (0..rows)
        .map(|_| rng.random_range(0..set.len() as u32))
        .collect();
    let mut x = vec![0.0; rows * set.features()];
    let mut labels = vec![0; rows];
    cpu::gather(set, &indices, &mut x, &mut labels);
    (indices, x, labels)
}

/// The batch a gather wrote, features and labels, is `want`'s exactly.
fn assert_gathered(
    gpu: &CudaBackend,
    what: &str,
    (x, labels): (&DeviceBuffer<f32>, &DeviceBuffer<u32>),
    (want_x, want_labels): (&[f32], &[u32]),
) {
    assert_exact(what, &download(gpu, x, 0, want_x.len()), want_x);
    let mut host = vec![0; want_labels.len()];
    gpu.download_labels(labels, 0, &mut host)
        .expect("download_labels");
    assert_eq!(host, want_labels, "{what}: labels");
}

#[test]
fn gather_matches_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng(7);
    for (features, examples, rows) in [(784, 300, 100), (37, 10, 25), (1, 5, 1), (300, 40, 0)] {
        let (set, resident) = data_set(&gpu, &mut rng, (features, examples));
        let (indices, want_x, want_labels) = random_batch(&mut rng, &set, rows);
        let mut x = poisoned(&gpu, rows * features);
        let mut got_labels = labels(&gpu, &vec![u32::MAX; rows]);
        gpu.gather(&resident, &indices, &mut x, &mut got_labels)
            .expect("gather");
        let what = format!("{rows} of {examples} x {features}");
        assert_gathered(&gpu, &what, (&x, &got_labels), (&want_x, &want_labels));

        let bad = [examples as u32];
        assert!(matches!(
            gpu.gather(&resident, &bad, &mut x, &mut got_labels),
            Err(KernelError::Shape(_))
        ));
    }
}

/// A random data set of `examples` of `features` bytes with labels below 10, uploaded.
fn data_set(
    gpu: &CudaBackend,
    rng: &mut ChaCha8Rng,
    (features, examples): (usize, usize),
) -> (ExampleSet, tandem_kernels::DeviceExamples) {
    let values: Vec<u8> = (0..features * examples).map(|_| rng.random()).collect();
    let classes: Vec<u8> = (0..examples).map(|_| rng.random_range(0..10)).collect();
    let set = ExampleSet::new(features, values, classes).expect("a consistent data set");
    let resident = gpu.upload_examples(&set).expect("upload_examples");
    (set, resident)
}

/// The gather fused into a first layer's product (`gather_matmul_bias`) writes the batch and
/// its labels exactly as `gather` does, and its product bit for bit as `gather` then
/// `matmul_bias` (close to the CPU's), split over k or not, with and without a ReLU; a bad
/// index or a product of another shape is an error.
#[test]
fn gather_matmul_bias_is_the_gather_then_the_product() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng(8);
    let cases = [
        (784, 300, 100, 500),
        (37, 10, 25, 3),
        (1, 5, 1, 1),
        (300, 40, 0, 7),
    ];
    for (features, examples, rows, outs) in cases {
        let (set, resident) = data_set(&gpu, &mut rng, (features, examples));
        let (indices, want_x, want_labels) = random_batch(&mut rng, &set, rows);
        let (w, bias) = (
            random(&mut rng, features * outs, 0.1),
            random(&mut rng, outs, 1.0),
        );
        let (gw, gbias) = (upload(&gpu, &w, 2), upload(&gpu, &bias, 0));
        let spec = Gemm::nn(rows, outs, features);
        for activation in [Activation::Relu, Activation::Identity] {
            let mut want = vec![0.0; rows * outs];
            cpu::matmul(spec, &want_x, &w, &mut want);
            match activation {
                Activation::Relu => cpu::bias_relu(&mut want, &bias),
                Activation::Identity => cpu::bias_add(&mut want, &bias),
            }
            let mut x = poisoned(&gpu, rows * features);
            let mut got_labels = labels(&gpu, &vec![u32::MAX; rows]);
            let mut separate = poisoned(&gpu, rows * outs + 1);
            gpu.gather(&resident, &indices, &mut x, &mut got_labels)
                .expect("gather");
            let (w, bias) = ((&gw, 2), (&gbias, 0));
            (gpu.matmul_bias(spec, (&x, 0), w, bias, (&mut separate, 1), activation))
                .expect("matmul_bias");
            let mut x = poisoned(&gpu, rows * features);
            let mut got_labels = labels(&gpu, &vec![u32::MAX; rows]);
            let mut fused = poisoned(&gpu, rows * outs + 1);
            let batch = (&mut x, &mut got_labels);
            gpu.gather_matmul_bias(
                (&resident, &indices),
                batch,
                spec,
                w,
                bias,
                (&mut fused, 1),
                activation,
            )
            .expect("gather_matmul_bias");
            let what = format!("{rows} of {examples} x {features} to {outs}, {activation:?}");
            assert_gathered(&gpu, &what, (&x, &got_labels), (&want_x, &want_labels));
            let got = download(&gpu, &fused, 1, rows * outs);
            assert_bitwise(&what, &got, &download(&gpu, &separate, 1, rows * outs));
            assert_close(&what, &got, &want);
            let bad = [examples as u32];
            let batch = (&mut x, &mut got_labels);
            let c = (&mut fused, 1);
            let outcome = gpu.gather_matmul_bias(
                (&resident, &bad),
                batch,
                Gemm::nn(1, outs, features),
                w,
                bias,
                c,
                activation,
            );
            assert!(
                matches!(outcome, Err(KernelError::Shape(_))),
                "{what}: {outcome:?}"
            );
            let batch = (&mut x, &mut got_labels);
            let c = (&mut fused, 1);
            let other = Gemm::nn(rows, outs, features + 1);
            let outcome =
                gpu.gather_matmul_bias((&resident, &indices), batch, other, w, bias, c, activation);
            assert!(
                matches!(outcome, Err(KernelError::Shape(_))),
                "{what}: {outcome:?}"
            );
        }
    }
}

/// A replayed sequence (the gather fused into a product, the batch's column sums, softmax
/// cross-entropy of the product into a ring of losses) gives, on every call, what its CPU twin
/// gives for that call's indices, the loss in that call's slot of the ring and nowhere else:
/// run directly, captured, then launched as a graph with fresh indices and a fresh slot.
#[test]
fn replay_runs_the_captured_sequence_with_each_calls_indices() {
    let Some(gpu) = gpu() else { return };
    let mut rng = rng(11);
    let (features, examples, rows, classes) = (37, 50, 12, 10);
    let (set, resident) = data_set(&gpu, &mut rng, (features, examples));
    let mut x = poisoned(&gpu, rows * features);
    let mut got_labels = labels(&gpu, &vec![u32::MAX; rows]);
    let mut sums = poisoned(&gpu, features);
    let (w, bias) = (
        random(&mut rng, features * classes, 0.1),
        random(&mut rng, classes, 1.0),
    );
    let (gw, gbias) = (upload(&gpu, &w, 0), upload(&gpu, &bias, 0));
    let mut logits = poisoned(&gpu, 4 * rows * classes);
    let mut dlogits = poisoned(&gpu, 4 * rows * classes);
    let mut ring = poisoned(&gpu, 8);
    let mut wide = (
        poisoned(&gpu, 4 * rows * features),
        labels(&gpu, &vec![0; 4 * rows]),
    );
    // Calls 0-3 run, capture and replay; call 4, with more rows, grows the backend's index
    // buffer, which the captured graph names; calls 5-7 must not replay that graph.
    for call in 0..8 {
        let rows = if call == 4 { 4 * rows } else { rows };
        let (indices, want_x, want_labels) = random_batch(&mut rng, &set, rows);
        let (x, got_labels) = match call {
            4 => (&mut wide.0, &mut wide.1),
            _ => (&mut x, &mut got_labels),
        };
        let spec = Gemm::nn(rows, classes, features);
        gpu.replay(rows as u64, &mut |b| {
            let batch = (&mut *x, &mut *got_labels);
            let (w, bias, c) = ((&gw, 0), (&gbias, 0), (&mut logits, 0));
            b.gather_matmul_bias(
                (&resident, &indices),
                batch,
                spec,
                w,
                bias,
                c,
                Activation::Identity,
            )?;
            b.column_sum(x, rows, features, (&mut sums, 0))?;
            let shape = (rows, classes);
            b.softmax_cross_entropy_into(
                &logits,
                got_labels,
                shape,
                &mut dlogits,
                (&mut ring, call),
            )
        })
        .expect("replay");
        let mut want_sums = vec![0.0; features];
        cpu::column_sum(&want_x, &mut want_sums);
        let what = format!("call {call}");
        assert_exact(&what, &download(&gpu, &sums, 0, features), &want_sums);
        let mut want_logits = vec![0.0; rows * classes];
        cpu::matmul(spec, &want_x, &w, &mut want_logits);
        cpu::bias_add(&mut want_logits, &bias);
        let mut want_d = vec![0.0; rows * classes];
        let want_loss =
            cpu::softmax_cross_entropy(&want_logits, &want_labels, classes, &mut want_d);
        let losses = download(&gpu, &ring, 0, 8);
        assert_close(&what, &losses[call..=call], &[want_loss]);
        assert!(
            losses[call + 1..].iter().all(|l| l.is_nan()),
            "{what}: {losses:?}"
        );
    }
    // A shape error inside the sequence is the same error, captured or not.
    let bad = [examples as u32];
    let replayed = gpu.replay(rows as u64, &mut |b| {
        b.gather(&resident, &bad, &mut x, &mut got_labels)
    });
    assert!(
        matches!(replayed, Err(KernelError::Shape(_))),
        "{replayed:?}"
    );
}

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

/// The sync store's update of a whole parameter vector, one `DeviceOp::Update` per tensor (the
/// queue joins them into one launch), with weight decay on some spans only and the parameters'
/// bf16 copy written in the same pass: exactly the CPU's update of each span, and the copy
/// exactly `tandem_tensor::round_to` of its result. An update of another buffer after them is
/// applied on its own.
#[test]
fn consecutive_updates_are_each_spans_cpu_update() {
    use tandem_core::{DType, DeviceOp, DeviceQueue, RoundedCopy};
    let Some(gpu) = gpu() else { return };
    let queue = gpu.queue();
    let mut rng = rng(9);
    let spans = [(300, true), (50, false), (600, true), (50, false)];
    let len: usize = spans.iter().map(|s| s.0).sum();
    let decayed = |on| UpdateStep {
        weight_decay: if on { STEP.weight_decay } else { 0.0 },
        ..STEP
    };
    let host: Vec<Vec<f32>> = (0..6).map(|_| random(&mut rng, len, 0.5)).collect();
    let buffers = written(&queue, &host);
    let hyper = queue.alloc(6, DType::F32).expect("alloc");
    let values =
        [decayed(true), decayed(false)].map(|s| [s.learning_rate, s.weight_decay, s.ema_decay]);
    // SAFETY: six values.
    unsafe { queue.write(hyper.address(), values.as_flattened()) }.expect("write");
    let at = |buffer: usize, offset: usize| buffer_at(&buffers, buffer, offset);
    let mut ops = Vec::new();
    let mut offset = 0;
    for &(span, on) in &spans {
        ops.push(DeviceOp::Update {
            kernel: "sgd_ema_update",
            params: at(0, offset),
            state: vec![at(1, offset)],
            grads: vec![at(2, offset), at(3, offset)],
            grads_dtype: DType::F32,
            len: span,
            hyper: hyper.address() + if on { 0 } else { 12 },
            copy: Some(RoundedCopy {
                params: at(5, offset),
                dtype: DType::BF16,
            }),
        });
        offset += span;
    }
    // The fifth buffer as parameters of their own, with the first as their average.
    ops.push(DeviceOp::Update {
        kernel: "sgd_ema_update",
        params: at(4, 0),
        state: vec![at(0, 0)],
        grads: vec![at(2, 0)],
        grads_dtype: DType::F32,
        len: 100,
        hyper: hyper.address(),
        copy: None,
    });
    // SAFETY: every span lies in its buffers, which outlive the reads below (they wait).
    unsafe { queue.run(&ops) }.expect("run");
    // Gradients of a type no update kernel reads are refused before anything is queued.
    assert!(queue.has_update("sgd_ema_update", 1, DType::F32));
    assert!(queue.has_update("sgd_ema_update", 1, DType::BF16));
    assert!(!queue.has_update("sgd_ema_update", 1, DType::F16));
    let mut narrow = ops[0].clone();
    if let DeviceOp::Update { grads_dtype, .. } = &mut narrow {
        *grads_dtype = DType::F16;
    }
    // SAFETY: as above; the update is refused, not run.
    let refused = unsafe { queue.run(&[narrow]) }.expect_err("f16 gradients");
    assert!(refused.to_string().contains("f16 gradients"), "{refused}");
    let (mut want_p, mut want_e) = (host[0].clone(), host[1].clone());
    let mut offset = 0;
    for &(span, on) in &spans {
        let range = offset..offset + span;
        cpu::sgd_ema_update(
            &mut want_p[range.clone()],
            &mut want_e[range.clone()],
            &[&host[2][range.clone()], &host[3][range]],
            decayed(on),
        );
        offset += span;
    }
    let mut want_copy = want_p.clone();
    tandem_tensor::round_to(DType::BF16, &mut want_copy);
    let mut want_other = host[4][..100].to_vec();
    let mut want_other_e = want_p[..100].to_vec();
    cpu::sgd_ema_update(
        &mut want_other,
        &mut want_other_e,
        &[&host[2][..100]],
        decayed(true),
    );
    want_p[..100].copy_from_slice(&want_other_e);
    let read = |buffer: usize, n: usize| {
        let mut got = vec![0.0; n];
        // SAFETY: the buffer holds at least `n` values; the read waits for the queue.
        unsafe { queue.read(buffers[buffer].address(), &mut got) }.expect("read");
        got
    };
    assert_exact("params", &read(0, len), &want_p);
    assert_exact("ema", &read(1, len), &want_e);
    assert_exact("the other update", &read(4, 100), &want_other);
    assert_bitwise("the bf16 copy", &read(5, len), &want_copy);
    assert_ne!(want_copy, want_p, "the copy is rounded");

    // An f32 copy (of parameters that replicas share) is the updated parameters themselves.
    assert!([DType::F32, DType::BF16, DType::F16].map(|t| queue.rounds_to(t)) == [true; 3]);
    let mut plain = ops[0].clone();
    if let DeviceOp::Update { copy, .. } = &mut plain {
        *copy = copy.map(|c| RoundedCopy {
            dtype: DType::F32,
            ..c
        });
    }
    // SAFETY: as above.
    unsafe { queue.run(&[plain]) }.expect("an update with an f32 copy");
    let first = spans[0].0;
    let updated = read(0, first);
    assert_ne!(updated, want_p[..first], "updated again");
    assert_bitwise("the f32 copy", &read(5, first), &updated);
}

/// Adam's kernel over two spans (one regularised) is exactly its host arithmetic
/// (`tandem_optim::adam_update`), with one and with three replicas' gradients, with the moving
/// average and without it (a null average the kernel leaves alone), writing the parameters'
/// f16 copy or none: the copy exactly `tandem_tensor::round_to` of the result.
#[test]
fn adam_update_is_exactly_the_host_update() {
    use tandem_core::{DType, DeviceOp, DeviceQueue, Optimizer, RoundedCopy};
    use tandem_optim::{adam_update, Adam};
    let Some(gpu) = gpu() else { return };
    let queue = gpu.queue();
    let mut rng = rng(11);
    let spans = [(700, true), (300, false)];
    let len: usize = spans.iter().map(|s| s.0).sum();
    let adam = Adam {
        learning_rate: 0.01,
        weight_decay: 0.05,
        ..Adam::DEFAULT
    };
    let values = |decayed| -> [f32; 6] {
        let update = adam
            .device_update(4, 0.5, decayed, 1.0)
            .expect("a device update");
        update.hyper.try_into().expect("six values")
    };
    for (grads, average) in [(1, true), (3, true), (3, false)] {
        // Parameters, the first moment, the second (not negative), the average, the gradients.
        let mut host: Vec<Vec<f32>> = (0..4 + grads).map(|_| random(&mut rng, len, 0.5)).collect();
        host[2].iter_mut().for_each(|v| *v = v.abs() * 1e-3);
        let buffers = written(&queue, &host);
        // Written where there are several gradients' vectors.
        let copy = written(&queue, &[vec![0.5; len]]);
        let copied = grads > 1;
        let hyper = queue.alloc(12, DType::F32).expect("alloc");
        // SAFETY: twelve values.
        unsafe { queue.write(hyper.address(), &[values(true), values(false)].concat()) }
            .expect("write");
        let at = |buffer: usize, offset: usize| buffer_at(&buffers, buffer, offset);
        let states = if average { 3 } else { 2 };
        let mut ops = Vec::new();
        let mut offset = 0;
        for &(span, on) in &spans {
            ops.push(DeviceOp::Update {
                kernel: "adam_update",
                params: at(0, offset),
                state: (1..=states).map(|s| at(s, offset)).collect(),
                grads: (4..4 + grads).map(|g| at(g, offset)).collect(),
                grads_dtype: DType::F32,
                len: span,
                hyper: hyper.address() + if on { 0 } else { 24 },
                copy: copied.then(|| RoundedCopy {
                    params: buffer_at(&copy, 0, offset),
                    dtype: DType::F16,
                }),
            });
            offset += span;
        }
        // SAFETY: every span lies in its buffers, which outlive the reads below (they wait).
        unsafe { queue.run(&ops) }.expect("run");

        let mut want = host.clone();
        let (outputs, inputs) = want.split_at_mut(4);
        let (params, state) = outputs.split_first_mut().expect("four buffers");
        let mut offset = 0;
        for &(span, on) in &spans {
            let range = offset..offset + span;
            let mut slots: Vec<&mut [f32]> = state[..states]
                .iter_mut()
                .map(|s| &mut s[range.clone()])
                .collect();
            let parts: Vec<&[f32]> = inputs.iter().map(|g| &g[range.clone()]).collect();
            adam_update(&mut params[range.clone()], &mut slots, &parts, values(on));
            offset += span;
        }
        for (buffer, name) in [(0, "params"), (1, "m"), (2, "v"), (3, "ema")] {
            let mut got = vec![0.0; len];
            // SAFETY: the buffer holds `len` values; the read waits for the queue.
            unsafe { queue.read(buffers[buffer].address(), &mut got) }.expect("read");
            assert_exact(
                &format!("{grads} gradients, average {average}: {name}"),
                &got,
                &want[buffer],
            );
        }
        assert_ne!(want[0], host[0], "the update moved the parameters");
        let mut want_copy = match copied {
            true => want[0].clone(),
            false => vec![0.5; len],
        };
        tandem_tensor::round_to(DType::F16, &mut want_copy);
        let mut got = vec![0.0; len];
        // SAFETY: the buffer holds `len` values; the read waits for the queue.
        unsafe { queue.read(copy[0].address(), &mut got) }.expect("read");
        assert_bitwise(
            &format!("{grads} gradients: the f16 copy"),
            &got,
            &want_copy,
        );
    }
}

/// The L2 term's sums on the device (`DeviceOp::SumSquares`): spans of every alignment to 16
/// bytes and of lengths around the kernel's vector loads (empty, shorter than a float4, not
/// whole float4s, more than the block's threads take at once, the MNIST network's first
/// weights), each against the exact sum (squares of floats are exact in f64, and an f64 sum of
/// these within a few units of its last place), and bit for bit the same when run again.
#[test]
fn sums_of_squares_on_the_device_are_the_exact_sums_to_f64() {
    use tandem_core::{f64_of_slots, DType, DeviceOp, DeviceQueue};
    let Some(gpu) = gpu() else { return };
    let queue = gpu.queue();
    let mut rng = rng(17);
    let values = random(&mut rng, 392_000 + 3, 0.1);
    let buffers = written(&queue, std::slice::from_ref(&values));
    let sums = queue.alloc(2, DType::F32).expect("alloc");
    for offset in 0..4 {
        for len in [0, 1, 3, 4, 5, 1_023, 1_030, 4 * 256 + 7, 392_000] {
            let op = DeviceOp::SumSquares {
                dst: sums.address(),
                src: buffer_at(&buffers, 0, offset),
                len,
            };
            let mut runs = Vec::new();
            for _ in 0..2 {
                let mut slots = [f32::NAN; 2];
                // SAFETY: the span lies in the buffer, `sums` holds 8 bytes; the read waits.
                unsafe {
                    queue.run(std::slice::from_ref(&op)).expect("sum_squares");
                    queue.read(sums.address(), &mut slots).expect("read");
                }
                runs.push(f64_of_slots(slots));
            }
            let span = &values[offset..offset + len];
            // Each square exact; a sum of n terms within n units of roundoff of the exact one.
            let exact: f64 = span.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            let bound = (len as f64 + 1.0) * f64::EPSILON * exact;
            let what = format!("{len} values from {offset}");
            assert!(
                (runs[0] - exact).abs() <= bound,
                "{what}: {} against {exact}",
                runs[0]
            );
            assert_eq!(runs[0].to_bits(), runs[1].to_bits(), "{what}: run again");
        }
    }
}

/// A rounding on the device (`DeviceOp::Round`: how an asynchronous store's copy of the record
/// into a 16-bit replica ends) is exactly the host's `tandem_tensor::round_to` to bf16 and f16:
/// ties to even both ways, values past each type's range, subnormals of each, zeros of both
/// signs, infinities and NaN included; f32 leaves the values alone. Only the `len` values given
/// change.
#[test]
fn a_device_rounding_is_the_hosts() {
    use tandem_core::{DType, DeviceOp, DeviceQueue};
    let Some(gpu) = gpu() else { return };
    let queue = gpu.queue();
    let mut values = random(&mut rng(17), 1_000, 3.0);
    let specials = [
        f32::from_bits(0x3f80_8000), // bf16 tie, to the even below
        f32::from_bits(0x3f81_8000), // bf16 tie, to the even above
        f32::from_bits(0x3f80_1000), // f16 tie, to the even below
        f32::from_bits(0x3f80_3000), // f16 tie, to the even above
        f32::MAX,
        -65_520.0, // past f16's largest finite value once rounded
        65_504.0,
        1.0e-6,  // an f16 subnormal
        3.0e-39, // an f32 (and bf16) subnormal
        -0.0,
        0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    values[..specials.len()].copy_from_slice(&specials);
    let len = values.len() - 1;
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let buffer = written(&queue, std::slice::from_ref(&values));
        let at = buffer[0].address();
        // SAFETY: the buffer holds `len` + 1 values and outlives the read (which waits).
        unsafe { queue.run(&[DeviceOp::Round { at, len, dtype }]) }.expect("round");
        let mut got = vec![0.0; values.len()];
        // SAFETY: as above.
        unsafe { queue.read(at, &mut got) }.expect("read");
        let mut want = values.clone();
        tandem_tensor::round_to(dtype, &mut want[..len]);
        let changed = (want.iter().zip(&values))
            .filter(|(w, v)| w.to_bits() != v.to_bits())
            .count();
        assert_eq!(
            changed == 0,
            dtype == DType::F32,
            "{dtype}: {changed} rounded"
        );
        let nan = specials.len() - 1;
        assert!(got[nan].is_nan(), "{dtype}: NaN rounds to {}", got[nan]);
        (got[nan], want[nan]) = (0.0, 0.0);
        assert_bitwise(&format!("rounded to {dtype}"), &got, &want);
        assert!(queue.rounds_to(dtype));
    }
}

/// A 16-bit exchange on the device: each replica's gradients divided by the worker count and
/// rounded to bf16 (`DeviceOp::Compress`) are exactly the host's exchange's (an f32 division,
/// then `encode_bf16`), and SGD and Adam's updates from them (`grads_dtype` bf16) sum them from
/// zero in order in f32, exactly as the host sums what arrives, then update as from one
/// gradient. Ties and values past bf16's range included.
#[test]
fn a_bf16_exchange_compresses_and_updates_as_the_host_does() {
    use tandem_core::{DType, DeviceOp, DeviceQueue, Optimizer};
    use tandem_optim::{adam_update, Adam};
    let Some(gpu) = gpu() else { return };
    let queue = gpu.queue();
    let mut rng = rng(13);
    let (workers, len) = (3, 2_000);
    let mut grads: Vec<Vec<f32>> = (0..workers).map(|_| random(&mut rng, len, 0.5)).collect();
    // Exact ties after the division by 3 (odd and even halves), a value that overflows bf16
    // and a negative zero.
    grads[0][..4].copy_from_slice(&[
        3.0 * f32::from_bits(0x3f80_8000),
        3.0 * f32::from_bits(0x3f81_8000),
        f32::MAX,
        -0.0,
    ]);
    let sent: Vec<Vec<u16>> = grads
        .iter()
        .map(|g| {
            let divided: Vec<f32> = g.iter().map(|v| v / workers as f32).collect();
            let mut bits = Vec::new();
            tandem_tensor::encode_bf16(&divided, &mut bits);
            bits
        })
        .collect();
    let f32_grads = written(&queue, &grads);
    let outboxes: Vec<_> = (0..workers)
        .map(|_| queue.alloc(len, DType::BF16).expect("alloc"))
        .collect();
    let compress: Vec<DeviceOp> = (0..workers)
        .map(|w| DeviceOp::Compress {
            dst: outboxes[w].address(),
            src: f32_grads[w].address(),
            len,
            divisor: workers as f32,
            dtype: DType::BF16,
        })
        .collect();
    // SAFETY: every buffer holds `len` values of its type and outlives the reads (they wait).
    unsafe { queue.run(&compress) }.expect("compress");
    for (w, want) in sent.iter().enumerate() {
        let mut got = vec![0u16; len];
        // SAFETY: the outbox holds `len` bf16 values.
        unsafe { queue.read_bits16(outboxes[w].address(), &mut got) }.expect("read");
        if let Some(i) = (0..len).find(|&i| got[i] != want[i]) {
            panic!(
                "worker {w}: value {i} is {:#06x}, the host's {:#06x}",
                got[i], want[i]
            );
        }
    }
    let other = DeviceOp::Compress {
        dst: outboxes[0].address(),
        src: f32_grads[0].address(),
        len,
        divisor: 1.0,
        dtype: DType::F16,
    };
    // SAFETY: as above; refused, not run.
    let refused = unsafe { queue.run(&[other]) }.expect_err("f16");
    assert!(refused.to_string().contains("to f16"), "{refused}");
    assert!(queue.compresses_to(DType::BF16) && !queue.compresses_to(DType::F16));

    // What arrives, summed from zero in worker order: the one gradient of the host's update.
    let mut mean = vec![0.0f32; len];
    for bits in &sent {
        let mut values = vec![0.0f32; len];
        tandem_tensor::decode_bf16(bits, &mut values);
        mean.iter_mut().zip(&values).for_each(|(m, v)| *m += v);
    }
    let adam = Adam {
        learning_rate: 0.01,
        weight_decay: 0.05,
        ..Adam::DEFAULT
    };
    let adam_values: [f32; 6] = (adam.device_update(4, 0.5, true, 1.0))
        .expect("a device update")
        .hyper
        .try_into()
        .expect("six values");
    let sgd_values = [STEP.learning_rate, STEP.weight_decay, STEP.ema_decay];
    for (kernel, values, states) in [
        ("sgd_ema_update", &sgd_values[..], 1),
        ("adam_update", &adam_values[..], 3),
    ] {
        let mut host: Vec<Vec<f32>> = (0..=states).map(|_| random(&mut rng, len, 0.5)).collect();
        if states == 3 {
            host[2].iter_mut().for_each(|v| *v = v.abs() * 1e-3);
        }
        let buffers = written(&queue, &host);
        let hyper = written(&queue, &[values.to_vec()]);
        let update = DeviceOp::Update {
            kernel,
            params: buffers[0].address(),
            state: buffers[1..].iter().map(|b| b.address()).collect(),
            grads: outboxes.iter().map(|o| o.address()).collect(),
            grads_dtype: DType::BF16,
            len,
            hyper: hyper[0].address(),
            copy: None,
        };
        // SAFETY: every buffer holds `len` values of its type (the hyper-parameters the
        // kernel's), alive until the reads below, which wait.
        unsafe { queue.run(&[update]) }.expect("update");
        let (params, state) = host.split_first_mut().expect("parameters");
        let mut slots: Vec<&mut [f32]> = state.iter_mut().map(Vec::as_mut_slice).collect();
        match states {
            1 => cpu::sgd_ema_update(params, &mut *slots[0], &[&mean], STEP),
            _ => adam_update(params, &mut slots, &[&mean], adam_values),
        }
        for (buffer, want) in buffers.iter().zip(&host) {
            let mut got = vec![0.0; len];
            // SAFETY: the buffer holds `len` values; the read waits for the queue.
            unsafe { queue.read(buffer.address(), &mut got) }.expect("read");
            assert_bitwise(kernel, &got, want);
        }
    }
}

/// New buffers on `queue`'s device holding `host`'s vectors.
fn written(
    queue: &dyn tandem_core::DeviceQueue,
    host: &[Vec<f32>],
) -> Vec<Box<dyn tandem_core::DeviceAlloc>> {
    host.iter()
        .map(|values| {
            let buffer = queue
                .alloc(values.len(), tandem_core::DType::F32)
                .expect("alloc");
            // SAFETY: the buffer holds as many values.
            unsafe { queue.write(buffer.address(), values) }.expect("write");
            buffer
        })
        .collect()
}

/// The device address of value `offset` of `buffers[buffer]`.
fn buffer_at(buffers: &[Box<dyn tandem_core::DeviceAlloc>], buffer: usize, offset: usize) -> u64 {
    tandem_core::DType::F32.at(buffers[buffer].address(), offset)
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
    // The first layer's forward product's shape, split over k, masked by the last block of each tile.
    let spec = Gemm::nn(100, 500, 784);
    let (got, _) = gemm_case(gpu, &mut rng, spec, Epilogue::ReluBackward);
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

#[test]
fn a_missing_device_skips_or_fails_as_required() {
    let reason = KernelError::NoSuchDevice {
        ordinal: 0,
        count: 0,
    };
    use tandem_testkit::Verdict;
    let Verdict::Skip(skipped) = tandem_testkit::verdict("t", &reason, false) else {
        panic!("skipped when not required")
    };
    assert!(
        skipped.starts_with("SKIPPED: t: no CUDA device"),
        "{skipped}"
    );
    let Verdict::Fail(failure) = tandem_testkit::verdict("t", &reason, true) else {
        panic!("fails when required")
    };
    assert!(failure.contains("TANDEM_REQUIRE_GPU=1"), "{failure}");
    // Any other error opening the device fails whether or not one is required.
    let broken = std::panic::catch_unwind(|| {
        tandem_testkit::or_skip::<(), _>(
            Err(KernelError::NoSuchDevice {
                ordinal: 3,
                count: 1,
            }),
            KernelError::is_no_device,
        )
    });
    assert!(broken.is_err());
}

/// Operand lengths and offsets for [`bad_inputs`]: a batch of 2 rows of 3 classes.
const ROWS: usize = 2;
const CLASSES: usize = 3;

/// Runs every operation of `Backend` on inputs that are wrong in one way each, and returns what
/// each one said, by case. `shape` turns the backend's error into the shape error it carries.
fn bad_inputs<B: Backend>(
    backend: &B,
    shape: impl Fn(B::Error) -> tandem_tensor::ShapeError,
) -> Vec<(&'static str, Result<(), tandem_tensor::ShapeError>)> {
    let zeros = |len| backend.zeros(len).expect("allocating");
    // Labels: 1, 3, 5 from a data set whose examples are labelled so; 3 and 5 are out of range
    // for 3 classes, and 3 is the first.
    let set = ExampleSet::new(1, vec![0; 3], vec![1, 3, 5]).expect("a data set");
    let examples = backend.upload_examples(&set).expect("upload_examples");
    let gathered = |indices: &[u32]| {
        let mut x = zeros(indices.len());
        let mut labels = backend.zero_labels(indices.len()).expect("labels");
        backend
            .gather(&examples, indices, &mut x, &mut labels)
            .expect("gather");
        labels
    };
    let good = gathered(&[0, 0]);
    let bad = gathered(&[0, 1]);
    let worse = gathered(&[2, 1]); // the first bad one is 5
    let short_labels = backend.zero_labels(ROWS - 1).expect("labels");
    let logits = zeros(ROWS * CLASSES);
    let spec = Gemm::nt(2, 3, 4);
    macro_rules! unit {
        ($result:expr) => {
            $result.map(|_| ()).map_err(&shape)
        };
    }
    let mut cases = Vec::new();
    let mut case = |name, result| cases.push((name, result));
    case(
        "upload past the end",
        unit!(backend.upload(&[1.0; 3], &mut zeros(4), 2)),
    );
    case(
        "download past the end",
        unit!(backend.download(&zeros(4), 2, &mut [0.0; 3])),
    );
    case(
        "gather: an index past the data set",
        unit!(backend.gather(
            &examples,
            &[0, 3],
            &mut zeros(2),
            &mut backend.zero_labels(2).unwrap(),
        )),
    );
    case(
        "gather: x too short",
        unit!(backend.gather(
            &examples,
            &[0, 1],
            &mut zeros(1),
            &mut backend.zero_labels(2).unwrap(),
        )),
    );
    case(
        "matmul: a too short",
        unit!(backend.matmul(spec, (&zeros(8), 1), (&zeros(12), 0), (&mut zeros(6), 0))),
    );
    case(
        "matmul: c too short at its offset",
        unit!(backend.matmul(spec, (&zeros(8), 0), (&zeros(12), 0), (&mut zeros(6), 1))),
    );
    case(
        "bias_add: no columns",
        unit!(backend.bias_add(&mut zeros(4), (&zeros(4), 0), 2, 0, Activation::Relu)),
    );
    case(
        "bias_add: bias too short",
        unit!(backend.bias_add(&mut zeros(6), (&zeros(3), 1), 2, 3, Activation::Identity)),
    );
    case(
        "relu_backward: grad too short",
        unit!(backend.relu_backward(&mut zeros(3), &zeros(4), 4)),
    );
    case(
        "softmax_cross_entropy: no classes",
        unit!(backend.softmax_cross_entropy(&logits, &good, ROWS, 0, &mut zeros(6))),
    );
    case(
        "softmax_cross_entropy: labels too short",
        unit!(backend.softmax_cross_entropy(&logits, &short_labels, ROWS, CLASSES, &mut zeros(6))),
    );
    case(
        "softmax_cross_entropy: dlogits too short",
        unit!(backend.softmax_cross_entropy(&logits, &good, ROWS, CLASSES, &mut zeros(5))),
    );
    case(
        "softmax_cross_entropy: a label out of range",
        unit!(backend.softmax_cross_entropy(&logits, &bad, ROWS, CLASSES, &mut zeros(6))),
    );
    case(
        "softmax_cross_entropy: two labels out of range",
        unit!(backend.softmax_cross_entropy(&logits, &worse, ROWS, CLASSES, &mut zeros(6))),
    );
    case(
        "column_sum: no columns",
        unit!(backend.column_sum(&zeros(4), 4, 0, (&mut zeros(1), 0))),
    );
    case(
        "column_sum: out too short at its offset",
        unit!(backend.column_sum(&zeros(6), 2, 3, (&mut zeros(3), 1))),
    );
    case(
        "count_correct: no classes",
        unit!(backend.count_correct(&logits, &good, ROWS, 0)),
    );
    case(
        "count_correct: logits too short",
        unit!(backend.count_correct(&zeros(5), &good, ROWS, CLASSES)),
    );
    case(
        "count_correct: a label out of range",
        unit!(backend.count_correct(&logits, &bad, ROWS, CLASSES)),
    );
    case(
        "count_correct: two labels out of range",
        unit!(backend.count_correct(&logits, &worse, ROWS, CLASSES)),
    );
    cases
}

/// The CPU and the GPU refuse the same inputs with the same error: the shared checks of
/// `tandem_tensor::check`, and the labels' range, checked on the device.
#[test]
fn bad_inputs_fail_alike_on_the_cpu_and_the_gpu() {
    let cpu = bad_inputs(&CpuBackend, |e| e);
    for (case, result) in &cpu {
        assert!(result.is_err(), "CPU accepted {case}");
    }
    // The label cases name the first bad label.
    let named = |case: &str| cpu.iter().find(|(c, _)| *c == case).unwrap().1.clone();
    let first = named("softmax_cross_entropy: two labels out of range").unwrap_err();
    assert_eq!(
        (first.operand, first.needed, first.available),
        ("labels", 6, CLASSES)
    );
    let Some(gpu) = gpu() else { return };
    let on_gpu = bad_inputs(&gpu, |e| match e {
        KernelError::Shape(shape) => shape,
        other => panic!("not a shape error: {other}"),
    });
    for ((case, want), (_, got)) in cpu.iter().zip(&on_gpu) {
        assert_eq!(got, want, "{case}");
    }
    // And the GPU still works after refusing (no poisoned state left behind).
    let logits = upload(&gpu, &[0.0, 1.0, 0.0, 2.0, 0.0, 0.0], 0);
    let good = labels(&gpu, &[1, 0]);
    assert_eq!(gpu.count_correct(&logits, &good, ROWS, CLASSES).unwrap(), 2);
    let mut d = poisoned(&gpu, ROWS * CLASSES);
    let loss = gpu
        .softmax_cross_entropy(&logits, &good, ROWS, CLASSES, &mut d)
        .unwrap();
    assert!(loss.is_finite(), "{loss}");
}

/// Buffers are freed in their own context whatever the dropping thread has current, and doing
/// so leaves that thread's own context current: replicas on `cuda:0,1` are torn down this way.
#[test]
fn buffers_are_freed_in_their_own_context_on_any_thread() {
    let Some(first) = gpu() else { return };
    let failures = tandem_kernels::release_failures();
    let mut held = Vec::new();
    for len in [1, 1000, 100_000] {
        held.push(upload(&first, &vec![1.0; len], 0));
    }
    // Another thread, with no context current: every release must still succeed.
    let spare = upload(&first, &[2.0; 10], 0);
    std::thread::spawn(move || drop(spare)).join().unwrap();
    // A second backend (the second GPU where there is one, else another on the first) made
    // current last: dropping the first's buffers must not change what is current.
    let second = CudaBackend::new(tandem_kernels::device_count().unwrap().min(2) - 1)
        .expect("a second backend");
    second.make_current().unwrap();
    drop(held);
    let after = upload(&second, &[3.0, 4.0], 0);
    let mut sums = poisoned(&second, 1);
    second
        .column_sum(&after, 2, 1, (&mut sums, 0))
        .expect("the second backend's context is still current");
    assert_eq!(download(&second, &sums, 0, 1), [7.0]);
    // Whole backends too, dropped on a thread with nothing current.
    std::thread::spawn(move || drop(first)).join().unwrap();
    drop(after);
    drop(sums);
    drop(second);
    assert_eq!(tandem_kernels::release_failures(), failures);
}

/// Two backends of one GPU whose queues share an order (`DeviceQueue::share_order`): work
/// queued on the second runs after what the first queued before it, with no event between
/// them (the stand-in runs each stream on a thread of its own, so an update of 400,000 values
/// on one stream would still be running when a copy on another reads them). A queue of another
/// GPU does not join.
#[test]
fn queues_of_one_gpu_share_an_order_and_no_other_gpus() {
    use tandem_core::{DType, DeviceOp, DeviceQueue};
    let (Some(first), Some(second)) = (gpu(), gpu()) else {
        return;
    };
    let (queue, joining) = (first.queue(), second.queue());
    assert!(joining.share_order(&queue).expect("sharing an order"));
    let len = 400_000;
    let mut rng = rng(12);
    let host: Vec<Vec<f32>> = (0..4).map(|_| random(&mut rng, len, 0.5)).collect();
    let buffers = written(&queue, &host);
    let hyper = queue.alloc(3, DType::F32).expect("alloc");
    let step = [STEP.learning_rate, STEP.weight_decay, STEP.ema_decay];
    // SAFETY: three values.
    unsafe { queue.write(hyper.address(), &step) }.expect("write");
    let update = DeviceOp::Update {
        kernel: "sgd_ema_update",
        params: buffer_at(&buffers, 0, 0),
        state: vec![buffer_at(&buffers, 1, 0)],
        grads: vec![buffer_at(&buffers, 2, 0)],
        grads_dtype: DType::F32,
        len,
        hyper: hyper.address(),
        copy: None,
    };
    let copy = DeviceOp::Copy {
        dst: buffer_at(&buffers, 3, 0),
        src: buffer_at(&buffers, 0, 0),
        len,
        dtype: DType::F32,
    };
    // SAFETY: every buffer holds `len` values and outlives the reads below, which wait.
    unsafe {
        queue.run(&[update]).expect("the update");
        joining.run(&[copy]).expect("the copy");
    }
    let (mut want_p, mut want_e) = (host[0].clone(), host[1].clone());
    cpu::sgd_ema_update(&mut want_p, &mut want_e, &[&host[2]], STEP);
    let mut got = vec![0.0; len];
    // SAFETY: the buffer holds `len` values; the read waits for the shared stream.
    unsafe { joining.read(buffers[3].address(), &mut got) }.expect("read");
    assert_bitwise("the copy of the updated parameters", &got, &want_p);

    let Some(other) = tandem_testkit::or_skip(CudaBackend::new(1), KernelError::is_no_device)
    else {
        return;
    };
    assert!(!other.queue().share_order(&queue).expect("asking"));
}
