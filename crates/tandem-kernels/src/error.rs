//! The CUDA backend's error type.

use cust::error::CudaError;
use tandem_tensor::ShapeError;

use crate::ptx::{MAX_GRADIENT_BUFFERS, MIN_DRIVER, PTX_ISA_VERSION};

/// What can go wrong in [`CudaBackend`](crate::CudaBackend).
//
// CUDA errors are shown with `Debug` (`NoDevice`) and their number, never with cust's
// `Display`: that asks the driver for the error's text and fails the whole formatting when the
// driver cannot answer (the stub libcuda of CI, a broken install).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// A CUDA driver call failed.
    #[error("{during}: CUDA error {code:?} ({})", code_number(.code))]
    Cuda {
        /// What was being done: an operation, or the kernel being launched.
        during: &'static str,
        /// The driver's error.
        code: CudaError,
    },
    /// The driver is too old for the committed PTX (it fails to load with
    /// `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`).
    #[error(
        "the NVIDIA driver (CUDA {major}.{minor}) cannot load the kernels' PTX (ISA \
         {PTX_ISA_VERSION}, from CUDA 13.0): update the driver to {MIN_DRIVER} or newer"
    )]
    DriverTooOld {
        /// The CUDA version the driver supports, major part.
        major: i32,
        /// Minor part.
        minor: i32,
    },
    /// The requested device ordinal does not exist.
    #[error("there is no CUDA device {ordinal}: this machine has {count}")]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices there are.
        count: usize,
    },
    /// An operand was too short.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// A size exceeds what the kernels index (32-bit dimensions, grid limits).
    #[error("{what} is {value}, more than the kernels handle ({max})")]
    TooLarge {
        /// Which size.
        what: &'static str,
        /// Its value.
        value: usize,
        /// The largest supported.
        max: usize,
    },
    /// An update or reduction was given no gradient buffer, or more than one launch averages.
    #[error("{op}: {given} gradient buffers given, 1 to {MAX_GRADIENT_BUFFERS} supported")]
    GradientCount {
        /// The operation.
        op: &'static str,
        /// How many buffers were given.
        given: usize,
    },
}

impl KernelError {
    /// Whether this says that the machine has no usable CUDA device (no GPU, no driver behind
    /// the stub libcuda): the case where GPU tests skip rather than fail.
    pub fn is_no_device(&self) -> bool {
        matches!(
            self,
            KernelError::Cuda {
                code: CudaError::NoDevice,
                ..
            } | KernelError::NoSuchDevice { count: 0, .. }
        )
    }
}

fn code_number(code: &CudaError) -> u32 {
    *code as u32
}

/// Wraps a driver error with what was being done, for `map_err`.
pub(crate) fn cuda(during: &'static str) -> impl FnOnce(CudaError) -> KernelError {
    move |code| KernelError::Cuda { during, code }
}
