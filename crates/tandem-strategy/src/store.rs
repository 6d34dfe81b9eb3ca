use std::ops::Range;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use tandem_pool::ParamSpan;
use tandem_tensor::cpu::{self, UpdateStep};

use crate::{Hyper, TrainState};

/// Parameters per shard: small enough that workers updating different shards rarely wait for
/// each other, large enough that locking costs nothing next to the arithmetic.
const SHARD_LEN: usize = 16 * 1024;

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
}
