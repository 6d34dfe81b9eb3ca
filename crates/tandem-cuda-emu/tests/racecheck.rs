//! `TANDEM_EMU_RACECHECK=1`: a launch with a shared-memory race fails like any kernel fault
//! (`CUDA_ERROR_LAUNCH_FAILED`, sticky, reported at the next synchronisation).

mod common;

use std::ffi::{c_void, CString};
use std::ptr::null_mut;

use common::*;

/// `swap(out)`: lanes 0 and 1 swap their values through shared memory, with `bar.warp.sync`
/// between the store and the load in `swap_synced`, without it in `swap_racy`.
const PTX: &str = ".version 8.0
.target sm_75
.address_size 64
.shared .align 4 .b8 buf[8];
.visible .entry swap_synced(.param .u64 out)
{
	.reg .b32 %r<9>;
	.reg .b64 %rd<5>;
	ld.param.u64 %rd1, [out];
	mov.u32 %r1, %tid.x;
	mov.u32 %r2, buf;
	shl.b32 %r3, %r1, 2;
	add.u32 %r4, %r2, %r3;
	xor.b32 %r5, %r3, 4;
	add.u32 %r6, %r2, %r5;
	add.u32 %r7, %r1, 10;
	st.shared.u32 [%r4], %r7;
	bar.warp.sync -1;
	ld.shared.u32 %r8, [%r6];
	cvt.u64.u32 %rd2, %r3;
	add.s64 %rd3, %rd1, %rd2;
	st.global.u32 [%rd3], %r8;
	ret;
}
.visible .entry swap_racy(.param .u64 out)
{
	.reg .b32 %r<9>;
	.reg .b64 %rd<5>;
	ld.param.u64 %rd1, [out];
	mov.u32 %r1, %tid.x;
	mov.u32 %r2, buf;
	shl.b32 %r3, %r1, 2;
	add.u32 %r4, %r2, %r3;
	xor.b32 %r5, %r3, 4;
	add.u32 %r6, %r2, %r5;
	add.u32 %r7, %r1, 10;
	st.shared.u32 [%r4], %r7;
	ld.shared.u32 %r8, [%r6];
	cvt.u64.u32 %rd2, %r3;
	add.s64 %rd3, %rd1, %rd2;
	st.global.u32 [%rd3], %r8;
	ret;
}
";

fn launch2(module: Handle, name: &str, mut out: u64) -> CUresult {
    let name = CString::new(name).unwrap();
    let mut f = null_mut();
    check!(cuModuleGetFunction(&mut f, module, name.as_ptr()));
    let mut params = [&mut out as *mut u64 as *mut c_void];
    unsafe {
        cuLaunchKernel(
            f,
            1,
            1,
            1,
            2,
            1,
            1,
            0,
            null_mut(),
            params.as_mut_ptr(),
            null_mut(),
        )
    }
}

#[test]
fn a_racy_launch_fails_at_synchronisation() {
    std::env::set_var("TANDEM_EMU_RACECHECK", "1");
    let _ctx = context(0);
    let text = CString::new(PTX).unwrap();
    let mut module = null_mut();
    check!(cuModuleLoadData(
        &mut module,
        text.as_ptr() as *const c_void
    ));
    let out = alloc(8);
    assert_eq!(launch2(module, "swap_synced", out), CUDA_SUCCESS);
    check!(cuCtxSynchronize());
    assert_eq!(download(out, 2), [11, 10]);
    // The race is found when the launch runs: the launch itself succeeds.
    assert_eq!(launch2(module, "swap_racy", out), CUDA_SUCCESS);
    check!(CUDA_ERROR_LAUNCH_FAILED, cuCtxSynchronize());
    // Sticky.
    check!(CUDA_ERROR_LAUNCH_FAILED, cuCtxSynchronize());
    let mut p = 0;
    check!(CUDA_ERROR_LAUNCH_FAILED, cuMemAlloc_v2(&mut p, 4));
}
