use tandem_core::{
    Alone, Helpers, LossScaler, ParamSpan, Precision, Replica, ReplicaError, Residence, StepLoss,
};
use tandem_pool::Device;
use tandem_tensor::{Backend, CpuBackend, ExampleSet, NarrowCpuBackend, ShapeError};

use crate::layers::Batch;
use crate::network::{activation_buffers, logits_of, logits_of_mut};
use crate::{Mlp, Network};

/// One copy of a [`Network`] on one backend, with its parameters, gradients, batch buffers
/// and a resident copy of the training set: what trains any network with any strategy, on any
/// device ([`tandem_core::Replica`]). The network writes only its math.
pub struct NetworkReplica<N: Network, B: Backend> {
    network: N,
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
    /// An `f16` replica's loss scaling.
    scaler: Option<LossScaler>,
    /// Declared last so that it is dropped last: a device backend's buffers must be freed while
    /// its context is still alive.
    backend: B,
}

/// The replica of a multi-layer perceptron.
pub type MlpReplica<B> = NetworkReplica<Mlp, B>;

/// What one batch of examples needs on the backend: inputs and labels, the network's
/// activations and the gradients of the loss with respect to them.
struct BatchBuffers<B: Backend> {
    x: B::Buffer,
    labels: B::Labels,
    activations: Vec<B::Buffer>,
    deltas: Vec<B::Buffer>,
}

impl<B: Backend> BatchBuffers<B> {
    /// Buffers for batches of up to `rows` examples of `network`.
    fn new(backend: &B, network: &impl Network, rows: usize) -> Result<Self, B::Error> {
        Ok(Self {
            x: backend.zeros(rows * network.inputs())?,
            labels: backend.zero_labels(rows)?,
            activations: activation_buffers(network, backend, rows)?,
            deltas: activation_buffers(network, backend, rows)?,
        })
    }
}

impl<N: Network, B: Backend> NetworkReplica<N, B> {
    /// A replica with zero parameters (set them with [`Replica::set_params`]) and buffers for
    /// batches of up to `max_batch` examples drawn from `training`. On an `f16` backend its
    /// passes are loss-scaled from [`LossScaler::DEFAULT_INITIAL`] (see
    /// [`with_initial_loss_scale`](Self::with_initial_loss_scale)). Fails where `training`'s
    /// examples are not the network's inputs, or one of its labels is not one of its classes.
    pub fn new(
        network: N,
        backend: B,
        training: &ExampleSet,
        max_batch: usize,
    ) -> Result<Self, B::Error> {
        ShapeError::check_exact("replica", "examples", network.inputs(), training.features())?;
        // Refused here, on every backend alike: a device step, which leaves its loss on the
        // device, could not say so, and would make the loss NaN.
        let classes = network.classes();
        let outside = training
            .labels()
            .iter()
            .find(|&&label| usize::from(label) >= classes);
        if let Some(&bad) = outside {
            return Err(tandem_tensor::check::bad_label("replica", bad.into(), classes).into());
        }
        let capacity = max_batch.max(1);
        let params = backend.zeros(network.num_params())?;
        let grads = backend.zeros(network.num_params())?;
        let scaler = Precision::new(backend.dtype()).scaler();
        Ok(Self {
            layout: network.layout(),
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
            batch: BatchBuffers::new(&backend, &network, capacity)?,
            scaler,
            network,
            backend,
        })
    }

    /// Starts a loss-scaled replica's scale at `scale` (a power of two,
    /// [`tandem_core::check_loss_scale`]); a replica that does not scale ignores it.
    pub fn with_initial_loss_scale(mut self, scale: f32) -> Self {
        if let Some(scaler) = &mut self.scaler {
            *scaler = LossScaler::new(scale);
        }
        self
    }

    /// The backend this replica computes on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// [`step`](Self::step), loss-scaled where the replica scales: the pass ends by taking the
    /// scale off its gradients (`Backend::unscale`, inside the step, so that what a store does
    /// after it sees them unscaled), and a pass whose gradients were not all finite halves the
    /// scale and computes the batch again ([`LossScaler`]), the store's work after the step
    /// included.
    fn scaled_step(
        &mut self,
        lent: Option<&B::Buffer>,
        batch: &[u32],
        helpers: &dyn Helpers,
    ) -> Result<StepLoss, ReplicaError> {
        let Some(mut scaler) = self.scaler else {
            return Ok(self.step(lent, batch, helpers, false)?);
        };
        let outcome = loop {
            if !self.backend.set_loss_scale(scaler.scale())? {
                let dtype = self.backend.dtype();
                break Err(format!("a {dtype} backend that cannot scale the loss").into());
            }
            let loss = self.step(lent, batch, helpers, true)?;
            match scaler.record(self.backend.unscaled_finite()?) {
                Ok(true) => break Ok(loss),
                Ok(false) => {}
                Err(e) => break Err(e.into()),
            }
            // The pass is thrown away, and with it the loss it left on the device.
            if matches!(loss, StepLoss::OnDevice) {
                self.losses.forget_last();
            }
            self.backend.repeat_after_step();
        };
        self.scaler = Some(scaler);
        outcome
    }

    fn grow(&mut self, rows: usize) -> Result<(), B::Error> {
        self.batch = BatchBuffers::new(&self.backend, &self.network, rows)?;
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
        scaled: bool,
    ) -> Result<StepLoss, B::Error> {
        let rows = batch.len();
        if rows > self.capacity {
            self.grow(rows)?;
        }
        let classes = self.network.classes();
        let resident = self.residence.is_some();
        let params_len = self.network.num_params();
        let Self {
            capacity,
            network,
            examples,
            params: own,
            grads,
            batch: buffers,
            losses,
            backend,
            ..
        } = self;
        let params = lent.unwrap_or(own);
        // A device replica's loss goes to its slot in the ring from inside the step (which the
        // backend may replay as one graph: the slot is one of the step's inputs).
        let slot = match resident {
            true => Some(losses.slot(backend)?),
            false => None,
        };
        let mut known = None;
        let outcome = backend.replay(replay_key(*capacity, rows), &mut |b| {
            let BatchBuffers {
                x,
                labels,
                activations,
                deltas,
            } = buffers;
            let gathered = Batch {
                examples,
                indices: batch,
                x: &mut *x,
                labels: &mut *labels,
            };
            match slot {
                // The loss stays on the device: the network may fuse its last operation with it.
                Some(slot) => {
                    let buffers = (&mut activations[..], &mut deltas[..]);
                    let loss = (&mut losses.ring, slot);
                    network.forward_loss_into(b, params, gathered, buffers, loss)?;
                }
                None => {
                    network.forward_batch(b, params, gathered, activations)?;
                    let logits = logits_of(activations)?;
                    let dlogits = logits_of_mut(deltas)?;
                    let mean = b.softmax_cross_entropy(logits, labels, rows, classes, dlogits)?;
                    known = Some(mean);
                }
            }
            network.backward(b, params, x, rows, activations, deltas, grads, helpers)?;
            match scaled {
                true => b.unscale((grads, 0), params_len),
                false => Ok(()),
            }
        });
        if let Err(e) = outcome {
            if slot.is_some() {
                losses.forget_last(); // the step left no loss there
            }
            return Err(e);
        }
        Ok(known.map_or(StepLoss::OnDevice, StepLoss::Known))
    }
}

/// The key under which a backend replays a step ([`Backend::replay`]): the sequence is the same
/// for a row count and the buffers of one capacity (growing them replaces the buffers a
/// captured sequence names). Batches have fewer than 2^32 rows.
fn replay_key(capacity: usize, rows: usize) -> u64 {
    (capacity as u64) << 32 | rows as u64
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

    /// Forgets the loss of the last [`slot`](Self::slot) (a pass computed again).
    fn forget_last(&mut self) {
        if self.pending > 0 {
            self.pending -= 1;
            self.next = (self.next + LOSS_RING - 1) % LOSS_RING;
        }
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

impl<N: Network, B: Backend> Replica for NetworkReplica<N, B> {
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
        self.scaled_step(None, batch, &Alone)
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
        let needed = self.network.num_params();
        ShapeError::check_exact("compute_gradients_from", "params", needed, params.len())
            .map_err(B::Error::from)?;
        Ok(Some(self.scaled_step(Some(view), batch, helpers)?))
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

    fn loss_scaling(&self) -> Option<LossScaler> {
        self.scaler
    }

    fn dtype(&self) -> tandem_core::DType {
        self.backend.dtype()
    }
}

/// Opens a replica of `network` on `device` for batches of up to `max_batch` examples of
/// `training`, computing in `precision`: on the host for CPU and simulated workers (`f32` on
/// [`CpuBackend`], `bf16` and `f16` on [`NarrowCpuBackend`]), on the GPU for a CUDA device (in
/// a build with this crate's `cuda` feature, `tandem_kernels::CudaBackend::with_dtype`, which
/// refuses 16-bit types on GPUs without tensor cores for them; without the feature, an error
/// saying so).
pub fn open_replica<N: Network>(
    network: N,
    device: &Device,
    training: &ExampleSet,
    max_batch: usize,
    precision: Precision,
) -> Result<Box<dyn Replica>, ReplicaError> {
    match device {
        Device::Cpu { .. } | Device::Sim { .. } => match NarrowCpuBackend::new(precision.compute) {
            None => Ok(Box::new(NetworkReplica::new(
                network, CpuBackend, training, max_batch,
            )?)),
            Some(narrow) => Ok(Box::new(
                NetworkReplica::new(network, narrow, training, max_batch)?
                    .with_initial_loss_scale(precision.initial_loss_scale),
            )),
        },
        #[cfg(feature = "cuda")]
        Device::Cuda { ordinal } => {
            let backend = tandem_kernels::CudaBackend::with_dtype(*ordinal, precision.compute)?;
            Ok(Box::new(
                NetworkReplica::new(network, backend, training, max_batch)?
                    .with_initial_loss_scale(precision.initial_loss_scale),
            ))
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda { .. } => Err(format!("{device} needs a build with `--features cuda`").into()),
    }
}

#[cfg(test)]
mod tests {
    use tandem_core::DType;

    use super::*;

    /// A ring of losses on the host, every slot at first NaN (never a loss a step records).
    fn ring() -> DeviceLosses<CpuBackend> {
        DeviceLosses {
            ring: vec![f32::NAN; LOSS_RING],
            next: 0,
            pending: 0,
            spilled: Vec::new(),
        }
    }

    /// Records step `step`'s loss as the step's own number, so that what is taken names the
    /// steps it came from; the slot it went to.
    fn record(losses: &mut DeviceLosses<CpuBackend>, step: usize) -> usize {
        let slot = losses.slot(&CpuBackend).unwrap();
        losses.ring[slot] = step as f32;
        slot
    }

    fn take(losses: &mut DeviceLosses<CpuBackend>) -> Vec<f32> {
        let mut taken = Vec::new();
        losses.take(&CpuBackend, &mut taken).unwrap();
        taken
    }

    fn steps(steps: std::ops::Range<usize>) -> Vec<f32> {
        steps.map(|step| step as f32).collect()
    }

    #[test]
    fn device_losses_are_taken_oldest_first_and_once_across_the_rings_end() {
        let mut losses = ring();
        for step in 0..1000 {
            assert_eq!(record(&mut losses, step), step);
        }
        assert_eq!(take(&mut losses), steps(0..1000));
        assert_eq!(take(&mut losses), [], "taken twice");
        // The next 500 wrap around the ring's end: 24 slots before it, 476 after.
        for step in 1000..1500 {
            assert_eq!(record(&mut losses, step), step % LOSS_RING);
        }
        let mut taken = vec![-1.0];
        losses.take(&CpuBackend, &mut taken).unwrap();
        assert_eq!(taken[0], -1.0, "appended to what was there");
        assert_eq!(taken[1..], steps(1000..1500));
    }

    #[test]
    fn a_full_ring_moves_to_the_host_and_no_loss_is_lost() {
        let mut losses = ring();
        let count = 2 * LOSS_RING + 5;
        for step in 0..count {
            record(&mut losses, step);
        }
        assert_eq!(losses.spilled.len(), 2 * LOSS_RING, "spilled when full");
        assert_eq!(take(&mut losses), steps(0..count));
        assert!(losses.spilled.is_empty());
    }

    #[test]
    fn a_forgotten_loss_gives_its_slot_to_the_next_step() {
        let mut losses = ring();
        for step in 0..3 {
            record(&mut losses, step);
        }
        losses.forget_last();
        assert_eq!(record(&mut losses, 3), 2);
        assert_eq!(take(&mut losses), [0.0, 1.0, 3.0]);
        // Nothing pending: nothing to forget, and the next slot stays where it was.
        losses.forget_last();
        assert_eq!(record(&mut losses, 4), 3);
        assert_eq!(take(&mut losses), [4.0]);
        // Forgetting the ring's last slot goes back across its end.
        for step in 5..5 + LOSS_RING - 4 {
            record(&mut losses, step);
        }
        assert_eq!(losses.next, 0);
        losses.forget_last();
        assert_eq!(record(&mut losses, 0), LOSS_RING - 1);
        assert_eq!(losses.pending, LOSS_RING - 4);
    }

    #[test]
    fn a_step_is_replayed_under_a_key_of_its_row_count_and_its_buffers_capacity() {
        let keys = [
            (100, 100),
            (100, 50),
            (200, 100),
            (200, 50),
            (1, 1),
            (60_000, 60_000),
        ];
        for (i, &(capacity, rows)) in keys.iter().enumerate() {
            let key = replay_key(capacity, rows);
            assert_eq!(
                (key >> 32, key & 0xffff_ffff),
                (capacity as u64, rows as u64)
            );
            for &(other_capacity, other_rows) in &keys[i + 1..] {
                assert_ne!(key, replay_key(other_capacity, other_rows));
            }
        }
    }

    /// A network of 3 inputs, 4 hidden units and 2 classes, and 10 examples.
    fn tiny() -> (Mlp, ExampleSet) {
        let pixels = (0..30).map(|v| (v * 37 % 256) as u8).collect();
        let labels = vec![0, 1, 0, 1, 1, 0, 0, 1, 1, 0];
        let examples = ExampleSet::new(3, pixels, labels).unwrap();
        (Mlp::new(3, &[4], 2).unwrap(), examples)
    }

    fn params(mlp: &Mlp) -> Vec<f32> {
        (0..mlp.num_params())
            .map(|i| (i as f32 * 0.37).sin() * 0.5)
            .collect()
    }

    #[test]
    fn a_label_past_the_classes_is_refused_when_the_replica_opens() {
        let (mlp, examples) = tiny();
        let mut labels = examples.labels().to_vec();
        labels[7] = 2; // the first past the 2 classes, after a 0 and a 1 that are not
        labels[8] = 5;
        let bad = ExampleSet::new(3, examples.values().to_vec(), labels).unwrap();
        let expected = tandem_tensor::check::bad_label("replica", 2, 2);
        let cpu = NetworkReplica::new(mlp.clone(), CpuBackend, &bad, 4).err();
        assert_eq!(cpu, Some(expected.clone()));
        let bf16 = NarrowCpuBackend::new(DType::BF16).unwrap();
        assert_eq!(
            NetworkReplica::new(mlp.clone(), bf16, &bad, 4).err(),
            Some(expected)
        );
        assert!(NetworkReplica::new(mlp, CpuBackend, &examples, 4).is_ok());
    }

    #[test]
    fn a_replica_states_its_networks_layout_examples_and_type() {
        let (mlp, examples) = tiny();
        let layout = mlp.layout();
        let mut f32_replica = NetworkReplica::new(mlp.clone(), CpuBackend, &examples, 4).unwrap();
        assert_eq!(f32_replica.layout(), layout);
        assert_eq!(f32_replica.training_examples(), 10);
        assert_eq!(f32_replica.dtype(), DType::F32);
        assert!(f32_replica.residence().is_none(), "on the host");
        assert!(f32_replica.loss_scaling().is_none());
        f32_replica.bind_thread().unwrap();
        let params = params(&mlp);
        f32_replica
            .set_params(&mut |p| p.copy_from_slice(&params))
            .unwrap();
        let loss = f32_replica.compute_gradients(&[0, 1, 2]).unwrap();
        assert!(
            matches!(loss, StepLoss::Known(l) if l.is_finite()),
            "{loss:?}"
        );
        let mut losses = Vec::new();
        f32_replica.take_losses(&mut losses).unwrap();
        assert_eq!(
            losses,
            [],
            "a host replica's losses are known when computed"
        );
        for (dtype, scaled) in [(DType::BF16, false), (DType::F16, true)] {
            let backend = NarrowCpuBackend::new(dtype).unwrap();
            let replica = NetworkReplica::new(mlp.clone(), backend, &examples, 4)
                .unwrap()
                .with_initial_loss_scale(1024.0);
            assert_eq!(replica.dtype(), dtype);
            let scale = replica.loss_scaling().map(|s| s.scale());
            assert_eq!(scale, scaled.then_some(1024.0), "{dtype}");
        }
    }

    /// An f16 pass whose scaled gradients overflow halves the scale and computes the batch
    /// again, until they fit: the gradients kept are those of the first scale that fits.
    #[test]
    fn an_f16_replica_whose_scale_overflows_halves_it_and_keeps_the_pass_that_fits() {
        let (mlp, examples) = tiny();
        let params = params(&mlp);
        let replica = |scale: f32| {
            let backend = NarrowCpuBackend::new(DType::F16).unwrap();
            let mut replica = NetworkReplica::new(mlp.clone(), backend, &examples, 4)
                .unwrap()
                .with_initial_loss_scale(scale);
            replica
                .set_params(&mut |p| p.copy_from_slice(&params))
                .unwrap();
            replica
        };
        let too_high = 2f32.powi(40);
        let mut overflowed = replica(too_high);
        overflowed.compute_gradients(&[1, 4, 7]).unwrap();
        let scaler = overflowed.loss_scaling().unwrap();
        let kept = scaler.scale();
        assert!(kept < too_high, "the scale was not halved");
        assert_eq!(
            scaler.overflows(),
            u64::from((too_high / kept).log2() as u32)
        );
        let mut fitting = replica(kept);
        fitting.compute_gradients(&[1, 4, 7]).unwrap();
        assert_eq!(fitting.loss_scaling().unwrap().overflows(), 0);
        let grads = |replica: &mut NetworkReplica<Mlp, NarrowCpuBackend>| {
            let mut grads = Vec::new();
            replica.read_gradients(&mut |g| grads = g.to_vec()).unwrap();
            grads
        };
        let kept_grads = grads(&mut overflowed);
        assert!(kept_grads.iter().all(|g| g.is_finite()));
        assert!(kept_grads.iter().any(|&g| g != 0.0));
        assert_eq!(kept_grads, grads(&mut fitting));
    }
}
