// The optimisers' steps and the gradient reduction of data-parallel training, over flat f32
// spans. sgd_ema_update is bit for bit the arithmetic of cpu::sgd_ema_update:
//
//   g     = (grads[0][i] + grads[1][i] + ...) * (1/n) summed in this order (g = grads[0][i] if n == 1)
//   p[i] -= lr * (g + wd * p[i])
//   e[i]  = d * e[i] + (1 - d) * p[i]
//
// with lr, wd and d read from device memory (hyper = {lr, wd, d}): a captured CUDA graph keeps
// the update's arguments fixed, while the host writes each step's values there before it. One
// launch updates consecutive spans with their own values (weights and biases differ in wd).
//
// Every operation is an explicitly rounded intrinsic (__fadd_rn, __fmul_rn, ...): the compiler
// never contracts those into fused multiply-adds, so the result matches the CPU's separate
// f32 operations exactly and a GPU run can be checked against a CPU run bitwise.
//
// Where a replica reads a copy of the parameters (copy non-null), the update writes it in the
// same pass, rounded as round.cuh's round_stored says (narrow): copy[i] = round_stored(p[i]), the
// replica's parameters for its next step. A replica that computes in bf16 or f16 (values held in
// f32 slots) reads its f32 master weights rounded; one that shares the parameters of record with
// others (asynchronous replicas on one GPU) reads them as they are (NARROW_NONE).
// Where the replicas exchange their gradients in bf16 (grads_bf16 != 0: compress_bf16 wrote
// them), g is their f32 sum instead (see mean_gradient).
//
// Launch (all): 1-D, 256 threads a block, any number of blocks (grid-stride loop).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "round.cuh"

#define MAX_GRADS 16

// Up to MAX_GRADS gradient buffers, passed by value among the kernel's parameters (so no
// pointer array has to be uploaded each step), as __grid_constant__: threads read the table
// where the launch put it, instead of each copying it to local memory to index it at run time.
// Slots past n are unused. Each holds f32 values, or bf16 ones (their 16 bits) where the
// kernel's grads_bf16 is non-zero.
struct Grads {
    const void *ptr[MAX_GRADS];
};

// The gradient of value i from the n buffers. f32 gradients are averaged; bf16 ones come from a
// 16-bit exchange (compress_bf16), each divided by the worker count before it was rounded, so
// their f32 sum from zero in buffer order is the mean, as the host sums what arrives over MPI.
__device__ float mean_gradient(const Grads &grads, unsigned n, size_t i, int grads_bf16) {
    if (grads_bf16) {
        float sum = 0.0f;
        for (unsigned j = 0; j < n; ++j) {
            const unsigned bits = static_cast<const unsigned short *>(grads.ptr[j])[i];
            sum = __fadd_rn(sum, __uint_as_float(bits << 16));
        }
        return sum;
    }
    const float *first = static_cast<const float *>(grads.ptr[0]);
    if (n == 1) {
        return first[i];
    }
    // Starting from the first buffer, as the twin does (starting from 0.0f would turn a -0.0
    // sum into +0.0).
    float sum = first[i];
    for (unsigned j = 1; j < n; ++j) {
        sum = __fadd_rn(sum, static_cast<const float *>(grads.ptr[j])[i]);
    }
    return __fmul_rn(sum, __fdiv_rn(1.0f, (float)n));
}

#define MAX_SPANS 8

// Consecutive spans of the values one update covers, passed by value like Grads: span s ends
// before value end[s] (and starts where span s - 1 ends, span 0 at 0), and its values (the
// optimiser's: sgd_ema_update's [lr, wd, d], adam_update's six) are at hyper[s]. Slots past the launch's count are unused.
struct Spans {
    unsigned long long end[MAX_SPANS];
    const float *hyper[MAX_SPANS];
};

// The values of the span (of count) that value i lies in.
__device__ const float *span_values(const Spans &spans, unsigned count, size_t i) {
    unsigned s = 0;
    while (s + 1 < count && i >= spans.end[s]) {
        ++s;
    }
    return spans.hyper[s];
}

// The fused SGD + L2 + moving-average update of the count spans (1 to MAX_SPANS) of p and e from
// n gradient buffers (and p's rounded copy, unless copy is null).
extern "C" __global__ void sgd_ema_update(float *__restrict__ p, float *__restrict__ e,
                                          const __grid_constant__ Grads grads, unsigned n,
                                          const __grid_constant__ Spans spans, unsigned count,
                                          float *__restrict__ copy, int narrow, int grads_bf16) {
    const size_t len = spans.end[count - 1];
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
         i += (size_t)gridDim.x * blockDim.x) {
        const float *hyper = span_values(spans, count, i);
        const float lr = hyper[0], wd = hyper[1], d = hyper[2];
        const float g = mean_gradient(grads, n, i, grads_bf16);
        const float pi = __fsub_rn(p[i], __fmul_rn(lr, __fadd_rn(g, __fmul_rn(wd, p[i]))));
        p[i] = pi;
        e[i] = __fadd_rn(__fmul_rn(d, e[i]), __fmul_rn(__fsub_rn(1.0f, d), pi));
        if (copy != nullptr) {
            copy[i] = round_stored(pi, narrow);
        }
    }
}

// Adam over the count spans of p and its moments m and v (and the moving average e, unless
// e is null; p's rounded copy, unless copy is null) from n gradient buffers, bit for bit
// tandem_optim::adam_update: per span, hyper = {step_size, beta1, beta2, epsilon_hat, wd, d},
// the bias corrections folded into step_size and epsilon_hat on the host.
//
//   g  = mean of the gradients + wd * p[i]
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * (g * g)
//   p -= step_size * (m / (sqrt(v) + epsilon_hat))
//   e  = d * e + (1 - d) * p
extern "C" __global__ void adam_update(float *__restrict__ p, float *__restrict__ m,
                                       float *__restrict__ v, float *__restrict__ e,
                                       const __grid_constant__ Grads grads, unsigned n,
                                       const __grid_constant__ Spans spans, unsigned count,
                                       float *__restrict__ copy, int narrow, int grads_bf16) {
    const size_t len = spans.end[count - 1];
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
         i += (size_t)gridDim.x * blockDim.x) {
        const float *hyper = span_values(spans, count, i);
        const float step = hyper[0], b1 = hyper[1], b2 = hyper[2], eps = hyper[3];
        const float wd = hyper[4], d = hyper[5];
        const float g = __fadd_rn(mean_gradient(grads, n, i, grads_bf16), __fmul_rn(wd, p[i]));
        const float mi = __fadd_rn(__fmul_rn(b1, m[i]), __fmul_rn(__fsub_rn(1.0f, b1), g));
        const float vi =
            __fadd_rn(__fmul_rn(b2, v[i]), __fmul_rn(__fsub_rn(1.0f, b2), __fmul_rn(g, g)));
        const float pi =
            __fsub_rn(p[i], __fmul_rn(step, __fdiv_rn(mi, __fadd_rn(__fsqrt_rn(vi), eps))));
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
        if (e != nullptr) {
            e[i] = __fadd_rn(__fmul_rn(d, e[i]), __fmul_rn(__fsub_rn(1.0f, d), pi));
        }
        if (copy != nullptr) {
            copy[i] = round_stored(pi, narrow);
        }
    }
}

// out[i] = the mean of the n gradient buffers at i (the sync strategy's all-reduce on one
// device). out may be one of the gradient buffers: each i is read before it is written, by the
// same thread.
extern "C" __global__ void mean_gradients(float *out, const __grid_constant__ Grads grads,
                                          unsigned n, size_t len) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
         i += (size_t)gridDim.x * blockDim.x) {
        out[i] = mean_gradient(grads, n, i, 0);
    }
}

// dst[i] = the 16 bits of src[i] / divisor rounded to bf16 (to nearest, ties to even), for
// i < len: a replica's gradients as a 16-bit exchange sends them, divided by the worker count
// first (as PyTorch DDP's compression hooks do) so that their sum on arrival is the mean and
// cannot overflow. Bit for bit the host's exchange (an f32 division, then encode_bf16).
extern "C" __global__ void compress_bf16(unsigned short *__restrict__ dst,
                                         const float *__restrict__ src, size_t len,
                                         float divisor) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
         i += (size_t)gridDim.x * blockDim.x) {
        dst[i] = __bfloat16_as_ushort(__float2bfloat16_rn(__fdiv_rn(src[i], divisor)));
    }
}
