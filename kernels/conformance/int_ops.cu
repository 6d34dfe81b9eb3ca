// Conformance kernel: integer arithmetic, each exact.
//
// For i < n, with a = a[i], b = b[i] (signed, b != 0, never INT_MIN / -1) and ua = ua[i],
// ub = ub[i] (unsigned, ub != 0), out[k * n + i] (as 32-bit patterns) is:
//   0: a / b  (C: truncates toward 0)     1: a % b  (sign of a)
//   2: ua / ub                            3: ua % ub
//   4: min(a, b)                          5: max(ua, ub)
//   6: a >> (ub & 31)  (arithmetic)       7: ua >> (ub & 31)  (logical)
//   8: ua * ub  (low 32 bits)
//   9: (int)(((long long)a * 1000003) / b)        (64-bit signed division, low 32 bits)
//  10: (unsigned)((((u64)ua << 20) | ub) % ub)    (64-bit unsigned remainder)
// and atomicMax(max_out, a), atomicMin(min_out, a), atomicOr(or_out, 1 << (ua & 31)),
// atomicXor(xor_out, ua) over every i. The caller initialises the four accumulators.
// (The bit intrinsics are in bit_ops.cu.)
// Launch: any 1-D grid and block (grid-stride).
extern "C" __global__ void int_ops(const int* __restrict__ a, const int* __restrict__ b,
                                   const unsigned* __restrict__ ua, const unsigned* __restrict__ ub,
                                   unsigned* __restrict__ out, int n, int* max_out, int* min_out,
                                   unsigned* or_out, unsigned* xor_out) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const int x = a[i];
        const int y = b[i];
        const unsigned ux = ua[i];
        const unsigned uy = ub[i];
        out[0 * n + i] = (unsigned)(x / y);
        out[1 * n + i] = (unsigned)(x % y);
        out[2 * n + i] = ux / uy;
        out[3 * n + i] = ux % uy;
        out[4 * n + i] = (unsigned)min(x, y);
        out[5 * n + i] = max(ux, uy);
        out[6 * n + i] = (unsigned)(x >> (uy & 31));
        out[7 * n + i] = ux >> (uy & 31);
        out[8 * n + i] = ux * uy;
        out[9 * n + i] = (unsigned)(int)(((long long)x * 1000003LL) / (long long)y);
        out[10 * n + i] =
            (unsigned)((((unsigned long long)ux << 20) | (unsigned long long)uy) % (unsigned long long)uy);
        atomicMax(max_out, x);
        atomicMin(min_out, x);
        atomicOr(or_out, 1u << (ux & 31));
        atomicXor(xor_out, ux);
    }
}
