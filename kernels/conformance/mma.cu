// nvcc-arch: compute_90
// Conformance kernel: the tensor-core product mma.sync.aligned.m16n8k16.row.col.f32.T.T.f32
// (T = bf16 or f16), one 16x8 tile D = A . B + C per warp, each lane loading its fragments
// as the PTX ISA lays them out for this shape (groupID g = lane / 4, t = lane % 4):
//   A (16x16, row-major 16-bit bits): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..2t+1],
//                                     a2 = A[g][2t+8..2t+9], a3 = A[g+8][2t+8..2t+9]
//                                     (the lower column in the low half of each register)
//   B (16x8, row-major, k by n):      b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   C, D (16x8 f32):                  c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t],
//                                     c3 = C[g+8][2t+1]
// For tile i < tiles: A + 256 i, B + 128 i, C + 128 i, D + 128 i. Launch: one warp (32
// threads) per block, a block per tile.

__device__ unsigned pair(const unsigned short* m, int lo, int hi) {
    return (unsigned)m[lo] | ((unsigned)m[hi] << 16);
}

template <bool BF16>
__device__ void tile(const unsigned short* A, const unsigned short* B, const float* C, float* D) {
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    const unsigned a0 = pair(A, g * 16 + 2 * t, g * 16 + 2 * t + 1);
    const unsigned a1 = pair(A, (g + 8) * 16 + 2 * t, (g + 8) * 16 + 2 * t + 1);
    const unsigned a2 = pair(A, g * 16 + 2 * t + 8, g * 16 + 2 * t + 9);
    const unsigned a3 = pair(A, (g + 8) * 16 + 2 * t + 8, (g + 8) * 16 + 2 * t + 9);
    const unsigned b0 = pair(B, (2 * t) * 8 + g, (2 * t + 1) * 8 + g);
    const unsigned b1 = pair(B, (2 * t + 8) * 8 + g, (2 * t + 9) * 8 + g);
    const float c0 = C[g * 8 + 2 * t], c1 = C[g * 8 + 2 * t + 1];
    const float c2 = C[(g + 8) * 8 + 2 * t], c3 = C[(g + 8) * 8 + 2 * t + 1];
    float d0, d1, d2, d3;
    if (BF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
            : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(c2),
              "f"(c3));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
            : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(c2),
              "f"(c3));
    }
    D[g * 8 + 2 * t] = d0;
    D[g * 8 + 2 * t + 1] = d1;
    D[(g + 8) * 8 + 2 * t] = d2;
    D[(g + 8) * 8 + 2 * t + 1] = d3;
}

extern "C" __global__ void mma_bf16(const unsigned short* __restrict__ A,
                                    const unsigned short* __restrict__ B,
                                    const float* __restrict__ C, float* __restrict__ D, int tiles) {
    const int i = blockIdx.x;
    if (i < tiles) tile<true>(A + 256 * i, B + 128 * i, C + 128 * i, D + 128 * i);
}

extern "C" __global__ void mma_f16(const unsigned short* __restrict__ A,
                                   const unsigned short* __restrict__ B,
                                   const float* __restrict__ C, float* __restrict__ D, int tiles) {
    const int i = blockIdx.x;
    if (i < tiles) tile<false>(A + 256 * i, B + 128 * i, C + 128 * i, D + 128 * i);
}
