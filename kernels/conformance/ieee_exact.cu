// Conformance kernel: the IEEE-exact operations of f32 and f64.
//
// Operations IEEE 754 rounds exactly (round to nearest even), so any conforming implementation
// gives the same bits. For i < n, with out64 and out32 laid out as [k * n + i]:
//   out64[0] = fma(a, b, c)          (one rounding)
//   out64[1] = a / b
//   out64[2] = sqrt(|a|)
//   out64[3] = a * b + c             (two roundings: __dmul_rn / __dadd_rn forbid the fma)
//   out64[4] = (double)af            (f32 -> f64, exact)
//   out32[0] = fmaf(af, bf, cf)      (one rounding)
//   out32[1] = af / bf
//   out32[2] = sqrtf(|af|)
//   out32[3] = af * bf + cf          (two roundings: __fmul_rn / __fadd_rn)
//   out32[4] = (float)a              (f64 -> f32, round to nearest even)
//   out32[5] = af - bf
// Launch: any 1-D grid and block (grid-stride).
extern "C" __global__ void ieee_exact(const double* __restrict__ a, const double* __restrict__ b,
                                      const double* __restrict__ c, const float* __restrict__ af,
                                      const float* __restrict__ bf, const float* __restrict__ cf,
                                      double* __restrict__ out64, float* __restrict__ out32,
                                      int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        out64[0 * n + i] = fma(a[i], b[i], c[i]);
        out64[1 * n + i] = a[i] / b[i];
        out64[2 * n + i] = sqrt(fabs(a[i]));
        out64[3 * n + i] = __dadd_rn(__dmul_rn(a[i], b[i]), c[i]);
        out64[4 * n + i] = (double)af[i];
        out32[0 * n + i] = fmaf(af[i], bf[i], cf[i]);
        out32[1 * n + i] = af[i] / bf[i];
        out32[2 * n + i] = sqrtf(fabsf(af[i]));
        out32[3 * n + i] = __fadd_rn(__fmul_rn(af[i], bf[i]), cf[i]);
        out32[4 * n + i] = (float)a[i];
        out32[5 * n + i] = af[i] - bf[i];
    }
}
