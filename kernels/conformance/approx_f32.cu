// Conformance kernel: approximate single-precision functions.
//
// Approximate single-precision functions, each with an error bound the CUDA C++ Programming
// Guide documents (see check.py). For i < n, out[k * n + i]:
//   0: __fdividef(x, y)   1: __expf(x)   2: __logf(|y|)   3: expf(x)   4: logf(|y|)
//   5: __sinf(x)          6: rsqrtf(|y|)
// (sinf and cosf are in f64_math.cu: they need libdevice's constant tables.)
// Launch: any 1-D grid and block (grid-stride).
extern "C" __global__ void approx_f32(const float* __restrict__ x, const float* __restrict__ y,
                                      float* __restrict__ out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const float xv = x[i];
        const float yv = y[i];
        out[0 * n + i] = __fdividef(xv, yv);
        out[1 * n + i] = __expf(xv);
        out[2 * n + i] = __logf(fabsf(yv));
        out[3 * n + i] = expf(xv);
        out[4 * n + i] = logf(fabsf(yv));
        out[5 * n + i] = __sinf(xv);
        out[6 * n + i] = rsqrtf(fabsf(yv));
    }
}
