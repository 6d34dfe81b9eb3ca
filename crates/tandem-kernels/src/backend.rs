//! [`CudaBackend`]: tandem's [`Backend`] on one GPU, through the CUDA driver API.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use tandem_core::{DType, DeviceOp, Helpers, RoundedCopy};
use tandem_tensor::check::{self, Operand};
use tandem_tensor::cpu::UpdateStep;
use tandem_tensor::{
    Activation, Backend, ExampleSet, Gemm, LayerOperands, ResidentExamples, ShapeError,
};

use crate::driver::{
    self, Code, Context, DeviceBuffer, DeviceCopy, DevicePointer, Dim3, Function, GraphExec,
    Module, PinnedBuffer, Stream, NO_DEVICE, UNSUPPORTED_PTX_VERSION,
};
use crate::error::{cuda, KernelError};
use crate::launch::{consecutive_spans, span_table, KSplits, TILE};
use crate::ptx::{Kernel, PtxModule, MAX_GRADIENT_BUFFERS, MAX_UPDATE_SPANS, MODULES, SPAN_TABLE};

/// Threads per block of the 1-D kernels; also the reductions' `REDUCE_THREADS`.
const BLOCK: u32 = 256;
/// `unscale`'s blocks (`kernels/narrow.cu`): its flags, which the host reads after a
/// loss-scaled pass, are one a block.
const UNSCALE_BLOCKS: u32 = 64;
/// At most this many blocks for the grid-stride kernels: several waves on any current GPU, and
/// the loop inside each kernel covers the rest.
const MAX_BLOCKS: usize = 4096;
/// `SIDE` of `kernels/matmul.cu`: a block of `MATMUL_SIDE x MATMUL_SIDE` threads computes a
/// `TILE x TILE` tile of C.
const MATMUL_SIDE: u32 = 16;
/// `mma_matmul` (kernels/narrow.cu): each warp computes a 16 x 8 tile of C, four warps a block
/// side by side, so a block covers 16 rows and 32 columns.
const MMA_ROWS: usize = 16;
const MMA_COLS: u32 = 32;
const MMA_BLOCK: u32 = 128;
/// What the scalar results are set to before the kernels that write them run: every byte
/// 0xFF, a NaN loss and counts of `u32::MAX`, so that a result left unwritten shows.
const POISON: u8 = 0xFF;
/// The largest grid y dimension CUDA allows.
const MAX_GRID_Y: usize = 65_535;
/// The argument array of a kernel launch: a pointer to each value, in the kernel's order.
macro_rules! args {
    ($($arg:expr),* $(,)?) => {
        &[$(&$arg as *const _ as *mut c_void),*]
    };
}

/// How many CUDA devices this machine has: 0 where the driver reports none.
pub fn device_count() -> Result<usize, KernelError> {
    match driver::init() {
        Err(NO_DEVICE) => Ok(0),
        other => {
            other.map_err(cuda("initialising the CUDA driver"))?;
            driver::device_count().map_err(cuda("counting CUDA devices"))
        }
    }
}

/// A labelled data set resident on the device: the bytes of an [`ExampleSet`], scaled by 1/255
/// only when gathered into a batch.
pub struct DeviceExamples {
    features: usize,
    len: usize,
    values: DeviceBuffer<u8>,
    labels: DeviceBuffer<u8>,
}

impl ResidentExamples for DeviceExamples {
    fn features(&self) -> usize {
        self.features
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// What a product does to its result as it stores it (`matmul`'s epilogue).
#[derive(Clone, Copy)]
enum Epilogue<'b> {
    /// Nothing.
    None,
    /// `activation(v + bias[column])`: a layer's forward pass.
    Bias((&'b DeviceBuffer<f32>, usize), Activation),
    /// `0` where the mask, the output of a ReLU of the result's shape, is not positive: the
    /// backward pass through that ReLU.
    ReluBackward(&'b DeviceBuffer<f32>),
    /// One more row of C after its `m`: the column sums of op(B), as the product with a row of
    /// ones that `matmul` (16-bit: `mma_matmul`) reads after op(A)'s last.
    ColumnSums,
}

/// A batch that `gather_matmul` (16-bit: `gather_mma_matmul`) gathers as it loads op(A): the
/// data set's images and labels, the batch's indices, and where it writes the batch (`x`, of
/// `x_len` values) and its labels, as `gather` would.
#[derive(Clone, Copy)]
struct GatheredBatch {
    images: DevicePointer<u8>,
    example_labels: DevicePointer<u8>,
    indices: DevicePointer<u32>,
    x: DevicePointer<f32>,
    x_len: usize,
    labels: DevicePointer<u32>,
}

/// Where a product's op(A) comes from.
#[derive(Clone, Copy)]
enum ProductA<'a> {
    /// A buffer, from an offset.
    Buffer((&'a DeviceBuffer<f32>, usize)),
    /// A batch that the product gathers.
    Gathered(GatheredBatch),
}

impl ProductA<'_> {
    /// What the shape checks see: the buffer, or the batch's.
    fn operand(&self) -> Operand {
        match self {
            ProductA::Buffer(a) => operand(a),
            ProductA::Gathered(batch) => Operand::at(batch.x_len, 0),
        }
    }
}

/// The `bias`, `relu` and `mask` arguments of a product with `epilogue` (null pointers where
/// it has none), its operands checked (`c_len`: the values of C's buffer).
fn epilogue_arguments(
    spec: Gemm,
    (a, b, c): (Operand, Operand, Operand),
    c_len: usize,
    epilogue: Epilogue<'_>,
) -> Result<(DevicePointer<f32>, i32, DevicePointer<f32>), KernelError> {
    Ok(match epilogue {
        Epilogue::None => {
            check::matmul(spec, a, b, c)?;
            (DevicePointer::null(), 0, DevicePointer::null())
        }
        Epilogue::Bias(bias, activation) => {
            check::matmul_bias(spec, a, b, operand(&bias), c)?;
            let relu = i32::from(activation == Activation::Relu);
            (span(bias), relu, DevicePointer::null())
        }
        Epilogue::ReluBackward(mask) => {
            check::matmul(spec, a, b, c)?;
            check::relu_backward(c_len, mask.len(), spec.m.saturating_mul(spec.n))?;
            (DevicePointer::null(), 0, span((mask, 0)))
        }
        Epilogue::ColumnSums => {
            check::matmul(spec, a, b, c)?;
            let sums = Operand::at(
                c.len,
                c.offset.saturating_add(spec.m.saturating_mul(spec.n)),
            );
            check::column_sum(b.len, spec.k, spec.n, sums)?;
            (DevicePointer::null(), 0, DevicePointer::null())
        }
    })
}

/// A product's checked `matmul` arguments but op(A) ([`CudaBackend::product_args`]).
#[derive(Clone, Copy)]
struct ProductArgs {
    b: DevicePointer<f32>,
    c: DevicePointer<f32>,
    bias: DevicePointer<f32>,
    relu: i32,
    mask: DevicePointer<f32>,
    m: u32,
    n: u32,
    k: u32,
    a_t: i32,
    b_t: i32,
    ones: i32,
    /// The values of C (`m * n`, the sums' row in `m`).
    len: usize,
    /// Rows of blocks: C's rows over the product kernel's rows a block.
    grid_y: u32,
}

/// One product of [`CudaBackend::gemm_pair`]: its shape, op(A), op(B), epilogue and C.
type PairedProduct<'a> = (
    Gemm,
    (&'a DeviceBuffer<f32>, usize),
    (&'a DeviceBuffer<f32>, usize),
    Epilogue<'a>,
    (&'a mut DeviceBuffer<f32>, usize),
);

/// `matmul_pair`'s table of one product (`kernels/matmul.cu`'s `ProductTable`): op(A) at `a`,
/// then `product`'s arguments, each in 8 bytes.
fn product_table(a: DevicePointer<f32>, p: &ProductArgs) -> [u64; 12] {
    let flag = |v: i32| u64::from(v != 0);
    [
        a.as_raw(),
        p.b.as_raw(),
        p.c.as_raw(),
        p.bias.as_raw(),
        p.mask.as_raw(),
        flag(p.relu),
        u64::from(p.m),
        u64::from(p.n),
        u64::from(p.k),
        flag(p.a_t),
        flag(p.b_t),
        flag(p.ones),
    ]
}

/// Device memory the operations need between their kernels, kept from call to call so that a
/// training step allocates nothing.
struct Scratch {
    /// `gather`'s indices, uploaded from the host (outside [`Backend::replay`]'s passes).
    indices: DeviceBuffer<u32>,
    /// A replayed step's inputs ([`StepInputs`]) on the device, where its graph reads them.
    inputs: DeviceBuffer<u32>,
    /// The mean loss (`softmax_cross_entropy`).
    loss: DeviceBuffer<f32>,
    /// The loss scale a 16-bit backend multiplies the loss's gradient by
    /// (`softmax_cross_entropy` reads it when it runs, so a captured step follows
    /// [`Backend::set_loss_scale`]).
    loss_scale: DeviceBuffer<f32>,
    /// `[lr, wd, d]` of [`CudaBackend::sgd_ema_update`].
    hyper: DeviceBuffer<f32>,
    /// The partial products of a matmul split over k (the last block of each tile adds them).
    parts: DeviceBuffer<f32>,
    /// A split matmul's counters, one a tile of its output: how many of the tile's splits are
    /// done (`matmul_softmax_cross_entropy`: and one after them, how many tiles are). Zero
    /// between launches (each launch's last block sets its tile's back).
    arrivals: DeviceBuffer<u32>,
    /// `matmul_softmax_cross_entropy`'s loss of each row, which its last tile adds.
    row_losses: DeviceBuffer<f64>,
    /// `unscale`'s flags, one a block: 1 where it met a value that is not finite.
    unscale_flags: DeviceBuffer<f32>,
    /// `count_correct`'s hits and label check, `[hits, bad labels, first bad label]`;
    /// `softmax_cross_entropy`'s label check in the last two.
    counts: DeviceBuffer<u32>,
    /// Page-locked host memory that `write_with` and `read_with` stage through (parameters in,
    /// gradients out, every step): the driver copies it at full bus speed, without bouncing
    /// through a pinned buffer of its own.
    staging: Option<PinnedBuffer<f32>>,
}

impl Scratch {
    /// The first `len` values of the staging buffer, grown when it is shorter.
    fn staging(&mut self, context: &Arc<Context>, len: usize) -> Result<&mut [f32], KernelError> {
        if len == 0 {
            return Ok(&mut []);
        }
        let buffer = match self.staging.take() {
            Some(buffer) if buffer.len() >= len => self.staging.insert(buffer),
            _ => self.staging.insert(
                PinnedBuffer::zeroed(context, len)
                    .map_err(cuda("allocating pinned host memory"))?,
            ),
        };
        Ok(&mut buffer[..len])
    }
}

/// A sequence of operations that [`Backend::replay`] has seen under one key.
enum Replay {
    /// Run once as it came: its buffers are allocated, so it can be captured.
    Seen,
    /// Captured: launched as one graph from now on.
    Captured(GraphExec),
}

/// The inputs of a replayed step that the host gives afresh each run: the batch's indices,
/// the store's uploads (its rates), the slot of the loss. [`Pass::Inputs`] gathers them here,
/// in the order the step's operations ask for them, and [`Backend::replay`] copies them to
/// [`Scratch::inputs`] with one call before the graph; [`Pass::Kernels`] places them in the
/// same order, so the captured kernels read each where it lands.
#[derive(Default)]
struct StepInputs {
    /// What [`Pass::Inputs`] gathered.
    host: Vec<u32>,
    /// Values placed so far in the pass.
    placed: usize,
}

/// What the backend's operations do with their work, while [`Backend::replay`] runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Check, then queue everything (outside `replay`, and the first run of a key).
    Direct,
    /// Check, and gather only what the host provides afresh each time ([`StepInputs`],
    /// copied before a graph that reads them): the kernels are in the graph.
    Inputs,
    /// Check, and queue only kernels and fills, into the graph being captured.
    Kernels,
}

/// The kernels' handles, looked up once when their modules are loaded, indexed by
/// [`Kernel::index`].
pub(crate) struct Kernels {
    /// `None` for a kernel whose module was not loaded.
    functions: [Option<Function>; Kernel::ALL.len()],
    // After the handles, which are valid only while their modules are loaded.
    _modules: Vec<Option<Module>>,
}

impl Kernels {
    /// Loads, in `context`, the modules that a device of compute `capability` runs
    /// ([`runs`]) and looks up their kernels.
    fn load(context: &Arc<Context>, capability: u32) -> Result<Kernels, KernelError> {
        let modules = MODULES
            .iter()
            .map(|module| match runs(module, capability) {
                true => Module::load(context, module.ptx)
                    .map(Some)
                    .map_err(load_error),
                false => Ok(None),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut functions = Vec::with_capacity(Kernel::ALL.len());
        for kernel in Kernel::ALL {
            let function = match &modules[kernel.module_index()] {
                Some(module) => Some(
                    module
                        .function(kernel.entry())
                        .map_err(cuda(kernel.entry()))?,
                ),
                None => None,
            };
            functions.push(function);
        }
        let functions = functions
            .try_into()
            .unwrap_or_else(|_| unreachable!("one handle per kernel"));
        Ok(Kernels {
            functions,
            _modules: modules,
        })
    }

    pub(crate) fn get(&self, kernel: Kernel) -> Result<Function, KernelError> {
        self.functions[kernel.index()].ok_or(KernelError::NotLoaded {
            kernel: kernel.entry(),
        })
    }
}

/// tandem's [`Backend`] on one CUDA device.
///
/// Every operation is issued on the backend's own stream, in call order; the calls that return
/// host values (`download`, the loss, `count_correct`) wait for it. Buffers are
/// [`DeviceBuffer`]s in the device's primary context, which every backend on that device shares,
/// so several replicas on one GPU can read each other's buffers (see
/// [`sgd_ema_update`](Self::sgd_ema_update)). [`Backend::replay`] captures a fixed sequence of
/// operations (a training step) as a CUDA graph the second time it sees it, and from then on
/// launches the graph: one launch for the sequence, the batch's indices copied in before it.
///
/// Threads: the CUDA driver tracks a *current context* per thread. [`CudaBackend::new`] makes
/// the device's context current on the thread that calls it; any other thread (a worker the
/// backend moved to) must call [`make_current`](Self::make_current) (or
/// [`Backend::bind_thread`], which does the same) before anything else. Dropping needs
/// nothing: buffers, and the backend itself, are freed in their own context on any thread,
/// whatever is current there. A buffer written on one backend's stream and read on another's
/// needs [`synchronize`](Self::synchronize) on the writer first.
///
/// ```no_run
/// use tandem_kernels::{device_count, CudaBackend, KernelError};
/// use tandem_tensor::{Activation, Backend};
///
/// fn main() -> Result<(), KernelError> {
///     if device_count()? == 0 {
///         return Ok(());
///     }
///     let gpu = CudaBackend::new(0)?;
///     let mut x = gpu.zeros(6)?;
///     gpu.upload(&[-1.0, 2.0, -3.0, 4.0, 5.0, -6.0], &mut x, 0)?;
///     let bias = gpu.zeros(3)?;
///     gpu.bias_add(&mut x, (&bias, 0), 2, 3, Activation::Relu)?;
///     let mut out = [0.0; 6];
///     gpu.download(&x, 0, &mut out)?;
///     assert_eq!(out, [0.0, 2.0, 0.0, 4.0, 5.0, 0.0]);
///     Ok(())
/// }
/// ```
pub struct CudaBackend {
    ordinal: usize,
    /// What its buffers hold: `f32`, or `bf16`/`f16` values in `f32` slots (see
    /// [`with_dtype`](Self::with_dtype)).
    dtype: DType,
    /// The loss scale last written to the device (a 16-bit backend's), `None` before the first.
    loss_scale: Cell<Option<f32>>,
    scratch: RefCell<Scratch>,
    /// What [`Backend::replay`] knows of each key: run once, or captured.
    replays: RefCell<HashMap<ReplayKey, Replay>>,
    /// What the operations do now (see [`Pass`]).
    pass: Cell<Pass>,
    /// The inputs of the step [`Backend::replay`] is running.
    step_inputs: RefCell<StepInputs>,
    /// What a store put around the next step, for [`Backend::replay`] to take.
    step_ops: Arc<StepOps>,
    /// What the last [`Backend::replay`] ran after its step, for
    /// [`Backend::repeat_after_step`].
    last_after: RefCell<Vec<DeviceOp>>,
    kernels: Arc<Kernels>,
    /// The stream its work runs on: its own, or one it shares with other backends of its device
    /// ([`DeviceQueue::share_order`](tandem_core::DeviceQueue::share_order)).
    runs_on: Arc<RunsOn>,
    /// A stream of its own where its steps are captured as graphs, and nothing runs: work that
    /// another thread queues on a stream being captured would join the capture (or, waiting
    /// for it, fail).
    capture: Arc<Stream>,
    // Everything above holds the context too: it is released after the last of them.
    context: Arc<Context>,
}

impl CudaBackend {
    /// Opens device `ordinal`: retains its primary context (making it current on this thread),
    /// creates the backend's streams (one to run on, one to capture graphs on) and loads every
    /// kernel module the device runs. Computes in `f32`.
    ///
    /// Fails with [`KernelError::DriverTooOld`] when the driver predates the committed PTX, and
    /// with an error for which [`KernelError::is_no_device`] holds where there is no device.
    pub fn new(ordinal: usize) -> Result<CudaBackend, KernelError> {
        Self::with_dtype(ordinal, DType::F32)
    }

    /// [`new`](Self::new), computing in `dtype`. In `bf16` or `f16` it is the twin of
    /// [`tandem_tensor::NarrowCpuBackend`]: every buffer holds values of the type (in `f32`
    /// slots: the same memory as `f32`, so far), every kernel that stores a result computes it
    /// in `f32` from 16-bit operands and rounds it once (to nearest even), and the products run
    /// on tensor cores (`mma.sync` with `f32` accumulation). The parameters of record stay in
    /// `f32` on the device ([`Residence::dtype`](tandem_core::Residence) says `f32`, its
    /// `precision` the type the replica computes in, whose rounded copy the device stores'
    /// updates write), and it scales the loss's gradient ([`Backend::set_loss_scale`]).
    ///
    /// Fails with [`KernelError::NoTensorCores`] for `bf16` or `f16` on a GPU older than
    /// compute capability 8.0.
    pub fn with_dtype(ordinal: usize, dtype: DType) -> Result<CudaBackend, KernelError> {
        driver::init().map_err(cuda("initialising the CUDA driver"))?;
        let count = driver::device_count().map_err(cuda("counting CUDA devices"))?;
        if ordinal >= count {
            return Err(KernelError::NoSuchDevice { ordinal, count });
        }
        let context =
            Context::retain_primary(ordinal).map_err(cuda("retaining the primary context"))?;
        // Non-blocking: the legacy default stream, which other replicas' libraries may use,
        // never serialises with this one. Nothing here uses the default stream.
        let stream = Arc::new(Stream::new(&context).map_err(cuda("creating a stream"))?);
        // Never run on, so that no work of another thread on the stream it runs on (its own
        // or, shared, another backend's) can join a capture under way.
        let capture = Arc::new(Stream::new(&context).map_err(cuda("creating a stream"))?);
        let capability = context
            .capability()
            .map_err(cuda("reading the compute capability"))?;
        if dtype != DType::F32 && !runs(Kernel::MmaMatmul.module(), capability) {
            return Err(KernelError::NoTensorCores {
                dtype,
                ordinal,
                capability,
            });
        }
        let kernels = Arc::new(Kernels::load(&context, capability)?);
        let scratch = Scratch {
            indices: allocate(&context, 0)?, // grown on first use
            inputs: allocate(&context, 0)?,
            parts: allocate(&context, 0)?,
            arrivals: allocate(&context, 0)?,
            row_losses: allocate(&context, 0)?,
            loss: allocate(&context, 1)?,
            loss_scale: allocate(&context, 1)?,
            counts: allocate(&context, 3)?,
            unscale_flags: allocate(&context, UNSCALE_BLOCKS as usize)?,
            hyper: allocate(&context, 3)?,
            staging: None, // allocated on first use, at the size the model needs
        };
        let backend = CudaBackend {
            ordinal,
            dtype,
            loss_scale: Cell::new(None),
            scratch: RefCell::new(scratch),
            replays: RefCell::default(),
            pass: Cell::new(Pass::Direct),
            step_inputs: RefCell::default(),
            step_ops: Arc::default(),
            last_after: RefCell::default(),
            kernels,
            runs_on: Arc::new(RunsOn::new(stream)),
            capture,
            context,
        };
        // Unscaled until told otherwise (bf16 never is): the kernels read the scale always.
        backend.set_loss_scale(1.0)?;
        Ok(backend)
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Makes the device's context current on the calling thread. Every thread that uses the
    /// backend, or drops buffers it made, must call this first (the thread that called
    /// [`new`](Self::new) already has it).
    pub fn make_current(&self) -> Result<(), KernelError> {
        self.context
            .set_current()
            .map_err(cuda("making the context current"))
    }

    /// The stream the backend's work goes to now: [`capture`](Self::capture)'s while a step is
    /// captured ([`Pass::Kernels`]), else the one it runs on.
    fn stream(&self) -> Arc<Stream> {
        match self.pass.get() {
            Pass::Kernels => Arc::clone(&self.capture),
            _ => self.runs_on.get(),
        }
    }

    /// Waits until everything issued on this backend's stream has finished: needed before
    /// another backend (another stream) reads what this one wrote.
    pub fn synchronize(&self) -> Result<(), KernelError> {
        self.stream()
            .synchronize()
            .map_err(cuda("waiting for the stream"))
    }

    /// Copies host labels into `dst` from `offset` on: [`Backend::upload`] for labels.
    pub fn upload_labels(
        &self,
        src: &[u32],
        dst: &mut DeviceBuffer<u32>,
        offset: usize,
    ) -> Result<(), KernelError> {
        self.copy_in("upload_labels", src, dst, offset)
    }

    /// Copies `dst.len()` labels of `src` from `offset` on to the host: [`Backend::download`]
    /// for labels.
    pub fn download_labels(
        &self,
        src: &DeviceBuffer<u32>,
        offset: usize,
        dst: &mut [u32],
    ) -> Result<(), KernelError> {
        self.copy_out("download_labels", src, offset, dst)
    }

    /// The fused optimiser step over `len` parameters, bit for bit
    /// [`cpu::sgd_ema_update`](tandem_tensor::cpu::sgd_ema_update): the gradient is the mean of
    /// the `grads` buffers, summed in their order, then SGD with L2 decay and the moving
    /// average.
    ///
    /// With one buffer per replica this is the sync strategy's all-reduce and update in one
    /// pass. All buffers must be on this backend's device (replicas on one GPU share its
    /// context), at most [`MAX_GRADIENT_BUFFERS`] of them, and the backends that wrote them
    /// must have been [synchronized](Self::synchronize); synchronize this one before other
    /// replicas read the parameters.
    pub fn sgd_ema_update(
        &self,
        params: (&mut DeviceBuffer<f32>, usize),
        ema: (&mut DeviceBuffer<f32>, usize),
        grads: &[(&DeviceBuffer<f32>, usize)],
        len: usize,
        step: UpdateStep,
    ) -> Result<(), KernelError> {
        let op = "sgd_ema_update";
        check_span(op, "params", &params, len)?;
        check_span(op, "ema", &ema, len)?;
        let (p, e) = (span_mut(params).as_raw(), span_mut(ema).as_raw());
        let grads = grad_addresses(op, grads, len)?;
        let hyper = self.scratch.borrow().hyper.as_device_ptr().as_raw();
        let values = vec![step.learning_rate, step.weight_decay, step.ema_decay];
        // SAFETY: p, e and every gradient span cover len values (checked above), in buffers
        // of this backend's device; `hyper` holds three, written on the stream before the
        // kernel reads them.
        unsafe {
            self.launcher().run(
                Pass::Direct,
                &[
                    DeviceOp::Upload { dst: hyper, values },
                    DeviceOp::Update {
                        kernel: Kernel::SgdEmaUpdate.entry(),
                        params: p,
                        state: vec![e],
                        grads,
                        grads_dtype: DType::F32,
                        len,
                        hyper,
                        copy: None,
                    },
                ],
            )
        }
    }

    /// This backend's stream, kernels and context as a [`tandem_core::DeviceQueue`], for a
    /// store that keeps the parameters of record beside the backend's buffers.
    pub fn queue(&self) -> crate::CudaQueue {
        crate::CudaQueue::new(
            self.ordinal,
            Arc::clone(&self.runs_on),
            Arc::clone(&self.kernels),
            Arc::clone(&self.context),
            Arc::clone(&self.step_ops),
        )
    }

    /// `out[i] = (grads[0][i] + grads[1][i] + ...) / grads.len()` over `len` values, summed in
    /// this order: the sync strategy's gradient all-reduce on one device, the same arithmetic as
    /// [`sgd_ema_update`](Self::sgd_ema_update)'s. The same rules about devices and streams
    /// apply.
    pub fn mean_gradients(
        &self,
        grads: &[(&DeviceBuffer<f32>, usize)],
        out: (&mut DeviceBuffer<f32>, usize),
        len: usize,
    ) -> Result<(), KernelError> {
        let op = "mean_gradients";
        check_span(op, "out", &out, len)?;
        let out = span_mut(out);
        let (table, n) = gradient_table(op, grads, len)?;
        // SAFETY: the arguments follow `mean_gradients`'s parameters; out and the first n table
        // entries cover len values each.
        unsafe {
            self.launch(
                Kernel::MeanGradients,
                stride_grid(len),
                BLOCK,
                args![out, table, n, len],
            )
        }
    }

    /// Rounds the `len` values at `x` to a 16-bit backend's type (`round_to`); nothing on an
    /// `f32` backend. What follows the operations whose kernel stores `f32` results (values
    /// from the host, `bias_add`), as [`tandem_tensor::NarrowCpuBackend`] rounds after
    /// [`tandem_tensor::CpuBackend`]; the step's other kernels round as they store (their
    /// `narrow` parameter).
    fn round(&self, x: DevicePointer<f32>, len: usize) -> Result<(), KernelError> {
        if self.pass.get() == Pass::Inputs {
            return Ok(()); // the captured graph launches it
        }
        // SAFETY: x covers len values (the caller's operation checked it); the thread has the
        // context current.
        unsafe { self.launcher().round(x.as_raw(), len, self.dtype) }
    }

    /// Queues softmax + cross-entropy over `rows` of logits (at least one), their mean into
    /// `loss[*loss_at]` (`loss_at` null: `loss[0]`) and the label check into the scratch
    /// counts, in one kernel; on a 16-bit backend it stores the logits' gradient times the
    /// loss scale, rounded.
    fn softmax_loss(
        &self,
        logits: &DeviceBuffer<f32>,
        labels: &DeviceBuffer<u32>,
        (rows, classes): (usize, usize),
        dlogits: &mut DeviceBuffer<f32>,
        loss: DevicePointer<f32>,
        loss_at: DevicePointer<u32>,
    ) -> Result<(), KernelError> {
        check::softmax_cross_entropy(logits.len(), labels.len(), rows, classes, dlogits.len())?;
        let logits = span((logits, 0));
        let labels = span((labels, 0));
        let dlogits = span_mut((dlogits, 0));
        let rows_u32 = dim("softmax_cross_entropy: rows", rows)?;
        let classes_u32 = dim("softmax_cross_entropy: classes", classes)?;
        // The label check goes to counts[1..3], where count_correct leaves its own.
        let scratch = self.scratch.borrow();
        let status = span((&scratch.counts, 1));
        let loss_scale = match self.dtype {
            DType::BF16 | DType::F16 => scratch.loss_scale.as_device_ptr(),
            DType::F32 => DevicePointer::null(),
        };
        drop(scratch);
        let narrow = narrow(self.dtype);
        // SAFETY: the arguments follow `softmax_cross_entropy`'s parameters; logits and dlogits
        // cover rows*classes values, labels rows, loss one from the slot at loss_at (the
        // caller's), status two (of the three counts) and loss_scale one or is null.
        unsafe {
            self.launch(
                Kernel::SoftmaxCrossEntropy,
                1u32,
                BLOCK,
                args![
                    logits,
                    labels,
                    dlogits,
                    rows_u32,
                    classes_u32,
                    loss,
                    loss_at,
                    status,
                    loss_scale,
                    narrow
                ],
            )
        }
    }

    /// Where a step's loss goes on the device, and where the slot's index is: replayed, the
    /// slot is a step input (the loss buffer's start and the input's address), so that each
    /// run of the graph writes its own; otherwise the slot itself and a null index.
    fn loss_slot(
        &self,
        loss: (&mut DeviceBuffer<f32>, usize),
    ) -> Result<(DevicePointer<f32>, DevicePointer<u32>), KernelError> {
        let slot = dim("softmax_cross_entropy_into: loss slot", loss.1)?;
        Ok(match self.step_input(&[slot])? {
            Some(at) => (span_mut((loss.0, 0)), DevicePointer::from_raw(at)),
            None => (span_mut(loss), DevicePointer::null()),
        })
    }

    /// [`Launcher::launch`] on this backend's stream, except while [`Backend::replay`] queues
    /// inputs only (the kernel is in the captured graph).
    ///
    /// # Safety
    ///
    /// As [`Launcher::launch`]'s.
    unsafe fn launch(
        &self,
        kernel: Kernel,
        grid: impl Into<Dim3>,
        block: impl Into<Dim3>,
        args: &[*mut c_void],
    ) -> Result<(), KernelError> {
        if self.pass.get() == Pass::Inputs {
            return Ok(()); // the captured graph launches it
        }
        // SAFETY: the caller's promises; the thread has the context current (`make_current`).
        unsafe { self.launcher().launch(kernel, grid, block, args) }
    }

    /// [`launch`](Self::launch) of a kernel that gathers `batch` (`gather_matmul`,
    /// `gather_mma_matmul`): the batch's images, labels, indices, `x` and `labels` are its first
    /// parameters, `rest` the others.
    ///
    /// # Safety
    ///
    /// As [`Launcher::launch`]'s.
    unsafe fn launch_gathered(
        &self,
        kernel: Kernel,
        (grid, block): (Dim3, Dim3),
        batch: GatheredBatch,
        rest: &[*mut c_void],
    ) -> Result<(), KernelError> {
        let GatheredBatch {
            images,
            example_labels,
            indices,
            x,
            labels,
            ..
        } = batch;
        let mut all = args![images, example_labels, indices, x, labels].to_vec();
        all.extend_from_slice(rest);
        // SAFETY: the caller's promises; `all` points at this frame's copies of the batch's
        // pointers, alive until the launch returns.
        unsafe { self.launch(kernel, grid, block, &all) }
    }

    /// Where the step input `values` are on the device while [`Backend::replay`] runs a pass:
    /// gathered into the step's packet in [`Pass::Inputs`], placed in [`Pass::Kernels`] (the
    /// address the captured kernels read). `None` in [`Pass::Direct`]: the caller copies them.
    fn step_input(&self, values: &[u32]) -> Result<Option<u64>, KernelError> {
        let pass = self.pass.get();
        if pass == Pass::Direct {
            return Ok(None);
        }
        let mut inputs = self.step_inputs.borrow_mut();
        let at = inputs.placed;
        inputs.placed = at.saturating_add(values.len());
        let device = &self.scratch.borrow().inputs;
        match pass {
            Pass::Inputs => inputs.host.extend_from_slice(values),
            // The capture follows a pass that gathered as many (`send_inputs` made room).
            _ => ShapeError::check("replay", "step inputs", inputs.placed, device.len())?,
        }
        Ok(Some(DType::F32.at(device.as_device_ptr().as_raw(), at)))
    }

    /// Where a batch's `indices` are on the device for the kernel that gathers it: a step
    /// input while [`Backend::replay`] runs, else copied to the scratch buffer, queued without
    /// waiting (the driver takes a copy of pageable host memory, as `indices` is, before it
    /// returns, so a training step never waits for the device here).
    fn batch_indices(&self, indices: &[u32]) -> Result<DevicePointer<u32>, KernelError> {
        if let Some(at) = self.step_input(indices)? {
            return Ok(DevicePointer::from_raw(at));
        }
        let mut scratch = self.scratch.borrow_mut();
        self.reserve(&mut scratch.indices, indices.len())?;
        // SAFETY: the buffer holds the indices (reserved above); the kernel queued after the
        // copy on the same stream reads them after it.
        unsafe {
            self.stream()
                .copy_in(span_mut((&mut scratch.indices, 0)), indices)
        }
        .map_err(cuda("copying the batch's indices to the device"))?;
        Ok(scratch.indices.as_device_ptr())
    }

    /// Copies the step inputs that [`Pass::Inputs`] gathered to the device, in one call; where
    /// they outgrow their buffer (only before a step is captured: `may_grow`), into a larger one.
    fn send_inputs(&self, may_grow: bool) -> Result<(), KernelError> {
        let inputs = self.step_inputs.borrow();
        let mut scratch = self.scratch.borrow_mut();
        if may_grow {
            self.reserve(&mut scratch.inputs, inputs.host.len())?;
        }
        ShapeError::check(
            "replay",
            "step inputs",
            inputs.host.len(),
            scratch.inputs.len(),
        )?;
        if inputs.host.is_empty() {
            return Ok(());
        }
        // Queued without waiting, as `gather`'s indices outside a replay: the driver takes a
        // copy of pageable host memory before it returns.
        // SAFETY: the buffer holds as many values (checked above); the graph launched after it
        // on the same stream reads them after the copy.
        unsafe {
            self.stream()
                .copy_in(span_mut((&mut scratch.inputs, 0)), &inputs.host)
        }
        .map_err(cuda("copying a step's inputs to the device"))
    }

    /// Runs the operations a store put around a step in the current pass. Replayed, their
    /// uploads are step inputs, and an update reads its values where they land.
    fn run_step_ops(&self, ops: &[DeviceOp]) -> Result<(), KernelError> {
        let pass = self.pass.get();
        if pass == Pass::Direct {
            // SAFETY: the store's promises (`around_next_step`'s); this thread has the context
            // current, as every operation of the backend needs.
            return unsafe { self.launcher().run(pass, ops) };
        }
        let mut moved: Vec<(u64, u64, u64)> = Vec::new(); // (dst, its end, where it went)
        for op in ops {
            if let DeviceOp::Upload { dst, values } = op {
                let bits: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
                if let Some(at) = self.step_input(&bits)? {
                    moved.push((*dst, DType::F32.at(*dst, values.len()), at));
                }
            }
        }
        if pass == Pass::Inputs {
            return Ok(()); // the rest is in the captured graph
        }
        let rest: Vec<DeviceOp> = (ops.iter())
            .filter(|op| !matches!(op, DeviceOp::Upload { .. }))
            .map(|op| {
                let mut op = op.clone();
                if let DeviceOp::Update { hyper, .. } = &mut op {
                    let found = (moved.iter()).find(|(dst, end, _)| (*dst..*end).contains(hyper));
                    if let Some((dst, _, at)) = found {
                        *hyper = *at + (*hyper - *dst);
                    }
                }
                op
            })
            .collect();
        // SAFETY: as above; a moved update's values are at their place in the step inputs,
        // written before the graph runs.
        unsafe { self.launcher().run(pass, &rest) }
    }

    /// This backend's stream and kernels, to launch on.
    fn launcher(&self) -> Launcher<'_> {
        Launcher {
            stream: self.stream(),
            kernels: &self.kernels,
        }
    }

    /// Runs `ops` in `pass`, back in [`Pass::Direct`] afterwards whatever happens; the step's
    /// inputs are gathered, or placed, from the first.
    fn in_pass<R>(&self, pass: Pass, ops: impl FnOnce() -> R) -> R {
        let mut inputs = self.step_inputs.borrow_mut();
        inputs.placed = 0;
        if pass == Pass::Inputs {
            inputs.host.clear();
        }
        drop(inputs);
        self.pass.set(pass);
        let outcome = ops();
        self.pass.set(Pass::Direct);
        outcome
    }

    /// A shared `matmul` launch, with its `epilogue`.
    fn gemm(
        &self,
        spec: Gemm,
        a: ProductA<'_>,
        b: (&DeviceBuffer<f32>, usize),
        epilogue: Epilogue<'_>,
        c: (&mut DeviceBuffer<f32>, usize),
    ) -> Result<(), KernelError> {
        match self.product_args(spec, &a, b, epilogue, c)? {
            Some(product) => self.launch_product(a, product),
            None => Ok(()),
        }
    }

    /// Two products, as two [`gemm`](Self::gemm)s would compute them, in one `matmul_pair`
    /// launch where both are f32 and unsplit (else one after the other). Neither may read
    /// what the other writes.
    fn gemm_pair(
        &self,
        first: PairedProduct<'_>,
        second: PairedProduct<'_>,
    ) -> Result<(), KernelError> {
        let (spec0, a0, b0, epilogue0, c0) = first;
        let (spec1, a1, b1, epilogue1, c1) = second;
        let p0 = self.product_args(spec0, &ProductA::Buffer(a0), b0, epilogue0, c0)?;
        let p1 = self.product_args(spec1, &ProductA::Buffer(a1), b1, epilogue1, c1)?;
        let unsplit = |p: &ProductArgs| {
            let tiles = p.n.div_ceil(TILE as u32) as usize * p.grid_y as usize;
            KSplits::of(tiles, p.k as usize).count == 1
        };
        let (p0, p1) = match (p0, p1) {
            (Some(p0), Some(p1)) if self.dtype == DType::F32 && unsplit(&p0) && unsplit(&p1) => {
                (p0, p1)
            }
            (p0, p1) => {
                if let Some(p0) = p0 {
                    self.launch_product(ProductA::Buffer(a0), p0)?;
                }
                return match p1 {
                    Some(p1) => self.launch_product(ProductA::Buffer(a1), p1),
                    None => Ok(()),
                };
            }
        };
        let tiles = |p: &ProductArgs| p.n.div_ceil(TILE as u32).saturating_mul(p.grid_y);
        let blocks = tiles(&p0).saturating_add(tiles(&p1));
        let first = product_table(span(a0), &p0);
        let second = product_table(span(a1), &p1);
        // SAFETY: each table holds a product's checked `matmul` arguments (as `gemm` launches
        // them, unsplit: a, b and c cover m*k, k*n and m*n values, bias n values or null, the
        // mask m*n or null), and the grid has a block for each tile of either C.
        unsafe {
            self.launch(
                Kernel::MatmulPair,
                blocks,
                (MATMUL_SIDE, MATMUL_SIDE),
                args![first, second],
            )
        }
    }

    /// A product's `matmul` arguments, its operands checked against `spec` and `epilogue`;
    /// `None` when C is empty (nothing to launch).
    fn product_args(
        &self,
        spec: Gemm,
        a: &ProductA<'_>,
        b: (&DeviceBuffer<f32>, usize),
        epilogue: Epilogue<'_>,
        c: (&mut DeviceBuffer<f32>, usize),
    ) -> Result<Option<ProductArgs>, KernelError> {
        let Gemm {
            m,
            n,
            k,
            a_transposed,
            b_transposed,
        } = spec;
        let (ga, gb, gc) = (a.operand(), operand(&b), operand(&c));
        let (bias, relu, mask) = epilogue_arguments(spec, (ga, gb, gc), c.0.len(), epilogue)?;
        let (b, c) = (span(b), span_mut(c));
        let column_sums = matches!(epilogue, Epilogue::ColumnSums);
        let ones = i32::from(column_sums);
        let m = m.saturating_add(usize::from(column_sums)); // the sums' row (checked: c has it)
        if m == 0 || n == 0 {
            return Ok(None);
        }
        let len = m.saturating_mul(n); // no saturation: c holds that many values (checked)
        let block_rows = match self.dtype {
            DType::F32 => TILE,
            _ => MMA_ROWS,
        };
        let grid_y = m.div_ceil(block_rows);
        if grid_y > MAX_GRID_Y {
            return Err(KernelError::TooLarge {
                what: "matmul: rows of C",
                value: m,
                max: MAX_GRID_Y * block_rows,
            });
        }
        let (m, n, k) = (
            dim("matmul: m", m)?,
            dim("matmul: n", n)?,
            dim("matmul: k", k)?,
        );
        let (a_t, b_t) = (i32::from(a_transposed), i32::from(b_transposed));
        Ok(Some(ProductArgs {
            b,
            c,
            bias,
            relu,
            mask,
            m,
            n,
            k,
            a_t,
            b_t,
            ones,
            len,
            grid_y: grid_y as u32, // at most MAX_GRID_Y (checked)
        }))
    }

    /// The grid of an f32 product of `tiles` (across, down) tiles of C over `k` (`len` values),
    /// split over k as [`KSplits`] says, with its k per split and the scratch its splits use:
    /// `parts` for their slices and `arrivals`, a zeroed counter for each tile (where split,
    /// or with extras) and `extra` more after them (what the kernel counts beyond the tiles),
    /// grown as needed.
    fn split_over_k(
        &self,
        (across, down): (u32, u32),
        k: u32,
        len: usize,
        extra: usize,
    ) -> Result<(Dim3, u32, DevicePointer<f32>, DevicePointer<u32>), KernelError> {
        let tiles = across as usize * down as usize;
        let splits = KSplits::of(tiles, k as usize);
        let count = dim("matmul: splits", splits.count)?;
        let k_split = dim("matmul: k per split", splits.k_split)?;
        let mut scratch = self.scratch.borrow_mut();
        if count > 1 {
            self.reserve(&mut scratch.parts, splits.count.saturating_mul(len))?;
        }
        // The extra counters come after the tiles', split or not.
        let counters = if count > 1 || extra > 0 {
            tiles + extra
        } else {
            0
        };
        if scratch.arrivals.len() < counters {
            self.reserve(&mut scratch.arrivals, counters)?;
            self.fill(&scratch.arrivals, 0, "zeroing a matmul's counters")?;
        }
        let grid = Dim3 {
            x: across,
            y: down,
            z: count,
        };
        let (parts, arrivals) = (
            scratch.parts.as_device_ptr(),
            scratch.arrivals.as_device_ptr(),
        );
        Ok((grid, k_split, parts, arrivals))
    }

    /// Launches a product whose arguments [`product_args`](Self::product_args) checked, its
    /// op(A) `a`: split over k where it has too few tiles of C (f32).
    fn launch_product(&self, a: ProductA<'_>, product: ProductArgs) -> Result<(), KernelError> {
        let ProductArgs {
            b,
            c,
            bias,
            relu,
            mask,
            m,
            n,
            k,
            a_t,
            b_t,
            ones,
            len,
            grid_y,
        } = product;
        if self.dtype != DType::F32 {
            let grid = (n.div_ceil(MMA_COLS), grid_y);
            let bf16 = i32::from(self.dtype == DType::BF16);
            // SAFETY: the arguments follow `mma_matmul`'s (or `gather_mma_matmul`'s)
            // parameters: a (or the batch, whose indices are below the data set's length), b
            // and c cover m*k, k*n and m*n values, bias n values or is null, the mask m*n or is
            // null (checked above; a gathered product has none).
            return unsafe {
                match a {
                    ProductA::Buffer(a) => {
                        let a = span(a);
                        self.launch(
                            Kernel::MmaMatmul,
                            grid,
                            MMA_BLOCK,
                            args![a, b, c, bias, relu, mask, m, n, k, a_t, b_t, ones, bf16],
                        )
                    }
                    ProductA::Gathered(batch) => self.launch_gathered(
                        Kernel::GatherMmaMatmul,
                        (grid.into(), MMA_BLOCK.into()),
                        batch,
                        args![b, c, bias, relu, m, n, k, b_t, bf16],
                    ),
                }
            };
        }
        let grid_x = n.div_ceil(TILE as u32);
        let (grid, k_split, parts, arrivals) = self.split_over_k((grid_x, grid_y), k, len, 0)?;
        let block = (MATMUL_SIDE, MATMUL_SIDE);
        // SAFETY: the arguments follow `matmul`'s (or `gather_matmul`'s) parameters: a (or the
        // batch, whose indices are below the data set's length), b and c cover m*k, k*n and
        // m*n values, bias n values or is null, the mask m*n or is null (checked above); split,
        // `parts` holds the `count` slices of m*n values and `arrivals` a zeroed counter for
        // each of the grid's tiles (unsplit, the kernel reads neither).
        unsafe {
            match a {
                ProductA::Buffer(a) => {
                    let a = span(a);
                    self.launch(
                        Kernel::Matmul,
                        grid,
                        block,
                        args![
                            a, b, c, parts, arrivals, bias, relu, mask, m, n, k, a_t, b_t, ones,
                            k_split
                        ],
                    )
                }
                ProductA::Gathered(batch) => self.launch_gathered(
                    Kernel::GatherMatmul,
                    (grid, block.into()),
                    batch,
                    args![b, c, parts, arrivals, bias, relu, m, n, k, b_t, k_split],
                ),
            }
        }
    }

    /// Copies `src` into `dst` from `offset` on, for operation `op`.
    fn copy_in<T: DeviceCopy>(
        &self,
        op: &'static str,
        src: &[T],
        dst: &mut DeviceBuffer<T>,
        offset: usize,
    ) -> Result<(), KernelError> {
        let device = ("dst", dst.len(), offset);
        self.transfer(op, device, src.len(), "copying to the device", || {
            // SAFETY: `transfer` runs this once it has checked that `dst` holds `src.len()`
            // values from `offset` on, and keeps `src` borrowed until the copy is through, even
            // where it is pinned memory that the driver would read later.
            unsafe { self.stream().copy_in(span_mut((dst, offset)), src) }
        })
    }

    /// Copies `dst.len()` values of `src` from `offset` on to the host, for operation `op`.
    fn copy_out<T: DeviceCopy>(
        &self,
        op: &'static str,
        src: &DeviceBuffer<T>,
        offset: usize,
        dst: &mut [T],
    ) -> Result<(), KernelError> {
        let device = ("src", src.len(), offset);
        self.transfer(op, device, dst.len(), "copying to the host", || {
            // SAFETY: `transfer` runs this once it has checked that `src` holds `dst.len()`
            // values from `offset` on, and keeps `dst` borrowed until the copy has landed (the
            // driver may return early when `dst` is pinned).
            unsafe { self.stream().copy_out(dst, span((src, offset))) }
        })
    }

    /// What [`copy_in`](Self::copy_in) and [`copy_out`](Self::copy_out) share: checks that the
    /// device buffer `name` of operation `op` (`buf_len` values) holds `len` values from
    /// `offset` on; then, unless there are none, queues the copy (`copy`) and waits for it.
    fn transfer(
        &self,
        op: &'static str,
        (name, buf_len, offset): (&'static str, usize, usize),
        len: usize,
        during: &'static str,
        copy: impl FnOnce() -> Result<(), Code>,
    ) -> Result<(), KernelError> {
        ShapeError::check(op, name, offset.saturating_add(len), buf_len)?;
        if len == 0 {
            return Ok(());
        }
        copy().map_err(cuda(during))?;
        self.synchronize()
    }

    /// A new device buffer holding `values`.
    fn upload_new<T: DeviceCopy>(&self, values: &[T]) -> Result<DeviceBuffer<T>, KernelError> {
        let mut buf = allocate(&self.context, values.len())?;
        self.copy_in("upload_examples", values, &mut buf, 0)?;
        Ok(buf)
    }

    /// A new buffer of `len` zeros.
    fn zeroed<T: DeviceCopy>(&self, len: usize) -> Result<DeviceBuffer<T>, KernelError> {
        let buf = allocate(&self.context, len)?;
        self.fill(&buf, 0, "zeroing device memory")?;
        Ok(buf)
    }

    /// Queues setting every byte of `buf` to `byte` on the stream.
    fn fill<T: DeviceCopy>(
        &self,
        buf: &DeviceBuffer<T>,
        byte: u8,
        during: &'static str,
    ) -> Result<(), KernelError> {
        if self.pass.get() == Pass::Inputs {
            return Ok(()); // in the captured graph
        }
        // SAFETY: the memset covers exactly `buf`, and runs on the stream before anything
        // issued after it, so nothing reads the memory before it is set. `buf` outlives it:
        // its owner synchronises the stream before freeing it (see `reserve` and `Drop`).
        unsafe {
            self.stream()
                .fill_bytes(buf.as_device_ptr(), buf.len(), byte)
        }
        .map_err(cuda(during))
    }

    /// Grows a scratch buffer to at least `len` values (its contents are not kept).
    fn reserve<T: DeviceCopy>(
        &self,
        buf: &mut DeviceBuffer<T>,
        len: usize,
    ) -> Result<(), KernelError> {
        if buf.len() < len {
            // Kernels already issued may still use the old buffer: let them finish first.
            self.synchronize()?;
            *buf = allocate(&self.context, len)?;
            // Captured graphs name the old buffer: none may run again (a sequence only seen
            // names none, and is captured when it comes again).
            (self.replays.borrow_mut()).retain(|_, replay| matches!(replay, Replay::Seen));
        }
        Ok(())
    }

    /// Copies the first `N` values of `first` and the first `M` of `second` (when given) to the
    /// host: the scalars that the reduction kernels left, read with one wait for both.
    fn read_results<const N: usize, const M: usize>(
        &self,
        first: &DeviceBuffer<u32>,
        second: Option<&DeviceBuffer<f32>>,
    ) -> Result<([u32; N], [f32; M]), KernelError> {
        ShapeError::check("read_results", "counts", N, first.len())?;
        let (mut counts, mut values) = ([0u32; N], [0f32; M]);
        // SAFETY: `first` holds N values (checked above) and `second`, when given, M (checked
        // below); the synchronize keeps the arrays borrowed until the copies have landed.
        unsafe {
            self.stream()
                .copy_out(&mut counts, first.as_device_ptr())
                .map_err(cuda("copying to the host"))?;
            if let Some(second) = second {
                ShapeError::check("read_results", "values", M, second.len())?;
                self.stream()
                    .copy_out(&mut values, second.as_device_ptr())
                    .map_err(cuda("copying to the host"))?;
            }
        }
        self.synchronize()?;
        Ok((counts, values))
    }

    /// The result of a label check that `kernel` left in `status` (`[bad, first bad]`, see
    /// `check_labels` in `kernels/reduce.cu`): the CPU's error for the first bad label, if any.
    fn label_check(
        kernel: Kernel,
        op: &'static str,
        [bad, first]: [u32; 2],
        rows: usize,
        classes: usize,
    ) -> Result<(), KernelError> {
        if bad as usize > rows {
            return Err(KernelError::NotWritten {
                kernel: kernel.entry(),
            });
        }
        match bad {
            0 => Ok(()),
            _ => Err(check::bad_label(op, first, classes).into()),
        }
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Kernels issued last (a step whose result was never read back) may still be running
        // and using the scratch memory and the modules' code that the fields free and unload
        // (each in the backend's context, whatever thread this is). Nothing can be done about
        // a failure here.
        let _ = self.make_current();
        let _ = self.stream().synchronize();
    }
}

/// Whether a device of compute `capability` runs `module`: its target is no newer (the 16-bit
/// module's tensor-core products need 8.0; the others, 7.5).
fn runs(module: &PtxModule, capability: u32) -> bool {
    module.capability().is_some_and(|needs| needs <= capability)
}

/// Turns a failure to load a PTX module into an error that names its likely cause.
fn load_error(code: Code) -> KernelError {
    // An older driver says CUDA_ERROR_UNSUPPORTED_PTX_VERSION about PTX ISA 9.0 (or, before
    // it had that code, something else): the driver's version tells that case apart.
    match driver::driver_version() {
        Ok(version) if version < 13_000 || code == UNSUPPORTED_PTX_VERSION => {
            KernelError::DriverTooOld {
                major: version / 1000,
                minor: version % 1000 / 10,
            }
        }
        _ => KernelError::Cuda {
            during: "loading the kernels' PTX",
            code,
        },
    }
}

/// `len` uninitialised values in `context`: every caller writes the memory (copy, memset or
/// kernel) before reading it.
fn allocate<T: DeviceCopy>(
    context: &Arc<Context>,
    len: usize,
) -> Result<DeviceBuffer<T>, KernelError> {
    DeviceBuffer::uninitialized(context, len).map_err(cuda("allocating device memory"))
}

/// An operand as [`check`] sees it.
fn operand<B: HasLen>((buf, offset): &(B, usize)) -> Operand {
    Operand::at(buf.len_of(), *offset)
}

/// The length of a buffer behind a reference, shared or not.
trait HasLen {
    fn len_of(&self) -> usize;
}

impl<T> HasLen for &DeviceBuffer<T> {
    fn len_of(&self) -> usize {
        self.len()
    }
}

impl<T> HasLen for &mut DeviceBuffer<T> {
    fn len_of(&self) -> usize {
        self.len()
    }
}

/// `ShapeError::check` of an operand that a GPU-only operation (no `check` function) reads.
fn check_span<B: HasLen>(
    op: &'static str,
    name: &'static str,
    at: &(B, usize),
    len: usize,
) -> Result<(), ShapeError> {
    let at = operand(at);
    ShapeError::check(op, name, at.offset.saturating_add(len), at.len)
}

/// A pointer to the value at `offset` in `buf`, for an operand already checked.
fn span<T>((buf, offset): (&DeviceBuffer<T>, usize)) -> DevicePointer<T> {
    debug_assert!(offset <= buf.len());
    buf.as_device_ptr().wrapping_add(offset)
}

/// [`span`] of a buffer the kernel writes.
fn span_mut<T>((buf, offset): (&mut DeviceBuffer<T>, usize)) -> DevicePointer<T> {
    span((buf, offset))
}

/// A size as the kernels' 32-bit `unsigned`.
fn dim(what: &'static str, value: usize) -> Result<u32, KernelError> {
    u32::try_from(value).map_err(|_| KernelError::TooLarge {
        what,
        value,
        max: u32::MAX as usize,
    })
}

/// Blocks for a grid-stride kernel over `len` values (at least one, so that a launch over
/// nothing is still valid and simply does nothing).
fn stride_grid(len: usize) -> u32 {
    len.div_ceil(BLOCK as usize).clamp(1, MAX_BLOCKS) as u32
}

/// The kernels' `Grads` parameter: the device address of each buffer's span, and the count.
fn gradient_table(
    op: &'static str,
    grads: &[(&DeviceBuffer<f32>, usize)],
    len: usize,
) -> Result<([u64; MAX_GRADIENT_BUFFERS], u32), KernelError> {
    address_table(op, &grad_addresses(op, grads, len)?)
}

/// The device address of each gradient span, checked to hold `len` values.
fn grad_addresses(
    op: &'static str,
    grads: &[(&DeviceBuffer<f32>, usize)],
    len: usize,
) -> Result<Vec<u64>, KernelError> {
    grads
        .iter()
        .map(|grad| {
            check_span(op, "grads", grad, len)?;
            Ok(span(*grad).as_raw())
        })
        .collect()
}

/// A stream and the kernels loaded in its context: what launches a kernel, for the backend and
/// for its [`CudaQueue`](crate::CudaQueue).
pub(crate) struct Launcher<'a> {
    pub(crate) stream: Arc<Stream>,
    pub(crate) kernels: &'a Kernels,
}

impl Launcher<'_> {
    /// Launches `kernel` on the stream.
    ///
    /// # Safety
    ///
    /// `args` must point to values of the kernel's parameter types, in order, and every device
    /// pointer among them must cover what the kernel reads and writes with these arguments.
    /// The stream's context must be current.
    unsafe fn launch(
        &self,
        kernel: Kernel,
        grid: impl Into<Dim3>,
        block: impl Into<Dim3>,
        args: &[*mut c_void],
    ) -> Result<(), KernelError> {
        let function = self.kernels.get(kernel)?;
        // SAFETY: the caller's promises; the handle is one of the stream's context's modules'.
        unsafe {
            self.stream
                .launch(function, grid.into(), block.into(), args)
        }
        .map_err(cuda(kernel.entry()))
    }

    /// Queues the optimiser update `kernel` (of `kernels/update.cu`) of the consecutive
    /// `spans` (each `(len, hyper)`: its length, and where its values are read when the kernel
    /// runs) of the parameters at `p` and their state vectors at `state`, from the mean of the
    /// gradients at `grads` (each holding the spans' values from its address on; of type
    /// `grads_dtype`, f32 or an exchange's bf16, which are summed), writing the parameters'
    /// rounded `copy` too where there is one.
    ///
    /// # Safety
    ///
    /// Every address covers the spans' total length (each `hyper` the kernel's values) of live
    /// device memory that the stream's device can read, until the kernel has run; the
    /// stream's context is current.
    pub(crate) unsafe fn update(
        &self,
        kernel: &str,
        p: u64,
        state: &[u64],
        grads: &[u64],
        spans: &[(usize, u64)],
        (grads_dtype, copy): (DType, Option<RoundedCopy>),
    ) -> Result<(), KernelError> {
        let (span_table, count) = update_spans(spans)?;
        let (copy, narrow) = copy_args(copy);
        let grads_bf16 = i32::from(grads_dtype == DType::BF16);
        let grid = stride_grid(spans.iter().map(|&(len, _)| len).sum::<usize>());
        if kernel == Kernel::SgdEmaUpdate.entry() {
            let e = sgd_state(state)?;
            let (table, n) = address_table(Kernel::SgdEmaUpdate.entry(), grads)?;
            // SAFETY: the arguments follow `sgd_ema_update`'s parameters; the caller's
            // promises cover the memory.
            unsafe {
                self.launch(
                    Kernel::SgdEmaUpdate,
                    grid,
                    BLOCK,
                    args![p, e, table, n, span_table, count, copy, narrow, grads_bf16],
                )
            }
        } else if kernel == Kernel::AdamUpdate.entry() {
            let (m, v, e) = adam_state(state)?;
            let (table, n) = address_table(Kernel::AdamUpdate.entry(), grads)?;
            // SAFETY: the arguments follow `adam_update`'s parameters (its average null where
            // it keeps none); the caller's promises cover the memory.
            unsafe {
                self.launch(
                    Kernel::AdamUpdate,
                    grid,
                    BLOCK,
                    args![p, m, v, e, table, n, span_table, count, copy, narrow, grads_bf16],
                )
            }
        } else {
            Err(no_update_kernel(kernel, state))
        }
    }

    /// Queues `compress_bf16` of the `len` f32 values at `src` into bf16 ones at `dst`, each
    /// divided by `divisor` first.
    ///
    /// # Safety
    ///
    /// `src` and `dst` hold `len` values of live device memory of the stream's device until
    /// the kernel has run; the stream's context is current.
    unsafe fn compress_bf16(
        &self,
        dst: u64,
        src: u64,
        len: usize,
        divisor: f32,
    ) -> Result<(), KernelError> {
        // SAFETY: the arguments follow `compress_bf16`'s parameters; the caller's promises
        // cover the memory.
        unsafe {
            self.launch(
                Kernel::CompressBf16,
                stride_grid(len),
                BLOCK,
                args![dst, src, len, divisor],
            )
        }
    }

    /// Queues `round_to` of the `len` f32 values at `x` to `dtype`, in place (nothing for
    /// `f32`).
    ///
    /// # Safety
    ///
    /// `x` holds `len` f32 values of live device memory of the stream's device until the
    /// kernel has run; the stream's context is current.
    unsafe fn round(&self, x: u64, len: usize, dtype: DType) -> Result<(), KernelError> {
        if dtype == DType::F32 || len == 0 {
            return Ok(());
        }
        let bf16 = i32::from(dtype == DType::BF16);
        // SAFETY: the arguments follow `round_to`'s parameters; the caller's promises cover
        // the memory.
        unsafe {
            self.launch(
                Kernel::RoundTo,
                stride_grid(len),
                BLOCK,
                args![x, len, bf16],
            )
        }
    }

    /// Queues `sum_squares` of the `len` f32 values at `src` into the f64 at `dst`.
    ///
    /// # Safety
    ///
    /// `src` holds `len` f32 values and `dst` 8 bytes of this device's memory, until the
    /// kernel has run.
    unsafe fn sum_squares(&self, dst: u64, src: u64, len: usize) -> Result<(), KernelError> {
        // SAFETY: the arguments follow `sum_squares`'s parameters; the caller's promises cover
        // the memory.
        unsafe { self.launch(Kernel::SumSquares, 1u32, BLOCK, args![src, len, dst]) }
    }

    /// Queues `ops` as `pass` says: in [`Pass::Inputs`] only the uploads (the rest is in the
    /// captured graph), in [`Pass::Kernels`] all but them (they come before the graph), in
    /// [`Pass::Direct`] everything.
    ///
    /// # Safety
    ///
    /// As [`DeviceQueue::run`](tandem_core::DeviceQueue::run)'s; the stream's context is
    /// current.
    pub(crate) unsafe fn run(&self, pass: Pass, ops: &[DeviceOp]) -> Result<(), KernelError> {
        let mut rest = ops;
        while let Some(op) = rest.first() {
            let mut done = 1;
            match op {
                DeviceOp::Upload { dst, values } if pass != Pass::Kernels => {
                    // SAFETY: the caller's promises; the driver copies pageable memory
                    // before it returns.
                    unsafe { self.stream.copy_in(DevicePointer::from_raw(*dst), values) }
                        .map_err(cuda("copying to the device"))?
                }
                DeviceOp::Copy {
                    dst,
                    src,
                    len,
                    dtype,
                } if pass != Pass::Inputs => {
                    // SAFETY: the caller's promises.
                    unsafe { self.stream.copy_device(*dst, *src, dtype.bytes(*len)) }
                        .map_err(cuda("copying on the device"))?
                }
                DeviceOp::Update {
                    kernel,
                    params,
                    state,
                    grads,
                    grads_dtype,
                    copy,
                    ..
                } if pass != Pass::Inputs => {
                    if !runs_update(kernel, state.len(), *grads_dtype) {
                        return Err(KernelError::NoUpdateKernel {
                            kernel: kernel.to_string(),
                            states: state.len(),
                            grads: *grads_dtype,
                        });
                    }
                    let spans = consecutive_spans(rest);
                    done = spans.len();
                    // SAFETY: the caller's promises, for each update that the spans join.
                    unsafe {
                        let with = (*grads_dtype, *copy);
                        self.update(kernel, *params, state, grads, &spans, with)
                    }?
                }
                DeviceOp::Compress {
                    dst,
                    src,
                    len,
                    divisor,
                    dtype,
                } if pass != Pass::Inputs => {
                    if *dtype != DType::BF16 {
                        return Err(KernelError::NoCompression(*dtype));
                    }
                    // SAFETY: the caller's promises: `src` holds `len` f32 values, `dst` as
                    // many bf16 ones.
                    unsafe { self.compress_bf16(*dst, *src, *len, *divisor) }?
                }
                DeviceOp::Round { at, len, dtype } if pass != Pass::Inputs => {
                    // SAFETY: the caller's promises: `at` holds `len` f32 values.
                    unsafe { self.round(*at, *len, *dtype) }?
                }
                DeviceOp::SumSquares { dst, src, len } if pass != Pass::Inputs => {
                    // SAFETY: the caller's promises: `src` holds `len` f32 values, `dst` 8
                    // bytes.
                    unsafe { self.sum_squares(*dst, *src, *len) }?
                }
                _ => {}
            }
            rest = &rest[done..];
        }
        Ok(())
    }
}

/// Whether an update kernel `kernel` of `kernels/update.cu` takes `states` state vectors and
/// gradients of type `grads` (`f32`, or the bf16 of an exchange).
pub(crate) fn runs_update(kernel: &str, states: usize, grads: DType) -> bool {
    matches!(grads, DType::F32 | DType::BF16)
        && ((kernel == Kernel::SgdEmaUpdate.entry() && states == 1)
            || (kernel == Kernel::AdamUpdate.entry() && (2..=3).contains(&states)))
}

/// The update kernels' `copy` and `narrow` parameters for `copy` (a null pointer: none).
fn copy_args(copy: Option<RoundedCopy>) -> (u64, i32) {
    match copy {
        None => (0, 0),
        Some(RoundedCopy { params, dtype }) => (params, narrow(dtype)),
    }
}

/// The `narrow` parameter (`kernels/round.cuh`) of a kernel that stores a `dtype` backend's
/// results: what it rounds them to (`round_stored`).
fn narrow(dtype: DType) -> i32 {
    match dtype {
        DType::F32 => 0,
        DType::BF16 => 1,
        DType::F16 => 2,
    }
}

fn no_update_kernel(kernel: &str, state: &[u64]) -> KernelError {
    KernelError::NoUpdateKernel {
        kernel: kernel.to_owned(),
        states: state.len(),
        grads: DType::F32,
    }
}

/// `sgd_ema_update`'s state vector: the moving average.
fn sgd_state(state: &[u64]) -> Result<u64, KernelError> {
    match *state {
        [e] => Ok(e),
        _ => Err(no_update_kernel(Kernel::SgdEmaUpdate.entry(), state)),
    }
}

/// `adam_update`'s state vectors: the two moments and the moving average (null, 0, where it
/// keeps none).
fn adam_state(state: &[u64]) -> Result<(u64, u64, u64), KernelError> {
    match *state {
        [m, v] => Ok((m, v, 0)),
        [m, v, e] => Ok((m, v, e)),
        _ => Err(no_update_kernel(Kernel::AdamUpdate.entry(), state)),
    }
}

/// An update kernel's `Spans` parameter for `spans` ([`span_table`]), or the error for no
/// spans or more than the kernel takes.
fn update_spans(spans: &[(usize, u64)]) -> Result<([u64; SPAN_TABLE], u32), KernelError> {
    span_table(spans).ok_or(KernelError::TooLarge {
        what: "update: spans",
        value: spans.len(),
        max: MAX_UPDATE_SPANS,
    })
}

/// What identifies a [`DeviceOp`] in a captured graph: all of it but an upload's values.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum OpShape {
    Copy(u64, u64, usize, DType),
    Upload(u64, usize),
    Compress(u64, u64, usize, u32, DType),
    SumSquares(u64, u64, usize),
    Round(u64, usize, DType),
    Update(
        &'static str,
        u64,
        Vec<u64>,
        Vec<u64>,
        DType,
        usize,
        u64,
        Option<RoundedCopy>,
    ),
}

impl OpShape {
    fn of(op: &DeviceOp) -> OpShape {
        match op {
            DeviceOp::Copy {
                dst,
                src,
                len,
                dtype,
            } => OpShape::Copy(*dst, *src, *len, *dtype),
            DeviceOp::Upload { dst, values } => OpShape::Upload(*dst, values.len()),
            DeviceOp::Compress {
                dst,
                src,
                len,
                divisor,
                dtype,
            } => OpShape::Compress(*dst, *src, *len, divisor.to_bits(), *dtype),
            DeviceOp::SumSquares { dst, src, len } => OpShape::SumSquares(*dst, *src, *len),
            DeviceOp::Round { at, len, dtype } => OpShape::Round(*at, *len, *dtype),
            DeviceOp::Update {
                kernel,
                params,
                state,
                grads,
                grads_dtype,
                len,
                hyper,
                copy,
            } => OpShape::Update(
                kernel,
                *params,
                state.clone(),
                grads.clone(),
                *grads_dtype,
                *len,
                *hyper,
                *copy,
            ),
        }
    }
}

/// A key of [`Backend::replay`] with the shapes of the operations a store put around the step.
#[derive(Debug, PartialEq, Eq, Hash)]
struct ReplayKey {
    key: u64,
    before: Vec<OpShape>,
    after: Vec<OpShape>,
}

/// The stream a backend and its queues run their work on, which a queue may switch to another
/// backend's ([`DeviceQueue::share_order`](tandem_core::DeviceQueue::share_order)).
pub(crate) struct RunsOn(RwLock<Arc<Stream>>);

impl RunsOn {
    fn new(stream: Arc<Stream>) -> Self {
        Self(RwLock::new(stream))
    }

    /// The stream now.
    pub(crate) fn get(&self) -> Arc<Stream> {
        // Nothing panics while holding it.
        Arc::clone(&self.0.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Runs later work on `stream`.
    pub(crate) fn set(&self, stream: Arc<Stream>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = stream;
    }
}

/// Operations a store put around a replica's next step
/// ([`DeviceQueue::around_next_step`](tandem_core::DeviceQueue::around_next_step)): shared by
/// a backend and its queues, taken by the backend's next [`Backend::replay`].
#[derive(Default)]
pub(crate) struct StepOps(Mutex<Option<(Vec<DeviceOp>, Vec<DeviceOp>)>>);

impl StepOps {
    fn slot(&self) -> MutexGuard<'_, Option<(Vec<DeviceOp>, Vec<DeviceOp>)>> {
        // Nothing panics while holding it.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the operations around the next step (replacing any not yet taken).
    pub(crate) fn put(&self, before: Vec<DeviceOp>, after: Vec<DeviceOp>) {
        *self.slot() = Some((before, after));
    }

    /// Whether operations wait for a step.
    pub(crate) fn pending(&self) -> bool {
        self.slot().is_some()
    }

    fn take(&self) -> (Vec<DeviceOp>, Vec<DeviceOp>) {
        self.slot().take().unwrap_or_default()
    }
}

/// The kernels' `Grads` parameter from device addresses, and the count.
fn address_table(
    op: &'static str,
    grads: &[u64],
) -> Result<([u64; MAX_GRADIENT_BUFFERS], u32), KernelError> {
    if grads.is_empty() || grads.len() > MAX_GRADIENT_BUFFERS {
        return Err(KernelError::GradientCount {
            op,
            given: grads.len(),
        });
    }
    let mut table = [0u64; MAX_GRADIENT_BUFFERS];
    table[..grads.len()].copy_from_slice(grads);
    Ok((table, grads.len() as u32))
}

impl Backend for CudaBackend {
    type Buffer = DeviceBuffer<f32>;
    type Labels = DeviceBuffer<u32>;
    type Examples = DeviceExamples;
    type Error = KernelError;

    fn dtype(&self) -> DType {
        self.dtype
    }

    /// On a 16-bit backend: writes `scale` to the device (only when it changed), where the
    /// loss gradient's rounding reads it.
    fn set_loss_scale(&self, scale: f32) -> Result<bool, KernelError> {
        if self.dtype == DType::F32 {
            return Ok(false);
        }
        if self.loss_scale.get() != Some(scale) {
            let mut scratch = self.scratch.borrow_mut();
            self.copy_in("set_loss_scale", &[scale], &mut scratch.loss_scale, 0)?;
            self.loss_scale.set(Some(scale));
        }
        Ok(true)
    }

    fn unscale(&self, x: (&mut DeviceBuffer<f32>, usize), len: usize) -> Result<(), KernelError> {
        check::unscale(operand(&x), len)?;
        if self.dtype == DType::F32 {
            return Ok(());
        }
        let x = span_mut(x);
        let scratch = self.scratch.borrow();
        let scale = scratch.loss_scale.as_device_ptr();
        let flags = scratch.unscale_flags.as_device_ptr();
        // SAFETY: the arguments follow `unscale`'s parameters; x covers len values (checked
        // above), the scale is one value and the flags one a block.
        unsafe {
            self.launch(
                Kernel::Unscale,
                UNSCALE_BLOCKS,
                BLOCK,
                args![x, len, scale, flags],
            )
        }
    }

    fn unscaled_finite(&self) -> Result<bool, KernelError> {
        if self.dtype == DType::F32 {
            return Ok(true);
        }
        let mut flags = [0.0f32; UNSCALE_BLOCKS as usize];
        self.download(&self.scratch.borrow().unscale_flags, 0, &mut flags)?;
        Ok(flags.iter().all(|&flag| flag == 0.0))
    }

    fn repeat_after_step(&self) {
        let after = self.last_after.borrow().clone();
        if !after.is_empty() {
            self.step_ops.put(Vec::new(), after);
        }
    }

    fn bind_thread(&self) -> Result<(), KernelError> {
        self.make_current()
    }

    fn zeros(&self, len: usize) -> Result<DeviceBuffer<f32>, KernelError> {
        self.zeroed(len)
    }

    fn zero_labels(&self, len: usize) -> Result<DeviceBuffer<u32>, KernelError> {
        self.zeroed(len)
    }

    fn upload(
        &self,
        src: &[f32],
        dst: &mut DeviceBuffer<f32>,
        offset: usize,
    ) -> Result<(), KernelError> {
        check::upload(src.len(), Operand::at(dst.len(), offset))?;
        self.copy_in("upload", src, dst, offset)?;
        self.round(span_mut((dst, offset)), src.len())
    }

    fn download(
        &self,
        src: &DeviceBuffer<f32>,
        offset: usize,
        dst: &mut [f32],
    ) -> Result<(), KernelError> {
        check::download(Operand::at(src.len(), offset), dst.len())?;
        self.copy_out("download", src, offset, dst)
    }

    /// Stages through pinned host memory: `fill` must write the whole slice it is given (it
    /// holds whatever the last staging left), which is then uploaded.
    fn write_with(
        &self,
        dst: &mut DeviceBuffer<f32>,
        fill: &mut dyn FnMut(&mut [f32]),
    ) -> Result<(), KernelError> {
        let mut scratch = self.scratch.borrow_mut();
        let host = scratch.staging(&self.context, dst.len())?;
        fill(host);
        self.copy_in("write_with", host, dst, 0)?;
        self.round(span_mut((dst, 0)), dst.len())
    }

    /// Stages through pinned host memory: the buffer is downloaded, then handed to `read`.
    fn read_with(
        &self,
        src: &DeviceBuffer<f32>,
        read: &mut dyn FnMut(&[f32]),
    ) -> Result<(), KernelError> {
        let mut scratch = self.scratch.borrow_mut();
        let host = scratch.staging(&self.context, src.len())?;
        self.copy_out("read_with", src, 0, host)?;
        read(host);
        Ok(())
    }

    fn upload_examples(&self, examples: &ExampleSet) -> Result<DeviceExamples, KernelError> {
        Ok(DeviceExamples {
            features: examples.features(),
            len: examples.len(),
            values: self.upload_new(examples.values())?,
            labels: self.upload_new(examples.labels())?,
        })
    }

    fn gather(
        &self,
        examples: &DeviceExamples,
        indices: &[u32],
        x: &mut DeviceBuffer<f32>,
        labels: &mut DeviceBuffer<u32>,
    ) -> Result<(), KernelError> {
        let rows = indices.len();
        let features = examples.features;
        check::gather(examples.len, features, indices, x.len(), labels.len())?;
        let x = span_mut((x, 0));
        let labels = span_mut((labels, 0));
        if rows == 0 {
            return Ok(());
        }
        let grid_y = features.div_ceil(BLOCK as usize);
        if grid_y > MAX_GRID_Y {
            return Err(KernelError::TooLarge {
                what: "gather: features",
                value: features,
                max: MAX_GRID_Y * BLOCK as usize,
            });
        }
        let grid = (dim("gather: rows", rows)?, grid_y as u32);
        let features = dim("gather: features", features)?;
        let indices = self.batch_indices(indices)?;
        let values = examples.values.as_device_ptr();
        let example_labels = examples.labels.as_device_ptr();
        let narrow = narrow(self.dtype);
        // SAFETY: the arguments follow `gather`'s parameters; x covers rows*features values,
        // labels rows, the uploaded indices rows, and each index is below the data set's
        // length (checked above).
        unsafe {
            self.launch(
                Kernel::Gather,
                grid,
                BLOCK,
                args![values, example_labels, indices, features, x, labels, narrow],
            )
        }
    }

    fn matmul(
        &self,
        spec: Gemm,
        a: (&DeviceBuffer<f32>, usize),
        b: (&DeviceBuffer<f32>, usize),
        c: (&mut DeviceBuffer<f32>, usize),
    ) -> Result<(), KernelError> {
        self.gemm(spec, ProductA::Buffer(a), b, Epilogue::None, c)
    }

    /// One product, the biases' sums as its row of ones (`Epilogue::ColumnSums`; 16-bit: on
    /// the tensor cores).
    fn weight_and_bias_gradients(
        &self,
        (ins, outs, rows): (usize, usize, usize),
        x: &DeviceBuffer<f32>,
        delta: &DeviceBuffer<f32>,
        (grads, offset): (&mut DeviceBuffer<f32>, usize),
        _: &dyn Helpers,
    ) -> Result<(), KernelError> {
        let spec = Gemm::tn(ins, outs, rows);
        self.gemm(
            spec,
            ProductA::Buffer((x, 0)),
            (delta, 0),
            Epilogue::ColumnSums,
            (grads, offset),
        )
    }

    /// f32: both products in one `matmul_pair` launch where neither splits (the weight
    /// gradient's walk over the batch is short, the input gradient's over the layer's
    /// outputs too); 16-bit, or split: one after the other.
    fn layer_gradients(
        &self,
        (ins, outs, rows): (usize, usize, usize),
        (x, delta): (&DeviceBuffer<f32>, &DeviceBuffer<f32>),
        weights: (&DeviceBuffer<f32>, usize),
        (grads, offset): (&mut DeviceBuffer<f32>, usize),
        (input_delta, mask): (&mut DeviceBuffer<f32>, Option<&DeviceBuffer<f32>>),
        _: &dyn Helpers,
    ) -> Result<(), KernelError> {
        let epilogue = match mask {
            Some(mask) => Epilogue::ReluBackward(mask),
            None => Epilogue::None,
        };
        let input_gradient = (
            Gemm::nt(rows, ins, outs),
            (delta, 0),
            weights,
            epilogue,
            (input_delta, 0),
        );
        let weight_gradient = (
            Gemm::tn(ins, outs, rows),
            (x, 0),
            (delta, 0),
            Epilogue::ColumnSums,
            (grads, offset),
        );
        self.gemm_pair(weight_gradient, input_gradient)
    }

    fn matmul_relu_backward(
        &self,
        spec: Gemm,
        a: (&DeviceBuffer<f32>, usize),
        b: (&DeviceBuffer<f32>, usize),
        mask: &DeviceBuffer<f32>,
        c: &mut DeviceBuffer<f32>,
    ) -> Result<(), KernelError> {
        self.gemm(
            spec,
            ProductA::Buffer(a),
            b,
            Epilogue::ReluBackward(mask),
            (c, 0),
        )
    }

    fn matmul_bias(
        &self,
        spec: Gemm,
        a: (&DeviceBuffer<f32>, usize),
        b: (&DeviceBuffer<f32>, usize),
        bias: (&DeviceBuffer<f32>, usize),
        c: (&mut DeviceBuffer<f32>, usize),
        activation: Activation,
    ) -> Result<(), KernelError> {
        self.gemm(
            spec,
            ProductA::Buffer(a),
            b,
            Epilogue::Bias(bias, activation),
            c,
        )
    }

    /// One `gather_matmul` (16-bit: `gather_mma_matmul`): the batch gathered as the product
    /// loads its operand, and written to `x` and `labels` on the way.
    fn gather_matmul_bias(
        &self,
        (examples, indices): (&DeviceExamples, &[u32]),
        (x, labels): (&mut DeviceBuffer<f32>, &mut DeviceBuffer<u32>),
        spec: Gemm,
        b: (&DeviceBuffer<f32>, usize),
        bias: (&DeviceBuffer<f32>, usize),
        c: (&mut DeviceBuffer<f32>, usize),
        activation: Activation,
    ) -> Result<(), KernelError> {
        check::gather_matmul(indices.len(), examples.features, spec)?;
        check::gather(
            examples.len,
            examples.features,
            indices,
            x.len(),
            labels.len(),
        )?;
        let a = ProductA::Gathered(GatheredBatch {
            images: examples.values.as_device_ptr(),
            example_labels: examples.labels.as_device_ptr(),
            indices: self.batch_indices(indices)?,
            x: span_mut((x, 0)),
            x_len: x.len(),
            labels: span_mut((labels, 0)),
        });
        self.gemm(spec, a, b, Epilogue::Bias(bias, activation), c)
    }

    fn copy(
        &self,
        src: (&DeviceBuffer<f32>, usize),
        dst: (&mut DeviceBuffer<f32>, usize),
        len: usize,
    ) -> Result<(), KernelError> {
        check::copy(operand(&src), operand(&dst), len)?;
        if len == 0 {
            return Ok(());
        }
        let (from, to) = (span(src).as_raw(), span_mut(dst).as_raw());
        // SAFETY: both spans hold `len` values (checked above) of this device's memory.
        unsafe { self.stream().copy_device(to, from, DType::F32.bytes(len)) }
            .map_err(cuda("copying on the device"))
    }

    /// The first run of a key goes as it comes (allocating what it needs); the second is
    /// captured as a graph; from then on a call queues `ops`' fresh inputs (the batch's indices)
    /// and launches the graph: one launch for the whole sequence. The operations a store put
    /// around the step ([`CudaQueue`](crate::CudaQueue)'s `around_next_step`) are part of it:
    /// their shapes join the key, and their uploads are inputs.
    fn replay(
        &self,
        key: u64,
        ops: &mut dyn FnMut(&Self) -> Result<(), KernelError>,
    ) -> Result<(), KernelError> {
        let (before, after) = self.step_ops.take();
        if self.dtype != DType::F32 {
            // Only a loss-scaled pass is ever computed again; f32 steps keep no copy.
            self.last_after.replace(after.clone());
        }
        let key = ReplayKey {
            key,
            before: before.iter().map(OpShape::of).collect(),
            after: after.iter().map(OpShape::of).collect(),
        };
        let mut step = |b: &Self| {
            b.run_step_ops(&before)?;
            ops(b)?;
            b.run_step_ops(&after)
        };
        // Taken out while `ops` runs: a scratch buffer it grows forgets every graph (`reserve`).
        let known = self.replays.borrow_mut().remove(&key);
        let replay = match known {
            None => {
                step(self)?;
                Replay::Seen
            }
            Some(Replay::Seen) => {
                self.in_pass(Pass::Inputs, || step(self))?;
                self.send_inputs(true)?;
                let (recorded, graph) = self
                    .in_pass(Pass::Kernels, || self.capture.capture(|| step(self)))
                    .map_err(cuda("capturing a graph"))?;
                recorded?;
                self.stream()
                    .launch_graph(&graph)
                    .map_err(cuda("launching a graph"))?;
                Replay::Captured(graph)
            }
            Some(Replay::Captured(graph)) => {
                self.in_pass(Pass::Inputs, || step(self))?;
                self.send_inputs(false)?;
                self.stream()
                    .launch_graph(&graph)
                    .map_err(cuda("launching a graph"))?;
                Replay::Captured(graph)
            }
        };
        self.replays.borrow_mut().insert(key, replay);
        Ok(())
    }

    fn bias_add(
        &self,
        x: &mut DeviceBuffer<f32>,
        bias: (&DeviceBuffer<f32>, usize),
        rows: usize,
        cols: usize,
        activation: Activation,
    ) -> Result<(), KernelError> {
        check::bias_add(x.len(), operand(&bias), rows, cols)?;
        let len = rows.saturating_mul(cols); // no saturation: checked against x.len()
        let bias = span(bias);
        let x = span_mut((x, 0));
        let cols = dim("bias: cols", cols)?;
        let relu = i32::from(activation == Activation::Relu);
        // SAFETY: the arguments follow `bias_add`'s parameters; x covers len = rows*cols values
        // and bias cols values.
        unsafe {
            self.launch(
                Kernel::BiasAdd,
                stride_grid(len),
                BLOCK,
                args![x, bias, len, cols, relu],
            )?;
        }
        self.round(x, len)
    }

    fn relu_backward(
        &self,
        grad: &mut DeviceBuffer<f32>,
        activation: &DeviceBuffer<f32>,
        len: usize,
    ) -> Result<(), KernelError> {
        check::relu_backward(grad.len(), activation.len(), len)?;
        let activation = span((activation, 0));
        let grad = span_mut((grad, 0));
        // SAFETY: the arguments follow `relu_backward`'s parameters; both cover len values.
        unsafe {
            self.launch(
                Kernel::ReluBackward,
                stride_grid(len),
                BLOCK,
                args![grad, activation, len],
            )
        }
    }

    /// As on the CPU, with one difference: a label outside `0..classes` is found on the device,
    /// after the kernels ran, so the error comes with `dlogits` written (bad rows as if their
    /// label matched no class).
    fn softmax_cross_entropy(
        &self,
        logits: &DeviceBuffer<f32>,
        labels: &DeviceBuffer<u32>,
        rows: usize,
        classes: usize,
        dlogits: &mut DeviceBuffer<f32>,
    ) -> Result<f32, KernelError> {
        let op = "softmax_cross_entropy";
        if rows == 0 {
            check::softmax_cross_entropy(logits.len(), labels.len(), rows, classes, dlogits.len())?;
            return Ok(f32::NAN); // the mean of no losses, as on the CPU
        }
        // Poisoned first, so that a kernel that never ran cannot pass for one that found no bad
        // label. (Training's `softmax_cross_entropy_into` reads neither, and sets nothing.)
        let loss = {
            let scratch = self.scratch.borrow();
            self.fill(&scratch.counts, POISON, "poisoning the label check")?;
            self.fill(&scratch.loss, POISON, "poisoning the loss")?;
            scratch.loss.as_device_ptr()
        };
        let at = DevicePointer::null();
        self.softmax_loss(logits, labels, (rows, classes), dlogits, loss, at)?;
        let scratch = self.scratch.borrow();
        let ([_, bad, first], [loss]) = self.read_results(&scratch.counts, Some(&scratch.loss))?;
        Self::label_check(Kernel::SoftmaxCrossEntropy, op, [bad, first], rows, classes)?;
        Ok(loss)
    }

    fn softmax_cross_entropy_into(
        &self,
        logits: &DeviceBuffer<f32>,
        labels: &DeviceBuffer<u32>,
        (rows, classes): (usize, usize),
        dlogits: &mut DeviceBuffer<f32>,
        loss: (&mut DeviceBuffer<f32>, usize),
    ) -> Result<(), KernelError> {
        check_span("softmax_cross_entropy_into", "loss", &loss, 1)?;
        if rows == 0 {
            check::softmax_cross_entropy(logits.len(), labels.len(), rows, classes, dlogits.len())?;
            return self.upload(&[f32::NAN], loss.0, loss.1);
        }
        let (loss, at) = self.loss_slot(loss)?;
        self.softmax_loss(logits, labels, (rows, classes), dlogits, loss, at)
    }

    /// f32, with at most [`TILE`] classes and at least one row: one
    /// `matmul_softmax_cross_entropy` (the product split over k as `matmul` splits it);
    /// otherwise the product, then `softmax_cross_entropy`.
    fn matmul_bias_softmax_cross_entropy_into(
        &self,
        spec: Gemm,
        (a, b, bias): LayerOperands<'_, Self>,
        (logits, labels): (&mut DeviceBuffer<f32>, &DeviceBuffer<u32>),
        dlogits: &mut DeviceBuffer<f32>,
        loss: (&mut DeviceBuffer<f32>, usize),
    ) -> Result<(), KernelError> {
        let (rows, classes) = (spec.m, spec.n);
        let plain = !spec.a_transposed && !spec.b_transposed;
        let fused = self.dtype == DType::F32 && plain && classes <= TILE && rows > 0;
        let product = match fused {
            true => {
                let epilogue = Epilogue::Bias(bias, Activation::Identity);
                self.product_args(spec, &ProductA::Buffer(a), b, epilogue, (&mut *logits, 0))?
            }
            false => None,
        };
        let Some(product) = product else {
            self.matmul_bias(spec, a, b, bias, (&mut *logits, 0), Activation::Identity)?;
            return self.softmax_cross_entropy_into(logits, labels, (rows, classes), dlogits, loss);
        };
        check::softmax_cross_entropy(logits.len(), labels.len(), rows, classes, dlogits.len())?;
        check_span("matmul_bias_softmax_cross_entropy_into", "loss", &loss, 1)?;
        let ProductArgs {
            b,
            c,
            bias,
            m,
            n,
            k,
            len,
            grid_y,
            ..
        } = product;
        let a = span(a);
        let (grid, k_split, parts, arrivals) = self.split_over_k((1, grid_y), k, len, 1)?;
        let (loss, loss_at) = self.loss_slot(loss)?;
        let labels = span((labels, 0));
        let dlogits = span_mut((dlogits, 0));
        let mut scratch = self.scratch.borrow_mut();
        self.reserve(&mut scratch.row_losses, rows)?;
        let row_losses = scratch.row_losses.as_device_ptr();
        // The label check goes to counts[1..3], as `softmax_cross_entropy`'s.
        let status = span((&scratch.counts, 1));
        drop(scratch);
        // SAFETY: the arguments follow `matmul_softmax_cross_entropy`'s parameters: a, b and
        // the logits c cover m*k, k*n and m*n values (n at most TILE: one tile across), bias n
        // (checked by `product_args`), labels and dlogits rows and rows*classes (checked
        // above), `parts` the splits' slices and `arrivals` a zeroed counter a tile and one
        // more (`split_over_k`), row_losses m values, loss one from the slot at loss_at,
        // status two (of the three counts).
        unsafe {
            self.launch(
                Kernel::MatmulSoftmaxCrossEntropy,
                grid,
                (MATMUL_SIDE, MATMUL_SIDE),
                args![
                    a, b, c, parts, arrivals, bias, m, n, k, k_split, labels, dlogits, row_losses,
                    loss, loss_at, status
                ],
            )
        }
    }

    /// A 16-bit backend says its type, which the device stores decline (they would copy the
    /// record in unrounded), so its parameters of record stay on the host. Its buffers are
    /// `f32` slots all the same: a store that learns to serve it must address them as `f32`.
    fn residence(
        &self,
        params: &DeviceBuffer<f32>,
        grads: &DeviceBuffer<f32>,
    ) -> Option<tandem_core::Residence> {
        Some(tandem_core::Residence {
            queue: Arc::new(self.queue()),
            params: params.as_device_ptr().as_raw(),
            grads: grads.as_device_ptr().as_raw(),
            // A 16-bit backend's values are held in f32 slots.
            dtype: DType::F32,
            precision: self.dtype(),
        })
    }

    fn column_sum(
        &self,
        x: &DeviceBuffer<f32>,
        rows: usize,
        cols: usize,
        out: (&mut DeviceBuffer<f32>, usize),
    ) -> Result<(), KernelError> {
        check::column_sum(x.len(), rows, cols, operand(&out))?;
        let x = span((x, 0));
        let out = span_mut(out);
        let rows = dim("column_sum: rows", rows)?;
        let cols = dim("column_sum: cols", cols)?;
        let narrow = narrow(self.dtype);
        // SAFETY: the arguments follow `column_sum`'s parameters; x covers rows*cols values
        // and out cols.
        unsafe {
            self.launch(
                Kernel::ColumnSum,
                cols.div_ceil(BLOCK),
                BLOCK,
                args![x, rows, cols, out, narrow],
            )
        }
    }

    fn count_correct(
        &self,
        logits: &DeviceBuffer<f32>,
        labels: &DeviceBuffer<u32>,
        rows: usize,
        classes: usize,
    ) -> Result<usize, KernelError> {
        let op = "count_correct";
        check::count_correct(logits.len(), labels.len(), rows, classes)?;
        let logits = span((logits, 0));
        let labels = span((labels, 0));
        let rows_u32 = dim("count_correct: rows", rows)?;
        let classes_u32 = dim("count_correct: classes", classes)?;
        let scratch = self.scratch.borrow();
        self.fill(&scratch.counts, POISON, "poisoning the count")?;
        let counts = scratch.counts.as_device_ptr();
        // SAFETY: the arguments follow `count_correct`'s parameters; logits covers
        // rows*classes values, labels rows, counts three.
        unsafe {
            self.launch(
                Kernel::CountCorrect,
                1u32,
                BLOCK,
                args![logits, labels, rows_u32, classes_u32, counts],
            )?;
        }
        let ([hits, bad, first], []) = self.read_results::<3, 0>(&scratch.counts, None)?;
        Self::label_check(Kernel::CountCorrect, op, [bad, first], rows, classes)?;
        if hits as usize > rows {
            return Err(KernelError::NotWritten {
                kernel: Kernel::CountCorrect.entry(),
            });
        }
        Ok(hits as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::{narrow, CudaBackend, Kernel, KernelError, BLOCK, MATMUL_SIDE, POISON};
    use crate::launch::TILE;
    use tandem_core::DType;
    use tandem_tensor::check;

    /// What the host makes of the label check a kernel left: nothing bad, the CPU's error for
    /// the first bad label, or the poison still there (the kernel never wrote it).
    #[test]
    fn label_checks_read_back_as_the_cpus_errors() {
        let read = |status, rows| {
            CudaBackend::label_check(
                Kernel::SoftmaxCrossEntropy,
                "softmax_cross_entropy",
                status,
                rows,
                10,
            )
        };
        assert!(read([0, 0], 4).is_ok());
        match read([2, 12], 4) {
            Err(KernelError::Shape(e)) => {
                assert_eq!(e, check::bad_label("softmax_cross_entropy", 12, 10));
                assert_eq!(
                    check::labels("softmax_cross_entropy", &[1, 12, 10, 3], 10),
                    Err(e)
                );
            }
            other => panic!("{other:?}"),
        }
        let poison = u32::from_ne_bytes([POISON; 4]);
        assert_eq!(poison, u32::MAX);
        assert!(f32::from_ne_bytes([POISON; 4]).is_nan());
        assert!(matches!(
            read([poison, poison], 4),
            Err(KernelError::NotWritten {
                kernel: "softmax_cross_entropy"
            })
        ));
        // As many bad labels as rows is possible; more is not.
        assert!(matches!(read([4, 11], 4), Err(KernelError::Shape(_))));
        assert!(matches!(
            read([5, 11], 4),
            Err(KernelError::NotWritten { .. })
        ));
    }

    /// The launch shapes above are the ones the kernels are written for (`block_sum` needs
    /// exactly REDUCE_THREADS threads, `matmul` a SIDE x SIDE block).
    #[test]
    fn launch_shapes_match_the_kernel_sources() {
        let matmul = include_str!("../../../kernels/matmul.cu");
        assert!(matmul.contains(&format!("#define TILE {TILE}\n")));
        assert!(matmul.contains(&format!("#define SIDE {MATMUL_SIDE} ")));
        let reduce = include_str!("../../../kernels/reduce.cuh");
        assert!(reduce.contains(&format!("#define REDUCE_THREADS {BLOCK}\n")));
    }

    /// The `narrow` codes the launches pass are the ones `kernels/round.cuh` defines.
    #[test]
    fn narrow_codes_match_the_kernel_header() {
        let round = include_str!("../../../kernels/round.cuh");
        for (dtype, name) in [
            (DType::F32, "NONE"),
            (DType::BF16, "BF16"),
            (DType::F16, "F16"),
        ] {
            let define = format!("#define NARROW_{name} {}\n", narrow(dtype));
            assert!(round.contains(&define), "{define}");
        }
    }
}
