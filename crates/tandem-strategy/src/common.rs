//! What both strategies need before their workers start.

use tandem_pool::{Replica, ReplicaError, WorkerPool};

use crate::{Hyper, NonFiniteLoss, TrainError, TrainState};

/// Checks the state and configuration against the pool's replicas; returns the number of
/// training examples.
pub(crate) fn validate<R: Replica>(
    pool: &WorkerPool<R>,
    state: &TrainState,
    hyper: &Hyper,
) -> Result<usize, TrainError> {
    let first = pool
        .replicas()
        .first()
        .ok_or_else(|| TrainError::Config("the pool has no workers".into()))?;
    let model: usize = first.layout().iter().map(|s| s.len()).sum();
    if state.params.len() != model || state.ema.len() != model {
        return Err(TrainError::StateMismatch {
            state: state.params.len(),
            model,
        });
    }
    if hyper.batch_size == 0 {
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

/// Fails the step when its loss is not finite, before any update is applied.
pub(crate) fn check_loss(loss: f32, step: u64) -> Result<f32, ReplicaError> {
    if loss.is_finite() {
        Ok(loss)
    } else {
        Err(Box::new(NonFiniteLoss {
            loss,
            step: step + 1,
        }))
    }
}
