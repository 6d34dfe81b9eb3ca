// nvcc-arch: compute_80
// The kernels of 16-bit training (`--precision bf16|f16`), the twins of
// tandem_tensor::NarrowCpuBackend. Values are held in f32 slots, each exactly a bf16 or f16
// value (`bf16 != 0` picks the type): every kernel that stores a result rounds it once,
// round to nearest even (cvt.rn), from an f32 computed on 16-bit operands; but unscale, whose
// gradients go on in f32. compute_80: the
// products use tensor cores (mma.sync with bf16/f16 operands, sm_80 and newer), and the
// conversions are single instructions there.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "round.cuh"

// Two values of the operands' type packed for mma.sync, lo in the low half (exact: each is
// already a value of the type).
__device__ unsigned pack(float lo, float hi, int bf16) {
    if (bf16) {
        const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const unsigned *>(&p);
    }
    const __half2 p = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned *>(&p);
}

// op(P)[r][c] of an operand op(P) that is rows x cols, P stored rows x cols or, transposed,
// cols x rows; zero past the edges.
__device__ float at(const float *p, unsigned rows, unsigned cols, int t, unsigned r, unsigned c) {
    if (r >= rows || c >= cols) {
        return 0.0f;
    }
    return t ? p[(size_t)c * rows + r] : p[(size_t)r * cols + c];
}

// Where gather_mma_matmul's op(A) comes from (gather.cu's arguments), and where it writes the
// batch: x null in the blocks that do not.
struct MmaGather {
    const unsigned char *images;
    const unsigned *indices;
    float *x;
};

// op(A)[r][c] of mma_matmul (GATHERED false: `at`), or of gather_mma_matmul: the batch's pixel
// as a 16-bit gather stores it (gather.cu's division, rounded), also written to x unless that
// is null; zero past the edges either way.
template <bool GATHERED>
__device__ float a_at(const float *a, MmaGather gathered, unsigned m, unsigned k, int a_t,
                      unsigned r, unsigned c, int bf16) {
    if (!GATHERED) {
        return at(a, m, k, a_t, r, c);
    }
    if (r >= m || c >= k) {
        return 0.0f;
    }
    const unsigned char pixel = gathered.images[(size_t)gathered.indices[r] * k + c];
    const float v = round_narrow(pixel / 255.0f, bf16);
    if (gathered.x) {
        gathered.x[(size_t)r * k + c] = v;
    }
    return v;
}

// The staged tiles of mma_product: MMA_KC values of k at a time, as pairs of consecutive k
// packed for mma.sync (`pack`), each row padded to MMA_STRIDE words so that a warp's fragment
// loads (8 rows x 4 words) fall in 32 different banks.
#define MMA_KC 32
#define MMA_STRIDE (MMA_KC / 2 + 4)

// s[x][p] = pack(value(x0 + x, k0 + 2p), value(x0 + x, k0 + 2p + 1)) for the tile's `rows` x and
// MMA_KC / 2 pairs p, by the block's threads together; `value` is zero past the operand's
// edges. Consecutive threads take consecutive k where the operand is k_contiguous in memory,
// else consecutive x: consecutive addresses either way.
template <typename Value>
__device__ __forceinline__ void stage_pairs(unsigned (*__restrict__ s)[MMA_STRIDE], unsigned rows,
                                            unsigned x0, unsigned k0, bool k_contiguous,
                                            Value value, int bf16) {
    const unsigned pairs = MMA_KC / 2;
    for (unsigned i = threadIdx.x; i < rows * pairs; i += blockDim.x) {
        const unsigned x = k_contiguous ? i / pairs : i % rows;
        const unsigned p = k_contiguous ? i % pairs : i / rows;
        const unsigned gk = k0 + 2 * p;
        s[x][p] = pack(value(x0 + x, gk), value(x0 + x, gk + 1), bf16);
    }
}

// C (m x n) = op(A) (m x k) . op(B) (k x n), the operands as in matmul.cu (a_t, b_t; ones != 0:
// op(A)'s last row is a row of ones after the m - 1 that a holds, so that C's last row is the
// column sums of op(B), a layer's bias gradients beside its weights'), then the optional
// epilogues C = C + bias (bias null: none; relu != 0: max(0, C + bias)) and C = 0 where
// mask (m x n) is not positive (mask null: none; matmul.cu's), in f32, then each value rounded
// to the type. Each warp computes one 16 x 8 tile of C with mma.sync.m16n8k16 (16-bit operands,
// f32 accumulation), 16 values of k at a time in increasing k: the same order every run, so
// the result is bitwise reproducible. The block's 16 rows of op(A) and 32 columns of op(B) are
// staged in shared memory MMA_KC values of k at a time, each value read from global memory
// and converted once a block (its four warps share the rows of A); each warp then loads its
// fragments from there in the ISA's layout (groupID g = lane / 4, t = lane % 4):
// a0 = A[g][2t..2t+1], a1 = A[g+8][2t..2t+1], a2 = A[g][2t+8..2t+9], a3 = A[g+8][2t+8..2t+9];
// b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]; accumulators c0 = C[g][2t], c1 = C[g][2t+1],
// c2 = C[g+8][2t], c3 = C[g+8][2t+1].
// Launch: grid (ceil(n / 32), ceil(m / 16)), block 128: warp w of block (x, y) computes rows
// 16 y .. 16 y + 15, columns 32 x + 8 w .. 32 x + 8 w + 7 (every lane takes part in the mma,
// even past the edges, where it reads zeros and stores nothing).
// The body of mma_matmul and gather_mma_matmul (GATHERED: op(A) is gathered's batch, a unused
// and a_t 0). Not static, as matmul.cu's `product`: the committed PTX must not depend on where
// it was built.
template <bool GATHERED>
__device__ __forceinline__ void mma_product(const float *__restrict__ a, MmaGather gathered,
                                            const float *__restrict__ b, float *__restrict__ c,
                                            const float *__restrict__ bias, int relu,
                                            const float *__restrict__ mask, unsigned m,
                                            unsigned n, unsigned k, int a_t, int b_t, int ones,
                                            int bf16) {
    __shared__ unsigned as[16][MMA_STRIDE]; // as[r][p]: op(A)[row0 + r][k0 + 2p ..= 2p + 1]
    __shared__ unsigned bs[32][MMA_STRIDE]; // bs[cc][p]: op(B)[k0 + 2p ..= 2p + 1][cols0 + cc]
    const unsigned lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, w = threadIdx.x / 32;
    const unsigned row0 = blockIdx.y * 16, cols0 = blockIdx.x * 32, col0 = cols0 + 8 * w;
    const unsigned r0 = row0 + g, r1 = row0 + g + 8;
    const unsigned a_rows = ones ? m - 1 : m; // the rows that a holds
    const auto a_of = [&](unsigned r, unsigned kk) {
        if (ones && r == a_rows) {
            return kk < k ? 1.0f : 0.0f;
        }
        return a_at<GATHERED>(a, gathered, a_rows, k, a_t, r, kk, bf16);
    };
    const auto b_of = [&](unsigned col, unsigned kk) { return at(b, k, n, b_t, kk, col); };
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (unsigned k0 = 0; k0 < k; k0 += MMA_KC) {
        // op(A) is k-contiguous unless stored transposed, op(B) only where it is.
        stage_pairs(as, 16, row0, k0, GATHERED || !a_t, a_of, bf16);
        stage_pairs(bs, 32, cols0, k0, b_t != 0, b_of, bf16);
        __syncthreads();
        // As many steps of 16 as k needs, no more: a step on zeros could turn a -0 into +0.
        for (unsigned kk = 0; kk < MMA_KC && k0 + kk < k; kk += 16) {
            const unsigned p = kk / 2 + t, cc = 8 * w + g;
            const unsigned a0 = as[g][p], a1 = as[g + 8][p], a2 = as[g][p + 4];
            const unsigned a3 = as[g + 8][p + 4], b0 = bs[cc][p], b1 = bs[cc][p + 4];
            if (bf16) {
                asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                             "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
            } else {
                asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                             "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
            }
        }
        __syncthreads(); // before the next stage overwrites the tiles
    }
    for (unsigned i = 0; i < 4; ++i) {
        const unsigned row = i < 2 ? r0 : r1, cc = col0 + 2 * t + i % 2;
        if (row < m && cc < n) {
            const size_t at = (size_t)row * n + cc;
            float v = bias ? d[i] + bias[cc] : d[i];
            v = bias && relu ? fmaxf(v, 0.0f) : v;
            v = mask && !(mask[at] > 0.0f) ? 0.0f : v; // a NaN in the mask zeroes it too
            c[at] = round_narrow(v, bf16);
        }
    }
}

extern "C" __global__ void mma_matmul(const float *__restrict__ a, const float *__restrict__ b,
                                      float *__restrict__ c, const float *__restrict__ bias,
                                      int relu, const float *__restrict__ mask, unsigned m,
                                      unsigned n, unsigned k, int a_t, int b_t, int ones,
                                      int bf16) {
    mma_product<false>(a, MmaGather{}, b, c, bias, relu, mask, m, n, k, a_t, b_t, ones, bf16);
}

// gather_mma_matmul is mma_matmul with op(A) gathered on the fly from a u8 data set (a 16-bit
// gather's batch, bit for bit), which each block of the first column writes to x as it stages
// it (its 16 rows, every k), and labels[r] = example_labels[indices[r]]: a 16-bit first
// layer's product and the gather that feeds it, one kernel (matmul.cu's gather_matmul for
// f32). No mask: a first layer's forward pass.
extern "C" __global__ void gather_mma_matmul(const unsigned char *__restrict__ images,
                                             const unsigned char *__restrict__ example_labels,
                                             const unsigned *__restrict__ indices,
                                             float *__restrict__ x, unsigned *__restrict__ labels,
                                             const float *__restrict__ b, float *__restrict__ c,
                                             const float *__restrict__ bias, int relu, unsigned m,
                                             unsigned n, unsigned k, int b_t, int bf16) {
    const bool writes = blockIdx.x == 0;
    if (writes && threadIdx.x < 16 && blockIdx.y * 16 + threadIdx.x < m) {
        const unsigned row = blockIdx.y * 16 + threadIdx.x;
        labels[row] = example_labels[indices[row]];
    }
    const MmaGather gathered = {images, indices, writes ? x : nullptr};
    mma_product<true>(nullptr, gathered, b, c, bias, relu, nullptr, m, n, k, 0, b_t, 0, bf16);
}

// x[i] = round(x[i]) for i < len: what follows the values a 16-bit backend takes from the
// host, and the f32 kernels that have no `narrow` parameter of their own (round.cuh).
// Launch: 1-D, 256 threads a block, any number of blocks (grid-stride).
extern "C" __global__ void round_to(float *__restrict__ x, size_t len, int bf16) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
         i += (size_t)gridDim.x * blockDim.x) {
        x[i] = round_narrow(x[i], bf16);
    }
}

#define UNSCALE_THREADS 256

// x[i] = x[i] * (1 / scale[0]) for i < len (exact: the scale is a power of two), and flags[b]
// = 1 where block b met a value that is not finite, 0 otherwise: a loss-scaled pass's
// gradients handed on in f32 without the scale, and what the host reads to throw the pass
// away. The twin of NarrowCpuBackend::unscale. No atomics: each block ORs its
// threads' findings in shared memory, in thread order.
// Launch: 1-D, UNSCALE_THREADS threads a block, one flag per block (grid-stride).
extern "C" __global__ void unscale(float *__restrict__ x, size_t len,
                                   const float *__restrict__ scale, float *__restrict__ flags) {
    __shared__ int bad[UNSCALE_THREADS];
    const float inverse = __fdiv_rn(1.0f, scale[0]);
    int mine = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
         i += (size_t)gridDim.x * blockDim.x) {
        const float v = x[i];
        mine |= !isfinite(v);
        x[i] = __fmul_rn(v, inverse);
    }
    bad[threadIdx.x] = mine;
    __syncthreads();
    if (threadIdx.x == 0) {
        int any = 0;
        for (unsigned t = 0; t < blockDim.x; ++t) {
            any |= bad[t];
        }
        flags[blockIdx.x] = any ? 1.0f : 0.0f;
    }
}
