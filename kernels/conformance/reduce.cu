// Conformance kernels: warp-shuffle sum reductions.
//
// Each thread sums its grid-stride share of x, each warp sums its 32 values with
// __shfl_down_sync, warp 0 sums the per-warp results (staged in shared memory) the same way;
// then lane 0 of warp 0 writes the block's sum to block_sums[blockIdx.x] AND adds it to *total
// with atomicAdd (so *total, zeroed by the caller, ends as the sum of all of x; for f32 in
// whatever order the blocks finish).
// Launch: 1-D grid, blockDim.x a multiple of 32 up to 1024.

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, offset);
    }
    return v;
}

template <typename T>
__device__ __forceinline__ void block_reduce(const T* __restrict__ x, int n, T* block_sums,
                                             T* total) {
    __shared__ T warp_sums[32];
    T v = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        v += x[i];
    }
    v = warp_sum(v);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) {
        warp_sums[warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        const int warps = blockDim.x >> 5;
        v = lane < warps ? warp_sums[lane] : T(0);
        v = warp_sum(v);
        if (lane == 0) {
            block_sums[blockIdx.x] = v;
            atomicAdd(total, v);
        }
    }
}

// f32: block sums and the atomically accumulated total.
extern "C" __global__ void reduce_sum_f32(const float* __restrict__ x, int n, float* block_sums,
                                          float* total) {
    block_reduce<float>(x, n, block_sums, total);
}

// i32: the same in integers, so every result is exact whatever the order.
extern "C" __global__ void reduce_sum_i32(const int* __restrict__ x, int n, int* block_sums,
                                          int* total) {
    block_reduce<int>(x, n, block_sums, total);
}
