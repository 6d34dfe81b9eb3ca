/// The optimiser's hyper-parameters, with the TensorFlow multi-GPU MNIST example's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hyper {
    /// Examples per worker per step.
    pub batch_size: usize,
    /// Base learning rate.
    pub learning_rate: f32,
    /// The learning rate is multiplied by this once per epoch, continuously (see
    /// [`Epochs::epoch_at`](crate::Epochs::epoch_at)).
    pub lr_decay: f32,
    /// L2 coefficient on weights: the loss gains `weight_decay / 2 * sum w^2`.
    pub weight_decay: f32,
    /// Upper bound of the moving-average decay.
    pub ema_decay: f32,
    /// Seed of the data order.
    pub seed: u64,
    /// Call the observer every this many steps (0: never).
    pub log_every: u64,
}

impl Default for Hyper {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl Hyper {
    /// The TensorFlow multi-GPU MNIST example's values, and the one place tandem writes its defaults: the CLI's
    /// flags, `compare` and the README take them from here.
    pub const DEFAULT: Hyper = Hyper {
        batch_size: 100,
        learning_rate: 0.8,
        lr_decay: 0.99,
        weight_decay: 1e-4,
        ema_decay: 0.99,
        seed: 1,
        log_every: 1000,
    };

    /// `learning_rate * lr_decay ^ epoch` (TensorFlow's `exponential_decay`, not staircase),
    /// where `epoch` is continuous: [`Epochs::epoch_at`](crate::Epochs::epoch_at) of the step.
    pub fn learning_rate(&self, epoch: f64) -> f32 {
        (f64::from(self.learning_rate) * f64::from(self.lr_decay).powf(epoch)) as f32
    }

    /// Whether the observer hears of global step `step` (counted from 1): every `log_every`-th,
    /// never when `log_every` is 0 (no step from 1 on is a multiple of 0).
    pub fn reports(&self, step: u64) -> bool {
        step.is_multiple_of(self.log_every)
    }

    /// `min(ema_decay, (1 + step) / (10 + step))` (TensorFlow's `ExponentialMovingAverage` with
    /// `num_updates`): the average follows the parameters closely while they move fast.
    pub fn ema_decay(&self, step: u64) -> f32 {
        let warmup = (1.0 + step as f64) / (10.0 + step as f64);
        (warmup as f32).min(self.ema_decay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_every_nth_step_and_never_for_0() {
        let every = |n| Hyper {
            log_every: n,
            ..Hyper::default()
        };
        let reported = |h: Hyper| (1..=10).filter(|&s| h.reports(s)).collect::<Vec<u64>>();
        assert_eq!(reported(every(3)), [3, 6, 9]);
        assert_eq!(reported(every(1)), (1..=10).collect::<Vec<_>>());
        assert_eq!(reported(every(0)), Vec::<u64>::new());
    }

    #[test]
    fn schedules_follow_the_book() {
        let h = Hyper::default();
        let epochs = crate::Epochs::new(55_000, 100);
        assert_eq!(h.learning_rate(epochs.epoch_at(0)), 0.8);
        assert!((h.learning_rate(epochs.epoch_at(550)) - 0.792).abs() < 1e-6);
        assert!((h.learning_rate(epochs.epoch_at(275)) - 0.8 * 0.99f32.sqrt()).abs() < 1e-6);
        assert!((h.ema_decay(0) - 0.1).abs() < 1e-7);
        assert!((h.ema_decay(10) - 11.0 / 20.0).abs() < 1e-7);
        assert_eq!(h.ema_decay(100_000), 0.99);
    }
}
