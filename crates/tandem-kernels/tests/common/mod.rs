//! What the kernel tests share (`cuda.rs`, `narrow.rs`): random operands, buffers filled and
//! read back, the product shapes.
#![allow(dead_code)] // each test binary uses its own part of this module

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tandem_kernels::{CudaBackend, DeviceBuffer};
use tandem_tensor::Backend;

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

pub fn random(rng: &mut ChaCha8Rng, len: usize, scale: f32) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(-scale..scale)).collect()
}

/// A device buffer holding `values` from `offset` on (zeros before).
pub fn upload(gpu: &CudaBackend, values: &[f32], offset: usize) -> DeviceBuffer<f32> {
    let mut buf = gpu.zeros(offset + values.len()).expect("allocating");
    gpu.upload(values, &mut buf, offset).expect("uploading");
    buf
}

/// A device buffer of `len` NaNs, to be overwritten.
pub fn poisoned(gpu: &CudaBackend, len: usize) -> DeviceBuffer<f32> {
    upload(gpu, &vec![f32::NAN; len], 0)
}

pub fn download(gpu: &CudaBackend, buf: &DeviceBuffer<f32>, offset: usize, len: usize) -> Vec<f32> {
    let mut host = vec![0.0; len];
    gpu.download(buf, offset, &mut host).expect("downloading");
    host
}

pub fn labels(gpu: &CudaBackend, values: &[u32]) -> DeviceBuffer<u32> {
    let mut buf = gpu.zero_labels(values.len()).expect("allocating");
    gpu.upload_labels(values, &mut buf, 0)
        .expect("uploading labels");
    buf
}

/// `(m, n, k)`: edge cases, the model's shapes (batch 100, 784-500-10) and random ones, most of
/// them not multiples of the 32-wide tile.
pub fn gemm_shapes(rng: &mut ChaCha8Rng) -> Vec<(usize, usize, usize)> {
    let mut shapes = vec![
        (1, 1, 1),
        (1, 7, 0),
        (32, 32, 32),
        (33, 31, 65),
        (100, 500, 784),
        (100, 10, 500),
        (784, 500, 100),
        (500, 10, 100),
        (100, 500, 10),
    ];
    shapes.extend((0..6).map(|_| {
        (
            rng.random_range(1..150),
            rng.random_range(1..150),
            rng.random_range(1..150),
        )
    }));
    shapes
}
