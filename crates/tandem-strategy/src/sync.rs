//! Synchronous data parallelism.
//!
//! Each step, every worker reads the same parameters (lent by the store where the replica
//! computes in host memory, copied into it otherwise), computes gradients on its own shard of
//! the global batch (`workers x batch_size` consecutive examples of the [`EpochOrder`]) and
//! publishes them. After a barrier, each worker averages the gradients of its own slice of the
//! parameters over all workers, always in worker order, and applies the update to that slice;
//! a second barrier ends the step. The reduction order never depends on timing, so a run is
//! bitwise reproducible for a seed and a worker count, and the averaged gradient equals that of
//! one worker with a `workers` times larger batch.
//!
//! A worker that fails stops the whole run at the next barrier, with an error naming the
//! worker and the step. Every step needs every worker, so a pool with a retired worker (one that
//! failed under asynchronous training) does not train synchronously.
//!
//! A watchdog beside the workers reports stalls to the observer and, when a stop cannot be
//! honoured because a worker hangs, hands it the state after the last step every worker
//! completed (see [`Observer::on_abandon`](crate::Observer::on_abandon)).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Instant;

use tandem_core::{Optimizer, Replica};
use tandem_pool::{Device, FailurePolicy, RunWatch, WorkerContext};

use crate::common::{check_loss, watchdog, Job, StepLosses};
use crate::helping::Board;
use crate::hyper::reports;
use crate::store::SyncStore;
use crate::{EpochOrder, Epochs, StepReport, TrainError, TrainReport};

/// The replicas [`crate::train`] needs for a run of `strategy` on `devices`, one a worker,
/// and the workers each of them computes (its batch that many workers' batches): a
/// synchronous run exchanging f32 with as many replicas on each of its GPUs (`cuda:0x4`,
/// `cuda:0x2,1x2`) needs one replica a GPU, computing its workers' shards (consecutive in the
/// data order, so the same examples) at once: every kernel covers them all and the update runs
/// once, where a replica each would launch every kernel and apply the whole update for each.
/// The averaged gradient is theirs in exact arithmetic (each sum runs over all their rows, in
/// a fixed order: reproducible, not bit for bit separate replicas'). Anything else needs a
/// replica a worker: CPU workers are parallel, asynchronous workers update on their own, and a
/// bf16 exchange rounds each worker's gradients.
pub fn replicas_for(strategy: &crate::Strategy, devices: &[Device]) -> (Vec<Device>, usize) {
    let apart = (devices.to_vec(), 1);
    if strategy.mode != crate::Mode::Sync || strategy.exchange != crate::Exchange::F32 {
        return apart;
    }
    let mut gpus: Vec<Device> = Vec::new();
    for device in devices {
        if !matches!(device, Device::Cuda { .. }) {
            return apart;
        }
        if !gpus.contains(device) {
            gpus.push(*device);
        }
    }
    let shards = devices.len() / gpus.len().max(1);
    let even = gpus
        .iter()
        .all(|gpu| devices.iter().filter(|d| *d == gpu).count() == shards);
    match even && shards > 1 {
        true => (gpus, shards),
        false => apart,
    }
}

/// [`crate::train`] in this mode, on a validated job, with `store` holding the parameters of
/// record (loaded from the job's state, and saved back into it).
pub(crate) fn run<R: Replica, O: Optimizer + ?Sized, S: SyncStore<R> + ?Sized>(
    job: Job<'_, R, O>,
    store: &S,
) -> Result<TrainReport, TrainError> {
    let (pool, state) = (job.pool, job.state);
    // The global batch and the split of the update are the whole pool's: without a retired
    // worker this would silently be another run, so its failure ends this one too.
    if let Some(failure) = pool.retired().first() {
        return Err(failure.clone().into());
    }
    // Across ranks, the run's workers are every rank's, in rank order.
    let local = pool.len();
    let (rank, ranks) = job.ranks.map_or((0, 1), |r| (r.rank(), r.ranks()));
    let workers = local * ranks;
    let global_batch = (workers * job.batches.batch_size) as u64;
    let epochs = Epochs::new(job.examples, global_batch);
    // Every rank takes its workers' losses at the run's log steps; this rank's observer hears
    // of those it asked for.
    let (log_every, observed) = (job.log_every, job.observer.log_every());
    let losses: Vec<AtomicU32> = (0..local).map(|_| AtomicU32::new(0)).collect();
    let stop = AtomicBool::new(false);
    let board = Board::new(local);
    let start_step = state.step;
    let started = Instant::now();

    // The store changes only between the two barriers of a step, so an even count of opened
    // barriers means no worker is updating, and half of it is the number of completed steps:
    // the version of `ParamStore::consistent_copy`.
    let snapshot = |run: &RunWatch<'_>| {
        store.consistent_copy(&|| {
            let passed = run.barriers_passed();
            passed.is_multiple_of(2).then_some(start_step + passed / 2)
        })
    };
    let work = |ctx: &WorkerContext<'_>, replica: &mut R| {
        let me = ctx.worker();
        replica.bind_thread()?;
        let mut order = EpochOrder::new(job.batches.seed, job.examples);
        let mut batch = vec![0u32; job.batches.batch_size];
        let mut step_losses = StepLosses::new(log_every);
        let mut done = start_step;
        for step in start_step..job.end_step {
            ctx.set_step(step + 1);
            order.fill(
                epochs.position(step) + ((rank * local + me) * job.batches.batch_size) as u64,
                &mut batch,
            );
            let helpers = board.helpers(me);
            step_losses.record(step + 1, store.compute(me, replica, &batch, &helpers)?)?;
            let logs = reports(log_every, step + 1);
            if logs || step_losses.due() {
                // Before the update: a non-finite loss fails the step before it is applied.
                if let Some(loss) = step_losses.settle(replica, ctx)? {
                    losses[me].store(loss.to_bits(), Ordering::Relaxed);
                }
            }
            store.publish(me, replica)?;
            // Waiting for the others, it finishes what they share out of their steps.
            if board.worth_waiting_for() {
                ctx.barrier_helping(&mut || board.help(me))?;
            } else {
                ctx.barrier()?;
            }
            let epoch = epochs.epoch_at(step);
            store.update_share(me, step, epoch)?;
            let mut data_loss = 0.0;
            if me == 0 {
                // Read between the barriers: every worker has stored this step's loss, and
                // nobody stores the next one before the second barrier.
                let mut agreed = [
                    f64::from(
                        losses
                            .iter()
                            .map(|l| f32::from_bits(l.load(Ordering::Relaxed)))
                            .sum::<f32>(),
                    ),
                    f64::from(u8::from(job.observer.should_stop())),
                ];
                // Worker 0 (of every rank, together) decides for everyone, before the barrier,
                // so all stop after the same step.
                if let Some(ranks) = job.ranks {
                    ranks.all_sum(0, &mut agreed);
                }
                data_loss = agreed[0] as f32 / workers as f32;
                stop.store(agreed[1] > 0.0, Ordering::Relaxed);
            }
            ctx.barrier()?;
            done = step + 1;

            if me == 0 && logs && reports(observed, done) {
                // What is printed and recorded is checked too: the L2 term overflows where the
                // weights have grown huge but the data loss is still finite.
                let l2 = store.l2_loss(me, job.optimizer.weight_decay())?;
                job.observer.on_log(&StepReport {
                    step: done,
                    loss: check_loss(data_loss + l2)?,
                    learning_rate: job.optimizer.learning_rate(epoch),
                    examples: (done - start_step) * global_batch,
                    elapsed: started.elapsed(),
                    staleness: None,
                });
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
        // The losses still on the device, before the run's end can be saved.
        step_losses.settle(replica, ctx)?;
        Ok(done)
    };
    let outcome = pool.run_watched(FailurePolicy::StopAll, work, |run| {
        watchdog(job.observer, run, job.messages, snapshot)
    });
    let elapsed = started.elapsed();
    let finished = outcome.into_results()?;
    let reached = finished.first().copied().unwrap_or(start_step);
    store.save_into(state).map_err(TrainError::Device)?;
    state.step = reached;
    let steps = reached - start_step;
    Ok(TrainReport {
        steps,
        examples: steps * global_batch,
        elapsed,
        staleness: None,
        failures: Vec::new(),
        stopped: reached < job.end_step,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Exchange, Mode, Strategy};

    /// A sync run exchanging f32 computes the replicas of each GPU as one when every GPU has
    /// as many; anything else keeps a replica a worker.
    #[test]
    fn only_even_sync_gpu_replicas_are_batched() {
        let cuda = |ordinal| Device::Cuda { ordinal };
        let strategy = |mode, exchange| Strategy {
            exchange,
            ..Strategy::from(mode)
        };
        let sync = strategy(Mode::Sync, Exchange::F32);
        let two_on_0 = [cuda(0), cuda(0)];
        assert_eq!(replicas_for(&sync, &two_on_0), (vec![cuda(0)], 2));
        let two_each = [cuda(0), cuda(1), cuda(0), cuda(1)];
        assert_eq!(replicas_for(&sync, &two_each), (vec![cuda(0), cuda(1)], 2));
        let uneven = [cuda(0), cuda(0), cuda(1)];
        let cpus = [Device::Cpu { worker: 0 }, Device::Cpu { worker: 1 }];
        let sims = [Device::Sim { worker: 0 }, Device::Sim { worker: 1 }];
        for (strategy, devices) in [
            (sync, &uneven[..]),
            (sync, &[cuda(0), cuda(1)][..]),
            (sync, &[cuda(0)][..]),
            (sync, &cpus[..]),
            (sync, &sims[..]),
            (sync, &[cuda(0), cuda(0), Device::Cpu { worker: 0 }][..]),
            (strategy(Mode::Async, Exchange::F32), &two_on_0[..]),
            (strategy(Mode::Sync, Exchange::Bf16), &two_on_0[..]),
        ] {
            let apart = (devices.to_vec(), 1);
            assert_eq!(
                replicas_for(&strategy, devices),
                apart,
                "{strategy:?} {devices:?}"
            );
        }
    }
}
