//! [`DeviceStore`]: the parameters of record in device memory, beside replicas that compute on
//! devices (sync: on any; async: all on one). A step then moves no parameters or gradients over the host bus: the store
//! queues device copies, the fused update kernel and events on the workers' own queues, and
//! the host waits for the device only when it reads the store (a log line's L2 term, a save).

use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

use tandem_core::{
    DeviceAlloc, DeviceEvent, DeviceQueue, Optimizer, ParamSpan, Replica, ReplicaError, Residence,
    TrainState,
};
use tandem_tensor::cpu;

use crate::store::{l2_term, zeros, ParamStore};
use crate::Mode;

/// The device address of value `index` of the `f32` array at `base`.
fn at(base: u64, index: usize) -> u64 {
    // Wrapping: a staging buffer is addressed as if it held the whole vector.
    base.wrapping_add(4 * index as u64)
}

/// One worker's replica as the store sees it.
struct Member {
    residence: Residence,
    /// Sync, where other replicas are on other devices: their gradients of this worker's share,
    /// copied here (a share's worth per worker) so that the update kernel reads only local
    /// memory.
    staging: Option<Box<dyn DeviceAlloc>>,
    /// Recorded once its gradients of the step are computed (sync).
    published: Box<dyn DeviceEvent>,
    /// Recorded once its share of the step's update is everywhere (sync).
    updated: Box<dyn DeviceEvent>,
}

impl Member {
    fn queue(&self) -> &dyn DeviceQueue {
        &*self.residence.queue
    }
}

/// Where the parameters of record are.
enum Record {
    /// In every replica's parameter buffer, identical after each step: worker `w` updates
    /// `shares[w]` of its own copy (with its moving average, `ema[w]`, the only one) and copies
    /// the result into the others'.
    Sync {
        shares: Vec<Range<usize>>,
        ema: Vec<Box<dyn DeviceAlloc>>,
    },
    /// In the store's own buffers, updated shard by shard; each shard's event marks its last
    /// update, and its lock keeps waiting for that event and queueing the next update together.
    Async {
        params: Box<dyn DeviceAlloc>,
        ema: Box<dyn DeviceAlloc>,
        shards: Vec<Shard>,
        /// `begun[w]`: how many updates worker `w` has begun on the device (a `u32` in each
        /// value's bits), written by `w`'s queue as each begins: the device's count of the
        /// host's version counter.
        begun: Box<dyn DeviceAlloc>,
        /// Each worker's staleness records, by worker.
        seen: Vec<Mutex<Seen>>,
    },
}

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

/// A piece of the asynchronous store, updated by one worker at a time.
struct Shard {
    range: Range<usize>,
    /// Marks the shard's last update; held while waiting for it and queueing the next.
    last: Mutex<Box<dyn DeviceEvent>>,
}

/// The parameters of record and the moving average in device memory, for replicas that compute
/// on devices (synchronous: any; asynchronous: all on one) and an optimiser that is the fused
/// SGD kernel's arithmetic ([`Optimizer::fused_sgd`]).
///
/// * **Synchronous:** each replica keeps the parameters; worker `w` owns a contiguous share of
///   them. After its gradients are published (an event), every worker waits on its queue for
///   the others', copies their gradients of its share to its own device where they are on
///   another (no peer access needed), updates its share from all replicas' gradients summed in
///   worker order (the
///   fused kernel: bitwise the host store's arithmetic), copies the share into the other
///   replicas and records that it is done; a replica's next step waits for every share.
/// * **Asynchronous:** the store keeps one copy, in shards (one per parameter span). A worker's load copies the store
///   into its replica as it is when the copy runs, waiting for no update (as the host's store
///   copies what is applied; a shard being updated meanwhile gives each value old or new); its
///   update waits for each shard's previous update, then applies its own (never lost: each
///   shard's updates run one after another). Staleness is counted on the device: the updates
///   other workers began between a worker's load and its update, as copies of their counters
///   into a ring that [`ParamStore::take_staleness`] reads at the next boundary.
///
/// The host is never waited on within a step: ordering between workers is events on their
/// queues, and the host's barriers only ensure that an event is recorded before it is waited on.
pub struct DeviceStore<'o, O: Optimizer + ?Sized> {
    optimizer: &'o O,
    spans: Vec<(Range<usize>, bool)>,
    len: usize,
    slot_names: Vec<String>,
    members: Vec<Member>,
    record: Record,
}

impl<'o, O: Optimizer + ?Sized> DeviceStore<'o, O> {
    /// A store for `replicas` in `mode`, holding `state`, if they can have one: every replica
    /// is [resident](Replica::residence) (asynchronous: all in the same memory; synchronous:
    /// no more than one update kernel averages), and `optimizer` is the fused kernel's with
    /// its one state vector. `None` otherwise (the host store serves them).
    /// `state` must fit `layout` and `optimizer` (the strategies check it first).
    pub fn open<R: Replica>(
        mode: Mode,
        replicas: &[R],
        state: &TrainState,
        layout: &[ParamSpan],
        optimizer: &'o O,
    ) -> Result<Option<Self>, ReplicaError> {
        let Some(residences) = replicas
            .iter()
            .map(Replica::residence)
            .collect::<Option<Vec<Residence>>>()
        else {
            return Ok(None);
        };
        let Some(first) = residences.first() else {
            return Ok(None);
        };
        let memory = first.queue.memory();
        let one_device = residences.iter().all(|r| r.queue.memory() == memory);
        let fused = optimizer.fused_sgd(state.step, 0.0, false).is_some();
        // Async updates run on the updating worker's device, so the store must be there too; a
        // sync update averages every replica's gradients in one kernel, which takes so many.
        let too_many = residences
            .iter()
            .any(|r| r.queue.max_gradients() < residences.len());
        let unsupported = match mode {
            Mode::Async => !one_device,
            Mode::Sync => too_many,
        };
        if !fused || state.slots.len() != 1 || unsupported {
            return Ok(None);
        }
        let len = state.params.len();
        let workers = residences.len();
        let share_len = len.div_ceil(workers);
        let members = residences
            .into_iter()
            .map(|residence| {
                let queue = &residence.queue;
                queue.bind()?;
                let (published, updated) = (queue.event()?, queue.event()?);
                // Recorded once, so that the first step's waits have something to wait for.
                queue.record(&*published)?;
                queue.record(&*updated)?;
                let staging = match one_device {
                    true => None,
                    false => Some(queue.alloc(share_len * workers)?),
                };
                Ok(Member {
                    residence,
                    staging,
                    published,
                    updated,
                })
            })
            .collect::<Result<Vec<_>, ReplicaError>>()?;
        let mut spans = Vec::with_capacity(layout.len());
        let mut offset = 0;
        for span in layout {
            spans.push((offset..offset + span.len(), span.weight_decay));
            offset += span.len();
        }
        let ema = &state.slots[0].values;
        let queue = members[0].queue();
        let record = match mode {
            Mode::Sync => {
                let shares: Vec<Range<usize>> = (0..workers)
                    .map(|w| len * w / workers..len * (w + 1) / workers)
                    .collect();
                let mut averages = Vec::with_capacity(workers);
                for (member, share) in members.iter().zip(&shares) {
                    member.queue().bind()?;
                    let average = member.queue().alloc(share.len())?;
                    // SAFETY: the replica's parameter buffer holds `len` values (its layout's),
                    // the new buffer `share.len()`.
                    unsafe {
                        member
                            .queue()
                            .write(member.residence.params, &state.params)?;
                        member
                            .queue()
                            .write(average.address(), &ema[share.clone()])?;
                    }
                    averages.push(average);
                }
                Record::Sync {
                    shares,
                    ema: averages,
                }
            }
            Mode::Async => {
                queue.bind()?;
                let (params, average) = (queue.alloc(len)?, queue.alloc(len)?);
                // SAFETY: both buffers were just allocated with `len` values.
                unsafe {
                    queue.write(params.address(), &state.params)?;
                    queue.write(average.address(), ema)?;
                }
                // A shard a span: on the device an update of a shard is one kernel, fast next to
                // the launch, so few large shards cost least; workers still start at different
                // ones.
                let shards = spans
                    .iter()
                    .map(|(range, _)| range.clone())
                    .filter(|range| !range.is_empty())
                    .map(|range| {
                        let event = queue.event()?;
                        queue.record(&*event)?;
                        Ok(Shard {
                            range,
                            last: Mutex::new(event),
                        })
                    })
                    .collect::<Result<Vec<_>, ReplicaError>>()?;
                let begun = queue.alloc(workers)?;
                // SAFETY: `begun` holds a value per worker.
                unsafe { queue.write(begun.address(), &vec![0.0; workers])? };
                let seen = members
                    .iter()
                    .map(|_| {
                        Ok(Mutex::new(Seen {
                            ring: queue.alloc(SEEN_RING * 2 * workers)?,
                            current: 0,
                            pending: 0,
                            own: 0,
                        }))
                    })
                    .collect::<Result<Vec<_>, ReplicaError>>()?;
                Record::Async {
                    params,
                    ema: average,
                    shards,
                    begun,
                    seen,
                }
            }
        };
        Ok(Some(Self {
            optimizer,
            spans,
            len,
            slot_names: state.slots.iter().map(|s| s.name.clone()).collect(),
            members,
            record,
        }))
    }

    /// Queues, on `queue`, the fused update `step` (at `epoch`) of `range` of the parameters at
    /// `params` and the average at `ema` (whose first value is parameter `ema_start`), with the
    /// gradients at `grads`.
    ///
    /// # Safety
    /// Every address holds the parameters' values over `range` (`ema` from `ema_start`).
    #[allow(clippy::too_many_arguments)]
    unsafe fn update(
        &self,
        queue: &dyn DeviceQueue,
        (params, ema, ema_start): (u64, u64, usize),
        grads: &[u64],
        range: Range<usize>,
        step: u64,
        epoch: f64,
    ) -> Result<(), ReplicaError> {
        for (span, decayed) in &self.spans {
            let piece = range.start.max(span.start)..range.end.min(span.end);
            if piece.is_empty() {
                continue;
            }
            let fused = self
                .optimizer
                .fused_sgd(step, epoch, *decayed)
                .ok_or("the optimiser has no fused device update")?;
            let grads: Vec<u64> = grads.iter().map(|&g| at(g, piece.start)).collect();
            // SAFETY: the caller's promise, for a part of `range`.
            unsafe {
                queue.sgd_update(
                    at(params, piece.start),
                    at(ema, piece.start - ema_start),
                    &grads,
                    piece.len(),
                    fused,
                )?;
            }
        }
        Ok(())
    }

    /// Makes `queue` wait for every update so far (sync: every share; async: every shard).
    fn wait_all(&self, queue: &dyn DeviceQueue) -> Result<(), ReplicaError> {
        match &self.record {
            Record::Sync { .. } => {
                for member in &self.members {
                    queue.wait(&*member.updated)?;
                }
            }
            Record::Async { shards, .. } => {
                for shard in shards {
                    queue.wait(&**lock(&shard.last))?;
                }
            }
        }
        Ok(())
    }

    /// The parameters of record, read through `queue` (which waits for every update first).
    fn read_params(&self, queue: &dyn DeviceQueue, out: &mut [f32]) -> Result<(), ReplicaError> {
        self.wait_all(queue)?;
        let source = match &self.record {
            Record::Sync { .. } => self.members[0].residence.params,
            Record::Async { params, .. } => params.address(),
        };
        // SAFETY: both hold the `len` parameters.
        unsafe { queue.read(source, out) }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding a shard's lock but the driver's own calls; the event stays
    // usable.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// The error of an operation that the store's mode does not have.
fn wrong_mode(operation: &str) -> ReplicaError {
    format!("the device store was opened for the other mode than {operation}").into()
}

impl<R: Replica, O: Optimizer + ?Sized> ParamStore<R> for DeviceStore<'_, O> {
    fn load(&self, worker: usize, _: &mut R) -> Result<(), ReplicaError> {
        let member = &self.members[worker];
        let queue = member.queue();
        let Record::Async {
            params,
            begun,
            seen,
            ..
        } = &self.record
        else {
            // Sync: the parameters are in place once every share's update is.
            return self.wait_all(queue);
        };
        // Async: whatever the store holds when the copy runs, waiting for no update (the
        // host's store copies what is applied, too); a shard being updated meanwhile gives each
        // value old or new.
        let mut seen = lock(&seen[worker]);
        if seen.pending == SEEN_RING {
            return Err(format!(
                "worker {worker}'s staleness records were not taken for {SEEN_RING} updates"
            )
            .into());
        }
        seen.current = (seen.current + 1) % SEEN_RING;
        let workers = self.members.len();
        let record = at(seen.ring.address(), seen.current * 2 * workers);
        // SAFETY: the store and the replica hold the `len` parameters (the replica's previous
        // step, which reads them, is earlier on the same queue); the record holds `2 x
        // workers` values and `begun` `workers`.
        unsafe {
            queue.copy(record, begun.address(), workers)?;
            queue.copy(member.residence.params, params.address(), self.len)?;
        }
        Ok(())
    }

    fn measures_staleness(&self) -> bool {
        matches!(self.record, Record::Async { .. })
    }

    fn take_staleness(&self, worker: usize, out: &mut Vec<u64>) -> Result<(), ReplicaError> {
        let Record::Async { seen, .. } = &self.record else {
            return Err(wrong_mode("take_staleness"));
        };
        let mut seen = lock(&seen[worker]);
        let workers = self.members.len();
        let record_len = 2 * workers;
        let mut records = vec![0.0f32; seen.pending * record_len];
        // Oldest first: the `pending` records ending with `current`, in at most two pieces.
        let first = (seen.current + 1 + SEEN_RING - seen.pending) % SEEN_RING;
        let head = seen.pending.min(SEEN_RING - first);
        let (early, late) = records.split_at_mut(head * record_len);
        let queue = self.members[worker].queue();
        for (start, piece) in [(first, early), (0, late)] {
            if !piece.is_empty() {
                // SAFETY: the piece lies in the ring of `SEEN_RING` records.
                unsafe { queue.read(at(seen.ring.address(), start * record_len), piece)? };
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

    fn publish(&self, worker: usize, _: &mut R) -> Result<(), ReplicaError> {
        let member = &self.members[worker];
        member.queue().record(&*member.published)
    }

    fn update_share(&self, worker: usize, step: u64, epoch: f64) -> Result<(), ReplicaError> {
        let Record::Sync { shares, ema } = &self.record else {
            return Err(wrong_mode("update_share"));
        };
        let me = &self.members[worker];
        let queue = me.queue();
        for other in &self.members {
            queue.wait(&*other.published)?;
        }
        let share = shares[worker].clone();
        let memory = queue.memory();
        let mut grads = Vec::with_capacity(self.members.len());
        for (slot, other) in self.members.iter().enumerate() {
            let theirs = other.residence.grads;
            match &me.staging {
                Some(staging) if other.queue().memory() != memory => {
                    // Addressed like the whole gradient vector: value i of the share is at
                    // `here + 4 * i` for i in the share.
                    let here = at(staging.address(), slot * share.len());
                    // SAFETY: the staging buffer holds a share for every worker; the other
                    // replica's gradients are complete (the wait above) and stay until its
                    // next step, which waits for `updated`.
                    unsafe { queue.copy(here, at(theirs, share.start), share.len())? };
                    grads.push(here.wrapping_sub(4 * share.start as u64));
                }
                _ => grads.push(theirs),
            }
        }
        let params = me.residence.params;
        // SAFETY: every replica's buffers hold the `len` parameters and gradients, the average
        // the share; every replica has computed its gradients (the waits above) and reads
        // nothing of the share before `updated` (its next load waits for it).
        unsafe {
            self.update(
                queue,
                (params, ema[worker].address(), share.start),
                &grads,
                share.clone(),
                step,
                epoch,
            )?;
            for other in self.members.iter().filter(|m| m.residence.params != params) {
                queue.copy(
                    at(other.residence.params, share.start),
                    at(params, share.start),
                    share.len(),
                )?;
            }
        }
        queue.record(&*me.updated)
    }

    fn apply(
        &self,
        (worker, workers): (usize, usize),
        _: &mut R,
        begin: &mut dyn FnMut() -> (u64, f64),
    ) -> Result<(), ReplicaError> {
        let Record::Async {
            params,
            ema,
            shards,
            begun,
            seen,
        } = &self.record
        else {
            return Err(wrong_mode("apply"));
        };
        let member = &self.members[worker];
        let queue = member.queue();
        let (step, epoch) = begin();
        let first = worker * shards.len() / workers.max(1);
        let mut seen = lock(&seen[worker]);
        // What others had begun when this update begins (the second half of its record), then
        // this one counted as begun.
        let record = at(seen.ring.address(), (2 * seen.current + 1) * workers);
        seen.own = seen.own.wrapping_add(1);
        seen.pending += 1;
        // SAFETY: the record's second half holds `workers` values, as `begun` does.
        unsafe {
            queue.copy(record, begun.address(), workers)?;
            queue.upload(at(begun.address(), worker), &[f32::from_bits(seen.own)])?;
        }
        for shard in shards[first..].iter().chain(&shards[..first]) {
            let event = lock(&shard.last);
            queue.wait(&**event)?;
            // SAFETY: the store's buffers and the replica's gradients hold `len` values; the
            // shard's earlier updates run before this one (the wait, under the shard's lock).
            unsafe {
                self.update(
                    queue,
                    (params.address(), ema.address(), 0),
                    &[member.residence.grads],
                    shard.range.clone(),
                    step,
                    epoch,
                )?;
            }
            queue.record(&**event)?;
        }
        Ok(())
    }

    fn l2_loss(&self, worker: usize, weight_decay: f32) -> Result<f32, ReplicaError> {
        let mut params = vec![0.0; self.len];
        self.read_params(self.members[worker].queue(), &mut params)?;
        let sum = self
            .spans
            .iter()
            .filter(|(_, decayed)| *decayed)
            .map(|(range, _)| cpu::sum_squares(&params[range.clone()]))
            .sum();
        Ok(l2_term(weight_decay, sum))
    }

    fn save_into(&self, state: &mut TrainState) -> Result<(), ReplicaError> {
        let queue = self.members[0].queue();
        // The caller may be any thread: the main one after the run, the watchdog during it.
        queue.bind()?;
        self.read_params(queue, &mut state.params)?;
        let average = &mut state.slots[0].values;
        match &self.record {
            Record::Sync { shares, ema } => {
                for ((member, share), ema) in self.members.iter().zip(shares).zip(ema) {
                    member.queue().bind()?;
                    // SAFETY: the share's average holds `share.len()` values; the read waits
                    // for its owner's queue, whose last update wrote it.
                    unsafe {
                        member
                            .queue()
                            .read(ema.address(), &mut average[share.clone()])?
                    };
                }
            }
            Record::Async { ema, .. } => {
                // SAFETY: the average holds `len` values; `read_params` waited for every shard.
                unsafe { queue.read(ema.address(), average)? };
            }
        }
        Ok(())
    }

    fn empty_state(&self, step: u64) -> TrainState {
        zeros(self.len, &self.slot_names, step)
    }
}
