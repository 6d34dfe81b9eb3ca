// Conformance kernel: grid-stride vector add in f32.
//
// c[i] = a[i] + b[i] for every i < n, whatever the grid: a grid smaller than n / blockDim.x
// makes each thread loop over several elements (stride blockDim.x * gridDim.x).
// Launch: any 1-D grid and block.
extern "C" __global__ void vector_add(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        c[i] = a[i] + b[i];
    }
}
