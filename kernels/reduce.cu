// Deterministic reductions: every sum is taken in a fixed order that depends only on the
// launch shape, never on timing, and no kernel uses atomics.

#define REDUCE_THREADS 256

// The reduction over the block of one value per thread by `op`, by a fixed tree in shared
// memory; every thread gets the result. blockDim.x must be REDUCE_THREADS. Ends with a barrier
// after reading the result, so that a block may reduce again right away.
template <typename T, typename Op> __device__ T block_reduce(T v, Op op) {
    __shared__ T part[REDUCE_THREADS];
    part[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = REDUCE_THREADS / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) {
            part[threadIdx.x] = op(part[threadIdx.x], part[threadIdx.x + s]);
        }
        __syncthreads();
    }
    const T total = part[0];
    __syncthreads();
    return total;
}

struct Add {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};

struct Min {
    template <typename T> __device__ T operator()(T a, T b) const { return b < a ? b : a; }
};

template <typename T> __device__ T block_sum(T v) { return block_reduce(v, Add()); }

// The label check of check::labels, by one block of REDUCE_THREADS threads:
//   status[0] = how many of labels[0..rows] are >= classes
//   status[1] = the first of them (lowest row), 0 when there is none
// so that the host reports the first bad label as the CPU does.
__device__ void check_labels(const unsigned *__restrict__ labels, unsigned rows,
                             unsigned classes, unsigned *__restrict__ status) {
    unsigned bad = 0, first = 0xffffffffu; // the first bad row this thread saw
    for (unsigned r = threadIdx.x; r < rows; r += REDUCE_THREADS) {
        if (labels[r] >= classes) {
            bad += 1;
            first = first < r ? first : r;
        }
    }
    bad = block_sum(bad);
    first = block_reduce(first, Min());
    if (threadIdx.x == 0) {
        status[0] = bad;
        status[1] = bad ? labels[first] : 0;
    }
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

// The end of softmax_cross_entropy (cpu::softmax_cross_entropy's mean and its label check):
//   loss[0]   = (sum of losses[0..rows]) / rows, accumulated in double like the CPU's mean
//   status[0..2] = check_labels of labels[0..rows] (a bad label's loss is NaN, and so the mean)
// Launch: grid 1, block REDUCE_THREADS.
extern "C" __global__ void mean_loss(const float *__restrict__ losses,
                                     const unsigned *__restrict__ labels, unsigned rows,
                                     unsigned classes, float *__restrict__ loss,
                                     unsigned *__restrict__ status) {
    double s = 0.0;
    for (unsigned i = threadIdx.x; i < rows; i += REDUCE_THREADS) {
        s += losses[i];
    }
    s = block_sum(s);
    if (threadIdx.x == 0) {
        loss[0] = (float)(s / (double)rows);
    }
    check_labels(labels, rows, classes, status);
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
