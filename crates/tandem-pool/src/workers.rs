use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{Device, ReplicaError};

/// What a run does when one worker fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Break the barrier so that every other worker stops at its next [`WorkerContext::barrier`]
    /// (workers in lockstep cannot go on without the failed one).
    StopAll,
    /// Let the other workers carry on (workers that never wait for each other).
    Continue,
}

/// A worker that returned an error or panicked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("worker {worker} ({device}) failed{}: {message}", step.map(|s| format!(" at step {s}")).unwrap_or_default())]
pub struct WorkerFailure {
    /// The worker's index.
    pub worker: usize,
    /// Its device.
    pub device: Device,
    /// The last step it announced with [`WorkerContext::set_step`], if any.
    pub step: Option<u64>,
    /// The error or panic message.
    pub message: String,
}

/// Returned by [`WorkerContext::barrier`] once another worker has failed under
/// [`FailurePolicy::StopAll`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stopped because another worker failed")]
pub struct Aborted;

#[derive(Default)]
struct BarrierState {
    arrived: usize,
    generation: u64,
    aborted: bool,
}

/// What one worker sees of the run: who it is, and the barrier.
pub struct WorkerContext<'run> {
    worker: usize,
    workers: usize,
    device: Device,
    shared: &'run RunShared,
}

struct RunShared {
    state: Mutex<BarrierState>,
    turn: Condvar,
    /// The barrier's generation, readable without the lock, for the short spin before parking.
    generation: AtomicU64,
    steps: Vec<AtomicU64>,
}

/// How long a worker spins at the barrier before it parks. Workers of a synchronous step arrive
/// within microseconds of each other, and waking a parked thread costs tens of microseconds,
/// twice a step.
const SPIN: Duration = Duration::from_micros(100);

const NO_STEP: u64 = u64::MAX;

impl RunShared {
    fn lock(&self) -> MutexGuard<'_, BarrierState> {
        // A panic never happens while this lock is held, so poisoning carries no meaning here.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn abort(&self) {
        self.lock().aborted = true;
        self.turn.notify_all();
    }
}

impl WorkerContext<'_> {
    /// This worker's index, `0..workers()`.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// How many workers run.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// This worker's device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Records the step this worker is on, for the failure report.
    pub fn set_step(&self, step: u64) {
        self.shared.steps[self.worker].store(step, Ordering::Relaxed);
    }

    /// Waits until every worker has arrived, or returns [`Aborted`] as soon as one has failed.
    pub fn barrier(&self) -> Result<(), Aborted> {
        let mut state = self.shared.lock();
        if state.aborted {
            return Err(Aborted);
        }
        state.arrived += 1;
        if state.arrived == self.workers {
            state.arrived = 0;
            state.generation += 1;
            self.shared
                .generation
                .store(state.generation, Ordering::Release);
            self.shared.turn.notify_all();
            return Ok(());
        }
        let generation = state.generation;
        drop(state);
        let spin_start = Instant::now();
        while spin_start.elapsed() < SPIN {
            for _ in 0..64 {
                if self.shared.generation.load(Ordering::Acquire) != generation {
                    return Ok(());
                }
                std::hint::spin_loop();
            }
        }
        // The generation is checked again under the lock, so a release between the spin and
        // the wait is not missed.
        let mut state = self.shared.lock();
        while state.generation == generation && !state.aborted {
            state = self
                .shared
                .turn
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
        if state.generation == generation {
            Err(Aborted)
        } else {
            Ok(())
        }
    }

    /// Whether another worker has failed under [`FailurePolicy::StopAll`].
    pub fn is_aborted(&self) -> bool {
        self.shared.lock().aborted
    }
}

/// The results of [`WorkerPool::run`]: what each worker returned, and who failed.
#[derive(Debug)]
pub struct RunOutcome<T> {
    /// Each worker's result, `None` where it failed or was stopped.
    pub results: Vec<Option<T>>,
    /// The workers that failed themselves (not those stopped because of them), in worker order.
    pub failures: Vec<WorkerFailure>,
}

impl<T> RunOutcome<T> {
    /// Every worker's value, or the first failure.
    pub fn into_results(self) -> Result<Vec<T>, WorkerFailure> {
        if let Some(failure) = self.failures.into_iter().next() {
            return Err(failure);
        }
        // Without failures nobody was stopped, so every worker has a value.
        Ok(self.results.into_iter().flatten().collect())
    }
}

/// One worker thread per device, each owning its replica (or any per-worker state `R`).
pub struct WorkerPool<R> {
    devices: Vec<Device>,
    replicas: Vec<R>,
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = payload.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".to_owned()
    }
}

impl<R: Send> WorkerPool<R> {
    /// Opens one replica per device with `open`.
    pub fn new<E>(
        devices: Vec<Device>,
        mut open: impl FnMut(&Device) -> Result<R, E>,
    ) -> Result<Self, E> {
        let replicas = devices.iter().map(&mut open).collect::<Result<_, _>>()?;
        Ok(Self { devices, replicas })
    }

    /// The devices, one per worker.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// How many workers there are.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Whether the pool has no workers.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The replicas, for reading between runs.
    pub fn replicas(&self) -> &[R] {
        &self.replicas
    }

    /// The replicas, for changing between runs.
    pub fn replicas_mut(&mut self) -> &mut [R] {
        &mut self.replicas
    }

    /// Runs `work` on every worker, each on its own thread with its own replica, and waits for
    /// all of them. A worker that returns an error or panics becomes a [`WorkerFailure`]; under
    /// [`FailurePolicy::StopAll`] it also breaks the barrier so the others stop promptly.
    pub fn run<T, F>(&mut self, policy: FailurePolicy, work: F) -> RunOutcome<T>
    where
        T: Send,
        F: Fn(&WorkerContext<'_>, &mut R) -> Result<T, ReplicaError> + Sync,
    {
        let workers = self.devices.len();
        let shared = RunShared {
            state: Mutex::new(BarrierState::default()),
            turn: Condvar::new(),
            generation: AtomicU64::new(0),
            steps: (0..workers).map(|_| AtomicU64::new(NO_STEP)).collect(),
        };
        let outcomes: Vec<Result<T, Option<String>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .replicas
                .iter_mut()
                .zip(&self.devices)
                .enumerate()
                .map(|(worker, (replica, &device))| {
                    let ctx = WorkerContext {
                        worker,
                        workers,
                        device,
                        shared: &shared,
                    };
                    let work = &work;
                    scope.spawn(move || {
                        let result = catch_unwind(AssertUnwindSafe(|| work(&ctx, replica)));
                        let outcome = match result {
                            Ok(Ok(value)) => return Ok(value),
                            // Stopped because of someone else: not a failure of its own.
                            Ok(Err(e)) if e.is::<Aborted>() => None,
                            Ok(Err(e)) => Some(e.to_string()),
                            Err(payload) => Some(panic_message(payload.as_ref())),
                        };
                        if policy == FailurePolicy::StopAll {
                            ctx.shared.abort();
                        }
                        Err(outcome)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|payload| Err(Some(panic_message(payload.as_ref()))))
                })
                .collect()
        });
        let mut failures = Vec::new();
        let results = outcomes
            .into_iter()
            .enumerate()
            .map(|(worker, outcome)| match outcome {
                Ok(value) => Some(value),
                Err(message) => {
                    if let Some(message) = message {
                        let step = shared.steps[worker].load(Ordering::Relaxed);
                        failures.push(WorkerFailure {
                            worker,
                            device: self.devices[worker],
                            step: (step != NO_STEP).then_some(step),
                            message,
                        });
                    }
                    None
                }
            })
            .collect();
        RunOutcome { results, failures }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu_pool(n: usize) -> WorkerPool<usize> {
        let devices = (0..n).map(|worker| Device::Cpu { worker }).collect();
        WorkerPool::new(devices, |d| match d {
            Device::Cpu { worker } => Ok::<_, ReplicaError>(*worker),
            Device::Cuda { .. } => Err("no".into()),
        })
        .unwrap()
    }

    #[test]
    fn barrier_keeps_workers_in_lockstep() {
        let mut pool = cpu_pool(4);
        let counter = AtomicU64::new(0);
        let outcome = pool.run(FailurePolicy::StopAll, |ctx, _| {
            let mut seen = Vec::new();
            for round in 0..50u64 {
                counter.fetch_add(1, Ordering::SeqCst);
                ctx.barrier()?;
                // Every worker has incremented for this round and nobody for the next yet.
                seen.push(counter.load(Ordering::SeqCst) == 4 * (round + 1));
                ctx.barrier()?;
            }
            Ok(seen.into_iter().all(|ok| ok))
        });
        assert!(outcome.failures.is_empty());
        assert!(outcome.results.iter().all(|r| *r == Some(true)));
    }

    #[test]
    fn stop_all_ends_promptly_naming_the_failed_worker_and_step() {
        for panics in [false, true] {
            let mut pool = cpu_pool(3);
            let start = Instant::now();
            let outcome = pool.run(FailurePolicy::StopAll, |ctx, id| {
                for step in 0..1_000_000u64 {
                    ctx.set_step(step);
                    if *id == 1 && step == 7 {
                        if panics {
                            panic!("injected fault");
                        }
                        return Err("injected fault".into());
                    }
                    ctx.barrier()?;
                }
                Ok(())
            });
            assert!(start.elapsed() < Duration::from_secs(20), "the run hung");
            assert_eq!(outcome.failures.len(), 1, "{:?}", outcome.failures);
            let failure = &outcome.failures[0];
            assert_eq!((failure.worker, failure.step), (1, Some(7)));
            let text = failure.to_string();
            assert!(text.contains("worker 1 (cpu:1) failed at step 7"), "{text}");
            assert!(text.contains("injected fault"), "{text}");
            assert!(outcome.results.iter().all(Option::is_none));
        }
    }

    #[test]
    fn continue_lets_the_other_workers_finish() {
        let mut pool = cpu_pool(3);
        let outcome = pool.run(FailurePolicy::Continue, |ctx, id| {
            ctx.set_step(3);
            if *id == 0 {
                panic!("injected fault");
            }
            Ok(*id * 10)
        });
        assert_eq!(outcome.results, vec![None, Some(10), Some(20)]);
        assert_eq!(outcome.failures.len(), 1);
        assert!(outcome.failures[0]
            .message
            .contains("panicked: injected fault"));
    }
}
