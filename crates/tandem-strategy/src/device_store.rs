//! The parameters of record in device memory, beside replicas that compute on devices:
//! [`DeviceSyncStore`] (replicas on any devices; also a lone asynchronous replica's, whose
//! updates have nobody else's to be ordered against) and [`DeviceAsyncStore`] (all on one, their
//! queues in one order). A step then moves no parameters or gradients over the host bus: the
//! store queues the optimiser's update kernel (and, sync, device copies and events) on the
//! workers' own queues, inside each replica's next step, one graph with it, and the host waits
//! for the device only when it reads the store (a log line's L2 term, a save).
//!
//! Both are opened only where they can serve the replicas (`None` otherwise, and the host
//! store serves them): every replica is [resident](Replica::residence), and the optimiser has a
//! device update ([`Optimizer::device_update`]) that their queues run
//! ([`DeviceQueue::has_update`]); for replicas that compute in a narrower type than their f32
//! buffers hold (bf16, f16: [`Residence::precision`]), one that also writes the rounded copy
//! of the f32 master weights that they read ([`DeviceQueue::rounds_to`]). The host is never
//! waited on within a step: ordering between workers is events on their queues (sync) or
//! their queues' one order (async), and the host's barriers only ensure that an event is
//! recorded before it is waited on.

use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

use tandem_core::{
    f64_of_slots, DType, DeviceAlloc, DeviceOp, DeviceQueue, Optimizer, ParamSpan, Replica,
    ReplicaError, Residence, RoundedCopy, TrainState, MAX_HYPER,
};
use tandem_tensor::round_to;

use crate::store::{l2_term, zeros, UpdateAt};

mod asynchronous;
mod sync;

pub use asynchronous::DeviceAsyncStore;
pub use sync::DeviceSyncStore;

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

/// What both device stores hold: the workers' queues, the optimiser's device update and where
/// each parameter span lies.
struct Devices<'o, O: Optimizer + ?Sized> {
    optimizer: &'o O,
    /// The optimiser's update kernel ([`tandem_core::DeviceUpdate::kernel`]).
    kernel: &'static str,
    /// How many values it reads for a span ([`tandem_core::DeviceUpdate::hyper`]).
    hyper_len: usize,
    spans: Vec<(Range<usize>, bool)>,
    len: usize,
    /// The type of the gradients the updates read: the replicas' ([`Residence::dtype`]), or
    /// that of the exchange between them ([`DeviceOp::Compress`]).
    grads_dtype: DType,
    /// Where the replicas compute in a narrower type ([`Residence::precision`]): their
    /// parameters are then a [`RoundedCopy`] of the store's f32 master weights, which every
    /// update writes in the same pass.
    copy: Option<DType>,
    slot_names: Vec<String>,
    members: Vec<Member>,
    /// Where [`DeviceOp::SumSquares`] leaves each regularised span's sum of squares (8 bytes
    /// each, on the first member's device), which the host reads for the L2 term; held while
    /// a term is computed.
    sums: Mutex<Box<dyn DeviceAlloc>>,
}

/// What the replicas' queues say of them, for a store to decide whether it serves them.
struct Fleet {
    /// Every replica's queue is in the same memory.
    one_device: bool,
    /// The fewest gradient vectors any queue's update kernel averages at once.
    max_gradients: usize,
}

impl<'o, O: Optimizer + ?Sized> Devices<'o, O> {
    /// The queues of `replicas`, if every one is resident, `serves` accepts them and
    /// `optimizer` has a device update that every queue runs (from gradients `exchanged` in
    /// that type, where given, which every queue then compresses to); `None` otherwise.
    /// `state` must fit `layout` and `optimizer` (the strategies check it first).
    fn open<R: Replica>(
        replicas: &[R],
        state: &TrainState,
        layout: &[ParamSpan],
        optimizer: &'o O,
        (exchanged, serves): (Option<DType>, impl FnOnce(&Fleet) -> bool),
    ) -> Result<Option<(Self, Fleet)>, ReplicaError> {
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
        // The parameters of record are f32, as the replicas' buffers must be; a replica that
        // computes in a narrower type gets their rounded copy, where its queue writes one.
        let grads_dtype = exchanged.unwrap_or(first.dtype);
        if exchanged.is_some_and(|dtype| !residences.iter().all(|r| r.queue.compresses_to(dtype))) {
            return Ok(None);
        }
        let precision = first.precision;
        if residences
            .iter()
            .any(|r| r.dtype != DType::F32 || r.precision != precision)
        {
            return Ok(None);
        }
        let copy = (precision != DType::F32).then_some(precision);
        if copy.is_some_and(|dtype| !residences.iter().all(|r| r.queue.rounds_to(dtype))) {
            return Ok(None);
        }
        let memory = first.queue.memory();
        let fleet = Fleet {
            one_device: residences.iter().all(|r| r.queue.memory() == memory),
            max_gradients: residences
                .iter()
                .map(|r| r.queue.max_gradients())
                .min()
                .unwrap_or(0),
        };
        let kernel = optimizer
            .device_update(state.step, 0.0, false, 1.0)
            .filter(|update| update.hyper.len() <= MAX_HYPER)
            .map(|update| (update.kernel, update.hyper.len()))
            .filter(|(kernel, _)| {
                residences
                    .iter()
                    .all(|r| r.queue.has_update(kernel, state.slots.len(), grads_dtype))
            });
        let Some((kernel, hyper_len)) = kernel.filter(|_| serves(&fleet)) else {
            return Ok(None);
        };
        let members = residences
            .into_iter()
            .map(|residence| {
                residence.queue.bind()?;
                let hyper = residence.queue.alloc(2 * hyper_len, DType::F32)?;
                Ok(Member { residence, hyper })
            })
            .collect::<Result<Vec<_>, ReplicaError>>()?;
        let mut spans = Vec::with_capacity(layout.len());
        let mut offset = 0;
        for span in layout {
            spans.push((offset..offset + span.len(), span.weight_decay));
            offset += span.len();
        }
        let decayed = spans.iter().filter(|(_, decayed)| *decayed).count();
        members[0].queue().bind()?;
        let sums = Mutex::new(members[0].queue().alloc(2 * decayed, DType::F32)?);
        let devices = Self {
            optimizer,
            kernel,
            hyper_len,
            spans,
            len: state.params.len(),
            grads_dtype,
            copy,
            slot_names: state.slots.iter().map(|s| s.name.clone()).collect(),
            members,
            sums,
        };
        Ok(Some((devices, fleet)))
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
    /// [`hyper_upload`](Self::hyper_upload); writing the parameters' copy too where given (its
    /// address that of the first parameter's).
    fn update_ops(
        &self,
        worker: usize,
        (params, state, copy): (u64, &[u64], Option<RoundedCopy>),
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
                    params: DType::F32.at(params, piece.start),
                    state: (state.iter())
                        .map(|&s| DType::F32.at(s, piece.start))
                        .collect(),
                    grads: (grads.iter())
                        .map(|&g| self.grads_dtype.at(g, piece.start))
                        .collect(),
                    grads_dtype: self.grads_dtype,
                    len: piece.len(),
                    hyper: DType::F32.at(hyper, if *decayed { 0 } else { self.hyper_len }),
                    copy: copy.map(|copy| RoundedCopy {
                        params: DType::F32.at(copy.params, piece.start),
                        ..copy
                    }),
                })
            })
            .collect()
    }

    /// Writes `params` at `at` in `queue`'s memory, rounded to the replicas' type where they
    /// compute in a narrower one: a replica's parameters, or the store's copy of them.
    ///
    /// # Safety
    ///
    /// `at` holds `params.len()` f32 values of `queue`'s device that no queued work uses.
    unsafe fn write_replica_params(
        &self,
        queue: &dyn DeviceQueue,
        at: u64,
        params: &[f32],
    ) -> Result<(), ReplicaError> {
        let Some(dtype) = self.copy else {
            // SAFETY: the caller's promise.
            return unsafe { queue.write(at, params) };
        };
        let mut rounded = params.to_vec();
        round_to(dtype, &mut rounded);
        // SAFETY: the caller's promise.
        unsafe { queue.write(at, &rounded) }
    }

    /// The L2 term of the `f32` parameters at `params`, computed on `queue` (in the first
    /// member's memory) behind its work so far: each regularised span's sum of squares on the
    /// device ([`DeviceOp::SumSquares`]), the sums read back (8 bytes a span, not the
    /// parameters) and added in span order.
    ///
    /// # Safety
    ///
    /// `params` holds the store's `len` values in `queue`'s memory, and the work that writes
    /// them is ordered before the queue's next (on it, or by a wait on it).
    unsafe fn l2_loss(
        &self,
        queue: &dyn DeviceQueue,
        params: u64,
        weight_decay: f32,
    ) -> Result<f32, ReplicaError> {
        let sums = lock(&self.sums);
        let decayed = self.spans.iter().filter(|(_, decayed)| *decayed);
        let ops: Vec<DeviceOp> = (decayed.enumerate())
            .map(|(i, (range, _))| DeviceOp::SumSquares {
                dst: DType::F32.at(sums.address(), 2 * i),
                src: DType::F32.at(params, range.start),
                len: range.len(),
            })
            .collect();
        let mut slots = vec![0.0f32; 2 * ops.len()];
        // SAFETY: the caller's promises for the parameters; `sums` holds 8 bytes a regularised
        // span, and its lock keeps other readers out until the read is through.
        unsafe {
            queue.run(&ops)?;
            queue.read(sums.address(), &mut slots)?;
        }
        let sum = (slots.chunks_exact(2))
            .map(|pair| f64_of_slots([pair[0], pair[1]]))
            .sum();
        Ok(l2_term(weight_decay, sum))
    }

    /// Fills `state` with what `read` gives (a store's record).
    fn save_into(
        &self,
        state: &mut TrainState,
        read: impl FnOnce(&mut [f32], &mut [&mut [f32]]) -> Result<(), ReplicaError>,
    ) -> Result<(), ReplicaError> {
        // The caller may be any thread: the main one after the run, the watchdog during it.
        if state.slots.len() != self.slot_names.len() {
            return Err("the state does not have the store's optimiser slots".into());
        }
        let mut slots: Vec<&mut [f32]> = state
            .slots
            .iter_mut()
            .map(|s| s.values.as_mut_slice())
            .collect();
        read(&mut state.params, &mut slots)
    }

    /// A state of the store's shape (zeros) at `step`.
    fn empty_state(&self, step: u64) -> TrainState {
        zeros(self.len, &self.slot_names, step)
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
            let buffer = queue.alloc(slot.values.len(), DType::F32)?;
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

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding a store's lock but the driver's own calls; what it guards
    // stays usable.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
