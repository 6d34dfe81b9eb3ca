// nvcc-arch: compute_90
// Conformance kernel: 16-bit floats (cuda_fp16.h, cuda_bf16.h) on sm_90, where each is one PTX
// instruction: f32 -> f16 and bf16 in every rounding mode, back to f32, packing two f32 into
// f16x2 and bf16x2, and packed add, mul and fma. For i < n, with x = x[i], y = y[i], z = z[i]
// (f32, including ties, overflows, subnormals, infinities and NaN):
//   bits[0..4 * n]: __float2half_rn/_rz/_rd/_ru(x)            (cvt.{rn,rz,rm,rp}.f16.f32)
//   bits[4..8 * n]: __float2bfloat16_rn/_rz/_rd/_ru(x)        (cvt.{rn,rz,rm,rp}.bf16.f32)
//   wide[0 * n + i] = __half2float(__float2half_rz(y))        (cvt.f32.f16)
//   wide[1 * n + i] = __bfloat162float(__float2bfloat16_rz(y)) (cvt.f32.bf16)
//   packed[0]: h = __floats2half2_rn(x, y)   (cvt.rn.f16x2.f32: x in the low lane)
//   packed[1]: g = __floats2half2_rn(z, x)
//   packed[2..5]: __hadd2(h, g), __hmul2(h, g), __hfma2(h, g, __hadd2(h, g))
//   packed[5..10]: the same with __nv_bfloat162 (cvt.rn.bf16x2.f32, add/mul/fma.rn.bf16x2)
// Launch: any 1-D grid and block (grid-stride).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ unsigned bits_of(__half2 v) { return *reinterpret_cast<const unsigned*>(&v); }
__device__ unsigned bits_of(__nv_bfloat162 v) { return *reinterpret_cast<const unsigned*>(&v); }

extern "C" __global__ void half_ops(const float* __restrict__ x, const float* __restrict__ y,
                                    const float* __restrict__ z,
                                    unsigned short* __restrict__ bits, float* __restrict__ wide,
                                    unsigned* __restrict__ packed, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        const float xv = x[i], yv = y[i], zv = z[i];
        bits[0 * n + i] = __half_as_ushort(__float2half_rn(xv));
        bits[1 * n + i] = __half_as_ushort(__float2half_rz(xv));
        bits[2 * n + i] = __half_as_ushort(__float2half_rd(xv));
        bits[3 * n + i] = __half_as_ushort(__float2half_ru(xv));
        bits[4 * n + i] = __bfloat16_as_ushort(__float2bfloat16_rn(xv));
        bits[5 * n + i] = __bfloat16_as_ushort(__float2bfloat16_rz(xv));
        bits[6 * n + i] = __bfloat16_as_ushort(__float2bfloat16_rd(xv));
        bits[7 * n + i] = __bfloat16_as_ushort(__float2bfloat16_ru(xv));
        wide[0 * n + i] = __half2float(__float2half_rz(yv));
        wide[1 * n + i] = __bfloat162float(__float2bfloat16_rz(yv));
        const __half2 h = __floats2half2_rn(xv, yv), g = __floats2half2_rn(zv, xv);
        const __half2 hs = __hadd2(h, g);
        packed[0 * n + i] = bits_of(h);
        packed[1 * n + i] = bits_of(g);
        packed[2 * n + i] = bits_of(hs);
        packed[3 * n + i] = bits_of(__hmul2(h, g));
        packed[4 * n + i] = bits_of(__hfma2(h, g, hs));
        const __nv_bfloat162 b = __floats2bfloat162_rn(xv, yv), c = __floats2bfloat162_rn(zv, xv);
        const __nv_bfloat162 bs = __hadd2(b, c);
        packed[5 * n + i] = bits_of(b);
        packed[6 * n + i] = bits_of(c);
        packed[7 * n + i] = bits_of(bs);
        packed[8 * n + i] = bits_of(__hmul2(b, c));
        packed[9 * n + i] = bits_of(__hfma2(b, c, bs));
    }
}
