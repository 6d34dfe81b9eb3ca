//! A synchronous run's learning rate as its global batch grows: the linear scaling rule with a
//! gradual warm-up (Goyal et al., "Accurate, Large Minibatch SGD", 2017), as an optimiser that
//! wraps the run's own.

use std::fmt;
use std::str::FromStr;

use tandem_core::{DeviceUpdate, Optimizer, Piece};

/// How a synchronous run scales its optimiser's learning rate with its global batch (every
/// worker's batch in one step). A larger batch makes fewer, less noisy steps an epoch; a
/// larger rate makes up for some of the lost steps, reached gradually, since the full one from
/// the first step diverges.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum BatchScaling {
    /// Linear in the global batch above [`BatchScaling::AUTO_FROM_BATCH`] examples, up to
    /// [`BatchScaling::AUTO_MAX`] times the rate; none at or below it.
    #[default]
    Auto,
    /// This factor, whatever the batch (1: none).
    Factor(f32),
}

impl BatchScaling {
    /// The global batch up to which [`BatchScaling::Auto`] keeps the rate: the reference's 8
    /// towers of 100, where its rate still trains (`sim:8`, 100 epochs: 0.9806).
    pub const AUTO_FROM_BATCH: u64 = 800;
    /// The largest factor of [`BatchScaling::Auto`]: measured on `sim:16` (global batch
    /// 1,600), 100 epochs, with the warm-up: 0.9809 at 2x, 0.9790 at 3x, divergence at 4x
    /// (README, "Many workers").
    pub const AUTO_MAX: f32 = 2.0;
    /// The epochs over which a scaled rate grows linearly from the optimiser's own.
    pub const WARMUP_EPOCHS: f64 = 5.0;
    /// The largest factor a run may ask for.
    pub const MAX_FACTOR: f32 = 64.0;

    /// The factor of the learning rate at a global batch of `examples`.
    pub fn factor(self, examples: u64) -> f32 {
        match self {
            BatchScaling::Auto => {
                (examples as f32 / Self::AUTO_FROM_BATCH as f32).clamp(1.0, Self::AUTO_MAX)
            }
            BatchScaling::Factor(factor) => factor,
        }
    }
}

impl fmt::Display for BatchScaling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchScaling::Auto => f.write_str("auto"),
            BatchScaling::Factor(factor) => write!(f, "{factor}"),
        }
    }
}

/// A scaling that is neither `auto` nor a factor in range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid learning-rate scaling {0:?} (expected auto or a factor from 1 to 64)")]
pub struct InvalidScaling(pub String);

impl FromStr for BatchScaling {
    type Err = InvalidScaling;

    fn from_str(text: &str) -> Result<Self, InvalidScaling> {
        match text.trim() {
            "auto" => Ok(BatchScaling::Auto),
            t => t
                .parse::<f32>()
                .ok()
                .filter(|f| (1.0..=Self::MAX_FACTOR).contains(f))
                .map(BatchScaling::Factor)
                .ok_or_else(|| InvalidScaling(text.to_owned())),
        }
    }
}

/// `inner` with its learning rate multiplied by a factor that grows linearly from 1 at epoch 0
/// to `factor` at [`BatchScaling::WARMUP_EPOCHS`], and stays there.
pub(crate) struct BatchScaled<'o, O: ?Sized> {
    pub inner: &'o O,
    pub factor: f32,
}

impl<O: Optimizer + ?Sized> BatchScaled<'_, O> {
    /// The factor at `epoch`.
    fn at(&self, epoch: f64) -> f32 {
        let warmed = (epoch / BatchScaling::WARMUP_EPOCHS).clamp(0.0, 1.0);
        (1.0 + (f64::from(self.factor) - 1.0) * warmed) as f32
    }
}

impl<O: Optimizer + ?Sized> Optimizer for BatchScaled<'_, O> {
    fn state_names(&self) -> &[&'static str] {
        self.inner.state_names()
    }

    fn initial_state(&self, name: &str, params: &[f32]) -> Vec<f32> {
        self.inner.initial_state(name, params)
    }

    fn update(&self, piece: Piece<'_, '_>, step: u64, epoch: f64) {
        let rate_scale = piece.rate_scale * self.at(epoch);
        self.inner.update(
            Piece {
                rate_scale,
                ..piece
            },
            step,
            epoch,
        );
    }

    fn learning_rate(&self, epoch: f64) -> f32 {
        self.inner.learning_rate(epoch) * self.at(epoch)
    }

    fn device_update(
        &self,
        step: u64,
        epoch: f64,
        weight_decay: bool,
        rate_scale: f32,
    ) -> Option<DeviceUpdate> {
        self.inner
            .device_update(step, epoch, weight_decay, rate_scale * self.at(epoch))
    }

    fn evaluated_slot(&self) -> Option<&'static str> {
        self.inner.evaluated_slot()
    }

    fn weight_decay(&self) -> f32 {
        self.inner.weight_decay()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_optim::Sgd;

    #[test]
    fn auto_scales_only_batches_above_the_references_largest_and_at_most_twice() {
        assert_eq!(BatchScaling::Auto.factor(100), 1.0);
        assert_eq!(BatchScaling::Auto.factor(800), 1.0);
        assert_eq!(BatchScaling::Auto.factor(1_200), 1.5);
        assert_eq!(BatchScaling::Auto.factor(1_600), 2.0);
        assert_eq!(BatchScaling::Auto.factor(6_400), 2.0);
        assert_eq!(BatchScaling::Factor(3.0).factor(100), 3.0);
    }

    #[test]
    fn a_scaling_is_auto_or_a_factor_in_range() {
        assert_eq!("auto".parse(), Ok(BatchScaling::Auto));
        assert_eq!(" 2.5".parse(), Ok(BatchScaling::Factor(2.5)));
        for bad in ["", "0.5", "65", "NaN", "inf", "x", "-2"] {
            let err = bad.parse::<BatchScaling>().unwrap_err();
            assert!(
                err.to_string().contains("expected auto or a factor"),
                "{bad}: {err}"
            );
        }
        for s in [
            BatchScaling::Auto,
            BatchScaling::Factor(1.0),
            BatchScaling::Factor(2.5),
        ] {
            assert_eq!(s.to_string().parse(), Ok(s));
        }
    }

    /// Only the rate is scaled: the state, what evaluation reads and the L2 term are the
    /// optimiser's own.
    #[test]
    fn everything_but_the_rate_is_the_optimisers_own() {
        let adam = tandem_optim::Adam {
            weight_decay: 0.25,
            ..tandem_optim::Adam::DEFAULT
        };
        let scaled = BatchScaled {
            inner: &adam,
            factor: 2.0,
        };
        assert_eq!(scaled.state_names(), ["m", "v", "ema"]);
        assert_eq!(scaled.initial_state("ema", &[0.5, -1.0]), [0.5, -1.0]);
        assert_eq!(scaled.initial_state("m", &[0.5, -1.0]), [0.0, 0.0]);
        assert_eq!(scaled.evaluated_slot(), Some("ema"));
        assert_eq!(scaled.weight_decay(), 0.25);
    }

    /// The scaled rate in f64: the optimiser's own, times 1 + (factor - 1) * min(1, epoch / 5).
    #[test]
    fn the_rate_grows_linearly_over_the_warmup_then_holds_on_every_path() {
        let sgd = Sgd::DEFAULT;
        let scaled = BatchScaled {
            inner: &sgd,
            factor: 3.0,
        };
        for epoch in [0.0, 1.0, 2.5, 4.99, 5.0, 7.0, 60.0] {
            let ramp = 1.0 + 2.0 * (epoch / 5.0f64).min(1.0);
            let expected = f64::from(sgd.learning_rate(epoch)) * ramp;
            let got = scaled.learning_rate(epoch);
            assert!(
                (f64::from(got) - expected).abs() < 1e-6 * expected,
                "epoch {epoch}: {got} vs {expected}"
            );
            let device = scaled.device_update(3, epoch, true, 1.0).unwrap();
            assert_eq!(device.hyper[0], got, "epoch {epoch}: the device's rate");
            // The host's update: one step on a parameter with gradient 1 and no L2 moves it by
            // the rate.
            let (mut params, mut ema) = ([1.0f32], [1.0f32]);
            scaled.update(
                Piece {
                    params: &mut params,
                    state: &mut [&mut ema],
                    grads: &[&[1.0]],
                    weight_decay: false,
                    rate_scale: 1.0,
                },
                3,
                epoch,
            );
            assert_eq!(params[0], 1.0 - got, "epoch {epoch}: the host's rate");
        }
    }
}
