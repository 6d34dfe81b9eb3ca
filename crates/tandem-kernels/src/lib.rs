//! CUDA kernels for tandem's multi-layer perceptron, and a CUDA implementation of
//! [`tandem_tensor::Backend`].
//!
//! * [`ptx`]: the PTX of every `kernels/*.cu` file, committed and embedded as constants (always
//!   available), and [`ptx::Kernel`], the entry points the launch code uses.
//! * With the `cuda` feature: `CudaBackend`, which runs every [`Backend`](tandem_tensor::Backend)
//!   operation on one GPU through the CUDA driver API (its own declarations of the ~30 calls
//!   it makes, each result an integer: see the private `driver` module; a training step
//!   replayed as one CUDA graph, `Backend::replay`), its buffers (`DeviceBuffer`), plus the
//!   fused optimiser step (`CudaBackend::sgd_ema_update`) and the gradient reduction
//!   (`CudaBackend::mean_gradients`) of data-parallel training, and `device_count`;
//!   `CudaQueue`, a backend's stream as a `tandem_core::DeviceQueue`, for a store that keeps
//!   the parameters of record in device memory.
//!
//! The feature is off by default so that the workspace builds where no CUDA is installed. With
//! it, linking needs a `libcuda`: the driver's, or on a machine without a GPU tandem's CPU
//! stand-in that `cargo xtask cuda-emu` builds (set `CUDA_LIBRARY_PATH` to `target/cuda-emu`).
//!
//! The committed PTX targets `compute_75` with PTX ISA 9.0 (nvcc 13.0): it loads on Turing and
//! newer GPUs with a driver of the 580 branch or newer. The 16-bit kernels ([`ptx::NARROW`],
//! tensor cores) target `compute_80`: a backend loads every module whose target its GPU has,
//! and a 16-bit one (`CudaBackend::with_dtype`) needs compute capability 8.0 or newer.
//!
//! ```
//! use tandem_kernels::ptx::{self, Kernel};
//!
//! // Every kernel the launch code names is an entry point of its module's PTX.
//! for kernel in Kernel::ALL {
//!     let module = kernel.module();
//!     assert!(module.ptx.contains(&format!(".entry {}(", kernel.entry())), "{}", module.name);
//! }
//! assert!(ptx::MATMUL.contains(&format!(".target {}", ptx::PTX_TARGET)));
//! ```
#![warn(missing_docs)]

mod launch;
pub mod ptx;

#[cfg(feature = "cuda")]
mod backend;
#[cfg(feature = "cuda")]
mod driver;
#[cfg(feature = "cuda")]
mod error;
#[cfg(feature = "cuda")]
mod queue;

#[cfg(feature = "cuda")]
pub use backend::{device_count, CudaBackend, DeviceExamples};
#[cfg(feature = "cuda")]
pub use driver::{release_failures, DeviceBuffer};
#[cfg(feature = "cuda")]
pub use error::KernelError;
#[cfg(feature = "cuda")]
pub use queue::CudaQueue;
