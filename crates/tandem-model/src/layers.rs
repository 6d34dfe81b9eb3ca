//! The layer library: each layer's forward and backward pass over [`Backend`] operations, so
//! that a [`Network`](crate::Network) is composed without writing backpropagation. Layers use
//! the backends' fused operations (a product with its bias and ReLU in one pass, softmax with
//! its cross-entropy), so composing costs no speed.

use tandem_core::{Alone, Helpers, ParamSpan};
use tandem_tensor::{Activation, Backend, Gemm};

use crate::network::{logits_of, logits_of_mut};

/// A fully connected layer, `y = activation(x . W + b)`: `W` is `ins x outs` (row-major),
/// followed by `b` (`outs`) in a model's flat parameter vector. Its weights are
/// L2-regularised, its biases not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dense {
    /// Input features.
    pub ins: usize,
    /// Output features.
    pub outs: usize,
    /// What follows the affine map (fused into the product where the backend can).
    pub activation: Activation,
}

impl Dense {
    /// The number of parameters: weights then biases.
    pub fn num_params(&self) -> usize {
        self.ins * self.outs + self.outs
    }

    /// Its parameter spans, named `{name}/weights` and `{name}/biases`.
    pub fn layout(&self, name: &str) -> [ParamSpan; 2] {
        [
            ParamSpan::new(format!("{name}/weights"), [self.ins, self.outs], true),
            ParamSpan::new(format!("{name}/biases"), [self.outs], false),
        ]
    }

    /// Writes the first `rows` rows of the output into `output` from those of `input`; the
    /// layer's parameters start at `offset` in `params`.
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        (params, offset): (&B::Buffer, usize),
        input: &B::Buffer,
        rows: usize,
        output: &mut B::Buffer,
    ) -> Result<(), B::Error> {
        let product = Gemm::nn(rows, self.outs, self.ins);
        let bias = offset + self.ins * self.outs;
        b.matmul_bias(
            product,
            (input, 0),
            (params, offset),
            (params, bias),
            (output, 0),
            self.activation,
        )
    }

    /// [`forward`](Self::forward) from the batch of `examples` at `indices`, gathered into
    /// `x` and `labels` on the way ([`Backend::gather_matmul_bias`]): a first layer.
    pub fn forward_gathered<B: Backend>(
        &self,
        b: &B,
        (params, offset): (&B::Buffer, usize),
        batch: Batch<'_, B>,
        output: &mut B::Buffer,
    ) -> Result<(), B::Error> {
        let product = Gemm::nn(batch.indices.len(), self.outs, self.ins);
        let bias = offset + self.ins * self.outs;
        b.gather_matmul_bias(
            (batch.examples, batch.indices),
            (batch.x, batch.labels),
            product,
            (params, offset),
            (params, bias),
            (output, 0),
            self.activation,
        )
    }

    /// The backward pass of [`forward`](Self::forward) over `rows` rows. `delta` holds the
    /// loss's gradient with respect to the layer's `output`, or, when `delta_masked`, already
    /// with respect to what went into its activation (the product that computed it masked it,
    /// see below); it is left as the latter. The parameter gradients go to `grads` at
    /// `offset`, the input's to `input_delta` when one is wanted (a first layer needs none):
    /// with a mask (the input is a ReLU's output), already through that ReLU, in the same
    /// product ([`Backend::matmul_relu_backward`]). `helpers` may take part in the weight
    /// gradient, the layer's largest product.
    #[allow(clippy::too_many_arguments)]
    pub fn backward<B: Backend>(
        &self,
        b: &B,
        (params, offset): (&B::Buffer, usize),
        (input, output): (&B::Buffer, &B::Buffer),
        rows: usize,
        (delta, delta_masked): (&mut B::Buffer, bool),
        (grads, input_delta): (&mut B::Buffer, Option<InputDelta<'_, B>>),
        helpers: &dyn Helpers,
    ) -> Result<(), B::Error> {
        if self.activation == Activation::Relu && !delta_masked {
            b.relu_backward(delta, output, rows * self.outs)?;
        }
        // dW = input^T . delta, db = colsum(delta), the biases' after the weights'; and
        // dX = delta . W^T, masked where the input's ReLU was not positive.
        let shape = (self.ins, self.outs, rows);
        match input_delta {
            Some(input_delta) => b.layer_gradients(
                shape,
                (input, delta),
                (params, offset),
                (grads, offset),
                input_delta,
                helpers,
            ),
            None => b.weight_and_bias_gradients(shape, input, delta, (grads, offset), helpers),
        }
    }
}

/// A batch to gather ([`Backend::gather`]): the examples at `indices` of `examples`, their
/// features into the first rows of `x` and their labels into `labels`.
pub struct Batch<'a, B: Backend> {
    /// The data set.
    pub examples: &'a B::Examples,
    /// The batch's examples, by index in the data set.
    pub indices: &'a [u32],
    /// Where their features go.
    pub x: &'a mut B::Buffer,
    /// Where their labels go.
    pub labels: &'a mut B::Labels,
}

impl<B: Backend> Batch<'_, B> {
    /// The same batch, lent for a shorter while: what a pass that takes a batch is given, so
    /// that its buffers (the labels the loss reads, the features the backward pass reads)
    /// remain at hand after it.
    pub fn reborrow(&mut self) -> Batch<'_, B> {
        Batch {
            examples: self.examples,
            indices: self.indices,
            x: &mut *self.x,
            labels: &mut *self.labels,
        }
    }
}

/// Where [`Dense::backward`] writes its input's gradient, and the ReLU output it masks that
/// gradient by when its input is one (`None`: the gradient as it is).
pub type InputDelta<'a, B> = (
    &'a mut <B as Backend>::Buffer,
    Option<&'a <B as Backend>::Buffer>,
);

/// A stack of [`Dense`] layers, one's output the next one's input, their parameters one after
/// another: the forward and backward pass of any multi-layer perceptron.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenseStack {
    layers: Vec<Dense>,
}

impl DenseStack {
    /// Layers of the widths `widths[0] -> widths[1] -> ... -> widths[last]`, every one but the
    /// last followed by a ReLU; `None` for fewer than two widths or a zero one.
    pub fn relu(widths: &[usize]) -> Option<Self> {
        if widths.len() < 2 || widths.contains(&0) {
            return None;
        }
        let last = widths.len() - 2;
        let layers = widths
            .windows(2)
            .enumerate()
            .map(|(i, pair)| Dense {
                ins: pair[0],
                outs: pair[1],
                activation: if i == last {
                    Activation::Identity
                } else {
                    Activation::Relu
                },
            })
            .collect();
        Some(Self { layers })
    }

    /// The layers, first to last.
    pub fn layers(&self) -> &[Dense] {
        &self.layers
    }

    /// The parameter spans, `layer1/weights`, `layer1/biases`, `layer2/weights`, ...
    pub fn layout(&self) -> Vec<ParamSpan> {
        (self.layers.iter().enumerate())
            .flat_map(|(i, layer)| layer.layout(&format!("layer{}", i + 1)))
            .collect()
    }

    /// The width of each layer's output, in order (the last is the stack's output).
    pub fn activations(&self) -> Vec<usize> {
        self.layers.iter().map(|layer| layer.outs).collect()
    }

    /// Where each layer's parameters start, in order.
    fn offsets(&self) -> impl Iterator<Item = usize> + '_ {
        self.layers.iter().scan(0, |next, layer| {
            let offset = *next;
            *next += layer.num_params();
            Some(offset)
        })
    }

    /// Every layer's forward pass, layer `l`'s output into `activations[l]`.
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        params: &B::Buffer,
        x: &B::Buffer,
        rows: usize,
        activations: &mut [B::Buffer],
    ) -> Result<(), B::Error> {
        let all = (0, self.layers.len());
        self.forward_from(all, b, params, x, rows, activations)
    }

    /// The forward passes of the layers from `first` on up to `end` exclusive (layer 0's
    /// input `x`).
    #[allow(clippy::too_many_arguments)]
    fn forward_from<B: Backend>(
        &self,
        (first, end): (usize, usize),
        b: &B,
        params: &B::Buffer,
        x: &B::Buffer,
        rows: usize,
        activations: &mut [B::Buffer],
    ) -> Result<(), B::Error> {
        let layers = self.layers.iter().zip(self.offsets()).enumerate();
        for (l, (layer, offset)) in layers.take(end).skip(first) {
            let (before, after) = activations.split_at_mut(l);
            let input = before.last().unwrap_or(x);
            layer.forward(b, (params, offset), input, rows, &mut after[0])?;
        }
        Ok(())
    }

    /// [`forward`](Self::forward) from a batch gathered on the way, by the first layer's
    /// product ([`Dense::forward_gathered`]).
    pub fn forward_batch<B: Backend>(
        &self,
        b: &B,
        params: &B::Buffer,
        batch: Batch<'_, B>,
        activations: &mut [B::Buffer],
    ) -> Result<(), B::Error> {
        self.forward_batch_to(self.layers.len(), b, params, batch, activations)
    }

    /// [`forward_batch`](Self::forward_batch) and the loss, left where the backend computes
    /// ([`Network::forward_loss_into`](crate::Network::forward_loss_into)): the last layer's
    /// product and the softmax cross-entropy of its logits as one operation
    /// ([`Backend::matmul_bias_softmax_cross_entropy_into`]) where that layer has no
    /// activation and is not the first (whose product gathers the batch).
    pub fn forward_loss_into<B: Backend>(
        &self,
        b: &B,
        params: &B::Buffer,
        batch: Batch<'_, B>,
        (activations, deltas): (&mut [B::Buffer], &mut [B::Buffer]),
        loss: (&mut B::Buffer, usize),
    ) -> Result<(), B::Error> {
        let last = self.layers.len() - 1;
        let layer = self.layers[last];
        let fused = last > 0 && layer.activation == Activation::Identity;
        let rows = batch.indices.len();
        let mut batch = batch;
        let end = if fused { last } else { last + 1 };
        self.forward_batch_to(end, b, params, batch.reborrow(), activations)?;
        let (labels, dlogits) = (&*batch.labels, logits_of_mut(deltas)?);
        if !fused {
            let logits = logits_of(activations)?;
            return b.softmax_cross_entropy_into(logits, labels, (rows, layer.outs), dlogits, loss);
        }
        let offset = self.offsets().nth(last).unwrap_or(0);
        let bias = offset + layer.ins * layer.outs;
        let (before, after) = activations.split_at_mut(last);
        let operands = ((&before[last - 1], 0), (params, offset), (params, bias));
        let product = Gemm::nn(rows, layer.outs, layer.ins);
        b.matmul_bias_softmax_cross_entropy_into(
            product,
            operands,
            (&mut after[0], labels),
            dlogits,
            loss,
        )
    }

    /// [`forward_batch`](Self::forward_batch) of the layers before `end`.
    fn forward_batch_to<B: Backend>(
        &self,
        end: usize,
        b: &B,
        params: &B::Buffer,
        batch: Batch<'_, B>,
        activations: &mut [B::Buffer],
    ) -> Result<(), B::Error> {
        let mut batch = batch;
        match self.layers.first() {
            Some(first) => {
                first.forward_gathered(b, (params, 0), batch.reborrow(), &mut activations[0])?
            }
            None => b.gather(batch.examples, batch.indices, batch.x, batch.labels)?,
        }
        let rows = batch.indices.len();
        self.forward_from((1, end), b, params, batch.x, rows, activations)
    }

    /// Every layer's backward pass, last to first: `deltas[l]` holds the gradient with respect
    /// to `activations[l]` once layer `l + 1` is done (the caller writes the last one).
    /// `helpers` take part in the first layer's weight gradient (the largest product of an
    /// MNIST-sized network, and the step's last).
    #[allow(clippy::too_many_arguments)]
    pub fn backward<B: Backend>(
        &self,
        b: &B,
        params: &B::Buffer,
        x: &B::Buffer,
        rows: usize,
        activations: &[B::Buffer],
        deltas: &mut [B::Buffer],
        grads: &mut B::Buffer,
        helpers: &dyn Helpers,
    ) -> Result<(), B::Error> {
        let offsets: Vec<usize> = self.offsets().collect();
        let last = self.layers.len() - 1;
        let is_relu = |l: usize| self.layers[l].activation == Activation::Relu;
        for (l, layer) in self.layers.iter().enumerate().rev() {
            let input = if l == 0 { x } else { &activations[l - 1] };
            let (before, after) = deltas.split_at_mut(l);
            let helpers = if l == 0 { helpers } else { &Alone };
            // Layer l's delta comes from layer l + 1's input product, which masked it by layer
            // l's ReLU (the last layer's comes from the head, as it is).
            let masked = l < last && is_relu(l);
            let input_delta = (before.last_mut()).map(|d| (d, is_relu(l - 1).then_some(input)));
            layer.backward(
                b,
                (params, offsets[l]),
                (input, &activations[l]),
                rows,
                (&mut after[0], masked),
                (grads, input_delta),
                helpers,
            )?;
        }
        Ok(())
    }
}
