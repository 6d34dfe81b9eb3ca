// Conformance kernel: 256-bin histogram of bytes (u8 loads, shared and global atomicAdd).
//
// bins[v] += the number of i < n with data[i] == v. Each block counts its grid-stride share in
// 256 u32 counters in shared memory (atomicAdd on shared), then adds its non-zero counters to
// the global bins (atomicAdd on global). The caller zeroes bins first.
// Launch: any 1-D grid and block.
extern "C" __global__ void histogram256(const unsigned char* __restrict__ data, int n,
                                        unsigned int* bins) {
    __shared__ unsigned int local[256];
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
        local[b] = 0;
    }
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        atomicAdd(&local[data[i]], 1u);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
        if (local[b] != 0) {
            atomicAdd(&bins[b], local[b]);
        }
    }
}
