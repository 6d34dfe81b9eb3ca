//! [`DeviceAsyncStore`]: asynchronous training's parameters of record in the device memory of
//! replicas that all compute on one device.

use std::sync::{Mutex, MutexGuard};

use tandem_core::{
    DType, DeviceAlloc, DeviceOp, Optimizer, ParamSpan, Replica, ReplicaError, RoundedCopy,
    TrainState,
};

use super::{addresses, lock, upload_state, Devices};
use crate::store::{AsyncStore, ParamStore, UpdateAt};

/// A worker's update between its [`AsyncStore::apply`] and the step that runs it.
#[derive(Default)]
struct Progress {
    /// The update that the worker's next step runs first.
    pending: Option<UpdateAt>,
    /// From the load that hands `pending` to the next step until the worker's next apply: the
    /// update is then neither in the store's hands nor surely queued, for a reader on another
    /// thread.
    in_step: bool,
}

/// The parameters of record and the optimiser's state of asynchronous training, in the device
/// memory of replicas that all compute on one device, whose queues run in one order
/// ([`tandem_core::DeviceQueue::share_order`]).
///
/// **Each worker's update runs first in its next step, inside that step's graph**, as a lone
/// replica's does ([`super::DeviceSyncStore`]): `apply` only notes the update, and the next
/// `load` puts it around the step. The update writes the parameters of record, the optimiser's
/// state, and the worker's own parameters in the same pass (a [`RoundedCopy`]: rounded where
/// the replicas compute in a narrower type, else as they are), so the step then computes from
/// the record as it is, with every update queued before it: a step is one launch, with no
/// copies and no events. The order of updates is the order in which the workers' steps reach
/// the one queue; as no two run at once, none is lost. What a worker's update waits for is its
/// own next step: the others see it from then on (a push and the next pull in one, as a
/// parameter server's "push-pull"). Staleness is what the strategy counts, the updates begun
/// between a worker's load and its own, as with the host's store. A save runs the updates still
/// waiting, on their workers' queues; a worker's L2 term runs its own first.
pub struct DeviceAsyncStore<'o, O: Optimizer + ?Sized> {
    devices: Devices<'o, O>,
    params: Box<dyn DeviceAlloc>,
    /// The optimiser's state vectors.
    state: Vec<Box<dyn DeviceAlloc>>,
    /// What each update writes beside the record: its worker's parameters, as it computes in.
    copy: DType,
    /// Each worker's, by worker.
    progress: Vec<Mutex<Progress>>,
}

impl<'o, O: Optimizer + ?Sized> DeviceAsyncStore<'o, O> {
    /// A store for `replicas`, holding `state`, if they can have one (see the module): every
    /// replica is resident, all in the same memory, their queues run in one order and copy the
    /// parameters as their updates write them, and `optimizer` has a device update that their
    /// queues run. `None` otherwise (the host store serves them). `state` must fit `layout` and
    /// `optimizer` (the strategies check it first).
    pub fn open<R: Replica>(
        replicas: &[R],
        state: &TrainState,
        layout: &[ParamSpan],
        optimizer: &'o O,
    ) -> Result<Option<Self>, ReplicaError> {
        let Some((devices, _)) = Devices::open(
            replicas,
            state,
            layout,
            optimizer,
            (None, |fleet: &_| fleet.one_device),
        )?
        else {
            return Ok(None);
        };
        let copy = devices.copy.unwrap_or(DType::F32);
        let queue = devices.members[0].queue();
        if !devices.members.iter().all(|m| m.queue().rounds_to(copy)) {
            return Ok(None);
        }
        // A refusal after some joined leaves those in one order: harmless, as the host's store
        // then serves them, and one order only serialises their work.
        for member in &devices.members[1..] {
            if !member.queue().share_order(queue)? {
                return Ok(None);
            }
        }
        queue.bind()?;
        let params = queue.alloc(devices.len, DType::F32)?;
        // Only the record: each worker's first `load` copies it into the worker's replica on
        // the device.
        // SAFETY: the buffer was just allocated with `len` values.
        unsafe { queue.write(params.address(), &state.params)? };
        let slots = upload_state(queue, state)?;
        let progress = devices.members.iter().map(|_| Mutex::default()).collect();
        Ok(Some(Self {
            devices,
            params,
            state: slots,
            copy,
            progress,
        }))
    }

    /// `worker`'s update `at`: its values uploaded, then the update of the record from the
    /// worker's gradients, writing its parameters too.
    fn update(&self, worker: usize, at: UpdateAt) -> Result<Vec<DeviceOp>, ReplicaError> {
        let devices = &self.devices;
        let residence = &devices.members[worker].residence;
        let copy = RoundedCopy {
            params: residence.params,
            dtype: self.copy,
        };
        let mut ops = vec![devices.hyper_upload(worker, at)?];
        ops.extend(devices.update_ops(
            worker,
            (self.params.address(), &addresses(&self.state), Some(copy)),
            &[residence.grads],
            0..devices.len,
        ));
        Ok(ops)
    }

    /// Queues `worker`'s pending update on its own queue, on its own (outside a step).
    fn run_pending(&self, worker: usize, progress: &mut Progress) -> Result<(), ReplicaError> {
        if let Some(at) = progress.pending {
            let queue = self.devices.members[worker].queue();
            queue.bind()?;
            // SAFETY: the store's buffers and the worker's hold `len` values; the queues run in
            // one order, so the worker's last step (which wrote the gradients) is before it.
            unsafe { queue.run(&self.update(worker, at)?)? };
            // Only once queued: a failure leaves it waiting.
            progress.pending = None;
        }
        Ok(())
    }

    /// Every worker's progress, locked in worker order (no worker holds its own while taking
    /// another's), with the updates still waiting queued on their workers' queues: the record
    /// then holds every update applied so far, for as long as the locks are held. An error
    /// while a worker's step is taking its update (see [`Progress::in_step`]).
    fn settled(&self) -> Result<Vec<MutexGuard<'_, Progress>>, ReplicaError> {
        let mut all: Vec<_> = self.progress.iter().map(lock).collect();
        if all.iter().any(|p| p.in_step) {
            return Err("an update is being taken into a step".into());
        }
        for (worker, progress) in all.iter_mut().enumerate() {
            self.run_pending(worker, progress)?;
        }
        Ok(all)
    }
}

impl<R: Replica, O: Optimizer + ?Sized> ParamStore<R> for DeviceAsyncStore<'_, O> {
    /// Puts the worker's update around its next step, which then computes from what that
    /// update leaves; where it has none (its first step, or a step computed again), copies the
    /// record as it is into the replica.
    fn load(&self, worker: usize, _: &mut R) -> Result<(), ReplicaError> {
        let member = &self.devices.members[worker];
        let queue = member.queue();
        let mut progress = lock(&self.progress[worker]);
        if let Some(at) = progress.pending {
            let ops = self.update(worker, at)?;
            // SAFETY: every address is the store's or the replica's, of the lengths given,
            // alive as long as the store; the queues run in one order.
            unsafe { queue.around_next_step(ops, Vec::new())? };
            progress.pending = None;
            progress.in_step = true;
            return Ok(());
        }
        let (params, len) = (member.residence.params, self.devices.len);
        // The record as it is, rounded to the replica's type on the device: nothing waits for
        // the other workers' steps queued before it.
        let copy = [
            DeviceOp::Copy {
                dst: params,
                src: self.params.address(),
                len,
                dtype: DType::F32,
            },
            DeviceOp::Round {
                at: params,
                len,
                dtype: self.copy,
            },
        ];
        // SAFETY: both hold the `len` parameters; the queues run in one order and round to the
        // replicas' type (`open` checked it).
        unsafe { queue.run(&copy) }
    }

    /// The record with `worker`'s update queued first, on its own (its next step then copies
    /// the record instead): the others' may still wait for their next steps (at most one a
    /// worker).
    fn l2_loss(&self, worker: usize, weight_decay: f32) -> Result<f32, ReplicaError> {
        self.run_pending(worker, &mut lock(&self.progress[worker]))?;
        let queue = self.devices.members[worker].queue();
        queue.bind()?;
        // SAFETY: the record holds the `len` parameters in this device's memory, and the queues
        // run in one order.
        unsafe { (self.devices).l2_loss(queue, self.params.address(), weight_decay) }
    }

    fn save_into(&self, state: &mut TrainState) -> Result<(), ReplicaError> {
        (self.devices).save_into(state, |params, slots| {
            let _settled = self.settled()?;
            let queue = self.devices.members[0].queue();
            // SAFETY: both hold the `len` values; the reads wait for every queue's work (one
            // order), the updates just queued among it.
            unsafe {
                queue.read(self.params.address(), params)?;
                for (slot, values) in self.state.iter().zip(slots.iter_mut()) {
                    queue.read(slot.address(), values)?;
                }
            }
            Ok(())
        })
    }

    fn empty_state(&self, step: u64) -> TrainState {
        self.devices.empty_state(step)
    }
}

impl<R: Replica, O: Optimizer + ?Sized> AsyncStore<R> for DeviceAsyncStore<'_, O> {
    fn apply(
        &self,
        (worker, _): (usize, usize),
        _: &mut R,
        begin: &mut dyn FnMut() -> UpdateAt,
    ) -> Result<bool, ReplicaError> {
        let queue = self.devices.members[worker].queue();
        if queue.step_ops_pending() {
            return Err(
                "the replica's step did not take the store's work around it (its backend \
                 must run `DeviceQueue::around_next_step`'s operations)"
                    .into(),
            );
        }
        let mut progress = lock(&self.progress[worker]);
        progress.pending = Some(begin());
        progress.in_step = false;
        // Its next step loads, which puts the update first in it.
        Ok(false)
    }

    /// Its step that took an update has run or failed (the update then lost with it).
    fn leave(&self, worker: usize) {
        lock(&self.progress[worker]).in_step = false;
    }
}
