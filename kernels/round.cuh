// round_narrow, shared by the kernels that store 16-bit values in f32 slots (narrow.cu, and
// gather.cu, reduce.cu and softmax_xent.cu through round_stored) and the update kernels that
// write a rounded copy of the f32 master weights (update.cu). Includes the headers it needs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// v rounded to the nearest bf16 (bf16 != 0) or f16 value, ties to even, as an f32 (f16
// overflows to infinity). A bf16 is the upper half of an f32: widened by a shift (compute_80's
// __bfloat162float packs the halves with a mov instead; cvt.f32.bf16 needs sm_90). Below
// compute_80, __float2bfloat16_rn is the header's integer rounding, the same result.
__device__ float round_narrow(float v, int bf16) {
    if (bf16) {
        return __uint_as_float((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(v)) << 16);
    }
    return __half2float(__float2half_rn(v));
}

// What a kernel that stores results rounds them to, its `narrow` parameter: nothing (an f32
// backend), or bf16 or f16 values in f32 slots (a 16-bit backend's, rounded where they are
// stored rather than by a `round_to` of their own afterwards).
#define NARROW_NONE 0
#define NARROW_BF16 1
#define NARROW_F16 2

// v as a kernel with `narrow` stores it: v itself (NARROW_NONE), or round_narrow(v).
__device__ float round_stored(float v, int narrow) {
    return narrow == NARROW_NONE ? v : round_narrow(v, narrow == NARROW_BF16);
}
