// Fused, numerically stable softmax + cross-entropy over rows x classes logits with its mean
// and label check (cpu::softmax_cross_entropy and check::labels), one kernel:
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
// fixed tree over the block. Every value is written once; no atomics.
//
// Launch: grid 1, block REDUCE_THREADS. One block: a training batch's rows are few (a hundred
// rows of ten classes is a thousand values), and a second kernel for the mean would cost more
// than the rows' arithmetic.

#include "reduce.cuh"
#include "round.cuh"

extern "C" __global__ void softmax_cross_entropy(const float *__restrict__ logits,
                                                 const unsigned *__restrict__ labels,
                                                 float *__restrict__ dlogits, unsigned rows,
                                                 unsigned classes, float *__restrict__ loss,
                                                 const unsigned *__restrict__ loss_at,
                                                 unsigned *__restrict__ status,
                                                 const float *__restrict__ loss_scale,
                                                 int narrow) {
    const float inv_rows = 1.0f / rows;
    const float s = loss_scale ? loss_scale[0] : 1.0f;
    double total = 0.0; // this thread's rows' losses, in row order
    for (unsigned r = threadIdx.x; r < rows; r += REDUCE_THREADS) {
        const float *z = logits + (size_t)r * classes;
        float *d = dlogits + (size_t)r * classes;
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
        const unsigned label = labels[r];
        const float scale = __fdiv_rn(inv_rows, sum);
        for (unsigned c = 0; c < classes; ++c) {
            const float p = __fmul_rn(d[c], scale);
            const float v = c == label ? __fsub_rn(p, inv_rows) : p;
            d[c] = round_stored(__fmul_rn(v, s), narrow);
        }
        total += label < classes ? (double)(logf(sum) - __fsub_rn(z[label], max)) : (double)NAN;
    }
    total = block_sum(total);
    if (threadIdx.x == 0) {
        loss[loss_at ? *loss_at : 0] = (float)(total / (double)rows);
    }
    check_labels(labels, rows, classes, status);
}
