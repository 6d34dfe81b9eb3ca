// Deterministic reductions: every sum is taken in a fixed order that depends only on the
// launch shape, never on timing, and no kernel uses atomics.

#define REDUCE_THREADS 256

// The sum over the block of one value per thread, by a fixed tree in shared memory; every
// thread gets the total. blockDim.x must be REDUCE_THREADS.
template <typename T> __device__ T block_sum(T v) {
    __shared__ T part[REDUCE_THREADS];
    part[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = REDUCE_THREADS / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) {
            part[threadIdx.x] += part[threadIdx.x + s];
        }
        __syncthreads();
    }
    return part[0];
}

// out[c] = sum over r of x[r][c] for a row-major rows x cols matrix (cpu::column_sum: bias
// gradients). One thread per column adds the rows in increasing order, the CPU twin's order.
// Launch: grid ceil(cols / 256), block 256.
extern "C" __global__ void column_sum(const float *__restrict__ x, unsigned rows, unsigned cols,
                                      float *__restrict__ out) {
    const unsigned c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) {
        return;
    }
    float s = 0.0f;
    for (unsigned r = 0; r < rows; ++r) {
        s += x[(size_t)r * cols + c]; // consecutive threads read consecutive columns
    }
    out[c] = s;
}

// out[0] = (sum of x[0..len]) / len, accumulated in double like the CPU's mean loss.
// Launch: grid 1, block REDUCE_THREADS.
extern "C" __global__ void mean(const float *__restrict__ x, size_t len, float *__restrict__ out) {
    double s = 0.0;
    for (size_t i = threadIdx.x; i < len; i += REDUCE_THREADS) {
        s += x[i];
    }
    s = block_sum(s);
    if (threadIdx.x == 0) {
        out[0] = (float)(s / (double)len);
    }
}

// out[0] = how many of the rows of logits (rows x classes) have their argmax (the first one on
// ties, as cpu::argmax) at their label (cpu::count_correct).
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
}
