//! The layer library: each layer's forward and backward pass over [`Backend`] operations, so
//! that a [`Network`](crate::Network) is composed without writing backpropagation. Layers use
//! the backends' fused operations (a product with its bias and ReLU in one pass, softmax with
//! its cross-entropy), so composing costs no speed.

use tandem_core::{Alone, Helpers, ParamSpan};
use tandem_tensor::{Activation, Backend, Gemm};

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
        // dW = input^T . delta, db = colsum(delta), the biases' after the weights'.
        let shape = (self.ins, self.outs, rows);
        b.weight_and_bias_gradients(shape, input, delta, (grads, offset), helpers)?;
        // dX = delta . W^T, masked where the input's ReLU was not positive.
        let product = Gemm::nt(rows, self.ins, self.outs);
        match input_delta {
            Some((input_delta, Some(mask))) => {
                b.matmul_relu_backward(product, (delta, 0), (params, offset), mask, input_delta)
            }
            Some((input_delta, None)) => {
                b.matmul(product, (delta, 0), (params, offset), (input_delta, 0))
            }
            None => Ok(()),
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
        self.forward_from(0, b, params, x, rows, activations)
    }

    /// The forward passes of the layers from `first` on (layer 0's input `x`).
    fn forward_from<B: Backend>(
        &self,
        first: usize,
        b: &B,
        params: &B::Buffer,
        x: &B::Buffer,
        rows: usize,
        activations: &mut [B::Buffer],
    ) -> Result<(), B::Error> {
        let layers = self.layers.iter().zip(self.offsets()).enumerate();
        for (l, (layer, offset)) in layers.skip(first) {
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
        let Batch {
            examples,
            indices,
            x,
            labels,
        } = batch;
        match self.layers.first() {
            Some(first) => {
                let batch = Batch {
                    examples,
                    indices,
                    x: &mut *x,
                    labels,
                };
                first.forward_gathered(b, (params, 0), batch, &mut activations[0])?
            }
            None => b.gather(examples, indices, x, labels)?,
        }
        self.forward_from(1, b, params, x, indices.len(), activations)
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

/// The classification head: a numerically stable softmax with its cross-entropy, fused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoftmaxCrossEntropy {
    /// Classes (logits per example).
    pub classes: usize,
}

impl SoftmaxCrossEntropy {
    /// The mean loss of the first `rows` rows of `logits` against `labels`, and its gradient
    /// with respect to the logits in `dlogits`. With `on_device`, the loss is left there (one
    /// value at its offset, read later: a device backend does not wait for the device) and
    /// `None` returned; without, it is returned.
    pub fn forward_backward<B: Backend>(
        &self,
        b: &B,
        (logits, labels): (&B::Buffer, &B::Labels),
        rows: usize,
        dlogits: &mut B::Buffer,
        on_device: Option<(&mut B::Buffer, usize)>,
    ) -> Result<Option<f32>, B::Error> {
        match on_device {
            Some(loss) => {
                let shape = (rows, self.classes);
                b.softmax_cross_entropy_into(logits, labels, shape, dlogits, loss)?;
                Ok(None)
            }
            None => b
                .softmax_cross_entropy(logits, labels, rows, self.classes, dlogits)
                .map(Some),
        }
    }
}

#[cfg(test)]
mod tests {
    use tandem_tensor::CpuBackend;

    use super::*;

    #[test]
    fn a_relu_stack_names_its_layers_and_ends_without_an_activation() {
        let stack = DenseStack::relu(&[5, 4, 3, 2]).unwrap();
        let acts: Vec<Activation> = stack.layers().iter().map(|l| l.activation).collect();
        assert_eq!(
            acts,
            [Activation::Relu, Activation::Relu, Activation::Identity]
        );
        assert_eq!(stack.activations(), [4, 3, 2]);
        let names: Vec<String> = stack.layout().into_iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "layer1/weights",
                "layer1/biases",
                "layer2/weights",
                "layer2/biases",
                "layer3/weights",
                "layer3/biases"
            ]
        );
        assert_eq!(stack.offsets().collect::<Vec<_>>(), [0, 24, 39]);
        assert!(DenseStack::relu(&[5]).is_none());
        assert!(DenseStack::relu(&[5, 0, 2]).is_none());
    }

    /// A dense layer's backward pass against finite differences of its forward pass, for a
    /// loss `sum(y * r)` with fixed random `r` (so `dL/dy = r`), in f64 on the host.
    #[test]
    fn dense_backward_is_the_derivative_of_its_forward() {
        for activation in [Activation::Identity, Activation::Relu] {
            let layer = Dense {
                ins: 3,
                outs: 4,
                activation,
            };
            let rows = 2;
            let wave = |i: usize, scale: f32| (i as f32 * 1.7).sin() * scale;
            let params: Vec<f32> = (0..layer.num_params()).map(|i| wave(i, 0.8)).collect();
            let x: Vec<f32> = (0..rows * layer.ins).map(|i| wave(i + 5, 1.0)).collect();
            let r: Vec<f32> = (0..rows * layer.outs).map(|i| wave(i + 9, 1.0)).collect();
            let loss = |params: &[f32], x: &[f32]| {
                let mut y = vec![0.0; rows * layer.outs];
                layer
                    .forward(
                        &CpuBackend,
                        (&params.to_vec(), 0),
                        &x.to_vec(),
                        rows,
                        &mut y,
                    )
                    .unwrap();
                y.iter().zip(&r).map(|(y, r)| f64::from(y * r)).sum::<f64>()
            };
            let mut y = vec![0.0; rows * layer.outs];
            layer
                .forward(&CpuBackend, (&params, 0), &x, rows, &mut y)
                .unwrap();
            let (mut delta, mut grads, mut dx) =
                (r.clone(), vec![0.0; layer.num_params()], vec![0.0; x.len()]);
            layer
                .backward(
                    &CpuBackend,
                    (&params, 0),
                    (&x, &y),
                    rows,
                    (&mut delta, false),
                    (&mut grads, Some((&mut dx, None))),
                    &Alone,
                )
                .unwrap();
            let h = 1e-2;
            let numeric = |values: &[f32], i: usize, of: &dyn Fn(&[f32]) -> f64| {
                let (mut up, mut down) = (values.to_vec(), values.to_vec());
                up[i] += h;
                down[i] -= h;
                (of(&up) - of(&down)) / f64::from(2.0 * h)
            };
            for (i, &grad) in grads.iter().enumerate() {
                let expected = numeric(&params, i, &|p| loss(p, &x));
                assert!(
                    (f64::from(grad) - expected).abs() < 1e-3,
                    "{activation:?} p{i}"
                );
            }
            for (i, &grad) in dx.iter().enumerate() {
                let expected = numeric(&x, i, &|x| loss(&params, x));
                assert!(
                    (f64::from(grad) - expected).abs() < 1e-3,
                    "{activation:?} x{i}"
                );
            }
        }
    }
}
