use tandem_core::{ParamSpan, Replica, ReplicaError};
use tandem_tensor::{Backend, ExampleSet, Gemm};

use crate::Mlp;

/// One copy of an [`Mlp`] on one backend, with its parameters, gradients, batch buffers and a
/// resident copy of the training set.
pub struct MlpReplica<B: Backend> {
    mlp: Mlp,
    layout: Vec<ParamSpan>,
    examples: B::Examples,
    training_examples: usize,
    params: B::Buffer,
    grads: B::Buffer,
    capacity: usize,
    batch: BatchBuffers<B>,
    /// Declared last so that it is dropped last: a device backend's buffers must be freed while
    /// its context is still alive.
    backend: B,
}

/// What one batch of examples needs on the backend: inputs and labels, the activations and
/// the gradients of the loss with respect to them.
struct BatchBuffers<B: Backend> {
    x: B::Buffer,
    labels: B::Labels,
    hidden: B::Buffer,
    logits: B::Buffer,
    dlogits: B::Buffer,
    dhidden: B::Buffer,
}

impl<B: Backend> BatchBuffers<B> {
    /// Buffers for batches of up to `rows` examples of `mlp`.
    fn new(backend: &B, mlp: &Mlp, rows: usize) -> Result<Self, B::Error> {
        Ok(Self {
            x: backend.zeros(rows * mlp.inputs)?,
            labels: backend.zero_labels(rows)?,
            hidden: backend.zeros(rows * mlp.hidden)?,
            logits: backend.zeros(rows * mlp.classes)?,
            dlogits: backend.zeros(rows * mlp.classes)?,
            dhidden: backend.zeros(rows * mlp.hidden)?,
        })
    }
}

impl<B: Backend> MlpReplica<B> {
    /// A replica with zero parameters (set them with [`Replica::set_params`]) and buffers for
    /// batches of up to `max_batch` examples drawn from `training`.
    pub fn new(
        mlp: Mlp,
        backend: B,
        training: &ExampleSet,
        max_batch: usize,
    ) -> Result<Self, B::Error> {
        let capacity = max_batch.max(1);
        Ok(Self {
            layout: mlp.layout(),
            examples: backend.upload_examples(training)?,
            training_examples: training.len(),
            params: backend.zeros(mlp.num_params())?,
            grads: backend.zeros(mlp.num_params())?,
            capacity,
            batch: BatchBuffers::new(&backend, &mlp, capacity)?,
            mlp,
            backend,
        })
    }

    /// The backend this replica computes on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    fn grow(&mut self, rows: usize) -> Result<(), B::Error> {
        self.batch = BatchBuffers::new(&self.backend, &self.mlp, rows)?;
        self.capacity = rows;
        Ok(())
    }

    /// The forward and backward pass; see [`Replica::compute_gradients`].
    fn step(&mut self, batch: &[u32]) -> Result<f32, B::Error> {
        let rows = batch.len();
        if rows > self.capacity {
            self.grow(rows)?;
        }
        let Mlp {
            inputs,
            hidden,
            classes,
        } = self.mlp;
        let o = self.mlp.offsets();
        let b = &self.backend;
        b.gather(
            &self.examples,
            batch,
            &mut self.batch.x,
            &mut self.batch.labels,
        )?;
        self.mlp.forward(
            b,
            &self.params,
            &self.batch.x,
            rows,
            &mut self.batch.hidden,
            &mut self.batch.logits,
        )?;
        let loss = b.softmax_cross_entropy(
            &self.batch.logits,
            &self.batch.labels,
            rows,
            classes,
            &mut self.batch.dlogits,
        )?;
        // Layer 2: dW2 = H^T . dL, db2 = colsum(dL), dH = dL . W2^T masked by the ReLU.
        dense_grads(
            b,
            (&self.batch.hidden, hidden),
            (&self.batch.dlogits, classes),
            rows,
            (&mut self.grads, o.w2, o.b2),
        )?;
        let dh = Gemm::nt(rows, hidden, classes);
        b.matmul(
            dh,
            (&self.batch.dlogits, 0),
            (&self.params, o.w2),
            (&mut self.batch.dhidden, 0),
        )?;
        b.relu_backward(&mut self.batch.dhidden, &self.batch.hidden, rows * hidden)?;
        // Layer 1: dW1 = X^T . dH, db1 = colsum(dH). The input gradient is never needed.
        dense_grads(
            b,
            (&self.batch.x, inputs),
            (&self.batch.dhidden, hidden),
            rows,
            (&mut self.grads, o.w1, o.b1),
        )?;
        Ok(loss)
    }
}

/// A dense layer's parameter gradients from its `rows x ins` input and the `rows x outs`
/// gradient of its output: `dW = input^T . delta` at `w` in `grads`, `db = colsum(delta)` at
/// `bias`.
fn dense_grads<B: Backend>(
    b: &B,
    (input, ins): (&B::Buffer, usize),
    (delta, outs): (&B::Buffer, usize),
    rows: usize,
    (grads, w, bias): (&mut B::Buffer, usize, usize),
) -> Result<(), B::Error> {
    b.matmul(
        Gemm::tn(ins, outs, rows),
        (input, 0),
        (delta, 0),
        (grads, w),
    )?;
    b.column_sum(delta, rows, outs, (grads, bias))
}

impl<B: Backend> Replica for MlpReplica<B> {
    fn layout(&self) -> &[ParamSpan] {
        &self.layout
    }

    fn bind_thread(&mut self) -> Result<(), ReplicaError> {
        Ok(self.backend.bind_thread()?)
    }

    fn set_params(&mut self, fill: &mut dyn FnMut(&mut [f32])) -> Result<(), ReplicaError> {
        Ok(self.backend.write_with(&mut self.params, fill)?)
    }

    fn compute_gradients(&mut self, batch: &[u32]) -> Result<f32, ReplicaError> {
        Ok(self.step(batch)?)
    }

    fn read_gradients(&mut self, read: &mut dyn FnMut(&[f32])) -> Result<(), ReplicaError> {
        Ok(self.backend.read_with(&self.grads, read)?)
    }

    fn training_examples(&self) -> usize {
        self.training_examples
    }
}
