//! Every CPU operation against a direct f64 computation.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem_core::DType;
use tandem_core::{Alone, Helpers};
use tandem_tensor::cpu::{self, UpdateStep};
use tandem_tensor::{
    Activation, Backend, CpuBackend, ExampleSet, Gemm, NarrowCpuBackend, ResidentExamples,
    ShapeError,
};

fn random(len: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(-1.0..1.0)).collect()
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * (1.0 + a.abs().max(b.abs()))
}

#[test]
fn matmul_matches_f64_for_every_transpose_and_odd_shapes() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for (m, n, k) in [
        (1, 1, 1),
        (7, 5, 3),
        (100, 500, 784),
        (33, 10, 500),
        (500, 10, 100),
    ] {
        for a_transposed in [false, true] {
            for b_transposed in [false, true] {
                let spec = Gemm::new(m, n, k, a_transposed, b_transposed);
                let a = random(m * k, &mut rng);
                let b = random(k * n, &mut rng);
                let mut c = vec![f32::NAN; m * n];
                cpu::matmul(spec, &a, &b, &mut c);
                for i in 0..m {
                    for j in 0..n {
                        let products: Vec<f64> = (0..k)
                            .map(|p| {
                                let av = if a_transposed {
                                    a[p * m + i]
                                } else {
                                    a[i * k + p]
                                };
                                let bv = if b_transposed {
                                    b[j * k + p]
                                } else {
                                    b[p * n + j]
                                };
                                f64::from(av) * f64::from(bv)
                            })
                            .collect();
                        let expected: f64 = products.iter().sum();
                        // f32 accumulation error grows with the magnitude of the terms, not of
                        // their (possibly cancelling) sum.
                        let magnitude: f64 = products.iter().map(|v| v.abs()).sum();
                        let got = f64::from(c[i * n + j]);
                        assert!(
                            (got - expected).abs() <= 1e-6 * magnitude,
                            "{spec:?} ({i},{j}): {got} vs {expected}"
                        );
                    }
                }
            }
        }
    }
}

/// Loss and d-logits straight from the definition, in f64.
fn reference_softmax_ce(logits: &[f32], labels: &[u32], classes: usize) -> (f64, Vec<f64>) {
    let rows = labels.len();
    let mut loss = 0.0;
    let mut grad = Vec::new();
    for (row, &label) in logits.chunks(classes).zip(labels) {
        let max = row
            .iter()
            .map(|&v| f64::from(v))
            .fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
        loss += -((f64::from(row[label as usize]) - max).exp() / sum).ln();
        for (c, &v) in row.iter().enumerate() {
            let p = (f64::from(v) - max).exp() / sum;
            grad.push((p - if c == label as usize { 1.0 } else { 0.0 }) / rows as f64);
        }
    }
    (loss / rows as f64, grad)
}

#[test]
fn softmax_cross_entropy_matches_the_definition_including_large_logits() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for scale in [1.0f32, 30.0, 1000.0, 1e30] {
        let (rows, classes) = (17, 10);
        let logits: Vec<f32> = random(rows * classes, &mut rng)
            .iter()
            .map(|v| v * scale)
            .collect();
        let labels: Vec<u32> = (0..rows)
            .map(|_| rng.random_range(0..classes as u32))
            .collect();
        let mut dlogits = vec![f32::NAN; rows * classes];
        let loss = cpu::softmax_cross_entropy(&logits, &labels, classes, &mut dlogits);
        let (expected, grad) = reference_softmax_ce(&logits, &labels, classes);
        assert!(
            loss.is_finite() && dlogits.iter().all(|g| g.is_finite()),
            "scale {scale}"
        );
        assert!(
            close(f64::from(loss), expected, 1e-5),
            "scale {scale}: {loss} vs {expected}"
        );
        for (g, e) in dlogits.iter().zip(&grad) {
            assert!(
                (f64::from(*g) - e).abs() < 1e-6,
                "scale {scale}: {g} vs {e}"
            );
        }
    }
}

#[test]
fn elementwise_and_reduction_ops_match_direct_loops() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let (rows, cols) = (9, 13);
    let x = random(rows * cols, &mut rng);
    let bias = random(cols, &mut rng);

    let mut added = x.clone();
    cpu::bias_add(&mut added, &bias);
    let mut relu = x.clone();
    cpu::bias_relu(&mut relu, &bias);
    for (i, (&a, &r)) in added.iter().zip(&relu).enumerate() {
        assert_eq!(a, x[i] + bias[i % cols]);
        assert_eq!(r, (x[i] + bias[i % cols]).max(0.0));
    }

    let mut grad = random(rows * cols, &mut rng);
    let before = grad.clone();
    cpu::relu_backward(&mut grad, &relu);
    for i in 0..grad.len() {
        assert_eq!(grad[i], if relu[i] > 0.0 { before[i] } else { 0.0 });
    }

    let mut sums = vec![f32::NAN; cols];
    cpu::column_sum(&x, &mut sums);
    for c in 0..cols {
        let expected: f64 = (0..rows).map(|r| f64::from(x[r * cols + c])).sum();
        assert!(close(f64::from(sums[c]), expected, 1e-6));
    }

    let labels: Vec<u32> = (0..rows as u32).map(|r| r % cols as u32).collect();
    let expected = (0..rows)
        .filter(|&r| {
            let row = &x[r * cols..(r + 1) * cols];
            let best = (0..cols).fold(0, |b, c| if row[c] > row[b] { c } else { b });
            best == labels[r] as usize
        })
        .count();
    assert_eq!(cpu::count_correct(&x, &labels, cols), expected);
    assert_eq!(cpu::argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
}

/// Within 1e-5 of the formula in f64, and bitwise the formula in f32 taken in the documented
/// order (the sum left to right, its mean, the descent, then the moving average), which keeps
/// runs reproducible from one version of the vectorised pass to the next.
#[test]
fn fused_update_is_the_formula_in_order_and_matches_it_in_f64() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    // Not a multiple of the pass's block or of any vector width, so its tails run too.
    let len = 1000;
    // `random`'s values are multiples of 2^-23 whose sums are exact in any order: products of
    // two have full mantissas and spread exponents, so a reordered sum rounds otherwise.
    let grads: Vec<Vec<f32>> = (0..4)
        .map(|_| {
            let (a, b) = (random(len, &mut rng), random(len, &mut rng));
            a.iter().zip(&b).map(|(a, b)| a * b * 10.0).collect()
        })
        .collect();
    let params = random(len, &mut rng);
    let ema = random(len, &mut rng);
    // A learning rate that is no power of two, so that a reordered descent rounds otherwise.
    let (lr, wd, d) = (0.3f32, 1e-2f32, 0.9f32);
    let step = UpdateStep {
        learning_rate: lr,
        weight_decay: wd,
        ema_decay: d,
    };
    for workers in 1..=4 {
        let (mut p, mut e) = (params.clone(), ema.clone());
        let views: Vec<&[f32]> = grads[..workers].iter().map(Vec::as_slice).collect();
        cpu::sgd_ema_update(&mut p, &mut e, &views, step);
        for i in 0..len {
            let sum = grads[1..workers]
                .iter()
                .fold(grads[0][i], |acc, g| acc + g[i]);
            let p32 = params[i] - lr * (sum * (1.0 / workers as f32) + wd * params[i]);
            let e32 = d * ema[i] + (1.0 - d) * p32;
            assert_eq!(
                (p[i].to_bits(), e[i].to_bits()),
                (p32.to_bits(), e32.to_bits()),
                "{workers} workers, parameter {i}"
            );
            let g: f64 = grads[..workers]
                .iter()
                .map(|g| f64::from(g[i]))
                .sum::<f64>()
                / workers as f64;
            let (lr, wd, d) = (f64::from(lr), f64::from(wd), f64::from(d));
            let p64 = f64::from(params[i]) - lr * (g + wd * f64::from(params[i]));
            let e64 = d * f64::from(ema[i]) + (1.0 - d) * p64;
            assert!(
                close(f64::from(p[i]), p64, 1e-5) && close(f64::from(e[i]), e64, 1e-5),
                "{workers} {i}"
            );
        }
    }
}

#[test]
fn gather_scales_bytes_and_copies_labels() {
    let examples = ExampleSet::new(3, vec![0, 255, 51, 10, 20, 30], vec![4, 7]).unwrap();
    let mut x = vec![f32::NAN; 6];
    let mut labels = vec![u32::MAX; 2];
    CpuBackend
        .gather(&examples, &[1, 0], &mut x, &mut labels)
        .unwrap();
    assert_eq!(labels, vec![7, 4]);
    assert_eq!(
        x,
        vec![10.0 / 255.0, 20.0 / 255.0, 30.0 / 255.0, 0.0, 1.0, 0.2]
    );
}

/// Rows as long as MNIST's, more of them than the gather prefetches ahead, every byte value
/// in every position modulo 256: the vectorised body and its remainder against `f64`.
#[test]
fn gather_scales_every_byte_of_long_rows_exactly() {
    let (features, rows) = (784, 9);
    let values: Vec<u8> = (0..features * rows).map(|i| (i * 7 % 256) as u8).collect();
    let labels: Vec<u8> = (0..rows as u8).collect();
    let examples = ExampleSet::new(features, values.clone(), labels).unwrap();
    let indices: Vec<u32> = (0..rows as u32).rev().collect();
    let mut x = vec![f32::NAN; features * rows];
    let mut got = vec![u32::MAX; rows];
    CpuBackend
        .gather(&examples, &indices, &mut x, &mut got)
        .unwrap();
    for (r, &i) in indices.iter().enumerate() {
        assert_eq!(got[r], i);
        for c in 0..features {
            let byte = values[i as usize * features + c];
            assert_eq!(
                x[r * features + c],
                (f64::from(byte) / 255.0) as f32,
                "{r} {c}"
            );
        }
    }
}

/// Helpers on other threads that take every task they can, last first, so that the blocks of
/// a shared product are computed out of order and mostly elsewhere.
struct Eager;

impl Helpers for Eager {
    fn share(&self, count: usize, task: &(dyn Fn(usize) + Sync)) {
        std::thread::scope(|scope| {
            for i in (0..count).rev() {
                scope.spawn(move || task(i));
            }
        });
    }
}

/// Helpers that might have come but never do: every task on the calling thread, in order.
struct Unlucky;

impl Helpers for Unlucky {
    fn share(&self, count: usize, task: &(dyn Fn(usize) + Sync)) {
        (0..count).for_each(task);
    }
}

/// A shared product is the same whoever computes its blocks, bitwise, and the product, for
/// products cut into one block, several, and a last short one (bitwise at the MNIST model's
/// dW1); where nobody may help it is the whole product, bitwise; it checks its operands like
/// `matmul`.
#[test]
fn a_shared_product_is_the_product_whoever_computes_its_blocks() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let cpu = CpuBackend;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (m, n, k) in [(784, 500, 100), (1, 3, 2), (200, 7, 9), (401, 12, 33)] {
        for (a_transposed, b_transposed) in [(true, false), (false, false), (false, true)] {
            let spec = Gemm::new(m, n, k, a_transposed, b_transposed);
            let a = random(m * k + 3, &mut rng);
            let b = random(k * n + 2, &mut rng);
            let mut whole = vec![f32::NAN; m * n + 5];
            cpu.matmul(spec, (&a, 3), (&b, 2), (&mut whole, 5)).unwrap();
            let mut helped = vec![f32::NAN; m * n + 5];
            cpu.matmul_shared(spec, (&a, 3), (&b, 2), (&mut helped, 5), &Eager)
                .unwrap();
            let mut unhelped = vec![f32::NAN; m * n + 5];
            cpu.matmul_shared(spec, (&a, 3), (&b, 2), (&mut unhelped, 5), &Unlucky)
                .unwrap();
            let mut alone = vec![f32::NAN; m * n + 5];
            cpu.matmul_shared(spec, (&a, 3), (&b, 2), (&mut alone, 5), &Alone)
                .unwrap();
            let case = format!("{m}x{n}x{k} {a_transposed} {b_transposed}");
            assert_eq!(bits(&helped), bits(&unhelped), "{case}");
            assert_eq!(bits(&alone), bits(&whole), "{case}: alone");
            if (m, n, k, a_transposed, b_transposed) == (784, 500, 100, true, false) {
                assert_eq!(bits(&helped), bits(&whole), "{case}: the MNIST model's dW1");
            }
            assert_eq!(
                bits(&helped[..5]),
                bits(&[f32::NAN; 5]),
                "{case}: wrote before c"
            );
            for (h, w) in helped[5..].iter().zip(&whole[5..]) {
                assert!(
                    close(f64::from(*h), f64::from(*w), 1e-5),
                    "{case}: {h} vs {w}"
                );
            }
        }
    }
    let spec = Gemm::nn(4, 4, 4);
    let (ok, short) = (vec![0.0; 16], vec![0.0; 15]);
    let err = cpu
        .matmul_shared(spec, (&ok, 0), (&short, 0), (&mut vec![0.0; 16], 0), &Eager)
        .unwrap_err();
    assert_eq!(err.operand, "b");
}

#[test]
fn backend_rejects_short_operands_and_bad_labels_instead_of_panicking() {
    let cpu = CpuBackend;
    let spec = Gemm::nn(4, 4, 4);
    let small = vec![0.0; 15];
    let ok = vec![0.0; 16];
    let mut out = vec![0.0; 16];
    let err = cpu
        .matmul(spec, (&small, 0), (&ok, 0), (&mut out, 0))
        .unwrap_err();
    assert_eq!(
        err,
        ShapeError {
            op: "matmul",
            operand: "a",
            needed: 16,
            available: 15
        }
    );
    assert!(cpu.matmul(spec, (&ok, 1), (&ok, 0), (&mut out, 0)).is_err());
    let mut d = vec![0.0; 4];
    assert!(cpu
        .softmax_cross_entropy(&vec![0.0; 4], &vec![2], 1, 2, &mut d)
        .is_err());
    let examples = ExampleSet::new(1, vec![0], vec![0]).unwrap();
    assert!(cpu
        .gather(&examples, &[1], &mut vec![0.0], &mut vec![0])
        .is_err());
}

#[test]
fn zero_width_operands_are_errors_not_panics() {
    let cpu = CpuBackend;
    let (mut x, empty) = (vec![0.0; 4], Vec::new());
    assert!(cpu
        .bias_add(&mut x, (&empty, 0), 4, 0, Activation::Identity)
        .is_err());
    assert!(cpu
        .bias_add(&mut x, (&empty, 0), 4, 0, Activation::Relu)
        .is_err());
    assert!(cpu.column_sum(&x, 4, 0, (&mut vec![], 0)).is_err());
    assert!(cpu
        .softmax_cross_entropy(&x, &vec![0; 4], 4, 0, &mut vec![0.0; 4])
        .is_err());
    assert!(cpu.count_correct(&x, &vec![0; 4], 4, 0).is_err());
}

#[test]
fn the_cpu_backend_holds_values_in_the_type_it_names() {
    let buffer = CpuBackend.zeros(3).expect("zeros");
    assert_eq!(
        std::mem::size_of_val(buffer.as_slice()),
        CpuBackend.dtype().bytes(3)
    );
    assert_eq!(CpuBackend.dtype(), DType::F32);
}

/// What the host backends say of their memory: the f32 backend lends the caller's vectors
/// and swaps buffers (it does not scale the loss); the 16-bit one rounds, so it lends nothing.
#[test]
fn host_backends_lend_and_swap_only_what_holds_their_values_as_they_are() {
    let values = vec![1.0, 2.0, 3.0];
    let lent = CpuBackend.host_view(&values).expect("a host view");
    assert!(std::ptr::eq(lent, &values), "lent without a copy");
    let narrow = NarrowCpuBackend::new(DType::BF16).expect("bf16");
    assert!(narrow.host_view(&values).is_none(), "unrounded values lent");

    let (mut buffer, mut host) = (vec![1.0, 2.0], vec![3.0, 4.0]);
    assert!(CpuBackend.exchange(&mut buffer, &mut host));
    assert_eq!((&buffer[..], &host[..]), (&[3.0, 4.0][..], &[1.0, 2.0][..]));
    let mut longer = vec![5.0; 3];
    assert!(
        !CpuBackend.exchange(&mut buffer, &mut longer),
        "lengths differ"
    );
    assert_eq!((&buffer[..], &longer[..]), (&[3.0, 4.0][..], &[5.0; 3][..]));

    assert_eq!(
        CpuBackend.set_loss_scale(1024.0),
        Ok(false),
        "f32 does not scale"
    );
    let mut grads = vec![f32::INFINITY, 2.0];
    CpuBackend.unscale((&mut grads, 0), 2).expect("unscale");
    assert_eq!(grads, [f32::INFINITY, 2.0], "nothing to take off");
    assert_eq!(CpuBackend.unscaled_finite(), Ok(true));
}

/// Reading and writing through the backend's callbacks sees the whole buffer; a download
/// starts where it is told.
#[test]
fn the_cpu_backend_reads_and_writes_whole_buffers_and_downloads_from_an_offset() {
    let mut buffer = CpuBackend.zeros(4).expect("zeros");
    CpuBackend
        .write_with(&mut buffer, &mut |b| {
            b.iter_mut().zip(1..).for_each(|(v, i)| *v = i as f32)
        })
        .expect("write");
    let mut seen = Vec::new();
    CpuBackend
        .read_with(&buffer, &mut |b| seen = b.to_vec())
        .expect("read");
    assert_eq!(seen, [1.0, 2.0, 3.0, 4.0]);
    let mut two = [0.0; 2];
    CpuBackend.download(&buffer, 2, &mut two).expect("download");
    assert_eq!(two, [3.0, 4.0]);
    assert!(
        CpuBackend.download(&buffer, 3, &mut two).is_err(),
        "past the end"
    );
    assert_eq!(CpuBackend.zero_labels(3), Ok(vec![0, 0, 0]));
}

#[test]
fn an_example_set_tells_its_size_features_and_values() {
    let set = ExampleSet::new(2, vec![1, 2, 3, 4, 5, 6], vec![7, 8, 9]).expect("three examples");
    assert_eq!((set.len(), set.features(), set.is_empty()), (3, 2, false));
    assert_eq!(set.values(), [1, 2, 3, 4, 5, 6]);
    assert_eq!((set.features_of(1), set.label(2)), (&[3, 4][..], 9));
    let resident: &dyn ResidentExamples = &set;
    assert_eq!((resident.len(), resident.features()), (3, 2));
    assert!(!resident.is_empty());
    let empty = ExampleSet::new(2, vec![], vec![]).expect("no examples");
    assert!(empty.is_empty() && ResidentExamples::is_empty(&empty));
    assert!(ExampleSet::new(0, vec![], vec![]).is_none(), "no features");
    assert!(
        ExampleSet::new(2, vec![1, 2, 3], vec![1]).is_none(),
        "values of 1.5 examples"
    );
}

/// Operands from offsets, in buffers longer than the operation needs: it reads and writes only
/// its own values, and refuses operands that end too soon.
#[test]
fn copies_and_bias_adds_touch_only_their_span_from_their_offsets() {
    let src = vec![1.0, 2.0, 3.0, 4.0];
    let mut dst = vec![-1.0; 5];
    CpuBackend.copy((&src, 1), (&mut dst, 1), 3).expect("copy");
    assert_eq!(dst, [-1.0, 2.0, 3.0, 4.0, -1.0]);
    assert!(
        CpuBackend.copy((&src, 3), (&mut dst, 0), 2).is_err(),
        "src too short"
    );
    assert!(
        CpuBackend.copy((&src, 0), (&mut dst, 4), 2).is_err(),
        "dst too short"
    );

    // Two rows of three and a seventh value past them; the bias from offset 1.
    let mut x = vec![1.0, -2.0, 3.0, -4.0, 5.0, -6.0, 100.0];
    let bias = vec![9.0, 0.5, 1.0, 2.0];
    let mut relu = x.clone();
    CpuBackend
        .bias_add(&mut x, (&bias, 1), 2, 3, Activation::Identity)
        .expect("bias");
    assert_eq!(x, [1.5, -1.0, 5.0, -3.5, 6.0, -4.0, 100.0]);
    CpuBackend
        .bias_add(&mut relu, (&bias, 1), 2, 3, Activation::Relu)
        .expect("bias and ReLU");
    assert_eq!(relu, [1.5, 0.0, 5.0, 0.0, 6.0, 0.0, 100.0]);
    assert!(CpuBackend
        .bias_add(&mut x, (&bias, 2), 2, 3, Activation::Identity)
        .is_err());
}

/// The checks that only some operations make: a 16-bit backend's unscaling span, and a fused
/// gather and product whose shape must be the batch's.
#[test]
fn unscaling_and_gathered_products_refuse_shapes_that_do_not_fit() {
    let narrow = NarrowCpuBackend::new(DType::F16).expect("f16");
    let mut x = vec![1.0; 4];
    assert!(narrow.unscale((&mut x, 2), 3).is_err(), "past the end");
    assert!(narrow.unscale((&mut x, 1), 3).is_ok());

    let examples = ExampleSet::new(2, vec![0, 255, 255, 0], vec![0, 1]).expect("two examples");
    let (mut batch, mut labels) = (vec![0.0; 4], vec![0; 2]);
    let (weights, bias, mut out) = (vec![1.0; 6], vec![0.0; 3], vec![0.0; 6]);
    let indices = [1, 0];
    let mut product = |spec: Gemm| {
        CpuBackend.gather_matmul_bias(
            (&examples, &indices),
            (&mut batch, &mut labels),
            spec,
            (&weights, 0),
            (&bias, 0),
            (&mut out, 0),
            Activation::Identity,
        )
    };
    assert!(product(Gemm::new(1, 3, 2, false, false)).is_err(), "rows");
    assert!(
        product(Gemm::new(2, 3, 1, false, false)).is_err(),
        "features"
    );
    assert!(
        product(Gemm::new(2, 3, 2, true, false)).is_err(),
        "a transposed batch"
    );
    product(Gemm::new(2, 3, 2, false, false)).expect("the batch's shape");
    assert_eq!(out, [1.0; 6]);
    assert_eq!(labels, [1, 0]);
}
