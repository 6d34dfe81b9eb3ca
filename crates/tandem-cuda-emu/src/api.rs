//! The implemented driver entry points.
//!
//! Each is `#[no_mangle] extern "C"` with the C signature of CUDA's `cuda.h` (handles are
//! pointers, `CUdeviceptr` is 64-bit, enums are `int`s); its body runs inside [`guard`], so a
//! panic is reported and returned as `CUDA_ERROR_UNKNOWN` instead of unwinding into C.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::Arc;

use tandem_ptx::Dim3;

use crate::codes::*;
use crate::guard;
use crate::state::{self, driver, Driver, GraphEntry};
use crate::stats;
use crate::stream::{count, count_graph, Event, HostSource, Stream, Work};

/// `CUcontext`, `CUstream`, `CUevent`, `CUmodule`, `CUfunction`, `CUgraph`, `CUgraphExec`.
pub type Handle = *mut c_void;
/// `CUdeviceptr`.
pub type CUdeviceptr = u64;
/// `CUdevice`.
pub type CUdevice = c_int;

/// The most threads in a block.
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;
/// The largest block dimensions.
pub const MAX_BLOCK: [u32; 3] = [1024, 1024, 64];
/// The largest grid dimensions.
pub const MAX_GRID: [u32; 3] = [(1 << 31) - 1, 65535, 65535];
/// Shared memory a block may use without opting in.
pub const SHARED_PER_BLOCK: usize = 48 * 1024;
/// Shared memory a block may use after opting in.
pub const SHARED_PER_BLOCK_OPTIN: usize = 227 * 1024;
/// Multiprocessors reported.
pub const MULTIPROCESSORS: i32 = 132;
/// The name every device reports.
pub const DEVICE_NAME: &str = "NVIDIA H200 (tandem-cuda-emu)";

macro_rules! api {
    ($($(#[doc = $doc:literal])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block)*) => {$(
        $(#[doc = $doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            guard(stringify!($name), || -> Result<(), CUresult> { $body })
        }
    )*};
}

/// `CUDA_ERROR_INVALID_VALUE` for a null `pointer`.
fn non_null<T>(pointer: *const T) -> Result<(), CUresult> {
    if pointer.is_null() {
        Err(CUDA_ERROR_INVALID_VALUE)
    } else {
        Ok(())
    }
}

/// Writes `value` through `out`, which the caller must pass non-null.
unsafe fn put<T>(out: *mut T, value: T) -> Result<(), CUresult> {
    non_null(out)?;
    out.write(value);
    Ok(())
}

fn key(handle: Handle) -> u64 {
    handle as u64
}

fn handle(id: u64) -> Handle {
    id as Handle
}

/// The PTX ISA version's minimum CUDA driver, as `1000 * major + 10 * minor`: the CUDA release
/// that brought it (the PTX ISA's release history, to 9.1 in CUDA 13.1); `u32::MAX`, which no
/// driver reaches, for a version it does not list.
pub fn isa_min_driver((major, minor): (u32, u32)) -> u32 {
    let cuda = |major: u32, minor: u32| 1000 * major + 10 * minor;
    match (major, minor) {
        (1, 0 | 1) => cuda(1, minor),
        (1, 2..=4) => cuda(2, minor - 2),
        (2, 0..=2) => cuda(3, minor),
        (2, 3) => cuda(4, 0),
        (3, 0) => cuda(4, 1),
        (3, 1) => cuda(5, 0),
        (3, 2) => cuda(5, 5),
        (4, 0..=3) => cuda(6 + minor / 2, minor % 2 * 5),
        (5, 0) => cuda(8, 0),
        (6, 0..=2) => cuda(9, minor),
        (6, 3..=5) => cuda(10, minor - 3),
        (7, 0..=8) => cuda(11, minor),
        (8, 0..=5) => cuda(12, minor),
        // CUDA 12.6 kept PTX ISA 8.5.
        (8, 6..=8) => cuda(12, minor + 1),
        (9, 0 | 1) => cuda(13, minor),
        _ => u32::MAX,
    }
}

/// The value of device attribute `attribute`, H100/H200-like but for the compute capability
/// (`10 * major + minor`).
pub fn device_attribute(attribute: i32, capability: u32) -> Option<i32> {
    Some(match attribute {
        1 => MAX_THREADS_PER_BLOCK as i32,
        2 => MAX_BLOCK[0] as i32,
        3 => MAX_BLOCK[1] as i32,
        4 => MAX_BLOCK[2] as i32,
        5 => MAX_GRID[0] as i32,
        6 => MAX_GRID[1] as i32,
        7 => MAX_GRID[2] as i32,
        8 => SHARED_PER_BLOCK as i32,
        9 => 65536,
        10 => 32,
        11 => i32::MAX,
        12 => 65536,
        13 => 1_980_000,
        14 => 512,
        15 => 1,
        16 => MULTIPROCESSORS,
        17 => 0,
        18 => 0,
        19 => 1,
        20 => 0,
        30 => 512,
        31 => 1,
        32 => 1,
        33 => 0,
        34 => 0,
        35 => 0,
        36 => 2_619_000,
        37 => 6144,
        38 => 50 * 1024 * 1024,
        39 => 2048,
        40 => 3,
        41 => 1,
        50 => 0,
        75 => (capability / 10) as i32,
        76 => (capability % 10) as i32,
        78 => 1,
        79 => 1,
        80 => 1,
        81 => 228 * 1024,
        82 => 65536,
        83 => 1,
        84 => 0,
        85 => 0,
        86 => 0,
        87 => 2,
        88 => 0,
        89 => 1,
        90 => 1,
        95 => 1,
        97 => SHARED_PER_BLOCK_OPTIN as i32,
        106 => 32,
        111 => 1024,
        115 => 1,
        _ => return None,
    })
}

/// Checks a launch's shape against the device limits.
fn check_launch(grid: Dim3, block: Dim3, shared: usize) -> Result<(), CUresult> {
    let grid_ok = [grid.x, grid.y, grid.z]
        .iter()
        .zip(MAX_GRID)
        .all(|(&d, max)| d >= 1 && d <= max);
    let block_ok = [block.x, block.y, block.z]
        .iter()
        .zip(MAX_BLOCK)
        .all(|(&d, max)| d >= 1 && d <= max);
    let threads = u64::from(block.x) * u64::from(block.y) * u64::from(block.z);
    if !grid_ok
        || !block_ok
        || threads > u64::from(MAX_THREADS_PER_BLOCK)
        || shared > SHARED_PER_BLOCK
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// Checks that `[addr, addr + len)` is inside one live device allocation
/// (`CUDA_ERROR_INVALID_VALUE`, as the driver says for a bad copy range).
fn check_range(driver: &Driver, addr: u64, len: usize) -> Result<usize, CUresult> {
    driver
        .memory
        .find(addr, len as u64)
        .map(|a| a.device)
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// Queues a host-to-device copy on `stream`.
unsafe fn htod(
    driver: &Driver,
    stream: &Stream,
    dst: u64,
    src: *const c_void,
    len: usize,
) -> Result<u64, CUresult> {
    if len == 0 {
        return Ok(0);
    }
    non_null(src)?;
    check_range(driver, dst, len)?;
    let source = if driver.pinned.contains(src as usize, len) {
        HostSource::Pinned(src as usize)
    } else {
        // Pageable memory: the driver stages it before returning, so the caller may reuse it.
        HostSource::Snapshot(Arc::new(
            std::slice::from_raw_parts(src as *const u8, len).to_vec(),
        ))
    };
    count(stream, |c| c.bytes_htod += len as u64);
    Ok(stream.enqueue(Work::HtoD {
        dst,
        src: source,
        len,
    }))
}

/// Queues a device-to-host copy on `stream`; into pageable memory it waits for it.
unsafe fn dtoh(
    driver: &Driver,
    stream: &Stream,
    dst: *mut c_void,
    src: u64,
    len: usize,
) -> Result<(), CUresult> {
    if len == 0 {
        return Ok(());
    }
    non_null(dst)?;
    check_range(driver, src, len)?;
    let pinned = driver.pinned.contains(dst as usize, len);
    if !pinned && stream.capturing() {
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    count(stream, |c| c.bytes_dtoh += len as u64);
    let sequence = stream.enqueue(Work::DtoH {
        dst: dst as usize,
        src,
        len,
    });
    if !pinned {
        // Pageable memory: the copy has landed when the call returns.
        stream.wait_for(sequence);
        stream.ctx.check()?;
    }
    Ok(())
}

/// Queues a device-to-device copy on `stream`.
fn dtod(driver: &Driver, stream: &Stream, dst: u64, src: u64, len: usize) -> Result<u64, CUresult> {
    if len == 0 {
        return Ok(0);
    }
    let from = check_range(driver, src, len)?;
    let to = check_range(driver, dst, len)?;
    count(stream, |c| {
        if from == to {
            c.bytes_dtod += len as u64
        } else {
            c.bytes_peer += len as u64
        }
    });
    Ok(stream.enqueue(Work::DtoD { dst, src, len }))
}

/// Queues a memset on `stream`.
fn memset(
    driver: &Driver,
    stream: &Stream,
    dst: u64,
    value: u32,
    elem: usize,
    count: usize,
) -> Result<u64, CUresult> {
    if count == 0 {
        return Ok(0);
    }
    if !dst.is_multiple_of(elem as u64) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let bytes = elem.checked_mul(count).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    check_range(driver, dst, bytes)?;
    crate::stream::count(stream, |c| c.bytes_memset += bytes as u64);
    Ok(stream.enqueue(Work::Memset {
        dst,
        value,
        elem,
        count,
    }))
}

/// Waits for item `sequence` of a synchronous call's stream and reports the context's error.
fn finish(stream: &Stream, sequence: u64) -> Result<(), CUresult> {
    stream.wait_for(sequence);
    stream.ctx.check()
}

/// The first `.entry` name in PTX text, to name the module in messages.
fn module_name(text: &str) -> String {
    text.split(".entry")
        .nth(1)
        .and_then(|rest| {
            rest.split(|c: char| c == '(' || c.is_whitespace())
                .find(|s| !s.is_empty())
        })
        .map_or_else(
            || "module".to_string(),
            |name| format!("module of `{name}`"),
        )
}

/// Loads PTX text into the current context; `log` receives an error message if given.
unsafe fn load_module(
    image: *const c_void,
    log: Option<(*mut c_char, usize)>,
) -> Result<u64, CUresult> {
    let driver = driver()?;
    let (ctx, _) = driver.current()?;
    non_null(image)?;
    let bytes = CStr::from_ptr(image as *const c_char).to_bytes();
    let report = |message: &str| {
        eprintln!("tandem-cuda-emu: {message}");
        if let Some((buffer, size)) = log {
            if !buffer.is_null() && size > 0 {
                let n = message.len().min(size - 1);
                std::ptr::copy_nonoverlapping(message.as_ptr(), buffer as *mut u8, n);
                *buffer.add(n) = 0;
            }
        }
    };
    let Ok(text) = std::str::from_utf8(bytes) else {
        report("module image: not PTX text (this driver runs PTX only)");
        return Err(CUDA_ERROR_INVALID_IMAGE);
    };
    let name = module_name(text);
    let module = match tandem_ptx::Module::parse(text) {
        Ok(module) => module,
        Err(err) => {
            report(&format!("{name}: {err}"));
            return Err(CUDA_ERROR_INVALID_PTX);
        }
    };
    let version = module.version();
    if isa_min_driver(version) > driver.config.driver_version {
        report(&format!(
            "{name}: PTX ISA {}.{} needs a newer driver than CUDA {}.{}",
            version.0,
            version.1,
            driver.config.driver_version / 1000,
            driver.config.driver_version % 1000 / 10
        ));
        return Err(CUDA_ERROR_UNSUPPORTED_PTX_VERSION);
    }
    let target = module
        .target()
        .trim_end_matches(|c: char| c.is_ascii_alphabetic());
    if let Some(sm) = target
        .strip_prefix("sm_")
        .and_then(|n| n.parse::<u32>().ok())
    {
        let capability = driver.config.capability;
        if sm > capability {
            report(&format!(
                "{name}: target {} is newer than the device (sm_{capability})",
                module.target()
            ));
            return Err(CUDA_ERROR_NO_BINARY_FOR_GPU);
        }
    }
    // Module variables live in device memory of the loading context, initialised as the PTX
    // says, like any allocation (so every access to them is checked).
    let mut globals = Vec::with_capacity(module.globals().len());
    for variable in module.globals() {
        let size = variable.size.max(1) as u64;
        let base = match driver.memory.allocate(ctx.device, ctx.id, size) {
            Ok(base) => base,
            Err(code) => {
                free_all(driver, &globals);
                return Err(code);
            }
        };
        globals.push(base);
        if let Some(allocation) = driver.memory.find(base, size) {
            let bytes = &variable.initial[..variable.size.min(variable.initial.len())];
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), allocation.host(base), bytes.len());
        }
    }
    let id = driver.id();
    driver.tables().modules.insert(
        id,
        state::ModuleEntry {
            ctx: ctx.id,
            module: Arc::new(module),
            functions: Default::default(),
            globals: Arc::new(globals),
        },
    );
    Ok(id)
}

/// Frees the allocations of a module's variables.
fn free_all(driver: &Driver, globals: &[u64]) {
    for &base in globals {
        // Allocated by the module load and known to nobody else: freeing cannot fail.
        let _ = driver.memory.free(base);
    }
}

/// Packs a launch's parameters as `kernel` lays them out.
unsafe fn pack_params(
    kernel: &tandem_ptx::Kernel,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<Vec<u8>, CUresult> {
    let bytes = kernel.param_bytes();
    if !params.is_null() && !extra.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if !params.is_null() {
        let mut buffer = vec![0u8; bytes];
        for (i, param) in kernel.params().iter().enumerate() {
            let value = *params.add(i);
            non_null(value)?;
            let slot = buffer
                .get_mut(param.offset..param.offset + param.size)
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            std::ptr::copy_nonoverlapping(value as *const u8, slot.as_mut_ptr(), param.size);
        }
        return Ok(buffer);
    }
    if !extra.is_null() {
        let (mut pointer, mut size) = (std::ptr::null::<u8>(), None);
        let mut i = 0;
        loop {
            match *extra.add(i) as usize {
                0 => break,
                1 => pointer = *extra.add(i + 1) as *const u8,
                2 => {
                    let p = *extra.add(i + 1) as *const usize;
                    non_null(p)?;
                    size = Some(*p);
                }
                _ => return Err(CUDA_ERROR_INVALID_VALUE),
            }
            i += 2;
        }
        if size != Some(bytes) || (pointer.is_null() && bytes > 0) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if bytes == 0 {
            return Ok(Vec::new());
        }
        return Ok(std::slice::from_raw_parts(pointer, bytes).to_vec());
    }
    if bytes > 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(Vec::new())
}

/// Waits for every stream of every context (before pinned memory goes away).
fn drain_all(driver: &Driver) {
    let streams: Vec<Arc<Stream>> = {
        let tables = driver.tables();
        tables
            .streams
            .values()
            .cloned()
            .chain(tables.contexts.values().map(|c| c.null_stream.clone()))
            .collect()
    };
    for stream in streams {
        stream.drain();
    }
}

/// Handles of the graph's event records renumbered for one more launch.
fn renumber(items: &[Work]) -> Vec<Work> {
    items
        .iter()
        .map(|item| match item {
            Work::Record { event, .. } => Work::Record {
                event: event.clone(),
                generation: event.issue(),
            },
            Work::Graph(inner) => Work::Graph(renumber(inner)),
            other => other.clone(),
        })
        .collect()
}

api! {
    /// Initialises the driver, reading the `TANDEM_EMU_*` variables.
    fn cuInit(flags: c_uint) {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        state::init().map(|_| ())
    }

    /// The emulated CUDA version (`TANDEM_EMU_DRIVER_VERSION`); callable before `cuInit`.
    fn cuDriverGetVersion(version: *mut c_int) {
        let value = match state::try_driver() {
            Some(driver) => driver.config.driver_version,
            None => crate::config::Config::from_env()?.driver_version,
        };
        put(version, value as c_int)
    }

    /// The number of devices.
    fn cuDeviceGetCount(count: *mut c_int) {
        put(count, driver()?.config.devices as c_int)
    }

    /// Device `ordinal`'s handle: the ordinal itself.
    fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) {
        driver()?.device(ordinal)?;
        put(device, ordinal)
    }

    /// A device attribute (unknown ones: `CUDA_ERROR_INVALID_VALUE`).
    fn cuDeviceGetAttribute(value: *mut c_int, attribute: c_int, device: CUdevice) {
        let driver = driver()?;
        driver.device(device)?;
        let config = &driver.config;
        let v = device_attribute(attribute, config.capability).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        put(value, v)
    }

    /// The device's name, truncated to `len - 1` bytes and NUL-terminated.
    fn cuDeviceGetName(name: *mut c_char, len: c_int, device: CUdevice) {
        driver()?.device(device)?;
        if name.is_null() || len <= 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let n = DEVICE_NAME.len().min(len as usize - 1);
        std::ptr::copy_nonoverlapping(DEVICE_NAME.as_ptr(), name as *mut u8, n);
        *name.add(n) = 0;
        Ok(())
    }

    /// The device's memory (`TANDEM_EMU_MEMORY`).
    fn cuDeviceTotalMem_v2(bytes: *mut usize, device: CUdevice) {
        let driver = driver()?;
        driver.device(device)?;
        put(bytes, driver.config.memory as usize)
    }

    /// A UUID that names the device ordinal.
    fn cuDeviceGetUuid(uuid: *mut [u8; 16], device: CUdevice) {
        let d = driver()?.device(device)?;
        let mut bytes = *b"tandem-cuda-emu\0";
        bytes[15] = d as u8;
        put(uuid, bytes)
    }

    /// [`cuDeviceGetUuid`].
    fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], device: CUdevice) {
        let status = cuDeviceGetUuid(uuid, device);
        if status == CUDA_SUCCESS { Ok(()) } else { Err(status) }
    }

    /// Whether `device` can access `peer`'s memory: any two different devices can.
    fn cuDeviceCanAccessPeer(can: *mut c_int, device: CUdevice, peer: CUdevice) {
        let driver = driver()?;
        let (a, b) = (driver.device(device)?, driver.device(peer)?);
        put(can, c_int::from(a != b))
    }

    /// Retains the device's primary context (creating it on first retain).
    fn cuDevicePrimaryCtxRetain(ctx: *mut Handle, device: CUdevice) {
        let driver = driver()?;
        let d = driver.device(device)?;
        non_null(ctx)?;
        let mut tables = driver.tables();
        let id = match tables.primary[d].ctx {
            Some(id) => id,
            None => {
                let id = driver.create_context(&mut tables, d)?;
                tables.primary[d].ctx = Some(id);
                id
            }
        };
        tables.primary[d].refs += 1;
        put(ctx, handle(id))
    }

    /// Releases the primary context; the last release destroys it (its memory, modules and
    /// streams with it), as on hardware.
    fn cuDevicePrimaryCtxRelease_v2(device: CUdevice) {
        let driver = driver()?;
        let d = driver.device(device)?;
        let destroy = {
            let mut tables = driver.tables();
            let primary = &mut tables.primary[d];
            if primary.refs == 0 {
                return Err(CUDA_ERROR_INVALID_CONTEXT);
            }
            primary.refs -= 1;
            if primary.refs == 0 { primary.ctx.take() } else { None }
        };
        if let Some(id) = destroy {
            driver.destroy_context(id)?;
        }
        Ok(())
    }

    /// Destroys the primary context whatever its reference count.
    fn cuDevicePrimaryCtxReset_v2(device: CUdevice) {
        let driver = driver()?;
        let d = driver.device(device)?;
        let destroy = {
            let mut tables = driver.tables();
            tables.primary[d].refs = 0;
            tables.primary[d].ctx.take()
        };
        if let Some(id) = destroy {
            driver.destroy_context(id)?;
        }
        Ok(())
    }

    /// The primary context's flags and whether it is active.
    fn cuDevicePrimaryCtxGetState(device: CUdevice, flags: *mut c_uint, active: *mut c_int) {
        let driver = driver()?;
        let d = driver.device(device)?;
        let primary = driver.tables().primary[d];
        put(flags, primary.flags)?;
        put(active, c_int::from(primary.ctx.is_some()))
    }

    /// Sets the primary context's flags (kept, otherwise ignored).
    fn cuDevicePrimaryCtxSetFlags_v2(device: CUdevice, flags: c_uint) {
        let driver = driver()?;
        let d = driver.device(device)?;
        driver.tables().primary[d].flags = flags;
        Ok(())
    }

    /// Creates a context and makes it current (pushed on the thread's stack).
    fn cuCtxCreate_v2(ctx: *mut Handle, _flags: c_uint, device: CUdevice) {
        let driver = driver()?;
        let d = driver.device(device)?;
        non_null(ctx)?;
        let id = driver.create_context(&mut driver.tables(), d)?;
        state::push_current(id);
        put(ctx, handle(id))
    }

    /// Destroys a context made with `cuCtxCreate` (waits for its streams first; works on a
    /// context with a sticky error).
    fn cuCtxDestroy_v2(ctx: Handle) {
        let driver = driver()?;
        let id = key(ctx);
        if driver.tables().primary.iter().any(|p| p.ctx == Some(id)) {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        driver.destroy_context(id)
    }

    /// Makes `ctx` current on this thread (NULL: none).
    fn cuCtxSetCurrent(ctx: Handle) {
        let driver = driver()?;
        let id = key(ctx);
        if id == 0 {
            state::set_current(None);
            return Ok(());
        }
        if !driver.tables().contexts.contains_key(&id) {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        state::set_current(Some(id));
        Ok(())
    }

    /// This thread's current context (NULL if none).
    fn cuCtxGetCurrent(ctx: *mut Handle) {
        driver()?;
        put(ctx, handle(state::current_id().unwrap_or(0)))
    }

    /// Pushes `ctx` on this thread's context stack.
    fn cuCtxPushCurrent_v2(ctx: Handle) {
        let driver = driver()?;
        let id = key(ctx);
        if !driver.tables().contexts.contains_key(&id) {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        state::push_current(id);
        Ok(())
    }

    /// Pops this thread's current context.
    fn cuCtxPopCurrent_v2(ctx: *mut Handle) {
        driver()?;
        let id = state::pop_current().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if !ctx.is_null() {
            *ctx = handle(id);
        }
        Ok(())
    }

    /// The current context's device.
    fn cuCtxGetDevice(device: *mut CUdevice) {
        let (ctx, _) = driver()?.current()?;
        put(device, ctx.device as CUdevice)
    }

    /// The context's API version (3020, as CUDA reports for every modern context).
    fn cuCtxGetApiVersion(ctx: Handle, version: *mut c_uint) {
        let driver = driver()?;
        let id = if ctx.is_null() { state::current_id().ok_or(CUDA_ERROR_INVALID_CONTEXT)? } else { key(ctx) };
        if !driver.tables().contexts.contains_key(&id) {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        put(version, 3020)
    }

    /// Stream priorities: only 0.
    fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) {
        driver()?.current()?;
        if !least.is_null() {
            *least = 0;
        }
        if !greatest.is_null() {
            *greatest = 0;
        }
        Ok(())
    }

    /// Waits for every stream of the current context; returns its sticky error if any.
    fn cuCtxSynchronize() {
        let driver = driver()?;
        let id = state::current_id().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        let streams = driver.streams_of(id);
        if streams.is_empty() {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        stats::with(|s| s.context_synchronizations += 1);
        for stream in &streams {
            if stream.capturing() {
                return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            }
        }
        for stream in &streams {
            stream.drain();
        }
        streams[0].ctx.check()
    }

    /// Lets the current context's kernels access `peer`'s memory.
    fn cuCtxEnablePeerAccess(peer: Handle, flags: c_uint) {
        let driver = driver()?;
        let (ctx, _) = driver.current()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let peer_device = driver.tables().contexts.get(&key(peer)).map(|c| c.core.device).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if peer_device == ctx.device {
            return Err(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
        }
        if !ctx.peers.lock().unwrap_or_else(|p| p.into_inner()).insert(key(peer)) {
            return Err(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        }
        Ok(())
    }

    /// Withdraws access to `peer`'s memory.
    fn cuCtxDisablePeerAccess(peer: Handle) {
        let driver = driver()?;
        let (ctx, _) = driver.current()?;
        if !driver.tables().contexts.contains_key(&key(peer)) {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        if !ctx.peers.lock().unwrap_or_else(|p| p.into_inner()).remove(&key(peer)) {
            return Err(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
        }
        Ok(())
    }

    /// Creates a stream in the current context, with its worker thread.
    fn cuStreamCreate(stream: *mut Handle, _flags: c_uint) {
        let driver = driver()?;
        let (ctx, _) = driver.current()?;
        non_null(stream)?;
        let id = driver.id();
        let created = Stream::start(id, ctx, driver.runner())?;
        driver.tables().streams.insert(id, created);
        put(stream, handle(id))
    }

    /// [`cuStreamCreate`]; priorities are ignored.
    fn cuStreamCreateWithPriority(stream: *mut Handle, flags: c_uint, _priority: c_int) {
        let status = cuStreamCreate(stream, flags);
        if status == CUDA_SUCCESS { Ok(()) } else { Err(status) }
    }

    /// Destroys a stream: returns at once; work already queued still runs.
    fn cuStreamDestroy_v2(stream: Handle) {
        let driver = driver()?;
        let removed = driver.tables().streams.remove(&key(stream)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        removed.close();
        Ok(())
    }

    /// Waits for everything queued on the stream.
    fn cuStreamSynchronize(stream: Handle) {
        let stream = driver()?.stream(key(stream))?;
        if stream.capturing() {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        count(&stream, |c| c.stream_synchronizations += 1);
        stream.drain();
        stream.ctx.check()
    }

    /// Whether the stream's work has all run (`CUDA_ERROR_NOT_READY` if not).
    fn cuStreamQuery(stream: Handle) {
        let stream = driver()?.stream(key(stream))?;
        if stream.idle() { stream.ctx.check() } else { Err(CUDA_ERROR_NOT_READY) }
    }

    /// The stream's context.
    fn cuStreamGetCtx(stream: Handle, ctx: *mut Handle) {
        let stream = driver()?.stream(key(stream))?;
        put(ctx, handle(stream.ctx.id))
    }

    /// Makes the stream's later work wait for the event's latest record.
    fn cuStreamWaitEvent(stream: Handle, event: Handle, _flags: c_uint) {
        let driver = driver()?;
        let stream = driver.stream(key(stream))?;
        let event = driver.tables().events.get(&key(event)).cloned().ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let generation = event.latest();
        if generation > 0 {
            stream.enqueue(Work::Wait { event, generation });
        }
        Ok(())
    }

    /// Starts capturing the stream's work into a graph.
    fn cuStreamBeginCapture_v2(stream: Handle, _mode: c_int) {
        if key(stream) <= 2 {
            // The legacy NULL stream cannot be captured.
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        driver()?.stream(key(stream))?.begin_capture()
    }

    /// Ends the capture, returning the graph of what was captured.
    fn cuStreamEndCapture(stream: Handle, graph: *mut Handle) {
        let driver = driver()?;
        let stream = driver.stream(key(stream))?;
        non_null(graph)?;
        let items = stream.end_capture()?;
        let id = driver.id();
        driver.tables().graphs.insert(id, GraphEntry { ctx: stream.ctx.id, items: Arc::new(items) });
        put(graph, handle(id))
    }

    /// Whether the stream is capturing (`CU_STREAM_CAPTURE_STATUS_ACTIVE` = 1 or NONE = 0).
    fn cuStreamIsCapturing(stream: Handle, status: *mut c_int) {
        let stream = driver()?.stream(key(stream))?;
        put(status, c_int::from(stream.capturing()))
    }

    /// Instantiates a graph: an executable copy of its items.
    fn cuGraphInstantiate_v2(exec: *mut Handle, graph: Handle, _error_node: *mut Handle, _log: *mut c_char, _log_size: usize) {
        let driver = driver()?;
        let mut tables = driver.tables();
        let entry = tables.graphs.get(&key(graph)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let copy = GraphEntry { ctx: entry.ctx, items: entry.items.clone() };
        let id = driver.id();
        tables.execs.insert(id, copy);
        put(exec, handle(id))
    }

    /// Queues the executable graph's items, in order, on `stream`.
    fn cuGraphLaunch(exec: Handle, stream: Handle) {
        let driver = driver()?;
        let stream = driver.stream(key(stream))?;
        let items = driver.tables().execs.get(&key(exec)).map(|e| e.items.clone()).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        count_graph(&stream, &items, |at| check_range(driver, at, 1).ok());
        stream.enqueue(Work::Graph(renumber(&items)));
        Ok(())
    }

    /// Destroys an executable graph.
    fn cuGraphExecDestroy(exec: Handle) {
        driver()?.tables().execs.remove(&key(exec)).map(|_| ()).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// Destroys a graph.
    fn cuGraphDestroy(graph: Handle) {
        driver()?.tables().graphs.remove(&key(graph)).map(|_| ()).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// Creates an event in the current context.
    fn cuEventCreate(event: *mut Handle, flags: c_uint) {
        let driver = driver()?;
        let (ctx, _) = driver.current()?;
        non_null(event)?;
        let id = driver.id();
        driver.tables().events.insert(id, Arc::new(Event::new(id, ctx.id, flags & 2 != 0)));
        put(event, handle(id))
    }

    /// Records the event on the stream: it completes when the work queued before it has run.
    fn cuEventRecord(event: Handle, stream: Handle) {
        let driver = driver()?;
        let stream = driver.stream(key(stream))?;
        let event = driver.tables().events.get(&key(event)).cloned().ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if event.ctx != stream.ctx.id {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        // A record captured into a graph gets its number when the graph is launched.
        let generation = if stream.capturing() { 0 } else { event.issue() };
        stream.enqueue(Work::Record { event, generation });
        Ok(())
    }

    /// Whether the event's latest record has completed (`CUDA_ERROR_NOT_READY` if not).
    fn cuEventQuery(event: Handle) {
        let event = driver()?.tables().events.get(&key(event)).cloned().ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if event.query().0 { Ok(()) } else { Err(CUDA_ERROR_NOT_READY) }
    }

    /// Waits for the event's latest record.
    fn cuEventSynchronize(event: Handle) {
        let driver = driver()?;
        let event = driver.tables().events.get(&key(event)).cloned().ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        stats::with(|s| s.event_synchronizations += 1);
        event.wait(event.latest());
        let tables = driver.tables();
        match tables.contexts.get(&event.ctx) {
            Some(context) => context.core.check(),
            None => Err(CUDA_ERROR_INVALID_CONTEXT),
        }
    }

    /// Destroys an event.
    fn cuEventDestroy_v2(event: Handle) {
        driver()?.tables().events.remove(&key(event)).map(|_| ()).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// Host time in milliseconds between the completions of two events' latest records.
    fn cuEventElapsedTime(ms: *mut f32, start: Handle, end: Handle) {
        let driver = driver()?;
        let (a, b) = {
            let tables = driver.tables();
            let get = |h: Handle| tables.events.get(&key(h)).cloned().ok_or(CUDA_ERROR_INVALID_HANDLE);
            (get(start)?, get(end)?)
        };
        if a.no_timing || b.no_timing {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let ((done_a, time_a), (done_b, time_b)) = (a.query(), b.query());
        if !done_a || !done_b {
            return Err(CUDA_ERROR_NOT_READY);
        }
        let (Some(time_a), Some(time_b)) = (time_a, time_b) else {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        };
        let elapsed = if time_b >= time_a {
            time_b.duration_since(time_a).as_secs_f32() * 1000.0
        } else {
            -(time_a.duration_since(time_b).as_secs_f32() * 1000.0)
        };
        put(ms, elapsed)
    }

    /// Loads a PTX module.
    fn cuModuleLoadData(module: *mut Handle, image: *const c_void) {
        non_null(module)?;
        let id = load_module(image, None)?;
        put(module, handle(id))
    }

    /// Loads a PTX module; honours `CU_JIT_ERROR_LOG_BUFFER` (and its size), ignores the rest.
    fn cuModuleLoadDataEx(module: *mut Handle, image: *const c_void, count: c_uint, options: *mut c_int, values: *mut *mut c_void) {
        if module.is_null() || (count > 0 && (options.is_null() || values.is_null())) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (mut buffer, mut size) = (std::ptr::null_mut::<c_char>(), 0usize);
        for i in 0..count as usize {
            match *options.add(i) {
                5 => buffer = *values.add(i) as *mut c_char,
                6 => size = *values.add(i) as usize,
                _ => {}
            }
        }
        let id = load_module(image, Some((buffer, size)))?;
        put(module, handle(id))
    }

    /// Unloads a module (its functions become invalid handles).
    fn cuModuleUnload(module: Handle) {
        let driver = driver()?;
        let mut tables = driver.tables();
        let entry = tables.modules.remove(&key(module)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        tables.functions.retain(|_, f| f.module != key(module));
        drop(tables);
        // Kernels still queued may read the module's variables.
        for stream in driver.streams_of(entry.ctx) {
            stream.drain();
        }
        free_all(driver, &entry.globals);
        Ok(())
    }

    /// The address and size of the module's `.global`/`.const` variable `name`
    /// (`CUDA_ERROR_NOT_FOUND` if none); either output may be null.
    fn cuModuleGetGlobal_v2(pointer: *mut CUdeviceptr, bytes: *mut usize, module: Handle, name: *const c_char) {
        let driver = driver()?;
        driver.current()?;
        non_null(name)?;
        let name = CStr::from_ptr(name).to_str().map_err(|_| CUDA_ERROR_NOT_FOUND)?;
        let tables = driver.tables();
        let entry = tables.modules.get(&key(module)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let index = entry
            .module
            .globals()
            .iter()
            .position(|v| v.name == name)
            .ok_or(CUDA_ERROR_NOT_FOUND)?;
        if !pointer.is_null() {
            put(pointer, entry.globals[index])?;
        }
        if !bytes.is_null() {
            put(bytes, entry.module.globals()[index].size)?;
        }
        Ok(())
    }

    /// The module's `.entry` called `name` (`CUDA_ERROR_NOT_FOUND` if none).
    fn cuModuleGetFunction(function: *mut Handle, module: Handle, name: *const c_char) {
        let driver = driver()?;
        if function.is_null() || name.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let name = CStr::from_ptr(name).to_str().map_err(|_| CUDA_ERROR_NOT_FOUND)?;
        let mut tables = driver.tables();
        let entry = tables.modules.get_mut(&key(module)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if let Some(&id) = entry.functions.get(name) {
            return put(function, handle(id));
        }
        let kernel = entry.module.kernel(name).ok_or(CUDA_ERROR_NOT_FOUND)?;
        let id = driver.id();
        entry.functions.insert(name.to_string(), id);
        let f = state::FunctionEntry {
            ctx: entry.ctx,
            module: key(module),
            kernel,
            version: entry.module.version(),
            globals: entry.globals.clone(),
        };
        tables.functions.insert(id, f);
        put(function, handle(id))
    }

    /// A function attribute.
    fn cuFuncGetAttribute(value: *mut c_int, attribute: c_int, function: Handle) {
        let driver = driver()?;
        let tables = driver.tables();
        let f = tables.functions.get(&key(function)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let shared = f.kernel.static_shared_bytes();
        let v = match attribute {
            0 => MAX_THREADS_PER_BLOCK as usize,
            1 => shared,
            2 | 3 | 7 => 0,
            4 => 32,
            5 => (f.version.0 * 10 + f.version.1) as usize,
            6 => 90,
            8 => SHARED_PER_BLOCK.saturating_sub(shared),
            9 => 0,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        put(value, v as c_int)
    }

    /// Queues a kernel launch after checking its shape and parameters.
    fn cuLaunchKernel(
        function: Handle,
        grid_x: c_uint, grid_y: c_uint, grid_z: c_uint,
        block_x: c_uint, block_y: c_uint, block_z: c_uint,
        shared: c_uint, stream: Handle,
        params: *mut *mut c_void, extra: *mut *mut c_void,
    ) {
        let driver = driver()?;
        let (ctx, _) = driver.current()?;
        let stream = driver.stream(key(stream))?;
        let (kernel, globals) = {
            let tables = driver.tables();
            let f = tables.functions.get(&key(function)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            if f.ctx != ctx.id {
                return Err(CUDA_ERROR_INVALID_CONTEXT);
            }
            (f.kernel.clone(), f.globals.clone())
        };
        if stream.ctx.id != ctx.id {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let grid = Dim3 { x: grid_x, y: grid_y, z: grid_z };
        let block = Dim3 { x: block_x, y: block_y, z: block_z };
        let shared = shared as usize;
        check_launch(grid, block, kernel.static_shared_bytes().saturating_add(shared))?;
        let params = pack_params(&kernel, params, extra)?;
        count(&stream, |c| c.kernel_launches += 1);
        stream.enqueue(Work::Launch { kernel, grid, block, shared, params: Arc::new(params), globals });
        Ok(())
    }

    /// Allocates device memory (every byte 0xFF) in the current context.
    fn cuMemAlloc_v2(pointer: *mut CUdeviceptr, bytes: usize) {
        let driver = driver()?;
        let (ctx, _) = driver.current()?;
        non_null(pointer)?;
        let base = driver.memory.allocate(ctx.device, ctx.id, bytes as u64)?;
        stats::with(|s| {
            s.allocations += 1;
            s.allocation_bytes += bytes as u64;
        });
        put(pointer, base)
    }

    /// Frees an allocation after its context's streams are idle (`CUDA_ERROR_INVALID_VALUE`
    /// for anything but a live allocation's base).
    fn cuMemFree_v2(pointer: CUdeviceptr) {
        let driver = driver()?;
        driver.current()?;
        let allocation = driver.memory.get_base(pointer)?;
        for stream in driver.streams_of(allocation.ctx) {
            stream.drain();
        }
        driver.memory.free(pointer)
    }

    /// Free and total memory of the current context's device.
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        let driver = driver()?;
        let (ctx, _) = driver.current()?;
        let (used, limit) = driver.memory.info(ctx.device);
        put(free, limit.saturating_sub(used) as usize)?;
        put(total, limit as usize)
    }

    /// Allocates pinned host memory (tracked: copies to and from it are truly asynchronous).
    fn cuMemAllocHost_v2(pointer: *mut *mut c_void, bytes: usize) {
        let driver = driver()?;
        driver.current()?;
        non_null(pointer)?;
        let p = driver.pinned.allocate(bytes)?;
        put(pointer, p as *mut c_void)
    }

    /// [`cuMemAllocHost_v2`]; the flags are ignored.
    fn cuMemHostAlloc(pointer: *mut *mut c_void, bytes: usize, _flags: c_uint) {
        let status = cuMemAllocHost_v2(pointer, bytes);
        if status == CUDA_SUCCESS { Ok(()) } else { Err(status) }
    }

    /// Frees pinned host memory after every stream is idle.
    fn cuMemFreeHost(pointer: *mut c_void) {
        let driver = driver()?;
        drain_all(driver);
        driver.pinned.free(pointer as usize)
    }

    /// Synchronous memset of bytes.
    fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, n: usize) {
        let driver = driver()?;
        let (_, null) = driver.current()?;
        let sequence = memset(driver, &null, dst, u32::from(value), 1, n)?;
        finish(&null, sequence)
    }

    /// Synchronous memset of 16-bit values.
    fn cuMemsetD16_v2(dst: CUdeviceptr, value: u16, n: usize) {
        let driver = driver()?;
        let (_, null) = driver.current()?;
        let sequence = memset(driver, &null, dst, u32::from(value), 2, n)?;
        finish(&null, sequence)
    }

    /// Synchronous memset of 32-bit values.
    fn cuMemsetD32_v2(dst: CUdeviceptr, value: c_uint, n: usize) {
        let driver = driver()?;
        let (_, null) = driver.current()?;
        let sequence = memset(driver, &null, dst, value, 4, n)?;
        finish(&null, sequence)
    }

    /// Memset of bytes on a stream.
    fn cuMemsetD8Async(dst: CUdeviceptr, value: u8, n: usize, stream: Handle) {
        let driver = driver()?;
        let stream = driver.stream(key(stream))?;
        memset(driver, &stream, dst, u32::from(value), 1, n).map(|_| ())
    }

    /// Memset of 16-bit values on a stream.
    fn cuMemsetD16Async(dst: CUdeviceptr, value: u16, n: usize, stream: Handle) {
        let driver = driver()?;
        let stream = driver.stream(key(stream))?;
        memset(driver, &stream, dst, u32::from(value), 2, n).map(|_| ())
    }

    /// Memset of 32-bit values on a stream.
    fn cuMemsetD32Async(dst: CUdeviceptr, value: c_uint, n: usize, stream: Handle) {
        let driver = driver()?;
        let stream = driver.stream(key(stream))?;
        memset(driver, &stream, dst, value, 4, n).map(|_| ())
    }

    /// Synchronous host-to-device copy.
    fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, bytes: usize) {
        let driver = driver()?;
        let (_, null) = driver.current()?;
        let sequence = htod(driver, &null, dst, src, bytes)?;
        finish(&null, sequence)
    }

    /// Synchronous device-to-host copy.
    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize) {
        let driver = driver()?;
        let (_, null) = driver.current()?;
        dtoh(driver, &null, dst, src, bytes)?;
        null.drain();
        null.ctx.check()
    }

    /// Synchronous device-to-device copy.
    fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) {
        let driver = driver()?;
        let (_, null) = driver.current()?;
        let sequence = dtod(driver, &null, dst, src, bytes)?;
        finish(&null, sequence)
    }

    /// Host-to-device copy on a stream (pageable sources are snapshot now).
    fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, bytes: usize, stream: Handle) {
        let driver = driver()?;
        let stream = driver.stream(key(stream))?;
        htod(driver, &stream, dst, src, bytes).map(|_| ())
    }

    /// Device-to-host copy on a stream (into pageable memory it completes before returning).
    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize, stream: Handle) {
        let driver = driver()?;
        let stream = driver.stream(key(stream))?;
        dtoh(driver, &stream, dst, src, bytes)
    }

    /// Device-to-device copy on a stream.
    fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: Handle) {
        let driver = driver()?;
        let stream = driver.stream(key(stream))?;
        dtod(driver, &stream, dst, src, bytes).map(|_| ())
    }

    /// Synchronous copy between contexts (needs no peer access).
    fn cuMemcpyPeer(dst: CUdeviceptr, dst_ctx: Handle, src: CUdeviceptr, src_ctx: Handle, bytes: usize) {
        let driver = driver()?;
        let (_, null) = driver.current()?;
        {
            let tables = driver.tables();
            if !tables.contexts.contains_key(&key(dst_ctx)) || !tables.contexts.contains_key(&key(src_ctx)) {
                return Err(CUDA_ERROR_INVALID_CONTEXT);
            }
        }
        let sequence = dtod(driver, &null, dst, src, bytes)?;
        finish(&null, sequence)
    }

    /// Copy between contexts on a stream.
    fn cuMemcpyPeerAsync(dst: CUdeviceptr, dst_ctx: Handle, src: CUdeviceptr, src_ctx: Handle, bytes: usize, stream: Handle) {
        let driver = driver()?;
        let stream = driver.stream(key(stream))?;
        {
            let tables = driver.tables();
            if !tables.contexts.contains_key(&key(dst_ctx)) || !tables.contexts.contains_key(&key(src_ctx)) {
                return Err(CUDA_ERROR_INVALID_CONTEXT);
            }
        }
        dtod(driver, &stream, dst, src, bytes).map(|_| ())
    }

    /// Unified-addressing copy: each side is device memory if an allocation covers it, host
    /// memory otherwise.
    fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) {
        let status = cuMemcpyAsync(dst, src, bytes, std::ptr::null_mut());
        if status != CUDA_SUCCESS {
            return Err(status);
        }
        let (_, null) = driver()?.current()?;
        null.drain();
        null.ctx.check()
    }

    /// [`cuMemcpy`] on a stream. Host-to-host copies run at once.
    fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: Handle) {
        let driver = driver()?;
        let stream = driver.stream(key(stream))?;
        let device = |p: u64| driver.memory.find(p, bytes as u64).is_some();
        match (device(dst), device(src)) {
            (true, true) => dtod(driver, &stream, dst, src, bytes).map(|_| ()),
            (true, false) => htod(driver, &stream, dst, src as *const c_void, bytes).map(|_| ()),
            (false, true) => dtoh(driver, &stream, dst as *mut c_void, src, bytes),
            (false, false) => {
                if bytes > 0 {
                    if dst == 0 || src == 0 {
                        return Err(CUDA_ERROR_INVALID_VALUE);
                    }
                    std::ptr::copy(src as *const u8, dst as *mut u8, bytes);
                }
                Ok(())
            }
        }
    }

    /// The name of an error code as a static C string (unknown: NULL and
    /// `CUDA_ERROR_INVALID_VALUE`).
    fn cuGetErrorName(code: CUresult, name: *mut *const c_char) {
        let found = ALL_C.iter().find(|(value, _, _)| *value == code);
        non_null(name)?;
        *name = found.map_or(std::ptr::null(), |(_, n, _)| n.as_ptr() as *const c_char);
        found.map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// The description of an error code as a static C string (unknown: NULL and
    /// `CUDA_ERROR_INVALID_VALUE`).
    fn cuGetErrorString(code: CUresult, text: *mut *const c_char) {
        let found = ALL_C.iter().find(|(value, _, _)| *value == code);
        non_null(text)?;
        *text = found.map_or(std::ptr::null(), |(_, _, t)| t.as_ptr() as *const c_char);
        found.map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE)
    }
}
