// Conformance kernels: calls to non-inlined device functions, a switch, an unrolled loop with
// a run-time trip count, a dynamically indexed local array, a struct passed by value, and the
// 3-D built-in indices.

// A parameter struct passed by value (a .b8 array parameter of 24 bytes, 8-aligned).
struct Affine {
    float scale;
    float shift;
    int count;   // trip count of the unrolled loop
    double bias;
};

// Steps of the Collatz map from v down to 1, at most `limit` (a data-dependent loop in a
// real .func, called with call.uni).
__device__ __noinline__ int collatz_steps(unsigned v, int limit) {
    int steps = 0;
    while (v > 1u && steps < limit) {
        v = (v & 1u) ? 3u * v + 1u : v >> 1;
        ++steps;
    }
    return steps;
}

// A dense switch on v % 8 (nvcc may turn it into a branch tree or a jump table).
__device__ __noinline__ int classify(int v) {
    int r;
    switch (((v % 8) + 8) % 8) {
        case 0: r = v * 3; break;
        case 1: r = v ^ 0x5a5a; break;
        case 2: r = v - 1000; break;
        case 3: r = v << 2; break;
        case 4: r = ~v; break;
        case 5: r = v / 3; break;
        case 6: r = v & 0xff; break;
        default: r = -v; break;
    }
    return r;
}

// For i < n, with v = v[i] (i32, >= 0) and f = f[i]:
//   ints[0 * n + i] = collatz_steps(v % 1000 + 1, 500)
//   ints[1 * n + i] = classify(v - 5000)
//   ints[2 * n + i] = sum over j < p.count of (v ^ j) * (j + 1)   (#pragma unroll 4, wrapping)
//   ints[3 * n + i] = t[v % 16] where t[j] = v * j + (j ^ 5) for j < 16 (a local array)
//   floats[i]       = f * p.scale + p.shift   (two roundings: __fmul_rn, __fadd_rn)
//   doubles[i]      = (double)f * p.bias       (exact product rounded once: __dmul_rn)
// Launch: any 1-D grid and block (grid-stride).
extern "C" __global__ void control_flow(const int* __restrict__ v, const float* __restrict__ f,
                                        Affine p, int* __restrict__ ints,
                                        float* __restrict__ floats, double* __restrict__ doubles,
                                        int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const int x = v[i];
        ints[0 * n + i] = collatz_steps((unsigned)(x % 1000 + 1), 500);
        ints[1 * n + i] = classify(x - 5000);
        unsigned acc = 0;
#pragma unroll 4
        for (int j = 0; j < p.count; ++j) {
            acc += (unsigned)(x ^ j) * (unsigned)(j + 1);
        }
        ints[2 * n + i] = (int)acc;
        int t[16];
        for (int j = 0; j < 16; ++j) {
            t[j] = x * j + (j ^ 5);
        }
        ints[3 * n + i] = t[x % 16];
        floats[i] = __fadd_rn(__fmul_rn(f[i], p.scale), p.shift);
        doubles[i] = __dmul_rn((double)f[i], p.bias);
    }
}

// Every thread of a 3-D grid of 3-D blocks writes its coordinates, packed 4 bits each
// (blockIdx.x, .y, .z, threadIdx.x, .y, .z, from bit 0 up; each < 16), at its linear index
//   ((bz * gy + by) * gx + bx) * (bdx * bdy * bdz) + (tz * bdy + ty) * bdx + tx
// and thread (0,0,0) of block (0,0,0) writes gridDim and blockDim to dims[0..6].
extern "C" __global__ void thread_ids(unsigned* __restrict__ out, unsigned* __restrict__ dims) {
    const unsigned block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    const unsigned per_block = blockDim.x * blockDim.y * blockDim.z;
    const unsigned thread = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    out[block * per_block + thread] = blockIdx.x | blockIdx.y << 4 | blockIdx.z << 8 |
                                      threadIdx.x << 12 | threadIdx.y << 16 | threadIdx.z << 20;
    if (block == 0 && thread == 0) {
        dims[0] = gridDim.x;
        dims[1] = gridDim.y;
        dims[2] = gridDim.z;
        dims[3] = blockDim.x;
        dims[4] = blockDim.y;
        dims[5] = blockDim.z;
    }
}
