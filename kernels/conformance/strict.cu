// Conformance kernel for the error checks (check.py --strict): p[offset] = value and nothing
// else. With an offset far past the end of p's allocation it is an illegal address, which the
// driver reports as CUDA_ERROR_ILLEGAL_ADDRESS (700), sticky for the context.
// Launch: one thread.
extern "C" __global__ void write_at(float* p, long long offset, float value) {
    p[offset] = value;
}
