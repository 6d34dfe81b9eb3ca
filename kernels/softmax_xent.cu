// Fused, numerically stable softmax + cross-entropy over rows x classes logits, one warp per
// row (cpu::softmax_cross_entropy, less the final mean and the label check, which reduce.cu's
// `mean_loss` does):
//
//   max        = max over c of z[c]
//   sum        = sum over c of exp(z[c] - max)
//   losses[r]  = log(sum) - (z[label] - max)            (NaN when label >= classes, which
//                                                         mean_loss reports as an error)
//   dlogits[r] = (exp(z - max) / sum - onehot(label)) / rows
//
// Subtracting the row's maximum keeps exp from overflowing on large logits. Every value of
// dlogits and losses is written exactly once, by the warp of its row; no atomics.
//
// Launch: grid ceil(rows / 4), block 128 (four warps, four rows a block).

#define WARP 32
#define FULL_MASK 0xffffffffu

// Butterfly reductions: afterwards every lane holds the result, in the same order each run.
__device__ float warp_max(float v) {
    for (int offset = WARP / 2; offset > 0; offset /= 2) {
        v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    }
    return v;
}

__device__ float warp_sum(float v) {
    for (int offset = WARP / 2; offset > 0; offset /= 2) {
        v += __shfl_xor_sync(FULL_MASK, v, offset);
    }
    return v;
}

extern "C" __global__ void softmax_cross_entropy(const float *__restrict__ logits,
                                                 const unsigned *__restrict__ labels,
                                                 float *__restrict__ dlogits,
                                                 float *__restrict__ losses, unsigned rows,
                                                 unsigned classes) {
    const unsigned row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    const unsigned lane = threadIdx.x % WARP;
    if (row >= rows) {
        return; // row is the same for the whole warp, so the shuffles below stay full-warp
    }
    const float *z = logits + (size_t)row * classes;
    float *d = dlogits + (size_t)row * classes;

    float max = -INFINITY;
    for (unsigned c = lane; c < classes; c += WARP) {
        max = fmaxf(max, z[c]);
    }
    max = warp_max(max);
    float sum = 0.0f;
    for (unsigned c = lane; c < classes; c += WARP) {
        sum += expf(z[c] - max);
    }
    sum = warp_sum(sum);

    const unsigned label = labels[row];
    const float inv_rows = 1.0f / rows;
    const float scale = inv_rows / sum;
    for (unsigned c = lane; c < classes; c += WARP) {
        d[c] = expf(z[c] - max) * scale - (c == label ? inv_rows : 0.0f);
    }
    if (lane == 0) {
        losses[row] = label < classes ? logf(sum) - (z[label] - max) : NAN;
    }
}
