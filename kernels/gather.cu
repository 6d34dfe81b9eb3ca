// Gathers a batch from a device-resident u8 data set (cpu::gather):
//
//   x[r][f]   = images[indices[r]][f] / 255      for f < features
//   labels[r] = example_labels[indices[r]]
//
// for r < rows. The indices were checked against the data set's length on the host.
// Launch: grid (rows, ceil(features / 256)), block 256.
extern "C" __global__ void gather(const unsigned char *__restrict__ images,
                                  const unsigned char *__restrict__ example_labels,
                                  const unsigned *__restrict__ indices, unsigned features,
                                  float *__restrict__ x, unsigned *__restrict__ labels) {
    const unsigned r = blockIdx.x;
    const unsigned f = blockIdx.y * blockDim.x + threadIdx.x;
    const size_t i = indices[r];
    if (f < features) {
        // The CPU twin's value, bit for bit: the IEEE division (float)p / 255.0f (nvcc divides
        // correctly rounded without fast math). Multiplying by 1.0f / 255.0f instead would be
        // one ulp off for 126 of the 256 byte values.
        x[(size_t)r * features + f] = images[i * features + f] / 255.0f;
    }
    if (f == 0) {
        labels[r] = example_labels[i];
    }
}
