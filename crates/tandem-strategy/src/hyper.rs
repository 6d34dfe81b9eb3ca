use tandem_core::{FusedSgd, Optimizer, Piece};
use tandem_tensor::cpu::{self, UpdateStep};

/// The TensorFlow multi-GPU MNIST example's optimiser: SGD with exponential learning-rate
/// decay and L2 regularisation, keeping a moving average of the parameters (the state vector
/// [`Sgd::AVERAGE`]) for evaluation. Its defaults are the example's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sgd {
    /// Base learning rate.
    pub learning_rate: f32,
    /// The learning rate is multiplied by this once per epoch, continuously (see
    /// [`Epochs::epoch_at`](crate::Epochs::epoch_at)).
    pub lr_decay: f32,
    /// L2 coefficient on weights: the loss gains `weight_decay / 2 * sum w^2`.
    pub weight_decay: f32,
    /// Upper bound of the moving-average decay.
    pub ema_decay: f32,
}

impl Sgd {
    /// The TensorFlow multi-GPU MNIST example's values, and the one place tandem writes them:
    /// the CLI's flags, `compare` and the README take them from here.
    pub const DEFAULT: Sgd = Sgd {
        learning_rate: 0.8,
        lr_decay: 0.99,
        weight_decay: 1e-4,
        ema_decay: 0.99,
    };

    /// The name of the moving average of the parameters in the [`TrainState`](tandem_core::TrainState)
    /// and in checkpoints.
    pub const AVERAGE: &'static str = "ema";

    /// `min(ema_decay, (1 + step) / (10 + step))` (TensorFlow's `ExponentialMovingAverage` with
    /// `num_updates`): the average follows the parameters closely while they move fast.
    pub fn ema_decay(&self, step: u64) -> f32 {
        let warmup = (1.0 + step as f64) / (10.0 + step as f64);
        (warmup as f32).min(self.ema_decay)
    }
}

impl Sgd {
    /// Update `step` at `epoch`, on a piece regularised where `weight_decay` says so.
    fn step(&self, step: u64, epoch: f64, weight_decay: bool) -> FusedSgd {
        FusedSgd {
            learning_rate: self.learning_rate(epoch),
            weight_decay: if weight_decay { self.weight_decay } else { 0.0 },
            ema_decay: self.ema_decay(step),
        }
    }
}

impl Optimizer for Sgd {
    fn state_names(&self) -> &[&'static str] {
        &[Self::AVERAGE]
    }

    /// The average starts equal to the parameters.
    fn initial_state(&self, _: &str, params: &[f32]) -> Vec<f32> {
        params.to_vec()
    }

    fn update(&self, piece: Piece<'_, '_>, step: u64, epoch: f64) {
        let FusedSgd {
            learning_rate,
            weight_decay,
            ema_decay,
        } = self.step(step, epoch, piece.weight_decay);
        let update = UpdateStep {
            learning_rate: learning_rate * piece.rate_scale,
            weight_decay,
            ema_decay,
        };
        let [ema] = piece.state else {
            unreachable!("Sgd keeps exactly one state vector, the strategies give what it names");
        };
        cpu::sgd_ema_update(piece.params, ema, piece.grads, update);
    }

    fn fused_sgd(&self, step: u64, epoch: f64, weight_decay: bool) -> Option<FusedSgd> {
        Some(self.step(step, epoch, weight_decay))
    }

    /// `learning_rate * lr_decay ^ epoch` (TensorFlow's `exponential_decay`, not staircase),
    /// where `epoch` is continuous: [`Epochs::epoch_at`](crate::Epochs::epoch_at) of the step.
    fn learning_rate(&self, epoch: f64) -> f32 {
        (f64::from(self.learning_rate) * f64::from(self.lr_decay).powf(epoch)) as f32
    }

    fn weight_decay(&self) -> f32 {
        self.weight_decay
    }
}

/// Which examples each step trains on: batches of the [`EpochOrder`](crate::EpochOrder) that
/// `seed` shuffles. Its defaults are the TensorFlow multi-GPU MNIST example's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batches {
    /// Examples per worker per step.
    pub batch_size: usize,
    /// Seed of the data order.
    pub seed: u64,
}

/// `Default` is the type's `DEFAULT`: the reference's values.
macro_rules! default_is_the_reference {
    ($($name:ty),*) => {
        $(impl Default for $name {
            fn default() -> Self {
                Self::DEFAULT
            }
        })*
    };
}

default_is_the_reference!(Sgd, Batches);

impl Batches {
    /// Batches of 100, seed 1.
    pub const DEFAULT: Batches = Batches {
        batch_size: 100,
        seed: 1,
    };
}

/// Whether an observer that asks for reports every `log_every` steps hears of global step
/// `step` (counted from 1): every `log_every`-th, never when `log_every` is 0.
pub(crate) fn reports(log_every: u64, step: u64) -> bool {
    step.is_multiple_of(log_every)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_every_nth_step_and_never_for_0() {
        let reported = |n| (1..=10).filter(|&s| reports(n, s)).collect::<Vec<u64>>();
        assert_eq!(reported(3), [3, 6, 9]);
        assert_eq!(reported(1), (1..=10).collect::<Vec<_>>());
        assert_eq!(reported(0), Vec::<u64>::new());
    }

    #[test]
    fn schedules_follow_the_reference() {
        let h = Sgd::default();
        let epochs = crate::Epochs::new(55_000, 100);
        assert_eq!(h.learning_rate(epochs.epoch_at(0)), 0.8);
        assert!((h.learning_rate(epochs.epoch_at(550)) - 0.792).abs() < 1e-6);
        assert!((h.learning_rate(epochs.epoch_at(275)) - 0.8 * 0.99f32.sqrt()).abs() < 1e-6);
        assert!((h.ema_decay(0) - 0.1).abs() < 1e-7);
        assert!((h.ema_decay(10) - 11.0 / 20.0).abs() < 1e-7);
        assert_eq!(h.ema_decay(100_000), 0.99);
    }

    #[test]
    fn the_update_regularises_only_decayed_pieces() {
        let sgd = Sgd {
            learning_rate: 0.5,
            lr_decay: 1.0,
            weight_decay: 0.1,
            ema_decay: 0.0,
        };
        for (decayed, want) in [(true, 2.0 - 0.5 * (1.0 + 0.1 * 2.0)), (false, 1.5)] {
            let (mut p, mut e) = ([2.0f32], [0.0f32]);
            sgd.update(
                Piece {
                    params: &mut p,
                    state: &mut [&mut e],
                    grads: &[&[0.5], &[1.5]],
                    weight_decay: decayed,
                    rate_scale: 1.0,
                },
                100,
                0.0,
            );
            assert_eq!(p, [want]);
            // ema_decay 0: the average is the new parameters.
            assert_eq!(e, [want]);
        }
    }
}
