// Conformance kernel: tiled shared-memory matrix transpose (f32).
//
// out (cols x rows, row-major) = transpose of in (rows x cols, row-major), for any rows and
// cols (not only multiples of 32). Each block moves one 32x32 tile through shared memory; the
// tile has 33 columns (+1 padding) so that reading it by column hits 32 different banks.
// Launch: block (32, 8), grid (ceil(cols / 32), ceil(rows / 32)); each thread moves 4 rows.
#define TILE 32
#define ROWS_PER_PASS 8

extern "C" __global__ void transpose(const float* __restrict__ in, float* __restrict__ out,
                                     int rows, int cols) {
    __shared__ float tile[TILE][TILE + 1];
    int x = blockIdx.x * TILE + threadIdx.x;  // column of `in`
    int y = blockIdx.y * TILE + threadIdx.y;  // row of `in`
    for (int j = 0; j < TILE; j += ROWS_PER_PASS) {
        if (x < cols && y + j < rows) {
            tile[threadIdx.y + j][threadIdx.x] = in[(size_t)(y + j) * cols + x];
        }
    }
    __syncthreads();
    x = blockIdx.y * TILE + threadIdx.x;  // column of `out` (a row of `in`)
    y = blockIdx.x * TILE + threadIdx.y;  // row of `out` (a column of `in`)
    for (int j = 0; j < TILE; j += ROWS_PER_PASS) {
        if (x < rows && y + j < cols) {
            out[(size_t)(y + j) * rows + x] = tile[threadIdx.x][threadIdx.y + j];
        }
    }
}
