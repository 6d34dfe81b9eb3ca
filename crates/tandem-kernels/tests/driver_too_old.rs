//! A driver older than the committed PTX's ISA: `CudaBackend::new` says to update the driver
//! (`KernelError::DriverTooOld`) instead of a bare CUDA error.
//!
//! Only the driver stand-in can pretend to be old (`TANDEM_EMU_DRIVER_VERSION`, read at
//! `cuInit`, hence a test binary of its own with a single test); NVIDIA's driver ignores the
//! variable, and there the test says it is skipped.
#![cfg(feature = "cuda")]

use std::io::Write;

use tandem_kernels::{CudaBackend, KernelError};

#[test]
fn a_driver_older_than_the_ptx_is_reported_as_too_old() {
    // Before anything in this process initialises the driver; the only test of this binary.
    std::env::set_var("TANDEM_EMU_DRIVER_VERSION", "12040");
    match CudaBackend::new(0) {
        Err(KernelError::DriverTooOld { major, minor }) => {
            assert_eq!((major, minor), (12, 4));
            let message = KernelError::DriverTooOld { major, minor }.to_string();
            assert!(
                message.contains("CUDA 12.4") && message.contains("580"),
                "{message}"
            );
        }
        Err(other) if other.is_no_device() => {
            tandem_testkit::no_device(&other, tandem_testkit::gpu_required())
        }
        Err(other) => panic!("expected DriverTooOld, got {other}"),
        // Under TANDEM_REQUIRE_GPU (CI, on the stand-in) this must not happen.
        Ok(_) if !tandem_testkit::gpu_required() => {
            let _ = std::io::stderr().write_all(
                b"SKIPPED: driver_too_old: this driver cannot pretend to be CUDA 12.4\n",
            );
        }
        Ok(_) => panic!("the driver loaded ISA 9.0 PTX while claiming to be CUDA 12.4"),
    }
}
