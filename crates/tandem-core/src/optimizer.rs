use crate::DeviceUpdate;

/// One contiguous piece of the parameters, as an [`Optimizer`] updates it.
pub struct Piece<'p, 's> {
    /// The parameters of the piece.
    pub params: &'p mut [f32],
    /// The optimiser's state for the same piece, one slice per [`Optimizer::state_names`]
    /// entry, in that order.
    pub state: &'p mut [&'s mut [f32]],
    /// The step's gradients for the piece, one per contributing replica; the update uses their
    /// mean, summed in this order (which makes a synchronous step reproducible).
    pub grads: &'p [&'s [f32]],
    /// Whether the piece lies in a span that L2 regularisation applies to
    /// ([`ParamSpan::weight_decay`](crate::ParamSpan::weight_decay)).
    pub weight_decay: bool,
    /// The factor the update's learning rate is multiplied by: 1, but where an asynchronous
    /// run's staleness rule lowers the rate of a stale update (see `tandem_strategy`'s
    /// `AsyncRule`). An optimiser with a learning rate applies it.
    pub rate_scale: f32,
}

/// Turns gradients into updates of the parameters of record. The strategies call it on pieces
/// of the parameters (a worker's share in a synchronous step, a shard at a time in an
/// asynchronous one), so an update must treat every parameter on its own: element-wise, with
/// per-parameter state of the same length as the parameters.
pub trait Optimizer: Sync {
    /// The per-parameter state vectors it keeps beside the parameters (SGD with a moving
    /// average: `["ema"]`; momentum would add a velocity). Checkpoints store each under its name.
    fn state_names(&self) -> &[&'static str];

    /// The initial value of the state vector `name` for a fresh run from `params`.
    fn initial_state(&self, name: &str, params: &[f32]) -> Vec<f32>;

    /// Applies update number `step` (0-based: updates applied before it) to `piece`; `epoch` is
    /// the step's position in passes over the training set, for schedules.
    fn update(&self, piece: Piece<'_, '_>, step: u64, epoch: f64);

    /// The learning rate at `epoch`, as progress reports show it.
    fn learning_rate(&self, epoch: f64) -> f32;

    /// Update `step` at `epoch` of a piece (regularised where `weight_decay` says so, its
    /// learning rate multiplied by `rate_scale` as [`Piece::rate_scale`] says) as a device
    /// kernel computes it, bit for bit [`update`](Self::update)'s arithmetic. A store in
    /// device memory needs it; `None` (the default) keeps the parameters of record on the host.
    fn device_update(
        &self,
        step: u64,
        epoch: f64,
        weight_decay: bool,
        rate_scale: f32,
    ) -> Option<DeviceUpdate> {
        let _ = (step, epoch, weight_decay, rate_scale);
        None
    }

    /// The state vector that evaluation reads instead of the parameters (SGD's moving average:
    /// `Some("ema")`); `None` (the default): the parameters themselves.
    fn evaluated_slot(&self) -> Option<&'static str> {
        None
    }

    /// The L2 coefficient on regularised spans: the reported loss adds
    /// `weight_decay / 2 * sum w^2` over them (0: none).
    fn weight_decay(&self) -> f32 {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An optimiser that states only what an optimiser must (and updates nothing).
    struct Descent;

    impl Optimizer for Descent {
        fn state_names(&self) -> &[&'static str] {
            &[]
        }

        fn initial_state(&self, _: &str, _: &[f32]) -> Vec<f32> {
            Vec::new()
        }

        fn update(&self, _: Piece<'_, '_>, _: u64, _: f64) {}

        fn learning_rate(&self, _: f64) -> f32 {
            0.5
        }
    }

    /// What an optimiser leaves out means: no device update (its parameters of record stay on
    /// the host), evaluation of the parameters themselves, no L2 term in the reported loss.
    #[test]
    fn the_defaults_keep_to_the_host_the_parameters_and_no_l2() {
        assert_eq!(Descent.device_update(3, 0.5, true, 1.0), None);
        assert_eq!(Descent.evaluated_slot(), None);
        assert_eq!(Descent.weight_decay(), 0.0);
    }
}
