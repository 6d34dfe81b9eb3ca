//! Where the parameters of record live while a strategy trains: the [`ParamStore`] seam, and
//! [`HostStore`], the store in host memory.

use std::ops::Range;
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use tandem_core::{
    Helpers, Optimizer, ParamSpan, Replica, ReplicaError, Slot, StepLoss, TrainState,
};
use tandem_tensor::cpu;

mod ranked;
mod shards;
pub(crate) use ranked::{RankedAsyncStore, RankedSyncStore, Sends};
use shards::{ShardWrite, Shards};

/// Parameters per shard: small enough that workers updating different shards rarely wait for
/// each other, large enough that locking costs nothing next to the arithmetic.
const SHARD_LEN: usize = 16 * 1024;

/// How many times [`ParamStore::consistent_copy`] tries before it gives up, a millisecond apart.
const COPY_TRIES: usize = 200;

/// Which update a store applies: its step (updates before it), its epoch (for schedules) and
/// the factor its learning rate is scaled by ([`crate::AsyncRule`]; 1 in synchronous training).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UpdateAt {
    /// Updates applied before this one.
    pub step: u64,
    /// Its position in passes over the training set.
    pub epoch: f64,
    /// The factor of its learning rate.
    pub rate_scale: f32,
}

impl UpdateAt {
    /// Update `step` at `epoch`, at the full learning rate.
    pub fn full(step: u64, epoch: f64) -> Self {
        Self {
            step,
            epoch,
            rate_scale: 1.0,
        }
    }
}

/// The parameters of record and the optimiser's state, as the strategies use them. Every
/// operation names the replica (or the worker) it serves rather than handing out host memory,
/// so that a store may keep everything where the replicas compute: [`HostStore`] in host
/// memory for CPU workers; a store in device memory moves the same data between device
/// buffers, and the strategies stay as they are.
pub trait ParamStore<R: Replica>: Sync {
    /// Gives `worker`'s `replica` the current parameters.
    fn load(&self, worker: usize, replica: &mut R) -> Result<(), ReplicaError>;

    /// `weight_decay / 2 * sum of w^2` over the regularised parameters (the L2 term of the
    /// reported loss), as `worker` sees them after its last update.
    fn l2_loss(&self, worker: usize, weight_decay: f32) -> Result<f32, ReplicaError>;

    /// Writes the parameters and optimiser state into `state` (its step is the caller's).
    fn save_into(&self, state: &mut TrainState) -> Result<(), ReplicaError>;

    /// A copy of the parameters and optimiser state that no update straddles, as a state whose
    /// step is the one `version` gives. `version` names the step the store holds, or `None`
    /// while an update is under way; writers must change it before they touch the store and
    /// keep it changed until they are done (a seqlock). A copy counts only if the version is
    /// the same before and after it. `None` if no quiet moment came in a while (200 tries a
    /// millisecond apart). Meant for rare use (a run being abandoned): it retries rather than
    /// making writers wait.
    fn consistent_copy(&self, version: &dyn Fn() -> Option<u64>) -> Option<TrainState> {
        for _ in 0..COPY_TRIES {
            if let Some(step) = version() {
                let mut state = self.empty_state(step);
                // A store that cannot be read now (a device store between a step's start and
                // its queueing) may be readable on the next try.
                if self.save_into(&mut state).is_ok() && version() == Some(step) {
                    return Some(state);
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }

    /// A state of the store's shape (zeros) at `step`, for [`save_into`](Self::save_into).
    fn empty_state(&self, step: u64) -> TrainState;
}

/// A store for synchronous training: between two barriers a step, every worker computes from
/// the same parameters, publishes its gradients, and updates its share with their mean.
pub trait SyncStore<R: Replica>: ParamStore<R> {
    /// `worker`'s `replica` computes its gradients on `batch` from the current
    /// parameters. A store may lend them to the replica rather than copy them into it, and then
    /// lets `helpers` take part ([`Replica::compute_gradients_from`]); the default:
    /// [`load`](ParamStore::load), then compute.
    fn compute(
        &self,
        worker: usize,
        replica: &mut R,
        batch: &[u32],
        helpers: &dyn Helpers,
    ) -> Result<StepLoss, ReplicaError> {
        let _ = helpers;
        load_then_compute(self, worker, replica, batch)
    }

    /// Makes `worker`'s gradients of its last step available to
    /// [`update_share`](Self::update_share).
    fn publish(&self, worker: usize, replica: &mut R) -> Result<(), ReplicaError>;

    /// `worker`'s part of update `step` (at `epoch`), with the mean of every
    /// worker's published gradients, summed in worker order. Every worker calls it once a step,
    /// between the same two barriers, and together they update every parameter once: a store
    /// may divide the work as it goes, so that workers done early help the others. A store may
    /// also leave the work to the worker's next step, if everything it hands out before then
    /// holds the update.
    fn update_share(&self, worker: usize, step: u64, epoch: f64) -> Result<(), ReplicaError>;
}

/// A store for asynchronous training: each worker applies its own update whenever its step
/// is done, while the others compute and update too.
pub trait AsyncStore<R: Replica>: ParamStore<R> {
    /// Applies `replica`'s gradients of its last step as one update, at once
    /// for this worker (`worker_of`: the worker and how many there are), while others may
    /// update too (each piece under its own lock, each worker starting at its own piece so
    /// that workers rarely queue). `begin` is called once, just before the first piece is
    /// written, and returns which update it is. A store may also leave the writing to the
    /// worker's next step, if everything it hands out before then holds the update (a device
    /// store's next [`load`](ParamStore::load) puts it first in that step).
    ///
    /// Returns whether it also gave `replica` the parameters as it left them, each piece read
    /// just after this update wrote it (while it is still in cache): the worker's next step,
    /// which starts at once, computes from them without a [`load`](ParamStore::load). They are the
    /// latest but for what other workers write to a piece between its update and the step's
    /// start, which the step after sees.
    fn apply(
        &self,
        worker_of: (usize, usize),
        replica: &mut R,
        begin: &mut dyn FnMut() -> UpdateAt,
    ) -> Result<bool, ReplicaError>;

    /// `worker` has stopped, done or failed: nothing of its is under way any more (a device
    /// store no longer waits for a step of its that took an update; one that failed may have
    /// lost it). The default: nothing to do.
    fn leave(&self, worker: usize) {
        let _ = worker;
    }
}

/// [`SyncStore::compute`] by copying: `store` loads the replica, which then computes.
fn load_then_compute<R: Replica, S: ParamStore<R> + ?Sized>(
    store: &S,
    worker: usize,
    replica: &mut R,
    batch: &[u32],
) -> Result<StepLoss, ReplicaError> {
    store.load(worker, replica)?;
    replica.compute_gradients(batch)
}

/// The parameters of record in host memory, split into shards that are locked one at a time,
/// so that workers can read and update different parts at once. Shards never straddle two
/// parameter spans, so each one is either regularised or not. It holds one gradient buffer per
/// worker, which replicas in host memory exchange theirs with rather than copy them. In
/// synchronous training it lends the parameters to such replicas
/// ([`Replica::compute_gradients_from`]): every worker reads the same parameters between the
/// barriers, so none needs a copy of its own. In asynchronous training each needs a copy (the
/// parameters change under a step), and an update writes it shard by shard as it goes
/// ([`AsyncStore::apply`]), rather than the next step reading every shard again.
pub struct HostStore<'o, O: Optimizer + ?Sized> {
    optimizer: &'o O,
    shards: Shards,
    slot_names: Vec<String>,
    len: usize,
    grads: Vec<RwLock<Vec<f32>>>,
    /// The shards each synchronous worker updates first, computed once: a step must not lock
    /// shards that other workers are updating just to find its own.
    shares: Vec<Range<usize>>,
    /// Which shards of each share are still to be updated in the step under way.
    claims: Mutex<Claims>,
}

/// The synchronous update's division of work in one step: each share's shards not yet claimed,
/// `next[w]..last[w]`. Its owner takes them from the front, workers done with their own share
/// from the back, so that a worker slowed down (a busy core) is helped, while each keeps
/// updating the same shards step after step. Who updates a shard does not change the result.
struct Claims {
    /// The step these claims are of; the first claim of another step starts afresh.
    step: Option<u64>,
    next: Vec<usize>,
    last: Vec<usize>,
}

impl Claims {
    /// A shard for `worker` to update in `step`: the next of its own share, else the last
    /// unclaimed one of the next share that has any; `None` when every shard is claimed.
    fn claim(&mut self, shares: &[Range<usize>], worker: usize, step: u64) -> Option<usize> {
        if self.step != Some(step) {
            self.step = Some(step);
            self.next = shares.iter().map(|share| share.start).collect();
            self.last = shares.iter().map(|share| share.end).collect();
        }
        if self.next[worker] < self.last[worker] {
            self.next[worker] += 1;
            return Some(self.next[worker] - 1);
        }
        let others = (worker + 1..shares.len()).chain(0..worker);
        let victim = others.into_iter().find(|&w| self.next[w] < self.last[w])?;
        self.last[victim] -= 1;
        Some(self.last[victim])
    }
}

/// The shards of the parameters of `layout`: [`SHARD_LEN`] values at most, never straddling
/// two spans, each with whether L2 applies to it.
fn shard_ranges(layout: &[ParamSpan]) -> Vec<(Range<usize>, bool)> {
    let mut ranges = Vec::new();
    let mut offset = 0;
    for span in layout {
        let end = offset + span.len();
        for start in (offset..end).step_by(SHARD_LEN) {
            ranges.push((start..(start + SHARD_LEN).min(end), span.weight_decay));
        }
        offset = end;
    }
    ranges
}

/// Shards `first..last` for each of `workers` workers in a synchronous step, from the shards'
/// first parameters (`starts`) over `len` parameters: contiguous, with about the same number of
/// parameters each.
fn shares(starts: &[usize], len: usize, workers: usize) -> Vec<Range<usize>> {
    let boundary = |w: usize| {
        let target = len * w / workers;
        starts
            .iter()
            .position(|&offset| offset >= target)
            .unwrap_or(starts.len())
    };
    (0..workers)
        .map(|w| {
            boundary(w)..if w + 1 == workers {
                starts.len()
            } else {
                boundary(w + 1)
            }
        })
        .collect()
}

impl<'o, O: Optimizer + ?Sized> HostStore<'o, O> {
    /// A store holding `state`'s parameters and optimiser state in `layout`'s spans, with
    /// gradient buffers for `workers` workers.
    /// `state` must fit `layout` and `optimizer` (the strategies check it first).
    pub fn new(state: &TrainState, layout: &[ParamSpan], optimizer: &'o O, workers: usize) -> Self {
        Self::with_shares(state, layout, optimizer, workers, workers)
    }

    /// [`HostStore::new`] with gradient buffers for `slots` workers and the parameters split
    /// into `shares` synchronous shares (across ranks: this rank's workers, everyone's shares).
    fn with_shares(
        state: &TrainState,
        layout: &[ParamSpan],
        optimizer: &'o O,
        slots: usize,
        shares_of: usize,
    ) -> Self {
        let ranges = shard_ranges(layout);
        let len = ranges.last().map_or(0, |(range, _)| range.end);
        let starts: Vec<usize> = ranges.iter().map(|(range, _)| range.start).collect();
        let slots_of: Vec<&[f32]> = state.slots.iter().map(|s| s.values.as_slice()).collect();
        Self {
            optimizer,
            shards: Shards::new(state.params.clone(), &slots_of, ranges),
            slot_names: state.slots.iter().map(|s| s.name.clone()).collect(),
            len,
            grads: (0..slots).map(|_| RwLock::new(vec![0.0; len])).collect(),
            shares: shares(&starts, len, shares_of),
            claims: Mutex::new(Claims {
                step: None,
                next: Vec::new(),
                last: Vec::new(),
            }),
        }
    }

    /// Applies one update to shard `index` with `grads` (whole flat vectors), and hands the
    /// shard to `written` before unlocking it.
    fn update(
        &self,
        index: usize,
        grads: &[&[f32]],
        at: UpdateAt,
        written: &mut dyn FnMut(&ShardWrite<'_>),
    ) {
        let mut shard = self.shards.write(index);
        shard.update(self.optimizer, grads, 0, at);
        written(&shard);
    }

    /// One asynchronous update with `grads` (a whole flat vector) of every shard, worker
    /// `worker` of `workers` starting at its own; see [`AsyncStore::apply`].
    fn update_all(
        &self,
        (worker, workers): (usize, usize),
        grads: &[f32],
        begin: &mut dyn FnMut() -> UpdateAt,
        written: &mut dyn FnMut(&ShardWrite<'_>),
    ) {
        let shards = self.shards.len();
        let first = worker * shards / workers.max(1);
        let at = begin();
        for shard in (first..shards).chain(0..first) {
            self.update(shard, &[grads], at, written);
        }
    }
}

impl<R: Replica, O: Optimizer + ?Sized> ParamStore<R> for HostStore<'_, O> {
    fn load(&self, _: usize, replica: &mut R) -> Result<(), ReplicaError> {
        replica.set_params(&mut |dst| {
            for index in 0..self.shards.len() {
                let shard = self.shards.read(index);
                dst[shard.range()].copy_from_slice(shard.params());
            }
        })
    }

    fn l2_loss(&self, _: usize, weight_decay: f32) -> Result<f32, ReplicaError> {
        let sum: f64 = (0..self.shards.len())
            .map(|index| self.shards.read(index))
            .filter(|s| s.weight_decay())
            .map(|s| cpu::sum_squares(s.params()))
            .sum();
        Ok(l2_term(weight_decay, sum))
    }

    fn save_into(&self, state: &mut TrainState) -> Result<(), ReplicaError> {
        for index in 0..self.shards.len() {
            let shard = self.shards.read(index);
            state.params[shard.range()].copy_from_slice(shard.params());
            for (slot, values) in state.slots.iter_mut().zip(&shard.state) {
                slot.values[shard.range()].copy_from_slice(values);
            }
        }
        Ok(())
    }

    fn empty_state(&self, step: u64) -> TrainState {
        zeros(self.len, &self.slot_names, step)
    }
}

impl<R: Replica, O: Optimizer + ?Sized> SyncStore<R> for HostStore<'_, O> {
    fn compute(
        &self,
        worker: usize,
        replica: &mut R,
        batch: &[u32],
        helpers: &dyn Helpers,
    ) -> Result<StepLoss, ReplicaError> {
        if let Some(loss) = self
            .shards
            .lend(|params| replica.compute_gradients_from(params, batch, helpers))?
        {
            return Ok(loss);
        }
        load_then_compute(self, worker, replica, batch)
    }

    fn publish(&self, worker: usize, replica: &mut R) -> Result<(), ReplicaError> {
        let mut mine = self.grads[worker]
            .write()
            .unwrap_or_else(|p| p.into_inner());
        // Where the replica's gradients are host memory, the slot takes them without a copy.
        if replica.exchange_gradients(&mut mine)? {
            return Ok(());
        }
        replica.read_gradients(&mut |g| mine.copy_from_slice(g))
    }

    fn update_share(&self, worker: usize, step: u64, epoch: f64) -> Result<(), ReplicaError> {
        let all: Vec<_> = self
            .grads
            .iter()
            .map(|g| g.read().unwrap_or_else(|p| p.into_inner()))
            .collect();
        let all: Vec<&[f32]> = all.iter().map(|g| g.as_slice()).collect();
        let claim = || {
            self.claims
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .claim(&self.shares, worker, step)
        };
        while let Some(shard) = claim() {
            self.update(shard, &all, UpdateAt::full(step, epoch), &mut |_| {});
        }
        Ok(())
    }
}

impl<R: Replica, O: Optimizer + ?Sized> AsyncStore<R> for HostStore<'_, O> {
    fn apply(
        &self,
        worker_of: (usize, usize),
        replica: &mut R,
        begin: &mut dyn FnMut() -> UpdateAt,
    ) -> Result<bool, ReplicaError> {
        // Where the replica's gradients are host memory, they change places with the worker's
        // buffer, and its parameters are written from each shard just updated.
        if let Some(slot) = self.grads.get(worker_of.0) {
            let mut grads = slot.write().unwrap_or_else(|p| p.into_inner());
            if replica.exchange_gradients(&mut grads)? {
                replica.set_params(&mut |params| {
                    self.update_all(worker_of, &grads, begin, &mut |shard| {
                        params[shard.range()].copy_from_slice(shard.params());
                    })
                })?;
                return Ok(true);
            }
        }
        replica.read_gradients(&mut |grads| {
            self.update_all(worker_of, grads, begin, &mut |_| {});
        })?;
        Ok(false)
    }
}

/// A state of `len` zero parameters and state vectors `names`, at `step`.
pub(crate) fn zeros(len: usize, names: &[String], step: u64) -> TrainState {
    TrainState {
        params: vec![0.0; len],
        slots: names
            .iter()
            .map(|name| Slot {
                name: name.clone(),
                values: vec![0.0; len],
            })
            .collect(),
        step,
    }
}

/// `weight_decay / 2 * sum`: the L2 term of the loss from the sum of the squared regularised
/// parameters.
pub(crate) fn l2_term(weight_decay: f32, sum: f64) -> f32 {
    (f64::from(weight_decay) / 2.0 * sum) as f32
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use tandem_optim::Sgd;

    /// Each shard of a step is claimed once: owners from the front of their share, a worker
    /// done with its own from the back of the next share with any left; a new step starts
    /// afresh.
    #[test]
    fn claims_hand_out_every_shard_of_a_step_once_owners_first() {
        let shares = [0..3, 3..6, 6..6];
        let mut claims = Claims {
            step: None,
            next: Vec::new(),
            last: Vec::new(),
        };
        let mut claim = |worker, step| claims.claim(&shares, worker, step);
        assert_eq!(claim(0, 7), Some(0));
        // Worker 2 has no shard of its own: it helps worker 0, from the back.
        assert_eq!(claim(2, 7), Some(2));
        assert_eq!(claim(1, 7), Some(3));
        assert_eq!(claim(0, 7), Some(1));
        // Worker 0 is done with its own share, and takes worker 1's last.
        assert_eq!(claim(0, 7), Some(5));
        assert_eq!(claim(1, 7), Some(4));
        for worker in 0..3 {
            assert_eq!(claim(worker, 7), None);
        }
        assert_eq!(claim(1, 8), Some(3), "the next step starts afresh");
    }

    /// The asynchronous protocol (begin, write every shard, complete) against copies taken at
    /// the same time: a copy never holds part of an update, and its step is the updates it holds.
    #[test]
    fn a_consistent_copy_never_holds_half_an_update() {
        let span = |name: &str| ParamSpan {
            name: name.into(),
            shape: vec![20_000],
            weight_decay: false,
        };
        let layout = [span("a"), span("b")];
        let sgd = Sgd {
            learning_rate: 1.0,
            lr_decay: 1.0,
            weight_decay: 0.0,
            ema_decay: 0.5,
        };
        // From step 8 on the warm-up no longer lowers the average's decay.
        const STEP: u64 = 100;
        let store = HostStore::new(&TrainState::new(vec![0.0; 40_000], &sgd), &layout, &sgd, 0);
        let shards = store.shards.len();
        assert!(shards > 2);
        let ones = vec![1.0f32; 40_000];
        const UPDATES: u64 = 2_000;
        // Every value follows the same sequence: after k updates, `expected[k]`.
        let mut expected = vec![(0.0f32, 0.0f32)];
        let one = Shards::new(vec![0.0], &[&[0.0]], vec![(0..1, false)]);
        for _ in 0..UPDATES {
            one.write(0)
                .update(&sgd, &[&[1.0]], 0, UpdateAt::full(STEP, 0.0));
            let piece = one.read(0);
            expected.push((piece.params()[0], piece.state[0][0]));
        }
        let (begun, done) = (AtomicU64::new(0), AtomicU64::new(0));
        let version = || {
            let completed = done.load(Ordering::Acquire);
            let started = begun.load(Ordering::Acquire);
            (completed == started).then_some(started)
        };
        let copy = || ParamStore::<Box<dyn Replica>>::consistent_copy(&store, &version);
        let check = |copy: &TrainState| {
            let (p, e) = expected[copy.step as usize];
            assert!(copy.params.iter().all(|&v| v == p), "step {}", copy.step);
            assert!(
                copy.slots[0].values.iter().all(|&v| v == e),
                "step {}",
                copy.step
            );
        };
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for _ in 0..UPDATES {
                    begun.fetch_add(1, Ordering::AcqRel);
                    // Last shard first (asynchronous workers start at different shards): an
                    // update that begins during a copy writes ahead of it.
                    for shard in (0..shards).rev() {
                        store.update(shard, &[&ones], UpdateAt::full(STEP, 0.0), &mut |_| {});
                        // Leaves the update half-applied for a while, as a preempted worker
                        // would, so that copies meet it.
                        std::thread::yield_now();
                    }
                    done.fetch_add(1, Ordering::Release);
                    // And gives copies a quiet moment to start in, about as long as a copy.
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
            });
            while done.load(Ordering::Acquire) < UPDATES {
                if let Some(copy) = copy() {
                    check(&copy);
                }
            }
        });
        let last = copy().expect("no update under way");
        assert_eq!(last.step, UPDATES);
        check(&last);
    }
}
