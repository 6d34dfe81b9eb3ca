//! tandem's CPU stand-in for the CUDA driver: built as `libcuda.so.1`, it implements the
//! driver API functions that cust (and so tandem) call, running PTX kernels in
//! [`tandem_ptx`]'s interpreter.
//!
//! It is strict, like the real driver and stricter (sanitizer-like):
//! - device memory lives at fake addresses no host pointer has, every allocation followed by an
//!   unmapped gap and never reused; fresh allocations are filled with 0xFF (NaN); every kernel
//!   access is checked against the live allocations the launching context may use;
//! - a kernel fault (illegal or misaligned address, trap) is reported asynchronously, at the
//!   next synchronising call, and is sticky: every later call in that context returns it;
//! - launch shapes, parameter buffers, handles and copy ranges are validated;
//! - streams really are asynchronous (a worker thread each), copies to and from pinned memory
//!   are deferred, and only events order two streams.
//!
//! Not emulated: the legacy NULL stream's implicit synchronisation with other blocking streams
//! (it is one more stream of its context), managed memory, arrays, textures, the graph-building
//! API beyond stream capture. Every other function cust_raw declares is exported and returns
//! `CUDA_ERROR_NOT_SUPPORTED` (see [`unsupported`]).
//!
//! Configuration (read at `cuInit`): see [`config::Config`].

// The exported functions' safety contract is the CUDA driver API's, documented by NVIDIA.
#![allow(clippy::missing_safety_doc)]
// The driver API's names and parameter conventions.
#![allow(non_snake_case)]

pub mod api;
pub mod codes;
pub mod config;
pub mod exit;
pub mod memory;
pub mod state;
pub mod stats;
pub mod stream;
pub mod unsupported;

pub use api::*;
pub use codes::CUresult;
pub use unsupported::*;

/// Runs an entry point's body: its error code, or `CUDA_ERROR_UNKNOWN` (reported on stderr)
/// if it panicked, since a panic must never unwind into C.
pub fn guard(name: &str, body: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => codes::CUDA_SUCCESS,
        Ok(Err(code)) => code,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            eprintln!("tandem-cuda-emu: {name} panicked: {message}");
            codes::CUDA_ERROR_UNKNOWN
        }
    }
}

/// A test hook: queues a closed [`stream::Gate`] on `stream` (a `CUstream`; NULL: the current
/// context's NULL stream) and returns it; the stream runs nothing queued after it until it is
/// opened.
pub fn hold_stream(stream: api::Handle) -> Result<stream::Gate, CUresult> {
    let driver = state::driver()?;
    let stream = driver.stream(stream as u64)?;
    let gate = stream::Gate::default();
    stream.enqueue(stream::Work::Gate(gate.clone()));
    Ok(gate)
}
