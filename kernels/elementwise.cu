// Element-wise kernels over flat f32 spans.
//
// Launch (both): 1-D, 256 threads a block, any number of blocks: a grid-stride loop covers all
// len elements.

// x[r][c] += bias[c] over a row-major matrix of len = rows * cols values, then
// x[r][c] = max(0, x[r][c]) when relu != 0 (cpu::bias_add and cpu::bias_relu).
extern "C" __global__ void bias_add(float *__restrict__ x, const float *__restrict__ bias,
                                    size_t len, unsigned cols, int relu) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
         i += (size_t)gridDim.x * blockDim.x) {
        const float v = x[i] + bias[i % cols];
        x[i] = relu ? fmaxf(v, 0.0f) : v;
    }
}

// grad[i] = 0 where activation[i] <= 0: back through a ReLU, given its output
// (cpu::relu_backward). Like the twin, it keeps grad[i] only where activation[i] > 0, so a NaN
// activation also zeroes it.
extern "C" __global__ void relu_backward(float *__restrict__ grad,
                                         const float *__restrict__ activation, size_t len) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
         i += (size_t)gridDim.x * blockDim.x) {
        if (!(activation[i] > 0.0f)) {
            grad[i] = 0.0f;
        }
    }
}
