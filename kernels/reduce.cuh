// The deterministic block reductions that reduce.cu and softmax_xent.cuh share: a fixed tree in
// shared memory, the same order on every run, no atomics.
#pragma once

#define REDUCE_THREADS 256

// This thread's index in its block, x fastest: a 1-D block's threadIdx.x, and a 2-D block's
// (matmul's 16 x 16) as well.
__device__ __forceinline__ unsigned thread_in_block() {
    return threadIdx.y * blockDim.x + threadIdx.x;
}

// The reduction over the block of one value per thread by `op`, by a fixed tree in shared
// memory; every thread gets the result. The block must have REDUCE_THREADS threads. Ends with a barrier
// after reading the result, so that a block may reduce again right away.
template <typename T, typename Op> __device__ T block_reduce(T v, Op op) {
    __shared__ T part[REDUCE_THREADS];
    const unsigned t = thread_in_block();
    part[t] = v;
    __syncthreads();
    for (unsigned s = REDUCE_THREADS / 2; s > 0; s /= 2) {
        if (t < s) {
            part[t] = op(part[t], part[t + s]);
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
    for (unsigned r = thread_in_block(); r < rows; r += REDUCE_THREADS) {
        if (labels[r] >= classes) {
            bad += 1;
            first = first < r ? first : r;
        }
    }
    bad = block_sum(bad);
    first = block_reduce(first, Min());
    if (thread_in_block() == 0) {
        status[0] = bad;
        status[1] = bad ? labels[first] : 0;
    }
}
