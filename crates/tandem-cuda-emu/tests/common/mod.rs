//! Helpers shared by the test binaries.
#![allow(dead_code)]

use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
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

/// Loads `text` into the current context.
pub fn load(text: &str) -> Result<Handle, CUresult> {
    let text = CString::new(text).unwrap();
    let mut module = null_mut();
    match unsafe { cuModuleLoadData(&mut module, text.as_ptr() as *const c_void) } {
        CUDA_SUCCESS => Ok(module),
        code => Err(code),
    }
}

/// `module`'s kernel `name`.
pub fn function(module: Handle, name: &str) -> Handle {
    let name = CString::new(name).unwrap();
    let mut f = null_mut();
    check!(cuModuleGetFunction(&mut f, module, name.as_ptr()));
    f
}

/// Launches `f` over `grid` blocks of `block` threads with `shared` bytes of dynamic shared
/// memory on `stream`, with `params` (none: a null pointer).
pub fn launch(
    f: Handle,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: Handle,
    params: &mut [*mut c_void],
) -> CUresult {
    let pointer = if params.is_empty() {
        null_mut()
    } else {
        params.as_mut_ptr()
    };
    let ([gx, gy, gz], [bx, by, bz]) = (grid, block);
    unsafe {
        cuLaunchKernel(
            f,
            gx,
            gy,
            gz,
            bx,
            by,
            bz,
            shared,
            stream,
            pointer,
            null_mut(),
        )
    }
}

/// An executable graph of `graph`.
pub fn instantiate(graph: Handle) -> Handle {
    let mut exec = null_mut();
    check!(cuGraphInstantiate_v2(
        &mut exec,
        graph,
        null_mut(),
        null_mut(),
        0
    ));
    exec
}

/// cust_raw's `src/cuda.rs`, as the workspace resolves it (its bindings of CUDA 11.4's
/// `cuda.h`); not finding it fails the test.
pub fn bindings() -> String {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--all-features",
            "--manifest-path",
        ])
        .arg(manifest_dir.join("../../Cargo.toml"))
        .output()
        .expect("running cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata's output is JSON");
    let manifest = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "cust_raw")
        .and_then(|p| p["manifest_path"].as_str())
        .map(PathBuf::from)
        .expect("cargo metadata lists no cust_raw package (is cust a dependency?)");
    let path = manifest
        .parent()
        .expect("a folder")
        .join("src")
        .join("cuda.rs");
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("reading {}: {err}", path.display()))
}

/// Whether `call`, run on another thread while `gate` holds a stream, is still waiting 20 ms
/// later; the gate opens then, and `call` returns before this does.
pub fn waits_for_gate(gate: tandem_cuda_emu::stream::Gate, call: impl FnOnce() + Send) -> bool {
    use std::sync::atomic::{AtomicBool, Ordering};
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let done = &done;
        scope.spawn(move || {
            call();
            done.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        let waiting = !done.load(Ordering::SeqCst);
        gate.open();
        waiting
    })
}
