use rand::Rng;
use tandem_core::ParamSpan;
use tandem_tensor::{cpu, Activation, Backend, CpuBackend, ExampleSet, Gemm, ShapeError, Tensor};

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
    /// The reference's network (the TensorFlow multi-GPU MNIST example): 784 -> 500 -> 10.
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
    /// (the reference uses 0.1).
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
        let first = Gemm::nn(rows, self.hidden, self.inputs);
        backend.matmul_bias_relu(first, (x, 0), (params, o.w1), (params, o.b1), (hidden, 0))?;
        let second = Gemm::nn(rows, self.classes, self.hidden);
        backend.matmul(second, (hidden, 0), (params, o.w2), (logits, 0))?;
        backend.bias_add(
            logits,
            (params, o.b2),
            rows,
            self.classes,
            Activation::Identity,
        )
    }

    /// The fraction of `examples` whose most probable class under `params` is their label.
    pub fn evaluate<B: Backend>(
        &self,
        backend: &B,
        params: &[f32],
        examples: &ExampleSet,
    ) -> Result<f64, B::Error> {
        let mut correct = 0;
        self.for_each_batch(backend, params, examples, |rows, logits, labels| {
            correct += backend.count_correct(logits, labels, rows, self.classes)?;
            Ok(())
        })?;
        Ok(correct as f64 / examples.len().max(1) as f64)
    }

    /// Runs the forward pass over `examples` in chunks of [`EVAL_CHUNK`], handing each chunk's
    /// row count, logits and labels to `visit`.
    fn for_each_batch<B: Backend>(
        &self,
        backend: &B,
        params: &[f32],
        examples: &ExampleSet,
        mut visit: impl FnMut(usize, &B::Buffer, &B::Labels) -> Result<(), B::Error>,
    ) -> Result<(), B::Error> {
        ShapeError::check_exact("forward", "params", self.num_params(), params.len())?;
        ShapeError::check_exact("forward", "examples", self.inputs, examples.features())?;
        let chunk = EVAL_CHUNK.min(examples.len().max(1));
        let mut device_params = backend.zeros(self.num_params())?;
        backend.upload(params, &mut device_params, 0)?;
        let resident = backend.upload_examples(examples)?;
        let mut x = backend.zeros(chunk * self.inputs)?;
        let mut labels = backend.zero_labels(chunk)?;
        let mut hidden = backend.zeros(chunk * self.hidden)?;
        let mut logits = backend.zeros(chunk * self.classes)?;
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
            visit(batch.len(), &logits, &labels)?;
        }
        Ok(())
    }

    /// The logits (`rows x classes`, row-major) of `rows = x.len() / inputs` inputs under
    /// `params`; `x` holds the inputs' features one row after another, each scaled to
    /// `[0, 1]` as in training. An `x` that is not whole rows is a [`ShapeError`].
    pub fn logits<B: Backend>(
        &self,
        backend: &B,
        params: &[f32],
        x: &[f32],
    ) -> Result<Vec<f32>, B::Error> {
        ShapeError::check_exact("logits", "params", self.num_params(), params.len())?;
        let rows = x.len() / self.inputs.max(1);
        if rows * self.inputs != x.len() {
            return Err(ShapeError {
                op: "logits",
                operand: "x",
                needed: (rows + 1) * self.inputs,
                available: x.len(),
            }
            .into());
        }
        let mut device_params = backend.zeros(self.num_params())?;
        backend.upload(params, &mut device_params, 0)?;
        let mut device_x = backend.zeros(x.len())?;
        backend.upload(x, &mut device_x, 0)?;
        let mut hidden = backend.zeros(rows * self.hidden)?;
        let mut logits = backend.zeros(rows * self.classes)?;
        self.forward(
            backend,
            &device_params,
            &device_x,
            rows,
            &mut hidden,
            &mut logits,
        )?;
        let mut host = vec![0.0; rows * self.classes];
        backend.download(&logits, 0, &mut host)?;
        Ok(host)
    }

    /// The most probable class of every example of `examples` under `params`, in order (the
    /// same decision [`Mlp::evaluate`] scores, so `predictions[i] == label(i)` exactly for the
    /// examples it counts as correct). Used for confusion matrices.
    pub fn predictions<B: Backend>(
        &self,
        backend: &B,
        params: &[f32],
        examples: &ExampleSet,
    ) -> Result<Vec<usize>, B::Error> {
        let mut host = vec![0.0; EVAL_CHUNK * self.classes];
        let mut predictions = Vec::with_capacity(examples.len());
        self.for_each_batch(backend, params, examples, |rows, logits, _| {
            let host = &mut host[..rows * self.classes];
            backend.download(logits, 0, host)?;
            // `cpu::argmax` is the tie rule `count_correct` uses, so predictions and accuracy
            // never disagree.
            predictions.extend(host.chunks_exact(self.classes).map(cpu::argmax));
            Ok(())
        })?;
        Ok(predictions)
    }

    /// The class probabilities (softmax of the logits) of one input of exactly `inputs`
    /// features in `[0, 1]`, computed on the CPU with the same forward pass as training. An `x`
    /// or `params` of the wrong length is a [`ShapeError`].
    pub fn probabilities(&self, params: &[f32], x: &[f32]) -> Result<Vec<f32>, ShapeError> {
        ShapeError::check_exact("probabilities", "x", self.inputs, x.len())?;
        let logits = self.logits(&CpuBackend, params, x)?;
        // Numerically stable: the largest logit is subtracted before exponentiating.
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exp: Vec<f64> = logits.iter().map(|&l| f64::from(l - max).exp()).collect();
        let sum: f64 = exp.iter().sum();
        Ok(exp.iter().map(|e| (e / sum) as f32).collect())
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    const TINY: Mlp = Mlp {
        inputs: 4,
        hidden: 8,
        classes: 3,
    };

    fn params() -> Vec<f32> {
        TINY.init(0.5, &mut rand::rngs::StdRng::seed_from_u64(3))
    }

    fn examples() -> ExampleSet {
        let values = vec![
            0, 255, 10, 3, 200, 1, 0, 0, 9, 9, 9, 9, 255, 255, 0, 128, 17, 34, 51, 68,
        ];
        ExampleSet::new(4, values, vec![2, 0, 1, 1, 0]).unwrap()
    }

    fn features(examples: &ExampleSet, i: usize) -> Vec<f32> {
        examples
            .features_of(i)
            .iter()
            .map(|&v| f32::from(v) / 255.0)
            .collect()
    }

    #[test]
    fn predictions_agree_with_evaluate_and_with_logits() {
        let (params, examples) = (params(), examples());
        let predictions = TINY.predictions(&CpuBackend, &params, &examples).unwrap();
        assert_eq!(predictions.len(), examples.len());
        let correct = predictions
            .iter()
            .zip(examples.labels())
            .filter(|(&p, &l)| p == usize::from(l))
            .count();
        let accuracy = TINY.evaluate(&CpuBackend, &params, &examples).unwrap();
        assert_eq!(correct as f64 / examples.len() as f64, accuracy);
        for (i, &predicted) in predictions.iter().enumerate() {
            let logits = TINY
                .logits(&CpuBackend, &params, &features(&examples, i))
                .unwrap();
            assert_eq!(cpu::argmax(&logits), predicted);
        }
    }

    #[test]
    fn probabilities_are_the_softmax_of_the_logits() {
        let (params, examples) = (params(), examples());
        for i in 0..examples.len() {
            let x = features(&examples, i);
            let logits = TINY.logits(&CpuBackend, &params, &x).unwrap();
            let p = TINY.probabilities(&params, &x).unwrap();
            assert_eq!(p.len(), TINY.classes);
            assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6, "{p:?}");
            assert!(p.iter().all(|&v| (0.0..=1.0).contains(&v)));
            assert_eq!(cpu::argmax(&p), cpu::argmax(&logits));
            // Ratios of probabilities are exponentials of differences of logits.
            let ratio = (p[0] / p[1]).ln();
            assert!((ratio - (logits[0] - logits[1])).abs() < 1e-4);
        }
        // Huge logits do not overflow.
        let mut big = params.clone();
        let b2 = TINY.num_params() - TINY.classes;
        big[b2] = 1e4;
        let p = TINY.probabilities(&big, &features(&examples, 0)).unwrap();
        assert!(p.iter().all(|v| v.is_finite()));
        assert!((p[0] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn logits_of_several_rows_are_those_of_each_row() {
        let (params, examples) = (params(), examples());
        let x: Vec<f32> = (0..examples.len())
            .flat_map(|i| features(&examples, i))
            .collect();
        let all = TINY.logits(&CpuBackend, &params, &x).unwrap();
        for i in 0..examples.len() {
            let one = TINY
                .logits(&CpuBackend, &params, &features(&examples, i))
                .unwrap();
            assert_eq!(&all[i * 3..i * 3 + 3], one.as_slice());
        }
    }

    #[test]
    fn wrong_lengths_are_errors_not_panics() {
        let (params, examples) = (params(), examples());
        let x = features(&examples, 0);
        assert!(TINY.probabilities(&params, &x[..3]).is_err());
        assert!(TINY
            .probabilities(&params, &[x.clone(), x.clone()].concat())
            .is_err());
        assert!(TINY.probabilities(&params[1..], &x).is_err());
        assert!(TINY.logits(&CpuBackend, &params, &x[..3]).is_err());
        assert!(TINY
            .logits(&CpuBackend, &[params.clone(), vec![0.0]].concat(), &x)
            .is_err());
        assert!(TINY
            .predictions(&CpuBackend, &params[1..], &examples)
            .is_err());
        for features in [3, 5] {
            let other = ExampleSet::new(features, vec![0; 2 * features], vec![0, 1]).unwrap();
            assert!(TINY.predictions(&CpuBackend, &params, &other).is_err());
        }
        let empty = ExampleSet::new(4, vec![], vec![]).unwrap();
        assert_eq!(
            TINY.predictions(&CpuBackend, &params, &empty).unwrap(),
            Vec::<usize>::new()
        );
    }
}
