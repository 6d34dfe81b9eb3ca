//! [`CudaBackend`]: tandem's [`Backend`] on one GPU, through the CUDA driver API.

use std::cell::RefCell;
use std::ffi::c_void;

use cust::context::{Context, CurrentContext};
use cust::device::Device;
use cust::error::CudaError;
use cust::function::{BlockSize, GridSize};
use cust::memory::{AsyncCopyDestination, DeviceBuffer, DeviceCopy, DevicePointer, LockedBuffer};
use cust::module::Module;
use cust::stream::{Stream, StreamFlags};
use cust::{CudaApiVersion, CudaFlags};
use tandem_tensor::cpu::UpdateStep;
use tandem_tensor::{Activation, Backend, ExampleSet, Gemm, ShapeError};

use crate::error::{cuda, KernelError};
use crate::ptx::{Kernel, MAX_GRADIENT_BUFFERS, MODULES};

/// Threads per block of the 1-D kernels; also the reductions' `REDUCE_THREADS`.
const BLOCK: u32 = 256;
/// At most this many blocks for the grid-stride kernels: several waves on any current GPU, and
/// the loop inside each kernel covers the rest.
const MAX_BLOCKS: usize = 4096;
/// `TILE` and `ROWS` of `kernels/matmul.cu`: a block computes a `TILE x TILE` tile of C with
/// `TILE x MATMUL_ROWS` threads.
const TILE: usize = 32;
const MATMUL_ROWS: u32 = 8;
/// Rows of logits per block of `softmax_cross_entropy`: one warp each.
const SOFTMAX_ROWS: u32 = 4;
/// The largest grid y dimension CUDA allows.
const MAX_GRID_Y: usize = 65_535;

/// The argument array of a kernel launch: a pointer to each value, in the kernel's order.
macro_rules! args {
    ($($arg:expr),* $(,)?) => {
        &[$(&$arg as *const _ as *mut c_void),*]
    };
}

/// How many CUDA devices this machine has: 0 where the driver reports none (including the stub
/// libcuda of `cargo xtask cuda-stub`).
pub fn device_count() -> Result<usize, KernelError> {
    match cust::init(CudaFlags::empty()) {
        Err(CudaError::NoDevice) => Ok(0),
        other => {
            other.map_err(cuda("initialising the CUDA driver"))?;
            let count = Device::num_devices().map_err(cuda("counting CUDA devices"))?;
            Ok(count as usize)
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

impl DeviceExamples {
    /// Features per example.
    pub fn features(&self) -> usize {
        self.features
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no examples.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Device memory the operations need between their kernels, kept from call to call so that a
/// training step allocates nothing.
struct Scratch {
    /// `gather`'s indices, uploaded from the host.
    indices: DeviceBuffer<u32>,
    /// `softmax_cross_entropy`'s per-row losses.
    losses: DeviceBuffer<f32>,
    /// The mean loss.
    loss: DeviceBuffer<f32>,
    /// `count_correct`'s result.
    count: DeviceBuffer<u32>,
    /// Page-locked host memory that `write_with` and `read_with` stage through (parameters in,
    /// gradients out, every step): the driver copies it at full bus speed, without bouncing
    /// through a pinned buffer of its own.
    staging: Option<LockedBuffer<f32>>,
}

impl Scratch {
    /// The first `len` values of the staging buffer, grown when it is shorter.
    fn staging(&mut self, len: usize) -> Result<&mut [f32], KernelError> {
        if len == 0 {
            return Ok(&mut []);
        }
        let buffer = match self.staging.take() {
            Some(buffer) if buffer.len() >= len => self.staging.insert(buffer),
            _ => self.staging.insert(
                LockedBuffer::new(&0.0, len).map_err(cuda("allocating pinned host memory"))?,
            ),
        };
        Ok(&mut buffer[..len])
    }
}

/// tandem's [`Backend`] on one CUDA device.
///
/// Every operation is issued on the backend's own stream, in call order; the calls that return
/// host values (`download`, the loss, `count_correct`) wait for it. Buffers are plain
/// [`DeviceBuffer`]s in the device's primary context, which every backend on that device shares,
/// so several replicas on one GPU can read each other's buffers (see
/// [`sgd_ema_update`](Self::sgd_ema_update)).
///
/// Threads: the CUDA driver tracks a *current context* per thread. [`CudaBackend::new`] makes
/// the device's context current on the thread that calls it; any other thread (a worker the
/// backend moved to) must call [`make_current`](Self::make_current) (or
/// [`Backend::bind_thread`], which does the same) before anything else, including dropping
/// buffers. A buffer written on one backend's stream and read on another's
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
    scratch: RefCell<Scratch>,
    modules: Vec<Module>,
    stream: Stream,
    // Last, so that it is released after everything allocated or loaded in it.
    context: Context,
}

impl CudaBackend {
    /// Opens device `ordinal`: retains its primary context (making it current on this thread),
    /// creates the backend's stream and loads every kernel module.
    ///
    /// Fails with [`KernelError::DriverTooOld`] when the driver predates the committed PTX, and
    /// with an error for which [`KernelError::is_no_device`] holds where there is no device.
    pub fn new(ordinal: usize) -> Result<CudaBackend, KernelError> {
        cust::init(CudaFlags::empty()).map_err(cuda("initialising the CUDA driver"))?;
        let count = Device::num_devices().map_err(cuda("counting CUDA devices"))? as usize;
        if ordinal >= count {
            return Err(KernelError::NoSuchDevice { ordinal, count });
        }
        let device = Device::get_device(ordinal as u32).map_err(cuda("opening the device"))?;
        let context = Context::new(device).map_err(cuda("retaining the primary context"))?;
        // Non-blocking: the legacy default stream, which other replicas' libraries may use,
        // never serialises with this one. Nothing here uses the default stream.
        let stream =
            Stream::new(StreamFlags::NON_BLOCKING, None).map_err(cuda("creating a stream"))?;
        let modules = MODULES
            .iter()
            .map(|module| Module::from_ptx(module.ptx, &[]).map_err(load_error))
            .collect::<Result<Vec<_>, _>>()?;
        let scratch = Scratch {
            indices: allocate(0)?, // grown on first use
            losses: allocate(0)?,
            loss: allocate(1)?,
            count: allocate(1)?,
            staging: None, // allocated on first use, at the size the model needs
        };
        Ok(CudaBackend {
            ordinal,
            scratch: RefCell::new(scratch),
            modules,
            stream,
            context,
        })
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Makes the device's context current on the calling thread. Every thread that uses the
    /// backend, or drops buffers it made, must call this first (the thread that called
    /// [`new`](Self::new) already has it).
    pub fn make_current(&self) -> Result<(), KernelError> {
        CurrentContext::set_current(&self.context).map_err(cuda("making the context current"))
    }

    /// Waits until everything issued on this backend's stream has finished: needed before
    /// another backend (another stream) reads what this one wrote.
    pub fn synchronize(&self) -> Result<(), KernelError> {
        self.stream
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

    /// `C = max(0, op(A) . op(B) + bias)`: [`Backend::matmul`] and [`Backend::bias_relu`] in
    /// one kernel (the bias is added in the matrix product's epilogue).
    pub fn matmul_bias_relu(
        &self,
        spec: Gemm,
        a: (&DeviceBuffer<f32>, usize),
        b: (&DeviceBuffer<f32>, usize),
        bias: (&DeviceBuffer<f32>, usize),
        c: (&mut DeviceBuffer<f32>, usize),
    ) -> Result<(), KernelError> {
        self.gemm("matmul_bias_relu", spec, a, b, Some(bias), c)
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
        let p = span_mut(op, "params", params, len)?;
        let e = span_mut(op, "ema", ema, len)?;
        let (table, n) = gradient_table(op, grads, len)?;
        let UpdateStep {
            learning_rate,
            weight_decay,
            ema_decay,
        } = step;
        // SAFETY: the arguments follow `sgd_ema_update`'s parameters; p, e and the first n
        // table entries cover len values each (checked above).
        unsafe {
            self.launch(
                Kernel::SgdEmaUpdate,
                stride_grid(len),
                BLOCK,
                args![p, e, table, n, len, learning_rate, weight_decay, ema_decay],
            )
        }
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
        let out = span_mut(op, "out", out, len)?;
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

    /// Launches `kernel` on the stream.
    ///
    /// # Safety
    ///
    /// `args` must point to values of the kernel's parameter types, in order, and every device
    /// pointer among them must cover what the kernel reads and writes with these arguments.
    unsafe fn launch(
        &self,
        kernel: Kernel,
        grid: impl Into<GridSize>,
        block: impl Into<BlockSize>,
        args: &[*mut c_void],
    ) -> Result<(), KernelError> {
        let function = self.modules[kernel.module_index()]
            .get_function(kernel.entry())
            .map_err(cuda(kernel.entry()))?;
        self.stream
            .launch(&function, grid, block, 0, args)
            .map_err(cuda(kernel.entry()))
    }

    /// A shared `matmul` launch, with the bias + ReLU epilogue when `bias` is given.
    fn gemm(
        &self,
        op: &'static str,
        spec: Gemm,
        a: (&DeviceBuffer<f32>, usize),
        b: (&DeviceBuffer<f32>, usize),
        bias: Option<(&DeviceBuffer<f32>, usize)>,
        c: (&mut DeviceBuffer<f32>, usize),
    ) -> Result<(), KernelError> {
        let Gemm {
            m,
            n,
            k,
            a_transposed,
            b_transposed,
        } = spec;
        let a = span(op, "a", a, m.saturating_mul(k))?;
        let b = span(op, "b", b, k.saturating_mul(n))?;
        let c = span_mut(op, "c", c, m.saturating_mul(n))?;
        let bias = match bias {
            Some(bias) => span(op, "bias", bias, n)?,
            None => DevicePointer::null(),
        };
        if m == 0 || n == 0 {
            return Ok(());
        }
        let grid_y = m.div_ceil(TILE);
        if grid_y > MAX_GRID_Y {
            return Err(KernelError::TooLarge {
                what: "matmul: rows of C",
                value: m,
                max: MAX_GRID_Y * TILE,
            });
        }
        let (m, n, k) = (
            dim("matmul: m", m)?,
            dim("matmul: n", n)?,
            dim("matmul: k", k)?,
        );
        let (a_t, b_t) = (i32::from(a_transposed), i32::from(b_transposed));
        let grid = (n.div_ceil(TILE as u32), grid_y as u32);
        // SAFETY: the arguments follow `matmul`'s parameters; a, b and c cover m*k, k*n and m*n
        // values and bias n values or is null (checked above).
        unsafe {
            self.launch(
                Kernel::Matmul,
                grid,
                (TILE as u32, MATMUL_ROWS),
                args![a, b, c, bias, m, n, k, a_t, b_t],
            )
        }
    }

    /// `bias_add`, with the ReLU or without.
    fn bias(
        &self,
        op: &'static str,
        x: &mut DeviceBuffer<f32>,
        bias: (&DeviceBuffer<f32>, usize),
        rows: usize,
        cols: usize,
        relu: bool,
    ) -> Result<(), KernelError> {
        let len = rows.saturating_mul(cols);
        let bias = span(op, "bias", bias, cols)?;
        let x = span_mut(op, "x", (x, 0), len)?;
        let cols = dim("bias: cols", cols)?;
        let relu = i32::from(relu);
        // SAFETY: the arguments follow `bias_add`'s parameters; x covers len = rows*cols values
        // and bias cols values.
        unsafe {
            self.launch(
                Kernel::BiasAdd,
                stride_grid(len),
                BLOCK,
                args![x, bias, len, cols, relu],
            )
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
        ShapeError::check(op, "dst", offset.saturating_add(src.len()), dst.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let mut span = dst.index(offset..offset + src.len());
        // SAFETY: `span` and `src` have the same length; `src` stays borrowed until the
        // synchronize below has seen the copy through, even where it is pinned memory that the
        // driver would read later.
        unsafe { span.async_copy_from(src, &self.stream) }
            .map_err(cuda("copying to the device"))?;
        self.synchronize()
    }

    /// Copies `dst.len()` values of `src` from `offset` on to the host, for operation `op`.
    fn copy_out<T: DeviceCopy>(
        &self,
        op: &'static str,
        src: &DeviceBuffer<T>,
        offset: usize,
        dst: &mut [T],
    ) -> Result<(), KernelError> {
        ShapeError::check(op, "src", offset.saturating_add(dst.len()), src.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let span = src.index(offset..offset + dst.len());
        // SAFETY: same lengths; the synchronize below keeps `dst` borrowed until the copy has
        // landed (the driver may return early when `dst` is pinned).
        unsafe { span.async_copy_to(dst, &self.stream) }.map_err(cuda("copying to the host"))?;
        self.synchronize()
    }

    /// A new device buffer holding `values`.
    fn upload_new<T: DeviceCopy>(&self, values: &[T]) -> Result<DeviceBuffer<T>, KernelError> {
        let mut buf = allocate(values.len())?;
        self.copy_in("upload_examples", values, &mut buf, 0)?;
        Ok(buf)
    }

    /// A new buffer of `len` zeros.
    fn zeroed<T: DeviceCopy + cust::memory::bytemuck::Zeroable>(
        &self,
        len: usize,
    ) -> Result<DeviceBuffer<T>, KernelError> {
        let mut buf = allocate(len)?;
        // SAFETY: the memset runs on the stream before anything issued after it, so nothing
        // reads the memory uninitialised.
        unsafe { buf.set_zero_async(&self.stream) }.map_err(cuda("zeroing device memory"))?;
        Ok(buf)
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
            *buf = allocate(len)?;
        }
        Ok(())
    }

    /// Reads back the scalar a reduction kernel left in `buf[0]`.
    fn read_scalar<T: DeviceCopy + Default>(
        &self,
        buf: &DeviceBuffer<T>,
    ) -> Result<T, KernelError> {
        let mut value = [T::default()];
        self.copy_out("read_scalar", buf, 0, &mut value)?;
        let [value] = value;
        Ok(value)
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // The fields unload modules and free memory in the *current* context: make it this
        // backend's, whichever thread drops it. Nothing can be done about a failure here; the
        // fields' own drops then fail the same way, quietly.
        let _ = CurrentContext::set_current(&self.context);
        // Kernels issued last (a step whose result was never read back) may still be running
        // and using the scratch memory and the modules' code that the fields free and unload.
        let _ = self.stream.synchronize();
    }
}

/// Turns a failure to load a PTX module into an error that names its likely cause.
fn load_error(code: CudaError) -> KernelError {
    // cust 0.3 knows CUDA 11.4's error codes and reports CUDA_ERROR_UNSUPPORTED_PTX_VERSION
    // (what an older driver says about PTX ISA 9.0) as an unknown error; the driver's version
    // tells that case apart.
    match CudaApiVersion::get() {
        Ok(version) if version.major() < 13 => KernelError::DriverTooOld {
            major: version.major(),
            minor: version.minor(),
        },
        _ => KernelError::Cuda {
            during: "loading the kernels' PTX",
            code,
        },
    }
}

/// `len` uninitialised values in the current context.
fn allocate<T: DeviceCopy>(len: usize) -> Result<DeviceBuffer<T>, KernelError> {
    // SAFETY: every caller writes the memory (copy, memset or kernel) before reading it.
    unsafe { DeviceBuffer::uninitialized(len) }.map_err(cuda("allocating device memory"))
}

/// Checks that `len` values from `offset` on fit in `buf` and returns a pointer to the first.
fn span<T: DeviceCopy>(
    op: &'static str,
    operand: &'static str,
    (buf, offset): (&DeviceBuffer<T>, usize),
    len: usize,
) -> Result<DevicePointer<T>, ShapeError> {
    ShapeError::check(op, operand, offset.saturating_add(len), buf.len())?;
    Ok(buf.as_device_ptr().wrapping_add(offset))
}

/// [`span`] of a buffer the kernel writes.
fn span_mut<T: DeviceCopy>(
    op: &'static str,
    operand: &'static str,
    (buf, offset): (&mut DeviceBuffer<T>, usize),
    len: usize,
) -> Result<DevicePointer<T>, ShapeError> {
    span(op, operand, (buf, offset), len)
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
    if grads.is_empty() || grads.len() > MAX_GRADIENT_BUFFERS {
        return Err(KernelError::GradientCount {
            op,
            given: grads.len(),
        });
    }
    let mut table = [0u64; MAX_GRADIENT_BUFFERS];
    for (slot, &grad) in table.iter_mut().zip(grads) {
        *slot = span(op, "grads", grad, len)?.as_raw();
    }
    Ok((table, grads.len() as u32))
}

impl Backend for CudaBackend {
    type Buffer = DeviceBuffer<f32>;
    type Labels = DeviceBuffer<u32>;
    type Examples = DeviceExamples;
    type Error = KernelError;

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
        self.copy_in("upload", src, dst, offset)
    }

    fn download(
        &self,
        src: &DeviceBuffer<f32>,
        offset: usize,
        dst: &mut [f32],
    ) -> Result<(), KernelError> {
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
        let host = scratch.staging(dst.len())?;
        fill(host);
        self.copy_in("write_with", host, dst, 0)
    }

    /// Stages through pinned host memory: the buffer is downloaded, then handed to `read`.
    fn read_with(
        &self,
        src: &DeviceBuffer<f32>,
        read: &mut dyn FnMut(&[f32]),
    ) -> Result<(), KernelError> {
        let mut scratch = self.scratch.borrow_mut();
        let host = scratch.staging(src.len())?;
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
        let op = "gather";
        let rows = indices.len();
        let features = examples.features;
        let x = span_mut(op, "x", (x, 0), rows.saturating_mul(features))?;
        let labels = span_mut(op, "labels", (labels, 0), rows)?;
        if let Some(&bad) = indices.iter().find(|&&i| i as usize >= examples.len) {
            return Err(ShapeError {
                op,
                operand: "examples",
                needed: bad as usize + 1,
                available: examples.len,
            }
            .into());
        }
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
        let mut scratch = self.scratch.borrow_mut();
        self.reserve(&mut scratch.indices, rows)?;
        self.copy_in(op, indices, &mut scratch.indices, 0)?;
        let values = examples.values.as_device_ptr();
        let example_labels = examples.labels.as_device_ptr();
        let indices = scratch.indices.as_device_ptr();
        // SAFETY: the arguments follow `gather`'s parameters; x covers rows*features values,
        // labels rows, the uploaded indices rows, and each index is below the data set's
        // length (checked above).
        unsafe {
            self.launch(
                Kernel::Gather,
                grid,
                BLOCK,
                args![values, example_labels, indices, features, x, labels],
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
        self.gemm("matmul", spec, a, b, None, c)
    }

    fn bias_add(
        &self,
        x: &mut DeviceBuffer<f32>,
        bias: (&DeviceBuffer<f32>, usize),
        rows: usize,
        cols: usize,
        activation: Activation,
    ) -> Result<(), KernelError> {
        self.bias(
            "bias_add",
            x,
            bias,
            rows,
            cols,
            activation == Activation::Relu,
        )
    }

    fn relu_backward(
        &self,
        grad: &mut DeviceBuffer<f32>,
        activation: &DeviceBuffer<f32>,
        len: usize,
    ) -> Result<(), KernelError> {
        let op = "relu_backward";
        let activation = span(op, "activation", (activation, 0), len)?;
        let grad = span_mut(op, "grad", (grad, 0), len)?;
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

    /// As on the CPU, except that a label outside `0..classes` makes the loss NaN rather than an
    /// error: the labels are on the device, where checking them first would cost a round trip.
    fn softmax_cross_entropy(
        &self,
        logits: &DeviceBuffer<f32>,
        labels: &DeviceBuffer<u32>,
        rows: usize,
        classes: usize,
        dlogits: &mut DeviceBuffer<f32>,
    ) -> Result<f32, KernelError> {
        let op = "softmax_cross_entropy";
        ShapeError::check(op, "classes", 1, classes)?;
        let len = rows.saturating_mul(classes);
        let logits = span(op, "logits", (logits, 0), len)?;
        let labels = span(op, "labels", (labels, 0), rows)?;
        let dlogits = span_mut(op, "dlogits", (dlogits, 0), len)?;
        if rows == 0 {
            return Ok(f32::NAN); // the mean of no losses, as on the CPU
        }
        let rows_u32 = dim("softmax_cross_entropy: rows", rows)?;
        let classes = dim("softmax_cross_entropy: classes", classes)?;
        let mut scratch = self.scratch.borrow_mut();
        self.reserve(&mut scratch.losses, rows)?;
        let losses = scratch.losses.as_device_ptr();
        let loss = scratch.loss.as_device_ptr();
        // SAFETY: the arguments follow `softmax_cross_entropy`'s and then `mean`'s parameters;
        // logits and dlogits cover rows*classes values, labels and losses rows, loss one.
        unsafe {
            self.launch(
                Kernel::SoftmaxCrossEntropy,
                rows_u32.div_ceil(SOFTMAX_ROWS),
                32 * SOFTMAX_ROWS,
                args![logits, labels, dlogits, losses, rows_u32, classes],
            )?;
            self.launch(Kernel::Mean, 1u32, BLOCK, args![losses, rows, loss])?;
        }
        self.read_scalar(&scratch.loss)
    }

    fn column_sum(
        &self,
        x: &DeviceBuffer<f32>,
        rows: usize,
        cols: usize,
        out: (&mut DeviceBuffer<f32>, usize),
    ) -> Result<(), KernelError> {
        let op = "column_sum";
        let x = span(op, "x", (x, 0), rows.saturating_mul(cols))?;
        let out = span_mut(op, "out", out, cols)?;
        if cols == 0 {
            return Ok(());
        }
        let rows = dim("column_sum: rows", rows)?;
        let cols = dim("column_sum: cols", cols)?;
        // SAFETY: the arguments follow `column_sum`'s parameters; x covers rows*cols values
        // and out cols.
        unsafe {
            self.launch(
                Kernel::ColumnSum,
                cols.div_ceil(BLOCK),
                BLOCK,
                args![x, rows, cols, out],
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
        ShapeError::check(op, "classes", 1, classes)?;
        let logits = span(op, "logits", (logits, 0), rows.saturating_mul(classes))?;
        let labels = span(op, "labels", (labels, 0), rows)?;
        let rows = dim("count_correct: rows", rows)?;
        let classes = dim("count_correct: classes", classes)?;
        let scratch = self.scratch.borrow();
        let count = scratch.count.as_device_ptr();
        // SAFETY: the arguments follow `count_correct`'s parameters; logits covers
        // rows*classes values, labels rows, count one.
        unsafe {
            self.launch(
                Kernel::CountCorrect,
                1u32,
                BLOCK,
                args![logits, labels, rows, classes, count],
            )?;
        }
        Ok(self.read_scalar(&scratch.count)? as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::{BLOCK, MATMUL_ROWS, TILE};

    /// The launch shapes above are the ones the kernels are written for (`block_sum` needs
    /// exactly REDUCE_THREADS threads, `matmul` a TILE x ROWS block).
    #[test]
    fn launch_shapes_match_the_kernel_sources() {
        let matmul = include_str!("../../../kernels/matmul.cu");
        assert!(matmul.contains(&format!("#define TILE {TILE}\n")));
        assert!(matmul.contains(&format!("#define ROWS {MATMUL_ROWS} ")));
        let reduce = include_str!("../../../kernels/reduce.cu");
        assert!(reduce.contains(&format!("#define REDUCE_THREADS {BLOCK}\n")));
    }
}
