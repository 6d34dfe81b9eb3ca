use tandem_core::{Helpers, ParamSpan};
use tandem_tensor::Backend;

use crate::layers::{Batch, DenseStack};
use crate::Network;

/// A multi-layer perceptron: `inputs -> hidden[0] (ReLU) -> hidden[1] (ReLU) -> ... ->
/// classes`, a [`DenseStack`] of any depth.
///
/// Its parameters live in one flat vector, layer after layer: each layer's weights (`ins x
/// outs`, row-major), then its biases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mlp {
    stack: DenseStack,
}

/// The widest layer [`Mlp::new`] accepts.
pub const MAX_WIDTH: usize = 1 << 16;
/// The most hidden layers [`Mlp::new`] accepts.
pub const MAX_HIDDEN_LAYERS: usize = 64;
/// The most parameters [`Mlp::new`] accepts (1 GiB of `f32`).
pub const MAX_PARAMS: usize = 1 << 28;

/// Layer sizes that make no network [`Mlp::new`] builds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MlpError {
    /// A width of 0 or above [`MAX_WIDTH`].
    #[error("a layer width of {0} is out of range 1..={MAX_WIDTH}")]
    Width(usize),
    /// More than [`MAX_HIDDEN_LAYERS`] hidden layers.
    #[error("{0} hidden layers are more than the {MAX_HIDDEN_LAYERS} allowed")]
    Depth(usize),
    /// More than [`MAX_PARAMS`] parameters.
    #[error("{0} parameters are more than the {MAX_PARAMS} allowed")]
    Params(usize),
    /// A name that is not widths joined by `-` (see [`Mlp::name`]).
    #[error("{0:?} is not a network's layer widths joined by '-' (such as \"784-500-10\")")]
    Name(String),
}

impl Mlp {
    /// `inputs -> hidden... -> classes`, each width in `1..=MAX_WIDTH`, at most
    /// [`MAX_HIDDEN_LAYERS`] hidden layers and [`MAX_PARAMS`] parameters.
    pub fn new(inputs: usize, hidden: &[usize], classes: usize) -> Result<Self, MlpError> {
        if hidden.len() > MAX_HIDDEN_LAYERS {
            return Err(MlpError::Depth(hidden.len()));
        }
        let widths: Vec<usize> = std::iter::once(inputs)
            .chain(hidden.iter().copied())
            .chain([classes])
            .collect();
        if let Some(&bad) = widths.iter().find(|&&w| w == 0 || w > MAX_WIDTH) {
            return Err(MlpError::Width(bad));
        }
        // Widths of at most 2^16 and at most 66 layers: no product or sum overflows.
        let params: usize = widths.windows(2).map(|w| w[0] * w[1] + w[1]).sum();
        if params > MAX_PARAMS {
            return Err(MlpError::Params(params));
        }
        let stack = DenseStack::relu(&widths).ok_or(MlpError::Width(0))?;
        Ok(Self { stack })
    }

    /// The reference's network (the TensorFlow multi-GPU MNIST example): 784 -> 500 -> 10.
    pub fn mnist() -> Self {
        Self::mnist_with(&[500]).unwrap_or_else(|_| unreachable!("784-500-10 is in range"))
    }

    /// An MNIST network (784 inputs, 10 classes) with these hidden layers.
    pub fn mnist_with(hidden: &[usize]) -> Result<Self, MlpError> {
        Self::new(784, hidden, 10)
    }

    /// The hidden layers' widths, first to last.
    pub fn hidden(&self) -> Vec<usize> {
        let layers = self.stack.layers();
        layers[..layers.len() - 1].iter().map(|l| l.outs).collect()
    }

    /// The widths joined by `-`, such as `784-500-10`: what checkpoints record as the model.
    pub fn name(&self) -> String {
        let layers = self.stack.layers();
        std::iter::once(layers[0].ins)
            .chain(layers.iter().map(|l| l.outs))
            .map(|w| w.to_string())
            .collect::<Vec<_>>()
            .join("-")
    }

    /// The network a [`name`](Self::name) names.
    pub fn from_name(name: &str) -> Result<Self, MlpError> {
        let bad = || MlpError::Name(name.to_owned());
        let widths = (name.split('-'))
            .map(|piece| match piece.parse::<usize>() {
                // Only the canonical spelling: a name is compared as a string elsewhere.
                Ok(w) if w.to_string() == piece => Ok(w),
                _ => Err(bad()),
            })
            .collect::<Result<Vec<usize>, MlpError>>()?;
        match widths.as_slice() {
            [inputs, hidden @ .., classes] => Self::new(*inputs, hidden, *classes),
            _ => Err(bad()),
        }
    }
}

impl Network for Mlp {
    fn inputs(&self) -> usize {
        self.stack.layers()[0].ins
    }

    fn classes(&self) -> usize {
        self.stack.activations().last().copied().unwrap_or(0)
    }

    fn layout(&self) -> Vec<ParamSpan> {
        self.stack.layout()
    }

    fn activations(&self) -> Vec<usize> {
        self.stack.activations()
    }

    fn forward<B: Backend>(
        &self,
        b: &B,
        params: &B::Buffer,
        x: &B::Buffer,
        rows: usize,
        activations: &mut [B::Buffer],
    ) -> Result<(), B::Error> {
        self.stack.forward(b, params, x, rows, activations)
    }

    fn forward_batch<B: Backend>(
        &self,
        b: &B,
        params: &B::Buffer,
        batch: Batch<'_, B>,
        activations: &mut [B::Buffer],
    ) -> Result<(), B::Error> {
        self.stack.forward_batch(b, params, batch, activations)
    }

    fn forward_loss_into<B: Backend>(
        &self,
        b: &B,
        params: &B::Buffer,
        batch: Batch<'_, B>,
        buffers: (&mut [B::Buffer], &mut [B::Buffer]),
        loss: (&mut B::Buffer, usize),
    ) -> Result<(), B::Error> {
        self.stack
            .forward_loss_into(b, params, batch, buffers, loss)
    }

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
    ) -> Result<(), B::Error> {
        self.stack
            .backward(b, params, x, rows, activations, deltas, grads, helpers)
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use tandem_tensor::{cpu, CpuBackend, ExampleSet};

    use super::*;

    static TINY: std::sync::LazyLock<Mlp> =
        std::sync::LazyLock::new(|| Mlp::new(4, &[8], 3).unwrap());

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
    fn a_network_is_named_by_its_widths_and_its_name_gives_it_back() {
        let reference = Mlp::mnist();
        assert_eq!(reference.name(), "784-500-10");
        assert_eq!(reference.hidden(), [500]);
        assert_eq!(reference.num_params(), 784 * 500 + 500 + 500 * 10 + 10);
        for name in ["784-500-10", "784-256-128-10", "4-3", "1-1-1-1"] {
            assert_eq!(Mlp::from_name(name).unwrap().name(), name);
        }
        assert_eq!(
            Mlp::from_name("784-256-128-10").unwrap().hidden(),
            [256, 128]
        );
        for bad in [
            "",
            "784",
            "784-",
            "-10",
            "784--10",
            "784-+5-10",
            "784-05-10",
            "a-b",
            "784-0-10",
        ] {
            assert!(Mlp::from_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sizes_out_of_range_are_refused_with_the_reason() {
        assert_eq!(Mlp::new(4, &[0], 3), Err(MlpError::Width(0)));
        assert_eq!(Mlp::new(0, &[2], 3), Err(MlpError::Width(0)));
        let wide = MAX_WIDTH + 1;
        assert_eq!(Mlp::new(4, &[wide], 3), Err(MlpError::Width(wide)));
        assert!(Mlp::new(4, &[MAX_WIDTH], 3).is_ok());
        let deep = vec![2; MAX_HIDDEN_LAYERS + 1];
        assert_eq!(Mlp::new(4, &deep, 3), Err(MlpError::Depth(deep.len())));
        assert!(Mlp::new(4, &deep[1..], 3).is_ok());
        let big = Mlp::new(MAX_WIDTH, &[MAX_WIDTH], 2).unwrap_err();
        assert!(
            matches!(big, MlpError::Params(n) if n > MAX_PARAMS),
            "{big}"
        );
        assert!(Mlp::mnist_with(&[4096]).is_ok());
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
            assert_eq!(p.len(), TINY.classes());
            assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6, "{p:?}");
            assert!(p.iter().all(|&v| (0.0..=1.0).contains(&v)));
            assert_eq!(cpu::argmax(&p), cpu::argmax(&logits));
            // Ratios of probabilities are exponentials of differences of logits.
            let ratio = (p[0] / p[1]).ln();
            assert!((ratio - (logits[0] - logits[1])).abs() < 1e-4);
        }
        // Huge logits do not overflow.
        let mut big = params.clone();
        let b2 = TINY.num_params() - TINY.classes();
        big[b2] = 1e4;
        let p = TINY.probabilities(&big, &features(&examples, 0)).unwrap();
        assert!(p.iter().all(|v| v.is_finite()));
        assert!((p[0] - 1.0).abs() < 1e-6);
    }

    /// The step's forward pass with its loss left where the backend computes (the last
    /// product and the loss as one operation, except in a one-layer network, whose only
    /// product gathers the batch) is the forward pass, then softmax cross-entropy: the logits,
    /// their gradient and the loss in its slot, against `logits` and `cpu`'s head.
    #[test]
    fn the_forward_pass_with_its_loss_is_the_logits_then_softmax_cross_entropy() {
        for name in ["4-8-3", "4-3", "4-8-5-3"] {
            let network = Mlp::from_name(name).unwrap();
            let params = network.init(0.5, &mut rand::rngs::StdRng::seed_from_u64(5));
            forward_loss_is_logits_then_head(&network, &params, name);
            // The trait's own passes, which fuse nothing.
            forward_loss_is_logits_then_head(&Unfused(network), &params, name);
        }
    }

    /// An [`Mlp`] that says only what a network must: the gather, the forward pass and the
    /// head are [`Network`]'s own, one operation after another.
    #[derive(Clone)]
    struct Unfused(Mlp);

    impl Network for Unfused {
        fn inputs(&self) -> usize {
            self.0.inputs()
        }

        fn classes(&self) -> usize {
            self.0.classes()
        }

        fn layout(&self) -> Vec<ParamSpan> {
            self.0.layout()
        }

        fn activations(&self) -> Vec<usize> {
            self.0.activations()
        }

        fn forward<B: Backend>(
            &self,
            b: &B,
            params: &B::Buffer,
            x: &B::Buffer,
            rows: usize,
            activations: &mut [B::Buffer],
        ) -> Result<(), B::Error> {
            self.0.forward(b, params, x, rows, activations)
        }

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
        ) -> Result<(), B::Error> {
            self.0
                .backward(b, params, x, rows, activations, deltas, grads, helpers)
        }
    }

    /// `network`'s forward pass with its loss from `params`, on a batch of the test set with an
    /// example twice, against its logits of the same features and `cpu`'s head.
    fn forward_loss_is_logits_then_head<N: Network>(network: &N, params: &[f32], name: &str) {
        let set = examples();
        let indices = [4u32, 0, 2, 2];
        let rows = indices.len();
        let (params, backend) = (params.to_vec(), CpuBackend);
        let buffers = |_| crate::network::activation_buffers(network, &backend, rows);
        let (mut activations, mut deltas) = (buffers(0).unwrap(), buffers(1).unwrap());
        let (mut x, mut labels, mut ring) = (vec![0.0; rows * 4], vec![0; rows], vec![f32::NAN; 3]);
        let batch = Batch {
            examples: &set,
            indices: &indices,
            x: &mut x,
            labels: &mut labels,
        };
        let buffers = (&mut activations[..], &mut deltas[..]);
        (network.forward_loss_into(&backend, &params, batch, buffers, (&mut ring, 1))).unwrap();
        let features: Vec<f32> = indices
            .iter()
            .flat_map(|&i| features(&set, i as usize))
            .collect();
        let want_logits = network.logits(&backend, &params, &features).unwrap();
        let want_labels: Vec<u32> = indices
            .iter()
            .map(|&i| u32::from(set.labels()[i as usize]))
            .collect();
        let mut want_d = vec![0.0; want_logits.len()];
        let want_loss = cpu::softmax_cross_entropy(&want_logits, &want_labels, 3, &mut want_d);
        assert_eq!(activations.last().unwrap(), &want_logits, "{name}");
        assert_eq!(deltas.last().unwrap(), &want_d, "{name}");
        assert_eq!(labels, want_labels, "{name}");
        assert!(ring[0].is_nan() && ring[2].is_nan(), "{name}: {ring:?}");
        assert_eq!(ring[1], want_loss, "{name}");
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
        // A whole row and part of another: the error asks for the second row whole.
        let ragged = [x.clone(), x[..3].to_vec()].concat();
        assert_eq!(
            TINY.logits(&CpuBackend, &params, &ragged)
                .unwrap_err()
                .to_string(),
            "logits: x needs 8 elements from its offset but has 7"
        );
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
