// Fused, numerically stable softmax + cross-entropy over rows x classes logits with its mean
// and label check (cpu::softmax_cross_entropy and check::labels), shared by
// softmax_cross_entropy (softmax_xent.cu) and matmul_softmax_cross_entropy (matmul.cu):
//
//   max        = max over c of z[c]
//   sum        = sum over c of exp(z[c] - max)              (c in increasing order)
//   loss_r     = log(sum) - (z[label] - max)                (NaN when label >= classes)
//   dlogits[r] = exp(z - max) * (1 / rows / sum) - onehot(label) / rows
//   loss[at]   = (sum of loss_r) / rows, accumulated in double like the CPU's mean, where at is
//                *loss_at (loss_at null: 0); read on the device, so that a captured step
//                writes each run's loss to a slot the host gives with the run's inputs
//   status     = check_labels (reduce.cuh): how many labels are >= classes, and the first
//
// dlogits are stored multiplied by loss_scale[0] (read on the device, so that a captured step
// sees each launch's; null: 1) and rounded as `narrow` says (round.cuh): a 16-bit backend's,
// as the CPU twin rounds them (tandem_tensor::NarrowCpuBackend).
//
// Subtracting the row's maximum keeps exp from overflowing on large logits. One thread a row
// does the row's arithmetic in the CPU twin's order, with explicitly rounded products so that
// nvcc cannot fuse them into FMAs; only expf and logf differ from the host's. The mean is a
// fixed tree over a block: thread t adds the losses of rows t, t + REDUCE_THREADS, ... in that
// order, then block_sum adds the threads'. Every value is written once; no atomics.
#pragma once

#include "reduce.cuh"
#include "round.cuh"

// Row z's loss_r (in double, as the mean adds it) and its gradient into d (classes values).
__device__ __forceinline__ double softmax_cross_entropy_row(const float *__restrict__ z,
                                                           unsigned label,
                                                           float *__restrict__ d,
                                                           unsigned classes, float inv_rows,
                                                           float scale_by, int narrow) {
    float max = -INFINITY;
    for (unsigned c = 0; c < classes; ++c) {
        max = fmaxf(max, z[c]);
    }
    float sum = 0.0f;
    for (unsigned c = 0; c < classes; ++c) {
        const float e = expf(__fsub_rn(z[c], max));
        d[c] = e;
        sum = __fadd_rn(sum, e);
    }
    const float scale = __fdiv_rn(inv_rows, sum);
    for (unsigned c = 0; c < classes; ++c) {
        const float p = __fmul_rn(d[c], scale);
        const float v = c == label ? __fsub_rn(p, inv_rows) : p;
        d[c] = round_stored(__fmul_rn(v, scale_by), narrow);
    }
    return label < classes ? (double)(logf(sum) - __fsub_rn(z[label], max)) : (double)NAN;
}

// The mean loss and the label check, by a block of REDUCE_THREADS threads whose thread t holds
// in `total` the losses of rows t, t + REDUCE_THREADS, ... added in that order.
__device__ __forceinline__ void softmax_cross_entropy_mean(double total,
                                                           const unsigned *__restrict__ labels,
                                                           unsigned rows, unsigned classes,
                                                           float *__restrict__ loss,
                                                           const unsigned *__restrict__ loss_at,
                                                           unsigned *__restrict__ status) {
    total = block_sum(total);
    if (thread_in_block() == 0) {
        loss[loss_at ? *loss_at : 0] = (float)(total / (double)rows);
    }
    check_labels(labels, rows, classes, status);
}
