use tandem_core::{Alone, Helpers, ParamSpan, Replica, ReplicaError, Residence, StepLoss};
use tandem_tensor::{Backend, ExampleSet, Gemm, ShapeError};

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
    /// Where the backend computes in device memory: its buffers, for a store on the device.
    residence: Option<Residence>,
    /// The losses of the steps not yet taken, on the device (see [`DeviceLosses`]).
    losses: DeviceLosses<B>,
    capacity: usize,
    batch: BatchBuffers<B>,
    /// Declared last so that it is dropped last: a device backend's buffers must be freed while
    /// its context is still alive.
    backend: B,
}

/// What one batch of examples needs on the backend: inputs and labels, the activations and
/// the gradients of the loss with respect to them.
struct BatchBuffers<B: Backend> {
    /// The step's mean loss, where a device replica leaves it.
    loss: B::Buffer,
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
            loss: backend.zeros(1)?,
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
        let params = backend.zeros(mlp.num_params())?;
        let grads = backend.zeros(mlp.num_params())?;
        Ok(Self {
            layout: mlp.layout(),
            examples: backend.upload_examples(training)?,
            training_examples: training.len(),
            residence: backend.residence(&params, &grads),
            losses: DeviceLosses {
                ring: backend.zeros(LOSS_RING)?,
                next: 0,
                pending: 0,
                spilled: Vec::new(),
            },
            params,
            grads,
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

    /// The forward and backward pass from `lent` parameters, or the replica's own, with
    /// `helpers` that may take part; see [`Replica::compute_gradients`].
    fn step(
        &mut self,
        lent: Option<&B::Buffer>,
        batch: &[u32],
        helpers: &dyn Helpers,
    ) -> Result<StepLoss, B::Error> {
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
        let resident = self.residence.is_some();
        let Self {
            capacity,
            mlp,
            examples,
            params: own,
            grads,
            batch: buffers,
            losses,
            backend,
            ..
        } = self;
        let params = lent.unwrap_or(own);
        // A device replica's loss goes to a fixed place inside the step (which the backend may
        // replay as one graph) and is copied to its slot after it.
        let mut known = None;
        // The sequence is the same for a row count and the buffers of one capacity (growing
        // them replaces the buffers a captured sequence names).
        let key = (*capacity as u64) << 32 | rows as u64;
        backend.replay(key, &mut |b| {
            b.gather(examples, batch, &mut buffers.x, &mut buffers.labels)?;
            mlp.forward(
                b,
                params,
                &buffers.x,
                rows,
                &mut buffers.hidden,
                &mut buffers.logits,
            )?;
            let (logits, labels) = (&buffers.logits, &buffers.labels);
            if resident {
                let dlogits = &mut buffers.dlogits;
                let loss = (&mut buffers.loss, 0);
                b.softmax_cross_entropy_into(logits, labels, (rows, classes), dlogits, loss)?;
            } else {
                let dlogits = &mut buffers.dlogits;
                known = Some(b.softmax_cross_entropy(logits, labels, rows, classes, dlogits)?);
            }
            // Layer 2: dW2 = H^T . dL, db2 = colsum(dL), dH = dL . W2^T masked by the ReLU.
            dense_grads(
                b,
                (&buffers.hidden, hidden),
                (&buffers.dlogits, classes),
                rows,
                (grads, o.w2, o.b2),
                &Alone,
            )?;
            let dh = Gemm::nt(rows, hidden, classes);
            b.matmul(
                dh,
                (&buffers.dlogits, 0),
                (params, o.w2),
                (&mut buffers.dhidden, 0),
            )?;
            b.relu_backward(&mut buffers.dhidden, &buffers.hidden, rows * hidden)?;
            // Layer 1: dW1 = X^T . dH, db1 = colsum(dH). The input gradient is never needed.
            // The step's largest product, and its last: the one idle workers can take part in.
            dense_grads(
                b,
                (&buffers.x, inputs),
                (&buffers.dhidden, hidden),
                rows,
                (grads, o.w1, o.b1),
                helpers,
            )
        })?;
        if let Some(loss) = known {
            return Ok(StepLoss::Known(loss));
        }
        let slot = losses.slot(backend)?;
        backend.copy((&buffers.loss, 0), (&mut losses.ring, slot), 1)?;
        Ok(StepLoss::OnDevice)
    }
}

/// Losses a device replica keeps: at least as many as a strategy lets wait on the device
/// before it takes them.
const LOSS_RING: usize = 1024;

/// The step losses of a replica whose backend computes on a device, left there by each step
/// and read by [`Replica::take_losses`]: a ring of [`LOSS_RING`] slots, the oldest `pending`
/// of them untaken. A step that finds the ring full first moves it to the host (`spilled`), so
/// nothing is lost even if the losses are taken late.
struct DeviceLosses<B: Backend> {
    ring: B::Buffer,
    next: usize,
    pending: usize,
    spilled: Vec<f32>,
}

impl<B: Backend> DeviceLosses<B> {
    /// The slot for the next step's loss.
    fn slot(&mut self, backend: &B) -> Result<usize, B::Error> {
        if self.pending == LOSS_RING {
            let mut taken = std::mem::take(&mut self.spilled);
            self.take(backend, &mut taken)?;
            self.spilled = taken;
        }
        let slot = self.next;
        self.next = (self.next + 1) % LOSS_RING;
        self.pending += 1;
        Ok(slot)
    }

    /// Appends the untaken losses to `out`, oldest first.
    fn take(&mut self, backend: &B, out: &mut Vec<f32>) -> Result<(), B::Error> {
        out.append(&mut self.spilled);
        let first = (self.next + LOSS_RING - self.pending) % LOSS_RING;
        let start = out.len();
        out.resize(start + self.pending, 0.0);
        // At most two pieces: from the oldest to the ring's end, then from its start.
        let head = self.pending.min(LOSS_RING - first);
        backend.download(&self.ring, first, &mut out[start..start + head])?;
        backend.download(&self.ring, 0, &mut out[start + head..])?;
        self.pending = 0;
        Ok(())
    }
}

/// A dense layer's parameter gradients from its `rows x ins` input and the `rows x outs`
/// gradient of its output: `dW = input^T . delta` at `w` in `grads`, `db = colsum(delta)` at
/// `bias`; `helpers` may take part in `dW`.
fn dense_grads<B: Backend>(
    b: &B,
    (input, ins): (&B::Buffer, usize),
    (delta, outs): (&B::Buffer, usize),
    rows: usize,
    (grads, w, bias): (&mut B::Buffer, usize, usize),
    helpers: &dyn Helpers,
) -> Result<(), B::Error> {
    b.matmul_shared(
        Gemm::tn(ins, outs, rows),
        (input, 0),
        (delta, 0),
        (grads, w),
        helpers,
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

    fn compute_gradients(&mut self, batch: &[u32]) -> Result<StepLoss, ReplicaError> {
        Ok(self.step(None, batch, &Alone)?)
    }

    fn compute_gradients_from(
        &mut self,
        params: &Vec<f32>,
        batch: &[u32],
        helpers: &dyn Helpers,
    ) -> Result<Option<StepLoss>, ReplicaError> {
        let Some(view) = self.backend.host_view(params) else {
            return Ok(None);
        };
        // Too long is as wrong as too short: another model's parameters must not be cut.
        let needed = self.mlp.num_params();
        ShapeError::check_exact("compute_gradients_from", "params", needed, params.len())
            .map_err(B::Error::from)?;
        Ok(Some(self.step(Some(view), batch, helpers)?))
    }

    fn take_losses(&mut self, losses: &mut Vec<f32>) -> Result<(), ReplicaError> {
        Ok(self.losses.take(&self.backend, losses)?)
    }

    fn residence(&self) -> Option<Residence> {
        self.residence.clone()
    }

    fn read_gradients(&mut self, read: &mut dyn FnMut(&[f32])) -> Result<(), ReplicaError> {
        Ok(self.backend.read_with(&self.grads, read)?)
    }

    fn exchange_gradients(&mut self, buffer: &mut Vec<f32>) -> Result<bool, ReplicaError> {
        // Every step writes every gradient (the products overwrite, the column sums start from
        // zero), so what the replica receives needs no clearing.
        Ok(self.backend.exchange(&mut self.grads, buffer))
    }

    fn training_examples(&self) -> usize {
        self.training_examples
    }
}
