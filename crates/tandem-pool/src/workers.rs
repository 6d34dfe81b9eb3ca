use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tandem_core::ReplicaError;

use crate::Device;

/// What a run does when one worker fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Break the barrier so that every other worker stops at its next [`WorkerContext::barrier`]
    /// (workers in lockstep cannot go on without the failed one). The failure is reported, not
    /// remembered: the caller decides what a stopped run means.
    StopAll,
    /// Let the other workers carry on (workers that never wait for each other). The failed
    /// worker is retired for the pool's life: later runs do not start it (see
    /// [`WorkerPool::retired`]), so a broken device is not tried again and again.
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
    running: usize,
    device: Device,
    shared: &'run RunShared,
}

/// One worker's step and progress. Its owner writes it once a step; a cache line of its own
/// keeps the other workers from paying for that.
#[repr(align(128))]
struct Slot {
    step: AtomicU64,
    /// When the worker last made progress, in nanoseconds since the run's start, or one of
    /// `WAITING`, `FINISHED`, `NOT_STARTED`: one atomic, so a watcher never sees a time and a
    /// state that disagree.
    activity: AtomicU64,
}

struct RunShared {
    state: Mutex<BarrierState>,
    turn: Condvar,
    /// The barrier's generation, readable without the lock, for the short spin before parking.
    generation: AtomicU64,
    /// Workers that have not returned yet; a watcher waits on `ended` for it to reach zero.
    remaining: Mutex<usize>,
    ended: Condvar,
    /// The origin of the progress times in `slots`.
    start: Instant,
    slots: Vec<Slot>,
}

/// How long a worker spins at the barrier before it parks. Workers of a synchronous step arrive
/// within microseconds of each other, and waking a parked thread costs tens of microseconds,
/// twice a step.
const SPIN: Duration = Duration::from_micros(100);

/// How long a worker that may help the others ([`WorkerContext::barrier_helping`]) spins before
/// it parks: long enough for a worker slowed down by a busy core to reach the work it shares
/// out (a few hundred microseconds behind), short enough not to hold a core through a stall.
const HELPING_SPIN: Duration = Duration::from_millis(2);

const NO_STEP: u64 = u64::MAX;

/// `Slot::activity` values that are not times (584 years of nanoseconds lie below them).
const WAITING: u64 = u64::MAX;
const FINISHED: u64 = u64::MAX - 1;
const NOT_STARTED: u64 = u64::MAX - 2;

fn unpoison<T>(result: std::sync::LockResult<T>) -> T {
    // A panic never happens while these locks are held, so poisoning carries no meaning here.
    result.unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl RunShared {
    fn lock(&self) -> MutexGuard<'_, BarrierState> {
        unpoison(self.state.lock())
    }

    fn abort(&self) {
        self.lock().aborted = true;
        self.turn.notify_all();
    }

    /// Records that `worker` made progress now.
    fn progress(&self, worker: usize) {
        let nanos = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(NOT_STARTED - 1);
        self.slots[worker]
            .activity
            .store(nanos.min(NOT_STARTED - 1), Ordering::Relaxed);
    }

    fn step(&self, worker: usize) -> Option<u64> {
        let step = self.slots[worker].step.load(Ordering::Relaxed);
        (step != NO_STEP).then_some(step)
    }
}

/// Marks a worker finished when its thread leaves its work, however it leaves (a panic that
/// escapes included), so that a watcher waiting for the run's end is never left waiting.
struct FinishGuard<'run> {
    shared: &'run RunShared,
    worker: usize,
}

impl Drop for FinishGuard<'_> {
    fn drop(&mut self) {
        self.shared.slots[self.worker]
            .activity
            .store(FINISHED, Ordering::Relaxed);
        let mut remaining = unpoison(self.shared.remaining.lock());
        *remaining = remaining.saturating_sub(1);
        if *remaining == 0 {
            self.shared.ended.notify_all();
        }
    }
}

impl WorkerContext<'_> {
    /// This worker's index, `0..workers()`.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// How many workers the pool has: indices run over `0..workers()`, retired workers (which
    /// this run did not start) included.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// How many workers this run started: [`workers`](Self::workers) less the retired ones.
    /// The barrier waits for this many.
    pub fn running(&self) -> usize {
        self.running
    }

    /// This worker's device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Records the step this worker is on, for the failure report. Announcing a step is also
    /// what counts as progress for a [`RunWatch`]: a worker that starts a new step has finished
    /// the previous one. It costs two relaxed atomic stores and a clock read.
    pub fn set_step(&self, step: u64) {
        self.shared.slots[self.worker]
            .step
            .store(step, Ordering::Relaxed);
        self.shared.progress(self.worker);
    }

    /// Waits until every worker of this run has arrived, or returns [`Aborted`] as soon as one
    /// has failed.
    pub fn barrier(&self) -> Result<(), Aborted> {
        self.arrive(SPIN, &mut || false)
    }

    /// [`barrier`](Self::barrier), calling `help` while it waits: work for the workers still
    /// to arrive (tasks they share out), which returns whether it did any. It waits busy for
    /// longer than `barrier` before it sleeps, since work may still come.
    pub fn barrier_helping(&self, help: &mut dyn FnMut() -> bool) -> Result<(), Aborted> {
        self.arrive(HELPING_SPIN, help)
    }

    /// The barrier: spins for `spin` (from the last time `help` did something), then sleeps.
    fn arrive(&self, spin: Duration, help: &mut dyn FnMut() -> bool) -> Result<(), Aborted> {
        let mut state = self.shared.lock();
        if state.aborted {
            return Err(Aborted);
        }
        state.arrived += 1;
        if state.arrived == self.running {
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
        let mut spin_start = Instant::now();
        while spin_start.elapsed() < spin {
            for _ in 0..64 {
                if self.shared.generation.load(Ordering::Acquire) != generation {
                    return Ok(());
                }
                std::hint::spin_loop();
            }
            if help() {
                spin_start = Instant::now();
            }
        }
        // Parked, this worker waits for the others: a watcher must not take it for stalled.
        // Only the slow path marks it, so a step whose workers arrive together pays nothing.
        let activity = &self.shared.slots[self.worker].activity;
        activity.store(WAITING, Ordering::Relaxed);
        // The generation is checked again under the lock, so a release between the spin and
        // the wait is not missed.
        let mut state = self.shared.lock();
        while state.generation == generation && !state.aborted {
            state = unpoison(self.shared.turn.wait(state));
        }
        let passed = state.generation != generation;
        drop(state);
        // Its idle time starts again when it leaves, not when it arrived.
        self.shared.progress(self.worker);
        if passed {
            Ok(())
        } else {
            Err(Aborted)
        }
    }

    /// Whether another worker has failed under [`FailurePolicy::StopAll`].
    pub fn is_aborted(&self) -> bool {
        self.shared.lock().aborted
    }
}

/// What one worker is doing, as a [`RunWatch`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerActivity {
    /// Retired by an earlier failure: this run did not start it.
    Retired,
    /// Working. It last made progress (started, announced a step with
    /// [`WorkerContext::set_step`], or left the barrier) at `since`.
    Working {
        /// The last step it announced, if any.
        step: Option<u64>,
        /// When it last made progress.
        since: Instant,
    },
    /// Parked at the barrier, waiting for the others (not stalled itself).
    Waiting {
        /// The last step it announced, if any.
        step: Option<u64>,
    },
    /// Its work has returned (a value, an error or a panic).
    Finished,
}

/// A view of a run in progress, for the watcher of [`WorkerPool::run_watched`]. Everything it
/// reads is an atomic load; nothing it does slows the workers down.
pub struct RunWatch<'run> {
    shared: &'run RunShared,
    devices: &'run [Device],
}

impl RunWatch<'_> {
    /// How many workers the pool has (retired ones included).
    pub fn workers(&self) -> usize {
        self.devices.len()
    }

    /// The devices, one per worker.
    pub fn devices(&self) -> &[Device] {
        self.devices
    }

    /// What worker `worker` is doing now (`None` if there is no such worker).
    pub fn activity(&self, worker: usize) -> Option<WorkerActivity> {
        let slot = self.shared.slots.get(worker)?;
        Some(match slot.activity.load(Ordering::Relaxed) {
            NOT_STARTED => WorkerActivity::Retired,
            FINISHED => WorkerActivity::Finished,
            WAITING => WorkerActivity::Waiting {
                step: self.shared.step(worker),
            },
            nanos => WorkerActivity::Working {
                step: self.shared.step(worker),
                since: self.shared.start + Duration::from_nanos(nanos),
            },
        })
    }

    /// How many times the barrier has opened in this run. A strategy whose workers change
    /// shared state only between two barriers can tell from it whether they are in there.
    pub fn barriers_passed(&self) -> u64 {
        self.shared.generation.load(Ordering::Acquire)
    }

    /// Waits up to `timeout` for every worker to return; `true` once they all have.
    pub fn wait_end(&self, timeout: Duration) -> bool {
        let remaining = unpoison(self.shared.remaining.lock());
        let (remaining, _) = unpoison(self.shared.ended.wait_timeout_while(
            remaining,
            timeout,
            |remaining| *remaining > 0,
        ));
        *remaining == 0
    }
}

/// The results of [`WorkerPool::run`]: what each worker returned, and who failed.
#[derive(Debug)]
pub struct RunOutcome<T> {
    /// Each worker's result, `None` where it failed, was stopped or was retired before the run.
    pub results: Vec<Option<T>>,
    /// The workers that failed themselves in this run (not those stopped because of them, nor
    /// those retired by an earlier run), in worker order.
    pub failures: Vec<WorkerFailure>,
}

impl<T> RunOutcome<T> {
    /// Every started worker's value, or the first failure.
    pub fn into_results(self) -> Result<Vec<T>, WorkerFailure> {
        if let Some(failure) = self.failures.into_iter().next() {
            return Err(failure);
        }
        // Without failures nobody was stopped, so every started worker has a value.
        Ok(self.results.into_iter().flatten().collect())
    }
}

/// One worker thread per device, each owning its replica (or any per-worker state `R`).
pub struct WorkerPool<R> {
    devices: Vec<Device>,
    replicas: Vec<R>,
    /// Workers that failed under [`FailurePolicy::Continue`]: run by run, each run's in worker
    /// order.
    retired: Vec<WorkerFailure>,
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
        Ok(Self {
            devices,
            replicas,
            retired: Vec::new(),
        })
    }

    /// The devices, one per worker.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// How many workers there are (retired ones included).
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Whether the pool has no workers.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The workers that failed under [`FailurePolicy::Continue`], each with its failure: run
    /// by run, in the order of the runs they failed in, and in worker order within a run.
    /// They stay out for the pool's life: no later run starts them.
    pub fn retired(&self) -> &[WorkerFailure] {
        &self.retired
    }

    /// Whether worker `worker` is retired.
    pub fn is_retired(&self, worker: usize) -> bool {
        self.retired.iter().any(|f| f.worker == worker)
    }

    /// How many workers a run starts: those not retired.
    pub fn active(&self) -> usize {
        self.len() - self.retired.len()
    }

    /// The replicas, for reading between runs.
    pub fn replicas(&self) -> &[R] {
        &self.replicas
    }

    /// The replicas, for changing between runs.
    pub fn replicas_mut(&mut self) -> &mut [R] {
        &mut self.replicas
    }

    /// Runs `work` on every worker that is not retired, each on its own thread with its own
    /// replica, and waits for all of them. A worker that returns an error or panics becomes a
    /// [`WorkerFailure`]; under [`FailurePolicy::StopAll`] it also breaks the barrier so the
    /// others stop promptly, under [`FailurePolicy::Continue`] it is retired.
    pub fn run<T, F>(&mut self, policy: FailurePolicy, work: F) -> RunOutcome<T>
    where
        T: Send,
        F: Fn(&WorkerContext<'_>, &mut R) -> Result<T, ReplicaError> + Sync,
    {
        self.run_inner(policy, work, None::<fn(&RunWatch<'_>)>)
    }

    /// [`run`](Self::run), with `watch` on a thread of its own for as long as the workers run:
    /// it sees their progress through a [`RunWatch`] and should return soon after
    /// [`RunWatch::wait_end`] says the run has ended, since the run returns only once `watch`
    /// has. A panic in `watch` ends the watching, not the run.
    pub fn run_watched<T, F, W>(
        &mut self,
        policy: FailurePolicy,
        work: F,
        watch: W,
    ) -> RunOutcome<T>
    where
        T: Send,
        F: Fn(&WorkerContext<'_>, &mut R) -> Result<T, ReplicaError> + Sync,
        W: FnOnce(&RunWatch<'_>) + Send,
    {
        self.run_inner(policy, work, Some(watch))
    }

    fn run_inner<T, F, W>(
        &mut self,
        policy: FailurePolicy,
        work: F,
        watch: Option<W>,
    ) -> RunOutcome<T>
    where
        T: Send,
        F: Fn(&WorkerContext<'_>, &mut R) -> Result<T, ReplicaError> + Sync,
        W: FnOnce(&RunWatch<'_>) + Send,
    {
        let workers = self.devices.len();
        let started: Vec<bool> = (0..workers).map(|w| !self.is_retired(w)).collect();
        let running = started.iter().filter(|&&s| s).count();
        let shared = RunShared {
            state: Mutex::new(BarrierState::default()),
            turn: Condvar::new(),
            generation: AtomicU64::new(0),
            remaining: Mutex::new(running),
            ended: Condvar::new(),
            start: Instant::now(),
            slots: started
                .iter()
                .map(|&s| Slot {
                    step: AtomicU64::new(NO_STEP),
                    // A started worker's idle time counts from the run's start.
                    activity: AtomicU64::new(if s { 0 } else { NOT_STARTED }),
                })
                .collect(),
        };
        let Self {
            devices, replicas, ..
        } = self;
        let outcomes: Vec<Option<Result<T, Option<String>>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = replicas
                .iter_mut()
                .zip(devices.iter())
                .enumerate()
                .map(|(worker, (replica, &device))| {
                    if !started[worker] {
                        return None;
                    }
                    let ctx = WorkerContext {
                        worker,
                        workers,
                        running,
                        device,
                        shared: &shared,
                    };
                    let work = &work;
                    Some(scope.spawn(move || {
                        let _finish = FinishGuard {
                            shared: ctx.shared,
                            worker,
                        };
                        let outcome = match catch_unwind(AssertUnwindSafe(|| work(&ctx, replica))) {
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
                    }))
                })
                .collect();
            let watcher = watch.map(|watch| {
                let view = RunWatch {
                    shared: &shared,
                    devices: devices.as_slice(),
                };
                scope.spawn(move || watch(&view))
            });
            let outcomes = handles
                .into_iter()
                .map(|h| {
                    h.map(|h| {
                        h.join()
                            .unwrap_or_else(|payload| Err(Some(panic_message(payload.as_ref()))))
                    })
                })
                .collect();
            if let Some(watcher) = watcher {
                // Joined here, so that its panic (an observer's, say) does not become the
                // scope's: the run's outcome is the workers'.
                let _ = watcher.join();
            }
            outcomes
        });
        let mut failures = Vec::new();
        let results = outcomes
            .into_iter()
            .enumerate()
            .map(|(worker, outcome)| match outcome? {
                Ok(value) => Some(value),
                Err(message) => {
                    if let Some(message) = message {
                        failures.push(WorkerFailure {
                            worker,
                            device: self.devices[worker],
                            step: shared.step(worker),
                            message,
                        });
                    }
                    None
                }
            })
            .collect();
        if policy == FailurePolicy::Continue {
            self.retired.extend(failures.iter().cloned());
        }
        RunOutcome { results, failures }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    fn cpu_pool(n: usize) -> WorkerPool<usize> {
        let devices = (0..n).map(|worker| Device::Cpu { worker }).collect();
        WorkerPool::new(devices, |d| match d {
            Device::Cpu { worker } => Ok::<_, ReplicaError>(*worker),
            Device::Cuda { .. } | Device::Sim { .. } => Err("no".into()),
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

    /// Workers that arrive early call `help` until the last one arrives (who never calls it),
    /// and the barrier still holds: nobody leaves before everyone has arrived.
    #[test]
    fn a_helping_barrier_helps_while_it_waits_and_still_holds() {
        let mut pool = cpu_pool(3);
        let arrived = AtomicU64::new(0);
        let outcome = pool.run(FailurePolicy::StopAll, |ctx, id| {
            let mut helped = 0u64;
            for round in 0..20u64 {
                if *id == 2 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                arrived.fetch_add(1, Ordering::SeqCst);
                ctx.barrier_helping(&mut || {
                    helped += 1;
                    helped.is_multiple_of(2)
                })?;
                assert!(arrived.load(Ordering::SeqCst) >= 3 * (round + 1));
                ctx.barrier()?;
            }
            Ok(helped)
        });
        assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
        let helped: Vec<u64> = outcome.results.into_iter().flatten().collect();
        assert_eq!(helped.len(), 3);
        // Worker 2 arrives last every round (a millisecond late), so it never waits.
        assert!(helped[0] > 0 && helped[1] > 0, "{helped:?}");
    }

    #[test]
    fn stop_all_ends_promptly_naming_the_failed_worker_and_step() {
        for panics in [false, true] {
            // Under a deadline: if the barrier never broke, the run would wait forever (the
            // others for worker 1, a million steps each), and the test must fail, not hang.
            let (done, outcome) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut pool = cpu_pool(3);
                let _ = done.send(pool.run(FailurePolicy::StopAll, |ctx, id| {
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
                }));
            });
            let outcome = outcome
                .recv_timeout(Duration::from_secs(60))
                .expect("the run did not stop within 60 s of the failure");
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

    #[test]
    fn continue_retires_a_failed_worker_for_later_runs() {
        let mut pool = cpu_pool(3);
        let calls: Vec<AtomicU64> = (0..3).map(|_| AtomicU64::new(0)).collect();
        let work = |ctx: &WorkerContext<'_>, id: &mut usize| {
            calls[*id].fetch_add(1, Ordering::SeqCst);
            ctx.set_step(1);
            if *id == 1 {
                return Err("broken device".into());
            }
            Ok(*id)
        };
        let first = pool.run(FailurePolicy::Continue, work);
        assert_eq!(first.results, vec![Some(0), None, Some(2)]);
        assert_eq!(first.failures.len(), 1);
        assert_eq!(pool.retired(), first.failures.as_slice());
        assert!(pool.is_retired(1) && !pool.is_retired(0));
        assert_eq!(pool.active(), 2);
        assert!(!pool.is_empty(), "a retired worker is still the pool's");

        let second = pool.run(FailurePolicy::Continue, work);
        assert_eq!(second.results, vec![Some(0), None, Some(2)]);
        assert!(second.failures.is_empty(), "reported once only");
        assert_eq!(
            calls[1].load(Ordering::SeqCst),
            1,
            "a retired worker is not started"
        );
        assert_eq!(pool.retired().len(), 1);

        // Lockstep work over the remaining workers: the barrier waits for those that run.
        let third = pool.run(FailurePolicy::StopAll, |ctx, id| {
            for _ in 0..20 {
                ctx.barrier()?;
            }
            Ok((*id, ctx.workers(), ctx.running()))
        });
        assert_eq!(third.into_results().unwrap(), vec![(0, 3, 2), (2, 3, 2)]);
    }

    #[test]
    fn stop_all_failures_are_reported_not_retired() {
        let mut pool = cpu_pool(2);
        let outcome = pool.run(FailurePolicy::StopAll, |ctx, id| {
            if *id == 0 {
                return Err("injected fault".into());
            }
            ctx.barrier()?;
            Ok(())
        });
        assert_eq!(outcome.failures.len(), 1);
        assert!(pool.retired().is_empty());
        let again = pool.run(FailurePolicy::StopAll, |_, id| Ok(*id));
        assert_eq!(again.into_results().unwrap(), vec![0, 1]);
    }

    /// What the watcher of `watch_sees_working_waiting_and_the_end` saw.
    #[derive(Debug, Default, PartialEq)]
    struct Seen {
        stuck_worker_working_at_step_3: bool,
        other_worker_waiting: bool,
        ended: bool,
    }

    #[test]
    fn watch_sees_working_waiting_and_the_end() {
        let mut pool = cpu_pool(2);
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = Mutex::new(released);
        let seen = Mutex::new(Seen::default());
        let outcome = pool.run_watched(
            FailurePolicy::StopAll,
            |ctx, id| {
                ctx.set_step(3);
                if *id == 1 {
                    // Stuck until the watcher has seen it stuck (or gives up).
                    let released = released.lock().unwrap();
                    released
                        .recv_timeout(Duration::from_secs(60))
                        .map_err(|_| "never released")?;
                }
                ctx.barrier()?;
                Ok(())
            },
            |watch| {
                let deadline = Instant::now() + Duration::from_secs(30);
                let mut seen_now = Seen::default();
                while Instant::now() < deadline
                    && !(seen_now.stuck_worker_working_at_step_3 && seen_now.other_worker_waiting)
                {
                    seen_now.stuck_worker_working_at_step_3 |= matches!(
                        watch.activity(1),
                        Some(WorkerActivity::Working { step: Some(3), .. })
                    );
                    seen_now.other_worker_waiting |= matches!(
                        watch.activity(0),
                        Some(WorkerActivity::Waiting { step: Some(3) })
                    );
                    std::thread::sleep(Duration::from_millis(5));
                }
                assert_eq!(watch.activity(2), None);
                release.send(()).unwrap();
                seen_now.ended = watch.wait_end(Duration::from_secs(30));
                assert_eq!(watch.activity(0), Some(WorkerActivity::Finished));
                *seen.lock().unwrap() = seen_now;
            },
        );
        assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
        assert_eq!(
            seen.into_inner().unwrap(),
            Seen {
                stuck_worker_working_at_step_3: true,
                other_worker_waiting: true,
                ended: true
            }
        );
    }

    /// A worker that never reaches a barrier still learns, by asking, that another has failed
    /// under `StopAll`: not before the failure, and soon after it.
    #[test]
    fn a_worker_asking_sees_another_fail() {
        let mut pool = cpu_pool(2);
        let asked_before = AtomicBool::new(false);
        let outcome = pool.run(FailurePolicy::StopAll, |ctx, id| {
            let deadline = Instant::now() + Duration::from_secs(60);
            if *id == 0 {
                // Fails once worker 1 has asked before any failure.
                while !asked_before.load(Ordering::SeqCst) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                return Err("injected fault".into());
            }
            let before = ctx.is_aborted();
            asked_before.store(true, Ordering::SeqCst);
            while !ctx.is_aborted() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok((before, ctx.is_aborted()))
        });
        assert_eq!(outcome.failures.len(), 1);
        assert_eq!(outcome.failures[0].worker, 0);
        assert_eq!(outcome.results[1], Some((false, true)));
    }

    /// A pool of no devices is empty and its runs return at once, with nothing.
    #[test]
    fn a_pool_without_devices_is_empty_and_runs_nothing() {
        let mut pool = WorkerPool::new(Vec::new(), |_| Ok::<_, ReplicaError>(0)).unwrap();
        assert!(pool.is_empty());
        let outcome = pool.run(FailurePolicy::StopAll, |_, id| Ok(*id));
        assert!(outcome.results.is_empty() && outcome.failures.is_empty());
    }

    /// A watcher waiting for the end is woken when the last worker returns, not when its wait
    /// runs out (a day here): the run, which returns only after its watcher, ends at once.
    #[test]
    fn the_end_wakes_a_watcher_waiting_for_it() {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut pool = cpu_pool(2);
            let ended = Mutex::new(None);
            let outcome = pool.run_watched(
                FailurePolicy::StopAll,
                |_, id| {
                    // Time for the watcher to be waiting before the end comes, and for it to
                    // wait again between the first worker's return and the last's.
                    std::thread::sleep(Duration::from_millis(200 * (*id as u64 + 1)));
                    Ok(*id)
                },
                |watch| *ended.lock().unwrap() = Some(watch.wait_end(Duration::from_secs(86_400))),
            );
            let _ = done.send((outcome.into_results(), ended.into_inner().unwrap()));
        });
        // Far longer than the workers' 400 ms, far shorter than the watcher's day.
        let (results, ended) = finished
            .recv_timeout(Duration::from_secs(120))
            .expect("the run did not end: its watcher was not woken");
        assert_eq!(results.unwrap(), vec![0, 1]);
        assert_eq!(ended, Some(true));
    }

    #[test]
    fn a_watcher_that_panics_does_not_fail_the_run() {
        let mut pool = cpu_pool(2);
        let outcome = pool.run_watched(
            FailurePolicy::StopAll,
            |_, id| Ok(*id),
            |_| panic!("observer bug"),
        );
        assert_eq!(outcome.into_results().unwrap(), vec![0, 1]);
    }
}
