//! [`DeviceAsyncStore`]: asynchronous training's parameters of record in the device memory of
//! replicas that all compute on one device.

use std::sync::Mutex;

use tandem_core::{
    DType, DeviceAlloc, DeviceEvent, DeviceOp, DeviceQueue, Optimizer, ParamSpan, Replica,
    ReplicaError, TrainState,
};

use super::{addresses, lock, upload_state, Devices};
use crate::store::{AsyncStore, ParamStore, UpdateAt};

/// Updates a worker may make before its staleness records are taken.
const SEEN_RING: usize = 1024;

/// One worker's staleness records on the device: for each update, `begun` as its load read it
/// and as the update found it when it began (`2 x workers` values), in a ring of
/// [`SEEN_RING`]. Copies on the worker's queue fill them, so measuring costs the step no wait:
/// the staleness of an update is the other workers' updates begun between the two, as the
/// host's store counts it, but counted where the work happens.
struct Seen {
    ring: Box<dyn DeviceAlloc>,
    /// The record of the update under way (set by the load).
    current: usize,
    /// Records filled and not yet taken, ending at `current` exclusive once applied.
    pending: usize,
    /// This worker's updates so far: what it writes to its `begun` value as each begins.
    own: u32,
}

/// The parameters of record and the optimiser's state of asynchronous training, in the device
/// memory of replicas that all compute on one device (updates run on the updating worker's
/// device, so the store must be there too).
///
/// The store keeps one copy, updated whole: on the device an update of every span is one
/// kernel launch, short next to a step, so shards would only add launches and host calls (the
/// host's store shards because its updates take long). A worker's load copies the store into
/// its replica as it is when the copy runs, waiting for no update (as the host's store copies
/// what is applied; an update running meanwhile gives each value old or new); its update waits
/// for the previous update, then applies its own (never lost: updates run one after another).
/// Staleness is counted on the device: the updates other workers began between a worker's
/// load and its update, as copies of their counters into a ring that
/// [`AsyncStore::take_staleness`] reads at the next boundary. (The strategies give a lone
/// replica [`super::DeviceSyncStore`] instead, which queues each update inside
/// the replica's next step; this store serves one as well.)
pub struct DeviceAsyncStore<'o, O: Optimizer + ?Sized> {
    devices: Devices<'o, O>,
    params: Box<dyn DeviceAlloc>,
    /// Where the replicas compute in a narrower type: the parameters' rounded copy, which
    /// every update writes with them and the loads copy from.
    rounded: Option<Box<dyn DeviceAlloc>>,
    /// The optimiser's state vectors.
    state: Vec<Box<dyn DeviceAlloc>>,
    /// Marks the last update queued; its lock keeps waiting for it and queueing the next
    /// update together.
    last_update: Mutex<Box<dyn DeviceEvent>>,
    /// `begun[w]`: how many updates worker `w` has begun on the device (a `u32` in each value's
    /// bits), written by `w`'s queue as each begins: the device's count of the host's version
    /// counter.
    begun: Box<dyn DeviceAlloc>,
    /// Each worker's staleness records, by worker.
    seen: Vec<Mutex<Seen>>,
}

impl<'o, O: Optimizer + ?Sized> DeviceAsyncStore<'o, O> {
    /// A store for `replicas`, holding `state`, if they can have one (see the module): every
    /// replica is resident, all in the same memory, and `optimizer` has a device update that
    /// their queues run. `None` otherwise (the host store serves them). `state` must fit
    /// `layout` and `optimizer` (the strategies check it first).
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
        let (len, workers) = (devices.len, devices.members.len());
        let queue = devices.members[0].queue();
        queue.bind()?;
        let params = queue.alloc(len, DType::F32)?;
        // SAFETY: the buffer was just allocated with `len` values.
        unsafe { queue.write(params.address(), &state.params)? };
        let rounded = match devices.copy {
            Some(_) => {
                let rounded = queue.alloc(len, DType::F32)?;
                // SAFETY: the buffer was just allocated with `len` values.
                unsafe { devices.write_replica_params(queue, rounded.address(), &state.params)? };
                Some(rounded)
            }
            None => None,
        };
        let slots = upload_state(queue, state)?;
        let last_update = queue.event()?;
        // Recorded once, so that the first update has something to wait for.
        queue.record(&*last_update)?;
        // Counts, as the bits of 4-byte values.
        let begun = queue.alloc(workers, DType::F32)?;
        // SAFETY: `begun` holds a value per worker.
        unsafe { queue.write(begun.address(), &vec![0.0; workers])? };
        let seen = (0..workers)
            .map(|_| {
                Ok(Mutex::new(Seen {
                    ring: queue.alloc(SEEN_RING * 2 * workers, DType::F32)?,
                    current: 0,
                    pending: 0,
                    own: 0,
                }))
            })
            .collect::<Result<Vec<_>, ReplicaError>>()?;
        Ok(Some(Self {
            devices,
            params,
            rounded,
            state: slots,
            last_update: Mutex::new(last_update),
            begun,
            seen,
        }))
    }

    /// What a replica's parameters are copied from: the record, or its rounded copy.
    fn replica_params(&self) -> u64 {
        self.rounded.as_ref().unwrap_or(&self.params).address()
    }

    /// Copies every worker's `begun` count into a staleness record's half at `record`.
    fn snapshot_begun(&self, record: u64) -> DeviceOp {
        DeviceOp::Copy {
            dst: record,
            src: self.begun.address(),
            len: self.devices.members.len(),
            dtype: DType::F32,
        }
    }

    /// `worker`'s queue, bound, its next work ordered after every update queued so far.
    fn after_updates(&self, worker: usize) -> Result<&dyn DeviceQueue, ReplicaError> {
        let queue = self.devices.members[worker].queue();
        queue.bind()?;
        queue.wait(&**lock(&self.last_update))?;
        Ok(queue)
    }

    /// The parameters of record and the optimiser's state (as many vectors as it has), read on
    /// `worker`'s thread (or any, between runs), with the device bound to that worker's queue.
    fn read_record(
        &self,
        worker: usize,
        params: &mut [f32],
        state: &mut [&mut [f32]],
    ) -> Result<(), ReplicaError> {
        let queue = self.after_updates(worker)?;
        // SAFETY: both hold the `len` values; the waits above order every update first.
        unsafe {
            queue.read(self.params.address(), params)?;
            for (slot, values) in self.state.iter().zip(state.iter_mut()) {
                queue.read(slot.address(), values)?;
            }
        }
        Ok(())
    }
}

impl<R: Replica, O: Optimizer + ?Sized> ParamStore<R> for DeviceAsyncStore<'_, O> {
    /// Whatever the store holds when the copy runs, waiting for no update (the host's store
    /// copies what is applied, too); an update running meanwhile gives each value old or new.
    fn load(&self, worker: usize, _: &mut R) -> Result<(), ReplicaError> {
        let member = &self.devices.members[worker];
        let mut seen = lock(&self.seen[worker]);
        if seen.pending == SEEN_RING {
            return Err(format!(
                "worker {worker}'s staleness records were not taken for {SEEN_RING} updates"
            )
            .into());
        }
        seen.current = (seen.current + 1) % SEEN_RING;
        let workers = self.devices.members.len();
        let record = DType::F32.at(seen.ring.address(), seen.current * 2 * workers);
        // SAFETY: the store and the replica hold the `len` parameters (the replica's previous
        // step, which reads them, is earlier on the same queue); the record holds `2 x
        // workers` values and `begun` `workers`.
        unsafe {
            member.queue().run(&[
                self.snapshot_begun(record),
                DeviceOp::Copy {
                    dst: member.residence.params,
                    src: self.replica_params(),
                    len: self.devices.len,
                    dtype: DType::F32,
                },
            ])
        }
    }

    /// Computed on `worker`'s queue, after every update queued so far.
    fn l2_loss(&self, worker: usize, weight_decay: f32) -> Result<f32, ReplicaError> {
        let queue = self.after_updates(worker)?;
        // SAFETY: the record holds the `len` parameters in this device's memory (one for every
        // worker), and the waits above order every update before the sums.
        unsafe { (self.devices).l2_loss(queue, self.params.address(), weight_decay) }
    }

    fn save_into(&self, state: &mut TrainState) -> Result<(), ReplicaError> {
        (self.devices).save_into(state, |params, slots| self.read_record(0, params, slots))
    }

    fn empty_state(&self, step: u64) -> TrainState {
        self.devices.empty_state(step)
    }
}

impl<R: Replica, O: Optimizer + ?Sized> AsyncStore<R> for DeviceAsyncStore<'_, O> {
    fn apply(
        &self,
        (worker, workers): (usize, usize),
        _: &mut R,
        begin: &mut dyn FnMut() -> UpdateAt,
    ) -> Result<bool, ReplicaError> {
        let devices = &self.devices;
        let member = &devices.members[worker];
        let queue = member.queue();
        let update = begin();
        let mut seen = lock(&self.seen[worker]);
        // What others had begun when this update begins (the second half of its record), then
        // this one counted as begun.
        let record = DType::F32.at(seen.ring.address(), (2 * seen.current + 1) * workers);
        seen.own = seen.own.wrapping_add(1);
        seen.pending += 1;
        // SAFETY: the record's second half holds `workers` values, as `begun` does; `hyper`
        // the kernel's values twice (the update kernels of this worker's last update, which
        // read it, are earlier on the same queue).
        unsafe {
            queue.run(&[
                self.snapshot_begun(record),
                DeviceOp::Upload {
                    dst: DType::F32.at(self.begun.address(), worker),
                    values: vec![f32::from_bits(seen.own)],
                },
                devices.hyper_upload(worker, update)?,
            ])?;
        }
        let ops = devices.update_ops(
            worker,
            (
                self.params.address(),
                &addresses(&self.state),
                self.replica_params(),
            ),
            &[member.residence.grads],
            0..devices.len,
        );
        let last = lock(&self.last_update);
        queue.wait(&**last)?;
        // SAFETY: the store's buffers and the replica's gradients hold `len` values; the
        // earlier updates run before this one (the wait, under the lock).
        unsafe { queue.run(&ops)? };
        queue.record(&**last)?;
        // The replica loads from the record on the device before its next step.
        Ok(false)
    }

    fn measures_staleness(&self) -> bool {
        true
    }

    fn take_staleness(&self, worker: usize, out: &mut Vec<u64>) -> Result<(), ReplicaError> {
        let mut seen = lock(&self.seen[worker]);
        let workers = self.devices.members.len();
        let record_len = 2 * workers;
        let mut records = vec![0.0f32; seen.pending * record_len];
        // Oldest first: the `pending` records ending with `current`, in at most two pieces.
        let first = (seen.current + 1 + SEEN_RING - seen.pending) % SEEN_RING;
        let head = seen.pending.min(SEEN_RING - first);
        let (early, late) = records.split_at_mut(head * record_len);
        let queue = self.devices.members[worker].queue();
        for (start, piece) in [(first, early), (0, late)] {
            if !piece.is_empty() {
                let oldest = DType::F32.at(seen.ring.address(), start * record_len);
                // SAFETY: the piece lies in the ring of `SEEN_RING` records.
                unsafe { queue.read(oldest, piece)? };
            }
        }
        let count = |values: &[f32]| values.iter().map(|v| u64::from(v.to_bits())).sum::<u64>();
        out.extend(records.chunks(record_len).map(|record| {
            let (read, applied) = record.split_at(workers);
            count(applied).saturating_sub(count(read))
        }));
        seen.pending = 0;
        Ok(())
    }
}
