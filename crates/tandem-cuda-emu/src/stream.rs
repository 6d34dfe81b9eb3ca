//! Streams: a worker thread per stream runs its queue of work items in order, asynchronously
//! to the host; events order work across streams; graphs replay captured work.
//!
//! A failure while running an item (a kernel's illegal address, a copy to freed memory) makes
//! the stream's context unusable: the error is stored in [`CtxCore::error`] and every later
//! call in that context returns it ("sticky", as on hardware). The worker then skips the
//! context's remaining launches, copies and memsets, but still completes event records, so that
//! nobody waiting on the stream hangs.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use tandem_ptx::{Dim3, ExecError, Kernel, Launch};

use crate::codes::*;
use crate::stats;

/// What streams and launches need of a context.
#[derive(Debug)]
pub struct CtxCore {
    /// The context's handle.
    pub id: u64,
    /// Its device.
    pub device: usize,
    /// The sticky error (0 while the context is usable).
    pub error: AtomicU32,
    /// Contexts whose memory this one's kernels may access (peer access enabled).
    pub peers: Mutex<HashSet<u64>>,
}

impl CtxCore {
    /// The sticky error, if any.
    pub fn check(&self) -> Result<(), CUresult> {
        match self.error.load(Ordering::SeqCst) {
            0 => Ok(()),
            code => Err(code),
        }
    }

    /// Makes the context unusable with `code` (the first failure wins) and says why on stderr.
    pub fn fail(&self, code: CUresult, message: &str) {
        let name = describe(code).map_or("?", |(name, _)| name);
        eprintln!(
            "tandem-cuda-emu: context {:#x} (device {}): {name}: {message}",
            self.id, self.device
        );
        let _ = self
            .error
            .compare_exchange(0, code, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// Where a host-to-device copy reads.
#[derive(Debug, Clone)]
pub enum HostSource {
    /// A snapshot of pageable memory, taken when the copy was issued.
    Snapshot(Arc<Vec<u8>>),
    /// Pinned memory, read when the copy runs.
    Pinned(usize),
}

/// One item of a stream's queue (or of a captured graph).
#[derive(Debug, Clone)]
pub enum Work {
    /// A kernel launch with its packed parameters.
    Launch {
        /// The kernel.
        kernel: Arc<Kernel>,
        /// Grid dimensions.
        grid: Dim3,
        /// Block dimensions.
        block: Dim3,
        /// Dynamic shared memory bytes.
        shared: usize,
        /// The packed parameter buffer.
        params: Arc<Vec<u8>>,
        /// The addresses of the kernel's module variables.
        globals: Arc<Vec<u64>>,
    },
    /// Host to device.
    HtoD {
        /// Destination device address.
        dst: u64,
        /// The source.
        src: HostSource,
        /// Bytes.
        len: usize,
    },
    /// Device to host (`dst` is a host address).
    DtoH {
        /// Destination host address.
        dst: usize,
        /// Source device address.
        src: u64,
        /// Bytes.
        len: usize,
    },
    /// Device to device (possibly across devices).
    DtoD {
        /// Destination device address.
        dst: u64,
        /// Source device address.
        src: u64,
        /// Bytes.
        len: usize,
    },
    /// A memset of `count` elements of `elem` bytes.
    Memset {
        /// Destination device address.
        dst: u64,
        /// The value (its low `elem` bytes, little-endian).
        value: u32,
        /// Element size: 1, 2 or 4.
        elem: usize,
        /// Elements.
        count: usize,
    },
    /// Completes record number `generation` of `event`.
    Record {
        /// The event.
        event: Arc<Event>,
        /// Which record.
        generation: u64,
    },
    /// Waits until record number `generation` of `event` has completed.
    Wait {
        /// The event.
        event: Arc<Event>,
        /// Which record.
        generation: u64,
    },
    /// The items of a graph, in order.
    Graph(Vec<Work>),
    /// Blocks the stream until the gate opens (a test hook: see [`Gate`]).
    Gate(Gate),
}

/// A test hook: holds a stream's later work back until [`open`](Gate::open)ed, so that tests
/// can observe asynchronous behaviour deterministically.
#[derive(Debug, Clone, Default)]
pub struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    /// Lets the stream go on.
    pub fn open(&self) {
        *self.0 .0.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.0 .1.notify_all();
    }

    fn pass(&self) {
        let mut open = self.0 .0.lock().unwrap_or_else(|p| p.into_inner());
        while !*open {
            open = self.0 .1.wait(open).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// An event: records complete in order; waits wait for a given record.
#[derive(Debug)]
pub struct Event {
    /// The event's handle.
    pub id: u64,
    /// Its context.
    pub ctx: u64,
    /// Whether timing was disabled (`CU_EVENT_DISABLE_TIMING`).
    pub no_timing: bool,
    state: Mutex<EventState>,
    done: Condvar,
}

#[derive(Debug, Default)]
struct EventState {
    /// Records issued so far.
    recorded: u64,
    /// The latest record that completed.
    completed: u64,
    /// When it completed.
    time: Option<Instant>,
}

impl Event {
    /// A new, never recorded event.
    pub fn new(id: u64, ctx: u64, no_timing: bool) -> Event {
        Event {
            id,
            ctx,
            no_timing,
            state: Mutex::default(),
            done: Condvar::new(),
        }
    }

    /// Issues a new record; returns its number.
    pub fn issue(&self) -> u64 {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.recorded += 1;
        state.recorded
    }

    /// The latest record issued (0: never recorded).
    pub fn latest(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .recorded
    }

    fn complete(&self, generation: u64) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if generation > state.completed {
            state.completed = generation;
            state.time = Some(Instant::now());
        }
        self.done.notify_all();
    }

    /// Blocks until record `generation` has completed.
    pub fn wait(&self, generation: u64) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while state.completed < generation {
            state = self.done.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Whether the latest record has completed, and when.
    pub fn query(&self) -> (bool, Option<Instant>) {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (state.completed >= state.recorded, state.time)
    }
}

/// A stream: a queue and the worker thread that runs it.
#[derive(Debug)]
pub struct Stream {
    /// The stream's handle (for the legacy NULL stream of a context: an id of its own, used in
    /// the statistics).
    pub id: u64,
    /// Its context.
    pub ctx: Arc<CtxCore>,
    queue: Mutex<Queue>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Queue {
    items: VecDeque<Work>,
    submitted: u64,
    completed: u64,
    /// The graph being captured, if the stream is capturing.
    capture: Option<Vec<Work>>,
    closed: bool,
}

/// How the worker runs items: the host threads each launch may use.
#[derive(Debug, Clone)]
pub struct Runner {
    /// Host threads per launch.
    pub threads: usize,
    /// Whether launches check shared memory for races (`TANDEM_EMU_RACECHECK`).
    pub race_check: bool,
    /// Whether launches count what their kernels do, for the statistics file
    /// (`TANDEM_EMU_STATS`).
    pub profile: bool,
    /// The device memory.
    pub memory: Arc<crate::memory::Memory>,
}

impl Stream {
    /// A new stream of context `ctx`, with its worker thread started.
    pub fn start(id: u64, ctx: Arc<CtxCore>, runner: Runner) -> Result<Arc<Stream>, CUresult> {
        let stream = Arc::new(Stream {
            id,
            ctx,
            queue: Mutex::default(),
            changed: Condvar::new(),
        });
        let worker = stream.clone();
        std::thread::Builder::new()
            .name(format!("cuda-emu-stream-{id:#x}"))
            .spawn(move || worker.work(&runner))
            .map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
        Ok(stream)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `work` (or, while capturing, adds it to the graph); returns its sequence number
    /// (0 when captured).
    pub fn enqueue(&self, work: Work) -> u64 {
        // A host call, whether it runs the work or captures it.
        stats::stream(self.id, self.ctx.device, |c| c.stream_calls += 1);
        let mut queue = self.lock();
        if let Some(graph) = queue.capture.as_mut() {
            graph.push(work);
            return 0;
        }
        queue.items.push_back(work);
        queue.submitted += 1;
        self.changed.notify_all();
        queue.submitted
    }

    /// Whether the stream is capturing.
    pub fn capturing(&self) -> bool {
        self.lock().capture.is_some()
    }

    /// Starts capturing (`CUDA_ERROR_ILLEGAL_STATE`-like misuse is reported as
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`).
    pub fn begin_capture(&self) -> Result<(), CUresult> {
        let mut queue = self.lock();
        if queue.capture.is_some() {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        queue.capture = Some(Vec::new());
        Ok(())
    }

    /// Ends capturing, returning the captured items.
    pub fn end_capture(&self) -> Result<Vec<Work>, CUresult> {
        self.lock()
            .capture
            .take()
            .ok_or(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED)
    }

    /// Blocks until item `sequence` (and everything before it) has run.
    pub fn wait_for(&self, sequence: u64) {
        let mut queue = self.lock();
        while queue.completed < sequence {
            queue = self.changed.wait(queue).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Blocks until everything queued so far has run.
    pub fn drain(&self) {
        let target = self.lock().submitted;
        self.wait_for(target);
    }

    /// Whether everything queued has run.
    pub fn idle(&self) -> bool {
        let queue = self.lock();
        queue.completed >= queue.submitted
    }

    /// Lets the worker exit once the queue is empty.
    pub fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }

    fn work(&self, runner: &Runner) {
        loop {
            let item = {
                let mut queue = self.lock();
                loop {
                    if let Some(item) = queue.items.pop_front() {
                        break item;
                    }
                    if queue.closed {
                        return;
                    }
                    queue = self.changed.wait(queue).unwrap_or_else(|p| p.into_inner());
                }
            };
            // A panic in the interpreter must not kill the worker (everyone waiting would hang):
            // it fails the context instead.
            let outcome =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run(&item, runner)));
            if let Err(panic) = outcome {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                self.ctx.fail(
                    CUDA_ERROR_LAUNCH_FAILED,
                    &format!("panic while running a work item: {message}"),
                );
            }
            let mut queue = self.lock();
            queue.completed += 1;
            self.changed.notify_all();
        }
    }

    fn run(&self, item: &Work, runner: &Runner) {
        let failed = self.ctx.check().is_err();
        match item {
            Work::Record { event, generation } => event.complete(*generation),
            Work::Wait { event, generation } => event.wait(*generation),
            Work::Gate(gate) => gate.pass(),
            Work::Graph(items) => {
                for item in items {
                    self.run(item, runner);
                }
            }
            _ if failed => {}
            Work::Launch {
                kernel,
                grid,
                block,
                shared,
                params,
                globals,
            } => {
                let peers = self
                    .ctx
                    .peers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                let ctx = self.ctx.id;
                let memory = runner
                    .memory
                    .view(|a| a.ctx == ctx || peers.contains(&a.ctx));
                let launch = Launch {
                    grid: *grid,
                    block: *block,
                    dynamic_shared: *shared,
                    params,
                    threads: runner.threads,
                    race_check: runner.race_check,
                    profile: runner.profile,
                };
                match tandem_ptx::run_counted_with_globals(kernel, &launch, &memory, globals) {
                    Ok(counted) => {
                        if let Some(profile) = counted.profile {
                            crate::stats::kernel(kernel.name(), &profile);
                        }
                    }
                    Err(err) => {
                        let code = match err {
                            ExecError::IllegalAddress(_) => CUDA_ERROR_ILLEGAL_ADDRESS,
                            ExecError::MisalignedAddress(_) => CUDA_ERROR_MISALIGNED_ADDRESS,
                            ExecError::LaunchFailed(_) => CUDA_ERROR_LAUNCH_FAILED,
                            ExecError::InvalidValue(_) => CUDA_ERROR_INVALID_VALUE,
                        };
                        self.ctx
                            .fail(code, &format!("kernel {}: {err}", kernel.name()));
                    }
                }
            }
            Work::HtoD { dst, src, len } => {
                let Some(to) = self.device_range(runner, *dst, *len, "copy to the device") else {
                    return;
                };
                match src {
                    // SAFETY: the range was checked; the snapshot is len bytes.
                    HostSource::Snapshot(bytes) => unsafe {
                        std::ptr::copy(bytes.as_ptr(), to, *len)
                    },
                    // SAFETY: pinned memory the caller promised stays valid until the copy ran.
                    HostSource::Pinned(ptr) => unsafe {
                        std::ptr::copy(*ptr as *const u8, to, *len)
                    },
                }
            }
            Work::DtoH { dst, src, len } => {
                let Some(from) = self.device_range(runner, *src, *len, "copy from the device")
                else {
                    return;
                };
                // SAFETY: checked device range; the host range is the caller's promise.
                unsafe { std::ptr::copy(from, *dst as *mut u8, *len) }
            }
            Work::DtoD { dst, src, len } => {
                let Some(from) = self.device_range(runner, *src, *len, "device copy source") else {
                    return;
                };
                let Some(to) = self.device_range(runner, *dst, *len, "device copy destination")
                else {
                    return;
                };
                // SAFETY: both ranges checked; `copy` allows overlap.
                unsafe { std::ptr::copy(from, to, *len) }
            }
            Work::Memset {
                dst,
                value,
                elem,
                count,
            } => {
                let len = elem * count;
                let Some(to) = self.device_range(runner, *dst, len, "memset") else {
                    return;
                };
                if *elem == 1 {
                    // SAFETY: inside the checked range.
                    unsafe { std::ptr::write_bytes(to, *value as u8, len) };
                    return;
                }
                let bytes = value.to_le_bytes();
                for i in 0..len {
                    // SAFETY: inside the checked range.
                    unsafe { *to.add(i) = bytes[i % elem] };
                }
            }
        }
    }

    /// The host pointer of device range `[addr, addr + len)`, or `None` after failing the
    /// context (the memory was freed between the call and the run).
    fn device_range(&self, runner: &Runner, addr: u64, len: usize, what: &str) -> Option<*mut u8> {
        match runner.memory.find(addr, len as u64) {
            Some(allocation) => Some(allocation.host(addr)),
            None => {
                self.ctx.fail(
                    CUDA_ERROR_ILLEGAL_ADDRESS,
                    &format!("{what}: {len} bytes at {addr:#x} are not (or no longer) allocated"),
                );
                None
            }
        }
    }
}

/// Records what `f` adds in the statistics of `stream`, unless the stream is capturing: work is
/// counted where it runs, so a captured call counts each time its graph is launched
/// ([`count_graph`]).
pub fn count(stream: &Stream, f: impl FnOnce(&mut stats::Counts)) {
    if !stream.capturing() {
        stats::stream(stream.id, stream.ctx.device, f);
    }
}

/// Records a launch of a graph of `items` on `stream`: the launch, its kernels and its copies
/// (`device_of` says which device an address is on, to tell a copy between devices).
pub fn count_graph(stream: &Stream, items: &[Work], device_of: impl Fn(u64) -> Option<usize>) {
    fn add(items: &[Work], c: &mut stats::Counts, device_of: &dyn Fn(u64) -> Option<usize>) {
        for item in items {
            match item {
                Work::Launch { .. } => c.graph_kernels += 1,
                Work::HtoD { len, .. } => {
                    c.graph_copies += 1;
                    c.bytes_htod += *len as u64
                }
                Work::DtoH { len, .. } => {
                    c.graph_copies += 1;
                    c.bytes_dtoh += *len as u64
                }
                Work::DtoD { dst, src, len } => {
                    c.graph_copies += 1;
                    match device_of(*dst) == device_of(*src) {
                        true => c.bytes_dtod += *len as u64,
                        false => c.bytes_peer += *len as u64,
                    }
                }
                Work::Memset { elem, count, .. } => {
                    c.graph_memsets += 1;
                    c.bytes_memset += (*elem * *count) as u64
                }
                Work::Graph(inner) => add(inner, c, device_of),
                _ => {}
            }
        }
    }
    count(stream, |c| {
        c.graph_launches += 1;
        add(items, c, &device_of);
    });
}
