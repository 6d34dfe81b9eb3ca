//! Kernel launches through tandem-ptx's interpreter: the strictness rules, each with a
//! deliberately broken launch asserting the exact error code. Each test makes its own context,
//! so that a sticky error stays in it.

mod common;

use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr::null_mut;

use common::*;

const PTX: &str = include_str!("ptx/small.ptx");

/// A context of this test's own on `device`, and `add_one` of [`PTX`] loaded into it.
fn add_one(device: i32) -> (Handle, Handle) {
    let ctx = context(device);
    let module = load(PTX).unwrap();
    (ctx, function(module, "add_one"))
}

/// Launches `f` on one thread of one block with `params`.
fn launch1(f: Handle, stream: Handle, params: &mut [*mut c_void]) -> CUresult {
    launch(f, [1, 1, 1], [1, 1, 1], 0, stream, params)
}

/// Launches `store(address, value)`.
fn store(module: Handle, stream: Handle, mut address: u64, mut value: u32) -> CUresult {
    let f = function(module, "store");
    launch1(
        f,
        stream,
        &mut [
            &mut address as *mut u64 as *mut c_void,
            &mut value as *mut u32 as *mut c_void,
        ],
    )
}

/// Launches `f` on one thread with its parameters in `buffer`, claiming `size` bytes
/// (`CU_LAUNCH_PARAM_BUFFER_POINTER` = 1, `CU_LAUNCH_PARAM_BUFFER_SIZE` = 2, `END` = 0).
fn launch_extra(f: Handle, buffer: &mut [u8], mut size: usize) -> CUresult {
    let mut extra = [
        std::ptr::without_provenance_mut(1),
        buffer.as_mut_ptr() as *mut c_void,
        std::ptr::without_provenance_mut(2),
        &mut size as *mut usize as *mut c_void,
        null_mut(),
    ];
    unsafe {
        cuLaunchKernel(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            null_mut(),
            null_mut(),
            extra.as_mut_ptr(),
        )
    }
}

#[test]
fn a_kernel_stores_through_packed_parameters() {
    let ctx = context(0);
    let module = load(PTX).unwrap();
    let p = alloc(16);
    assert_eq!(store(module, null_mut(), p + 4, 42), CUDA_SUCCESS);
    check!(cuCtxSynchronize());
    assert_eq!(download(p, 2)[1], 42);
    // The same through CU_LAUNCH_PARAM_BUFFER_POINTER / SIZE.
    let mut buffer = [0u8; 12];
    buffer[..8].copy_from_slice(&p.to_le_bytes());
    buffer[8..].copy_from_slice(&7u32.to_le_bytes());
    let f = function(module, "store");
    assert_eq!(launch_extra(f, &mut buffer, 12), CUDA_SUCCESS);
    check!(cuCtxSynchronize());
    assert_eq!(download(p, 1), [7]);
    assert_eq!(launch_extra(f, &mut buffer, 16), CUDA_ERROR_INVALID_VALUE);
    check!(
        CUDA_ERROR_INVALID_VALUE,
        cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, null_mut(), null_mut(), null_mut())
    );
    let mut attribute = 0;
    check!(cuFuncGetAttribute(&mut attribute, 0, f));
    assert_eq!(attribute, 1024);
    check!(cuModuleUnload(module));
    assert_eq!(launch_extra(f, &mut buffer, 12), CUDA_ERROR_INVALID_HANDLE);
    check!(cuCtxDestroy_v2(ctx));
}

#[test]
fn out_of_bounds_is_an_asynchronous_sticky_illegal_address() {
    let ctx = context(0);
    let module = load(PTX).unwrap();
    let s = stream();
    let p = alloc(16);
    assert_eq!(
        store(module, s, p + 16, 1),
        CUDA_SUCCESS,
        "reported asynchronously"
    );
    check!(CUDA_ERROR_ILLEGAL_ADDRESS, cuStreamSynchronize(s));
    let mut q = 0;
    check!(CUDA_ERROR_ILLEGAL_ADDRESS, cuMemAlloc_v2(&mut q, 16));
    check!(CUDA_ERROR_ILLEGAL_ADDRESS, cuCtxSynchronize());
    assert_eq!(store(module, s, p, 1), CUDA_ERROR_ILLEGAL_ADDRESS);
    check!(cuCtxDestroy_v2(ctx));
}

/// Work queued behind a launch that fails does not run: here a store into another device's
/// memory (reachable: peer access is on) leaves it as it was.
#[test]
fn nothing_runs_after_a_sticky_error() {
    let other = context(1);
    let elsewhere = alloc(4);
    upload(elsewhere, &[5]);
    let ctx = context(0);
    check!(cuCtxEnablePeerAccess(other, 0));
    let module = load(PTX).unwrap();
    let s = stream();
    let p = alloc(16);
    assert_eq!(store(module, s, elsewhere, 6), CUDA_SUCCESS);
    check!(cuStreamSynchronize(s));
    let gate = hold_stream(s).unwrap();
    assert_eq!(store(module, s, p + 16, 1), CUDA_SUCCESS);
    assert_eq!(store(module, s, elsewhere, 9), CUDA_SUCCESS);
    gate.open();
    check!(CUDA_ERROR_ILLEGAL_ADDRESS, cuStreamSynchronize(s));
    check!(cuCtxSetCurrent(other));
    assert_eq!(download(elsewhere, 1), [6]);
    check!(cuCtxDestroy_v2(ctx));
    check!(cuCtxDestroy_v2(other));
}

#[test]
fn freed_memory_and_host_pointers_are_illegal_addresses() {
    for case in 0..2 {
        let ctx = context(0);
        let module = load(PTX).unwrap();
        let p = alloc(16);
        let address = if case == 0 {
            check!(cuMemFree_v2(p));
            p
        } else {
            let host = Box::new([0u32; 4]);
            Box::leak(host).as_ptr() as u64
        };
        assert_eq!(store(module, null_mut(), address, 1), CUDA_SUCCESS);
        check!(CUDA_ERROR_ILLEGAL_ADDRESS, cuCtxSynchronize());
        check!(cuCtxDestroy_v2(ctx));
    }
}

#[test]
fn misaligned_access_and_trap() {
    let ctx = context(0);
    let module = load(PTX).unwrap();
    let p = alloc(16);
    assert_eq!(store(module, null_mut(), p + 1, 1), CUDA_SUCCESS);
    check!(CUDA_ERROR_MISALIGNED_ADDRESS, cuCtxSynchronize());
    check!(cuCtxDestroy_v2(ctx));
    let ctx = context(0);
    let module = load(PTX).unwrap();
    assert_eq!(
        launch1(function(module, "fail"), null_mut(), &mut []),
        CUDA_SUCCESS
    );
    check!(CUDA_ERROR_LAUNCH_FAILED, cuCtxSynchronize());
    check!(cuCtxDestroy_v2(ctx));
}

#[test]
fn another_devices_memory_needs_peer_access() {
    let ctx0 = context(0);
    let on0 = alloc(16);
    let ctx1 = context(1);
    let module = load(PTX).unwrap();
    check!(cuCtxEnablePeerAccess(ctx0, 0));
    assert_eq!(store(module, null_mut(), on0, 5), CUDA_SUCCESS);
    check!(cuCtxSynchronize());
    check!(cuCtxSetCurrent(ctx0));
    assert_eq!(download(on0, 1), [5]);
    check!(cuCtxSetCurrent(ctx1));
    check!(cuCtxDisablePeerAccess(ctx0));
    assert_eq!(store(module, null_mut(), on0, 6), CUDA_SUCCESS);
    check!(CUDA_ERROR_ILLEGAL_ADDRESS, cuCtxSynchronize());
    check!(cuCtxDestroy_v2(ctx1));
    check!(cuCtxDestroy_v2(ctx0));
}

#[test]
fn launch_limits() {
    let (ctx, f) = add_one(1);
    let p = alloc(4);
    let mut address = p;
    let mut params = [&mut address as *mut u64 as *mut c_void];
    for (grid, block, shared) in [
        ([1, 1, 1], [1025, 1, 1], 0),
        ([1, 1, 1], [32, 32, 2], 0),
        ([1, 1, 1], [1, 1, 65], 0),
        ([1, 65536, 1], [1, 1, 1], 0),
        ([1 << 31, 1, 1], [1, 1, 1], 0),
        ([0, 1, 1], [1, 1, 1], 0),
        ([1, 1, 1], [1, 1, 1], 48 * 1024 + 1),
    ] {
        assert_eq!(
            launch(f, grid, block, shared, null_mut(), &mut params),
            CUDA_ERROR_INVALID_VALUE,
            "grid {grid:?} block {block:?} shared {shared}"
        );
    }
    // None of that made the context unusable, and each limit itself is allowed.
    upload(p, &[0]);
    assert_eq!(
        launch(f, [1, 1, 1], [1, 1, 1], 48 * 1024, null_mut(), &mut params),
        CUDA_SUCCESS
    );
    check!(cuCtxSynchronize());
    assert_eq!(download(p, 1), [1]);
    let store = function(load(PTX).unwrap(), "store");
    let mut value = 5u32;
    let mut params = [
        &mut address as *mut u64 as *mut c_void,
        &mut value as *mut u32 as *mut c_void,
    ];
    for block in [[1024, 1, 1], [32, 32, 1], [1, 16, 64]] {
        let got = launch(store, [1, 1, 1], block, 0, null_mut(), &mut params);
        assert_eq!(got, CUDA_SUCCESS, "block {block:?}");
    }
    check!(cuCtxSynchronize());
    assert_eq!(download(p, 1), [5]);
    check!(cuCtxDestroy_v2(ctx));
}

#[test]
fn module_loading_errors() {
    let ctx = context(1);
    let module = load(PTX).unwrap();
    let name = CString::new("missing").unwrap();
    let mut f = null_mut();
    check!(
        CUDA_ERROR_NOT_FOUND,
        cuModuleGetFunction(&mut f, module, name.as_ptr())
    );
    let newer = PTX.replace(".version 8.0", ".version 9.1");
    assert_eq!(
        load(&newer).unwrap_err(),
        CUDA_ERROR_UNSUPPORTED_PTX_VERSION
    );
    let broken = PTX.replace("trap;", "frobnicate.b32 %r1;");
    assert_eq!(load(&broken).unwrap_err(), CUDA_ERROR_INVALID_PTX);
    // The error log buffer receives the message.
    let text = CString::new(broken).unwrap();
    let mut log = [0 as c_char; 256];
    let mut options = [5, 6];
    let mut values = [log.as_mut_ptr() as *mut c_void, 256usize as *mut c_void];
    let mut m = null_mut();
    check!(
        CUDA_ERROR_INVALID_PTX,
        cuModuleLoadDataEx(
            &mut m,
            text.as_ptr() as *const c_void,
            2,
            options.as_mut_ptr(),
            values.as_mut_ptr()
        )
    );
    let message = unsafe { CStr::from_ptr(log.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    // It names the module by its first kernel, and the line.
    assert!(message.starts_with("module of `store`: "), "{message}");
    assert!(message.contains("line "), "{message}");
    check!(cuCtxDestroy_v2(ctx));
}

#[test]
fn a_captured_kernel_runs_at_each_replay() {
    let (ctx, f) = add_one(0);
    let s = stream();
    let p = alloc(4);
    upload(p, &[0]);
    let mut address = p;
    check!(cuStreamBeginCapture_v2(s, 0));
    assert_eq!(
        launch1(f, s, &mut [&mut address as *mut u64 as *mut c_void]),
        CUDA_SUCCESS
    );
    // Parameter values are captured at capture time.
    address = 0;
    let mut graph = null_mut();
    check!(cuStreamEndCapture(s, &mut graph));
    let exec = instantiate(graph);
    assert_eq!(download(p, 1), [0]);
    check!(cuGraphLaunch(exec, s));
    check!(cuGraphLaunch(exec, s));
    check!(cuStreamSynchronize(s));
    assert_eq!(download(p, 1), [2]);
    let _ = address;
    check!(cuCtxDestroy_v2(ctx));
}

#[test]
fn launches_on_several_threads_at_once() {
    check!(cuInit(0));
    let threads: Vec<_> = (0..3)
        .map(|t| {
            std::thread::spawn(move || {
                let ctx = context(t % 2);
                let module = load(PTX).unwrap();
                let f = function(module, "add_one");
                let s = stream();
                let p = alloc(4);
                upload(p, &[0]);
                let mut address = p;
                for _ in 0..20 {
                    assert_eq!(
                        launch1(f, s, &mut [&mut address as *mut u64 as *mut c_void]),
                        CUDA_SUCCESS
                    );
                }
                check!(cuStreamSynchronize(s));
                assert_eq!(download(p, 1), [20]);
                check!(cuCtxDestroy_v2(ctx));
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
}

/// A module-scope variable with an initialiser, read by a kernel that bumps it.
const COUNTER_PTX: &str = "
.version 8.0
.target sm_75
.address_size 64
.global .align 4 .u32 counter[2] = {40, 7};

.visible .entry bump(.param .u64 bump_param_0)
{
	.reg .b32 	%r<3>;
	.reg .b64 	%rd<4>;
	ld.param.u64 	%rd1, [bump_param_0];
	cvta.to.global.u64 	%rd2, %rd1;
	mov.u64 	%rd3, counter;
	ld.global.u32 	%r1, [%rd3];
	add.s32 	%r2, %r1, 2;
	st.global.u32 	[%rd3], %r2;
	st.global.u32 	[%rd2], %r2;
	ret;
}
";

#[test]
fn module_variables_are_initialised_device_memory_of_the_module() {
    let ctx = context(0);
    let module = load(COUNTER_PTX).unwrap();
    let (mut address, mut size) = (0u64, 0usize);
    let name = CString::new("counter").unwrap();
    check!(cuModuleGetGlobal_v2(
        &mut address,
        &mut size,
        module,
        name.as_ptr()
    ));
    assert_eq!(size, 8);
    assert_eq!(download(address, 2), [40, 7]);
    let out = alloc(4);
    let f = function(module, "bump");
    for expected in [42, 44] {
        let mut p = out;
        assert_eq!(
            launch1(f, null_mut(), &mut [&mut p as *mut u64 as *mut c_void]),
            CUDA_SUCCESS
        );
        check!(cuCtxSynchronize());
        assert_eq!(download(out, 1), [expected]);
    }
    assert_eq!(download(address, 2), [44, 7]);
    let missing = CString::new("nothing").unwrap();
    check!(
        CUDA_ERROR_NOT_FOUND,
        cuModuleGetGlobal_v2(&mut address, &mut size, module, missing.as_ptr())
    );
    // Each load has its own copy.
    let again = load(COUNTER_PTX).unwrap();
    let mut other = 0u64;
    check!(cuModuleGetGlobal_v2(
        &mut other,
        null_mut(),
        again,
        name.as_ptr()
    ));
    assert_ne!(other, address);
    assert_eq!(download(other, 2), [40, 7]);
    check!(cuModuleUnload(module));
    // Unloading frees the module's variables.
    check!(CUDA_ERROR_INVALID_VALUE, cuMemFree_v2(address));
    check!(cuCtxDestroy_v2(ctx));
}
