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
// Split over k (more than one split): block z sums only k in [z * k_split, (z + 1) * k_split)
// (k_split a multiple of 32) into its own m x n slice of parts, parts + z * m * n, and counts
// its arrival in arrivals[tile] (one counter a tile of C, row-major over the grid's x and y,
// zero before the launch). The tile's last block to arrive adds the tile's slices in
// increasing z, applies the epilogue to the sum, writes C and sets the counter back to zero
// for the next launch. The model's matrices are too small to fill a GPU with one block per
// tile (100 x 500 x 784: 64 blocks walking 25 tiles of k one after another), and a block's
// walk over k is bound by memory latency, not arithmetic; adding the slices in the last block
// instead of a kernel of their own saves a launch (a graph node, about 2 us on an H200).
// Unsplit (one split: parts and arrivals unused), the block writes C with the epilogue.
//
// Every element of C is accumulated in increasing k within a split and the splits are added in
// increasing z whichever block adds them: the same order on every run for a shape, so the
// result is bitwise reproducible. The counter is the only atomic, and it orders nothing but
// who adds.
//
// gather_matmul is matmul with op(A) gathered on the fly from a u8 data set (gather.cu's batch,
// bit for bit): A[r][f] = images[indices[r]][f] / 255, which the blocks of the first column of
// tiles also write to x (each the rows and k of its tiles), and labels[r] =
// example_labels[indices[r]]: a first layer's product and the gather that feeds it, one kernel.
#include "softmax_xent.cuh"

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

// Which tile of C a block computes: column x and row y of the grid of tiles (`across` tiles
// a row), split z of `splits`. matmul's block (x, y, z) of its grid; matmul_pair's, the tile its
// block index falls on.
struct Tile {
    unsigned x, y, z, across, splits;
};

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

// matmul's body; GATHERED: op(A) is gathered's batch (a unused, a_t and ones 0). Returns
// whether this block wrote the tile of C (unsplit, every block; split, the tile's last). Not static:
// its tiles' names in the PTX would then carry a hash of this file's path, and the committed
// PTX must not depend on where it was built.
template <bool GATHERED>
__device__ __forceinline__ bool product(const float *__restrict__ a, Gather gathered,
                               const float *__restrict__ b, float *__restrict__ c,
                               float *__restrict__ parts, unsigned *__restrict__ arrivals,
                               const float *__restrict__ bias, int relu,
                               const float *__restrict__ mask, unsigned m, unsigned n, unsigned k,
                               int a_t, int b_t, int ones, unsigned k_split, Tile tile) {
    __shared__ __align__(16) float as[TILE][STRIDE]; // as[kk][r] = op(A)[row0 + r][k0 + kk]
    __shared__ __align__(16) float bs[TILE][STRIDE]; // bs[kk][cc] = op(B)[k0 + kk][col0 + cc]
    const unsigned tx = threadIdx.x, ty = threadIdx.y, tid = ty * SIDE + tx;
    const unsigned row0 = tile.y * TILE, col0 = tile.x * TILE;
    const unsigned k_begin = tile.z * k_split;
    const unsigned k_end = k - k_begin <= k_split ? k : k_begin + k_split; // without overflow
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

    const size_t len = (size_t)m * n;
    const bool split = tile.splits > 1;
    float *const slice = split ? parts + tile.z * len : c;
    for (unsigned i = 0; i < MICRO; ++i) {
        const unsigned row = row0 + MICRO * ty + i;
        for (unsigned j = 0; j < MICRO; ++j) {
            const unsigned col = col0 + MICRO * tx + j;
            if (row < m && col < n) {
                const size_t at = (size_t)row * n + col;
                slice[at] = split ? acc[i][j] : epilogue(acc[i][j], bias, relu, mask, at, col);
            }
        }
    }
    if (!split) {
        return true;
    }
    // The slice is visible to the whole device before this block counts itself in.
    __threadfence();
    __syncthreads();
    // Thread 0 counts the block in; the barrier's OR tells every thread whether it was the
    // tile's last (a barrier reduction, not a flag in shared memory: no shared load a thread).
    unsigned *const counter = arrivals + tile.y * tile.across + tile.x;
    if (!__syncthreads_or(tid == 0 && atomicAdd(counter, 1u) == tile.splits - 1)) {
        return false;
    }
    // The last block: every slice of the tile is written. Loaded through L2 (`ld.cg`), where
    // the other blocks' stores are, never a stale L1 line.
    for (unsigned i = tid; i < TILE * TILE; i += THREADS) {
        const unsigned row = row0 + i / TILE, col = col0 + i % TILE;
        if (row < m && col < n) {
            const size_t at = (size_t)row * n + col;
            float v = __ldcg(parts + at);
            for (unsigned z = 1; z < tile.splits; ++z) {
                v += __ldcg(parts + z * len + at);
            }
            c[at] = epilogue(v, bias, relu, mask, at, col);
        }
    }
    if (tid == 0) {
        *counter = 0; // every block of the tile has arrived: none reads it again in this launch
    }
    return true;
}

extern "C" __global__ void matmul(const float *__restrict__ a, const float *__restrict__ b,
                                  float *__restrict__ c, float *__restrict__ parts,
                                  unsigned *__restrict__ arrivals,
                                  const float *__restrict__ bias, int relu,
                                  const float *__restrict__ mask, unsigned m, unsigned n,
                                  unsigned k, int a_t, int b_t, int ones, unsigned k_split) {
    const Tile tile = {blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.z};
    product<false>(a, Gather{}, b, c, parts, arrivals, bias, relu, mask, m, n, k, a_t, b_t, ones,
                   k_split, tile);
}

// A network's last layer and its classification head in one launch: the logits
// c = a . b + bias (matmul's product, a m x k, b k x n, split over k as matmul is) of at most
// TILE classes (n <= TILE: a tile of C holds whole rows), then softmax_cross_entropy of them
// against labels (softmax_xent.cuh), bit for bit what the two kernels compute one after the
// other. The block that writes a tile of logits computes its rows' gradients into dlogits and
// their losses into row_losses (m values, in double); the last tile to be done (an integer
// arrival counter at arrivals[tiles of C], zero before the launch and set back after it) adds
// the losses into the mean and checks the labels, in softmax_cross_entropy's order. f32 only:
// the gradient is neither scaled nor rounded.
// Launch: as matmul's, with one tile across (grid (1, ceil(m / 32), splits)); arrivals holds a
// counter for each tile and one more.
extern "C" __global__ void matmul_softmax_cross_entropy(
    const float *__restrict__ a, const float *__restrict__ b, float *__restrict__ c,
    float *__restrict__ parts, unsigned *__restrict__ arrivals, const float *__restrict__ bias,
    unsigned m, unsigned n, unsigned k, unsigned k_split, const unsigned *__restrict__ labels,
    float *__restrict__ dlogits, double *__restrict__ row_losses, float *__restrict__ loss,
    const unsigned *__restrict__ loss_at, unsigned *__restrict__ status) {
    const Tile tile = {blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.z};
    if (!product<false>(a, Gather{}, b, c, parts, arrivals, bias, 0, nullptr, m, n, k, 0, 0, 0,
                        k_split, tile)) {
        return;
    }
    __syncthreads(); // the tile's logits, which this block wrote, are visible to all its threads
    const unsigned tid = thread_in_block();
    const unsigned row = tile.y * TILE + tid;
    const float inv_rows = 1.0f / m;
    if (tid < TILE && row < m) {
        const size_t at = (size_t)row * n;
        row_losses[row] = softmax_cross_entropy_row(c + at, labels[row], dlogits + at, n,
                                                    inv_rows, 1.0f, NARROW_NONE);
    }
    // The tile's losses are visible to the whole device before it counts itself in.
    __threadfence();
    __syncthreads();
    unsigned *const tiles_done = arrivals + gridDim.y * gridDim.x;
    if (!__syncthreads_or(tid == 0 && atomicAdd(tiles_done, 1u) == gridDim.y - 1)) {
        return;
    }
    double total = 0.0; // as softmax_cross_entropy's threads add their rows
    for (unsigned r = tid; r < m; r += REDUCE_THREADS) {
        total += __ldcg(row_losses + r);
    }
    softmax_cross_entropy_mean(total, labels, m, n, loss, loss_at, status);
    if (tid == 0) {
        *tiles_done = 0;
    }
}

// One unsplit product's matmul arguments (k_split = k), each in 8 bytes: matmul_pair's.
struct ProductTable {
    const float *a;
    const float *b;
    float *c;
    const float *bias;
    const float *mask;
    unsigned long long relu;
    unsigned long long m;
    unsigned long long n;
    unsigned long long k;
    unsigned long long a_t;
    unsigned long long b_t;
    unsigned long long ones;
};

// Two unsplit products in one launch, each as matmul computes it alone (bit for bit): a
// layer's weight-and-bias gradients and its input's gradient, which both read the layer's
// delta and neither reads what the other writes. Blocks [0, tiles of the first) compute the
// first's tiles of C, row-major over its grid of tiles, the others the second's: one node of a
// graph instead of two, and the two products' blocks run side by side.
// Launch: grid (tiles of C of the first + of the second), block (16, 16).
extern "C" __global__ void matmul_pair(const ProductTable first, const ProductTable second) {
    const unsigned across_first = ((unsigned)first.n + TILE - 1) / TILE;
    const unsigned tiles_first = across_first * (((unsigned)first.m + TILE - 1) / TILE);
    const bool in_first = blockIdx.x < tiles_first;
    // One call of product, its arguments chosen: two calls would each hold its own tiles in
    // shared memory, twice the block's footprint.
    const ProductTable p = in_first ? first : second;
    const unsigned at = in_first ? blockIdx.x : blockIdx.x - tiles_first;
    const unsigned across = in_first ? across_first : ((unsigned)second.n + TILE - 1) / TILE;
    const Tile tile = {at % across, at / across, 0, across, 1};
    product<false>(p.a, Gather{}, p.b, p.c, nullptr, nullptr, p.bias, (int)p.relu, p.mask,
                   (unsigned)p.m, (unsigned)p.n, (unsigned)p.k, (int)p.a_t, (int)p.b_t,
                   (int)p.ones, (unsigned)p.k, tile);
}

// Launch: as matmul's (m rows of the batch, k features).
extern "C" __global__ void gather_matmul(const unsigned char *__restrict__ images,
                                         const unsigned char *__restrict__ example_labels,
                                         const unsigned *__restrict__ indices,
                                         float *__restrict__ x, unsigned *__restrict__ labels,
                                         const float *__restrict__ b, float *__restrict__ c,
                                         float *__restrict__ parts,
                                         unsigned *__restrict__ arrivals,
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
    const Tile tile = {blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.z};
    product<true>(nullptr, gathered, b, c, parts, arrivals, bias, relu, nullptr, m, n, k, 0, b_t,
                  0, k_split, tile);
}
