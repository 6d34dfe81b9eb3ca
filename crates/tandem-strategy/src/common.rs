//! What both strategies share around their workers: the checks before they start, the loss
//! check of every step, and the watchdog that runs beside them.

use std::time::{Duration, Instant};

use tandem_core::{Optimizer, Replica, ReplicaError, TrainState};
use tandem_pool::{RunWatch, WorkerActivity, WorkerPool};

use crate::{Batches, NonFiniteLoss, Observer, Stall, TrainError};

/// How often the watchdog looks at the workers: a stall or an abandon is reported within this
/// of its deadline, and a wake-up this rare costs nothing next to training.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// A validated training job, as [`crate::train`] hands it to a strategy.
pub(crate) struct Job<'a, R, O: ?Sized, S> {
    pub pool: &'a mut WorkerPool<R>,
    pub state: &'a mut TrainState,
    pub optimizer: &'a O,
    pub batches: &'a Batches,
    pub end_step: u64,
    pub observer: &'a dyn Observer,
    /// The replicas' number of training examples.
    pub examples: usize,
    /// The parameters of record, loaded from `state`; the strategy saves them back into it.
    pub store: &'a S,
}

/// Checks the state and configuration against the pool's replicas; returns the number of
/// training examples.
pub(crate) fn validate<R: Replica, O: Optimizer + ?Sized>(
    pool: &WorkerPool<R>,
    state: &TrainState,
    optimizer: &O,
    batches: &Batches,
) -> Result<usize, TrainError> {
    let first = pool
        .replicas()
        .first()
        .ok_or_else(|| TrainError::Config("the pool has no workers".into()))?;
    // Retired workers stay out for the pool's life; with none left there is nothing to run, and
    // the failure that retired the first of them says why.
    if pool.active() == 0 {
        if let Some(failure) = pool.retired().first() {
            return Err(failure.clone().into());
        }
    }
    let model: usize = first.layout().iter().map(|s| s.len()).sum();
    if state.params.len() != model {
        return Err(TrainError::StateMismatch {
            state: state.params.len(),
            model,
        });
    }
    if !state.fits(optimizer) {
        return Err(TrainError::Config(format!(
            "the training state's optimiser state ({}) is not the optimiser's ({}), each as \
             long as the parameters",
            names(state.slots.iter().map(|s| s.name.as_str())),
            names(optimizer.state_names().iter().copied())
        )));
    }
    if batches.batch_size == 0 {
        return Err(TrainError::Config(
            "the batch size must be at least 1".into(),
        ));
    }
    let examples = first.training_examples();
    if examples == 0 {
        return Err(TrainError::Config("the training set is empty".into()));
    }
    Ok(examples)
}

/// `a, b` or `none`.
fn names<'n>(names: impl Iterator<Item = &'n str>) -> String {
    let list: Vec<&str> = names.collect();
    if list.is_empty() {
        "none".into()
    } else {
        list.join(", ")
    }
}

/// Fails the step when its loss is not finite, before any update is applied (the worker's
/// failure names the step).
pub(crate) fn check_loss(loss: f32) -> Result<f32, ReplicaError> {
    if loss.is_finite() {
        Ok(loss)
    } else {
        Err(Box::new(NonFiniteLoss { loss }))
    }
}

/// Watches a run for as long as its workers run (it returns within [`WATCH_EVERY`] of their
/// end): reports each stall to the observer once, and when a stop request has gone unanswered
/// for the observer's grace because workers make no progress, hands it `snapshot`, the last
/// consistent state of record, once. Both strategies run this one watchdog beside their workers
/// ([`WorkerPool::run_watched`]); it only reads atomics, so the workers pay nothing for it.
pub(crate) fn watchdog(
    observer: &dyn Observer,
    run: &RunWatch<'_>,
    snapshot: impl Fn(&RunWatch<'_>) -> Option<TrainState>,
) {
    let stall_timeout = observer.stall_timeout();
    let grace = observer.stop_grace();
    // For each worker, the progress time of the stall already reported: one report per stall,
    // and a new one only after the worker has made progress again.
    let mut reported: Vec<Option<Instant>> = vec![None; run.workers()];
    let mut stop_seen: Option<Instant> = None;
    let mut abandoned = false;
    while !run.wait_end(WATCH_EVERY) {
        let now = Instant::now();
        // Workers parked at a barrier wait for the others; only working ones can be stalled.
        let working: Vec<(Stall, Instant)> = (0..run.workers())
            .filter_map(|worker| match run.activity(worker)? {
                WorkerActivity::Working { step, since } => Some((
                    Stall {
                        worker,
                        device: *run.devices().get(worker)?,
                        step,
                        idle: now.saturating_duration_since(since),
                    },
                    since,
                )),
                _ => None,
            })
            .collect();
        if let Some(timeout) = stall_timeout {
            for (stall, since) in &working {
                if stall.idle >= timeout && reported[stall.worker] != Some(*since) {
                    reported[stall.worker] = Some(*since);
                    observer.on_stall(stall);
                }
            }
        }
        if abandoned {
            continue;
        }
        if !observer.should_stop() {
            stop_seen = None;
            continue;
        }
        let requested = *stop_seen.get_or_insert(now);
        if now.saturating_duration_since(requested) < grace {
            continue;
        }
        // A worker that made progress within the grace may still end on its own; those that
        // have not are what keeps the run from ending.
        let stalled: Vec<Stall> = working
            .into_iter()
            .map(|(stall, _)| stall)
            .filter(|stall| stall.idle >= grace)
            .collect();
        if stalled.is_empty() {
            continue;
        }
        abandoned = true;
        let state = snapshot(run);
        observer.on_abandon(&stalled, state.as_ref());
    }
}
