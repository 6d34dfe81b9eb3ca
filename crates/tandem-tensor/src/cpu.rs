//! The CPU implementations of every [`Backend`](crate::Backend) operation, on plain slices.
//!
//! These functions check no shapes but with assertions (which panic: `matmul_rows` keeps its
//! in release builds, the others only in debug builds): [`CpuBackend`](crate::CpuBackend)
//! checks shapes before calling them, and returns an error instead. They are the reference
//! twins of the CUDA kernels.
//!
//! The passes beside the matrix products are compiled for the host's widest vectors as well as
//! for the baseline, and pick at run time (`multiversion`): the same arithmetic in the same
//! order, so the results are bitwise those of the baseline build.

use std::ops::Range;

use multiversion::multiversion;

use crate::{ExampleSet, Gemm};

/// `c = op(a) . op(b)`, where `op` transposes when the spec says so; all row-major.
///
/// Single-threaded: each data-parallel worker owns one core, and at the model's batch sizes two
/// one-thread replicas beat one two-thread replica.
pub fn matmul(spec: Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
    matmul_rows(spec, a, b, 0..spec.m, c);
}

/// Rows `rows` of [`matmul`]'s `c` into `c_rows` (`rows.len() x n`): a product cut into row
/// blocks that different threads may compute. A block's values are those of the same block
/// computed anywhere else, but `gemm` may round them differently from the whole product (its
/// blocking depends on the shape).
pub fn matmul_rows(spec: Gemm, a: &[f32], b: &[f32], rows: Range<usize>, c_rows: &mut [f32]) {
    let Gemm {
        m,
        n,
        k,
        a_transposed,
        b_transposed,
    } = spec;
    assert!(
        rows.start <= rows.end && rows.end <= m,
        "rows {rows:?} of {m}"
    );
    assert!(a.len() >= m * k && b.len() >= k * n && c_rows.len() >= rows.len() * n);
    // Strides (column stride, row stride) of op(a) as an m x k matrix and op(b) as k x n, and
    // where op(a)'s first row of the block starts.
    let (a_cs, a_rs, a_first) = if a_transposed {
        (m as isize, 1, rows.start)
    } else {
        (1, k as isize, rows.start * k)
    };
    let (b_cs, b_rs) = if b_transposed {
        (k as isize, 1)
    } else {
        (1, n as isize)
    };
    // SAFETY: op(a)'s rows `rows` (from `a_first` on, with the strides above) lie inside the
    // m*k values of `a`, `b` covers k*n and `c_rows` the block's rows*n (all checked above);
    // `c_rows` does not alias `a` or `b` since it is borrowed mutably.
    unsafe {
        gemm::gemm(
            rows.len(),
            n,
            k,
            c_rows.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr().add(a_first),
            a_cs,
            a_rs,
            b.as_ptr(),
            b_cs,
            b_rs,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// `x[r][c] += bias[c]` over a row-major `rows x bias.len()` matrix.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
pub fn bias_add(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// `x[r][c] = max(0, x[r][c] + bias[c])`: the hidden layer's epilogue.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
pub fn bias_relu(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v = (*v + b).max(0.0);
        }
    }
}

/// `grad[i] = 0` where `activation[i] <= 0`: back through a ReLU, given its output.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
pub fn relu_backward(grad: &mut [f32], activation: &[f32]) {
    // A select, not a branch: half the activations are zero in no predictable pattern, and a
    // mispredicted branch per element costs more than the whole pass should.
    for (g, &a) in grad.iter_mut().zip(activation) {
        *g = if a > 0.0 { *g } else { 0.0 };
    }
}

/// Softmax and cross-entropy in one numerically stable pass over each row of `logits`
/// (`rows x classes`).
///
/// Returns the mean loss over the rows and writes `dlogits = (softmax(logits) - onehot(label))
/// / rows`, the gradient of that mean. The maximum of each row is subtracted before
/// exponentiating, so large logits neither overflow nor lose the loss.
pub fn softmax_cross_entropy(
    logits: &[f32],
    labels: &[u32],
    classes: usize,
    dlogits: &mut [f32],
) -> f32 {
    let rows = labels.len();
    let inv_rows = 1.0 / rows as f32;
    let mut loss = 0.0f64;
    for ((row, d), &label) in logits
        .chunks_exact(classes)
        .zip(dlogits.chunks_exact_mut(classes))
        .zip(labels)
    {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for (e, &z) in d.iter_mut().zip(row) {
            *e = (z - max).exp();
            sum += *e;
        }
        let label = label as usize;
        loss += f64::from(sum.ln() - (row[label] - max));
        let scale = inv_rows / sum;
        for e in d.iter_mut() {
            *e *= scale;
        }
        d[label] -= inv_rows;
    }
    (loss / rows as f64) as f32
}

/// `out[c] = sum over r of x[r][c]` for a row-major `rows x out.len()` matrix (bias gradients).
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
pub fn column_sum(x: &[f32], out: &mut [f32]) {
    out.fill(0.0);
    for row in x.chunks_exact(out.len()) {
        for (o, v) in out.iter_mut().zip(row) {
            *o += v;
        }
    }
}

/// The index of the largest value (the first one on ties).
pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// How many rows of `logits` (`rows x classes`) have their argmax at the row's label.
pub fn count_correct(logits: &[f32], labels: &[u32], classes: usize) -> usize {
    logits
        .chunks_exact(classes)
        .zip(labels)
        .filter(|(row, &label)| argmax(row) == label as usize)
        .count()
}

/// Copies the examples named by `indices` into `x` (one row of features each, scaled to
/// `[0, 1]`: `byte / 255`) and their labels into `labels`.
pub fn gather(examples: &ExampleSet, indices: &[u32], x: &mut [f32], labels: &mut [u32]) {
    let features = examples.features();
    for (r, ((&i, row), label)) in indices
        .iter()
        .zip(x.chunks_exact_mut(features))
        .zip(labels)
        .enumerate()
    {
        // The rows lie anywhere in the data set: ask for one a few rows ahead while this one is
        // scaled, so that its cache misses overlap with the work instead of stalling it.
        if let Some(&ahead) = indices.get(r + PREFETCH_AHEAD) {
            prefetch(examples.features_of(ahead as usize));
        }
        let i = i as usize;
        scale_bytes(examples.features_of(i), row);
        *label = u32::from(examples.label(i));
    }
}

/// How many rows ahead [`gather`] prefetches (measured: 2 to 4 rows of MNIST hide the misses).
const PREFETCH_AHEAD: usize = 3;

/// `dst[i] = src[i] / 255`: a division, so that the values are exactly the reference's.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
fn scale_bytes(src: &[u8], dst: &mut [f32]) {
    for (v, &p) in dst.iter_mut().zip(src) {
        *v = f32::from(p) / 255.0;
    }
}

/// Asks the cache for every line of `bytes` (a hint: no fault, no visible effect).
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch never faults and changes no memory; the pointer is in bounds.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// The hyper-parameters of one optimiser step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UpdateStep {
    /// Learning rate of this step.
    pub learning_rate: f32,
    /// L2 coefficient: the step descends `grad + weight_decay * param` (0 for biases).
    pub weight_decay: f32,
    /// Moving-average decay of this step.
    pub ema_decay: f32,
}

/// One fused pass of SGD with L2 decay and the moving average, over one span of parameters:
///
/// ```text
/// g     = (grads[0][i] + grads[1][i] + ...) * (1 / grads.len())    summed in this order
/// p[i] -= learning_rate * (g + weight_decay * p[i])
/// e[i]  = ema_decay * e[i] + (1 - ema_decay) * p[i]
/// ```
///
/// Averaging in a fixed order keeps a data-parallel run bitwise reproducible; doing it all in
/// one pass reads each parameter once per step instead of four times.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
pub fn sgd_ema_update(params: &mut [f32], ema: &mut [f32], grads: &[&[f32]], step: UpdateStep) {
    let UpdateStep {
        learning_rate: lr,
        weight_decay: wd,
        ema_decay: d,
    } = step;
    let inv_n = 1.0 / grads.len() as f32;
    let descend = |p: &mut [f32], e: &mut [f32], g: &[f32]| {
        for ((p, e), g) in p.iter_mut().zip(e.iter_mut()).zip(g) {
            *p -= lr * (g * inv_n + wd * *p);
            *e = d * *e + (1.0 - d) * *p;
        }
    };
    match grads {
        [] => {}
        // One replica's gradients (every async update, sync on one worker): read in place.
        [only] => descend(params, ema, &only[..params.len()]),
        // Sum the gradients block by block into a small stack buffer: plain vectorisable
        // loops, always in the order given, the first two added as they are read.
        [first, second, rest @ ..] => {
            const BLOCK: usize = 256;
            let mut sum = [0.0f32; BLOCK];
            for (start, (p, e)) in (0..)
                .step_by(BLOCK)
                .zip(params.chunks_mut(BLOCK).zip(ema.chunks_mut(BLOCK)))
            {
                let span = start..start + p.len();
                let g = &mut sum[..p.len()];
                for ((acc, a), b) in g
                    .iter_mut()
                    .zip(&first[span.clone()])
                    .zip(&second[span.clone()])
                {
                    *acc = a + b;
                }
                for other in rest {
                    for (acc, x) in g.iter_mut().zip(&other[span.clone()]) {
                        *acc += x;
                    }
                }
                descend(p, e, g);
            }
        }
    }
}

/// `sum of v^2`, accumulated in f64 (for the L2 term of the reported loss).
pub fn sum_squares(v: &[f32]) -> f64 {
    v.iter().map(|&x| f64::from(x) * f64::from(x)).sum()
}
