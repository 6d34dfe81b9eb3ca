// Conformance kernels: block-wide inclusive scan (Hillis-Steele, double-buffered in dynamic
// shared memory).
//
// Block b scans its own segment in[b * blockDim.x .. (b + 1) * blockDim.x) (the last one may be
// partial: elements past n count as 0 and are not written):
//     out[i] = in[seg] + in[seg + 1] + ... + in[i].
// log2(blockDim.x) passes; pass k adds the value 2^k places to the left, reading one half of
// the buffer and writing the other, with __syncthreads between passes.
// Launch: 1-D grid of ceil(n / blockDim.x) blocks, any blockDim.x up to 1024, and
// 2 * blockDim.x * sizeof(element) bytes of dynamic shared memory.

template <typename T>
__device__ __forceinline__ void block_scan(const T* __restrict__ in, T* __restrict__ out, int n) {
    extern __shared__ __align__(8) unsigned char scan_smem[];
    T* buf = reinterpret_cast<T*>(scan_smem);
    const int t = threadIdx.x;
    const int i = blockIdx.x * blockDim.x + t;
    int pout = 0;
    buf[t] = i < n ? in[i] : T(0);
    __syncthreads();
    for (int offset = 1; offset < blockDim.x; offset <<= 1) {
        pout = 1 - pout;
        const int pin = 1 - pout;
        T v = buf[pin * blockDim.x + t];
        if (t >= offset) {
            v += buf[pin * blockDim.x + t - offset];
        }
        buf[pout * blockDim.x + t] = v;
        __syncthreads();
    }
    if (i < n) {
        out[i] = buf[pout * blockDim.x + t];
    }
}

extern "C" __global__ void scan_inclusive_i32(const int* __restrict__ in, int* __restrict__ out,
                                              int n) {
    block_scan<int>(in, out, n);
}

extern "C" __global__ void scan_inclusive_f32(const float* __restrict__ in,
                                              float* __restrict__ out, int n) {
    block_scan<float>(in, out, n);
}
