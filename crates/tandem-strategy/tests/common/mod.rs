//! What the strategy tests share: a tiny least-squares model (the strategies know nothing of
//! MNIST) whose replicas each test gives its own faults, hangs or logs.
#![allow(dead_code)] // each test binary uses its own part of this module

use tandem_pool::{Device, ParamSpan, Replica, ReplicaError, WorkerPool};
use tandem_strategy::Hyper;

/// The number of training examples of the tiny model.
pub const EXAMPLES: usize = 70;

/// What a test adds to the tiny model's replica.
pub trait Quirks: Send {
    /// Called at the start of the replica's `call`-th gradient computation (counted from 1):
    /// may wait, fail, or answer a loss of its own (`Some`) instead of computing the gradients.
    fn before_gradients(&mut self, call: u64) -> Result<Option<f32>, ReplicaError>;

    /// Hands the gradients to `read`, the strategy reading them.
    fn read_gradients(&mut self, grad: &[f32; 2], read: &mut dyn FnMut(&[f32])) {
        read(grad);
    }
}

/// Fits w to targets 2*x with loss 0.5 * (w.x - 2*x)^2 over x = (i % 7, 1), with the quirks of
/// a test.
pub struct LeastSquares<Q> {
    layout: Vec<ParamSpan>,
    w: [f32; 2],
    grad: [f32; 2],
    /// How many gradient computations were started.
    pub calls: u64,
    pub quirks: Q,
}

impl<Q: Quirks> Replica for LeastSquares<Q> {
    fn layout(&self) -> &[ParamSpan] {
        &self.layout
    }
    fn set_params(&mut self, fill: &mut dyn FnMut(&mut [f32])) -> Result<(), ReplicaError> {
        fill(&mut self.w);
        Ok(())
    }
    fn compute_gradients(&mut self, batch: &[u32]) -> Result<f32, ReplicaError> {
        self.calls += 1;
        if let Some(loss) = self.quirks.before_gradients(self.calls)? {
            return Ok(loss);
        }
        let n = batch.len() as f32;
        let (mut loss, mut grad) = (0.0, [0.0; 2]);
        for &i in batch {
            let x = [(i % 7) as f32 / 7.0, 1.0];
            let err = self.w[0] * x[0] + self.w[1] * x[1] - 2.0 * x[0];
            loss += 0.5 * err * err / n;
            grad[0] += err * x[0] / n;
            grad[1] += err / n;
        }
        self.grad = grad;
        Ok(loss)
    }
    fn read_gradients(&mut self, read: &mut dyn FnMut(&[f32])) -> Result<(), ReplicaError> {
        self.quirks.read_gradients(&self.grad, read);
        Ok(())
    }
    fn training_examples(&self) -> usize {
        EXAMPLES
    }
}

/// A pool of `workers` CPU replicas, worker `w` with the quirks `quirks(w)`.
pub fn pool<Q: Quirks>(
    workers: usize,
    mut quirks: impl FnMut(usize) -> Q,
) -> WorkerPool<LeastSquares<Q>> {
    let devices = (0..workers).map(|worker| Device::Cpu { worker }).collect();
    WorkerPool::new(devices, |d| {
        let Device::Cpu { worker } = *d else {
            unreachable!("CPU devices only")
        };
        Ok::<_, ReplicaError>(LeastSquares {
            layout: vec![ParamSpan {
                name: "w".into(),
                shape: vec![2],
                weight_decay: true,
            }],
            w: [0.0; 2],
            grad: [0.0; 2],
            calls: 0,
            quirks: quirks(worker),
        })
    })
    .unwrap()
}

/// The tiny model's hyperparameters.
pub fn hyper() -> Hyper {
    Hyper {
        batch_size: 10,
        learning_rate: 0.5,
        ..Hyper::default()
    }
}
