//! With `TANDEM_EMU_STATS` set, each kernel's launches are profiled and summed by name, and the
//! statistics are written to the file at process exit. One test, run again as a child process
//! with the variable set: the configuration is read once per process, at `cuInit`, and the
//! file is written only when the process exits.

mod common;

use std::ffi::c_void;
use std::process::Command;
use std::ptr::null_mut;

use common::*;

/// Set in the child process, which launches the kernels.
const CHILD: &str = "TANDEM_EMU_TEST_PROFILED_CHILD";

/// What the child's launches of `add_one` did, as the statistics give them: three launches,
/// each `ld.param`, `cvta`, `ld.global` (4 bytes), `add`, `st.global` (4 bytes), `ret`.
fn assert_add_one_counted(statistics: &serde_json::Value) {
    let kernel = &statistics["kernels"]["add_one"];
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
    assert!(statistics["kernels"]["store"].is_null(), "never launched");
}

/// The child's part: three launches, counted in this process's statistics.
fn launch_three_times() {
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
    assert_add_one_counted(&serde_json::from_str(&json).expect("valid JSON"));
    check!(cuCtxDestroy_v2(ctx));
}

#[test]
fn each_kernels_launches_are_summed_by_name_and_written_at_exit() {
    if std::env::var_os(CHILD).is_some() {
        return launch_three_times();
    }
    let dir = std::env::temp_dir().join(format!("tandem-emu-profiled-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "each_kernels_launches_are_summed_by_name_and_written_at_exit",
            // The driver's messages on stderr, where the parent reads them.
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env("TANDEM_EMU_STATS", dir.join("statistics-%p.json"))
        .output()
        .unwrap();
    assert!(
        child.status.success(),
        "the child failed: {}\n{}",
        String::from_utf8_lossy(&child.stdout),
        String::from_utf8_lossy(&child.stderr)
    );
    // The driver had nothing to report (such as failing to register its exit handler).
    let stderr = String::from_utf8_lossy(&child.stderr);
    assert!(!stderr.contains("tandem-cuda-emu"), "{stderr}");
    let written: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(
        written.len(),
        1,
        "one file, named by the child's process id"
    );
    let text = std::fs::read_to_string(written[0].as_ref().unwrap().path()).unwrap();
    assert_add_one_counted(&serde_json::from_str(&text).expect("valid JSON"));
    std::fs::remove_dir_all(&dir).unwrap();
}
