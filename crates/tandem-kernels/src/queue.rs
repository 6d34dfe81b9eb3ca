//! [`CudaQueue`]: a [`CudaBackend`](crate::CudaBackend)'s stream as a
//! [`tandem_core::DeviceQueue`], so that a store can keep the parameters of record in the
//! device memory beside the backend's replica.

use std::any::Any;
use std::sync::Arc;

use tandem_core::{DType, DeviceAlloc, DeviceEvent, DeviceOp, DeviceQueue, ReplicaError};

use crate::backend::{Kernels, Launcher, Pass, RunsOn, StepOps};
use crate::driver::{Context, DeviceBuffer, DeviceCopy, DevicePointer, Event};
use crate::error::cuda;
use crate::ptx::MAX_GRADIENT_BUFFERS;

/// One backend's stream, kernels and context, shared with the backend: work queued here runs
/// in order with the backend's own, and what a store puts around the next step the backend's
/// `Backend::replay` takes into it.
pub struct CudaQueue {
    ordinal: usize,
    runs_on: Arc<RunsOn>,
    kernels: Arc<Kernels>,
    context: Arc<Context>,
    step_ops: Arc<StepOps>,
}

impl CudaQueue {
    pub(crate) fn new(
        ordinal: usize,
        runs_on: Arc<RunsOn>,
        kernels: Arc<Kernels>,
        context: Arc<Context>,
        step_ops: Arc<StepOps>,
    ) -> Self {
        Self {
            ordinal,
            runs_on,
            kernels,
            context,
            step_ops,
        }
    }

    fn launcher(&self) -> Launcher<'_> {
        Launcher {
            stream: self.runs_on.get(),
            kernels: &self.kernels,
        }
    }

    /// Copies `dst.len()` values from `src` to the host, once the work queued before is done.
    ///
    /// # Safety
    /// `src` must hold `dst.len()` values of `T` in this queue's context.
    unsafe fn copy_out<T: DeviceCopy>(&self, src: u64, dst: &mut [T]) -> Result<(), ReplicaError> {
        // SAFETY: the caller's promises; `dst` stays borrowed until the copy has landed.
        unsafe {
            self.runs_on
                .get()
                .copy_out(dst, DevicePointer::from_raw(src))
        }
        .map_err(cuda("copying to the host"))?;
        self.synchronize()
    }

    fn synchronize(&self) -> Result<(), ReplicaError> {
        Ok(self
            .runs_on
            .get()
            .synchronize()
            .map_err(cuda("waiting for the stream"))?)
    }
}

/// Memory [`CudaQueue::alloc`] made: bytes, with the type they were asked for.
struct QueueAlloc {
    memory: DeviceBuffer<u8>,
    dtype: DType,
}

impl DeviceAlloc for QueueAlloc {
    fn address(&self) -> u64 {
        self.memory.as_device_ptr().as_raw()
    }

    fn dtype(&self) -> DType {
        self.dtype
    }
}

/// A CUDA event as a [`DeviceEvent`].
struct CudaEvent(Event);

impl DeviceEvent for CudaEvent {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The CUDA event behind `event`: only this queue's kind makes them.
fn event_of(event: &dyn DeviceEvent) -> Result<&Event, ReplicaError> {
    event
        .as_any()
        .downcast_ref::<CudaEvent>()
        .map(|event| &event.0)
        .ok_or_else(|| "an event of another kind of device queue".into())
}

impl DeviceQueue for CudaQueue {
    fn memory(&self) -> usize {
        self.ordinal
    }

    fn max_gradients(&self) -> usize {
        MAX_GRADIENT_BUFFERS
    }

    fn has_update(&self, kernel: &str, states: usize, grads: DType) -> bool {
        crate::backend::runs_update(kernel, states, grads)
    }

    /// Every type: the update kernels and `round_to` round to bf16 and f16, and f32 is
    /// copied as it is.
    fn rounds_to(&self, _: DType) -> bool {
        true
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    /// Where `other` is a CUDA queue of the same context: this one waits for its own work,
    /// then runs everything (its backend's too) on `other`'s stream.
    fn share_order(&self, other: &dyn DeviceQueue) -> Result<bool, ReplicaError> {
        let Some(other) = other.as_any().downcast_ref::<CudaQueue>() else {
            return Ok(false);
        };
        if !self.context.is(&other.context) {
            return Ok(false);
        }
        self.bind()?;
        self.synchronize()?;
        self.runs_on.set(other.runs_on.get());
        Ok(true)
    }

    fn compresses_to(&self, dtype: DType) -> bool {
        dtype == DType::BF16
    }

    fn bind(&self) -> Result<(), ReplicaError> {
        Ok(self
            .context
            .set_current()
            .map_err(cuda("making the context current"))?)
    }

    fn alloc(&self, len: usize, dtype: DType) -> Result<Box<dyn DeviceAlloc>, ReplicaError> {
        let memory = DeviceBuffer::<u8>::uninitialized(&self.context, dtype.bytes(len))
            .map_err(cuda("allocating device memory"))?;
        Ok(Box::new(QueueAlloc { memory, dtype }))
    }

    unsafe fn run(&self, ops: &[DeviceOp]) -> Result<(), ReplicaError> {
        // SAFETY: the caller's promises (the trait's).
        Ok(unsafe { self.launcher().run(Pass::Direct, ops) }?)
    }

    unsafe fn around_next_step(
        &self,
        before: Vec<DeviceOp>,
        after: Vec<DeviceOp>,
    ) -> Result<(), ReplicaError> {
        self.step_ops.put(before, after);
        Ok(())
    }

    fn step_ops_pending(&self) -> bool {
        self.step_ops.pending()
    }

    unsafe fn write(&self, dst: u64, src: &[f32]) -> Result<(), ReplicaError> {
        // SAFETY: the caller's promises; `src` stays borrowed until the copy has landed.
        unsafe {
            self.runs_on
                .get()
                .copy_in(DevicePointer::from_raw(dst), src)
        }
        .map_err(cuda("copying to the device"))?;
        self.synchronize()
    }

    unsafe fn read(&self, src: u64, dst: &mut [f32]) -> Result<(), ReplicaError> {
        // SAFETY: the caller's promises.
        unsafe { self.copy_out(src, dst) }
    }

    unsafe fn read_bits16(&self, src: u64, dst: &mut [u16]) -> Result<(), ReplicaError> {
        // SAFETY: the caller's promises.
        unsafe { self.copy_out(src, dst) }
    }

    fn event(&self) -> Result<Box<dyn DeviceEvent>, ReplicaError> {
        let event = Event::new(&self.context).map_err(cuda("creating an event"))?;
        Ok(Box::new(CudaEvent(event)))
    }

    fn record(&self, event: &dyn DeviceEvent) -> Result<(), ReplicaError> {
        Ok(self
            .runs_on
            .get()
            .record(event_of(event)?)
            .map_err(cuda("recording an event"))?)
    }

    fn wait(&self, event: &dyn DeviceEvent) -> Result<(), ReplicaError> {
        Ok(self
            .runs_on
            .get()
            .wait(event_of(event)?)
            .map_err(cuda("waiting for an event"))?)
    }
}
