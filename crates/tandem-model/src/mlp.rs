use rand::Rng;
use tandem_pool::ParamSpan;
use tandem_tensor::{Backend, ExampleSet, Gemm, Tensor};

/// A one-hidden-layer perceptron: `inputs -> hidden (ReLU) -> classes`.
///
/// Its parameters live in one flat vector, in this order: layer-1 weights (`inputs x hidden`,
/// row-major), layer-1 biases, layer-2 weights (`hidden x classes`), layer-2 biases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mlp {
    /// Input features.
    pub inputs: usize,
    /// Hidden units.
    pub hidden: usize,
    /// Output classes.
    pub classes: usize,
}

/// Where each parameter starts in the flat vector.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Offsets {
    pub w1: usize,
    pub b1: usize,
    pub w2: usize,
    pub b2: usize,
}

/// Rows evaluated per forward pass in [`Mlp::evaluate`].
const EVAL_CHUNK: usize = 1000;

impl Mlp {
    /// The book's network: 784 -> 500 -> 10.
    pub const MNIST: Mlp = Mlp {
        inputs: 784,
        hidden: 500,
        classes: 10,
    };

    pub(crate) fn offsets(&self) -> Offsets {
        let w1 = 0;
        let b1 = w1 + self.inputs * self.hidden;
        let w2 = b1 + self.hidden;
        let b2 = w2 + self.hidden * self.classes;
        Offsets { w1, b1, w2, b2 }
    }

    /// The total number of parameters.
    pub fn num_params(&self) -> usize {
        self.offsets().b2 + self.classes
    }

    /// The parameter spans in flat order; weights are L2-regularised, biases not.
    pub fn layout(&self) -> Vec<ParamSpan> {
        let span = |name: &str, shape: Vec<usize>, weight_decay| ParamSpan {
            name: name.to_owned(),
            shape,
            weight_decay,
        };
        vec![
            span("layer1/weights", vec![self.inputs, self.hidden], true),
            span("layer1/biases", vec![self.hidden], false),
            span("layer2/weights", vec![self.hidden, self.classes], true),
            span("layer2/biases", vec![self.classes], false),
        ]
    }

    /// Initial parameters: weights truncated normal with standard deviation `stddev`, biases 0
    /// (the book uses 0.1).
    pub fn init(&self, stddev: f32, rng: &mut impl Rng) -> Vec<f32> {
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

    /// Writes the logits of the first `rows` rows of `x` into `logits`, using `hidden` as
    /// scratch; `params` is the flat parameter buffer.
    pub(crate) fn forward<B: Backend>(
        &self,
        backend: &B,
        params: &B::Buffer,
        x: &B::Buffer,
        rows: usize,
        hidden: &mut B::Buffer,
        logits: &mut B::Buffer,
    ) -> Result<(), B::Error> {
        let o = self.offsets();
        let first = Gemm {
            m: rows,
            n: self.hidden,
            k: self.inputs,
            a_transposed: false,
            b_transposed: false,
        };
        backend.matmul(first, (x, 0), (params, o.w1), (hidden, 0))?;
        backend.bias_relu(hidden, (params, o.b1), rows, self.hidden)?;
        let second = Gemm {
            m: rows,
            n: self.classes,
            k: self.hidden,
            a_transposed: false,
            b_transposed: false,
        };
        backend.matmul(second, (hidden, 0), (params, o.w2), (logits, 0))?;
        backend.bias_add(logits, (params, o.b2), rows, self.classes)
    }

    /// The fraction of `examples` whose most probable class under `params` is their label.
    pub fn evaluate<B: Backend>(
        &self,
        backend: &B,
        params: &[f32],
        examples: &ExampleSet,
    ) -> Result<f64, B::Error> {
        let chunk = EVAL_CHUNK.min(examples.len().max(1));
        let mut device_params = backend.zeros(self.num_params())?;
        backend.upload(params, &mut device_params, 0)?;
        let resident = backend.upload_examples(examples)?;
        let mut x = backend.zeros(chunk * self.inputs)?;
        let mut labels = backend.zero_labels(chunk)?;
        let mut hidden = backend.zeros(chunk * self.hidden)?;
        let mut logits = backend.zeros(chunk * self.classes)?;
        let mut correct = 0;
        let indices: Vec<u32> = (0..examples.len() as u32).collect();
        for batch in indices.chunks(chunk) {
            backend.gather(&resident, batch, &mut x, &mut labels)?;
            self.forward(
                backend,
                &device_params,
                &x,
                batch.len(),
                &mut hidden,
                &mut logits,
            )?;
            correct += backend.count_correct(&logits, &labels, batch.len(), self.classes)?;
        }
        Ok(correct as f64 / examples.len().max(1) as f64)
    }
}
