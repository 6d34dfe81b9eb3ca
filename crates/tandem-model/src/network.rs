//! The model seam: what a classifier states (its parameters, its activations, its forward and
//! backward pass over [`Backend`] operations), and what every such model gets from it
//! (initialisation, evaluation, predictions, probabilities, and, through
//! [`NetworkReplica`](crate::NetworkReplica), training on any device).

use rand::Rng;
use tandem_core::{Helpers, ParamSpan};
use tandem_tensor::{cpu, Backend, CpuBackend, ExampleSet, ShapeError, Tensor};

use crate::layers::Batch;

/// Rows evaluated per forward pass in [`Network::evaluate`] and [`Network::predictions`].
const EVAL_CHUNK: usize = 1000;

/// A classifier of byte-valued examples trained with softmax cross-entropy: its parameters in
/// one flat vector (in [`layout`](Self::layout) order), its forward pass from a batch of
/// inputs to logits through activation buffers it names, and the backward pass from the
/// logits' gradient to the parameters'. Compose it from [`crate::layers`]; the replica, the
/// evaluation and the device plumbing come with the trait.
pub trait Network: Clone + Send + Sync + 'static {
    /// Input features per example.
    fn inputs(&self) -> usize;

    /// Output classes (logits per example).
    fn classes(&self) -> usize;

    /// The parameter spans in flat order; L2-regularised ones are marked.
    fn layout(&self) -> Vec<ParamSpan>;

    /// Values per example of each buffer the forward pass writes, in order; the last is the
    /// logits (`classes`). A replica holds one buffer of each, and one for its gradient.
    fn activations(&self) -> Vec<usize>;

    /// The forward pass over the first `rows` rows of `x` (features in `[0, 1]`), writing
    /// `activations` (one buffer per [`Network::activations`] entry, each with room for the
    /// rows), the logits last.
    fn forward<B: Backend>(
        &self,
        b: &B,
        params: &B::Buffer,
        x: &B::Buffer,
        rows: usize,
        activations: &mut [B::Buffer],
    ) -> Result<(), B::Error>;

    /// [`forward`](Self::forward) over a batch gathered on the way: [`Backend::gather`], then
    /// the forward pass of its rows. A network may fuse the gather into its first operation
    /// (as [`crate::layers::DenseStack::forward_batch`] does into its first product).
    fn forward_batch<B: Backend>(
        &self,
        b: &B,
        params: &B::Buffer,
        batch: Batch<'_, B>,
        activations: &mut [B::Buffer],
    ) -> Result<(), B::Error> {
        b.gather(batch.examples, batch.indices, batch.x, batch.labels)?;
        self.forward(b, params, batch.x, batch.indices.len(), activations)
    }

    /// A training step's forward pass and its loss, left where the backend computes:
    /// [`forward_batch`](Self::forward_batch), then the softmax cross-entropy of the logits
    /// against the batch's labels ([`Backend::softmax_cross_entropy_into`]), its gradient with
    /// respect to the logits into the last of `deltas`, the mean loss at `loss`. A network may
    /// fuse its last operation with the loss (as
    /// [`crate::layers::DenseStack::forward_loss_into`] does its last product).
    fn forward_loss_into<B: Backend>(
        &self,
        b: &B,
        params: &B::Buffer,
        batch: Batch<'_, B>,
        (activations, deltas): (&mut [B::Buffer], &mut [B::Buffer]),
        loss: (&mut B::Buffer, usize),
    ) -> Result<(), B::Error> {
        let rows = batch.indices.len();
        let mut batch = batch;
        self.forward_batch(b, params, batch.reborrow(), activations)?;
        let (logits, dlogits) = (logits_of(activations)?, logits_of_mut(deltas)?);
        let shape = (rows, self.classes());
        b.softmax_cross_entropy_into(logits, batch.labels, shape, dlogits, loss)
    }

    /// The backward pass of [`forward`](Self::forward): the last of `deltas` holds the loss's
    /// gradient with respect to the logits; the others are scratch for the gradients with
    /// respect to the other activations. Writes every parameter's gradient into `grads`.
    /// `helpers` (idle workers) may take part where the backend can share a product out.
    #[allow(clippy::too_many_arguments)]
    fn backward<B: Backend>(
        &self,
        b: &B,
        params: &B::Buffer,
        x: &B::Buffer,
        rows: usize,
        activations: &[B::Buffer],
        deltas: &mut [B::Buffer],
        grads: &mut B::Buffer,
        helpers: &dyn Helpers,
    ) -> Result<(), B::Error>;

    /// The total number of parameters.
    fn num_params(&self) -> usize {
        self.layout().iter().map(ParamSpan::len).sum()
    }

    /// Initial parameters: the L2-regularised spans (weights) truncated normal with standard
    /// deviation `stddev`, the others (biases) zero. The reference uses 0.1.
    fn init(&self, stddev: f32, rng: &mut impl Rng) -> Vec<f32> {
        let mut params = Vec::with_capacity(self.num_params());
        for span in self.layout() {
            if span.weight_decay {
                params.extend(Tensor::truncated_normal(&span.shape, stddev, rng).into_vec());
            } else {
                params.extend(std::iter::repeat_n(0.0, span.len()));
            }
        }
        params
    }

    /// The fraction of `examples` whose most probable class under `params` is their label.
    fn evaluate<B: Backend>(
        &self,
        backend: &B,
        params: &[f32],
        examples: &ExampleSet,
    ) -> Result<f64, B::Error> {
        let mut correct = 0;
        for_each_batch(self, backend, params, examples, |rows, logits, labels| {
            correct += backend.count_correct(logits, labels, rows, self.classes())?;
            Ok(())
        })?;
        Ok(correct as f64 / examples.len().max(1) as f64)
    }

    /// The most probable class of every example of `examples` under `params`, in order (the
    /// same decision [`evaluate`](Self::evaluate) scores, so `predictions[i] == label(i)`
    /// exactly for the examples it counts as correct). Used for confusion matrices.
    fn predictions<B: Backend>(
        &self,
        backend: &B,
        params: &[f32],
        examples: &ExampleSet,
    ) -> Result<Vec<usize>, B::Error> {
        let classes = self.classes();
        let mut host = vec![0.0; EVAL_CHUNK * classes];
        let mut predictions = Vec::with_capacity(examples.len());
        for_each_batch(self, backend, params, examples, |rows, logits, _| {
            let host = &mut host[..rows * classes];
            backend.download(logits, 0, host)?;
            // `cpu::argmax` is the tie rule `count_correct` uses, so predictions and accuracy
            // never disagree.
            predictions.extend(host.chunks_exact(classes).map(cpu::argmax));
            Ok(())
        })?;
        Ok(predictions)
    }

    /// The logits (`rows x classes`, row-major) of `rows = x.len() / inputs` inputs under
    /// `params`; `x` holds the inputs' features one row after another, each scaled to
    /// `[0, 1]` as in training. An `x` that is not whole rows is a [`ShapeError`].
    fn logits<B: Backend>(
        &self,
        backend: &B,
        params: &[f32],
        x: &[f32],
    ) -> Result<Vec<f32>, B::Error> {
        ShapeError::check_exact("logits", "params", self.num_params(), params.len())?;
        let inputs = self.inputs();
        let rows = x.len() / inputs.max(1);
        if rows * inputs != x.len() {
            return Err(ShapeError {
                op: "logits",
                operand: "x",
                needed: (rows + 1) * inputs,
                available: x.len(),
            }
            .into());
        }
        let mut device_params = backend.zeros(params.len())?;
        backend.upload(params, &mut device_params, 0)?;
        let mut device_x = backend.zeros(x.len())?;
        backend.upload(x, &mut device_x, 0)?;
        let mut activations = activation_buffers(self, backend, rows)?;
        self.forward(backend, &device_params, &device_x, rows, &mut activations)?;
        let mut host = vec![0.0; rows * self.classes()];
        backend.download(logits_of(&activations)?, 0, &mut host)?;
        Ok(host)
    }

    /// The class probabilities (softmax of the logits) of one input of exactly `inputs`
    /// features in `[0, 1]`, computed on the CPU with the same forward pass as training. An `x`
    /// or `params` of the wrong length is a [`ShapeError`].
    fn probabilities(&self, params: &[f32], x: &[f32]) -> Result<Vec<f32>, ShapeError> {
        ShapeError::check_exact("probabilities", "x", self.inputs(), x.len())?;
        let logits = self.logits(&CpuBackend, params, x)?;
        // Numerically stable: the largest logit is subtracted before exponentiating.
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exp: Vec<f64> = logits.iter().map(|&l| f64::from(l - max).exp()).collect();
        let sum: f64 = exp.iter().sum();
        Ok(exp.iter().map(|e| (e / sum) as f32).collect())
    }
}

/// One zeroed buffer of `rows` rows for each of `network`'s activations.
pub(crate) fn activation_buffers<N: Network, B: Backend>(
    network: &N,
    backend: &B,
    rows: usize,
) -> Result<Vec<B::Buffer>, B::Error> {
    (network.activations().into_iter())
        .map(|width| backend.zeros(rows * width))
        .collect()
}

/// A network that names no activations has no logits: a shape error, not a panic.
fn no_activations() -> ShapeError {
    ShapeError {
        op: "forward",
        operand: "activations",
        needed: 1,
        available: 0,
    }
}

/// The logits: the last activation.
pub(crate) fn logits_of<T>(activations: &[T]) -> Result<&T, ShapeError> {
    activations.last().ok_or_else(no_activations)
}

/// The logits' gradient: the last of the deltas.
pub(crate) fn logits_of_mut<T>(deltas: &mut [T]) -> Result<&mut T, ShapeError> {
    deltas.last_mut().ok_or_else(no_activations)
}

/// Runs the forward pass over `examples` in chunks of [`EVAL_CHUNK`], handing each chunk's row
/// count, logits and labels to `visit`.
fn for_each_batch<N: Network, B: Backend>(
    network: &N,
    backend: &B,
    params: &[f32],
    examples: &ExampleSet,
    mut visit: impl FnMut(usize, &B::Buffer, &B::Labels) -> Result<(), B::Error>,
) -> Result<(), B::Error> {
    let inputs = network.inputs();
    ShapeError::check_exact("forward", "params", network.num_params(), params.len())?;
    ShapeError::check_exact("forward", "examples", inputs, examples.features())?;
    let chunk = EVAL_CHUNK.min(examples.len().max(1));
    let mut device_params = backend.zeros(params.len())?;
    backend.upload(params, &mut device_params, 0)?;
    let resident = backend.upload_examples(examples)?;
    let mut x = backend.zeros(chunk * inputs)?;
    let mut labels = backend.zero_labels(chunk)?;
    let mut activations = activation_buffers(network, backend, chunk)?;
    let indices: Vec<u32> = (0..examples.len() as u32).collect();
    for batch in indices.chunks(chunk) {
        backend.gather(&resident, batch, &mut x, &mut labels)?;
        network.forward(backend, &device_params, &x, batch.len(), &mut activations)?;
        visit(batch.len(), logits_of(&activations)?, &labels)?;
    }
    Ok(())
}
