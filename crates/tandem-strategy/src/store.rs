use std::ops::Range;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use tandem_core::{ParamSpan, TrainState};
use tandem_tensor::cpu::{self, UpdateStep};

use crate::Hyper;

/// Parameters per shard: small enough that workers updating different shards rarely wait for
/// each other, large enough that locking costs nothing next to the arithmetic.
const SHARD_LEN: usize = 16 * 1024;

/// How many times [`ParamStore::consistent_copy`] tries before it gives up, a millisecond apart.
const COPY_TRIES: usize = 200;

/// One contiguous piece of the parameters and their moving average.
pub(crate) struct Shard {
    offset: usize,
    weight_decay: bool,
    params: Vec<f32>,
    ema: Vec<f32>,
}

impl Shard {
    fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.params.len()
    }
}

/// The parameters of record, split into shards that are locked one at a time, so that workers
/// can read and update different parts at once. Shards never straddle two parameter spans, so
/// each one is either regularised or not.
pub(crate) struct ParamStore {
    shards: Vec<RwLock<Shard>>,
    len: usize,
}

fn read(shard: &RwLock<Shard>) -> RwLockReadGuard<'_, Shard> {
    // Shards are only written by `sgd_ema_update`, which cannot panic half-way.
    shard.read().unwrap_or_else(|p| p.into_inner())
}

fn write(shard: &RwLock<Shard>) -> RwLockWriteGuard<'_, Shard> {
    shard.write().unwrap_or_else(|p| p.into_inner())
}

impl ParamStore {
    pub fn new(state: &TrainState, layout: &[ParamSpan]) -> Self {
        let mut shards = Vec::new();
        let mut offset = 0;
        for span in layout {
            let end = offset + span.len();
            for start in (offset..end).step_by(SHARD_LEN) {
                let range = start..(start + SHARD_LEN).min(end);
                shards.push(RwLock::new(Shard {
                    offset: start,
                    weight_decay: span.weight_decay,
                    params: state.params[range.clone()].to_vec(),
                    ema: state.ema[range].to_vec(),
                }));
            }
            offset = end;
        }
        Self {
            shards,
            len: offset,
        }
    }

    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Shards `first..last` that worker `worker` of `workers` owns in a synchronous step:
    /// contiguous, with about the same number of parameters each.
    pub fn owned_by(&self, worker: usize, workers: usize) -> Range<usize> {
        let boundary = |w: usize| {
            let target = self.len * w / workers;
            self.shards
                .iter()
                .position(|s| read(s).offset >= target)
                .unwrap_or(self.shards.len())
        };
        boundary(worker)..if worker + 1 == workers {
            self.shards.len()
        } else {
            boundary(worker + 1)
        }
    }

    /// Copies the current parameters into `dst` (the whole flat vector), shard by shard.
    pub fn copy_params(&self, dst: &mut [f32]) {
        for shard in &self.shards {
            let shard = read(shard);
            dst[shard.range()].copy_from_slice(&shard.params);
        }
    }

    /// Applies one optimiser step to shard `index`, with the gradient averaged over `grads`
    /// (whole flat vectors) in their order.
    pub fn update(&self, index: usize, grads: &[&[f32]], hyper: &Hyper, lr: f32, ema_decay: f32) {
        let mut guard = write(&self.shards[index]);
        let shard = &mut *guard;
        let range = shard.range();
        let parts: Vec<&[f32]> = grads.iter().map(|g| &g[range.clone()]).collect();
        let weight_decay = if shard.weight_decay {
            hyper.weight_decay
        } else {
            0.0
        };
        let step = UpdateStep {
            learning_rate: lr,
            weight_decay,
            ema_decay,
        };
        cpu::sgd_ema_update(&mut shard.params, &mut shard.ema, &parts, step);
    }

    /// `weight_decay / 2 * sum of w^2` over the regularised parameters.
    pub fn l2_loss(&self, weight_decay: f32) -> f32 {
        let sum: f64 = self
            .shards
            .iter()
            .map(read)
            .filter(|s| s.weight_decay)
            .map(|s| cpu::sum_squares(&s.params))
            .sum();
        (f64::from(weight_decay) / 2.0 * sum) as f32
    }

    /// Writes the parameters and moving average back into `state`.
    pub fn save_into(&self, state: &mut TrainState) {
        for shard in &self.shards {
            let shard = read(shard);
            state.params[shard.range()].copy_from_slice(&shard.params);
            state.ema[shard.range()].copy_from_slice(&shard.ema);
        }
    }

    /// A copy of the parameters and moving average that no update straddles, as a state whose
    /// step is the one `version` gives. `version` names the step the store holds, or `None`
    /// while an update is under way; writers must change it before they touch a shard and
    /// keep it changed until they are done (a seqlock). A copy counts only if the version is
    /// the same before and after it: a shard changed meanwhile changed the version first, and
    /// the shard's lock makes that visible here. `None` if no quiet moment came in
    /// [`COPY_TRIES`] attempts. Meant for rare use (a run being abandoned): it retries rather
    /// than making writers wait.
    pub fn consistent_copy(&self, version: impl Fn() -> Option<u64>) -> Option<TrainState> {
        for _ in 0..COPY_TRIES {
            if let Some(step) = version() {
                let mut state = TrainState {
                    params: vec![0.0; self.len],
                    ema: vec![0.0; self.len],
                    step,
                };
                self.save_into(&mut state);
                if version() == Some(step) {
                    return Some(state);
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

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
        let store = ParamStore::new(&TrainState::new(vec![0.0; 40_000]), &layout);
        assert!(store.shard_count() > 2);
        let hyper = Hyper {
            weight_decay: 0.0,
            ..Hyper::default()
        };
        let ones = vec![1.0f32; 40_000];
        const UPDATES: u64 = 2_000;
        // Every value follows the same sequence: after k updates, `expected[k]`.
        let mut expected = vec![(0.0f32, 0.0f32)];
        let (mut p, mut e) = ([0.0f32], [0.0f32]);
        for _ in 0..UPDATES {
            let step = UpdateStep {
                learning_rate: 1.0,
                weight_decay: 0.0,
                ema_decay: 0.5,
            };
            cpu::sgd_ema_update(&mut p, &mut e, &[&[1.0]], step);
            expected.push((p[0], e[0]));
        }
        let (begun, done) = (AtomicU64::new(0), AtomicU64::new(0));
        let version = || {
            let completed = done.load(Ordering::Acquire);
            let started = begun.load(Ordering::Acquire);
            (completed == started).then_some(started)
        };
        let check = |copy: &TrainState| {
            let (p, e) = expected[copy.step as usize];
            assert!(copy.params.iter().all(|&v| v == p), "step {}", copy.step);
            assert!(copy.ema.iter().all(|&v| v == e), "step {}", copy.step);
        };
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for _ in 0..UPDATES {
                    begun.fetch_add(1, Ordering::AcqRel);
                    // Last shard first (asynchronous workers start at different shards): an
                    // update that begins during a copy writes ahead of it.
                    for shard in (0..store.shard_count()).rev() {
                        store.update(shard, &[&ones], &hyper, 1.0, 0.5);
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
                if let Some(copy) = store.consistent_copy(version) {
                    check(&copy);
                }
            }
        });
        let last = store.consistent_copy(version).expect("no update under way");
        assert_eq!(last.step, UPDATES);
        check(&last);
    }
}
