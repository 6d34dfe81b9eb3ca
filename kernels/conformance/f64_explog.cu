// Conformance kernel: f64 library math without argument-reduction tables (so that it runs
// where f64_math.cu's sin/cos cannot): libdevice's exp, log1p, log, pow, tanh, cbrt, sqrt
// and fma, inlined into the PTX as plain f64 arithmetic.
//
// y[i] = sqrt(x) * exp(x / 10) + log1p(x) + fma(a, x, b) + pow(x, 1.5) / 8 + tanh(x - 5)
//        + cbrt(x) + log(x + 2), x = x[i] >= 0.
// Launch: any 1-D grid and block (grid-stride).
extern "C" __global__ void f64_explog(const double* __restrict__ x, double* __restrict__ y, int n,
                                      double a, double b) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const double v = x[i];
        y[i] = sqrt(v) * exp(v / 10.0) + log1p(v) + fma(a, v, b) + pow(v, 1.5) / 8.0 +
               tanh(v - 5.0) + cbrt(v) + log(v + 2.0);
    }
}
