//! With `TANDEM_EMU_STATS` set, each kernel's launches are profiled and summed by name in the
//! statistics. One test: the configuration is read once per process, at `cuInit`.

mod common;

use std::ffi::c_void;
use std::ptr::null_mut;

use common::*;

#[test]
fn each_kernels_launches_are_summed_by_name() {
    // The file is written at exit: nothing here reads it.
    std::env::set_var("TANDEM_EMU_STATS", "/dev/null");
    let ctx = context(0);
    let module = load(include_str!("ptx/small.ptx")).unwrap();
    let add_one = function(module, "add_one");
    let p = alloc(4);
    upload(p, &[0]);
    let mut address = p;
    for _ in 0..3 {
        let mut params = [&mut address as *mut u64 as *mut c_void];
        let got = launch(add_one, [1, 1, 1], [1, 1, 1], 0, null_mut(), &mut params);
        assert_eq!(got, CUDA_SUCCESS);
    }
    check!(cuCtxSynchronize());
    assert_eq!(download(p, 1), [3]);
    let json = tandem_cuda_emu::stats::to_json(2, 13000);
    let value: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    let kernel = &value["kernels"]["add_one"];
    // Each launch: ld.param, cvta, ld.global (4 bytes), add, st.global (4 bytes), ret.
    for (counter, expected) in [
        ("launches", 3),
        ("instructions", 18),
        ("global_bytes_read", 12),
        ("global_bytes_written", 12),
        ("shared_loads", 0),
        ("fmas", 0),
    ] {
        assert_eq!(kernel[counter], expected, "{counter}: {kernel}");
    }
    assert!(value["kernels"]["store"].is_null(), "never launched");
    check!(cuCtxDestroy_v2(ctx));
}
