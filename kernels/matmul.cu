// C (m x n) = op(A) (m x k) . op(B) (k x n), all row-major, optionally followed by a layer's
// epilogue C = C + bias, or max(0, C + bias), or by the gradient's C = relu_backward(C, mask).
// This is tandem_tensor::Gemm and cpu::matmul (+ bias_add or bias_relu, or + relu_backward).
//
// op(A) is A stored m x k when a_t == 0, or A^T with A stored k x m when a_t != 0; likewise
// op(B) is B stored k x n, or B^T with B stored n x k when b_t != 0. bias (n values) may be
// null: then no bias epilogue; with one, relu != 0 also takes max(0, .). mask (m x n values)
// may be null; where it is not, C is zeroed wherever mask is not positive (C =
// relu_backward(C, mask): the backward pass through the ReLU whose output mask is,
// cpu::relu_backward), after any bias.
//
// With ones != 0, op(A)'s last row (row m - 1) is not stored but all ones: A holds m - 1 rows
// of op(A) (its leading dimension follows), and C's last row is the column sums of op(B). A
// layer's weight gradient x^T . delta and its bias gradient colsum(delta) lie one after the
// other in the gradient vector: one product writes both (the sums in increasing k, as
// cpu::column_sum adds, within each split).
//
// Launch: grid (ceil(n / 32), ceil(m / 32), splits), block (16, 16), no dynamic shared memory.
// Each block computes one 32 x 32 tile of C, each thread a 2 x 2 block of it held in registers
// (rows 2 ty, 2 ty + 1, columns 2 tx, 2 tx + 1). Tiles of op(A) and op(B) are staged through
// shared memory 32 values of k at a time, both laid out k-major, so that for each k a thread
// reads its two values of A and its two of B as two 8-byte loads and makes 4 multiply-adds
// with them (0.5 shared loads per FMA; a thread per element of C would need 2 per FMA). Not
// 4 x 4 on 8 x 8 threads (0.125 per FMA): at these sizes a block's walk over k waits on memory,
// and 2 warps a block hid too little of it; on an H200 the 8 warps made the step's products
// 1.7-2.7 times faster and a sync step on one replica 1.85 times (2026-12-04, README).
// Values past the edges of the operands load as zeros, so m, n and k need not be multiples of
// 32.
//
// Split over k: block z sums only k in [z * k_split, (z + 1) * k_split) (k_split a multiple of
// 32) into its own m x n slice of c, c + z * m * n; with more than one split the caller passes
// no bias and no mask and adds the slices with sum_splits. The model's matrices are too small to fill a GPU
// with one block per tile (100 x 500 x 784: 64 blocks walking 25 tiles of k one after another),
// and a block's walk over k is bound by memory latency, not arithmetic.
//
// Every element of C is accumulated in increasing k within a split and the splits are added in
// increasing z: the same order on every run for a shape, so the result is bitwise reproducible.
//
// gather_matmul is matmul with op(A) gathered on the fly from a u8 data set (gather.cu's batch,
// bit for bit): A[r][f] = images[indices[r]][f] / 255, which the blocks of the first column of
// tiles also write to x (each the rows and k of its tiles), and labels[r] =
// example_labels[indices[r]]: a first layer's product and the gather that feeds it, one kernel.
#define TILE 32
#define SIDE 16                // threads along x and along y
#define MICRO (TILE / SIDE)    // each thread's rows and columns of the tile
#define THREADS (SIDE * SIDE)
// Rows of the staged tiles are padded to 36 values: 16-byte aligned for the vector loads, and
// a warp writing a k-contiguous operand's tile (32 values of k of each row) spreads over 8
// banks instead of hitting one.
#define STRIDE (TILE + 4)

// Where gather_matmul's op(A) comes from (gather.cu's arguments), and where it writes the
// batch: x null in the blocks that do not.
struct Gather {
    const unsigned char *images;
    const unsigned *indices;
    float *x;
    const float *scaled; // scaled[p] = p / 255.0f (shared memory), gather.cu's division
};

// s[kk][x] = the operand's element (x0 + x, k0 + kk) for the tile's 32 x and 32 kk, zero past
// x_len (except in row ones_at, all ones) or k_end. The operand holds element (x, k) at
// p[x * k_len + k] when k_contiguous, else at p[k * x_len + x]; consecutive threads read
// consecutive addresses either way. GATHERED: the operand is gathered's batch (k-contiguous),
// not p, and each element is also written to gathered.x unless that is null.
template <bool GATHERED>
__device__ static void stage(float (*__restrict__ s)[STRIDE], const float *__restrict__ p,
                             Gather gathered, unsigned x0, unsigned x_len, unsigned ones_at,
                             unsigned k0, unsigned k_end, unsigned k_len, bool k_contiguous,
                             unsigned tid) {
    for (unsigned i = tid; i < TILE * TILE; i += THREADS) {
        const unsigned inner = i % TILE, outer = i / TILE;
        const unsigned x = k_contiguous ? outer : inner, kk = k_contiguous ? inner : outer;
        const unsigned gx = x0 + x, gk = k0 + kk;
        float v = 0.0f;
        if (gk < k_end) {
            if (GATHERED && gx < x_len) {
                // gather.cu's value: the same correctly rounded division, from the table.
                const size_t example = gathered.indices[gx];
                v = gathered.scaled[gathered.images[example * k_len + gk]];
                if (gathered.x) {
                    gathered.x[(size_t)gx * k_len + gk] = v;
                }
            } else if (gx < x_len) {
                v = k_contiguous ? p[(size_t)gx * k_len + gk] : p[(size_t)gk * x_len + gx];
            } else if (gx == ones_at) {
                v = 1.0f;
            }
        }
        s[kk][x] = v;
    }
}

// The epilogue of a product's (or its splits' sum's) element i, column col.
__device__ static float epilogue(float v, const float *__restrict__ bias, int relu,
                                 const float *__restrict__ mask, size_t i, unsigned col) {
    if (bias) {
        v = v + bias[col];
        v = relu ? fmaxf(v, 0.0f) : v;
    }
    // Like relu_backward: kept only where the mask is positive, so a NaN there zeroes it too.
    return mask && !(mask[i] > 0.0f) ? 0.0f : v;
}

// matmul's body; GATHERED: op(A) is gathered's batch (a unused, a_t and ones 0). Not static:
// its tiles' names in the PTX would then carry a hash of this file's path, and the committed
// PTX must not depend on where it was built.
template <bool GATHERED>
__device__ __forceinline__ void product(const float *__restrict__ a, Gather gathered,
                               const float *__restrict__ b, float *__restrict__ c,
                               const float *__restrict__ bias, int relu,
                               const float *__restrict__ mask, unsigned m, unsigned n, unsigned k,
                               int a_t, int b_t, int ones, unsigned k_split) {
    __shared__ __align__(16) float as[TILE][STRIDE]; // as[kk][r] = op(A)[row0 + r][k0 + kk]
    __shared__ __align__(16) float bs[TILE][STRIDE]; // bs[kk][cc] = op(B)[k0 + kk][col0 + cc]
    const unsigned tx = threadIdx.x, ty = threadIdx.y, tid = ty * SIDE + tx;
    const unsigned row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
    const unsigned k_begin = blockIdx.z * k_split;
    const unsigned k_end = k - k_begin <= k_split ? k : k_begin + k_split; // without overflow
    c += (size_t)blockIdx.z * m * n;
    float acc[MICRO][MICRO] = {{0.0f}};
    const unsigned a_rows = ones ? m - 1 : m, ones_at = ones ? m - 1 : 0xffffffffu;

    for (unsigned k0 = k_begin; k0 < k_end; k0 += TILE) {
        // A (m x k): k-contiguous; B^T (stored n x k) is.
        stage<GATHERED>(as, a, gathered, row0, a_rows, ones_at, k0, k_end, k, !a_t, tid);
        stage<false>(bs, b, Gather{}, col0, n, 0xffffffffu, k0, k_end, k, b_t, tid);
        __syncthreads();
        for (unsigned kk = 0; kk < TILE; ++kk) {
            const float2 av = *reinterpret_cast<const float2 *>(&as[kk][MICRO * ty]);
            const float2 bv = *reinterpret_cast<const float2 *>(&bs[kk][MICRO * tx]);
            const float ar[MICRO] = {av.x, av.y};
            const float br[MICRO] = {bv.x, bv.y};
            for (unsigned i = 0; i < MICRO; ++i) {
                for (unsigned j = 0; j < MICRO; ++j) {
                    acc[i][j] += ar[i] * br[j];
                }
            }
        }
        __syncthreads(); // before the next iteration overwrites the tiles
    }

    for (unsigned i = 0; i < MICRO; ++i) {
        const unsigned row = row0 + MICRO * ty + i;
        for (unsigned j = 0; j < MICRO; ++j) {
            const unsigned col = col0 + MICRO * tx + j;
            if (row < m && col < n) {
                const size_t at = (size_t)row * n + col;
                c[at] = epilogue(acc[i][j], bias, relu, mask, at, col);
            }
        }
    }
}

extern "C" __global__ void matmul(const float *__restrict__ a, const float *__restrict__ b,
                                  float *__restrict__ c, const float *__restrict__ bias,
                                  int relu, const float *__restrict__ mask, unsigned m,
                                  unsigned n, unsigned k, int a_t, int b_t, int ones,
                                  unsigned k_split) {
    product<false>(a, Gather{}, b, c, bias, relu, mask, m, n, k, a_t, b_t, ones, k_split);
}

// Launch: as matmul's (m rows of the batch, k features).
extern "C" __global__ void gather_matmul(const unsigned char *__restrict__ images,
                                         const unsigned char *__restrict__ example_labels,
                                         const unsigned *__restrict__ indices,
                                         float *__restrict__ x, unsigned *__restrict__ labels,
                                         const float *__restrict__ b, float *__restrict__ c,
                                         const float *__restrict__ bias, int relu, unsigned m,
                                         unsigned n, unsigned k, int b_t, unsigned k_split) {
    if (blockIdx.x == 0 && blockIdx.z == 0) {
        for (unsigned r = threadIdx.y * SIDE + threadIdx.x; r < TILE; r += THREADS) {
            const unsigned row = blockIdx.y * TILE + r;
            if (row < m) {
                labels[row] = example_labels[indices[row]];
            }
        }
    }
    // A pixel's value, p / 255 correctly rounded, is one of 256: each is divided once a block
    // instead of once an element loaded.
    __shared__ float scaled[256];
    for (unsigned p = threadIdx.y * SIDE + threadIdx.x; p < 256; p += THREADS) {
        scaled[p] = p / 255.0f;
    }
    __syncthreads();
    const Gather gathered = {images, indices, blockIdx.x == 0 ? x : nullptr, scaled};
    product<true>(nullptr, gathered, b, c, bias, relu, nullptr, m, n, k, 0, b_t, 0, k_split);
}

// c[i] = parts[0][i] + parts[1][i] + ... + parts[splits - 1][i] (in that order), the m x n slices
// of a matmul split over k (parts holds splits * len values, len = m * n), then matmul's
// epilogue: c[i] + bias[i % n] when bias is not null (max(0, .) with relu), then 0 where mask[i]
// is not positive when mask is not null.
// Launch: 1-D, 256 threads a block, any number of blocks (grid-stride loop).
extern "C" __global__ void sum_splits(const float *__restrict__ parts, unsigned splits,
                                      size_t len, unsigned n, const float *__restrict__ bias,
                                      int relu, const float *__restrict__ mask,
                                      float *__restrict__ c) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = parts[i];
        for (unsigned z = 1; z < splits; ++z) {
            v += parts[z * len + i];
        }
        c[i] = epilogue(v, bias, relu, mask, i, (unsigned)(i % n));
    }
}
