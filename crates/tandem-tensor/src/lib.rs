//! Tensors and the operations a small neural network needs, behind a [`Backend`] trait.
//!
//! * [`Tensor`]: a shape and contiguous row-major `f32` storage, with truncated-normal
//!   initialisation.
//! * [`Backend`]: the operations a forward and backward pass of a multi-layer perceptron is
//!   written against (matrix products with either operand transposed, bias + ReLU, a fused
//!   softmax + cross-entropy, column sums, ...). [`CpuBackend`] implements it on the host; the
//!   `tandem-kernels` crate implements it with CUDA kernels.
//! * [`check`]: the operand checks of every operation, shared by all backends so that they
//!   refuse the same inputs with the same error.
//! * [`cpu`]: the plain CPU functions behind [`CpuBackend`]. They are also the reference twins
//!   that every GPU kernel is tested against, and hold the host-side optimiser step
//!   ([`cpu::sgd_ema_update`]).
//! * [`NarrowCpuBackend`]: the CPU backend storing `bf16` or `f16` ([`round_to`], with the
//!   `half` crate), computing in `f32`: mixed-precision training on CPU workers, and the twin
//!   of 16-bit kernels.
//!
//! ```
//! use tandem_tensor::{Backend, CpuBackend, Gemm};
//!
//! let cpu = CpuBackend;
//! // C (2x2) = A (2x3) . B^T where B is stored as 2x3.
//! let a = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
//! let b = vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0];
//! let mut c = cpu.zeros(4).unwrap();
//! let spec = Gemm::nt(2, 2, 3);
//! cpu.matmul(spec, (&a, 0), (&b, 0), (&mut c, 0)).unwrap();
//! assert_eq!(c, vec![1.0, 2.0, 4.0, 5.0]);
//! ```
#![warn(missing_docs)]

mod backend;
pub mod check;
pub mod cpu;
mod narrow;
mod tensor;

pub use backend::{
    Activation, Backend, CpuBackend, ExampleSet, Gemm, LayerOperands, ResidentExamples, ShapeError,
};
pub use narrow::{decode_bf16, encode_bf16, round_to, NarrowCpuBackend};
pub use tensor::Tensor;
