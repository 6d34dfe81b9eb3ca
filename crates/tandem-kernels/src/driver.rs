//! The CUDA driver calls tandem makes, declared here with an integer result, and small RAII
//! types over them.
//!
//! **Why not `cust`'s types.** cust 0.3.2 (through `cust_raw`) declares every driver function
//! as returning `CUresult`, a Rust `enum` of CUDA 11.4's error codes. A newer driver returns
//! codes that enum lacks (46, `CUDA_ERROR_DEVICE_UNAVAILABLE`, for a GPU in exclusive-process
//! mode that another process holds; 222, `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`; whatever CUDA
//! 13 adds), and a Rust enum holding a value outside its variants is undefined behaviour:
//! the program may then do anything, including report success. Here the result is a plain
//! `u32` ([`Code`]) and every value is defined; [`name`] names the ones tandem cares about.
//!
//! **What.** 34 driver functions, with the exact (versioned) symbols cust uses, so that any
//! libcuda that serves cust serves tandem (NVIDIA's driver or tandem's CPU stand-in,
//! `cargo xtask cuda-emu`): `cuInit`, `cuDriverGetVersion`, `cuDeviceGetCount`, `cuDeviceGet`,
//! `cuDeviceGetAttribute`, `cuDevicePrimaryCtxRetain`, `cuDevicePrimaryCtxRelease_v2`,
//! `cuCtxGetCurrent`, `cuCtxSetCurrent`, `cuStreamCreate`, `cuStreamSynchronize`,
//! `cuStreamDestroy_v2`, `cuModuleLoadData`, `cuModuleGetFunction`, `cuModuleUnload`,
//! `cuLaunchKernel`, `cuMemAlloc_v2`, `cuMemFree_v2`, `cuMemAllocHost_v2`, `cuMemFreeHost`,
//! `cuMemcpyHtoDAsync_v2`, `cuMemcpyDtoHAsync_v2`, `cuMemcpyDtoDAsync_v2`, `cuMemsetD8Async`;
//! events to order streams (`cuEventCreate`, `cuEventRecord`, `cuStreamWaitEvent`,
//! `cuEventDestroy_v2`); graphs (`cuStreamBeginCapture_v2`, `cuStreamEndCapture`,
//! `cuGraphInstantiate_v2`, `cuGraphLaunch`, `cuGraphExecDestroy`, `cuGraphDestroy`).
//!
//! **The types.** [`Context`] retains a device's primary context (released on drop). Everything
//! made in a context keeps an `Arc` of it, and its `Drop` makes that context current first
//! (restoring whatever was current after), so a [`DeviceBuffer`], [`PinnedBuffer`], [`Stream`]
//! or [`Module`] is freed in its own context whichever thread drops it and whatever is current
//! there: the replicas of `cuda:0,1` are torn down on threads whose current context may be
//! another GPU's. [`Stream`]s are created non-blocking. A [`Function`] handle is looked up once
//! per kernel, when its [`Module`] is loaded.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A driver result (`CUresult`) as the integer the driver returned.
pub(crate) type Code = u32;

/// `CUDA_SUCCESS`.
const SUCCESS: Code = 0;
/// `CUDA_ERROR_INVALID_VALUE`: what an impossible request (a size that overflows, a NUL in the
/// PTX text) is reported as without asking the driver.
const INVALID_VALUE: Code = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
const OUT_OF_MEMORY: Code = 2;
/// `CUDA_ERROR_NO_DEVICE`: no GPU (or the stand-in configured with `TANDEM_EMU_DEVICES=0`).
pub(crate) const NO_DEVICE: Code = 100;
/// `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`: a driver older than the PTX.
pub(crate) const UNSUPPORTED_PTX_VERSION: Code = 222;
/// `CU_STREAM_NON_BLOCKING`: the stream does not synchronise with the legacy default stream.
const STREAM_NON_BLOCKING: c_uint = 1;

/// The names of the driver's error codes that tandem can meet (CUDA 13's `cuda.h`).
const NAMES: &[(Code, &str)] = &[
    (0, "CUDA_SUCCESS"),
    (1, "CUDA_ERROR_INVALID_VALUE"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY"),
    (3, "CUDA_ERROR_NOT_INITIALIZED"),
    (4, "CUDA_ERROR_DEINITIALIZED"),
    (34, "CUDA_ERROR_STUB_LIBRARY"),
    (46, "CUDA_ERROR_DEVICE_UNAVAILABLE"),
    (100, "CUDA_ERROR_NO_DEVICE"),
    (101, "CUDA_ERROR_INVALID_DEVICE"),
    (102, "CUDA_ERROR_DEVICE_NOT_LICENSED"),
    (200, "CUDA_ERROR_INVALID_IMAGE"),
    (201, "CUDA_ERROR_INVALID_CONTEXT"),
    (209, "CUDA_ERROR_NO_BINARY_FOR_GPU"),
    (214, "CUDA_ERROR_ECC_UNCORRECTABLE"),
    (216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE"),
    (218, "CUDA_ERROR_INVALID_PTX"),
    (221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND"),
    (222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"),
    (223, "CUDA_ERROR_JIT_COMPILATION_DISABLED"),
    (300, "CUDA_ERROR_INVALID_SOURCE"),
    (304, "CUDA_ERROR_OPERATING_SYSTEM"),
    (400, "CUDA_ERROR_INVALID_HANDLE"),
    (401, "CUDA_ERROR_ILLEGAL_STATE"),
    (500, "CUDA_ERROR_NOT_FOUND"),
    (600, "CUDA_ERROR_NOT_READY"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
    (701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
    (702, "CUDA_ERROR_LAUNCH_TIMEOUT"),
    (709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"),
    (710, "CUDA_ERROR_ASSERT"),
    (714, "CUDA_ERROR_HARDWARE_STACK_ERROR"),
    (715, "CUDA_ERROR_ILLEGAL_INSTRUCTION"),
    (716, "CUDA_ERROR_MISALIGNED_ADDRESS"),
    (717, "CUDA_ERROR_INVALID_ADDRESS_SPACE"),
    (718, "CUDA_ERROR_INVALID_PC"),
    (719, "CUDA_ERROR_LAUNCH_FAILED"),
    (800, "CUDA_ERROR_NOT_PERMITTED"),
    (801, "CUDA_ERROR_NOT_SUPPORTED"),
    (802, "CUDA_ERROR_SYSTEM_NOT_READY"),
    (803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"),
    (804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"),
    (999, "CUDA_ERROR_UNKNOWN"),
];

/// The name of a driver result (`CUDA_ERROR_NO_DEVICE`), where tandem knows it.
pub(crate) fn name(code: Code) -> Option<&'static str> {
    NAMES
        .iter()
        .find(|&&(known, _)| known == code)
        .map(|&(_, name)| name)
}

type CuDevice = c_int;
type CuContext = *mut c_void;
type CuStream = *mut c_void;
type CuModule = *mut c_void;
type CuFunction = *mut c_void;
type CuDevicePtr = u64;
type CuEvent = *mut c_void;
type CuGraph = *mut c_void;
type CuGraphExec = *mut c_void;

/// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`: other threads (other replicas' workers) may go on
/// using the driver while one stream is being captured.
const CAPTURE_THREAD_LOCAL: c_int = 1;

// The `cuda` library is found by cust's build script (see Cargo.toml); these are the driver
// API's C declarations, each `CUresult` as `c_uint`.
#[link(name = "cuda")]
extern "C" {
    fn cuInit(flags: c_uint) -> Code;
    fn cuDriverGetVersion(version: *mut c_int) -> Code;
    fn cuDeviceGetCount(count: *mut c_int) -> Code;
    fn cuDeviceGet(device: *mut CuDevice, ordinal: c_int) -> Code;
    fn cuDeviceGetAttribute(value: *mut c_int, attribute: c_int, device: CuDevice) -> Code;
    fn cuDevicePrimaryCtxRetain(context: *mut CuContext, device: CuDevice) -> Code;
    fn cuDevicePrimaryCtxRelease_v2(device: CuDevice) -> Code;
    fn cuCtxGetCurrent(context: *mut CuContext) -> Code;
    fn cuCtxSetCurrent(context: CuContext) -> Code;
    fn cuStreamCreate(stream: *mut CuStream, flags: c_uint) -> Code;
    fn cuStreamSynchronize(stream: CuStream) -> Code;
    fn cuStreamDestroy_v2(stream: CuStream) -> Code;
    fn cuModuleLoadData(module: *mut CuModule, image: *const c_void) -> Code;
    fn cuModuleGetFunction(
        function: *mut CuFunction,
        module: CuModule,
        name: *const c_char,
    ) -> Code;
    fn cuModuleUnload(module: CuModule) -> Code;
    #[allow(clippy::too_many_arguments)]
    fn cuLaunchKernel(
        function: CuFunction,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared_bytes: c_uint,
        stream: CuStream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> Code;
    fn cuMemAlloc_v2(pointer: *mut CuDevicePtr, bytes: usize) -> Code;
    fn cuMemFree_v2(pointer: CuDevicePtr) -> Code;
    fn cuMemAllocHost_v2(pointer: *mut *mut c_void, bytes: usize) -> Code;
    fn cuMemFreeHost(pointer: *mut c_void) -> Code;
    fn cuMemcpyHtoDAsync_v2(
        dst: CuDevicePtr,
        src: *const c_void,
        bytes: usize,
        stream: CuStream,
    ) -> Code;
    fn cuMemcpyDtoHAsync_v2(
        dst: *mut c_void,
        src: CuDevicePtr,
        bytes: usize,
        stream: CuStream,
    ) -> Code;
    fn cuMemsetD8Async(dst: CuDevicePtr, value: u8, count: usize, stream: CuStream) -> Code;
    fn cuMemcpyDtoDAsync_v2(
        dst: CuDevicePtr,
        src: CuDevicePtr,
        bytes: usize,
        stream: CuStream,
    ) -> Code;
    fn cuEventCreate(event: *mut CuEvent, flags: c_uint) -> Code;
    fn cuEventRecord(event: CuEvent, stream: CuStream) -> Code;
    fn cuEventDestroy_v2(event: CuEvent) -> Code;
    fn cuStreamWaitEvent(stream: CuStream, event: CuEvent, flags: c_uint) -> Code;
    fn cuStreamBeginCapture_v2(stream: CuStream, mode: c_int) -> Code;
    fn cuStreamEndCapture(stream: CuStream, graph: *mut CuGraph) -> Code;
    fn cuGraphInstantiate_v2(
        exec: *mut CuGraphExec,
        graph: CuGraph,
        error_node: *mut *mut c_void,
        log: *mut c_char,
        log_size: usize,
    ) -> Code;
    fn cuGraphLaunch(exec: CuGraphExec, stream: CuStream) -> Code;
    fn cuGraphExecDestroy(exec: CuGraphExec) -> Code;
    fn cuGraphDestroy(graph: CuGraph) -> Code;
}

/// How many releases (frees, unloads, stream destructions, context releases) the driver has
/// refused in this process: a `Drop` cannot return an error, so it counts it here.
static RELEASE_FAILURES: AtomicUsize = AtomicUsize::new(0);

/// How many times, in this process, the driver refused to free device or pinned memory, unload
/// a module, destroy a stream or release a context when a [`CudaBackend`](crate::CudaBackend)
/// or a [`DeviceBuffer`] was dropped. Drops cannot fail, so this is where such a failure (and
/// the leak it means) shows; it stays 0 while everything is released in its own context.
pub fn release_failures() -> usize {
    RELEASE_FAILURES.load(Ordering::Relaxed)
}

/// Counts a failed release (see [`release_failures`]).
fn released(code: Code) {
    if code != SUCCESS {
        RELEASE_FAILURES.fetch_add(1, Ordering::Relaxed);
    }
}

/// `Ok` for `CUDA_SUCCESS`, the code otherwise.
fn check(code: Code) -> Result<(), Code> {
    match code {
        SUCCESS => Ok(()),
        code => Err(code),
    }
}

/// `cuInit(0)`: needed once per process before anything else (repeating it is harmless).
pub(crate) fn init() -> Result<(), Code> {
    // SAFETY: no pointers.
    check(unsafe { cuInit(0) })
}

/// The CUDA version the driver supports, as `1000 * major + 10 * minor` (13000 for 13.0).
pub(crate) fn driver_version() -> Result<i32, Code> {
    let mut version = 0;
    // SAFETY: `version` is a valid `int` to write.
    check(unsafe { cuDriverGetVersion(&mut version) })?;
    Ok(version)
}

/// How many devices the driver sees (after [`init`]).
pub(crate) fn device_count() -> Result<usize, Code> {
    let mut count = 0;
    // SAFETY: `count` is a valid `int` to write.
    check(unsafe { cuDeviceGetCount(&mut count) })?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// A device's primary context, retained for as long as this lives (and so for as long as
/// anything made in it lives: they hold an `Arc` of it).
#[derive(Debug)]
pub(crate) struct Context {
    device: CuDevice,
    raw: CuContext,
}

// SAFETY: a CUDA context is a process-wide object that the driver lets any thread use; this
// type only makes it current and releases it.
unsafe impl Send for Context {}
// SAFETY: as above; no method mutates the handle.
unsafe impl Sync for Context {}

impl Context {
    /// Retains device `ordinal`'s primary context and makes it current on this thread.
    pub(crate) fn retain_primary(ordinal: usize) -> Result<Arc<Context>, Code> {
        let ordinal = c_int::try_from(ordinal).map_err(|_| INVALID_VALUE)?;
        let mut device = 0;
        // SAFETY: `device` is a valid `CUdevice` to write.
        check(unsafe { cuDeviceGet(&mut device, ordinal) })?;
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` is a valid `CUcontext` to write.
        check(unsafe { cuDevicePrimaryCtxRetain(&mut raw, device) })?;
        // Retained: from here on, dropping `context` releases it.
        let context = Arc::new(Context { device, raw });
        context.set_current()?;
        Ok(context)
    }

    /// Its device's compute capability as `10 major + minor` (90 for an H200).
    pub(crate) fn capability(&self) -> Result<u32, Code> {
        // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR and _MINOR.
        let [mut major, mut minor] = [0; 2];
        // SAFETY: each value is a valid `int` to write; `device` is the context's device.
        unsafe {
            check(cuDeviceGetAttribute(&mut major, 75, self.device))?;
            check(cuDeviceGetAttribute(&mut minor, 76, self.device))?;
        }
        Ok(u32::try_from(10 * major + minor).unwrap_or(0))
    }

    /// Makes this context current on the calling thread.
    pub(crate) fn set_current(&self) -> Result<(), Code> {
        // SAFETY: `raw` is a retained context.
        check(unsafe { cuCtxSetCurrent(self.raw) })
    }

    /// Makes this context current until the returned guard is dropped, which restores the one
    /// that was current before (when it was another).
    fn enter(&self) -> Result<Entered, Code> {
        let mut previous = ptr::null_mut();
        // SAFETY: `previous` is a valid `CUcontext` to write.
        check(unsafe { cuCtxGetCurrent(&mut previous) })?;
        if previous == self.raw {
            return Ok(Entered { previous: None });
        }
        self.set_current()?;
        Ok(Entered {
            previous: Some(previous),
        })
    }

    /// Whether `other` is the same driver context (each retain of a device's primary context
    /// is a `Context` of its own, of the same handle).
    pub(crate) fn is(&self, other: &Context) -> bool {
        self.raw == other.raw
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: this value retained the primary context once; it releases it once. Nothing
        // made in it is left: everything holds an `Arc` of this value.
        released(unsafe { cuDevicePrimaryCtxRelease_v2(self.device) });
    }
}

/// While alive, a context made current by [`Context::enter`].
struct Entered {
    /// What to make current again on drop (`None`: nothing changed).
    previous: Option<CuContext>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        if let Some(previous) = self.previous {
            // SAFETY: `previous` was current on this thread a moment ago (or null: none).
            // Failing to restore it would leave the wrong context current: count it.
            released(unsafe { cuCtxSetCurrent(previous) });
        }
    }
}

/// A value type that may be copied to and from device memory byte for byte, for which every
/// bit pattern (all zeros in particular) is a valid value.
pub trait DeviceCopy: Copy + Send + 'static {}
impl DeviceCopy for u8 {}
impl DeviceCopy for u16 {}
impl DeviceCopy for u32 {}
impl DeviceCopy for f32 {}
impl DeviceCopy for f64 {}

/// `len` values of `T` in bytes, or `CUDA_ERROR_OUT_OF_MEMORY` when that overflows.
fn bytes<T>(len: usize) -> Result<usize, Code> {
    len.checked_mul(size_of::<T>()).ok_or(OUT_OF_MEMORY)
}

/// A device address of values of `T`, as a kernel parameter takes it (a `u64`).
#[repr(transparent)]
pub(crate) struct DevicePointer<T> {
    raw: CuDevicePtr,
    _values: PhantomData<*const T>,
}

impl<T> Clone for DevicePointer<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for DevicePointer<T> {}

impl<T> DevicePointer<T> {
    /// The null pointer (an absent optional operand).
    pub(crate) fn null() -> Self {
        DevicePointer {
            raw: 0,
            _values: PhantomData,
        }
    }

    /// The address `count` values further on (no check: the caller checked the span).
    pub(crate) fn wrapping_add(self, count: usize) -> Self {
        DevicePointer {
            raw: self
                .raw
                .wrapping_add((count as u64).wrapping_mul(size_of::<T>() as u64)),
            _values: PhantomData,
        }
    }

    /// The pointer at device address `raw`.
    pub(crate) fn from_raw(raw: u64) -> Self {
        DevicePointer {
            raw,
            _values: PhantomData,
        }
    }

    /// The address as an integer.
    pub(crate) fn as_raw(self) -> u64 {
        self.raw
    }
}

/// Device memory holding `len` values of `T`, freed in its own context on drop.
///
/// The `Buffer` and `Labels` of [`CudaBackend`](crate::CudaBackend): made and read only through
/// it.
pub struct DeviceBuffer<T> {
    raw: CuDevicePtr,
    len: usize,
    context: Arc<Context>,
    _values: PhantomData<T>,
}

impl<T> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("len", &self.len)
            .field("type", &std::any::type_name::<T>())
            .finish_non_exhaustive()
    }
}

impl<T> DeviceBuffer<T> {
    /// How many values it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of its first value (null when empty).
    pub(crate) fn as_device_ptr(&self) -> DevicePointer<T> {
        DevicePointer {
            raw: self.raw,
            _values: PhantomData,
        }
    }
}

impl<T: DeviceCopy> DeviceBuffer<T> {
    /// `len` values of uninitialised device memory in `context` (nothing is allocated for 0).
    pub(crate) fn uninitialized(context: &Arc<Context>, len: usize) -> Result<Self, Code> {
        let bytes = bytes::<T>(len)?;
        let mut raw = 0;
        if bytes > 0 {
            let _entered = context.enter()?;
            // SAFETY: `raw` is a valid `CUdeviceptr` to write.
            check(unsafe { cuMemAlloc_v2(&mut raw, bytes) })?;
        }
        Ok(DeviceBuffer {
            raw,
            len,
            context: Arc::clone(context),
            _values: PhantomData,
        })
    }
}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.raw == 0 {
            return;
        }
        // In its own context, whatever is current on this thread.
        let _entered = self.context.enter().map_err(released);
        // SAFETY: `raw` came from `cuMemAlloc_v2` and is freed once. The backend synchronises
        // its stream before it drops memory its kernels may still use (and `cuMemFree`, like
        // `cudaFree`, waits for the device's pending work anyway).
        released(unsafe { cuMemFree_v2(self.raw) });
    }
}

/// Page-locked host memory holding `len` values of `T` (zeroed when made), which the driver
/// copies at full bus speed; freed in its own context on drop.
pub(crate) struct PinnedBuffer<T> {
    raw: NonNull<T>,
    len: usize,
    context: Arc<Context>,
}

// SAFETY: the buffer owns its memory exclusively, like a `Box<[T]>`.
unsafe impl<T: Send> Send for PinnedBuffer<T> {}

impl<T: DeviceCopy> PinnedBuffer<T> {
    /// `len` (at least 1) zeroed values of page-locked memory, allocated in `context`.
    pub(crate) fn zeroed(context: &Arc<Context>, len: usize) -> Result<Self, Code> {
        let bytes = bytes::<T>(len)?;
        if bytes == 0 {
            return Err(INVALID_VALUE);
        }
        let mut raw = ptr::null_mut();
        {
            let _entered = context.enter()?;
            // SAFETY: `raw` is a valid pointer to write.
            check(unsafe { cuMemAllocHost_v2(&mut raw, bytes) })?;
        }
        let raw = NonNull::new(raw.cast::<T>()).ok_or(OUT_OF_MEMORY)?;
        // SAFETY: the driver returned `bytes` bytes of host memory, suitably aligned for any
        // type; all zeros is a valid `T` (`DeviceCopy`).
        unsafe { ptr::write_bytes(raw.as_ptr().cast::<u8>(), 0, bytes) };
        Ok(PinnedBuffer {
            raw,
            len,
            context: Arc::clone(context),
        })
    }
}

impl<T> std::ops::Deref for PinnedBuffer<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialised values, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.raw.as_ptr(), self.len) }
    }
}

impl<T> std::ops::DerefMut for PinnedBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: `len` initialised values, owned by `self` and borrowed mutably here.
        unsafe { std::slice::from_raw_parts_mut(self.raw.as_ptr(), self.len) }
    }
}

impl<T> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        let _entered = self.context.enter().map_err(released);
        // SAFETY: allocated by `cuMemAllocHost_v2`, freed once.
        released(unsafe { cuMemFreeHost(self.raw.as_ptr().cast()) });
    }
}

/// A non-blocking stream (`CU_STREAM_NON_BLOCKING`: it never synchronises with the legacy
/// default stream that other code in the process may use), destroyed in its own context on
/// drop.
#[derive(Debug)]
pub(crate) struct Stream {
    raw: CuStream,
    context: Arc<Context>,
}

// SAFETY: a stream handle may be used from any thread, and the driver's calls on one stream
// are thread-safe: a store may queue work and waits on a replica's stream from another thread.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

/// `CU_EVENT_DISABLE_TIMING`: the events only order work, which makes them cheaper.
const EVENT_DISABLE_TIMING: c_uint = 2;

/// An executable graph (captured work, launched as one), destroyed in its own context on drop.
#[derive(Debug)]
pub(crate) struct GraphExec {
    raw: CuGraphExec,
    context: Arc<Context>,
}

// SAFETY: executable graphs may be launched and destroyed from any thread.
unsafe impl Send for GraphExec {}

impl Drop for GraphExec {
    fn drop(&mut self) {
        let _entered = self.context.enter().map_err(released);
        // SAFETY: a live executable graph, destroyed once; launches already queued complete.
        released(unsafe { cuGraphExecDestroy(self.raw) });
    }
}

/// An event (a marker in a stream's work), destroyed in its own context on drop.
#[derive(Debug)]
pub(crate) struct Event {
    raw: CuEvent,
    context: Arc<Context>,
}

// SAFETY: event handles may be used from any thread; the driver's calls on them are
// thread-safe.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    /// A new event in `context`, without timing.
    pub(crate) fn new(context: &Arc<Context>) -> Result<Event, Code> {
        let _entered = context.enter()?;
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` is a valid `CUevent` to write.
        check(unsafe { cuEventCreate(&mut raw, EVENT_DISABLE_TIMING) })?;
        Ok(Event {
            raw,
            context: Arc::clone(context),
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _entered = self.context.enter().map_err(released);
        // SAFETY: a live event, destroyed once (waits already queued on it still hold).
        released(unsafe { cuEventDestroy_v2(self.raw) });
    }
}

/// A grid or block shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dim3 {
    pub(crate) x: u32,
    pub(crate) y: u32,
    pub(crate) z: u32,
}

impl From<u32> for Dim3 {
    fn from(x: u32) -> Self {
        Dim3 { x, y: 1, z: 1 }
    }
}

impl From<(u32, u32)> for Dim3 {
    fn from((x, y): (u32, u32)) -> Self {
        Dim3 { x, y, z: 1 }
    }
}

impl Stream {
    /// A new non-blocking stream in `context`.
    pub(crate) fn new(context: &Arc<Context>) -> Result<Stream, Code> {
        let _entered = context.enter()?;
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` is a valid `CUstream` to write.
        check(unsafe { cuStreamCreate(&mut raw, STREAM_NON_BLOCKING) })?;
        Ok(Stream {
            raw,
            context: Arc::clone(context),
        })
    }

    /// Waits until everything issued on the stream has finished.
    pub(crate) fn synchronize(&self) -> Result<(), Code> {
        // SAFETY: a live stream.
        check(unsafe { cuStreamSynchronize(self.raw) })
    }

    /// Launches `function` on the stream, with no dynamic shared memory.
    ///
    /// # Safety
    ///
    /// `args` must point to values of the kernel's parameter types, in order, and what the
    /// kernel reads and writes with them must be device memory that stays allocated until the
    /// launch has finished. The stream's context must be current.
    pub(crate) unsafe fn launch(
        &self,
        function: Function,
        grid: Dim3,
        block: Dim3,
        args: &[*mut c_void],
    ) -> Result<(), Code> {
        // SAFETY: the caller's promises; the driver only reads `args` (the C API is not
        // const-correct).
        check(unsafe {
            cuLaunchKernel(
                function.raw,
                grid.x,
                grid.y,
                grid.z,
                block.x,
                block.y,
                block.z,
                0,
                self.raw,
                args.as_ptr().cast_mut(),
                ptr::null_mut(),
            )
        })
    }

    /// Queues a copy of `src` to `dst`.
    ///
    /// # Safety
    ///
    /// `dst` must cover `src.len()` values of device memory, and both must stay alive and
    /// unchanged until the stream has been synchronised (the driver may read `src` later). The
    /// stream's context must be current.
    pub(crate) unsafe fn copy_in<T: DeviceCopy>(
        &self,
        dst: DevicePointer<T>,
        src: &[T],
    ) -> Result<(), Code> {
        // SAFETY: the caller's promises.
        check(unsafe {
            cuMemcpyHtoDAsync_v2(dst.raw, src.as_ptr().cast(), size_of_val(src), self.raw)
        })
    }

    /// Queues a copy of `dst.len()` values from `src` into `dst`.
    ///
    /// # Safety
    ///
    /// As [`copy_in`](Self::copy_in): `src` covers `dst.len()` values, and `dst` must not be
    /// read or released before the stream has been synchronised.
    pub(crate) unsafe fn copy_out<T: DeviceCopy>(
        &self,
        dst: &mut [T],
        src: DevicePointer<T>,
    ) -> Result<(), Code> {
        // SAFETY: the caller's promises.
        check(unsafe {
            cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src.raw, size_of_val(dst), self.raw)
        })
    }

    /// Captures the work `record` queues on the stream (and nothing else runs) as a graph, and
    /// instantiates it; what `record` returned, and the graph once the capture succeeded.
    /// Capture ends whatever `record` does, so a failure leaves the stream usable.
    ///
    /// `record` must only queue work (no waits, no copies from pageable host memory: the
    /// driver refuses those while capturing). The stream's context must be current.
    pub(crate) fn capture<R>(&self, record: impl FnOnce() -> R) -> Result<(R, GraphExec), Code> {
        // SAFETY: a live stream.
        check(unsafe { cuStreamBeginCapture_v2(self.raw, CAPTURE_THREAD_LOCAL) })?;
        let recorded = record();
        let mut graph = ptr::null_mut();
        // SAFETY: a stream being captured; `graph` is a valid `CUgraph` to write.
        check(unsafe { cuStreamEndCapture(self.raw, &mut graph) })?;
        let mut raw = ptr::null_mut();
        // SAFETY: a graph just captured; no error node or log wanted.
        let instantiated = check(unsafe {
            cuGraphInstantiate_v2(&mut raw, graph, ptr::null_mut(), ptr::null_mut(), 0)
        });
        // SAFETY: the template is not needed once instantiated (or failed to be).
        released(unsafe { cuGraphDestroy(graph) });
        instantiated?;
        Ok((
            recorded,
            GraphExec {
                raw,
                context: Arc::clone(&self.context),
            },
        ))
    }

    /// Queues a run of `graph` (one launch for all its work).
    pub(crate) fn launch_graph(&self, graph: &GraphExec) -> Result<(), Code> {
        // SAFETY: a live executable graph and stream, of one context.
        check(unsafe { cuGraphLaunch(graph.raw, self.raw) })
    }

    /// Queues a copy of `bytes` bytes from device address `src` to `dst`.
    ///
    /// # Safety
    ///
    /// Both must cover `bytes` bytes of device memory that stays allocated until the stream
    /// has done it. The stream's context must be current.
    pub(crate) unsafe fn copy_device(&self, dst: u64, src: u64, bytes: usize) -> Result<(), Code> {
        // SAFETY: the caller's promises.
        check(unsafe { cuMemcpyDtoDAsync_v2(dst, src, bytes, self.raw) })
    }

    /// Marks the end of the work queued so far with `event`.
    pub(crate) fn record(&self, event: &Event) -> Result<(), Code> {
        // SAFETY: a live event and stream (of one context, which the caller has current).
        check(unsafe { cuEventRecord(event.raw, self.raw) })
    }

    /// Makes the stream's later work wait for the work before `event`'s last record.
    pub(crate) fn wait(&self, event: &Event) -> Result<(), Code> {
        // SAFETY: a live event and stream.
        check(unsafe { cuStreamWaitEvent(self.raw, event.raw, 0) })
    }

    /// Queues setting every byte of `len` values from `dst` on to `byte`.
    ///
    /// # Safety
    ///
    /// `dst` must cover `len` values of device memory that stays allocated until the stream
    /// has done it. The stream's context must be current.
    pub(crate) unsafe fn fill_bytes<T: DeviceCopy>(
        &self,
        dst: DevicePointer<T>,
        len: usize,
        byte: u8,
    ) -> Result<(), Code> {
        let bytes = bytes::<T>(len)?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: the caller's promises.
        check(unsafe { cuMemsetD8Async(dst.raw, byte, bytes, self.raw) })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _entered = self.context.enter().map_err(released);
        // SAFETY: a live stream, destroyed once; work still queued on it completes first (the
        // driver releases it afterwards).
        released(unsafe { cuStreamDestroy_v2(self.raw) });
    }
}

/// A loaded PTX module, unloaded in its own context on drop.
#[derive(Debug)]
pub(crate) struct Module {
    raw: CuModule,
    context: Arc<Context>,
}

// SAFETY: a module handle may be used from any thread.
unsafe impl Send for Module {}
// SAFETY: nothing changes a loaded module until it is unloaded on drop.
unsafe impl Sync for Module {}

/// A kernel's handle: valid while the [`Module`] it was looked up in is loaded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Function {
    raw: CuFunction,
}

// SAFETY: a function handle may be used from any thread.
unsafe impl Send for Function {}
// SAFETY: launching is thread-safe; the handle itself never changes.
unsafe impl Sync for Function {}

impl Module {
    /// Loads (JIT-compiles) PTX text in `context`.
    pub(crate) fn load(context: &Arc<Context>, ptx: &str) -> Result<Module, Code> {
        let image = CString::new(ptx).map_err(|_| INVALID_VALUE)?;
        let _entered = context.enter()?;
        let mut raw = ptr::null_mut();
        // SAFETY: `image` is NUL-terminated PTX text that lives through the call; `raw` is a
        // valid `CUmodule` to write.
        check(unsafe { cuModuleLoadData(&mut raw, image.as_ptr().cast()) })?;
        Ok(Module {
            raw,
            context: Arc::clone(context),
        })
    }

    /// The handle of entry point `name`.
    pub(crate) fn function(&self, name: &str) -> Result<Function, Code> {
        let name = CString::new(name).map_err(|_| INVALID_VALUE)?;
        let mut raw = ptr::null_mut();
        // SAFETY: a loaded module; `name` is NUL-terminated; `raw` is a valid `CUfunction`
        // to write.
        check(unsafe { cuModuleGetFunction(&mut raw, self.raw, name.as_ptr()) })?;
        Ok(Function { raw })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let _entered = self.context.enter().map_err(released);
        // SAFETY: a loaded module, unloaded once; its owner synchronised its stream first, so
        // no kernel of it is still running.
        released(unsafe { cuModuleUnload(self.raw) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_named_where_known() {
        assert_eq!(name(NO_DEVICE), Some("CUDA_ERROR_NO_DEVICE"));
        assert_eq!(name(46), Some("CUDA_ERROR_DEVICE_UNAVAILABLE"));
        assert_eq!(
            name(UNSUPPORTED_PTX_VERSION),
            Some("CUDA_ERROR_UNSUPPORTED_PTX_VERSION")
        );
        assert_eq!(name(47), None);
        assert_eq!(name(u32::MAX), None);
        // One name per code, every name CUDA_...
        for (i, &(code, name)) in NAMES.iter().enumerate() {
            assert!(name.starts_with("CUDA_"), "{name}");
            assert!(
                NAMES[..i].iter().all(|&(c, _)| c < code),
                "{code} out of order"
            );
        }
    }

    #[test]
    fn device_pointers_advance_by_values() {
        let base = DevicePointer::<f32> {
            raw: 0x1000,
            _values: PhantomData,
        };
        assert_eq!(base.wrapping_add(3).as_raw(), 0x100c);
        assert_eq!(DevicePointer::<u8>::null().wrapping_add(5).as_raw(), 5);
        assert_eq!(size_of::<DevicePointer<f32>>(), 8);
    }

    #[test]
    fn shapes_fill_missing_dimensions_with_one() {
        assert_eq!(Dim3::from(7), Dim3 { x: 7, y: 1, z: 1 });
        assert_eq!(Dim3::from((7, 3)), Dim3 { x: 7, y: 3, z: 1 });
    }

    #[test]
    fn sizes_that_overflow_are_refused_before_the_driver() {
        assert_eq!(bytes::<f32>(usize::MAX / 2), Err(OUT_OF_MEMORY));
        assert_eq!(bytes::<f32>(3), Ok(12));
    }
}
