//! What both strategies share around their workers: the checks before they start, the loss
//! check of every step, and the watchdog that runs beside them.

use std::time::{Duration, Instant};

use tandem_core::{Optimizer, Replica, ReplicaError, StepLoss, TrainState};
use tandem_pool::{Device, RunWatch, WorkerActivity, WorkerContext, WorkerPool};

use crate::{
    AsyncRule, Batches, ConfigError, NonFiniteLoss, Observer, SilentRank, StalenessBound, Stall,
    TrainError,
};
use tandem_collectives::{Channel, Collectives, Ranks};

/// How often the watchdog looks at the workers: a stall or an abandon is reported within this
/// of its deadline, and a wake-up this rare costs nothing next to training.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// A validated training job, as [`crate::train`] hands it to a strategy.
pub(crate) struct Job<'a, R, O: ?Sized> {
    pub pool: &'a mut WorkerPool<R>,
    pub state: &'a mut TrainState,
    pub optimizer: &'a O,
    pub batches: &'a Batches,
    pub end_step: u64,
    pub observer: &'a dyn Observer,
    /// The replicas' number of training examples.
    pub examples: usize,
    /// The other processes of the run, when it spans several.
    pub ranks: Option<&'a dyn Collectives>,
    /// The same, when the transport carries messages too.
    pub messages: Option<&'a dyn Ranks>,
    /// What asynchronous updates do about staleness.
    pub rule: AsyncRule,
    /// How stale an asynchronous update may be.
    pub bound: StalenessBound,
    /// The steps between the run's logged losses: rank 0's observer's, on every rank.
    pub log_every: u64,
}

/// Whether the pool's workers are simulated ([`Device::Sim`]): all of them or none, and not
/// across processes (a simulation is one process's turns).
pub(crate) fn simulated(devices: &[Device], across_ranks: bool) -> Result<bool, TrainError> {
    let sims = devices
        .iter()
        .filter(|d| matches!(d, Device::Sim { .. }))
        .count();
    match sims {
        0 => Ok(false),
        _ if sims < devices.len() => Err(ConfigError::SimulatedBesideReal.into()),
        _ if across_ranks => Err(ConfigError::SimulatedAcrossRanks.into()),
        _ => Ok(true),
    }
}

/// Checks that every rank runs the same job: as many workers, training examples and
/// parameters, and the same steps. Collective; every rank gets the same answer.
pub(crate) fn validate_across<R: Replica>(
    ranks: &dyn Collectives,
    pool: &WorkerPool<R>,
    state: &TrainState,
    examples: usize,
    end_step: u64,
    log_every: u64,
) -> Result<u64, TrainError> {
    let mine = [
        pool.len() as u64,
        examples as u64,
        state.params.len() as u64,
        state.step,
        end_step,
    ];
    // The maxima of the values and of their complements: the largest and the smallest.
    let mut spread: Vec<u64> = mine
        .iter()
        .copied()
        .chain(mine.iter().map(|v| !v))
        .collect();
    ranks.open_lanes(1);
    ranks.all_max(0, &mut spread);
    let what = [
        "workers",
        "training examples",
        "parameters",
        "starting step",
        "end step",
    ];
    for (i, name) in what.iter().enumerate() {
        let (most, least) = (spread[i], !spread[i + what.len()]);
        if most != least {
            return Err(ConfigError::RanksDisagree {
                what: name,
                least,
                most,
            }
            .into());
        }
    }
    // Rank 0's: the others may watch less, but must take their losses when it logs.
    let mut cadence = [if ranks.rank() == 0 { log_every } else { 0 }];
    ranks.all_max(0, &mut cadence);
    Ok(cadence[0])
}

/// Checks the state and configuration against the pool's replicas; returns the number of
/// training examples.
pub(crate) fn validate<R: Replica, O: Optimizer + ?Sized>(
    pool: &WorkerPool<R>,
    state: &TrainState,
    optimizer: &O,
    batches: &Batches,
) -> Result<usize, TrainError> {
    let first = pool.replicas().first().ok_or(ConfigError::NoWorkers)?;
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
        return Err(ConfigError::OtherOptimizerState {
            state: names(state.slots.iter().map(|s| s.name.as_str())),
            optimizer: names(optimizer.state_names().iter().copied()),
        }
        .into());
    }
    if batches.batch_size == 0 {
        return Err(ConfigError::EmptyBatch.into());
    }
    let examples = first.training_examples();
    if examples == 0 {
        return Err(ConfigError::NoExamples.into());
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

/// Fails when `loss` is not finite.
pub(crate) fn check_loss(loss: f32) -> Result<f32, ReplicaError> {
    if loss.is_finite() {
        Ok(loss)
    } else {
        Err(Box::new(NonFiniteLoss { loss }))
    }
}

/// At most this many steps' losses wait on a device before they are checked, whatever the
/// logging interval (a device replica keeps at least this many).
const MAX_DEFERRED: u64 = 1000;

/// One worker's step losses. A loss known at once is checked at once, so that a non-finite one
/// fails its step before the update is applied. Losses left on the device are taken and
/// checked together at [`due`](Self::due) steps and at the end of the worker's run (so at every
/// log, evaluation and checkpoint boundary, each of which ends a strategy's run): a
/// divergence stops the run within one logging interval, before a checkpoint could hold it,
/// and the failure names the first step whose loss was not finite.
pub(crate) struct StepLosses {
    /// The global steps (1-based) whose losses are still on the device, oldest first.
    pending: Vec<u64>,
    taken: Vec<f32>,
    every: u64,
    /// Steps recorded since the last [`settle`](Self::settle).
    unsettled: u64,
    last: Option<f32>,
}

impl StepLosses {
    /// Losses of an observer that logs every `log_every` steps.
    pub fn new(log_every: u64) -> Self {
        Self {
            pending: Vec::new(),
            taken: Vec::new(),
            every: if log_every == 0 {
                MAX_DEFERRED
            } else {
                log_every.min(MAX_DEFERRED)
            },
            unsettled: 0,
            last: None,
        }
    }

    /// Records the loss of global step `step` (1-based); fails if it is known and not finite.
    pub fn record(&mut self, step: u64, loss: StepLoss) -> Result<(), ReplicaError> {
        self.unsettled += 1;
        match loss {
            StepLoss::Known(loss) => self.last = Some(check_loss(loss)?),
            StepLoss::OnDevice => self.pending.push(step),
        }
        Ok(())
    }

    /// Whether enough steps have passed since the last [`settle`](Self::settle) that what they
    /// left on the device (their losses) should be taken now.
    pub fn due(&self) -> bool {
        self.unsettled >= self.every
    }

    /// Takes the losses left on the device and checks them (a failure is reported at the first
    /// bad step, through `ctx`); returns the loss of the last step recorded.
    pub fn settle<R: Replica>(
        &mut self,
        replica: &mut R,
        ctx: &WorkerContext<'_>,
    ) -> Result<Option<f32>, ReplicaError> {
        self.unsettled = 0;
        if self.pending.is_empty() {
            return Ok(self.last);
        }
        self.taken.clear();
        replica.take_losses(&mut self.taken)?;
        if self.taken.len() != self.pending.len() {
            return Err(format!(
                "the replica returned {} losses for {} steps",
                self.taken.len(),
                self.pending.len()
            )
            .into());
        }
        for (&step, &loss) in self.pending.iter().zip(&self.taken) {
            if !loss.is_finite() {
                ctx.set_step(step);
                return Err(Box::new(NonFiniteLoss { loss }));
            }
        }
        self.pending.clear();
        self.last = self.taken.last().copied();
        Ok(self.last)
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
    ranks: Option<&dyn Ranks>,
    snapshot: impl Fn(&RunWatch<'_>) -> Option<TrainState>,
) {
    match ranks.filter(|r| r.ranks() > 1) {
        // Every rank but 0 signals it is alive from a thread of its own, so that a send that
        // waits (rank 0 stopped) never holds up this rank's own watch.
        Some(ranks) if ranks.rank() != 0 => std::thread::scope(|scope| {
            scope.spawn(|| {
                while !run.wait_end(BEACON_EVERY) {
                    ranks.send(Channel::Beacon, 0, 0, &[highest_step(run)], &[]);
                }
            });
            watch(observer, run, None, snapshot);
        }),
        Some(ranks) => watch(observer, run, Some(&mut Beacons::new(ranks)), snapshot),
        None => watch(observer, run, None, snapshot),
    }
}

/// How often every rank but 0 tells rank 0 it is alive.
const BEACON_EVERY: Duration = Duration::from_secs(1);
/// How long rank 0 goes without a sign of life from a rank before it names it in a stall.
const SILENCE: Duration = Duration::from_secs(3);

/// The highest step any of the run's workers has announced, plus one (0: none yet), as a
/// beacon carries it.
fn highest_step(run: &RunWatch<'_>) -> u64 {
    (0..run.workers())
        .filter_map(|worker| match run.activity(worker)? {
            WorkerActivity::Working { step, .. } | WorkerActivity::Waiting { step } => step,
            _ => None,
        })
        .max()
        .map_or(0, |step| step + 1)
}

/// Rank 0's record of the other ranks' beacons: when each was last heard from, at what step.
struct Beacons<'r> {
    ranks: &'r dyn Ranks,
    heard: Vec<(Instant, Option<u64>)>,
}

impl<'r> Beacons<'r> {
    fn new(ranks: &'r dyn Ranks) -> Self {
        Self {
            ranks,
            heard: vec![(Instant::now(), None); ranks.ranks()],
        }
    }

    /// Takes every beacon that has arrived.
    fn take(&mut self) {
        let (mut header, mut payload) = (Vec::new(), Vec::new());
        while let Some((from, tag)) = self.ranks.poll(Channel::Beacon) {
            self.ranks
                .receive(Channel::Beacon, from, tag, &mut header, &mut payload);
            if let Some(heard) = self.heard.get_mut(from) {
                let step = header.first().and_then(|s| s.checked_sub(1));
                *heard = (Instant::now(), step.or(heard.1));
            }
        }
    }

    /// The ranks not heard from for [`SILENCE`] or longer, at `now`.
    fn silent(&self, now: Instant) -> Vec<SilentRank> {
        (self.heard.iter().enumerate().skip(1))
            .map(|(rank, &(at, step))| SilentRank {
                rank,
                silence: now.saturating_duration_since(at),
                step,
            })
            .filter(|silent| silent.silence >= SILENCE)
            .collect()
    }
}

/// [`watchdog`]'s loop; `beacons` on rank 0 of a run across ranks.
fn watch(
    observer: &dyn Observer,
    run: &RunWatch<'_>,
    mut beacons: Option<&mut Beacons<'_>>,
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
        if let Some(beacons) = beacons.as_deref_mut() {
            beacons.take();
        }
        let now = Instant::now();
        let silent_ranks = beacons
            .as_deref()
            .map(|b| b.silent(now))
            .unwrap_or_default();
        // Workers parked at a barrier wait for the others; only working ones can be stalled.
        let working: Vec<(Stall, Instant)> = (0..run.workers())
            .filter_map(|worker| match run.activity(worker)? {
                WorkerActivity::Working { step, since } => Some((
                    Stall {
                        worker,
                        device: *run.devices().get(worker)?,
                        step,
                        idle: now.saturating_duration_since(since),
                        silent_ranks: silent_ranks.clone(),
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
