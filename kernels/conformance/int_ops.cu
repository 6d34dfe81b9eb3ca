// Conformance kernel: integer arithmetic and bit operations, each exact.
//
// For i < n, with a = a[i], b = b[i] (signed, b != 0, never INT_MIN / -1) and ua = ua[i],
// ub = ub[i] (unsigned, ub != 0), out[k * n + i] (as 32-bit patterns) is:
//   0: a / b  (C: truncates toward 0)     1: a % b  (sign of a)
//   2: ua / ub                            3: ua % ub
//   4: __popc(ua)                         5: __clz(ua)
//   6: __brev(ua)                         7: __ffs(a)  (1 + index of the lowest set bit, 0 if none)
//   8: __umulhi(ua, ub)                   9: min(a, b)
//  10: max(ua, ub)                       11: a >> (ub & 31)  (arithmetic)
//  12: ua >> (ub & 31)  (logical)        13: ua * ub  (low 32 bits)
//  14: (int)(((long long)a * 1000003) / b)        (64-bit signed division, truncated to 32 bits)
//  15: (unsigned)(((u64)ua << 20 | ub) % ub)   (64-bit unsigned remainder)
// and atomicMax(max_out, a), atomicMin(min_out, a), atomicOr(or_out, 1 << (ua & 31)),
// atomicXor(xor_out, ua) over every i. The caller initialises the four accumulators.
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
        out[4 * n + i] = (unsigned)__popc(ux);
        out[5 * n + i] = (unsigned)__clz(ux);
        out[6 * n + i] = __brev(ux);
        out[7 * n + i] = (unsigned)__ffs(x);
        out[8 * n + i] = __umulhi(ux, uy);
        out[9 * n + i] = (unsigned)min(x, y);
        out[10 * n + i] = max(ux, uy);
        out[11 * n + i] = (unsigned)(x >> (uy & 31));
        out[12 * n + i] = ux >> (uy & 31);
        out[13 * n + i] = ux * uy;
        out[14 * n + i] = (unsigned)(int)(((long long)x * 1000003LL) / (long long)y);
        out[15 * n + i] =
            (unsigned)((((unsigned long long)ux << 20) | (unsigned long long)uy) % (unsigned long long)uy);
        atomicMax(max_out, x);
        atomicMin(min_out, x);
        atomicOr(or_out, 1u << (ux & 31));
        atomicXor(xor_out, ux);
    }
}
