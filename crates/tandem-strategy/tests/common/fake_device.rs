//! A [`DeviceQueue`] in host memory, so that the device-resident store's protocol (which
//! buffers it copies, where its updates read and write, what it uploads) runs in the default
//! test suite, without a GPU or the driver stand-in. Its "device memory" is one arena of
//! blocks named by byte address, shared by every queue, each addressed in the type it was
//! allocated with (the values are held as f32 whatever the type: the fake checks the store's
//! addresses and types; it rounds only an update's rounded copy, as the kernels write it);
//! each queue runs its operations at
//! once, in order, so it shows what the store asks for but not the ordering between queues that
//! the store's events provide on a real device (the stand-in's CI job checks that).

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tandem_core::{
    DType, DeviceAlloc, DeviceEvent, DeviceOp, DeviceQueue, ReplicaError, Residence,
};
use tandem_optim::adam_update;
use tandem_tensor::cpu::{self, UpdateStep};

/// One allocation: the device memory it is in, its type and its values.
struct Allocated {
    memory: usize,
    dtype: DType,
    values: Vec<f32>,
}

/// The device memory of every fake queue: blocks by their first byte's address.
struct Arena {
    next: u64,
    blocks: BTreeMap<u64, Allocated>,
}

static ARENA: Mutex<Arena> = Mutex::new(Arena {
    next: 0x1000,
    blocks: BTreeMap::new(),
});

fn arena() -> MutexGuard<'static, Arena> {
    ARENA.lock().unwrap_or_else(|p| p.into_inner())
}

impl Arena {
    /// The `len` values of type `dtype` at byte address `at`, which must lie inside one block
    /// of that type.
    fn span(&mut self, at: u64, len: usize, dtype: DType) -> &mut [f32] {
        let (&start, block) = self
            .blocks
            .range_mut(..=at)
            .next_back()
            .unwrap_or_else(|| panic!("no device memory at {at:#x}"));
        assert_eq!(block.dtype, dtype, "{dtype} values at {at:#x}");
        let size = dtype.size() as u64;
        assert_eq!((at - start) % size, 0, "{at:#x} is not a {dtype}'s address");
        let from = ((at - start) / size) as usize;
        let held = block.values.len();
        (block.values)
            .get_mut(from..from + len)
            .unwrap_or_else(|| panic!("{len} values at {at:#x} run past a block of {held}"))
    }

    fn read(&mut self, at: u64, len: usize, dtype: DType) -> Vec<f32> {
        self.span(at, len, dtype).to_vec()
    }

    /// Which device's memory the block holding byte address `at` is in.
    fn memory_of(&self, at: u64) -> usize {
        let (_, block) = (self.blocks.range(..=at).next_back())
            .unwrap_or_else(|| panic!("no device memory at {at:#x}"));
        block.memory
    }
}

/// A block of the arena, freed when dropped.
struct Block(u64, DType);

impl DeviceAlloc for Block {
    fn address(&self) -> u64 {
        self.0
    }
    fn dtype(&self) -> DType {
        self.1
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        arena().blocks.remove(&self.0);
    }
}

struct Event;

impl DeviceEvent for Event {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Runs `ops` on the arena, in order, as a queue of device `memory` would: an update reads and
/// writes its own device's memory only (a copy may cross devices).
fn run(ops: &[DeviceOp], memory: usize) {
    let mut arena = arena();
    for op in ops {
        match op {
            DeviceOp::Copy {
                dst,
                src,
                len,
                dtype,
            } => {
                let values = arena.read(*src, *len, *dtype);
                arena.span(*dst, *len, *dtype).copy_from_slice(&values);
            }
            DeviceOp::Compress {
                dst,
                src,
                len,
                divisor,
                dtype,
            } => {
                assert_eq!(
                    arena.memory_of(*src),
                    memory,
                    "compressing another device's"
                );
                let mut values = arena.read(*src, *len, DType::F32);
                values.iter_mut().for_each(|v| *v /= divisor);
                tandem_tensor::round_to(*dtype, &mut values);
                arena.span(*dst, *len, *dtype).copy_from_slice(&values);
            }
            DeviceOp::Round { at, len, dtype } => {
                tandem_tensor::round_to(*dtype, arena.span(*at, *len, DType::F32));
            }
            DeviceOp::SumSquares { dst, src, len } => {
                // The host's sum, in its order: the stores' L2 terms then equal the host
                // store's bit for bit here (a GPU sums in an order of its own).
                let sum = cpu::sum_squares(&arena.read(*src, *len, DType::F32));
                let slots = tandem_core::slots_of_f64(sum);
                arena.span(*dst, 2, DType::F32).copy_from_slice(&slots);
            }
            DeviceOp::Upload { dst, values } => {
                (arena.span(*dst, values.len(), DType::F32)).copy_from_slice(values);
            }
            DeviceOp::Update {
                kernel,
                params,
                state,
                grads,
                grads_dtype,
                len,
                hyper,
                copy,
            } => {
                let copy_at = copy.map(|c| c.params);
                for &at in [*params, *hyper]
                    .iter()
                    .chain(state)
                    .chain(grads)
                    .chain(&copy_at)
                {
                    let owner = arena.memory_of(at);
                    assert_eq!(
                        owner, memory,
                        "an update on device {memory} reads device {owner}"
                    );
                }
                let values = match *kernel {
                    "sgd_ema_update" => 3,
                    _ => 6,
                };
                let hyper = arena.read(*hyper, values, DType::F32);
                let mut grads: Vec<Vec<f32>> = (grads.iter())
                    .map(|&g| arena.read(g, *len, *grads_dtype))
                    .collect();
                if *grads_dtype == DType::BF16 {
                    // An exchange's, each divided by their count: summed from zero in order.
                    let mut sum = vec![0.0f32; *len];
                    for part in &grads {
                        sum.iter_mut().zip(part).for_each(|(s, g)| *s += g);
                    }
                    grads = vec![sum];
                } else {
                    assert_eq!(*grads_dtype, DType::F32, "f32 or bf16 gradients");
                }
                let grads: Vec<&[f32]> = grads.iter().map(Vec::as_slice).collect();
                let mut p = arena.read(*params, *len, DType::F32);
                let mut slots: Vec<Vec<f32>> = (state.iter())
                    .map(|&s| arena.read(s, *len, DType::F32))
                    .collect();
                let mut views: Vec<&mut [f32]> = slots.iter_mut().map(Vec::as_mut_slice).collect();
                match (*kernel, &mut views[..]) {
                    ("sgd_ema_update", [e]) => {
                        let step = UpdateStep {
                            learning_rate: hyper[0],
                            weight_decay: hyper[1],
                            ema_decay: hyper[2],
                        };
                        cpu::sgd_ema_update(&mut p, e, &grads, step);
                    }
                    ("adam_update", views) => {
                        let values = hyper[..6].try_into().expect("six values");
                        adam_update(&mut p, views, &grads, values);
                    }
                    (other, _) => panic!("no kernel {other} here"),
                }
                arena.span(*params, *len, DType::F32).copy_from_slice(&p);
                if let Some(copy) = copy {
                    tandem_tensor::round_to(copy.dtype, &mut p);
                    arena
                        .span(copy.params, *len, DType::F32)
                        .copy_from_slice(&p);
                }
                for (&at, values) in state.iter().zip(&slots) {
                    arena.span(at, *len, DType::F32).copy_from_slice(values);
                }
            }
        }
    }
}

/// One replica's queue; `memory` says which device's memory it has (queues with different
/// ones make the store stage copies between them, as on several GPUs).
pub struct FakeQueue {
    memory: usize,
    /// Whether its updates write copies of the parameters ([`DeviceQueue::rounds_to`]).
    rounds: bool,
    /// How many replicas' gradients one update kernel may average.
    max_gradients: usize,
    step_ops: Mutex<Option<(Vec<DeviceOp>, Vec<DeviceOp>)>>,
    /// How many values [`DeviceQueue::write`] has copied from the host.
    written: AtomicUsize,
}

impl FakeQueue {
    pub fn new(memory: usize, max_gradients: usize, rounds: bool) -> Self {
        Self {
            memory,
            rounds,
            max_gradients,
            step_ops: Mutex::new(None),
            written: AtomicUsize::new(0),
        }
    }

    /// What [`DeviceQueue::around_next_step`] gave for the step now starting.
    fn take_step_ops(&self) -> (Vec<DeviceOp>, Vec<DeviceOp>) {
        self.step_ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or_default()
    }
}

impl DeviceQueue for FakeQueue {
    fn memory(&self) -> usize {
        self.memory
    }
    fn bind(&self) -> Result<(), ReplicaError> {
        Ok(())
    }
    fn alloc(&self, len: usize, dtype: DType) -> Result<Box<dyn DeviceAlloc>, ReplicaError> {
        let mut arena = arena();
        let at = arena.next;
        // A gap after every block, so that a span running past its block is caught.
        arena.next += dtype.bytes(len) as u64 + 256;
        let block = Allocated {
            memory: self.memory,
            dtype,
            values: vec![f32::NAN; len],
        };
        arena.blocks.insert(at, block);
        Ok(Box::new(Block(at, dtype)))
    }
    fn max_gradients(&self) -> usize {
        self.max_gradients
    }
    /// The kernels of tandem's optimisers, run with their host arithmetic, over gradients of
    /// any type (the fake holds every value as f32): that a store does not send narrow
    /// replicas' gradients to them is then the store's own rule, which a test can see.
    fn has_update(&self, kernel: &str, states: usize, _: DType) -> bool {
        matches!(
            (kernel, states),
            ("sgd_ema_update", 1) | ("adam_update", 2 | 3)
        )
    }
    fn rounds_to(&self, _: DType) -> bool {
        self.rounds
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    /// Another fake queue of the same memory: every queue runs its work at once, so any two
    /// run in one order.
    fn share_order(&self, other: &dyn DeviceQueue) -> Result<bool, ReplicaError> {
        let other = other.as_any().downcast_ref::<FakeQueue>();
        Ok(other.is_some_and(|other| other.memory == self.memory))
    }
    fn compresses_to(&self, dtype: DType) -> bool {
        dtype == DType::BF16
    }
    unsafe fn run(&self, ops: &[DeviceOp]) -> Result<(), ReplicaError> {
        run(ops, self.memory);
        Ok(())
    }
    unsafe fn around_next_step(
        &self,
        before: Vec<DeviceOp>,
        after: Vec<DeviceOp>,
    ) -> Result<(), ReplicaError> {
        let mut pending = self.step_ops.lock().unwrap_or_else(|p| p.into_inner());
        assert!(pending.is_none(), "a step's operations given twice");
        *pending = Some((before, after));
        Ok(())
    }
    fn step_ops_pending(&self) -> bool {
        self.step_ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }
    unsafe fn write(&self, dst: u64, src: &[f32]) -> Result<(), ReplicaError> {
        self.written.fetch_add(src.len(), Ordering::Relaxed);
        (arena().span(dst, src.len(), DType::F32)).copy_from_slice(src);
        Ok(())
    }
    unsafe fn read(&self, src: u64, dst: &mut [f32]) -> Result<(), ReplicaError> {
        dst.copy_from_slice(arena().span(src, dst.len(), DType::F32));
        Ok(())
    }
    unsafe fn read_bits16(&self, src: u64, dst: &mut [u16]) -> Result<(), ReplicaError> {
        let mut bits = Vec::new();
        tandem_tensor::encode_bf16(arena().span(src, dst.len(), DType::BF16), &mut bits);
        dst.copy_from_slice(&bits);
        Ok(())
    }
    fn event(&self) -> Result<Box<dyn DeviceEvent>, ReplicaError> {
        Ok(Box::new(Event))
    }
    fn record(&self, _: &dyn DeviceEvent) -> Result<(), ReplicaError> {
        Ok(())
    }
    fn wait(&self, _: &dyn DeviceEvent) -> Result<(), ReplicaError> {
        Ok(())
    }
}

/// A replica's parameters and gradients in the arena, and its queue.
pub struct Resident {
    queue: Arc<FakeQueue>,
    params: Box<dyn DeviceAlloc>,
    grads: Box<dyn DeviceAlloc>,
    precision: DType,
}

/// What a [`Resident`]'s buffers hold and its queue does.
#[derive(Clone, Copy)]
pub struct Kind {
    /// How many replicas' gradients one update kernel may average.
    pub max_gradients: usize,
    /// The type of the buffers' values.
    pub dtype: DType,
    /// The type the replica computes in ([`Residence::precision`]).
    pub precision: DType,
    /// Whether its updates write rounded copies.
    pub rounds: bool,
}

impl Kind {
    /// f32 buffers and computation, updates of up to 16 replicas' gradients that write
    /// rounded copies.
    pub const F32: Kind = Kind {
        max_gradients: 16,
        dtype: DType::F32,
        precision: DType::F32,
        rounds: true,
    };
}

impl Resident {
    /// `len` parameters and gradients as `kind` says, on a new queue of `memory`.
    pub fn new(memory: usize, len: usize, kind: Kind) -> Self {
        let queue = Arc::new(FakeQueue::new(memory, kind.max_gradients, kind.rounds));
        Self {
            params: queue.alloc(len, kind.dtype).expect("arena memory"),
            grads: queue.alloc(len, kind.dtype).expect("arena memory"),
            precision: kind.precision,
            queue,
        }
    }

    /// What the store sees of it.
    pub fn residence(&self) -> Residence {
        Residence {
            queue: self.queue.clone(),
            params: self.params.address(),
            grads: self.grads.address(),
            dtype: self.params.dtype(),
            precision: self.precision,
        }
    }

    /// A step on the device: the operations the store queued before it, the parameters read
    /// into `params`, `compute` writing `grads`, which are then written to the device, and the
    /// operations queued after it.
    pub fn step<T>(
        &self,
        params: &mut [f32],
        grads: &mut [f32],
        compute: impl FnOnce(&[f32], &mut [f32]) -> T,
    ) -> T {
        let (before, after) = self.queue.take_step_ops();
        run(&before, self.queue.memory);
        let dtype = self.params.dtype();
        params.copy_from_slice(arena().span(self.params.address(), params.len(), dtype));
        let out = compute(params, grads);
        arena()
            .span(self.grads.address(), grads.len(), dtype)
            .copy_from_slice(grads);
        run(&after, self.queue.memory);
        out
    }

    /// How many values the store has written to the replica's queue from the host.
    pub fn host_writes(&self) -> usize {
        self.queue.written.load(Ordering::Relaxed)
    }

    /// Writes the replica's parameters to the device.
    pub fn write_params(&self, params: &[f32]) {
        arena()
            .span(self.params.address(), params.len(), self.params.dtype())
            .copy_from_slice(params);
    }
}
