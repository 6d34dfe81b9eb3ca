//! [`DeviceSyncStore`]: synchronous training's parameters of record in the replicas' own
//! device memory.

use std::sync::Mutex;

use tandem_core::{
    DType, DeviceAlloc, DeviceEvent, DeviceOp, DeviceQueue, Optimizer, ParamSpan, Piece, Replica,
    ReplicaError, RoundedCopy, TrainState,
};

use super::{addresses, lock, upload_state, Devices, Fleet};
use crate::exchange::sum_in_order;
use crate::store::{AsyncStore, ParamStore, SyncStore, UpdateAt};
use crate::Exchange;
use tandem_tensor::decode_bf16;

/// A synchronous replica's buffers beside its own, and where it is in the run.
struct SyncReplica {
    /// The f32 master weights where the replica computes in a narrower type (its own
    /// parameters are then their rounded copy); `None`: its parameters are the master weights.
    master: Option<Box<dyn DeviceAlloc>>,
    /// The optimiser's state vectors (each replica keeps them whole; the first one's are the
    /// record).
    state: Vec<Box<dyn DeviceAlloc>>,
    /// Its gradients of a step, copied at the end of the step to `outbox[parity]` (the parity
    /// of the replica's step count), where every replica's next step reads them; the other
    /// one still holds the previous step's, which slower replicas may be reading. `None`
    /// where the replica's own gradients serve ([`DeviceSyncStore::outboxes`]).
    outbox: Option<[Box<dyn DeviceAlloc>; 2]>,
    /// Where some replicas are on other devices: every replica's outbox copied here first
    /// (worker `q`'s from value `q x len`), so that the update kernel reads only local memory.
    staging: Option<Box<dyn DeviceAlloc>>,
    /// Recorded after each of its steps, for the other replicas' queues to wait on (none: a
    /// replica's own queue runs its work in order).
    done: Box<dyn DeviceEvent>,
    progress: Mutex<Progress>,
}

/// Whether the replicas of a store of `workers` need outboxes for gradients of type `grads`:
/// not a lone replica's f32 gradients, which the update at the start of its next step reads
/// where they are (its own queue runs that update before the step overwrites them); a bf16
/// exchange's are rounded into their outbox all the same.
fn outboxes(workers: usize, grads: DType) -> bool {
    workers > 1 || grads != DType::F32
}

/// An update whose gradients wait in the outboxes for a replica's next step.
#[derive(Debug, Clone, Copy)]
struct Pending {
    at: UpdateAt,
    parity: usize,
}

/// A synchronous replica's place in the run, as its worker moves it.
#[derive(Default)]
struct Progress {
    /// Steps begun in this store: the next one's gradients go to `outbox[steps % 2]`.
    steps: u64,
    /// The update that the replica's parameters do not hold yet.
    pending: Option<Pending>,
    /// From the load that hands `pending` to the next step until the step is queued: the
    /// parameters are then neither before nor after it, for a reader on another thread.
    in_step: bool,
}

/// The parameters of record and the optimiser's state of synchronous training, in the device
/// memory of replicas on any devices.
///
/// Each replica keeps the parameters and applies every update itself: a step's gradients go
/// to the replica's outbox at the step's end (a lone replica's f32 gradients stay where they
/// are: nothing else reads them), and the next step of every replica begins with
/// the update from all outboxes, summed in worker order (the optimiser's kernel: bitwise its
/// host arithmetic), copied to its own device first where a replica is on another. Store work
/// and step are one unit, which a replica that replays its steps launches as one graph
/// ([`tandem_core::DeviceQueue::around_next_step`]). Before a step, its queue waits for every
/// other replica's previous step (events): their gradients are complete, and they have read
/// the outbox this step overwrites. A save reads the first replica's parameters with the
/// update still pending applied on the host; the L2 term is summed on the device, that update
/// applied there first.
pub struct DeviceSyncStore<'o, O: Optimizer + ?Sized> {
    devices: Devices<'o, O>,
    replicas: Vec<SyncReplica>,
}

impl<'o, O: Optimizer + ?Sized> DeviceSyncStore<'o, O> {
    /// A store for `replicas`, holding `state`, if they can have one (see the module): every
    /// replica is resident, no more replicas than one update kernel averages, and `optimizer`
    /// has a device update that their queues run; with `exchange` bf16, their queues also
    /// compress the gradients to it. `None` otherwise (the host store serves them). `state`
    /// must fit `layout` and `optimizer` (the strategies check it first).
    pub fn open<R: Replica>(
        replicas: &[R],
        state: &TrainState,
        layout: &[ParamSpan],
        optimizer: &'o O,
        exchange: Exchange,
    ) -> Result<Option<Self>, ReplicaError> {
        // The update averages every replica's gradients in one kernel, which takes so many.
        let workers = replicas.len();
        let exchanged = match exchange {
            Exchange::F32 => None,
            Exchange::Bf16 => Some(DType::BF16),
        };
        let serves = |fleet: &Fleet| fleet.max_gradients >= workers;
        let Some((devices, fleet)) =
            Devices::open(replicas, state, layout, optimizer, (exchanged, serves))?
        else {
            return Ok(None);
        };
        let len = devices.len;
        let replicas = devices
            .members
            .iter()
            .map(|member| {
                let queue = member.queue();
                queue.bind()?;
                let master = match devices.copy {
                    Some(_) => {
                        let master = queue.alloc(len, DType::F32)?;
                        // SAFETY: the buffer was just allocated with `len` values.
                        unsafe { queue.write(master.address(), &state.params)? };
                        Some(master)
                    }
                    None => None,
                };
                // SAFETY: the replica's parameter buffer holds `len` values (its layout's).
                unsafe {
                    devices.write_replica_params(queue, member.residence.params, &state.params)?
                };
                let slots = upload_state(queue, state)?;
                let done = queue.event()?;
                // Recorded once, so that the first step's waits have something to wait for.
                queue.record(&*done)?;
                Ok(SyncReplica {
                    master,
                    state: slots,
                    outbox: match outboxes(workers, devices.grads_dtype) {
                        true => Some([
                            queue.alloc(len, devices.grads_dtype)?,
                            queue.alloc(len, devices.grads_dtype)?,
                        ]),
                        false => None,
                    },
                    staging: match fleet.one_device {
                        true => None,
                        false => Some(queue.alloc(len * workers, devices.grads_dtype)?),
                    },
                    done,
                    progress: Mutex::default(),
                })
            })
            .collect::<Result<Vec<_>, ReplicaError>>()?;
        Ok(Some(Self { devices, replicas }))
    }

    /// Where replica `q`'s gradients of the update of `parity` are: its outbox, or, where it
    /// has none, its own gradients.
    fn gradients(&self, q: usize, replica: &SyncReplica, parity: usize) -> u64 {
        match &replica.outbox {
            Some(outbox) => outbox[parity].address(),
            None => self.devices.members[q].residence.grads,
        }
    }

    /// What `worker`'s next step applies first, `pending` from every replica's outbox.
    fn pending_update(
        &self,
        worker: usize,
        pending: Pending,
    ) -> Result<Vec<DeviceOp>, ReplicaError> {
        let devices = &self.devices;
        let me = &self.replicas[worker];
        let memory = devices.members[worker].queue().memory();
        let mut ops = Vec::new();
        let mut grads = Vec::with_capacity(self.replicas.len());
        for (q, other) in self.replicas.iter().enumerate() {
            let theirs = self.gradients(q, other, pending.parity);
            match &me.staging {
                Some(staging) if devices.members[q].queue().memory() != memory => {
                    let here = devices.grads_dtype.at(staging.address(), q * devices.len);
                    ops.push(DeviceOp::Copy {
                        dst: here,
                        src: theirs,
                        len: devices.len,
                        dtype: devices.grads_dtype,
                    });
                    grads.push(here);
                }
                _ => grads.push(theirs),
            }
        }
        ops.push(devices.hyper_upload(worker, pending.at)?);
        let replica_params = devices.members[worker].residence.params;
        let params = me.master.as_ref().map_or(replica_params, |m| m.address());
        let state = addresses(&me.state);
        let copy = (devices.copy).map(|dtype| RoundedCopy {
            params: replica_params,
            dtype,
        });
        ops.extend(devices.update_ops(worker, (params, &state, copy), &grads, 0..devices.len));
        Ok(ops)
    }

    /// The first replica's queue, bound, its next work ordered after every other replica's last
    /// step.
    fn after_last_steps(&self) -> Result<&dyn DeviceQueue, ReplicaError> {
        let first = self.devices.members[0].queue();
        first.bind()?;
        for other in &self.replicas[1..] {
            first.wait(&*other.done)?;
        }
        Ok(first)
    }

    /// The parameters of record and the optimiser's state (as many vectors as it has), read on
    /// `worker`'s thread (or any, between runs), with the device bound to that worker's queue
    /// afterwards.
    fn read_record(
        &self,
        worker: usize,
        params: &mut [f32],
        state: &mut [&mut [f32]],
    ) -> Result<(), ReplicaError> {
        let members = &self.devices.members;
        // Held while reading: the first replica's worker cannot queue another step.
        let progress = lock(&self.replicas[0].progress);
        if progress.in_step {
            return Err("the parameters are being updated".into());
        }
        let first = self.after_last_steps()?;
        // SAFETY: the replica's parameters and its average hold `len` values; the reads wait
        // for the queue's work (the first replica's own steps among it), and the waits above
        // for every other replica's last step.
        unsafe {
            let master = self.replicas[0].master.as_ref();
            first.read(
                master.map_or(members[0].residence.params, |m| m.address()),
                params,
            )?;
            for (slot, values) in self.replicas[0].state.iter().zip(state.iter_mut()) {
                first.read(slot.address(), values)?;
            }
        }
        if let Some(pending) = progress.pending {
            self.apply_on_host(pending, params, state)?;
        }
        members[worker].queue().bind()
    }

    /// Applies `pending` to `params` and `state` on the host, from every replica's outbox: the
    /// optimiser's own arithmetic, which its kernel is bit for bit.
    fn apply_on_host(
        &self,
        pending: Pending,
        params: &mut [f32],
        state: &mut [&mut [f32]],
    ) -> Result<(), ReplicaError> {
        let devices = &self.devices;
        let mut grads = vec![vec![0.0f32; devices.len]; self.replicas.len()];
        let mut bits = vec![0u16; devices.len];
        let replicas = devices.members.iter().zip(&self.replicas).enumerate();
        for ((q, (member, replica)), out) in replicas.zip(&mut grads) {
            let queue = member.queue();
            queue.bind()?;
            let outbox = self.gradients(q, replica, pending.parity);
            // SAFETY: the outbox (or the replica's gradients) holds `len` values of its type;
            // the read waits for its replica's queue.
            match devices.grads_dtype {
                DType::F32 => unsafe { queue.read(outbox, out)? },
                _ => {
                    unsafe { queue.read_bits16(outbox, &mut bits)? };
                    decode_bf16(&bits, out);
                }
            }
        }
        if devices.grads_dtype != DType::F32 {
            // An exchange's gradients, each divided by the worker count: their f32 sum from
            // zero in worker order is the one gradient of the update, as the kernel sums them.
            let mut sum = Vec::new();
            sum_in_order(grads.iter().map(Vec::as_slice), devices.len, &mut sum);
            grads = vec![sum];
        }
        for (range, decayed) in &devices.spans {
            let parts: Vec<&[f32]> = grads.iter().map(|g| &g[range.clone()]).collect();
            let mut slots: Vec<&mut [f32]> =
                state.iter_mut().map(|s| &mut s[range.clone()]).collect();
            let piece = Piece {
                params: &mut params[range.clone()],
                state: &mut slots,
                grads: &parts,
                weight_decay: *decayed,
                rate_scale: pending.at.rate_scale,
            };
            devices
                .optimizer
                .update(piece, pending.at.step, pending.at.epoch);
        }
        Ok(())
    }

    /// Makes `at` the update that `worker`'s next step applies first (or a read before it, on
    /// the host).
    fn defer(&self, worker: usize, at: UpdateAt) {
        let mut progress = lock(&self.replicas[worker].progress);
        let parity = ((progress.steps + 1) % 2) as usize;
        progress.pending = Some(Pending { at, parity });
    }
}

impl<R: Replica, O: Optimizer + ?Sized> ParamStore<R> for DeviceSyncStore<'_, O> {
    fn load(&self, worker: usize, _: &mut R) -> Result<(), ReplicaError> {
        let member = &self.devices.members[worker];
        let queue = member.queue();
        let me = &self.replicas[worker];
        let mut progress = lock(&me.progress);
        // The others' last steps: their gradients are complete, and they have read the outbox
        // that this step overwrites.
        for (q, other) in self.replicas.iter().enumerate() {
            if q != worker {
                queue.wait(&*other.done)?;
            }
        }
        let before = match progress.pending {
            Some(pending) => self.pending_update(worker, pending)?,
            None => Vec::new(),
        };
        let (src, len) = (member.residence.grads, self.devices.len);
        let after = match &me.outbox {
            None => Vec::new(),
            Some(outbox) => {
                let dst = outbox[(progress.steps % 2) as usize].address();
                vec![match self.devices.grads_dtype {
                    DType::F32 => DeviceOp::Copy {
                        dst,
                        src,
                        len,
                        dtype: DType::F32,
                    },
                    // Divided by the worker count before the rounding: their sum is then the
                    // mean.
                    dtype => DeviceOp::Compress {
                        dst,
                        src,
                        len,
                        divisor: self.replicas.len() as f32,
                        dtype,
                    },
                }]
            }
        };
        // SAFETY: every address is one of the store's buffers or the replica's, of the lengths
        // given, alive as long as the store; the waits above order the other replicas' work on
        // them.
        unsafe { queue.around_next_step(before, after)? };
        progress.pending = None;
        progress.steps += 1;
        progress.in_step = true;
        Ok(())
    }

    /// Computed on the first replica's queue, after every replica's last step, with the
    /// update its parameters do not hold yet applied there first (its next step then applies
    /// none): the sums of squares are read back, not the parameters.
    fn l2_loss(&self, worker: usize, weight_decay: f32) -> Result<f32, ReplicaError> {
        let members = &self.devices.members;
        // Held throughout: the first replica's worker cannot queue another step meanwhile.
        let mut progress = lock(&self.replicas[0].progress);
        if progress.in_step {
            return Err("the parameters are being updated".into());
        }
        let first = self.after_last_steps()?;
        if let Some(pending) = progress.pending {
            let ops = self.pending_update(0, pending)?;
            // SAFETY: as a step's own update: the store's buffers and the outboxes hold `len`
            // values, and the waits above order every replica's last step (which wrote them)
            // first.
            unsafe { first.run(&ops)? };
            // Only once queued: a failure leaves it pending, for a save to apply on the host.
            progress.pending = None;
        }
        let master = self.replicas[0].master.as_ref();
        let params = master.map_or(members[0].residence.params, |m| m.address());
        // SAFETY: the first replica's f32 parameters (or master weights) hold `len` values,
        // their update queued just before on the same queue.
        let l2 = unsafe { (self.devices).l2_loss(first, params, weight_decay) };
        members[worker].queue().bind()?;
        l2
    }

    fn save_into(&self, state: &mut TrainState) -> Result<(), ReplicaError> {
        (self.devices).save_into(state, |params, slots| self.read_record(0, params, slots))
    }

    fn empty_state(&self, step: u64) -> TrainState {
        self.devices.empty_state(step)
    }
}

impl<R: Replica, O: Optimizer + ?Sized> SyncStore<R> for DeviceSyncStore<'_, O> {
    fn publish(&self, worker: usize, _: &mut R) -> Result<(), ReplicaError> {
        let queue = self.devices.members[worker].queue();
        if queue.step_ops_pending() {
            return Err(
                "the replica's step did not take the store's work around it (its \
                        backend must run `DeviceQueue::around_next_step`'s operations)"
                    .into(),
            );
        }
        let me = &self.replicas[worker];
        let mut progress = lock(&me.progress);
        if self.replicas.len() > 1 {
            queue.record(&*me.done)?;
        }
        progress.in_step = false;
        Ok(())
    }

    fn update_share(&self, worker: usize, step: u64, epoch: f64) -> Result<(), ReplicaError> {
        self.defer(worker, UpdateAt::full(step, epoch));
        Ok(())
    }
}

/// Asynchronous training on one replica: nobody else updates, so each update can wait for the
/// start of the replica's next step on its own queue, inside that step's graph, as a sync
/// replica's does; the store of one sync replica is the store of one async one, and its
/// updates land in step order. Refused with several replicas: their sync store averages every
/// replica's gradients into each update, which asynchronous training never does.
impl<R: Replica, O: Optimizer + ?Sized> AsyncStore<R> for DeviceSyncStore<'_, O> {
    fn apply(
        &self,
        (worker, _): (usize, usize),
        replica: &mut R,
        begin: &mut dyn FnMut() -> UpdateAt,
    ) -> Result<bool, ReplicaError> {
        if self.replicas.len() != 1 {
            return Err(format!(
                "asynchronous updates on the synchronous store of {} replicas",
                self.replicas.len()
            )
            .into());
        }
        SyncStore::<R>::publish(self, worker, replica)?;
        self.defer(worker, begin());
        // The replica's next step loads, which queues the update first.
        Ok(false)
    }

    /// Its step that took an update has run or failed (the update then lost with it).
    fn leave(&self, worker: usize) {
        lock(&self.replicas[worker].progress).in_step = false;
    }
}
