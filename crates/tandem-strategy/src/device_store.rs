//! [`DeviceStore`]: the parameters of record in device memory, beside replicas that compute on
//! devices (sync: on any; async: all on one). A step then moves no parameters or gradients
//! over the host bus: the store queues device copies, the fused update kernel and events on the
//! workers' own queues (sync: inside each replica's step, one graph with it), and the host
//! waits for the device only when it reads the store (a log line's L2 term, a save).

use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

use tandem_core::{
    DeviceAlloc, DeviceEvent, DeviceOp, DeviceQueue, Optimizer, ParamSpan, Piece, Replica,
    ReplicaError, Residence, TrainState, MAX_HYPER,
};
use tandem_tensor::cpu;

use crate::store::{l2_term, zeros, ParamStore, UpdateAt};
use crate::Mode;

/// The device address of value `index` of the `f32` array at `base`.
fn at(base: u64, index: usize) -> u64 {
    base.wrapping_add(4 * index as u64)
}

/// One worker's replica as the store sees it.
struct Member {
    residence: Residence,
    /// The update kernel's values for regularised spans, then for the others: what the
    /// worker's updates read, written before each.
    hyper: Box<dyn DeviceAlloc>,
}

impl Member {
    fn queue(&self) -> &dyn DeviceQueue {
        &*self.residence.queue
    }
}

/// Where the parameters of record are.
enum Record {
    /// In every replica's parameter buffer: each replica applies every update itself, at the
    /// start of its next step (inside that step's graph), from all replicas' gradients in
    /// worker order, so all hold the same values; the first replica's are the record, with
    /// the update its next step will apply.
    Sync(Vec<SyncReplica>),
    /// In the store's own buffers, updated shard by shard; each shard's event marks its last
    /// update, and its lock keeps waiting for that event and queueing the next update together.
    Async {
        params: Box<dyn DeviceAlloc>,
        /// The optimiser's state vectors.
        state: Vec<Box<dyn DeviceAlloc>>,
        shards: Vec<Shard>,
        /// `begun[w]`: how many updates worker `w` has begun on the device (a `u32` in each
        /// value's bits), written by `w`'s queue as each begins: the device's count of the
        /// host's version counter.
        begun: Box<dyn DeviceAlloc>,
        /// Each worker's staleness records, by worker.
        seen: Vec<Mutex<Seen>>,
    },
}

/// A synchronous replica's buffers beside its own, and where it is in the run.
struct SyncReplica {
    /// The optimiser's state vectors (each replica keeps them whole; the first one's are the
    /// record).
    state: Vec<Box<dyn DeviceAlloc>>,
    /// Its gradients of a step, copied at the end of the step to `outbox[parity]` (the parity
    /// of the replica's step count), where every replica's next step reads them; the other
    /// one still holds the previous step's, which slower replicas may be reading.
    outbox: [Box<dyn DeviceAlloc>; 2],
    /// Where some replicas are on other devices: every replica's outbox copied here first
    /// (worker `q`'s from value `q x len`), so that the update kernel reads only local memory.
    staging: Option<Box<dyn DeviceAlloc>>,
    /// Recorded after each of its steps.
    done: Box<dyn DeviceEvent>,
    progress: Mutex<Progress>,
}

/// An update whose gradients wait in the outboxes for a replica's next step.
#[derive(Debug, Clone, Copy)]
struct Pending {
    step: u64,
    epoch: f64,
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

/// The parameters of record and the optimiser's state in device memory, for replicas that
/// compute on devices (synchronous: any; asynchronous: all on one) and an optimiser with a
/// device update that their queues run ([`Optimizer::device_update`],
/// [`DeviceQueue::has_update`]).
///
/// * **Synchronous:** each replica keeps the parameters and applies every update itself: a
///   step's gradients go to the replica's outbox at the step's end, and the next step of every
///   replica begins with the update from all outboxes, summed in worker order (the
///   optimiser's kernel: bitwise its host arithmetic), copied to its own device first where a
///   replica is on another. Store work and step are one unit, which a replica that replays
///   its steps launches as one graph ([`DeviceQueue::around_next_step`]). Before a step, its
///   queue waits for every other replica's previous step (events): their gradients are
///   complete, and they have read the outbox this step overwrites. What the host reads (a
///   save, the L2 term) is the first replica's parameters with the update still pending
///   applied on the host.
/// * **Asynchronous:** the store keeps one copy, in shards (one per parameter span). A worker's
///   load copies the store into its replica as it is when the copy runs, waiting for no
///   update (as the host's store copies what is applied; a shard being updated meanwhile
///   gives each value old or new); its update waits for each shard's previous update, then
///   applies its own (never lost: each shard's updates run one after another). Staleness is
///   counted on the device: the updates other workers began between a worker's load and its
///   update, as copies of their counters into a ring that [`ParamStore::take_staleness`]
///   reads at the next boundary.
///
/// The host is never waited on within a step: ordering between workers is events on their
/// queues, and the host's barriers only ensure that an event is recorded before it is waited on.
pub struct DeviceStore<'o, O: Optimizer + ?Sized> {
    optimizer: &'o O,
    /// The optimiser's update kernel ([`tandem_core::DeviceUpdate::kernel`]).
    kernel: &'static str,
    /// How many values it reads for a span ([`tandem_core::DeviceUpdate::hyper`]).
    hyper_len: usize,
    spans: Vec<(Range<usize>, bool)>,
    len: usize,
    slot_names: Vec<String>,
    members: Vec<Member>,
    record: Record,
}

impl<'o, O: Optimizer + ?Sized> DeviceStore<'o, O> {
    /// A store for `replicas` in `mode`, holding `state`, if they can have one: every replica
    /// is [resident](Replica::residence) (asynchronous: all in the same memory; synchronous:
    /// no more than one update kernel averages), and `optimizer` has a device update that
    /// their queues run. `None` otherwise (the host store serves them).
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
        let kernel = optimizer
            .device_update(state.step, 0.0, false, 1.0)
            .filter(|update| update.hyper.len() <= MAX_HYPER)
            .map(|update| (update.kernel, update.hyper.len()))
            .filter(|(kernel, _)| {
                residences
                    .iter()
                    .all(|r| r.queue.has_update(kernel, state.slots.len()))
            });
        // Async updates run on the updating worker's device, so the store must be there too; a
        // sync update averages every replica's gradients in one kernel, which takes so many.
        let too_many = residences
            .iter()
            .any(|r| r.queue.max_gradients() < residences.len());
        let unsupported = match mode {
            Mode::Async => !one_device,
            Mode::Sync => too_many,
        };
        let Some((kernel, hyper_len)) = kernel.filter(|_| !unsupported) else {
            return Ok(None);
        };
        let len = state.params.len();
        let workers = residences.len();
        let members = residences
            .into_iter()
            .map(|residence| {
                residence.queue.bind()?;
                let hyper = residence.queue.alloc(2 * hyper_len)?;
                Ok(Member { residence, hyper })
            })
            .collect::<Result<Vec<_>, ReplicaError>>()?;
        let mut spans = Vec::with_capacity(layout.len());
        let mut offset = 0;
        for span in layout {
            spans.push((offset..offset + span.len(), span.weight_decay));
            offset += span.len();
        }
        let record = match mode {
            Mode::Sync => {
                let replicas = members
                    .iter()
                    .map(|member| {
                        let queue = member.queue();
                        queue.bind()?;
                        // SAFETY: the replica's parameter buffer holds `len` values (its
                        // layout's).
                        unsafe { queue.write(member.residence.params, &state.params)? };
                        let slots = upload_state(queue, state)?;
                        let done = queue.event()?;
                        // Recorded once, so that the first step's waits have something to
                        // wait for.
                        queue.record(&*done)?;
                        Ok(SyncReplica {
                            state: slots,
                            outbox: [queue.alloc(len)?, queue.alloc(len)?],
                            staging: match one_device {
                                true => None,
                                false => Some(queue.alloc(len * workers)?),
                            },
                            done,
                            progress: Mutex::default(),
                        })
                    })
                    .collect::<Result<Vec<_>, ReplicaError>>()?;
                Record::Sync(replicas)
            }
            Mode::Async => {
                let queue = members[0].queue();
                queue.bind()?;
                let params = queue.alloc(len)?;
                // SAFETY: the buffer was just allocated with `len` values.
                unsafe { queue.write(params.address(), &state.params)? };
                let slots = upload_state(queue, state)?;
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
                    state: slots,
                    shards,
                    begun,
                    seen,
                }
            }
        };
        Ok(Some(Self {
            optimizer,
            kernel,
            hyper_len,
            spans,
            len,
            slot_names: state.slots.iter().map(|s| s.name.clone()).collect(),
            members,
            record,
        }))
    }

    /// What `worker`'s `hyper` must hold for update `at`.
    fn hyper_upload(&self, worker: usize, at: UpdateAt) -> Result<DeviceOp, ReplicaError> {
        let mut values = Vec::with_capacity(2 * self.hyper_len);
        for decayed in [true, false] {
            let update = self
                .optimizer
                .device_update(at.step, at.epoch, decayed, at.rate_scale)
                .filter(|u| u.kernel == self.kernel && u.hyper.len() == self.hyper_len)
                .ok_or("the optimiser's device update changed during the run")?;
            values.extend(update.hyper);
        }
        Ok(DeviceOp::Upload {
            dst: self.members[worker].hyper.address(),
            values,
        })
    }

    /// The update kernels, on `worker`'s queue, of `range` of the parameters at `params` and
    /// their state at `state`, with the gradients at `grads` and the values of
    /// [`hyper_upload`](Self::hyper_upload).
    fn update_ops(
        &self,
        worker: usize,
        (params, state): (u64, &[u64]),
        grads: &[u64],
        range: Range<usize>,
    ) -> Vec<DeviceOp> {
        let hyper = self.members[worker].hyper.address();
        self.spans
            .iter()
            .filter_map(|(span, decayed)| {
                let piece = range.start.max(span.start)..range.end.min(span.end);
                (!piece.is_empty()).then(|| DeviceOp::Update {
                    kernel: self.kernel,
                    params: at(params, piece.start),
                    state: state.iter().map(|&s| at(s, piece.start)).collect(),
                    grads: grads.iter().map(|&g| at(g, piece.start)).collect(),
                    len: piece.len(),
                    hyper: at(hyper, if *decayed { 0 } else { self.hyper_len }),
                })
            })
            .collect()
    }

    /// Sync: what `worker`'s next step applies first, `pending` from every replica's outbox.
    fn pending_update(
        &self,
        replicas: &[SyncReplica],
        worker: usize,
        pending: Pending,
    ) -> Result<Vec<DeviceOp>, ReplicaError> {
        let me = &replicas[worker];
        let memory = self.members[worker].queue().memory();
        let mut ops = Vec::new();
        let mut grads = Vec::with_capacity(replicas.len());
        for (q, other) in replicas.iter().enumerate() {
            let theirs = other.outbox[pending.parity].address();
            match &me.staging {
                Some(staging) if self.members[q].queue().memory() != memory => {
                    let here = at(staging.address(), q * self.len);
                    ops.push(DeviceOp::Copy {
                        dst: here,
                        src: theirs,
                        len: self.len,
                    });
                    grads.push(here);
                }
                _ => grads.push(theirs),
            }
        }
        ops.push(self.hyper_upload(worker, UpdateAt::full(pending.step, pending.epoch))?);
        let params = self.members[worker].residence.params;
        let state = addresses(&me.state);
        ops.extend(self.update_ops(worker, (params, &state), &grads, 0..self.len));
        Ok(ops)
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
        let queue = self.members[worker].queue();
        match &self.record {
            Record::Sync(replicas) => {
                // Held while reading: the first replica's worker cannot queue another step.
                let progress = lock(&replicas[0].progress);
                if progress.in_step {
                    return Err("the parameters are being updated".into());
                }
                let first = self.members[0].queue();
                first.bind()?;
                for other in replicas {
                    first.wait(&*other.done)?;
                }
                // SAFETY: the replica's parameters and its average hold `len` values; the
                // reads wait for the queue's work, and the waits above for every replica's
                // last step.
                unsafe {
                    first.read(self.members[0].residence.params, params)?;
                    for (slot, values) in replicas[0].state.iter().zip(state.iter_mut()) {
                        first.read(slot.address(), values)?;
                    }
                }
                if let Some(pending) = progress.pending {
                    self.apply_on_host(replicas, pending, params, state)?;
                }
            }
            Record::Async {
                params: store,
                state: slots,
                shards,
                ..
            } => {
                queue.bind()?;
                for shard in shards {
                    queue.wait(&**lock(&shard.last))?;
                }
                // SAFETY: both hold the `len` values; the waits above order every update first.
                unsafe {
                    queue.read(store.address(), params)?;
                    for (slot, values) in slots.iter().zip(state.iter_mut()) {
                        queue.read(slot.address(), values)?;
                    }
                }
            }
        }
        queue.bind()
    }

    /// Applies `pending` to `params` and `state` on the host, from every replica's outbox: the
    /// optimiser's own arithmetic, which its kernel is bit for bit.
    fn apply_on_host(
        &self,
        replicas: &[SyncReplica],
        pending: Pending,
        params: &mut [f32],
        state: &mut [&mut [f32]],
    ) -> Result<(), ReplicaError> {
        let mut grads = vec![vec![0.0f32; self.len]; replicas.len()];
        for ((member, replica), out) in self.members.iter().zip(replicas).zip(&mut grads) {
            let queue = member.queue();
            queue.bind()?;
            // SAFETY: the outbox holds `len` values; the read waits for its replica's queue.
            unsafe { queue.read(replica.outbox[pending.parity].address(), out)? };
        }
        for (range, decayed) in &self.spans {
            let parts: Vec<&[f32]> = grads.iter().map(|g| &g[range.clone()]).collect();
            let mut slots: Vec<&mut [f32]> =
                state.iter_mut().map(|s| &mut s[range.clone()]).collect();
            let piece = Piece {
                params: &mut params[range.clone()],
                state: &mut slots,
                grads: &parts,
                weight_decay: *decayed,
                rate_scale: 1.0,
            };
            self.optimizer.update(piece, pending.step, pending.epoch);
        }
        Ok(())
    }
}

/// The state vectors of `state` in new buffers on `queue`'s device.
fn upload_state(
    queue: &dyn DeviceQueue,
    state: &TrainState,
) -> Result<Vec<Box<dyn DeviceAlloc>>, ReplicaError> {
    state
        .slots
        .iter()
        .map(|slot| {
            let buffer = queue.alloc(slot.values.len())?;
            // SAFETY: the buffer was just allocated with as many values.
            unsafe { queue.write(buffer.address(), &slot.values)? };
            Ok(buffer)
        })
        .collect()
}

/// The addresses of `buffers`.
fn addresses(buffers: &[Box<dyn DeviceAlloc>]) -> Vec<u64> {
    buffers.iter().map(|b| b.address()).collect()
}

/// Copies every worker's `begun` count into a staleness record's half at `record`.
fn snapshot_begun(begun: &dyn DeviceAlloc, record: u64, workers: usize) -> DeviceOp {
    DeviceOp::Copy {
        dst: record,
        src: begun.address(),
        len: workers,
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
        let (params, begun, seen) = match &self.record {
            Record::Sync(replicas) => {
                let me = &replicas[worker];
                let mut progress = lock(&me.progress);
                // The others' last steps: their gradients are complete, and they have read the
                // outbox that this step overwrites.
                for (q, other) in replicas.iter().enumerate() {
                    if q != worker {
                        queue.wait(&*other.done)?;
                    }
                }
                let before = match progress.pending {
                    Some(pending) => self.pending_update(replicas, worker, pending)?,
                    None => Vec::new(),
                };
                let outbox = &me.outbox[(progress.steps % 2) as usize];
                let after = vec![DeviceOp::Copy {
                    dst: outbox.address(),
                    src: member.residence.grads,
                    len: self.len,
                }];
                // SAFETY: every address is one of the store's buffers or the replica's, of the
                // lengths given, alive as long as the store; the waits above order the other
                // replicas' work on them.
                unsafe { queue.around_next_step(before, after)? };
                progress.pending = None;
                progress.steps += 1;
                progress.in_step = true;
                return Ok(());
            }
            Record::Async {
                params,
                begun,
                seen,
                ..
            } => (params, begun, seen),
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
            queue.run(&[
                snapshot_begun(&**begun, record, workers),
                DeviceOp::Copy {
                    dst: member.residence.params,
                    src: params.address(),
                    len: self.len,
                },
            ])
        }
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
        let Record::Sync(replicas) = &self.record else {
            return Err(wrong_mode("publish"));
        };
        let queue = self.members[worker].queue();
        if queue.step_ops_pending() {
            return Err(
                "the replica's step did not take the store's work around it \
                        (its backend must run `DeviceQueue::around_next_step`'s operations)"
                    .into(),
            );
        }
        let me = &replicas[worker];
        let mut progress = lock(&me.progress);
        queue.record(&*me.done)?;
        progress.in_step = false;
        Ok(())
    }

    fn update_share(&self, worker: usize, step: u64, epoch: f64) -> Result<(), ReplicaError> {
        let Record::Sync(replicas) = &self.record else {
            return Err(wrong_mode("update_share"));
        };
        // Applied at the start of the replica's next step, or on the host by a read before it.
        let mut progress = lock(&replicas[worker].progress);
        let parity = ((progress.steps + 1) % 2) as usize;
        progress.pending = Some(Pending {
            step,
            epoch,
            parity,
        });
        Ok(())
    }

    fn apply(
        &self,
        (worker, workers): (usize, usize),
        _: &mut R,
        begin: &mut dyn FnMut() -> UpdateAt,
    ) -> Result<bool, ReplicaError> {
        let Record::Async {
            params,
            state,
            shards,
            begun,
            seen,
        } = &self.record
        else {
            return Err(wrong_mode("apply"));
        };
        let member = &self.members[worker];
        let queue = member.queue();
        let update = begin();
        let first = worker * shards.len() / workers.max(1);
        let mut seen = lock(&seen[worker]);
        // What others had begun when this update begins (the second half of its record), then
        // this one counted as begun.
        let record = at(seen.ring.address(), (2 * seen.current + 1) * workers);
        seen.own = seen.own.wrapping_add(1);
        seen.pending += 1;
        // SAFETY: the record's second half holds `workers` values, as `begun` does; `hyper`
        // the kernel's values twice (the update kernels of this worker's last update, which read it, are earlier on
        // the same queue).
        unsafe {
            queue.run(&[
                snapshot_begun(&**begun, record, workers),
                DeviceOp::Upload {
                    dst: at(begun.address(), worker),
                    values: vec![f32::from_bits(seen.own)],
                },
                self.hyper_upload(worker, update)?,
            ])?;
        }
        for shard in shards[first..].iter().chain(&shards[..first]) {
            let event = lock(&shard.last);
            queue.wait(&**event)?;
            let ops = self.update_ops(
                worker,
                (params.address(), &addresses(state)),
                &[member.residence.grads],
                shard.range.clone(),
            );
            // SAFETY: the store's buffers and the replica's gradients hold `len` values; the
            // shard's earlier updates run before this one (the wait, under the shard's lock).
            unsafe { queue.run(&ops)? };
            queue.record(&**event)?;
        }
        // The replica loads from the record on the device before its next step.
        Ok(false)
    }

    fn l2_loss(&self, worker: usize, weight_decay: f32) -> Result<f32, ReplicaError> {
        let mut params = vec![0.0; self.len];
        let mut state = vec![vec![0.0; self.len]; self.slot_names.len()];
        let mut slots: Vec<&mut [f32]> = state.iter_mut().map(Vec::as_mut_slice).collect();
        self.read_record(worker, &mut params, &mut slots)?;
        let sum = self
            .spans
            .iter()
            .filter(|(_, decayed)| *decayed)
            .map(|(range, _)| cpu::sum_squares(&params[range.clone()]))
            .sum();
        Ok(l2_term(weight_decay, sum))
    }

    fn save_into(&self, state: &mut TrainState) -> Result<(), ReplicaError> {
        // The caller may be any thread: the main one after the run, the watchdog during it.
        if state.slots.len() != self.slot_names.len() {
            return Err("the state does not have the store's optimiser slots".into());
        }
        let mut slots: Vec<&mut [f32]> = state
            .slots
            .iter_mut()
            .map(|s| s.values.as_mut_slice())
            .collect();
        self.read_record(0, &mut state.params, &mut slots)
    }

    fn empty_state(&self, step: u64) -> TrainState {
        zeros(self.len, &self.slot_names, step)
    }
}
