//! Every CPU operation against a direct f64 computation.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem_core::{Alone, Helpers};
use tandem_tensor::cpu::{self, UpdateStep};
use tandem_tensor::{Activation, Backend, CpuBackend, ExampleSet, Gemm, ShapeError};

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
    assert_eq!(CpuBackend.dtype(), tandem_core::DType::F32);
}
