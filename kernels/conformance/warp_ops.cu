// Conformance kernel: warp shuffles (xor / up / idx / down, full and half-warp masks) and votes.
//
// For i < n (n a multiple of 32, blockDim.x a multiple of 32, so every warp is full), with
// v = v[i], lane = i % 32, w = i / 32 (the warp's index in the grid):
//   out[0 * n + i] = sum of v over the warp              (butterfly: __shfl_xor_sync 16..1)
//   out[1 * n + i] = v[w*32] + ... + v[w*32 + lane]      (inclusive scan: __shfl_up_sync 1..16)
//   out[2 * n + i] = v[w*32 + (lane * 7 + 3) % 32]       (__shfl_sync from a computed lane)
//   out[3 * n + i] = v[w*32 + lane + 5] if lane + 5 < 32 else v  (__shfl_down_sync by 5)
//   out[4 * n + i] = lanes 0-15: the sum of v over lanes 0-15 (__shfl_xor_sync with mask
//                    0x0000ffff, only those lanes taking part); lanes 16-31: -1
//   votes[3 * w + 0] = __ballot_sync(all, v > 0)   (bit j: lane j's predicate)
//   votes[3 * w + 1] = __all_sync(all, v > -90)
//   votes[3 * w + 2] = __any_sync(all, v > 95)
// Launch: 1-D grid of n / blockDim.x blocks.
extern "C" __global__ void warp_ops(const int* __restrict__ v, int* __restrict__ out,
                                    unsigned* __restrict__ votes, int n) {
    const unsigned all = 0xffffffffu;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int lane = threadIdx.x & 31;
    const int x = v[i];

    int sum = x;
    for (int m = 16; m > 0; m >>= 1) {
        sum += __shfl_xor_sync(all, sum, m);
    }
    out[0 * n + i] = sum;

    int scan = x;
    for (int d = 1; d < 32; d <<= 1) {
        const int left = __shfl_up_sync(all, scan, d);
        if (lane >= d) {
            scan += left;
        }
    }
    out[1 * n + i] = scan;

    out[2 * n + i] = __shfl_sync(all, x, (lane * 7 + 3) % 32);
    out[3 * n + i] = __shfl_down_sync(all, x, 5);

    int half = -1;
    if (lane < 16) {
        half = x;
        for (int m = 8; m > 0; m >>= 1) {
            half += __shfl_xor_sync(0x0000ffffu, half, m);
        }
    }
    out[4 * n + i] = half;

    const unsigned ballot = __ballot_sync(all, x > 0);
    const int every = __all_sync(all, x > -90);
    const int some = __any_sync(all, x > 95);
    if (lane == 0) {
        const int w = i / 32;
        votes[3 * w + 0] = ballot;
        votes[3 * w + 1] = every ? 1u : 0u;
        votes[3 * w + 2] = some ? 1u : 0u;
    }
}
