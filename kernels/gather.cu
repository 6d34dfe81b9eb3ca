// Gathers a batch from a device-resident u8 data set (cpu::gather):
//
//   x[r][f]   = images[indices[r]][f] / 255      for f < features
//   labels[r] = example_labels[indices[r]]
//
// for r < rows, each x rounded as `narrow` says (round.cuh: a 16-bit backend's batch). The
// indices were checked against the data set's length on the host.
// Launch: grid (rows, ceil(features / 256)), block 256.

#include "round.cuh"

extern "C" __global__ void gather(const unsigned char *__restrict__ images,
                                  const unsigned char *__restrict__ example_labels,
                                  const unsigned *__restrict__ indices, unsigned features,
                                  float *__restrict__ x, unsigned *__restrict__ labels,
                                  int narrow) {
    const unsigned r = blockIdx.x;
    const unsigned f = blockIdx.y * blockDim.x + threadIdx.x;
    const size_t i = indices[r];
    if (f < features) {
        // The CPU twin's value, bit for bit: the IEEE division (float)p / 255.0f (nvcc divides
        // correctly rounded without fast math). Multiplying by 1.0f / 255.0f instead would be
        // one ulp off for 126 of the 256 byte values.
        x[(size_t)r * features + f] = round_stored(images[i * features + f] / 255.0f, narrow);
    }
    if (f == 0) {
        labels[r] = example_labels[i];
    }
}
