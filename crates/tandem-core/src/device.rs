//! What a store needs to keep the parameters of record in device memory, beside replicas that
//! compute there: the replica's buffers ([`Residence`]) and the queue its work runs on
//! ([`DeviceQueue`]), as addresses and operations. The crate still knows no CUDA: a device
//! backend implements the trait.

use std::any::Any;
use std::sync::Arc;

use crate::{DType, ReplicaError};

/// A step's data loss, as [`Replica::compute_gradients`](crate::Replica::compute_gradients)
/// reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepLoss {
    /// Known at once, on the host.
    Known(f32),
    /// Left in device memory; [`Replica::take_losses`](crate::Replica::take_losses) reads it
    /// later, with the losses of the steps in between, so that a step needs no wait for the
    /// device.
    OnDevice,
}

/// The most values an update kernel reads at its [`DeviceOp::Update::hyper`] address.
pub const MAX_HYPER: usize = 8;

/// An optimiser's update of one piece on a device, as the optimiser describes it
/// ([`Optimizer::device_update`](crate::Optimizer::device_update)): the update kernel a device
/// backend knows by name, and the values it reads for the piece (the learning rate and the
/// like, computed on the host each step). The kernel's arithmetic is the optimiser's own
/// [`update`](crate::Optimizer::update), bit for bit, so that a store may apply either.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceUpdate {
    /// The kernel's name, as [`DeviceQueue::has_update`] knows it (e.g. `"sgd_ema_update"`).
    pub kernel: &'static str,
    /// What the kernel reads at `hyper`: at most [`MAX_HYPER`] values, their meaning the
    /// kernel's.
    pub hyper: Vec<f32>,
}

/// Device memory a [`DeviceQueue`] allocated, freed when dropped.
pub trait DeviceAlloc: Send + Sync {
    /// Its device address.
    fn address(&self) -> u64;

    /// The type of its values, as [`DeviceQueue::alloc`] was asked for.
    fn dtype(&self) -> DType;
}

/// A marker in a queue's work (a CUDA event): [`DeviceQueue::wait`] makes another queue's
/// later work wait until the work before the last [`DeviceQueue::record`] has run.
pub trait DeviceEvent: Send + Sync {
    /// For the queue's own downcast.
    fn as_any(&self) -> &dyn Any;
}

/// One operation on a [`DeviceQueue`], over device memory named by address. Each says the
/// type of the values it moves; the parameters of record and the optimiser's state are `f32`.
#[derive(Debug, Clone, PartialEq)]
pub enum DeviceOp {
    /// Copies `len` values of type `dtype` from `src` to `dst` (either may be another
    /// device's memory).
    Copy {
        /// Where to.
        dst: u64,
        /// Where from.
        src: u64,
        /// How many values.
        len: usize,
        /// Their type, the same at both ends.
        dtype: DType,
    },
    /// Copies `values` from the host to the `f32` memory at `dst`. The values are this call's input: a queue that
    /// replays a step as a captured graph copies them in before the graph, each time.
    Upload {
        /// Where to.
        dst: u64,
        /// What.
        values: Vec<f32>,
    },
    /// The optimiser update `kernel` of `len` `f32` parameters at `params` and their `f32`
    /// state vectors at `state` (in the optimiser's
    /// [`state_names`](crate::Optimizer::state_names) order) with the mean of the gradients of
    /// type `grads_dtype` at `grads` (summed in their order; at most
    /// [`DeviceQueue::max_gradients`]), reading the `f32` [`DeviceUpdate::hyper`] values at
    /// `hyper`; all in the queue's own memory. 16-bit gradients (`grads_dtype` bf16) come
    /// from an exchange ([`DeviceOp::Compress`]), each already divided by their count: they are
    /// summed (in f32, from zero, in their order) instead. With a [`RoundedCopy`], the same pass also
    /// writes the new parameters rounded to its type: the copy that a replica computing in a
    /// narrower type than its `f32` master weights reads.
    Update {
        /// The kernel ([`DeviceUpdate::kernel`]).
        kernel: &'static str,
        /// The parameters.
        params: u64,
        /// The optimiser's state vectors.
        state: Vec<u64>,
        /// The gradient vectors to average.
        grads: Vec<u64>,
        /// The gradients' type ([`Residence::dtype`]).
        grads_dtype: DType,
        /// How many values each holds.
        len: usize,
        /// The kernel's [`DeviceUpdate::hyper`] values.
        hyper: u64,
        /// Where the updated parameters are also written, rounded (`None`: nowhere).
        copy: Option<RoundedCopy>,
    },
    /// Writes the `len` `f32` values at `src`, each divided by `divisor` and rounded to
    /// nearest (ties to even) `dtype`, as `len` values of `dtype` at `dst`: a replica's
    /// gradients as a 16-bit exchange sends them, divided by the worker count first so that
    /// their sum on arrival is the mean.
    Compress {
        /// Where to (`dtype` values).
        dst: u64,
        /// Where from (`f32` values).
        src: u64,
        /// How many values.
        len: usize,
        /// What each is divided by before it is rounded.
        divisor: f32,
        /// The type written.
        dtype: DType,
    },
    /// Rounds the `len` `f32` values at `at` in place, each to nearest (ties to even) `dtype`
    /// and held in its `f32` (`f32`: nothing), as a [`RoundedCopy`] is: the parameters of
    /// record copied into a replica that computes in `dtype`, on a queue that
    /// [rounds to](DeviceQueue::rounds_to) it.
    Round {
        /// The values.
        at: u64,
        /// How many.
        len: usize,
        /// The type they are rounded to.
        dtype: DType,
    },
    /// Writes the sum of the squares of the `len` `f32` values at `src`, computed in `f64` in
    /// an order of the queue's own (not the host's), as the `f64` at `dst` (8 bytes: two `f32`
    /// slots, read with [`f64_of_slots`]): the L2 term of parameters on the device, one value
    /// read back instead of the parameters.
    SumSquares {
        /// Where the sum goes (8 bytes).
        dst: u64,
        /// The values.
        src: u64,
        /// How many.
        len: usize,
    },
}

/// The `f64` that [`DeviceOp::SumSquares`] wrote, as the two `f32` slots a
/// [`DeviceQueue::read`] of its 8 bytes gives (little-endian: the low half first).
pub fn f64_of_slots([low, high]: [f32; 2]) -> f64 {
    f64::from_bits(u64::from(low.to_bits()) | u64::from(high.to_bits()) << 32)
}

/// The two `f32` slots that hold `value` where [`DeviceOp::SumSquares`] writes it (the
/// inverse of [`f64_of_slots`]).
pub fn slots_of_f64(value: f64) -> [f32; 2] {
    let bits = value.to_bits();
    [
        f32::from_bits(bits as u32),
        f32::from_bits((bits >> 32) as u32),
    ]
}

/// Where a [`DeviceOp::Update`] also writes the parameters it updates, each rounded to
/// nearest (ties to even) to `dtype` and held in an `f32`: the parameters of a replica whose
/// [`Residence::precision`] is `dtype`, beside the `f32` master weights that the update keeps
/// (`f32`: a plain copy, for a replica that reads parameters of record kept elsewhere).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RoundedCopy {
    /// Where the copy of the update's first parameter goes (`f32` slots, `len` of them).
    pub params: u64,
    /// The type the values are rounded to.
    pub dtype: DType,
}

/// The ordered queue of work of one replica on one device (a CUDA stream), over device memory
/// named by address. Everything but [`read`](Self::read) and [`write`](Self::write) is
/// queued behind the replica's earlier work and returns without waiting for the device.
///
/// The operations that take addresses are `unsafe`: the caller promises that each names live
/// memory of the length given, on a device this queue can reach, and that nothing else writes
/// it while the queued operation runs (ordering with other queues is the caller's, through
/// [events](Self::record) or a [shared order](Self::share_order)).
pub trait DeviceQueue: Send + Sync {
    /// Which memory the queue's device has: a kernel on this queue may read only memory of
    /// queues with the same answer; a [`DeviceOp::Copy`] reaches any.
    fn memory(&self) -> usize;

    /// Makes the device usable from the calling thread.
    fn bind(&self) -> Result<(), ReplicaError>;

    /// Device memory for `len` values of type `dtype` on this queue's device (contents
    /// undefined).
    fn alloc(&self, len: usize, dtype: DType) -> Result<Box<dyn DeviceAlloc>, ReplicaError>;

    /// How many gradient vectors one [`DeviceOp::Update`] averages at most.
    fn max_gradients(&self) -> usize;

    /// Whether [`DeviceOp::Update`] runs `kernel` over `states` state vectors and gradients
    /// of type `grads` here: a store keeps the parameters of record on the device only for an
    /// optimiser whose update does, for replicas computing in that type.
    fn has_update(&self, kernel: &str, states: usize, grads: DType) -> bool;

    /// Whether a [`DeviceOp::Update`] here writes a [`RoundedCopy`] of type `dtype` and a
    /// [`DeviceOp::Round`] rounds to it: a store keeps the master weights of replicas computing
    /// in `dtype` on the device only where both do.
    fn rounds_to(&self, dtype: DType) -> bool;

    /// The queue as [`Any`](std::any::Any), for [`share_order`](Self::share_order) to see
    /// whether another queue is of its own kind.
    fn as_any(&self) -> &dyn std::any::Any;

    /// Makes this queue's later work, and its replica's, run in one order with `other`'s (a
    /// queue of the same device): each runs after everything queued on either before it, with
    /// no [events](Self::record) between them (a CUDA queue moves to `other`'s stream, after
    /// waiting for its own work). `false` (the default) where it cannot: nothing changed.
    fn share_order(&self, other: &dyn DeviceQueue) -> Result<bool, ReplicaError> {
        let _ = other;
        Ok(false)
    }

    /// Whether [`DeviceOp::Compress`] writes `dtype` here and [`DeviceOp::Update`] reads
    /// gradients of that type: a store exchanges gradients in `dtype` between replicas only
    /// where their queues do both.
    fn compresses_to(&self, dtype: DType) -> bool;

    /// Queues `ops`, in order. An [`Upload`](DeviceOp::Upload)'s values are copied before this
    /// returns, so the caller may drop them at once.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn run(&self, ops: &[DeviceOp]) -> Result<(), ReplicaError>;

    /// Makes `before` and `after` part of the replica's next step: queued ahead of its work and
    /// behind it, and captured with it where the replica's backend replays its steps as one
    /// graph (equal operations on equal addresses replay one graph; only uploads' values may
    /// differ). The replica's next
    /// [`compute_gradients`](crate::Replica::compute_gradients) takes them; until then
    /// [`step_ops_pending`](Self::step_ops_pending) says so.
    ///
    /// # Safety
    /// See the trait; the addresses must stay valid until the step has run, and for as long
    /// as a graph that captured them may be launched again (the store's lifetime).
    unsafe fn around_next_step(
        &self,
        before: Vec<DeviceOp>,
        after: Vec<DeviceOp>,
    ) -> Result<(), ReplicaError>;

    /// Whether operations given to [`around_next_step`](Self::around_next_step) are still
    /// waiting for a step to take them.
    fn step_ops_pending(&self) -> bool;

    /// Copies `src.len()` host values to the `f32` memory at `dst` and waits until they have
    /// landed.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn write(&self, dst: u64, src: &[f32]) -> Result<(), ReplicaError>;

    /// Waits for the queue's work so far, then copies `dst.len()` values of the `f32` memory at
    /// `src` to the host.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn read(&self, src: u64, dst: &mut [f32]) -> Result<(), ReplicaError>;

    /// [`read`](Self::read) of 16-bit memory (bf16 or f16 values, their bits).
    ///
    /// # Safety
    /// See the trait.
    unsafe fn read_bits16(&self, src: u64, dst: &mut [u16]) -> Result<(), ReplicaError>;

    /// A new event of this queue's device.
    fn event(&self) -> Result<Box<dyn DeviceEvent>, ReplicaError>;

    /// Marks the end of the work queued so far with `event`.
    fn record(&self, event: &dyn DeviceEvent) -> Result<(), ReplicaError>;

    /// Makes later work on this queue wait for the work before `event`'s last
    /// [`record`](Self::record) (whichever queue recorded it).
    fn wait(&self, event: &dyn DeviceEvent) -> Result<(), ReplicaError>;
}

/// Where a replica that computes on a device keeps its parameters and gradients (flat, laid
/// out as [`Replica::layout`](crate::Replica::layout) says), and the queue its work runs on.
/// With it a store keeps the parameters of record on the device: it writes the replica's
/// parameters and reads its gradients in place, between the replica's steps, instead of
/// [`set_params`](crate::Replica::set_params) and
/// [`read_gradients`](crate::Replica::read_gradients) through the host.
#[derive(Clone)]
pub struct Residence {
    /// The replica's queue: its steps run there, in call order.
    pub queue: Arc<dyn DeviceQueue>,
    /// The address of its parameters.
    pub params: u64,
    /// The address of its gradients of the last step.
    pub grads: u64,
    /// The type of the values its parameter and gradient buffers hold.
    pub dtype: DType,
    /// What it computes in: the type its parameters are rounded to. Where narrower than
    /// `dtype` (16-bit values held in `f32` slots), a store writes its parameters as a
    /// [`RoundedCopy`] of master weights kept elsewhere.
    pub precision: DType,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slots hold the f64's bytes as memory does on a little-endian device: the low word
    /// first; every value, NaN's bits included, comes back as it went.
    #[test]
    fn an_f64_goes_through_two_f32_slots_unchanged() {
        let values = [
            0.0,
            -0.0,
            1.0,
            1.0 + f64::EPSILON,
            -3.5e-310,
            6.02e23,
            f64::NAN,
        ];
        for value in values {
            let slots = slots_of_f64(value);
            let bytes: Vec<u8> = slots.iter().flat_map(|s| s.to_le_bytes()).collect();
            assert_eq!(bytes, value.to_le_bytes(), "{value}");
            assert_eq!(f64_of_slots(slots).to_bits(), value.to_bits(), "{value}");
        }
    }
}
