// Conformance kernel: bit-manipulation intrinsics, each exact.
//
// For i < n, with a = a[i] (signed) and ua = ua[i], ub = ub[i] (unsigned), out[k * n + i]:
//   0: __popc(ua)     1: __clz(ua)     2: __brev(ua)
//   3: __ffs(a)  (1 + index of the lowest set bit, 0 if none; nvcc: brev + bfind.shiftamt)
//   4: __umulhi(ua, ub)
// Launch: any 1-D grid and block (grid-stride).
extern "C" __global__ void bit_ops(const int* __restrict__ a, const unsigned* __restrict__ ua,
                                   const unsigned* __restrict__ ub, unsigned* __restrict__ out,
                                   int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const unsigned ux = ua[i];
        out[0 * n + i] = (unsigned)__popc(ux);
        out[1 * n + i] = (unsigned)__clz(ux);
        out[2 * n + i] = __brev(ux);
        out[3 * n + i] = (unsigned)__ffs(a[i]);
        out[4 * n + i] = __umulhi(ux, ub[i]);
    }
}
