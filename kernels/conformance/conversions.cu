// Conformance kernel: float <-> integer conversions with explicit rounding, and fminf/fmaxf.
//
// PTX defines these for every input: float-to-integer conversions saturate to the destination
// range and turn NaN into 0. For i < n, with x = x[i] (f32, including halves, out-of-range
// values, infinities and NaN), d = d[i] (f64), k = k[i] (i32), y = y[i] (f32):
//   ints[0 * n + i] = __float2int_rn(x)   (to nearest, ties to even)
//   ints[1 * n + i] = __float2int_rz(x)   (toward zero)
//   ints[2 * n + i] = __float2int_rd(x)   (down)
//   ints[3 * n + i] = __float2int_ru(x)   (up)
//   ints[4 * n + i] = __float2uint_rn(x)  (as a u32 pattern; negatives saturate to 0)
//   ints[5 * n + i] = __double2int_rn(d)
//   ints[6 * n + i] = __double2int_rz(d)
//   ints[7 * n + i] = low 32 bits of __float2ll_rd(x)
//   ints[8 * n + i] = high 32 bits of __float2ll_rd(x)
//   floats[0 * n + i] = (float)k            (round to nearest even: k may exceed 2^24)
//   floats[1 * n + i] = __int2float_rz(k)
//   floats[2 * n + i] = __int2float_ru(k)
//   floats[3 * n + i] = fminf(x, y)         (a NaN operand yields the other operand)
//   floats[4 * n + i] = fmaxf(x, y)
//   floats[5 * n + i] = rintf(x)            (round to nearest even, as a float)
//   floats[6 * n + i] = floorf(x)
//   floats[7 * n + i] = truncf(x)
// Launch: any 1-D grid and block (grid-stride).
extern "C" __global__ void conversions(const float* __restrict__ x, const double* __restrict__ d,
                                       const int* __restrict__ k, const float* __restrict__ y,
                                       unsigned* __restrict__ ints, float* __restrict__ floats,
                                       int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const float xv = x[i];
        ints[0 * n + i] = (unsigned)__float2int_rn(xv);
        ints[1 * n + i] = (unsigned)__float2int_rz(xv);
        ints[2 * n + i] = (unsigned)__float2int_rd(xv);
        ints[3 * n + i] = (unsigned)__float2int_ru(xv);
        ints[4 * n + i] = __float2uint_rn(xv);
        ints[5 * n + i] = (unsigned)__double2int_rn(d[i]);
        ints[6 * n + i] = (unsigned)__double2int_rz(d[i]);
        const long long wide = __float2ll_rd(xv);
        ints[7 * n + i] = (unsigned)(unsigned long long)wide;
        ints[8 * n + i] = (unsigned)((unsigned long long)wide >> 32);
        floats[0 * n + i] = (float)k[i];
        floats[1 * n + i] = __int2float_rz(k[i]);
        floats[2 * n + i] = __int2float_ru(k[i]);
        floats[3 * n + i] = fminf(xv, y[i]);
        floats[4 * n + i] = fmaxf(xv, y[i]);
        floats[5 * n + i] = rintf(xv);
        floats[6 * n + i] = floorf(xv);
        floats[7 * n + i] = truncf(xv);
    }
}
