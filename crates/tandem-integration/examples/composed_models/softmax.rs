//! A second model type, written against the model seam and nothing else: multinomial logistic
//! regression (a softmax classifier), one linear layer from the layer library. Adding it to
//! the example took this file, its `mod` line and one registration line in `main.rs`.

use tandem_core::{Helpers, ParamSpan};
use tandem_model::layers::Dense;
use tandem_model::Network;
use tandem_tensor::{Activation, Backend};

/// `softmax(x . W + b)` over the classes.
#[derive(Debug, Clone, Copy)]
pub struct SoftmaxClassifier {
    linear: Dense,
}

impl SoftmaxClassifier {
    /// From `inputs` features to `classes` classes.
    pub fn new(inputs: usize, classes: usize) -> Self {
        let linear = Dense {
            ins: inputs,
            outs: classes,
            activation: Activation::Identity,
        };
        Self { linear }
    }
}

impl Network for SoftmaxClassifier {
    fn inputs(&self) -> usize {
        self.linear.ins
    }

    fn classes(&self) -> usize {
        self.linear.outs
    }

    fn layout(&self) -> Vec<ParamSpan> {
        self.linear.layout("linear").into()
    }

    fn activations(&self) -> Vec<usize> {
        vec![self.linear.outs]
    }

    fn forward<B: Backend>(
        &self,
        b: &B,
        params: &B::Buffer,
        x: &B::Buffer,
        rows: usize,
        activations: &mut [B::Buffer],
    ) -> Result<(), B::Error> {
        self.linear
            .forward(b, (params, 0), x, rows, &mut activations[0])
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
        // The input needs no gradient: the layer is the whole network.
        self.linear.backward(
            b,
            (params, 0),
            (x, &activations[0]),
            rows,
            (&mut deltas[0], false),
            (grads, None),
            helpers,
        )
    }
}
