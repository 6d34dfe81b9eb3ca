//! The TensorFlow multi-GPU MNIST example's optimiser, tandem's default.

use tandem_core::{DeviceUpdate, Optimizer, Piece};
use tandem_tensor::cpu::{self, UpdateStep};

use crate::{check, decayed_rate, read_value, warmed_ema_decay, MetadataError, RecordedOptimizer};

/// SGD with exponential learning-rate decay and L2 regularisation, keeping a moving average of
/// the parameters (the state vector [`Sgd::AVERAGE`]) for evaluation. Its defaults are the
/// TensorFlow multi-GPU MNIST example's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sgd {
    /// Base learning rate.
    pub learning_rate: f32,
    /// The learning rate is multiplied by this once per epoch, continuously.
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

    /// The name of the moving average of the parameters in the
    /// [`TrainState`](tandem_core::TrainState) and in checkpoints.
    pub const AVERAGE: &'static str = "ema";

    /// The device kernel of its update (`kernels/update.cu`).
    pub const KERNEL: &'static str = "sgd_ema_update";

    /// The moving-average decay at `step` ([`warmed_ema_decay`]).
    pub fn ema_decay(&self, step: u64) -> f32 {
        warmed_ema_decay(self.ema_decay, step)
    }

    /// Update `step` at `epoch`, on a piece regularised where `weight_decay` says so.
    fn step(&self, step: u64, epoch: f64, weight_decay: bool, rate_scale: f32) -> UpdateStep {
        UpdateStep {
            learning_rate: self.learning_rate(epoch) * rate_scale,
            weight_decay: if weight_decay { self.weight_decay } else { 0.0 },
            ema_decay: self.ema_decay(step),
        }
    }
}

impl Default for Sgd {
    fn default() -> Self {
        Self::DEFAULT
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
        let update = self.step(step, epoch, piece.weight_decay, piece.rate_scale);
        let [ema] = piece.state else {
            unreachable!("Sgd keeps exactly one state vector, the strategies give what it names");
        };
        cpu::sgd_ema_update(piece.params, ema, piece.grads, update);
    }

    /// `[lr, wd, d]` for `sgd_ema_update`.
    fn device_update(
        &self,
        step: u64,
        epoch: f64,
        weight_decay: bool,
        rate_scale: f32,
    ) -> Option<DeviceUpdate> {
        let s = self.step(step, epoch, weight_decay, rate_scale);
        Some(DeviceUpdate {
            kernel: Self::KERNEL,
            hyper: vec![s.learning_rate, s.weight_decay, s.ema_decay],
        })
    }

    fn evaluated_slot(&self) -> Option<&'static str> {
        Some(Self::AVERAGE)
    }

    /// `learning_rate * lr_decay ^ epoch` ([`decayed_rate`]).
    fn learning_rate(&self, epoch: f64) -> f32 {
        decayed_rate(self.learning_rate, self.lr_decay, epoch)
    }

    fn weight_decay(&self) -> f32 {
        self.weight_decay
    }
}

impl RecordedOptimizer for Sgd {
    fn record(&self) -> Vec<(&'static str, String)> {
        vec![
            ("learning_rate", self.learning_rate.to_string()),
            ("lr_decay", self.lr_decay.to_string()),
            ("weight_decay", self.weight_decay.to_string()),
            ("ema_decay", self.ema_decay.to_string()),
        ]
    }

    fn from_values(value: &dyn Fn(&str) -> Option<String>) -> Result<Self, MetadataError> {
        Ok(Sgd {
            learning_rate: read_value(value, "learning_rate", check::learning_rate)?,
            lr_decay: read_value(value, "lr_decay", check::lr_decay)?,
            weight_decay: read_value(value, "weight_decay", check::weight_decay)?,
            ema_decay: read_value(value, "ema_decay", check::ema_decay)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_follow_the_reference() {
        let h = Sgd::default();
        // 550 steps of 100 examples an epoch.
        let epoch = |step: u64| step as f64 / 550.0;
        assert_eq!(h.learning_rate(epoch(0)), 0.8);
        assert!((h.learning_rate(epoch(550)) - 0.792).abs() < 1e-6);
        assert!((h.learning_rate(epoch(275)) - 0.8 * 0.99f32.sqrt()).abs() < 1e-6);
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

    /// Its one state vector is the moving average, which starts at the parameters and is
    /// what evaluation reads.
    #[test]
    fn its_state_is_the_average_and_evaluation_reads_it() {
        let sgd = Sgd::DEFAULT;
        assert_eq!(sgd.state_names(), [Sgd::AVERAGE]);
        assert_eq!(sgd.initial_state(Sgd::AVERAGE, &[0.5, -3.0]), [0.5, -3.0]);
        assert_eq!(sgd.evaluated_slot(), Some(Sgd::AVERAGE));
    }

    /// The device update carries the host update's values, the rate scaled.
    #[test]
    fn the_device_update_reads_the_host_updates_values() {
        let sgd = Sgd::DEFAULT;
        let update = sgd.device_update(20, 1.5, true, 0.5).unwrap();
        assert_eq!(update.kernel, "sgd_ema_update");
        let s = sgd.step(20, 1.5, true, 0.5);
        assert_eq!(update.hyper, [s.learning_rate, 1e-4, s.ema_decay]);
        assert_eq!(s.learning_rate, sgd.learning_rate(1.5) * 0.5);
        assert_eq!(
            sgd.device_update(20, 1.5, false, 1.0).unwrap().hyper[1],
            0.0
        );
    }

    #[test]
    fn its_record_reads_back_and_every_value_is_checked() {
        let sgd = Sgd {
            learning_rate: 0.25,
            ..Sgd::DEFAULT
        };
        // A resume compares what it is given with the record itself.
        assert_eq!(sgd.settings(), sgd.record());
        crate::check_record(
            &sgd,
            &[
                ("learning_rate", "-1"),
                ("lr_decay", "1.5"),
                ("weight_decay", "NaN"),
                ("ema_decay", "1"),
            ],
        );
    }
}
