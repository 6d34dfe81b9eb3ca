// Deterministic reductions: every sum is taken in a fixed order that depends only on the
// launch shape, never on timing, and no kernel uses atomics.

#include "reduce.cuh"
#include "round.cuh"

// out[c] = sum over r of x[r][c] for a row-major rows x cols matrix (cpu::column_sum: bias
// gradients), rounded as `narrow` says (round.cuh). One thread per column adds the rows in
// increasing order, the CPU twin's order.
// Launch: grid ceil(cols / 256), block 256.
extern "C" __global__ void column_sum(const float *__restrict__ x, unsigned rows, unsigned cols,
                                      float *__restrict__ out, int narrow) {
    const unsigned c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) {
        return;
    }
    float s = 0.0f;
    for (unsigned r = 0; r < rows; ++r) {
        s += x[(size_t)r * cols + c]; // consecutive threads read consecutive columns
    }
    out[c] = round_stored(s, narrow);
}

// out[0] = how many of the rows of logits (rows x classes) have their argmax (the first one on
// ties, as cpu::argmax) at their label (cpu::count_correct), and out[1..3] = check_labels of
// the labels (check::labels): a bad label never counts as a hit, and the host reports it.
// Launch: grid 1, block REDUCE_THREADS.
extern "C" __global__ void count_correct(const float *__restrict__ logits,
                                         const unsigned *__restrict__ labels, unsigned rows,
                                         unsigned classes, unsigned *__restrict__ out) {
    unsigned hits = 0;
    for (unsigned r = threadIdx.x; r < rows; r += REDUCE_THREADS) {
        const float *z = logits + (size_t)r * classes;
        unsigned best = 0;
        for (unsigned c = 1; c < classes; ++c) {
            if (z[c] > z[best]) {
                best = c;
            }
        }
        hits += best == labels[r];
    }
    hits = block_sum(hits);
    if (threadIdx.x == 0) {
        out[0] = hits;
    }
    check_labels(labels, rows, classes, out + 1);
}
