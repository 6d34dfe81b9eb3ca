//! The 16-bit CUDA backend (`CudaBackend::with_dtype`, bf16 and f16) against its CPU twin,
//! `tandem_tensor::NarrowCpuBackend`, and its products against exact (f64) arithmetic, on a GPU
//! or the stand-in (skipped without one, as in `cuda.rs`).
#![cfg(feature = "cuda")]

mod common;

use common::{download, gemm_shapes, random, rng, upload};
use rand::Rng;
use tandem_core::{Alone, DType};
use tandem_kernels::{CudaBackend, KernelError};
use tandem_tensor::{cpu, round_to, Activation, Backend, ExampleSet, Gemm, NarrowCpuBackend};

const NARROW: [DType; 2] = [DType::BF16, DType::F16];

/// Device 0 computing in `dtype`, or `None` after saying on stderr that the test is skipped.
fn gpu(dtype: DType) -> Option<CudaBackend> {
    tandem_testkit::or_skip(CudaBackend::with_dtype(0, dtype), KernelError::is_no_device)
}

fn twin(dtype: DType) -> NarrowCpuBackend {
    NarrowCpuBackend::new(dtype).expect("a 16-bit type")
}

/// Unit roundoff of the type: half the gap between 1 and the next value.
fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 2f64.powi(-8),
        _ => 2f64.powi(-11),
    }
}

/// The gap between `|v|` and the next larger value of the type (f16's subnormal gap below its
/// smallest normal).
fn gap(dtype: DType, v: f64) -> f64 {
    let exponent = v.abs().max(f64::MIN_POSITIVE).log2().floor() as i32;
    match dtype {
        DType::BF16 => 2f64.powi(exponent - 7),
        _ => 2f64.powi(exponent.max(-14) - 10),
    }
}

/// A data set of `examples` random images of `features` pixels (labels below 10), and a batch
/// of `rows` of them drawn at random.
fn random_batch(
    rng: &mut impl Rng,
    (features, examples): (usize, usize),
    rows: usize,
) -> (ExampleSet, Vec<u32>) {
    let pixels: Vec<u8> = (0..features * examples).map(|_| rng.random()).collect();
    let kinds: Vec<u8> = (0..examples).map(|_| rng.random_range(0..10)).collect();
    let set = ExampleSet::new(features, pixels, kinds).expect("a consistent data set");
    let indices: Vec<u32> = (0..rows)
        .map(|_| rng.random_range(0..examples as u32))
        .collect();
    (set, indices)
}

/// Every value is one of the type's (rounding leaves it as it is).
fn assert_of_type(what: &str, dtype: DType, values: &[f32]) {
    let mut rounded = values.to_vec();
    round_to(dtype, &mut rounded);
    if let Some(i) = (0..values.len()).find(|&i| rounded[i].to_bits() != values[i].to_bits()) {
        panic!("{what}: element {i}, {}, is not a {dtype} value", values[i]);
    }
}

/// The tensor-core product of 16-bit operands, every shape and transposition of `cuda.rs`,
/// with and without the bias + ReLU epilogue, against exact arithmetic. The bound: each
/// 16-value chunk of k is summed and added to the f32 accumulator with one rounding
/// (`mma.sync`), so after `ceil(k / 16)` chunks (and the bias) the f32 value is within
/// `(ceil(k / 16) + 1) e S` of the exact one, `S` the sum of `|a b|` (and `|bias|`), with
/// `e = u32 = 2^-24` where the chunk sum is exact and rounded to nearest. Tensor cores align
/// the products to the largest, cut them below 2^-25 of it and truncate the sum (Fasi et al.,
/// "Numerical behavior of NVIDIA tensor cores", 2021; the H200's rule, which the stand-in
/// follows): up to a few ulps a chunk, so the test allows `e = 2^-22`, still far below what a misplaced fragment costs (a swapped pair: 0.40
/// against a bound of 4.4e-4). The store rounds once more, by at most `u16` of its value (and
/// half the smallest f16 subnormal, 2^-25). The CPU twin sums in f32 in its own order, so its
/// accumulation is within `(k + 1) u32 S`, and then rounds once as well.
#[test]
fn tensor_core_products_are_exact_chunks_rounded_once() {
    let mut rng = rng(29);
    let shapes = gemm_shapes(&mut rng);
    for dtype in NARROW {
        let Some(gpu) = gpu(dtype) else { return };
        let cpu = twin(dtype);
        for &(m, n, k) in &shapes {
            for (a_t, b_t) in [(false, false), (true, false), (false, true), (true, true)] {
                let spec = Gemm::new(m, n, k, a_t, b_t);
                let with_bias = !a_t && !b_t;
                let mut a = random(&mut rng, m * k, 1.0);
                let mut b = random(&mut rng, k * n, 1.0);
                let mut bias = random(&mut rng, n, 0.5);
                for v in [&mut a, &mut b, &mut bias] {
                    round_to(dtype, v);
                }
                let (ga, gb, gbias) = (
                    upload(&gpu, &a, 0),
                    upload(&gpu, &b, 0),
                    upload(&gpu, &bias, 0),
                );
                let mut gc = upload(&gpu, &vec![f32::NAN; m * n], 0);
                let mut cc = vec![f32::NAN; m * n];
                match with_bias {
                    true => {
                        let bias_at = (&gbias, 0);
                        let relu = Activation::Relu;
                        (gpu.matmul_bias(spec, (&ga, 0), (&gb, 0), bias_at, (&mut gc, 0), relu))
                            .expect("gpu product");
                        (cpu.matmul_bias(spec, (&a, 0), (&b, 0), (&bias, 0), (&mut cc, 0), relu))
                            .expect("cpu product");
                    }
                    false => {
                        gpu.matmul(spec, (&ga, 0), (&gb, 0), (&mut gc, 0))
                            .expect("gpu product");
                        cpu.matmul(spec, (&a, 0), (&b, 0), (&mut cc, 0))
                            .expect("cpu product");
                    }
                }
                let got = download(&gpu, &gc, 0, m * n);
                let what = format!("{dtype} {spec:?} bias {with_bias}");
                assert_of_type(&what, dtype, &got);
                let op_a = |r: usize, c: usize| match a_t {
                    true => a[c * m + r],
                    false => a[r * k + c],
                };
                let op_b = |r: usize, c: usize| match b_t {
                    true => b[c * k + r],
                    false => b[r * n + c],
                };
                let chunks = k.div_ceil(16) as f64 + 1.0;
                let subnormal = if dtype == DType::F16 {
                    2f64.powi(-25)
                } else {
                    0.0
                };
                for r in 0..m {
                    for c in 0..n {
                        let (mut exact, mut size) = (0.0f64, 0.0f64);
                        for i in 0..k {
                            let p = f64::from(op_a(r, i)) * f64::from(op_b(i, c));
                            exact += p;
                            size += p.abs();
                        }
                        if with_bias {
                            exact = (exact + f64::from(bias[c])).max(0.0);
                            size += f64::from(bias[c]).abs();
                        }
                        let bound = |accumulation: f64| {
                            unit_roundoff(dtype) * exact.abs()
                                + accumulation * size * (1.0 + unit_roundoff(dtype))
                                + subnormal
                        };
                        let sides = [
                            ("gpu", got[r * n + c], bound(chunks * 2f64.powi(-22))),
                            ("cpu", cc[r * n + c], bound((k + 1) as f64 * 2f64.powi(-24))),
                        ];
                        for (side, value, bound) in sides {
                            let error = (f64::from(value) - exact).abs();
                            assert!(
                                error <= bound,
                                "{what} [{r}][{c}] {side}: {value} against {exact} (bound {bound})"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The other kernels store values of the type, the twin's: exactly where both do the same f32
/// operation (gather's division, the bias, ReLU, the column sums in row order), within one
/// step of the type where the f32 values differ in their last bits first (the softmax's
/// exponentials); the loss's gradient multiplied by the loss scale before it is rounded.
#[test]
fn every_kernel_stores_the_twins_values_of_the_type() {
    let mut rng = rng(30);
    let (rows, features, classes, examples) = (13, 37, 10, 40);
    let (set, indices) = random_batch(&mut rng, (features, examples), rows);
    for dtype in NARROW {
        let Some(gpu) = gpu(dtype) else { return };
        let cpu = twin(dtype);
        // Uploads round: what the buffers hold is always of the type.
        let wide = random(&mut rng, 50, 3.0);
        let mut want = cpu.zeros(50).unwrap();
        cpu.upload(&wide, &mut want, 0).unwrap();
        let got = download(&gpu, &upload(&gpu, &wide, 0), 0, 50);
        assert_eq!(got, want, "{dtype} upload");
        let mut written = gpu.zeros(50).unwrap();
        gpu.write_with(&mut written, &mut |p| p.copy_from_slice(&wide))
            .unwrap();
        assert_eq!(download(&gpu, &written, 0, 50), want, "{dtype} write_with");

        let resident = gpu.upload_examples(&set).unwrap();
        let mut x = gpu.zeros(rows * features).unwrap();
        let mut labels = gpu.zero_labels(rows).unwrap();
        gpu.gather(&resident, &indices, &mut x, &mut labels)
            .unwrap();
        let (mut cx, mut clabels) = (vec![0.0; rows * features], vec![0; rows]);
        cpu.gather(&set, &indices, &mut cx, &mut clabels).unwrap();
        let gx = download(&gpu, &x, 0, rows * features);
        assert_of_type(&format!("{dtype} gather"), dtype, &gx);
        assert_eq!(gx, cx, "{dtype} gather");

        let bias_values = random(&mut rng, features, 0.5);
        let (gbias, mut cbias) = (upload(&gpu, &bias_values, 0), bias_values.clone());
        round_to(dtype, &mut cbias);
        gpu.bias_add(&mut x, (&gbias, 0), rows, features, Activation::Relu)
            .unwrap();
        cpu.bias_add(&mut cx, (&cbias, 0), rows, features, Activation::Relu)
            .unwrap();
        let gx = download(&gpu, &x, 0, rows * features);
        assert_of_type(&format!("{dtype} bias_add"), dtype, &gx);
        assert_eq!(gx, cx, "{dtype} bias_add");

        // A gradient's product masked by the ReLU output `x` in its epilogue: the product's
        // values of the type where the mask is positive, zeros elsewhere, as the twin's
        // `relu_backward` leaves them.
        let spec = Gemm::nt(rows, features, 9);
        let (delta, weights) = (
            random(&mut rng, rows * 9, 1.0),
            random(&mut rng, features * 9, 1.0),
        );
        let (gdelta, gweights) = (upload(&gpu, &delta, 0), upload(&gpu, &weights, 0));
        let mut product = gpu.zeros(rows * features).unwrap();
        gpu.matmul(spec, (&gdelta, 0), (&gweights, 0), (&mut product, 0))
            .unwrap();
        let mut want = download(&gpu, &product, 0, rows * features);
        cpu::relu_backward(&mut want, &cx);
        let mut masked = gpu.zeros(rows * features).unwrap();
        (gpu.matmul_relu_backward(spec, (&gdelta, 0), (&gweights, 0), &x, &mut masked)).unwrap();
        let got = download(&gpu, &masked, 0, rows * features);
        assert!(
            got.contains(&0.0) && got.iter().any(|&v| v != 0.0),
            "{got:?}"
        );
        assert_eq!(got, want, "{dtype} matmul_relu_backward");

        let mut sums = gpu.zeros(features + 3).unwrap();
        gpu.column_sum(&x, rows, features, (&mut sums, 3)).unwrap();
        let mut csums = vec![0.0; features + 3];
        cpu.column_sum(&cx, rows, features, (&mut csums, 3))
            .unwrap();
        assert_eq!(
            download(&gpu, &sums, 0, features + 3),
            csums,
            "{dtype} column_sum"
        );

        // Confident logits: unscaled, f16 flushes the wrong classes' gradients to zero.
        let mut logits: Vec<f32> = random(&mut rng, rows * classes, 3.0);
        for r in 0..rows {
            logits[r * classes + r % classes] += 16.0;
        }
        round_to(dtype, &mut logits);
        let label_values: Vec<u32> = (0..rows as u32).map(|r| r % classes as u32).collect();
        let mut glabels = gpu.zero_labels(rows).unwrap();
        gpu.upload_labels(&label_values, &mut glabels, 0).unwrap();
        let glogits = upload(&gpu, &logits, 0);
        for scale in [1.0, 2f32.powi(12), 2f32.powi(24)] {
            assert!(gpu.set_loss_scale(scale).unwrap());
            cpu.set_loss_scale(scale).unwrap();
            let mut gd = gpu.zeros(rows * classes).unwrap();
            let loss = gpu
                .softmax_cross_entropy(&glogits, &glabels, rows, classes, &mut gd)
                .unwrap();
            let mut cd = vec![0.0; rows * classes];
            let closs = cpu
                .softmax_cross_entropy(&logits, &label_values, rows, classes, &mut cd)
                .unwrap();
            // Confident rows: a loss near zero, log(1 + tiny), absolute error of f32's exp.
            assert!((loss - closs).abs() <= 1e-6, "{loss} {closs}");
            let gd = download(&gpu, &gd, 0, rows * classes);
            let what = format!("{dtype} dlogits at scale {scale}");
            assert_of_type(&what, dtype, &gd);
            // The f32 values differ as in `cuda.rs` (1e-5 of the largest, 1 / rows before the
            // scale: a correct class's p - 1 cancels), each rounding adds half a gap.
            let f32_apart = 1e-5 * f64::from(scale) / rows as f64;
            for (i, (&g, &c)) in gd.iter().zip(&cd).enumerate() {
                let apart = (f64::from(g) - f64::from(c)).abs();
                let bound = gap(dtype, f64::from(g.abs().max(c.abs()))) + f32_apart;
                assert!(apart <= bound, "{what} [{i}]: {g} against {c}");
            }
            // The wrong classes' gradients (the right one's may be exactly 0 in f32 already).
            let wrong =
                (0..rows * classes).filter(|i| i % classes != label_values[i / classes] as usize);
            let zeros = wrong.filter(|&i| gd[i] == 0.0).count();
            if dtype == DType::F16 && scale == 1.0 {
                assert!(
                    zeros > 0,
                    "{what}: confident rows should underflow unscaled"
                );
            }
            if scale == 2f32.powi(24) {
                assert_eq!(zeros, 0, "{what}: the scale keeps every gradient");
            }
        }
    }
}

/// The gather fused into a 16-bit first layer's product (`gather_matmul_bias`, one
/// `gather_mma_matmul`) writes the batch and its labels as the 16-bit `gather` does (every
/// value, over poison), and its product bit for bit as that `gather` then `matmul_bias`: rows
/// and columns past one block's, k not a multiple of 16, with and without a ReLU.
#[test]
fn a_sixteen_bit_gather_matmul_is_the_gather_then_the_product() {
    let mut rng = rng(41);
    let (features, examples, rows, outs) = (50, 40, 37, 70);
    let (set, indices) = random_batch(&mut rng, (features, examples), rows);
    let (w, bias) = (
        random(&mut rng, features * outs, 0.1),
        random(&mut rng, outs, 1.0),
    );
    let spec = Gemm::nn(rows, outs, features);
    for dtype in NARROW {
        let Some(gpu) = gpu(dtype) else { return };
        let resident = gpu.upload_examples(&set).unwrap();
        let (w, bias) = (upload(&gpu, &w, 0), upload(&gpu, &bias, 0));
        for activation in [Activation::Relu, Activation::Identity] {
            let what = format!("{dtype} {activation:?}");
            let mut x = gpu.zeros(rows * features).unwrap();
            let mut labels = gpu.zero_labels(rows).unwrap();
            let mut separate = gpu.zeros(rows * outs).unwrap();
            gpu.gather(&resident, &indices, &mut x, &mut labels)
                .unwrap();
            gpu.matmul_bias(
                spec,
                (&x, 0),
                (&w, 0),
                (&bias, 0),
                (&mut separate, 0),
                activation,
            )
            .unwrap();
            let mut fused_x = upload(&gpu, &vec![f32::NAN; rows * features], 0);
            let mut fused_labels = gpu.zero_labels(rows).unwrap();
            gpu.upload_labels(&vec![u32::MAX; rows], &mut fused_labels, 0)
                .unwrap();
            let mut fused = upload(&gpu, &vec![f32::NAN; rows * outs], 0);
            gpu.gather_matmul_bias(
                (&resident, &indices),
                (&mut fused_x, &mut fused_labels),
                spec,
                (&w, 0),
                (&bias, 0),
                (&mut fused, 0),
                activation,
            )
            .unwrap();
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            let batch = |x: &_| bits(download(&gpu, x, 0, rows * features));
            assert_eq!(batch(&fused_x), batch(&x), "{what}: the batch");
            let (mut got, mut want) = (vec![0; rows], vec![0; rows]);
            gpu.download_labels(&fused_labels, 0, &mut got).unwrap();
            gpu.download_labels(&labels, 0, &mut want).unwrap();
            assert_eq!(got, want, "{what}: the labels");
            let product = |c: &_| bits(download(&gpu, c, 0, rows * outs));
            assert_eq!(product(&fused), product(&separate), "{what}: the product");
        }
    }
}

/// A 16-bit layer's weight and bias gradients are one tensor-core product, the biases' as the
/// product of a row of ones after x^T's last: its rows of weight gradients are the plain product
/// x^T delta bit for bit, its row of bias gradients the product of a real row of ones (the
/// same sums), and that row is the exact column sums of delta rounded to the type, but for the
/// tensor cores' truncated chunk sums: within (ceil(rows / 16) + 1) 2^-22 S of them (S the sum
/// of |delta| down the column, as in `tensor_core_products_are_exact_chunks_rounded_once`) and
/// one rounding. The shape spans several blocks of C each way, a batch that is no multiple of
/// 16 and an offset into a longer buffer whose other values stay untouched.
#[test]
fn sixteen_bit_bias_gradients_are_the_products_row_of_ones() {
    let mut rng = rng(43);
    let (ins, outs, rows, offset) = (37, 70, 45, 5);
    let mut x = random(&mut rng, rows * ins, 1.0);
    let mut delta = random(&mut rng, rows * outs, 1.0);
    for dtype in NARROW {
        let Some(gpu) = gpu(dtype) else { return };
        for v in [&mut x, &mut delta] {
            round_to(dtype, v);
        }
        let (gx, gdelta) = (upload(&gpu, &x, 0), upload(&gpu, &delta, 0));
        let len = (ins + 1) * outs;
        let mut grads = upload(&gpu, &vec![f32::NAN; offset + len + 3], 0);
        let shape = (ins, outs, rows);
        (gpu.weight_and_bias_gradients(shape, &gx, &gdelta, (&mut grads, offset), &Alone))
            .expect("the fused gradients");
        let fused = download(&gpu, &grads, 0, offset + len + 3);
        let mut weights = gpu.zeros(ins * outs).unwrap();
        (gpu.matmul(
            Gemm::tn(ins, outs, rows),
            (&gx, 0),
            (&gdelta, 0),
            (&mut weights, 0),
        ))
        .expect("the weights' product");
        let ones = upload(&gpu, &vec![1.0; rows], 0);
        let mut sums = gpu.zeros(outs).unwrap();
        (gpu.matmul(
            Gemm::nn(1, outs, rows),
            (&ones, 0),
            (&gdelta, 0),
            (&mut sums, 0),
        ))
        .expect("the product of a row of ones");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let what = format!("{dtype}");
        let (head, rest) = fused.split_at(offset);
        let (weight_rows, rest) = rest.split_at(ins * outs);
        let (bias_row, tail) = rest.split_at(outs);
        assert!(
            head.iter().chain(tail).all(|v| v.is_nan()),
            "{what}: outside"
        );
        assert_eq!(
            bits(weight_rows),
            bits(&download(&gpu, &weights, 0, ins * outs)),
            "{what}"
        );
        assert_eq!(
            bits(bias_row),
            bits(&download(&gpu, &sums, 0, outs)),
            "{what}"
        );
        assert_of_type(&what, dtype, bias_row);
        for (col, &got) in bias_row.iter().enumerate() {
            let column = (0..rows).map(|r| f64::from(delta[r * outs + col]));
            let (exact, size) = column.fold((0.0, 0.0), |(s, a), v| (s + v, a + v.abs()));
            let chunks = rows.div_ceil(16) as f64 + 1.0;
            let bound = chunks * 2f64.powi(-22) * size + gap(dtype, exact) / 2.0 + 2f64.powi(-25);
            let error = (f64::from(got) - exact).abs();
            assert!(
                error <= bound,
                "{what}: column {col}: {got} against {exact}, {error:e} > {bound:e}"
            );
        }
    }
}

/// The loss scale is read on the device when the kernel runs: a step captured as a graph at
/// one scale, replayed after the scale changed, scales by the new one.
#[test]
fn a_replayed_step_follows_the_loss_scale() {
    let Some(gpu) = gpu(DType::F16) else { return };
    let (rows, classes) = (4, 3);
    let logits = upload(
        &gpu,
        &[
            2.0, 0.0, -1.0, 0.5, 0.25, 0.0, -3.0, 4.0, 1.0, 0.0, 0.0, 8.0,
        ],
        0,
    );
    let mut labels = gpu.zero_labels(rows).unwrap();
    gpu.upload_labels(&[0, 1, 1, 2], &mut labels, 0).unwrap();
    let mut d = gpu.zeros(rows * classes).unwrap();
    let mut loss = gpu.zeros(1).unwrap();
    let mut seen = Vec::new();
    // Calls 0, 1 and 2: run, captured, replayed.
    for scale in [1.0, 4.0, 1024.0] {
        assert!(gpu.set_loss_scale(scale).unwrap());
        gpu.replay(7, &mut |b| {
            b.softmax_cross_entropy_into(&logits, &labels, (rows, classes), &mut d, (&mut loss, 0))
        })
        .unwrap();
        seen.push(download(&gpu, &d, 0, rows * classes));
    }
    for (scale, values) in [(4.0, &seen[1]), (1024.0, &seen[2])] {
        // Powers of two far from f16's limits scale exactly.
        let want: Vec<f32> = seen[0].iter().map(|v| v * scale).collect();
        let close = values
            .iter()
            .zip(&want)
            .all(|(&v, &w)| f64::from((v - w).abs()) <= gap(DType::F16, w.into()));
        assert!(close, "scale {scale}: {values:?} against {want:?}");
    }
    assert_ne!(seen[1], seen[2]);
}

/// A 16-bit product repeats itself bit for bit; an f32 backend does not scale the loss.
#[test]
fn a_sixteen_bit_product_repeats_bitwise() {
    let Some(gpu) = gpu(DType::BF16) else { return };
    let mut rng = rng(31);
    let (m, n, k) = (40, 70, 300);
    let a = upload(&gpu, &random(&mut rng, m * k, 1.0), 0);
    let b = upload(&gpu, &random(&mut rng, k * n, 1.0), 0);
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut c = gpu.zeros(m * n).unwrap();
        gpu.matmul(Gemm::nn(m, n, k), (&a, 0), (&b, 0), (&mut c, 0))
            .unwrap();
        runs.push(download(&gpu, &c, 0, m * n));
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&runs[0]), bits(&runs[1]));
    assert_eq!(gpu.dtype(), DType::BF16);
    let f32_gpu = CudaBackend::new(0).unwrap();
    assert!(!f32_gpu.set_loss_scale(2.0).unwrap(), "f32 does not scale");
}

/// `unscale` on the GPU is its CPU twin's, bit for bit: every value times the inverse of the
/// loss scale (an offset span of a longer buffer, the rest left alone), and the pass flagged
/// as overflowed exactly where one value of the span is infinite or NaN, wherever it lies (the
/// first value, one in the middle of a block's share, the last), never for one outside it.
#[test]
fn unscale_takes_the_scale_off_and_flags_what_is_not_finite_as_the_twin_does() {
    let Some(gpu) = gpu(DType::F16) else { return };
    let cpu = twin(DType::F16);
    let mut rng = rng(37);
    let (offset, len) = (7, 300_001);
    let scale = 2f32.powi(13);
    assert!(gpu.set_loss_scale(scale).unwrap() && cpu.set_loss_scale(scale).unwrap());
    // Values of the type, as a pass stores them (an upload rounds to it).
    let mut clean: Vec<f32> = random(&mut rng, offset + len + 5, 3.0e4);
    round_to(DType::F16, &mut clean);
    let cases = [
        (None, true),
        (Some((offset, f32::INFINITY)), false),
        (Some((offset + len / 2 + 3, f32::NAN)), false),
        (Some((offset + len - 1, f32::NEG_INFINITY)), false),
        (Some((offset + len, f32::NAN)), true), // outside the span
    ];
    for (poison, finite) in cases {
        let mut values = clean.clone();
        if let Some((at, value)) = poison {
            values[at] = value;
        }
        let mut on_gpu = upload(&gpu, &values, 0);
        gpu.unscale((&mut on_gpu, offset), len).unwrap();
        let mut on_cpu = values.clone();
        cpu.unscale((&mut on_cpu, offset), len).unwrap();
        let what = format!("{poison:?}");
        assert_eq!(gpu.unscaled_finite().unwrap(), finite, "{what}");
        assert_eq!(cpu.unscaled_finite().unwrap(), finite, "{what}");
        let got = download(&gpu, &on_gpu, 0, values.len());
        // A GPU may write its own NaN (the hardware's canonical one).
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        if let Some(i) = (0..got.len()).find(|&i| !same(got[i], on_cpu[i])) {
            panic!(
                "{what}: value {i} is {} against the twin's {}",
                got[i], on_cpu[i]
            );
        }
        assert_eq!(got[offset + 1], values[offset + 1] / scale, "{what}");
        assert_eq!(got[..offset], values[..offset], "{what}: before the span");
    }
    let mut short = gpu.zeros(10).unwrap();
    assert!(gpu.unscale((&mut short, 5), 6).is_err(), "past the buffer");
}
