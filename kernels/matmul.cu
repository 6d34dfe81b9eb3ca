// C (m x n) = op(A) (m x k) . op(B) (k x n), all row-major, optionally followed by the hidden
// layer's epilogue C = max(0, C + bias). This is tandem_tensor::Gemm and cpu::matmul (+ bias_relu).
//
// op(A) is A stored m x k when a_t == 0, or A^T with A stored k x m when a_t != 0; likewise
// op(B) is B stored k x n, or B^T with B stored n x k when b_t != 0. bias (n values) may be
// null: then no epilogue.
//
// Launch: grid (ceil(n / 32), ceil(m / 32), splits), block (32, 8), no dynamic shared memory.
// Each block computes one 32 x 32 tile of C, each thread four of its elements (column tx,
// rows ty, ty + 8, ty + 16, ty + 24). Tiles of op(A) and op(B) are staged through shared memory
// 32 values of k at a time; values past the edges of the operands load as zeros, so m, n and k
// need not be multiples of 32.
//
// Split over k: block z sums only k in [z * k_split, (z + 1) * k_split) (k_split a multiple of
// 32) into its own m x n slice of c, c + z * m * n; with more than one split the caller passes
// no bias and adds the slices with sum_splits. The model's matrices are too small to fill a GPU
// with one block per tile (100 x 500 x 784: 64 blocks walking 25 tiles of k one after another),
// and a block's walk over k is bound by memory latency, not arithmetic.
//
// Every element of C is accumulated in increasing k within a split and the splits are added in
// increasing z: the same order on every run for a shape, so the result is bitwise reproducible.
#define TILE 32
#define ROWS 8 // threads along y; each thread owns TILE / ROWS rows of the tile

extern "C" __global__ void matmul(const float *__restrict__ a, const float *__restrict__ b,
                                  float *__restrict__ c, const float *__restrict__ bias,
                                  unsigned m, unsigned n, unsigned k, int a_t, int b_t,
                                  unsigned k_split) {
    // One column of padding: a transposed operand is written into its tile column-wise, and
    // without the padding the 32 threads of a warp would all hit the same bank.
    __shared__ float as[TILE][TILE + 1]; // as[r][kk] = op(A)[row0 + r][k0 + kk]
    __shared__ float bs[TILE][TILE + 1]; // bs[kk][cc] = op(B)[k0 + kk][col0 + cc]
    const unsigned tx = threadIdx.x, ty = threadIdx.y;
    const unsigned row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
    const unsigned k_begin = blockIdx.z * k_split;
    const unsigned k_end = k - k_begin <= k_split ? k : k_begin + k_split; // without overflow
    c += (size_t)blockIdx.z * m * n;
    float acc[TILE / ROWS] = {0.0f};

    for (unsigned k0 = k_begin; k0 < k_end; k0 += TILE) {
        // tx walks the dimension that is contiguous in memory, so that loads coalesce whether
        // or not the operand is transposed.
        for (unsigned i = ty; i < TILE; i += ROWS) {
            const unsigned r = a_t ? tx : i, ka = a_t ? i : tx;
            const unsigned ar = row0 + r, ak = k0 + ka;
            as[r][ka] = (ar < m && ak < k_end) ? (a_t ? a[(size_t)ak * m + ar] : a[(size_t)ar * k + ak])
                                           : 0.0f;
            const unsigned kb = b_t ? tx : i, cc = b_t ? i : tx;
            const unsigned bk = k0 + kb, bc = col0 + cc;
            bs[kb][cc] = (bk < k_end && bc < n) ? (b_t ? b[(size_t)bc * k + bk] : b[(size_t)bk * n + bc])
                                            : 0.0f;
        }
        __syncthreads();
        for (unsigned kk = 0; kk < TILE; ++kk) {
            const float bv = bs[kk][tx];
            for (unsigned j = 0; j < TILE / ROWS; ++j) {
                acc[j] += as[ty + j * ROWS][kk] * bv; // a warp shares ty: a broadcast read
            }
        }
        __syncthreads(); // before the next iteration overwrites the tiles
    }

    const unsigned col = col0 + tx;
    if (col >= n) {
        return;
    }
    for (unsigned j = 0; j < TILE / ROWS; ++j) {
        const unsigned row = row0 + ty + j * ROWS;
        if (row < m) {
            const float v = acc[j];
            c[(size_t)row * n + col] = bias ? fmaxf(v + bias[col], 0.0f) : v;
        }
    }
}

// c[i] = parts[0][i] + parts[1][i] + ... + parts[splits - 1][i] (in that order), the m x n slices
// of a matmul split over k (parts holds splits * len values, len = m * n), then the epilogue
// c[i] = max(0, c[i] + bias[i % n]) when bias is not null.
// Launch: 1-D, 256 threads a block, any number of blocks (grid-stride loop).
extern "C" __global__ void sum_splits(const float *__restrict__ parts, unsigned splits,
                                      size_t len, unsigned n, const float *__restrict__ bias,
                                      float *__restrict__ c) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = parts[i];
        for (unsigned z = 1; z < splits; ++z) {
            v += parts[z * len + i];
        }
        c[i] = bias ? fmaxf(v + bias[i % n], 0.0f) : v;
    }
}
