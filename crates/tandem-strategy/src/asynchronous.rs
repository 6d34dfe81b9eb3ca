//! Asynchronous data parallelism (parameter-server style).
//!
//! The parameters of record live in a sharded store. Each worker, on its own schedule, takes
//! the next batch ticket, computes gradients on that batch from its copy of the current
//! parameters and applies its update to the store at once, shard by shard under each shard's
//! lock, so no update is lost. Where the store can, the update also refreshes the worker's copy
//! as it goes, each shard just after writing it, for the next step, which starts at once;
//! otherwise the worker copies the parameters from the store before each step. Nobody waits for anybody: an update may be computed from
//! parameters that others have changed since (its staleness, recorded for every update).
//!
//! What an update does about its staleness is the run's [`AsyncRule`](crate::AsyncRule): by
//! default its learning rate is divided by it. A [`StalenessBound`] may also limit it: workers
//! wait before reading while too many compute, or an update too stale is dropped and its batch
//! computed anew from fresh parameters.
//!
//! Simulated workers ([`tandem_pool::Device::Sim`]) take turns: the order of their
//! reads and updates is the one N equally fast, truly parallel workers make (every worker reads
//! the initial parameters, then each update is followed by its worker's next read), one worker
//! computing at a time. Every update is then exactly as stale as on such workers: 0, 1, ..,
//! N - 1 in the first round, N - 1 ever after; and a run is bitwise reproducible.
//!
//! A worker that fails drops out; the others carry on and the report lists the failure. The
//! pool retires it, so later runs on the same pool (the segments of a long run) leave it out
//! too and do not report it again. A run fails only when every worker has failed.
//!
//! A watchdog beside the workers reports stalls to the observer and, when a stop cannot be
//! honoured because a worker hangs, hands it the store with every update it holds applied in
//! full (see [`Observer::on_abandon`](crate::Observer::on_abandon)).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use tandem_core::{Optimizer, Replica};
use tandem_pool::{FailurePolicy, RunWatch, WorkerContext};

use crate::common::{check_loss, watchdog, Job, StepLosses};
use crate::hyper::reports;
use crate::store::{AsyncStore, UpdateAt};
use crate::{EpochOrder, Epochs, Staleness, StalenessBound, StepReport, TrainError, TrainReport};

/// [`crate::train`] in this mode, on a validated job, with `store` holding the parameters of
/// record (loaded from the job's state, and saved back into it).
pub(crate) fn run<R: Replica, O: Optimizer + ?Sized, S: AsyncStore<R> + ?Sized>(
    job: Job<'_, R, O>,
    store: &S,
    schedule: &dyn Schedule,
) -> Result<TrainReport, TrainError> {
    let (pool, state) = (job.pool, job.state);
    let workers = pool.len();
    let batch_size = job.batches.batch_size as u64;
    let epochs = Epochs::new(job.examples, batch_size);
    let log_every = job.observer.log_every();
    let start_step = state.step;
    let started = Instant::now();

    let snapshot = |_: &RunWatch<'_>| store.consistent_copy(&|| schedule.version());
    let work = |ctx: &WorkerContext<'_>, replica: &mut R| {
        // However the worker ends, the schedule stops counting on it and the store waits for
        // nothing of its.
        let _leaves = OnDrop(|| {
            schedule.leave(ctx.worker());
            store.leave(ctx.worker());
        });
        replica.bind_thread()?;
        let mut order = EpochOrder::new(job.batches.seed, job.examples);
        let mut batch = vec![0u32; job.batches.batch_size];
        // The updates begun between this worker's load and its own.
        let mut tally = Tally::default();
        let mut step_losses = StepLosses::new(log_every);
        let lane = ctx.worker();
        // Asked after each update, so that a stop requested before the first still lets every
        // worker finish one.
        let mut stop = false;
        // The version of the parameters the replica holds, where its last update left them
        // there; each run loads first (the store may have been reset between runs).
        let mut holds = None;
        while let Some((ticket, latest)) = schedule.ticket(lane, stop) {
            ctx.set_step(ticket + 1);
            // A worker let through a waiting bound's gate reads what is there now, not what
            // its last update left it (others may have landed while it waited).
            let waited = matches!(job.bound, StalenessBound::Wait(_));
            let mut read_version = match holds.take() {
                Some(version) if !waited || version == latest => version,
                _ => {
                    store.load(ctx.worker(), replica)?;
                    latest
                }
            };
            order.fill(epochs.position(ticket), &mut batch);
            step_losses.record(ticket + 1, replica.compute_gradients(&batch)?)?;
            // Under a dropping bound the update's step is taken here, where a too stale one can
            // still be given up for a fresh read and the same batch computed again.
            let claimed = match job.bound {
                StalenessBound::Drop(limit) => loop {
                    match schedule.claim(lane, read_version, limit) {
                        Ok(step) => break Some(step),
                        Err(version) => {
                            tally.dropped += 1;
                            store.load(ctx.worker(), replica)?;
                            read_version = version;
                            step_losses.record(ticket + 1, replica.compute_gradients(&batch)?)?;
                        }
                    }
                },
                _ => None,
            };
            let (mut step, mut epoch) = (0, 0.0);
            let refreshed = store.apply((ctx.worker(), workers), replica, &mut || {
                step = claimed.unwrap_or_else(|| schedule.begin(lane));
                epoch = epochs.epoch_at(step);
                UpdateAt {
                    step,
                    epoch,
                    rate_scale: job.rule.rate_scale(step.saturating_sub(read_version)),
                }
            })?;
            schedule.complete();
            // It holds every update begun up to its own.
            holds = refreshed.then_some(step + 1);
            tally.add(step - read_version);
            stop = job.observer.should_stop();
            let logs = reports(log_every, step + 1);
            if !(logs || step_losses.due()) {
                continue;
            }
            // A loss left on the device is checked after its update: that update may already
            // have reached the store, but no checkpoint will hold it.
            let loss = step_losses.settle(replica, ctx)?;
            if let (true, Some(loss)) = (logs, loss) {
                job.observer.on_log(&StepReport {
                    step: step + 1,
                    // Checked as the sync strategy checks it: the L2 term may overflow alone.
                    loss: check_loss(
                        loss + store.l2_loss(ctx.worker(), job.optimizer.weight_decay())?,
                    )?,
                    learning_rate: job.optimizer.learning_rate(epoch),
                    examples: (step + 1 - start_step) * batch_size,
                    elapsed: started.elapsed(),
                    staleness: tally.last,
                });
            }
        }
        step_losses.settle(replica, ctx)?;
        Ok((tally.sum, tally.max, tally.updates, tally.dropped))
    };
    // Across ranks, this rank's service answers the others' workers for as long as any works.
    let outcome = std::thread::scope(|scope| {
        scope.spawn(|| schedule.serve());
        let outcome = pool.run_watched(FailurePolicy::Continue, work, |run| {
            watchdog(job.observer, run, job.messages, snapshot)
        });
        schedule.done();
        outcome
    });
    let elapsed = started.elapsed();
    let (begun, stopped) = schedule.finish();
    if outcome.results.iter().all(Option::is_none) {
        if let Some(failure) = outcome.failures.first() {
            return Err(failure.clone().into());
        }
    }
    let (sum, max, updates, dropped) = outcome
        .results
        .iter()
        .flatten()
        .fold((0, 0, 0, 0), |(s, m, n, d), &(ws, wm, wn, wd)| {
            (s + ws, m.max(wm), n + wn, d + wd)
        });
    store.save_into(state).map_err(TrainError::Device)?;
    state.step = begun;
    // Counted from the store's version: a failed worker's earlier updates count too.
    let steps = state.step - start_step;
    Ok(TrainReport {
        steps,
        examples: steps * batch_size,
        elapsed,
        staleness: Some(Staleness {
            mean: sum as f64 / updates.max(1) as f64,
            max,
            dropped,
        }),
        failures: outcome.failures,
        stopped: state.step < job.end_step && stopped,
    })
}

/// Where an asynchronous run's batch tickets come from and its updates are counted: in this
/// process ([`Counters`]), or, across ranks, at rank 0's service.
pub(crate) trait Schedule: Sync {
    /// The next batch ticket for the worker on `lane`, with the updates begun so far (the
    /// version of the parameters it is about to read); `None` when the run is over: its end
    /// reached, or a stop asked for (`stop`: this worker asks for one).
    fn ticket(&self, lane: usize, stop: bool) -> Option<(u64, u64)>;

    /// The step of an update about to be applied (updates begun before it).
    fn begin(&self, lane: usize) -> u64;

    /// [`begin`](Self::begin), for an update computed from the parameters at `read_version`,
    /// if it is at most `limit` updates stale then; otherwise `Err` with the version of the
    /// parameters the worker is to read again.
    fn claim(&self, lane: usize, read_version: u64, limit: u64) -> Result<u64, u64>;

    /// An update has written every piece of the store.
    fn complete(&self);

    /// The updates the store holds, when none is under way (see
    /// [`crate::ParamStore::consistent_copy`]).
    fn version(&self) -> Option<u64>;

    /// Runs beside the workers, answering other ranks, until every rank's are
    /// [`done`](Self::done).
    fn serve(&self);

    /// This rank's workers have ended.
    fn done(&self);

    /// The updates begun by all workers and whether a stop was asked for, once every worker has
    /// ended (collective across ranks).
    fn finish(&self) -> (u64, bool);

    /// The worker on `lane` has ended (its last ticket used, or failed): nobody waits for it.
    fn leave(&self, lane: usize) {
        let _ = lane;
    }
}

/// Runs its closure when it goes out of scope (also when the worker fails or panics): what a
/// worker's end tells the schedule and the store.
struct OnDrop<F: FnMut()>(F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

/// The counters of a run in one process.
pub(crate) struct Counters {
    /// The next batch ticket.
    tickets: AtomicU64,
    /// Updates begun: the store's version.
    applied: AtomicU64,
    /// Updates whose every piece is written.
    completed: AtomicU64,
    stop: AtomicBool,
    end_step: u64,
    /// The worker that trains alone during the warm-up.
    leader: usize,
    /// The step the others join at (tickets before it are the leader's).
    warmup_end: u64,
    /// The leader has ended: nobody waits for the warm-up's end any longer.
    leader_left: AtomicBool,
    /// Under a waiting bound, the workers between a read and their update.
    computing: Option<Gate>,
}

/// At most `limit` workers between their read of the parameters and their update.
struct Gate {
    limit: usize,
    /// Per lane: it has read and not begun its update.
    inside: Mutex<Vec<bool>>,
    /// A worker has left the gate.
    freed: Condvar,
}

/// How long a worker waiting at the gate sleeps at most before it looks for a stop again.
const GATE_POLL: std::time::Duration = std::time::Duration::from_millis(10);

impl Gate {
    fn lock(&self) -> MutexGuard<'_, Vec<bool>> {
        self.inside.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn admits(inside: &[bool], limit: usize, lane: usize) -> bool {
        inside[lane] || inside.iter().filter(|&&i| i).count() < limit
    }

    /// Lets `lane` in, waiting while the gate is full; `false` if `stopped` turns true first.
    fn enter(&self, lane: usize, stopped: &AtomicBool) -> bool {
        let mut inside = self.lock();
        while !Self::admits(&inside, self.limit, lane) {
            if stopped.load(Ordering::Relaxed) {
                return false;
            }
            inside = self
                .freed
                .wait_timeout(inside, GATE_POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        inside[lane] = true;
        true
    }

    fn leave(&self, lane: usize) {
        let mut inside = self.lock();
        if std::mem::replace(&mut inside[lane], false) {
            self.freed.notify_one();
        }
    }
}

/// How long a worker waiting for the warm-up's end sleeps between looks: nothing next to an
/// epoch.
const WARMUP_POLL: std::time::Duration = std::time::Duration::from_millis(1);

impl Counters {
    /// Counters of a run from `step` to `end_step`, in which `leader` trains alone until step
    /// `warmup_end` (`(leader, warmup_end)`), of `lanes` workers of which at most `computing`
    /// may be between a read and their update at once, if given.
    pub fn new(
        step: u64,
        end_step: u64,
        (leader, warmup_end): (usize, u64),
        (lanes, computing): (usize, Option<u64>),
    ) -> Self {
        Self {
            tickets: AtomicU64::new(step),
            applied: AtomicU64::new(step),
            completed: AtomicU64::new(step),
            stop: AtomicBool::new(false),
            end_step,
            leader,
            warmup_end,
            leader_left: AtomicBool::new(false),
            computing: computing.map(|limit| Gate {
                limit: usize::try_from(limit).unwrap_or(usize::MAX),
                inside: Mutex::new(vec![false; lanes]),
                freed: Condvar::new(),
            }),
        }
    }

    /// Whether the warm-up lets `lane` take tickets now: the leader always, the others once
    /// the warm-up's tickets are all taken (or the leader has ended).
    fn warmed_up(&self, lane: usize) -> bool {
        lane == self.leader
            || self.tickets.load(Ordering::Acquire) >= self.warmup_end.min(self.end_step)
            || self.leader_left.load(Ordering::Acquire)
    }

    /// Whether `lane` may take a ticket now without waiting: warmed up, and let in by the gate.
    fn admits(&self, lane: usize) -> bool {
        self.warmed_up(lane)
            && self
                .computing
                .as_ref()
                .is_none_or(|gate| Gate::admits(&gate.lock(), gate.limit, lane))
    }

    /// `lane`'s update begins: it leaves the gate.
    fn left_gate(&self, lane: usize) {
        if let Some(gate) = &self.computing {
            gate.leave(lane);
        }
    }
}

impl Schedule for Counters {
    fn ticket(&self, lane: usize, stop: bool) -> Option<(u64, u64)> {
        if stop {
            self.stop.store(true, Ordering::Relaxed);
        }
        while !self.warmed_up(lane) && !self.stop.load(Ordering::Relaxed) {
            std::thread::sleep(WARMUP_POLL);
        }
        let entered = self
            .computing
            .as_ref()
            .is_none_or(|gate| gate.enter(lane, &self.stop));
        if !entered || self.stop.load(Ordering::Relaxed) {
            return None;
        }
        let ticket = self.tickets.fetch_add(1, Ordering::AcqRel);
        (ticket < self.end_step).then(|| (ticket, self.applied.load(Ordering::Acquire)))
    }

    fn begin(&self, lane: usize) -> u64 {
        // Counted before the gate lets another worker read: that read is after this update.
        let step = self.applied.fetch_add(1, Ordering::AcqRel);
        self.left_gate(lane);
        step
    }

    fn claim(&self, lane: usize, read_version: u64, limit: u64) -> Result<u64, u64> {
        let mut begun = self.applied.load(Ordering::Acquire);
        loop {
            if begun.saturating_sub(read_version) > limit {
                return Err(begun);
            }
            match self.applied.compare_exchange_weak(
                begun,
                begun + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(step) => {
                    self.left_gate(lane);
                    return Ok(step);
                }
                Err(now) => begun = now,
            }
        }
    }

    fn complete(&self) {
        // Release: whoever sees the count sees every shard this update wrote.
        self.completed.fetch_add(1, Ordering::Release);
    }

    /// Updates write shard by shard, so a plain copy of the store may hold half of one. When
    /// every update begun has completed, none is under way: `completed` is read first, so that
    /// an update that begins after it makes the two differ, or changes `applied` by the second
    /// look.
    fn version(&self) -> Option<u64> {
        let done = self.completed.load(Ordering::Acquire);
        let begun = self.applied.load(Ordering::Acquire);
        (done == begun).then_some(begun)
    }

    fn serve(&self) {}

    fn done(&self) {}

    fn finish(&self) -> (u64, bool) {
        (
            self.applied.load(Ordering::Acquire),
            self.stop.load(Ordering::Relaxed),
        )
    }

    fn leave(&self, lane: usize) {
        self.left_gate(lane);
        if lane == self.leader {
            self.leader_left.store(true, Ordering::Release);
        }
    }
}

/// The turns of simulated workers over [`Counters`]: one worker runs at a time, and the turn
/// passes when a worker is about to apply an update ([`Schedule::begin`]): to the next worker
/// that has not read the parameters yet (the first round), else to the one holding the oldest
/// read, which applies its update, takes its next ticket (reading the parameters its update
/// left in it) and computes, until it is about to apply that. Equally fast parallel workers
/// make the same order of reads and updates, and the values depend only on that order. A
/// worker whose update is dropped ([`Schedule::claim`]) reads again at once, keeping the turn.
pub(crate) struct Turns<'c> {
    counters: &'c Counters,
    state: Mutex<TurnState>,
    /// One per lane: its turn has come.
    wake: Vec<Condvar>,
}

struct TurnState {
    /// The lane whose turn it is.
    turn: usize,
    /// Per lane: when it read the parameters for the update it has not applied yet (reads are
    /// numbered in their order).
    holds: Vec<Option<u64>>,
    /// Reads so far.
    reads: u64,
    /// Per lane: ended (or retired before the run), never given the turn.
    left: Vec<bool>,
}

impl<'c> Turns<'c> {
    /// Turns over `counters` for lanes whose `active` entry is true (retired workers do not run).
    pub fn new(counters: &'c Counters, active: impl IntoIterator<Item = bool>) -> Self {
        let left: Vec<bool> = active.into_iter().map(|a| !a).collect();
        let lanes = left.len();
        Self {
            counters,
            state: Mutex::new(TurnState {
                turn: left.iter().position(|l| !l).unwrap_or(0),
                holds: vec![None; lanes],
                reads: 0,
                left,
            }),
            wake: (0..lanes).map(|_| Condvar::new()).collect(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, TurnState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `lane` reads the parameters now.
    fn read(state: &mut TurnState, lane: usize) {
        state.holds[lane] = Some(state.reads);
        state.reads += 1;
    }

    /// Waits, holding `state`, until it is `lane`'s turn.
    fn wait_turn<'g>(
        &self,
        mut state: MutexGuard<'g, TurnState>,
        lane: usize,
    ) -> MutexGuard<'g, TurnState> {
        while state.turn != lane {
            state = self.wake[lane]
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
        state
    }

    /// Gives the turn away from `lane` (see [`Turns`]).
    fn pass(&self, state: &mut TurnState, lane: usize) {
        let lanes = state.holds.len();
        let waiting = |l: usize| !state.left[l] && self.counters.admits(l);
        let unread = (1..=lanes)
            .map(|k| (lane + k) % lanes)
            .find(|&l| waiting(l) && state.holds[l].is_none());
        let oldest = (0..lanes)
            .filter(|&l| waiting(l))
            .filter_map(|l| state.holds[l].map(|t| (t, l)))
            .min()
            .map(|(_, l)| l);
        if let Some(next) = unread.or(oldest) {
            state.turn = next;
            self.wake[next].notify_one();
        }
    }
}

impl Schedule for Turns<'_> {
    fn ticket(&self, lane: usize, stop: bool) -> Option<(u64, u64)> {
        let mut state = self.wait_turn(self.lock(), lane);
        let ticket = self.counters.ticket(lane, stop);
        match ticket {
            Some(_) => Self::read(&mut state, lane),
            None => {
                state.left[lane] = true;
                self.pass(&mut state, lane);
            }
        }
        ticket
    }

    fn begin(&self, lane: usize) -> u64 {
        let mut state = self.lock();
        self.pass(&mut state, lane);
        let _turn = self.wait_turn(state, lane);
        self.counters.begin(lane)
    }

    fn claim(&self, lane: usize, read_version: u64, limit: u64) -> Result<u64, u64> {
        let mut state = self.lock();
        self.pass(&mut state, lane);
        let mut state = self.wait_turn(state, lane);
        // Nobody else runs: the counters cannot change between the look and the claim.
        self.counters
            .claim(lane, read_version, limit)
            .inspect_err(|_| {
                Self::read(&mut state, lane);
            })
    }

    fn complete(&self) {
        let mut state = self.lock();
        let turn = state.turn;
        state.holds[turn] = None;
        self.counters.complete();
    }

    fn version(&self) -> Option<u64> {
        self.counters.version()
    }

    fn serve(&self) {}

    fn done(&self) {}

    fn finish(&self) -> (u64, bool) {
        self.counters.finish()
    }

    /// Also where the leader's leaving ends a warm-up: whoever it could not pass the turn to
    /// when its tickets ran out may have it now.
    fn leave(&self, lane: usize) {
        self.counters.leave(lane);
        let mut state = self.lock();
        state.left[lane] = true;
        state.holds[lane] = None;
        if state.turn == lane {
            self.pass(&mut state, lane);
        }
    }
}

/// One worker's staleness so far.
#[derive(Default)]
struct Tally {
    sum: u64,
    max: u64,
    updates: u64,
    /// The staleness of its latest update counted.
    last: Option<u64>,
    /// Its gradients dropped for being too stale.
    dropped: u64,
}

impl Tally {
    fn add(&mut self, staleness: u64) {
        self.sum += staleness;
        self.max = self.max.max(staleness);
        self.updates += 1;
        self.last = Some(staleness);
    }
}
