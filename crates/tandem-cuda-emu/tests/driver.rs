//! The driver API without kernels, in the default configuration (2 devices, CUDA 13.0).
//! Each test makes its own context.

mod common;

use std::ffi::{c_char, c_void, CStr};
use std::ptr::{null, null_mut};

use common::*;

#[test]
fn devices_report_an_h200s_name_and_limits() {
    check!(cuInit(0));
    let mut n = 0;
    check!(cuDeviceGetCount(&mut n));
    assert_eq!(n, 2);
    let mut version = 0;
    check!(cuDriverGetVersion(&mut version));
    assert_eq!(version, 13000);
    let mut v = 0;
    check!(
        CUDA_ERROR_INVALID_VALUE,
        cuDeviceGetAttribute(&mut v, 9999, 0)
    );
    check!(
        CUDA_ERROR_INVALID_DEVICE,
        cuDeviceGetAttribute(&mut v, 1, 2)
    );
    let mut name = [0 as c_char; 64];
    check!(cuDeviceGetName(name.as_mut_ptr(), 64, 1));
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_str().unwrap();
    assert!(name.contains("H200"), "{name}");
    let mut total = 0;
    check!(cuDeviceTotalMem_v2(&mut total, 0));
    assert_eq!(total, 16 << 30);
}

/// Every attribute the stand-in answers has its H100/H200-like value, found by its name in
/// CUDA's `CUdevice_attribute` (cust_raw's bindings of `cuda.h`), so that a number taken for
/// another attribute shows; the others are refused.
#[test]
fn attributes_are_found_by_their_cuda_names() {
    const HOPPER: &[(&str, i32)] = &[
        ("MAX_THREADS_PER_BLOCK", 1024),
        ("MAX_BLOCK_DIM_X", 1024),
        ("MAX_BLOCK_DIM_Y", 1024),
        ("MAX_BLOCK_DIM_Z", 64),
        ("MAX_GRID_DIM_X", i32::MAX),
        ("MAX_GRID_DIM_Y", 65535),
        ("MAX_GRID_DIM_Z", 65535),
        ("MAX_SHARED_MEMORY_PER_BLOCK", 48 * 1024),
        ("TOTAL_CONSTANT_MEMORY", 64 * 1024),
        ("WARP_SIZE", 32),
        ("MAX_PITCH", i32::MAX),
        ("MAX_REGISTERS_PER_BLOCK", 64 * 1024),
        ("CLOCK_RATE", 1_980_000),
        ("TEXTURE_ALIGNMENT", 512),
        ("GPU_OVERLAP", 1),
        ("MULTIPROCESSOR_COUNT", 132),
        ("KERNEL_EXEC_TIMEOUT", 0),
        ("INTEGRATED", 0),
        ("CAN_MAP_HOST_MEMORY", 1),
        ("COMPUTE_MODE", 0),
        ("SURFACE_ALIGNMENT", 512),
        ("CONCURRENT_KERNELS", 1),
        ("ECC_ENABLED", 1),
        ("PCI_BUS_ID", 0),
        ("PCI_DEVICE_ID", 0),
        ("TCC_DRIVER", 0),
        ("MEMORY_CLOCK_RATE", 2_619_000),
        ("GLOBAL_MEMORY_BUS_WIDTH", 6144),
        ("L2_CACHE_SIZE", 50 << 20),
        ("MAX_THREADS_PER_MULTIPROCESSOR", 2048),
        ("ASYNC_ENGINE_COUNT", 3),
        ("UNIFIED_ADDRESSING", 1),
        ("PCI_DOMAIN_ID", 0),
        ("COMPUTE_CAPABILITY_MAJOR", 9),
        ("COMPUTE_CAPABILITY_MINOR", 0),
        ("STREAM_PRIORITIES_SUPPORTED", 1),
        ("GLOBAL_L1_CACHE_SUPPORTED", 1),
        ("LOCAL_L1_CACHE_SUPPORTED", 1),
        ("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", 228 * 1024),
        ("MAX_REGISTERS_PER_MULTIPROCESSOR", 64 * 1024),
        ("MANAGED_MEMORY", 1),
        ("MULTI_GPU_BOARD", 0),
        ("MULTI_GPU_BOARD_GROUP_ID", 0),
        ("HOST_NATIVE_ATOMIC_SUPPORTED", 0),
        ("SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO", 2),
        ("PAGEABLE_MEMORY_ACCESS", 0),
        ("CONCURRENT_MANAGED_ACCESS", 1),
        ("COMPUTE_PREEMPTION_SUPPORTED", 1),
        ("COOPERATIVE_LAUNCH", 1),
        ("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", 227 * 1024),
        ("MAX_BLOCKS_PER_MULTIPROCESSOR", 32),
        ("RESERVED_SHARED_MEMORY_PER_BLOCK", 1024),
        ("MEMORY_POOLS_SUPPORTED", 1),
    ];
    let bindings = bindings();
    let numbered = |name: &str| -> i32 {
        let line = format!("CU_DEVICE_ATTRIBUTE_{name} = ");
        let at = bindings
            .find(&line)
            .unwrap_or_else(|| panic!("{name} is not in cuda.h"));
        let rest = &bindings[at + line.len()..];
        rest[..rest.find(',').expect("a comma after the value")]
            .parse()
            .expect("a number")
    };
    check!(cuInit(0));
    let mut answered = 0;
    for &(name, value) in HOPPER {
        let mut got = -1;
        check!(cuDeviceGetAttribute(&mut got, numbered(name), 0));
        assert_eq!(got, value, "{name}");
        answered += 1;
    }
    // Nothing else: an attribute the stand-in does not model is refused, not made up.
    let mut known = 0;
    for attribute in 1..numbered("MAX") {
        let mut v = 0;
        // SAFETY: a pointer to a local the driver writes one int through.
        if unsafe { cuDeviceGetAttribute(&mut v, attribute, 0) } == CUDA_SUCCESS {
            known += 1;
        }
    }
    assert_eq!(known, answered);
}

#[test]
fn error_names_and_strings_are_static_c_strings() {
    let mut p: *const c_char = null();
    check!(cuGetErrorName(700, &mut p));
    assert_eq!(
        unsafe { CStr::from_ptr(p) }.to_str().unwrap(),
        "CUDA_ERROR_ILLEGAL_ADDRESS"
    );
    check!(cuGetErrorString(700, &mut p));
    assert_eq!(
        unsafe { CStr::from_ptr(p) }.to_str().unwrap(),
        "an illegal memory access was encountered"
    );
    check!(CUDA_ERROR_INVALID_VALUE, cuGetErrorName(46, &mut p));
    assert!(p.is_null());
}

#[test]
fn context_calls_without_a_current_context_fail() {
    check!(cuInit(0));
    std::thread::spawn(|| {
        let mut p = 0;
        check!(CUDA_ERROR_INVALID_CONTEXT, cuMemAlloc_v2(&mut p, 16));
        check!(CUDA_ERROR_INVALID_CONTEXT, cuCtxSynchronize());
        let mut s = null_mut();
        check!(CUDA_ERROR_INVALID_CONTEXT, cuStreamCreate(&mut s, 0));
    })
    .join()
    .unwrap();
}

#[test]
fn primary_contexts_are_reference_counted() {
    check!(cuInit(0));
    let (mut a, mut b) = (null_mut(), null_mut());
    check!(cuDevicePrimaryCtxRetain(&mut a, 1));
    check!(cuDevicePrimaryCtxRetain(&mut b, 1));
    assert_eq!(a, b);
    let (mut flags, mut active) = (0, 0);
    check!(cuDevicePrimaryCtxRelease_v2(1));
    check!(cuDevicePrimaryCtxGetState(1, &mut flags, &mut active));
    assert_eq!(active, 1);
    check!(cuDevicePrimaryCtxRelease_v2(1));
    check!(cuDevicePrimaryCtxGetState(1, &mut flags, &mut active));
    assert_eq!(active, 0);
    check!(CUDA_ERROR_INVALID_CONTEXT, cuCtxSetCurrent(a));
}

#[test]
fn allocation_rules() {
    let ctx = context(0);
    let mut p = 0;
    check!(CUDA_ERROR_INVALID_VALUE, cuMemAlloc_v2(&mut p, 0));
    check!(
        CUDA_ERROR_OUT_OF_MEMORY,
        cuMemAlloc_v2(&mut p, (16 << 30) + 1)
    );
    let a = alloc(64);
    let b = alloc(64);
    assert!(
        b >= a + 64 + (1 << 20),
        "allocations are separated by a gap"
    );
    assert!(a >= 1 << 52, "device addresses are not host addresses");
    check!(CUDA_ERROR_INVALID_VALUE, cuMemFree_v2(a + 4));
    check!(cuMemFree_v2(a));
    check!(CUDA_ERROR_INVALID_VALUE, cuMemFree_v2(a));
    let (mut free, mut total) = (0, 0);
    check!(cuMemGetInfo_v2(&mut free, &mut total));
    assert!(free <= total - 64, "the live allocation counts");
    check!(cuMemFree_v2(b));
    check!(cuCtxDestroy_v2(ctx));
}

#[test]
fn fresh_memory_is_nan() {
    let ctx = context(0);
    let p = alloc(8);
    let mut out = [0f32; 2];
    check!(cuMemcpyDtoH_v2(out.as_mut_ptr() as *mut c_void, p, 8));
    assert!(out.iter().all(|v| v.is_nan()));
    assert_eq!(download(p, 2), [u32::MAX; 2]);
    check!(cuCtxDestroy_v2(ctx));
}

#[test]
fn copies_and_memsets_check_their_device_ranges() {
    let ctx = context(0);
    let p = alloc(16);
    let values = [1u32, 2, 3, 4, 5];
    check!(
        CUDA_ERROR_INVALID_VALUE,
        cuMemcpyHtoD_v2(p, values.as_ptr() as *const c_void, 20)
    );
    check!(
        CUDA_ERROR_INVALID_VALUE,
        cuMemcpyHtoD_v2(p + 4, values.as_ptr() as *const c_void, 16)
    );
    check!(CUDA_ERROR_INVALID_VALUE, cuMemsetD32_v2(p, 7, 5));
    check!(cuMemsetD32_v2(p, 7, 4));
    assert_eq!(download(p, 4), [7; 4]);
    check!(cuMemsetD8_v2(p + 1, 0xAB, 2));
    assert_eq!(download(p, 1), [0x00AB_AB07]);
    let q = alloc(16);
    check!(cuMemcpyDtoD_v2(q, p, 16));
    assert_eq!(download(q, 4), download(p, 4));
    check!(cuMemFree_v2(q));
    let mut out = [0u32; 4];
    check!(
        CUDA_ERROR_INVALID_VALUE,
        cuMemcpyDtoH_v2(out.as_mut_ptr() as *mut c_void, q, 16)
    );
    check!(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoD_v2(q, p, 16));
    check!(cuCtxDestroy_v2(ctx));
}

#[test]
fn copies_to_pinned_memory_are_deferred_until_synchronised() {
    let ctx = context(0);
    let s = stream();
    let p = alloc(16);
    upload(p, &[1, 2, 3, 4]);
    let host = pinned(16);
    unsafe { std::ptr::write_bytes(host, 0, 16) };
    let gate = hold_stream(s).unwrap();
    check!(cuMemcpyDtoHAsync_v2(host as *mut c_void, p, 16, s));
    check!(CUDA_ERROR_NOT_READY, cuStreamQuery(s));
    let before = unsafe { std::slice::from_raw_parts(host as *const u32, 4) }.to_vec();
    assert_eq!(
        before, [0; 4],
        "read before synchronising: still the old bytes"
    );
    gate.open();
    check!(cuStreamSynchronize(s));
    let after = unsafe { std::slice::from_raw_parts(host as *const u32, 4) }.to_vec();
    assert_eq!(after, [1, 2, 3, 4]);
    // From pageable memory the source is snapshot at the call.
    let gate = hold_stream(s).unwrap();
    let mut pageable = [9u32; 4];
    check!(cuMemcpyHtoDAsync_v2(
        p,
        pageable.as_ptr() as *const c_void,
        16,
        s
    ));
    pageable.fill(5);
    gate.open();
    check!(cuStreamSynchronize(s));
    assert_eq!(download(p, 4), [9; 4]);
    // Freeing pinned memory waits for the copies queued into it.
    let gate = hold_stream(s).unwrap();
    check!(cuMemcpyDtoHAsync_v2(host as *mut c_void, p, 16, s));
    let address = host as usize;
    assert!(waits_for_gate(gate, || check!(cuMemFreeHost(
        address as *mut c_void
    ))));
    check!(CUDA_ERROR_INVALID_VALUE, cuMemFreeHost(host as *mut c_void));
    check!(cuCtxDestroy_v2(ctx));
}

#[test]
fn two_streams_are_ordered_by_an_event() {
    let ctx = context(0);
    let (a, b) = (stream(), stream());
    let src = alloc(16);
    let dst = alloc(16);
    upload(dst, &[0; 4]);
    let staging = pinned(16);
    unsafe { std::ptr::copy_nonoverlapping([4u32, 3, 2, 1].as_ptr() as *const u8, staging, 16) };
    let mut event = null_mut();
    check!(cuEventCreate(&mut event, 0));
    let gate = hold_stream(a).unwrap();
    check!(cuMemcpyHtoDAsync_v2(src, staging as *const c_void, 16, a));
    check!(cuEventRecord(event, a));
    check!(cuStreamWaitEvent(b, event, 0));
    check!(cuMemcpyDtoDAsync_v2(dst, src, 16, b));
    std::thread::sleep(std::time::Duration::from_millis(20));
    check!(CUDA_ERROR_NOT_READY, cuStreamQuery(b));
    check!(CUDA_ERROR_NOT_READY, cuEventQuery(event));
    gate.open();
    check!(cuStreamSynchronize(b));
    check!(cuEventQuery(event));
    assert_eq!(download(dst, 4), [4, 3, 2, 1]);
    // Recorded again: a wait is for the new record, not the one that completed.
    let gate = hold_stream(a).unwrap();
    check!(cuEventRecord(event, a));
    check!(cuStreamWaitEvent(b, event, 0));
    check!(cuMemsetD32Async(dst, 0, 4, b));
    std::thread::sleep(std::time::Duration::from_millis(20));
    check!(CUDA_ERROR_NOT_READY, cuStreamQuery(b));
    check!(CUDA_ERROR_NOT_READY, cuEventQuery(event));
    gate.open();
    check!(cuEventSynchronize(event));
    check!(cuStreamSynchronize(b));
    check!(cuStreamQuery(b));
    assert_eq!(download(dst, 4), [0; 4]);
    let mut end = null_mut();
    check!(cuEventCreate(&mut end, 0));
    check!(cuEventRecord(end, a));
    check!(cuEventSynchronize(end));
    let mut ms = -1.0;
    check!(cuEventElapsedTime(&mut ms, event, end));
    assert!(ms >= 0.0);
    check!(cuEventDestroy_v2(event));
    check!(CUDA_ERROR_INVALID_HANDLE, cuEventQuery(event));
    check!(CUDA_ERROR_INVALID_HANDLE, cuEventRecord(event, a));
    check!(cuStreamDestroy_v2(b));
    check!(CUDA_ERROR_INVALID_HANDLE, cuStreamSynchronize(b));
    check!(CUDA_ERROR_INVALID_HANDLE, cuStreamDestroy_v2(b));
    check!(cuCtxDestroy_v2(ctx));
}

/// Captured work runs, and is counted in the statistics, at each launch of its graph, never
/// while it is captured.
#[test]
fn captured_work_replays_at_each_graph_launch() {
    let ctx = context(0);
    let s = stream();
    let p = alloc(16);
    let q = alloc(16);
    let host = pinned(16);
    check!(cuStreamBeginCapture_v2(s, 0));
    let mut status = 0;
    check!(cuStreamIsCapturing(s, &mut status));
    assert_eq!(status, 1);
    check!(cuMemsetD32Async(p, 6, 4, s));
    check!(cuMemcpyDtoHAsync_v2(host as *mut c_void, p, 16, s));
    check!(cuMemcpyDtoDAsync_v2(q, p, 16, s));
    check!(
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        cuStreamSynchronize(s)
    );
    let mut graph = null_mut();
    check!(cuStreamEndCapture(s, &mut graph));
    // Nothing ran while capturing, and nothing counted.
    assert_eq!(download(p, 1), [u32::MAX]);
    let counts = |key: &str| {
        let json = tandem_cuda_emu::stats::to_json(2, 13000);
        let value: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
        value["streams"][(s as u64).to_string()][key]
            .as_u64()
            .unwrap_or(0)
    };
    assert_eq!(
        counts("bytes_dtoh") + counts("bytes_dtod") + counts("bytes_memset"),
        0
    );
    let exec = instantiate(graph);
    for _ in 0..2 {
        upload(p, &[0; 4]);
        unsafe { std::ptr::write_bytes(host, 0, 16) };
        check!(cuGraphLaunch(exec, s));
        check!(cuStreamSynchronize(s));
        assert_eq!(download(p, 4), [6; 4]);
        assert_eq!(download(q, 4), [6; 4]);
        assert_eq!(
            unsafe { std::slice::from_raw_parts(host as *const u32, 4) },
            [6; 4]
        );
    }
    for (key, each) in [
        ("graph_launches", 1),
        ("bytes_dtoh", 16),
        ("bytes_dtod", 16),
        ("bytes_memset", 16),
        ("graph_copies", 2),
        ("graph_memsets", 1),
    ] {
        assert_eq!(counts(key), 2 * each, "{key}");
    }
    assert_eq!(counts("bytes_peer") + counts("kernel_launches"), 0);
    // The host's calls on the stream: three captured, two graph launches.
    assert_eq!(counts("stream_calls"), 5);
    check!(cuGraphExecDestroy(exec));
    check!(CUDA_ERROR_INVALID_HANDLE, cuGraphLaunch(exec, s));
    check!(cuGraphDestroy(graph));
    check!(cuCtxDestroy_v2(ctx));
}

#[test]
fn peer_access_rules() {
    let ctx0 = context(0);
    let ctx1 = context(1);
    let mut can = -1;
    check!(cuDeviceCanAccessPeer(&mut can, 0, 1));
    assert_eq!(can, 1);
    check!(cuDeviceCanAccessPeer(&mut can, 0, 0));
    assert_eq!(can, 0);
    // Current: ctx1 (device 1).
    check!(
        CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
        cuCtxDisablePeerAccess(ctx0)
    );
    check!(cuCtxEnablePeerAccess(ctx0, 0));
    check!(
        CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        cuCtxEnablePeerAccess(ctx0, 0)
    );
    check!(
        CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
        cuCtxEnablePeerAccess(ctx1, 0)
    );
    check!(cuCtxDisablePeerAccess(ctx0));
    // Copies between devices need no peer access.
    let on1 = alloc(16);
    upload(on1, &[8; 4]);
    check!(cuCtxSetCurrent(ctx0));
    let on0 = alloc(16);
    check!(cuMemcpyPeer(on0, ctx0, on1, ctx1, 16));
    assert_eq!(download(on0, 4), [8; 4]);
    check!(cuCtxDestroy_v2(ctx1));
    check!(cuCtxDestroy_v2(ctx0));
}

#[test]
fn handles_are_validated() {
    let ctx = context(1);
    let bogus = 0xdead_beef_usize as Handle;
    check!(CUDA_ERROR_INVALID_HANDLE, cuStreamSynchronize(bogus));
    check!(CUDA_ERROR_INVALID_HANDLE, cuEventSynchronize(bogus));
    check!(CUDA_ERROR_INVALID_HANDLE, cuModuleUnload(bogus));
    check!(CUDA_ERROR_INVALID_HANDLE, cuGraphDestroy(bogus));
    check!(CUDA_ERROR_INVALID_CONTEXT, cuCtxSetCurrent(bogus));
    // A stream handle is not an event handle.
    let s = stream();
    check!(CUDA_ERROR_INVALID_HANDLE, cuEventQuery(s));
    check!(cuCtxDestroy_v2(ctx));
    check!(CUDA_ERROR_INVALID_HANDLE, cuStreamQuery(s));
    check!(CUDA_ERROR_NOT_SUPPORTED, cuMemAllocManaged());
}

/// A null pointer where the driver writes a result or reads host memory is an invalid value,
/// as the real driver answers, never a write through it.
#[test]
fn null_pointers_are_invalid_values() {
    let ctx = context(0);
    check!(CUDA_ERROR_INVALID_VALUE, cuDeviceGetCount(null_mut()));
    check!(CUDA_ERROR_INVALID_VALUE, cuDriverGetVersion(null_mut()));
    check!(
        CUDA_ERROR_INVALID_VALUE,
        cuDeviceGetAttribute(null_mut(), 1, 0)
    );
    check!(CUDA_ERROR_INVALID_VALUE, cuMemAlloc_v2(null_mut(), 16));
    check!(CUDA_ERROR_INVALID_VALUE, cuStreamCreate(null_mut(), 0));
    check!(CUDA_ERROR_INVALID_VALUE, cuEventCreate(null_mut(), 0));
    let p = alloc(16);
    check!(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD_v2(p, null(), 16));
    check!(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH_v2(null_mut(), p, 16));
    check!(cuCtxDestroy_v2(ctx));
}

#[test]
fn streams_on_several_threads_at_once() {
    check!(cuInit(0));
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            std::thread::spawn(move || {
                let ctx = context((t % 2) as i32);
                let s = stream();
                let p = alloc(4096);
                let q = alloc(4096);
                for round in 0..50u32 {
                    let values = vec![t * 1000 + round; 1024];
                    check!(cuMemcpyHtoDAsync_v2(
                        p,
                        values.as_ptr() as *const c_void,
                        4096,
                        s
                    ));
                    check!(cuMemcpyDtoDAsync_v2(q, p, 4096, s));
                    let mut out = vec![0u32; 1024];
                    check!(cuMemcpyDtoHAsync_v2(
                        out.as_mut_ptr() as *mut c_void,
                        q,
                        4096,
                        s
                    ));
                    assert_eq!(out, values);
                }
                check!(cuStreamSynchronize(s));
                check!(cuCtxDestroy_v2(ctx));
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
}

#[test]
fn statistics_are_json() {
    let ctx = context(0);
    let s = stream();
    let p = alloc(32);
    let values = [1u32; 8];
    check!(cuMemcpyHtoDAsync_v2(
        p,
        values.as_ptr() as *const c_void,
        32,
        s
    ));
    // Each kind of copy and a memset, counted by kind and by byte on the stream that ran it.
    let q = alloc(32);
    check!(cuMemcpyDtoDAsync_v2(q, p, 24, s));
    check!(cuMemsetD32Async(q, 0, 5, s));
    check!(cuMemsetD8Async(q, 0, 3, s));
    let mut back = [0u32; 4];
    check!(cuMemcpyDtoHAsync_v2(
        back.as_mut_ptr() as *mut c_void,
        q,
        12,
        s
    ));
    let mut other = null_mut();
    check!(cuDevicePrimaryCtxRetain(&mut other, 1));
    check!(cuCtxSetCurrent(other));
    let on1 = alloc(16);
    check!(cuCtxSetCurrent(ctx));
    check!(cuMemcpyDtoDAsync_v2(on1, p, 8, s));
    check!(cuStreamSynchronize(s));
    let json = tandem_cuda_emu::stats::to_json(2, 13000);
    let value: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    assert_eq!(value["devices"], 2);
    assert_eq!(value["driver_version"], 13000);
    assert!(value["totals"]["bytes_htod"].as_u64().unwrap() >= 32);
    assert!(value["totals"]["allocations"].as_u64().unwrap() >= 1);
    let mine = &value["streams"][(s as u64).to_string()];
    for (counter, expected) in [
        ("bytes_htod", 32),
        ("bytes_dtod", 24),
        ("bytes_memset", 23),
        ("bytes_dtoh", 12),
        ("bytes_peer", 8),
        ("stream_calls", 6),
        ("stream_synchronizations", 1),
        ("kernel_launches", 0),
    ] {
        assert_eq!(mine[counter], expected, "{counter}");
    }
    check!(cuDevicePrimaryCtxRelease_v2(1));
    check!(cuCtxDestroy_v2(ctx));
}

#[test]
fn the_statistics_file_names_its_process() {
    check!(cuInit(0));
    let dir = std::env::temp_dir().join(format!("tandem-emu-stats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pattern = dir.join("stats-%p.json");
    tandem_cuda_emu::stats::write(pattern.to_str().unwrap(), 2, 13000);
    let written = dir.join(format!("stats-{}.json", std::process::id()));
    let text = std::fs::read_to_string(&written).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(value["devices"], 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The driver a PTX ISA version needs: the CUDA release that brought it, row for row as the
/// PTX ISA's release history lists them, and no driver for a version it does not list.
#[test]
fn each_ptx_isa_version_needs_the_release_that_brought_it() {
    const HISTORY: &str = "1.0 1.0, 1.1 1.1, 1.2 2.0, 1.3 2.1, 1.4 2.2, 2.0 3.0, 2.1 3.1, \
        2.2 3.2, 2.3 4.0, 3.0 4.1, 3.1 5.0, 3.2 5.5, 4.0 6.0, 4.1 6.5, 4.2 7.0, 4.3 7.5, \
        5.0 8.0, 6.0 9.0, 6.1 9.1, 6.2 9.2, 6.3 10.0, 6.4 10.1, 6.5 10.2, 7.0 11.0, 7.1 11.1, \
        7.2 11.2, 7.3 11.3, 7.4 11.4, 7.5 11.5, 7.6 11.6, 7.7 11.7, 7.8 11.8, 8.0 12.0, \
        8.1 12.1, 8.2 12.2, 8.3 12.3, 8.4 12.4, 8.5 12.5, 8.6 12.7, 8.7 12.8, 8.8 12.9, \
        9.0 13.0, 9.1 13.1";
    let pair = |text: &str| -> (u32, u32) {
        let (major, minor) = text.split_once('.').expect("major.minor");
        (
            major.parse().expect("a major"),
            minor.parse().expect("a minor"),
        )
    };
    let mut listed = Vec::new();
    for row in HISTORY.split(", ") {
        let (isa, cuda) = row.split_once(' ').expect("a PTX ISA and a CUDA version");
        let (isa, (major, minor)) = (pair(isa), pair(cuda));
        assert_eq!(
            isa_min_driver(isa),
            1000 * major + 10 * minor,
            "PTX ISA {isa:?}"
        );
        listed.push(isa);
    }
    for major in 0..12 {
        for minor in 0..12 {
            if !listed.contains(&(major, minor)) {
                assert_eq!(isa_min_driver((major, minor)), u32::MAX, "{major}.{minor}");
            }
        }
    }
}

/// Destroying a context takes its handles and memory and nothing of another's: the other
/// stays current, and its graphs, streams and memory still work.
#[test]
fn destroying_a_context_leaves_the_others() {
    let graph_of = |p: u64, s: Handle| {
        let mut graph = null_mut();
        check!(cuStreamBeginCapture_v2(s, 0));
        check!(cuMemsetD32Async(p, 9, 4, s));
        check!(cuStreamEndCapture(s, &mut graph));
        instantiate(graph)
    };
    let small = include_str!("ptx/small.ptx");
    let doomed = context(0);
    let (doomed_stream, doomed_memory) = (stream(), alloc(16));
    let doomed_exec = graph_of(doomed_memory, doomed_stream);
    let doomed_module = load(small).unwrap();
    let kept = context(1);
    let (s, p) = (stream(), alloc(16));
    let exec = graph_of(p, s);
    let module = load(small).unwrap();
    let mut graph = null_mut();
    check!(cuStreamBeginCapture_v2(s, 0));
    check!(cuMemsetD32Async(p, 1, 4, s));
    check!(cuStreamEndCapture(s, &mut graph));
    check!(cuCtxDestroy_v2(doomed));
    check!(CUDA_ERROR_INVALID_HANDLE, cuModuleUnload(doomed_module));
    function(module, "store");
    check!(cuGraphDestroy(graph));
    let mut current = null_mut();
    check!(cuCtxGetCurrent(&mut current));
    assert_eq!(current, kept);
    check!(cuGraphLaunch(exec, s));
    check!(cuStreamSynchronize(s));
    assert_eq!(download(p, 4), [9; 4]);
    check!(CUDA_ERROR_INVALID_HANDLE, cuGraphLaunch(doomed_exec, s));
    check!(CUDA_ERROR_INVALID_HANDLE, cuStreamQuery(doomed_stream));
    check!(CUDA_ERROR_INVALID_VALUE, cuMemFree_v2(doomed_memory));
    check!(cuCtxDestroy_v2(kept));
}

/// Synchronising a context, and freeing its memory, wait for every stream of the context.
#[test]
fn a_context_waits_for_all_its_streams() {
    let ctx = context(0);
    let (s, p) = (stream(), alloc(16));
    for wait in ["cuCtxSynchronize", "cuMemFree"] {
        let gate = hold_stream(s).unwrap();
        check!(cuMemsetD32Async(p, 3, 4, s));
        let current = ctx as usize;
        let waited = waits_for_gate(gate, || {
            check!(cuCtxSetCurrent(current as Handle));
            match wait {
                "cuCtxSynchronize" => check!(cuCtxSynchronize()),
                _ => check!(cuMemFree_v2(p)),
            }
        });
        assert!(waited, "{wait}");
    }
    check!(cuCtxDestroy_v2(ctx));
}

/// Each thread has a stack of contexts: creating one pushes it, popping returns the top and
/// makes the one below current, and an empty stack has nothing to pop.
#[test]
fn contexts_stack_per_thread() {
    std::thread::spawn(|| {
        let first = context(0);
        let second = context(1);
        let current = || {
            let mut ctx = null_mut();
            check!(cuCtxGetCurrent(&mut ctx));
            ctx
        };
        assert_eq!(current(), second);
        let mut popped = null_mut();
        check!(cuCtxPopCurrent_v2(&mut popped));
        assert_eq!((popped, current()), (second, first));
        check!(cuCtxPushCurrent_v2(second));
        assert_eq!(current(), second);
        check!(cuCtxPopCurrent_v2(&mut popped));
        check!(cuCtxPopCurrent_v2(&mut popped));
        assert_eq!((popped, current()), (first, null_mut()));
        check!(CUDA_ERROR_INVALID_CONTEXT, cuCtxPopCurrent_v2(&mut popped));
        check!(cuCtxDestroy_v2(first));
        check!(cuCtxDestroy_v2(second));
    })
    .join()
    .unwrap();
}

/// Each kind of node a graph holds (a kernel, a copy in, a copy to another device, and a
/// memset inside a graph launched within the capture) is counted, by kind and by byte, at
/// each launch of the graph.
#[test]
fn each_kind_of_graph_node_is_counted_at_each_launch() {
    let ctx = context(0);
    let add_one = function(load(include_str!("ptx/small.ptx")).unwrap(), "add_one");
    let mut other = null_mut();
    check!(cuDevicePrimaryCtxRetain(&mut other, 1));
    check!(cuCtxSetCurrent(other));
    let on1 = alloc(8);
    check!(cuCtxSetCurrent(ctx));
    let s = stream();
    let p = alloc(8);
    let host = pinned(8);
    unsafe { std::ptr::copy_nonoverlapping([1u32, 2].as_ptr() as *const u8, host, 8) };
    let captured = |work: &dyn Fn()| {
        let mut graph = null_mut();
        check!(cuStreamBeginCapture_v2(s, 0));
        work();
        check!(cuStreamEndCapture(s, &mut graph));
        instantiate(graph)
    };
    let inner = captured(&|| check!(cuMemsetD32Async(p, 0, 2, s)));
    let outer = captured(&|| {
        check!(cuGraphLaunch(inner, s));
        check!(cuMemcpyHtoDAsync_v2(p, host as *const c_void, 8, s));
        let mut address = p;
        let mut params = [&mut address as *mut u64 as *mut c_void];
        let got = launch(add_one, [1, 1, 1], [1, 1, 1], 0, s, &mut params);
        assert_eq!(got, CUDA_SUCCESS);
        check!(cuMemcpyDtoDAsync_v2(on1, p, 8, s));
    });
    for _ in 0..3 {
        check!(cuGraphLaunch(outer, s));
    }
    check!(cuStreamSynchronize(s));
    assert_eq!(download(p, 2), [2, 2]);
    let json = tandem_cuda_emu::stats::to_json(2, 13000);
    let value: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    let mine = &value["streams"][(s as u64).to_string()];
    for (counter, expected) in [
        ("graph_launches", 3),
        ("graph_kernels", 3),
        ("graph_copies", 6),
        ("graph_memsets", 3),
        ("bytes_htod", 24),
        ("bytes_peer", 24),
        ("bytes_memset", 24),
        ("bytes_dtod", 0),
        ("kernel_launches", 0),
        // Five calls captured, three graph launches.
        ("stream_calls", 8),
    ] {
        assert_eq!(mine[counter], expected, "{counter}");
    }
    check!(cuCtxSetCurrent(other));
    assert_eq!(download(on1, 2), [2, 2]);
    check!(cuDevicePrimaryCtxRelease_v2(1));
    check!(cuCtxDestroy_v2(ctx));
}
