// Deterministic reductions: every sum is taken in a fixed order that depends only on the
// launch shape, never on timing, and no kernel here uses atomics.

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

// out[0] = the sum over i < len of x[i] * x[i], in double (DeviceOp::SumSquares: the L2 term of
// parameters on the device). The values before the first 16-byte boundary and after the last
// whole float4 go to thread 0 and the last thread; in between, thread t takes float4s t,
// t + REDUCE_THREADS, ..., each lane into an accumulator of its own; then a fixed tree adds
// the threads'. A float's square is exact in double, and the order depends only on len and
// x's alignment, so every run gives the same bits. One block: a few hundred thousand
// parameters, read once a log, with four loads of 16 bytes in flight a thread.
// Launch: grid 1, block REDUCE_THREADS.
extern "C" __global__ void sum_squares(const float *__restrict__ x, size_t len,
                                       double *__restrict__ out) {
    const size_t head = min(len, (size_t)((16 - (size_t)x % 16) % 16 / 4));
    const size_t quads = (len - head) / 4, tail = head + quads * 4;
    const float4 *body = reinterpret_cast<const float4 *>(x + head);
    double lanes[4] = {0.0, 0.0, 0.0, 0.0};
#pragma unroll 4
    for (size_t q = threadIdx.x; q < quads; q += REDUCE_THREADS) {
        const float4 v = body[q];
        lanes[0] = __dadd_rn(lanes[0], __dmul_rn(v.x, v.x));
        lanes[1] = __dadd_rn(lanes[1], __dmul_rn(v.y, v.y));
        lanes[2] = __dadd_rn(lanes[2], __dmul_rn(v.z, v.z));
        lanes[3] = __dadd_rn(lanes[3], __dmul_rn(v.w, v.w));
    }
    const size_t from = threadIdx.x == 0 ? 0 : threadIdx.x == REDUCE_THREADS - 1 ? tail : len;
    const size_t to = threadIdx.x == 0 ? head : len;
    for (size_t i = from; i < to; ++i) {
        lanes[0] = __dadd_rn(lanes[0], __dmul_rn(x[i], x[i]));
    }
    const double mine = __dadd_rn(__dadd_rn(lanes[0], lanes[1]), __dadd_rn(lanes[2], lanes[3]));
    const double sum = block_sum(mine);
    if (threadIdx.x == 0) {
        out[0] = sum;
    }
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
