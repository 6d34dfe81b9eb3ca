//! The CUDA backend's error type.

use tandem_tensor::ShapeError;

use crate::driver::{self, Code, NO_DEVICE};
use crate::ptx::{MAX_GRADIENT_BUFFERS, MIN_DRIVER, PTX_ISA_VERSION};

/// What can go wrong in [`CudaBackend`](crate::CudaBackend).
//
// CUDA errors are shown by tandem's own table of names and their number, never by asking the
// driver (`cuGetErrorName`), which cannot answer where the driver is broken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// A CUDA driver call failed.
    #[error("{during}: {}", describe(*.code))]
    Cuda {
        /// What was being done: an operation, or the kernel being launched.
        during: &'static str,
        /// The driver's result code (`CUresult`), whatever its value: `100` is
        /// `CUDA_ERROR_NO_DEVICE`.
        code: u32,
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
    /// A kernel left a result it always writes unwritten: the poison put there before the launch
    /// is still there. A driver that reports a launch as done when it did not run it, or a
    /// kernel that returned early.
    #[error("{kernel} did not write its result")]
    NotWritten {
        /// The kernel's entry point.
        kernel: &'static str,
    },
    /// An update named a kernel, a number of state vectors or a gradient type that no update
    /// kernel has.
    #[error("no update kernel {kernel} over {states} state vector(s) and {grads} gradients")]
    NoUpdateKernel {
        /// The kernel named.
        kernel: String,
        /// The state vectors given.
        states: usize,
        /// The gradients' type.
        grads: tandem_core::DType,
    },
    /// A gradient compression asked for a type that no kernel writes (they write bf16).
    #[error("no kernel compresses gradients to {0}")]
    NoCompression(tandem_core::DType),
    /// A 16-bit backend was asked of a GPU without tensor cores for its type (compute
    /// capability below 8.0, where `mma.sync` with bf16 and f16 operands is missing).
    #[error(
        "--precision {dtype} is not available on cuda:{ordinal}: its products need tensor cores \
         (compute capability 8.0 or newer, Ampere and later), and this GPU is {}.{} (a fresh \
         run with --precision f32 trains there; this precision, fresh or resumed, trains on CPU \
         workers)",
        capability / 10,
        capability % 10
    )]
    NoTensorCores {
        /// The type asked for.
        dtype: tandem_core::DType,
        /// The device.
        ordinal: usize,
        /// Its compute capability, `10 major + minor`.
        capability: u32,
    },
    /// A kernel was launched that the backend did not load (a 16-bit kernel on an `f32`
    /// backend): a bug in the launch code, reported rather than launched.
    #[error("{kernel} is not loaded on this backend")]
    NotLoaded {
        /// The kernel's entry point.
        kernel: &'static str,
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
    /// Whether this says that the machine has no CUDA device (`CUDA_ERROR_NO_DEVICE`, or an
    /// ordinal past a count of 0): the case where GPU tests skip rather than fail (unless
    /// `TANDEM_REQUIRE_GPU=1`).
    pub fn is_no_device(&self) -> bool {
        matches!(
            self,
            KernelError::Cuda {
                code: NO_DEVICE,
                ..
            } | KernelError::NoSuchDevice { count: 0, .. }
        )
    }
}

/// `CUDA_ERROR_NO_DEVICE (CUDA error 100)`, or `CUDA error 46` for a code tandem has no name
/// for.
fn describe(code: Code) -> String {
    match driver::name(code) {
        Some(name) => format!("{name} (CUDA error {code})"),
        None => format!("CUDA error {code}"),
    }
}

/// Wraps a driver error with what was being done, for `map_err`.
pub(crate) fn cuda(during: &'static str) -> impl FnOnce(Code) -> KernelError {
    move |code| KernelError::Cuda { during, code }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_errors_show_their_name_and_number() {
        let error = cuda("allocating device memory")(2);
        assert_eq!(
            error.to_string(),
            "allocating device memory: CUDA_ERROR_OUT_OF_MEMORY (CUDA error 2)"
        );
        assert!(!error.is_no_device());
        let unknown = cuda("opening the device")(12_345);
        assert_eq!(unknown.to_string(), "opening the device: CUDA error 12345");
        assert!(!unknown.is_no_device());
    }

    #[test]
    fn only_no_device_and_an_empty_machine_are_no_device() {
        assert!(cuda("initialising")(100).is_no_device());
        assert!(KernelError::NoSuchDevice {
            ordinal: 0,
            count: 0
        }
        .is_no_device());
        assert!(!KernelError::NoSuchDevice {
            ordinal: 2,
            count: 1
        }
        .is_no_device());
        // An exclusive-process GPU that another process holds is present but unusable.
        assert!(!cuda("retaining the primary context")(46).is_no_device());
    }
}
