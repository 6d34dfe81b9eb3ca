//! A model for the crate's tests: replicas of one parameter, fitted to 3 or given a constant
//! slope, on 40 examples.

use std::sync::LazyLock;

use tandem_core::{ParamSpan, Replica, ReplicaError, StepLoss};
use tandem_optim::Sgd;
use tandem_pool::Device;
use tandem_strategy::Batches;

use crate::{
    AsyncRule, BatchScaling, Exchange, Fresh, Length, Mode, Model, ModelId, Precision,
    StalenessBound, Start, Warmup,
};

const EXAMPLES: usize = 40;
pub(crate) static LAYOUT: LazyLock<Vec<ParamSpan>> =
    LazyLock::new(|| vec![ParamSpan::new("w", [1], true)]);

/// What a [`Scalar`] replica's one parameter `w` learns.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) enum Fit {
    /// `w` fitted to 3 on examples `x = i / 10`.
    #[default]
    Three,
    /// A constant slope, loss `SLOPE * w`: every gradient is the same, whatever parameters
    /// it was computed on, so an asynchronous run's result depends only on the order in
    /// which its updates' steps land: step order for one worker, and across ranks on any
    /// interleaving of the workers.
    Slope,
}

pub(crate) const SLOPE: f32 = 0.25;

#[derive(Default)]
pub(crate) struct Scalar {
    fit: Fit,
    w: f32,
    grad: f32,
}

impl Replica for Scalar {
    fn layout(&self) -> &[ParamSpan] {
        &LAYOUT
    }
    fn set_params(&mut self, fill: &mut dyn FnMut(&mut [f32])) -> Result<(), ReplicaError> {
        let mut p = [0.0];
        fill(&mut p);
        self.w = p[0];
        Ok(())
    }
    fn compute_gradients(&mut self, batch: &[u32]) -> Result<StepLoss, ReplicaError> {
        if let Fit::Slope = self.fit {
            self.grad = SLOPE;
            return Ok(StepLoss::Known(SLOPE * self.w));
        }
        let n = batch.len() as f32;
        let (mut loss, mut grad) = (0.0, 0.0);
        for &i in batch {
            let x = i as f32 / 10.0;
            let err = (self.w - 3.0) * x;
            loss += 0.5 * err * err / n;
            grad += err * x / n;
        }
        self.grad = grad;
        Ok(StepLoss::Known(loss))
    }
    fn read_gradients(&mut self, read: &mut dyn FnMut(&[f32])) -> Result<(), ReplicaError> {
        read(&[self.grad]);
        Ok(())
    }
    fn training_examples(&self) -> usize {
        EXAMPLES
    }
}

/// The model of [`Scalar`] replicas that learn [`Fit::Three`].
pub(crate) const SCALAR: ScalarModel = ScalarModel(Fit::Three);

pub(crate) struct ScalarModel(pub(crate) Fit);

impl Model for ScalarModel {
    type Replica = Scalar;
    fn id(&self) -> ModelId {
        ModelId::new("scalar-test-v1", "1")
    }
    fn layout(&self) -> Vec<ParamSpan> {
        LAYOUT.clone()
    }
    fn training_examples(&self) -> usize {
        EXAMPLES
    }
    fn open(&self, _: &Device, _: usize, _: Precision) -> Result<Scalar, ReplicaError> {
        Ok(Scalar {
            fit: self.0,
            ..Scalar::default()
        })
    }
}

pub(crate) fn fresh(mode: Mode, steps: u64) -> Start<Sgd> {
    Start::Fresh(Fresh {
        mode,
        async_rule: AsyncRule::DEFAULT,
        async_warmup: Warmup::Auto,
        async_bound: StalenessBound::Unbounded,
        lr_scaling: BatchScaling::Auto,
        optimizer: Sgd {
            learning_rate: 0.5,
            ..Sgd::DEFAULT
        },
        batches: Batches {
            batch_size: 5,
            seed: 1,
        },
        length: Length::Steps(steps),
        save_every: Some(4),
        params: vec![0.0],
        precision: Precision::F32,
        exchange: Exchange::F32,
    })
}
