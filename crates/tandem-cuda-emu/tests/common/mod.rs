//! Helpers shared by the test binaries.
#![allow(dead_code)]

use std::ffi::c_void;
use std::ptr::null_mut;

pub use tandem_cuda_emu::codes::*;
pub use tandem_cuda_emu::*;

/// Asserts a driver call returned `expected`.
#[macro_export]
macro_rules! check {
    ($expected:expr, $call:expr) => {{
        // Some calls are safe (the unsupported ones); the driver's are not.
        #[allow(unused_unsafe, clippy::macro_metavars_in_unsafe)]
        let got = unsafe { $call };
        assert_eq!(got, $expected, "{} returned {got}", stringify!($call));
    }};
    ($call:expr) => {
        check!(CUDA_SUCCESS, $call)
    };
}

/// Initialises the driver and creates a context of this test's own on `device` (current on
/// this thread), so that a sticky error stays in this test.
pub fn context(device: i32) -> Handle {
    check!(cuInit(0));
    let mut ctx = null_mut();
    check!(cuCtxCreate_v2(&mut ctx, 0, device));
    ctx
}

/// A new stream of the current context.
pub fn stream() -> Handle {
    let mut s = null_mut();
    check!(cuStreamCreate(&mut s, 1));
    s
}

/// A new allocation of `bytes`.
pub fn alloc(bytes: usize) -> u64 {
    let mut p = 0;
    check!(cuMemAlloc_v2(&mut p, bytes));
    p
}

/// Pinned host memory of `bytes`.
pub fn pinned(bytes: usize) -> *mut u8 {
    let mut p: *mut c_void = null_mut();
    check!(cuMemAllocHost_v2(&mut p, bytes));
    p as *mut u8
}

/// Copies `values` to device address `dst` synchronously.
pub fn upload(dst: u64, values: &[u32]) {
    check!(cuMemcpyHtoD_v2(
        dst,
        values.as_ptr() as *const c_void,
        values.len() * 4
    ));
}

/// Reads `n` u32 at device address `src` synchronously.
pub fn download(src: u64, n: usize) -> Vec<u32> {
    let mut out = vec![0u32; n];
    check!(cuMemcpyDtoH_v2(out.as_mut_ptr() as *mut c_void, src, n * 4));
    out
}
