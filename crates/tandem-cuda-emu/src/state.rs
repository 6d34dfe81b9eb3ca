//! The driver's process-wide state: configuration, devices, contexts and the handle tables.
//!
//! Handles given to callers (contexts, streams, events, modules, functions, graphs) are ids
//! from one counter, cast to pointers: a handle is looked up in its table and never
//! dereferenced, so a destroyed or foreign handle is `CUDA_ERROR_INVALID_HANDLE`, not a crash.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tandem_ptx::Kernel;

use crate::codes::*;
use crate::config::Config;
use crate::memory::{Memory, Pinned};
use crate::stream::{CtxCore, Event, Runner, Stream, Work};

/// A context.
#[derive(Debug)]
pub struct Context {
    /// What streams share of it.
    pub core: Arc<CtxCore>,
    /// Its legacy NULL stream (handle 0 while it is current). Legacy implicit synchronisation
    /// with the context's other blocking streams is not emulated: it is one more stream.
    pub null_stream: Arc<Stream>,
}

/// A loaded module.
#[derive(Debug)]
pub struct ModuleEntry {
    /// Its context.
    pub ctx: u64,
    /// The parsed PTX.
    pub module: Arc<tandem_ptx::Module>,
    /// Function handles already handed out, by name (cust asks for the function at every
    /// launch: one handle per name keeps the table small).
    pub functions: HashMap<String, u64>,
    /// The device address of each of the module's `.global`/`.const` variables, in
    /// `module.globals()` order (allocated and initialised at load, freed at unload).
    pub globals: Arc<Vec<u64>>,
}

/// A function handle.
#[derive(Debug)]
pub struct FunctionEntry {
    /// Its context.
    pub ctx: u64,
    /// The module it came from.
    pub module: u64,
    /// The kernel.
    pub kernel: Arc<Kernel>,
    /// The module's PTX ISA version.
    pub version: (u32, u32),
    /// The addresses of its module's variables (see [`ModuleEntry::globals`]).
    pub globals: Arc<Vec<u64>>,
}

/// A graph or an executable graph: the captured items.
#[derive(Debug)]
pub struct GraphEntry {
    /// Its context.
    pub ctx: u64,
    /// The work, in order.
    pub items: Arc<Vec<Work>>,
}

/// A device's primary context: its handle while active and its reference count.
#[derive(Debug, Default, Clone, Copy)]
pub struct Primary {
    /// The context while retained.
    pub ctx: Option<u64>,
    /// Retains minus releases.
    pub refs: u32,
    /// Flags set with `cuDevicePrimaryCtxSetFlags`.
    pub flags: u32,
}

/// Every handle table.
#[derive(Debug, Default)]
pub struct Tables {
    /// Contexts by handle.
    pub contexts: HashMap<u64, Context>,
    /// Primary context per device.
    pub primary: Vec<Primary>,
    /// Streams by handle (NULL streams are not in here).
    pub streams: HashMap<u64, Arc<Stream>>,
    /// Events by handle.
    pub events: HashMap<u64, Arc<Event>>,
    /// Modules by handle.
    pub modules: HashMap<u64, ModuleEntry>,
    /// Functions by handle.
    pub functions: HashMap<u64, FunctionEntry>,
    /// Graphs by handle.
    pub graphs: HashMap<u64, GraphEntry>,
    /// Executable graphs by handle.
    pub execs: HashMap<u64, GraphEntry>,
}

/// The initialised driver.
#[derive(Debug)]
pub struct Driver {
    /// What `cuInit` read.
    pub config: Config,
    /// Device memory.
    pub memory: Arc<Memory>,
    /// Pinned host memory.
    pub pinned: Pinned,
    tables: Mutex<Tables>,
    next_id: AtomicU64,
}

static DRIVER: OnceLock<Driver> = OnceLock::new();
/// The error `cuInit` failed with last (0: not tried or succeeded).
static INIT_ERROR: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// This thread's context stack; the top is the current context.
    static CURRENT: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Initialises the driver from the environment (once; later calls return the first outcome).
pub fn init() -> Result<&'static Driver, CUresult> {
    if let Some(driver) = DRIVER.get() {
        return Ok(driver);
    }
    let config = Config::from_env()?;
    if config.devices == 0 {
        INIT_ERROR.store(CUDA_ERROR_NO_DEVICE, Ordering::SeqCst);
        return Err(CUDA_ERROR_NO_DEVICE);
    }
    let stats = config.stats.clone();
    let mut installed = false;
    let driver = DRIVER.get_or_init(|| {
        installed = true;
        Driver {
            memory: Arc::new(Memory::new(config.devices, config.memory)),
            pinned: Pinned::default(),
            tables: Mutex::new(Tables {
                primary: vec![Primary::default(); config.devices],
                ..Tables::default()
            }),
            next_id: AtomicU64::new(0x1000),
            config,
        }
    });
    if installed && stats.is_some() {
        crate::exit::register();
    }
    Ok(driver)
}

/// The driver, once `cuInit` succeeded.
pub fn driver() -> Result<&'static Driver, CUresult> {
    DRIVER.get().ok_or(CUDA_ERROR_NOT_INITIALIZED)
}

/// The driver if initialised, without an error (for the exit handler).
pub fn try_driver() -> Option<&'static Driver> {
    DRIVER.get()
}

impl Driver {
    /// The handle tables.
    pub fn tables(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh handle.
    pub fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::SeqCst)
    }

    /// What stream workers need.
    pub fn runner(&self) -> Runner {
        Runner {
            threads: self.config.threads,
            race_check: self.config.race_check,
            profile: self.config.stats.is_some(),
            memory: self.memory.clone(),
        }
    }

    /// Checks a device ordinal.
    pub fn device(&self, ordinal: i32) -> Result<usize, CUresult> {
        usize::try_from(ordinal)
            .ok()
            .filter(|&d| d < self.config.devices)
            .ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    /// Creates a context on `device` (not made current).
    pub fn create_context(&self, tables: &mut Tables, device: usize) -> Result<u64, CUresult> {
        let id = self.id();
        let core = Arc::new(CtxCore {
            id,
            device,
            error: AtomicU32::new(0),
            peers: Mutex::new(HashSet::new()),
        });
        let null_stream = Stream::start(self.id(), core.clone(), self.runner())?;
        tables.contexts.insert(id, Context { core, null_stream });
        Ok(id)
    }

    /// Destroys context `id`: waits for its streams, then drops its streams, events, modules,
    /// functions, graphs and memory. Called without the tables locked.
    pub fn destroy_context(&self, id: u64) -> Result<(), CUresult> {
        let streams: Vec<Arc<Stream>> = {
            let mut tables = self.tables();
            let context = tables
                .contexts
                .remove(&id)
                .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
            let mut streams = vec![context.null_stream];
            let ids: Vec<u64> = tables
                .streams
                .iter()
                .filter(|(_, s)| s.ctx.id == id)
                .map(|(&k, _)| k)
                .collect();
            for key in ids {
                if let Some(stream) = tables.streams.remove(&key) {
                    streams.push(stream);
                }
            }
            tables.events.retain(|_, e| e.ctx != id);
            tables.modules.retain(|_, m| m.ctx != id);
            tables.functions.retain(|_, f| f.ctx != id);
            tables.graphs.retain(|_, g| g.ctx != id);
            tables.execs.retain(|_, g| g.ctx != id);
            for context in tables.contexts.values() {
                context
                    .core
                    .peers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
            }
            streams
        };
        for stream in &streams {
            stream.drain();
            stream.close();
        }
        self.memory.free_context(id);
        CURRENT.with(|current| current.borrow_mut().retain(|&c| c != id));
        Ok(())
    }

    /// The current context's core and NULL stream, checking its sticky error.
    pub fn current(&self) -> Result<(Arc<CtxCore>, Arc<Stream>), CUresult> {
        let id = current_id().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        let tables = self.tables();
        let context = tables.contexts.get(&id).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        context.core.check()?;
        Ok((context.core.clone(), context.null_stream.clone()))
    }

    /// Stream `handle` (0, `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`: the current context's
    /// NULL stream), checking its context's sticky error.
    pub fn stream(&self, handle: u64) -> Result<Arc<Stream>, CUresult> {
        if handle <= 2 {
            return Ok(self.current()?.1);
        }
        let stream = self
            .tables()
            .streams
            .get(&handle)
            .cloned()
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        stream.ctx.check()?;
        Ok(stream)
    }

    /// Every stream of context `ctx`, its NULL stream included.
    pub fn streams_of(&self, ctx: u64) -> Vec<Arc<Stream>> {
        let tables = self.tables();
        let mut streams: Vec<_> = tables
            .streams
            .values()
            .filter(|s| s.ctx.id == ctx)
            .cloned()
            .collect();
        if let Some(context) = tables.contexts.get(&ctx) {
            streams.push(context.null_stream.clone());
        }
        streams
    }
}

/// This thread's current context, if any.
pub fn current_id() -> Option<u64> {
    CURRENT.with(|current| current.borrow().last().copied())
}

/// Replaces this thread's current context (`None`: none).
pub fn set_current(ctx: Option<u64>) {
    CURRENT.with(|current| {
        let mut stack = current.borrow_mut();
        stack.pop();
        if let Some(ctx) = ctx {
            stack.push(ctx);
        }
    });
}

/// Pushes `ctx` on this thread's context stack.
pub fn push_current(ctx: u64) {
    CURRENT.with(|current| current.borrow_mut().push(ctx));
}

/// Pops this thread's current context.
pub fn pop_current() -> Option<u64> {
    CURRENT.with(|current| current.borrow_mut().pop())
}
