//! `TANDEM_EMU_RACECHECK=1`: a launch with a shared-memory race fails like any kernel fault
//! (`CUDA_ERROR_LAUNCH_FAILED`, sticky, reported at the next synchronisation).

mod common;

use std::ffi::c_void;
use std::ptr::null_mut;

use common::*;

/// `name(out)`: lanes 0 and 1 swap their values through shared memory, with `sync` between
/// the store and the load.
fn swap_entry(name: &str, sync: &str) -> String {
    format!(
        ".visible .entry {name}(.param .u64 out)
{{
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
	st.shared.u32 [%r4], %r7;{sync}
	ld.shared.u32 %r8, [%r6];
	cvt.u64.u32 %rd2, %r3;
	add.s64 %rd3, %rd1, %rd2;
	st.global.u32 [%rd3], %r8;
	ret;
}}
"
    )
}

/// The swap with `bar.warp.sync` between the store and the load in `swap_synced`, without it
/// in `swap_racy`.
fn ptx() -> String {
    ".version 8.0\n.target sm_75\n.address_size 64\n.shared .align 4 .b8 buf[8];\n".to_string()
        + &swap_entry("swap_synced", "\n\tbar.warp.sync -1;")
        + &swap_entry("swap_racy", "")
}

/// Launches `module`'s `name` on one block of two threads.
fn launch2(module: Handle, name: &str, mut out: u64) -> CUresult {
    let params = &mut [&mut out as *mut u64 as *mut c_void];
    launch(
        function(module, name),
        [1, 1, 1],
        [2, 1, 1],
        0,
        null_mut(),
        params,
    )
}

#[test]
fn a_racy_launch_fails_at_synchronisation() {
    std::env::set_var("TANDEM_EMU_RACECHECK", "1");
    let _ctx = context(0);
    let module = load(&ptx()).unwrap();
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
