// Conformance kernels: library math with argument reduction. libdevice's sin/cos (f64) and
// sinf/cosf (f32) read constant tables (__cudart_i2opi_d, __cudart_i2opi_f,
// __cudart_sin_cos_coeffs) that the PTX declares as initialised module-scope .global arrays.

// y[i] = sqrt(x) * exp(x / 10) + log1p(x) + fma(a, x, b) + sin(x) * cos(x), x = x[i] >= 0,
// all in f64. Launch: any 1-D grid and block (grid-stride).
extern "C" __global__ void f64_math(const double* __restrict__ x, double* __restrict__ y, int n,
                                    double a, double b) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const double v = x[i];
        y[i] = sqrt(v) * exp(v / 10.0) + log1p(v) + fma(a, v, b) + sin(v) * cos(v);
    }
}

// out[i] = sinf(x[i]), out[n + i] = cosf(x[i]) (each within 2 ulp).
// Launch: any 1-D grid and block (grid-stride).
extern "C" __global__ void trig_f32(const float* __restrict__ x, float* __restrict__ out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        out[i] = sinf(x[i]);
        out[n + i] = cosf(x[i]);
    }
}
