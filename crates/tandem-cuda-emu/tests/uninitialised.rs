//! Before a successful `cuInit`: calls fail with CUDA_ERROR_NOT_INITIALIZED; an invalid
//! `TANDEM_EMU_*` value makes `cuInit` fail with CUDA_ERROR_INVALID_VALUE. One test: the
//! driver's state and the environment are process-wide.

mod common;

use std::ptr::null_mut;

use common::*;

#[test]
fn calls_before_init_and_invalid_configuration() {
    let mut n = 0;
    check!(CUDA_ERROR_NOT_INITIALIZED, cuDeviceGetCount(&mut n));
    let mut p = 0;
    check!(CUDA_ERROR_NOT_INITIALIZED, cuMemAlloc_v2(&mut p, 4));
    let mut ctx = null_mut();
    check!(
        CUDA_ERROR_NOT_INITIALIZED,
        cuDevicePrimaryCtxRetain(&mut ctx, 0)
    );
    std::env::set_var("TANDEM_EMU_THREADS", "many");
    check!(CUDA_ERROR_INVALID_VALUE, cuInit(0));
    check!(CUDA_ERROR_NOT_INITIALIZED, cuDeviceGetCount(&mut n));
    std::env::set_var("TANDEM_EMU_THREADS", "2");
    std::env::set_var("TANDEM_EMU_DEVICES", "3");
    std::env::set_var("TANDEM_EMU_DRIVER_VERSION", "12040");
    std::env::set_var("TANDEM_EMU_MEMORY", "4096");
    check!(cuInit(0));
    check!(cuDeviceGetCount(&mut n));
    assert_eq!(n, 3);
    let mut version = 0;
    check!(cuDriverGetVersion(&mut version));
    assert_eq!(version, 12040);
    check!(cuDevicePrimaryCtxRetain(&mut ctx, 2));
    check!(cuCtxSetCurrent(ctx));
    check!(CUDA_ERROR_OUT_OF_MEMORY, cuMemAlloc_v2(&mut p, 4097));
    check!(cuMemAlloc_v2(&mut p, 4096));
    check!(CUDA_ERROR_OUT_OF_MEMORY, cuMemAlloc_v2(&mut p, 1));
}
