use std::sync::{Arc, Mutex};

use tandem_core::{DType, Helpers, Residence};

use crate::check::{self, Operand};
use crate::cpu;

/// The shape of one matrix product `C (m x n) = op(A) (m x k) . op(B) (k x n)`, all row-major.
///
/// `a_transposed` means A is stored as `k x m` and used transposed (likewise for B), which is
/// what a backward pass needs: `dW = X^T . dY` and `dX = dY . W^T`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// The shared inner dimension.
    pub k: usize,
    /// A is stored `k x m`.
    pub a_transposed: bool,
    /// B is stored `n x k`.
    pub b_transposed: bool,
}

impl Gemm {
    /// `C = A . B`, neither operand transposed: A stored `m x k`, B stored `k x n` (a forward
    /// pass, `Y = X . W`).
    pub const fn nn(m: usize, n: usize, k: usize) -> Self {
        Self::new(m, n, k, false, false)
    }

    /// `C = A^T . B`, A stored `k x m` (a weight gradient, `dW = X^T . dY`).
    pub const fn tn(m: usize, n: usize, k: usize) -> Self {
        Self::new(m, n, k, true, false)
    }

    /// `C = A . B^T`, B stored `n x k` (an input gradient, `dX = dY . W^T`).
    pub const fn nt(m: usize, n: usize, k: usize) -> Self {
        Self::new(m, n, k, false, true)
    }

    /// `C = A^T . B^T`, A stored `k x m` and B stored `n x k`.
    pub const fn tt(m: usize, n: usize, k: usize) -> Self {
        Self::new(m, n, k, true, true)
    }

    /// Any of the four, the transposes given as flags (for code that goes through all of them;
    /// elsewhere [`Gemm::nn`], [`Gemm::tn`], [`Gemm::nt`] or [`Gemm::tt`] say which it is).
    pub const fn new(m: usize, n: usize, k: usize, a_transposed: bool, b_transposed: bool) -> Self {
        Self {
            m,
            n,
            k,
            a_transposed,
            b_transposed,
        }
    }
}

/// What [`Backend::bias_add`] applies after adding the bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// Nothing: `x + bias` (an output layer's logits).
    Identity,
    /// `max(0, x + bias)` (a hidden layer).
    Relu,
}

/// An operand did not have the length its operation needs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {operand} needs {needed} elements from its offset but has {available}")]
pub struct ShapeError {
    /// The operation.
    pub op: &'static str,
    /// Which operand.
    pub operand: &'static str,
    /// Elements needed.
    pub needed: usize,
    /// Elements available.
    pub available: usize,
}

impl ShapeError {
    /// `Ok` when `available == needed`: for whole inputs, where too long is as wrong as too
    /// short (another model's parameters must not be silently cut).
    pub fn check_exact(
        op: &'static str,
        operand: &'static str,
        needed: usize,
        available: usize,
    ) -> Result<(), ShapeError> {
        match available == needed {
            true => Ok(()),
            false => Err(ShapeError {
                op,
                operand,
                needed,
                available,
            }),
        }
    }

    /// `Ok` when `available >= needed`.
    pub fn check(
        op: &'static str,
        operand: &'static str,
        needed: usize,
        available: usize,
    ) -> Result<(), ShapeError> {
        if available >= needed {
            Ok(())
        } else {
            Err(ShapeError {
                op,
                operand,
                needed,
                available,
            })
        }
    }
}

/// A labelled data set of byte-valued features (such as 8-bit pixels), shared cheaply between
/// workers: cloning shares the storage.
///
/// Features are scaled by 1/255 when gathered into a batch.
#[derive(Debug, Clone)]
pub struct ExampleSet {
    features: usize,
    values: Arc<[u8]>,
    labels: Arc<[u8]>,
}

/// What every backend's resident data set ([`Backend::Examples`]) tells of itself.
pub trait ResidentExamples: Send {
    /// Features per example.
    fn features(&self) -> usize;
    /// Number of examples.
    fn len(&self) -> usize;
    /// Whether there are no examples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ResidentExamples for ExampleSet {
    fn features(&self) -> usize {
        ExampleSet::features(self)
    }

    fn len(&self) -> usize {
        ExampleSet::len(self)
    }
}

impl ExampleSet {
    /// `values` holds `labels.len()` examples of `features` bytes each; `None` otherwise.
    pub fn new(features: usize, values: Vec<u8>, labels: Vec<u8>) -> Option<Self> {
        (features > 0 && values.len() == features * labels.len()).then(|| Self {
            features,
            values: values.into(),
            labels: labels.into(),
        })
    }

    /// Features per example.
    pub fn features(&self) -> usize {
        self.features
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The features of example `i`.
    pub fn features_of(&self, i: usize) -> &[u8] {
        &self.values[i * self.features..(i + 1) * self.features]
    }

    /// The label of example `i`.
    pub fn label(&self, i: usize) -> u8 {
        self.labels[i]
    }

    /// All features, example after example.
    pub fn values(&self) -> &[u8] {
        &self.values
    }

    /// All labels.
    pub fn labels(&self) -> &[u8] {
        &self.labels
    }
}

/// A layer's op(A), op(B) and bias, each in a buffer of backend `B` from an offset.
pub type LayerOperands<'a, B> = (
    (&'a <B as Backend>::Buffer, usize),
    (&'a <B as Backend>::Buffer, usize),
    (&'a <B as Backend>::Buffer, usize),
);

/// The operations a multi-layer perceptron's training step is written against.
///
/// A backend owns its memory: `Buffer` holds values of the backend's [`dtype`](Self::dtype)
/// (which cross to and from the host as `f32` whatever it is) and `Labels` holds `u32` class
/// labels, wherever the backend computes (host memory for [`CpuBackend`], device memory for
/// CUDA). Operands are passed as `(buffer, offset)` so that one flat buffer can hold every
/// parameter of a model. Every operation checks that its operands are long enough and returns
/// an error rather than panicking: the checks of [`check`](crate::check), the same for every
/// backend, so that all of them refuse the same inputs with the same [`ShapeError`].
pub trait Backend: Send {
    /// Storage of values of the backend's [`dtype`](Self::dtype).
    type Buffer: Send;
    /// `u32` label storage.
    type Labels: Send;
    /// A data set resident where the backend computes.
    type Examples: ResidentExamples;
    /// What can go wrong.
    type Error: std::error::Error + From<ShapeError> + Send + Sync + 'static;

    /// The type its buffers hold values in: what it computes with. Uploads and downloads
    /// take and give `f32`; a backend of a narrower type converts at that edge.
    fn dtype(&self) -> DType;
    /// Multiplies, from now on, the gradient that the softmax cross-entropy writes by `scale`
    /// before it is stored in the backend's type (loss scaling: `f16` gradients would
    /// underflow otherwise). `false` (the default) where the backend does not scale: it then
    /// computes as if the scale were 1, and a caller must not scale with it.
    fn set_loss_scale(&self, scale: f32) -> Result<bool, Self::Error> {
        let _ = scale;
        Ok(false)
    }
    /// Divides the `len` values at `x` by the loss scale (exact: a power of two) and notes
    /// whether they were all finite, for [`unscaled_finite`](Self::unscaled_finite): the last
    /// operation of a loss-scaled pass on its gradients, which hands them on in `f32` without
    /// the scale. A backend that does not scale leaves them (the default).
    fn unscale(&self, x: (&mut Self::Buffer, usize), len: usize) -> Result<(), Self::Error> {
        let _ = (x, len);
        Ok(())
    }
    /// Whether every value of the last [`unscale`](Self::unscale) was finite, waiting for the
    /// backend's work; `true` where the backend does not scale (the default).
    fn unscaled_finite(&self) -> Result<bool, Self::Error> {
        Ok(true)
    }
    /// Makes the next [`replay`](Self::replay) run again what a store put after the last one
    /// (and nothing of what it put before it): a pass computed again, after an overflow, hands
    /// on its gradients as the first would have. Nothing where the backend runs no store
    /// operations (the default).
    fn repeat_after_step(&self) {}
    /// Makes this backend usable from the calling thread (a GPU backend makes its context
    /// current). Called once by each worker thread before anything else.
    fn bind_thread(&self) -> Result<(), Self::Error> {
        Ok(())
    }
    /// A buffer of `len` zeros.
    fn zeros(&self, len: usize) -> Result<Self::Buffer, Self::Error>;
    /// A label buffer of `len` zeros.
    fn zero_labels(&self, len: usize) -> Result<Self::Labels, Self::Error>;
    /// Copies host values into `dst` from `offset` on.
    fn upload(&self, src: &[f32], dst: &mut Self::Buffer, offset: usize)
        -> Result<(), Self::Error>;
    /// Copies `dst.len()` values of `src` from `offset` on to the host.
    fn download(
        &self,
        src: &Self::Buffer,
        offset: usize,
        dst: &mut [f32],
    ) -> Result<(), Self::Error>;
    /// Lets host code fill the whole buffer in place: the CPU hands over its own memory, a
    /// device backend stages through host memory. This is how replicas receive parameters.
    fn write_with(
        &self,
        dst: &mut Self::Buffer,
        fill: &mut dyn FnMut(&mut [f32]),
    ) -> Result<(), Self::Error>;
    /// Lets host code read the whole buffer (the CPU without a copy). This is how replicas hand
    /// out gradients.
    fn read_with(
        &self,
        src: &Self::Buffer,
        read: &mut dyn FnMut(&[f32]),
    ) -> Result<(), Self::Error>;
    /// Exchanges `buffer`'s values with `host`'s, without copying, where the buffer is host
    /// memory of the same length; `false` (the default: device memory) where it cannot, with
    /// both unchanged.
    fn exchange(&self, buffer: &mut Self::Buffer, host: &mut Vec<f32>) -> bool {
        let _ = (buffer, host);
        false
    }
    /// `values` as this backend's buffer, without a copy, where its buffers are host `Vec`s
    /// (the CPU); `None` (the default: device memory) where they are not.
    #[allow(clippy::ptr_arg)]
    fn host_view<'a>(&self, values: &'a Vec<f32>) -> Option<&'a Self::Buffer> {
        let _ = values;
        None
    }
    /// Makes a data set resident (once per replica; the CPU shares it).
    fn upload_examples(&self, examples: &ExampleSet) -> Result<Self::Examples, Self::Error>;
    /// Gathers the examples at `indices` into the first rows of `x` (scaled to `[0, 1]`) and
    /// their labels into `labels`.
    fn gather(
        &self,
        examples: &Self::Examples,
        indices: &[u32],
        x: &mut Self::Buffer,
        labels: &mut Self::Labels,
    ) -> Result<(), Self::Error>;
    /// [`gather`](Self::gather) of the examples at `indices` into `x` and `labels`, then
    /// [`matmul_bias`](Self::matmul_bias) with the batch as op(A) (`spec`: `m` the batch's rows,
    /// `k` its features, A not transposed): a network's first layer over a gathered batch, in
    /// one pass where the backend can fuse them (a device backend reads the examples straight
    /// into the product's tiles: one kernel instead of two).
    #[allow(clippy::too_many_arguments)]
    fn gather_matmul_bias(
        &self,
        (examples, indices): (&Self::Examples, &[u32]),
        (x, labels): (&mut Self::Buffer, &mut Self::Labels),
        spec: Gemm,
        b: (&Self::Buffer, usize),
        bias: (&Self::Buffer, usize),
        c: (&mut Self::Buffer, usize),
        activation: Activation,
    ) -> Result<(), Self::Error> {
        check::gather_matmul(indices.len(), examples.features(), spec)?;
        self.gather(examples, indices, x, labels)?;
        self.matmul_bias(spec, (x, 0), b, bias, c, activation)
    }
    /// `C = op(A) . op(B)` (see [`Gemm`]), C overwritten.
    fn matmul(
        &self,
        spec: Gemm,
        a: (&Self::Buffer, usize),
        b: (&Self::Buffer, usize),
        c: (&mut Self::Buffer, usize),
    ) -> Result<(), Self::Error>;
    /// [`matmul`](Self::matmul), cut into tasks that `helpers` may share out where the backend
    /// can split it (the CPU: blocks of rows of C, fixed by the shape, so that the result never
    /// depends on who computes them), unless none may help
    /// ([`Helpers::may_help`]); the default computes it alone. Blocks and the whole product
    /// may round differently (`gemm`'s choice; at the MNIST model's shapes they do not).
    fn matmul_shared(
        &self,
        spec: Gemm,
        a: (&Self::Buffer, usize),
        b: (&Self::Buffer, usize),
        c: (&mut Self::Buffer, usize),
        helpers: &dyn Helpers,
    ) -> Result<(), Self::Error> {
        let _ = helpers;
        self.matmul(spec, a, b, c)
    }
    /// A dense layer's parameter gradients from its input `x` (`rows x ins`) and the gradient
    /// `delta` before its activation (`rows x outs`), both from their buffers' starts: the
    /// weights' `x^T . delta` (`ins x outs`) at `grads`' offset and the biases' column sums of
    /// `delta` right after them, where a layer's biases follow its weights. `helpers` may take
    /// part in the product, as in [`matmul_shared`](Self::matmul_shared). The default is that
    /// product then [`column_sum`](Self::column_sum); a device backend computes both in one
    /// product (the sums as the product with a row of ones).
    fn weight_and_bias_gradients(
        &self,
        (ins, outs, rows): (usize, usize, usize),
        x: &Self::Buffer,
        delta: &Self::Buffer,
        (grads, offset): (&mut Self::Buffer, usize),
        helpers: &dyn Helpers,
    ) -> Result<(), Self::Error> {
        let spec = Gemm::tn(ins, outs, rows);
        self.matmul_shared(spec, (x, 0), (delta, 0), (&mut *grads, offset), helpers)?;
        let biases = offset.saturating_add(ins.saturating_mul(outs));
        self.column_sum(delta, rows, outs, (grads, biases))
    }
    /// A dense layer's backward products from its input `x` (`rows x ins`), the gradient
    /// `delta` before its activation (`rows x outs`) and its weights (`ins x outs` at
    /// `weights`' offset): the parameter gradients of
    /// [`weight_and_bias_gradients`](Self::weight_and_bias_gradients) at `grads`' offset, and
    /// the input's gradient `delta . W^T` into `input_delta`, zeroed where `mask` (the ReLU
    /// output the input was, when it was one) is not positive, as
    /// [`matmul_relu_backward`](Self::matmul_relu_backward) (without a mask, as
    /// [`matmul`](Self::matmul)). Both read `delta` and neither reads what the other writes,
    /// so a device backend may run them as one launch. The default is the two, in that order.
    #[allow(clippy::too_many_arguments)]
    fn layer_gradients(
        &self,
        (ins, outs, rows): (usize, usize, usize),
        (x, delta): (&Self::Buffer, &Self::Buffer),
        weights: (&Self::Buffer, usize),
        (grads, offset): (&mut Self::Buffer, usize),
        (input_delta, mask): (&mut Self::Buffer, Option<&Self::Buffer>),
        helpers: &dyn Helpers,
    ) -> Result<(), Self::Error> {
        let shape = (ins, outs, rows);
        self.weight_and_bias_gradients(shape, x, delta, (grads, offset), helpers)?;
        let product = Gemm::nt(rows, ins, outs);
        match mask {
            Some(mask) => {
                self.matmul_relu_backward(product, (delta, 0), weights, mask, input_delta)
            }
            None => self.matmul(product, (delta, 0), weights, (input_delta, 0)),
        }
    }
    /// `C = op(A) . op(B)` written from the start of `c`, then zeroed where `mask` (the
    /// output of a ReLU, of C's shape) is not positive: the backward pass through a ReLU fused
    /// into the product that computes the gradient it masks, in one pass where the backend can
    /// (a device backend masks in the product's epilogue: one kernel instead of two). The
    /// default is [`matmul`](Self::matmul) then [`relu_backward`](Self::relu_backward).
    fn matmul_relu_backward(
        &self,
        spec: Gemm,
        a: (&Self::Buffer, usize),
        b: (&Self::Buffer, usize),
        mask: &Self::Buffer,
        c: &mut Self::Buffer,
    ) -> Result<(), Self::Error> {
        self.matmul(spec, a, b, (&mut *c, 0))?;
        self.relu_backward(c, mask, spec.m * spec.n)
    }
    /// `C = activation(op(A) . op(B) + bias)`: [`matmul`](Self::matmul), then
    /// [`bias_add`](Self::bias_add) with `activation` over C, in one pass where the backend
    /// can fuse them (a device backend adds the bias in the product's epilogue: one kernel
    /// instead of two).
    fn matmul_bias(
        &self,
        spec: Gemm,
        a: (&Self::Buffer, usize),
        b: (&Self::Buffer, usize),
        bias: (&Self::Buffer, usize),
        c: (&mut Self::Buffer, usize),
        activation: Activation,
    ) -> Result<(), Self::Error>;
    /// Copies `len` values of `src` into `dst` (each a buffer from an offset).
    fn copy(
        &self,
        src: (&Self::Buffer, usize),
        dst: (&mut Self::Buffer, usize),
        len: usize,
    ) -> Result<(), Self::Error>;
    /// Runs `ops`, a fixed sequence of operations on fixed buffers (a training step), as the
    /// backend sees fit: at once (the default), or, on a device, captured on a later call
    /// with the same `key` and from then on launched as one unit (a CUDA graph). Between calls
    /// with one key only [`gather`](Self::gather)'s indices and the offset of
    /// [`softmax_cross_entropy_into`](Self::softmax_cross_entropy_into)'s loss may differ:
    /// `ops` still runs each time, for them and for its checks.
    fn replay(
        &self,
        key: u64,
        ops: &mut dyn FnMut(&Self) -> Result<(), Self::Error>,
    ) -> Result<(), Self::Error> {
        let _ = key;
        ops(self)
    }
    /// `x[r][c] = activation(x[r][c] + bias[c])` over the first `rows x cols` values of `x`.
    fn bias_add(
        &self,
        x: &mut Self::Buffer,
        bias: (&Self::Buffer, usize),
        rows: usize,
        cols: usize,
        activation: Activation,
    ) -> Result<(), Self::Error>;
    /// `grad[i] = 0` where `activation[i] <= 0`, over the first `len` values.
    fn relu_backward(
        &self,
        grad: &mut Self::Buffer,
        activation: &Self::Buffer,
        len: usize,
    ) -> Result<(), Self::Error>;
    /// Fused, numerically stable softmax + cross-entropy over `rows x classes` logits: returns
    /// the mean loss and writes its gradient with respect to the logits into `dlogits`. A label
    /// outside `0..classes` is an error ([`check::labels`](crate::check::labels)).
    fn softmax_cross_entropy(
        &self,
        logits: &Self::Buffer,
        labels: &Self::Labels,
        rows: usize,
        classes: usize,
        dlogits: &mut Self::Buffer,
    ) -> Result<f32, Self::Error>;
    /// [`softmax_cross_entropy`](Self::softmax_cross_entropy), leaving the mean loss in
    /// `loss` (one value, at its offset) where the backend computes, to be read later: a device
    /// backend does not wait for the device. A label outside `0..classes` is an error where the
    /// backend can tell at once (the default) and makes the loss NaN where it cannot (a device).
    fn softmax_cross_entropy_into(
        &self,
        logits: &Self::Buffer,
        labels: &Self::Labels,
        (rows, classes): (usize, usize),
        dlogits: &mut Self::Buffer,
        loss: (&mut Self::Buffer, usize),
    ) -> Result<(), Self::Error> {
        let mean = self.softmax_cross_entropy(logits, labels, rows, classes, dlogits)?;
        self.upload(&[mean], loss.0, loss.1)
    }
    /// A last layer and the classification head at once, the loss left on the device:
    /// `logits = op(A) . op(B) + bias` ([`matmul_bias`](Self::matmul_bias) with no
    /// activation, `spec.n` classes), then
    /// [`softmax_cross_entropy_into`](Self::softmax_cross_entropy_into) of those logits
    /// against `labels`. The default is the two; a device backend may run them as one kernel.
    fn matmul_bias_softmax_cross_entropy_into(
        &self,
        spec: Gemm,
        (a, b, bias): LayerOperands<'_, Self>,
        (logits, labels): (&mut Self::Buffer, &Self::Labels),
        dlogits: &mut Self::Buffer,
        loss: (&mut Self::Buffer, usize),
    ) -> Result<(), Self::Error> {
        self.matmul_bias(spec, a, b, bias, (&mut *logits, 0), Activation::Identity)?;
        self.softmax_cross_entropy_into(logits, labels, (spec.m, spec.n), dlogits, loss)
    }
    /// Where `params` and `grads` live, when the backend computes in device memory that a
    /// store may keep the parameters of record beside ([`tandem_core::Residence`]); `None`
    /// (the default) for host memory.
    fn residence(&self, params: &Self::Buffer, grads: &Self::Buffer) -> Option<Residence> {
        let _ = (params, grads);
        None
    }
    /// `out[c] = sum over r of x[r][c]` for the first `rows x cols` values of `x`.
    fn column_sum(
        &self,
        x: &Self::Buffer,
        rows: usize,
        cols: usize,
        out: (&mut Self::Buffer, usize),
    ) -> Result<(), Self::Error>;
    /// How many of the first `rows` rows of `logits` have their argmax at their label. A label
    /// outside `0..classes` is an error ([`check::labels`](crate::check::labels)).
    fn count_correct(
        &self,
        logits: &Self::Buffer,
        labels: &Self::Labels,
        rows: usize,
        classes: usize,
    ) -> Result<usize, Self::Error>;
}

/// The host backend: single-threaded operations on `Vec`s (one core per worker).
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuBackend;

/// A product's `a`, `b` and `c`, each cut to the values it reads or writes.
type ProductSlices<'a> = (&'a [f32], &'a [f32], &'a mut [f32]);

/// A product's operands checked ([`check::matmul`]) and cut to the values it reads and writes.
fn matmul_operands<'a>(
    spec: Gemm,
    (a, a_at): (&'a Vec<f32>, usize),
    (b, b_at): (&'a Vec<f32>, usize),
    (c, c_at): (&'a mut Vec<f32>, usize),
) -> Result<ProductSlices<'a>, ShapeError> {
    check::matmul(
        spec,
        Operand::at(a.len(), a_at),
        Operand::at(b.len(), b_at),
        Operand::at(c.len(), c_at),
    )?;
    Ok((
        &a[a_at..a_at + spec.m * spec.k],
        &b[b_at..b_at + spec.k * spec.n],
        &mut c[c_at..c_at + spec.m * spec.n],
    ))
}

/// Rows of C per task of [`CpuBackend`]'s [`Backend::matmul_shared`]: the MNIST model's largest
/// product (784 rows) in 4 tasks, fine enough for a helper to take up to half of it, coarse
/// enough that the extra calls cost about 2% of the product. Its blocks happen to be bitwise
/// the whole product for that shape, but that is `gemm`'s choice, not a promise.
const SHARED_ROWS: usize = 200;

impl Backend for CpuBackend {
    type Buffer = Vec<f32>;
    type Labels = Vec<u32>;
    type Examples = ExampleSet;
    type Error = ShapeError;

    fn dtype(&self) -> DType {
        DType::F32
    }

    fn zeros(&self, len: usize) -> Result<Vec<f32>, ShapeError> {
        Ok(vec![0.0; len])
    }

    fn zero_labels(&self, len: usize) -> Result<Vec<u32>, ShapeError> {
        Ok(vec![0; len])
    }

    fn upload(&self, src: &[f32], dst: &mut Vec<f32>, offset: usize) -> Result<(), ShapeError> {
        check::upload(src.len(), Operand::at(dst.len(), offset))?;
        dst[offset..offset + src.len()].copy_from_slice(src);
        Ok(())
    }

    fn download(&self, src: &Vec<f32>, offset: usize, dst: &mut [f32]) -> Result<(), ShapeError> {
        check::download(Operand::at(src.len(), offset), dst.len())?;
        dst.copy_from_slice(&src[offset..offset + dst.len()]);
        Ok(())
    }

    fn write_with(
        &self,
        dst: &mut Vec<f32>,
        fill: &mut dyn FnMut(&mut [f32]),
    ) -> Result<(), ShapeError> {
        fill(dst);
        Ok(())
    }

    fn read_with(&self, src: &Vec<f32>, read: &mut dyn FnMut(&[f32])) -> Result<(), ShapeError> {
        read(src);
        Ok(())
    }

    fn exchange(&self, buffer: &mut Vec<f32>, host: &mut Vec<f32>) -> bool {
        let same = buffer.len() == host.len();
        if same {
            std::mem::swap(buffer, host);
        }
        same
    }

    fn host_view<'a>(&self, values: &'a Vec<f32>) -> Option<&'a Vec<f32>> {
        Some(values)
    }

    fn upload_examples(&self, examples: &ExampleSet) -> Result<ExampleSet, ShapeError> {
        Ok(examples.clone())
    }

    fn gather(
        &self,
        examples: &ExampleSet,
        indices: &[u32],
        x: &mut Vec<f32>,
        labels: &mut Vec<u32>,
    ) -> Result<(), ShapeError> {
        check::gather(
            examples.len(),
            examples.features(),
            indices,
            x.len(),
            labels.len(),
        )?;
        cpu::gather(examples, indices, x, labels);
        Ok(())
    }

    fn matmul(
        &self,
        spec: Gemm,
        a: (&Vec<f32>, usize),
        b: (&Vec<f32>, usize),
        c: (&mut Vec<f32>, usize),
    ) -> Result<(), ShapeError> {
        let (a, b, c) = matmul_operands(spec, a, b, c)?;
        cpu::matmul(spec, a, b, c);
        Ok(())
    }

    fn matmul_shared(
        &self,
        spec: Gemm,
        a: (&Vec<f32>, usize),
        b: (&Vec<f32>, usize),
        c: (&mut Vec<f32>, usize),
        helpers: &dyn Helpers,
    ) -> Result<(), ShapeError> {
        // Alone, the product in one piece: four blocks of dW1 took 1.04x as long.
        if !helpers.may_help() {
            return self.matmul(spec, a, b, c);
        }
        let (a, b, c) = matmul_operands(spec, a, b, c)?;
        let blocks: Vec<Mutex<&mut [f32]>> = c
            .chunks_mut(SHARED_ROWS * spec.n.max(1))
            .map(Mutex::new)
            .collect();
        helpers.share(blocks.len(), &|block| {
            // Each block is one task's alone: its lock is never contended.
            let mut c = blocks[block].lock().unwrap_or_else(|p| p.into_inner());
            let first = block * SHARED_ROWS;
            cpu::matmul_rows(spec, a, b, first..(first + SHARED_ROWS).min(spec.m), &mut c);
        });
        Ok(())
    }

    fn matmul_bias(
        &self,
        spec: Gemm,
        a: (&Vec<f32>, usize),
        b: (&Vec<f32>, usize),
        (bias, bias_at): (&Vec<f32>, usize),
        (c, c_at): (&mut Vec<f32>, usize),
        activation: Activation,
    ) -> Result<(), ShapeError> {
        let operand = |(buf, at): (&Vec<f32>, usize)| Operand::at(buf.len(), at);
        let c_operand = Operand::at(c.len(), c_at);
        let bias_operand = Operand::at(bias.len(), bias_at);
        check::matmul_bias(spec, operand(a), operand(b), bias_operand, c_operand)?;
        self.matmul(spec, a, b, (c, c_at))?;
        let c = &mut c[c_at..c_at + spec.m * spec.n];
        let bias = &bias[bias_at..bias_at + spec.n];
        match activation {
            Activation::Relu => cpu::bias_relu(c, bias),
            Activation::Identity => cpu::bias_add(c, bias),
        }
        Ok(())
    }

    fn copy(
        &self,
        (src, src_at): (&Vec<f32>, usize),
        (dst, dst_at): (&mut Vec<f32>, usize),
        len: usize,
    ) -> Result<(), ShapeError> {
        check::copy(
            Operand::at(src.len(), src_at),
            Operand::at(dst.len(), dst_at),
            len,
        )?;
        dst[dst_at..dst_at + len].copy_from_slice(&src[src_at..src_at + len]);
        Ok(())
    }

    fn bias_add(
        &self,
        x: &mut Vec<f32>,
        (bias, bias_at): (&Vec<f32>, usize),
        rows: usize,
        cols: usize,
        activation: Activation,
    ) -> Result<(), ShapeError> {
        check::bias_add(x.len(), Operand::at(bias.len(), bias_at), rows, cols)?;
        let bias = &bias[bias_at..bias_at + cols];
        let x = &mut x[..rows * cols];
        match activation {
            Activation::Identity => cpu::bias_add(x, bias),
            Activation::Relu => cpu::bias_relu(x, bias),
        }
        Ok(())
    }

    fn relu_backward(
        &self,
        grad: &mut Vec<f32>,
        activation: &Vec<f32>,
        len: usize,
    ) -> Result<(), ShapeError> {
        check::relu_backward(grad.len(), activation.len(), len)?;
        cpu::relu_backward(&mut grad[..len], &activation[..len]);
        Ok(())
    }

    fn softmax_cross_entropy(
        &self,
        logits: &Vec<f32>,
        labels: &Vec<u32>,
        rows: usize,
        classes: usize,
        dlogits: &mut Vec<f32>,
    ) -> Result<f32, ShapeError> {
        let op = "softmax_cross_entropy";
        check::softmax_cross_entropy(logits.len(), labels.len(), rows, classes, dlogits.len())?;
        let labels = &labels[..rows];
        check::labels(op, labels, classes)?;
        let len = rows * classes;
        Ok(cpu::softmax_cross_entropy(
            &logits[..len],
            labels,
            classes,
            &mut dlogits[..len],
        ))
    }

    fn column_sum(
        &self,
        x: &Vec<f32>,
        rows: usize,
        cols: usize,
        (out, out_at): (&mut Vec<f32>, usize),
    ) -> Result<(), ShapeError> {
        check::column_sum(x.len(), rows, cols, Operand::at(out.len(), out_at))?;
        cpu::column_sum(&x[..rows * cols], &mut out[out_at..out_at + cols]);
        Ok(())
    }

    fn count_correct(
        &self,
        logits: &Vec<f32>,
        labels: &Vec<u32>,
        rows: usize,
        classes: usize,
    ) -> Result<usize, ShapeError> {
        check::count_correct(logits.len(), labels.len(), rows, classes)?;
        let labels = &labels[..rows];
        check::labels("count_correct", labels, classes)?;
        Ok(cpu::count_correct(
            &logits[..rows * classes],
            labels,
            classes,
        ))
    }
}
