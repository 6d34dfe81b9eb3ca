//! How a replica computes: the [`Precision`] of its forward and backward pass (the parameters
//! of record and the optimiser's state stay `f32` whatever it is), and the dynamic loss scale
//! that keeps `f16` gradients from underflowing ([`LossScaler`]).

use std::fmt;
use std::str::FromStr;

use crate::{DType, UnknownDType};

/// What a replica's forward and backward pass compute in: weights, activations and gradients
/// stored in [`Precision::compute`], products accumulated in `f32`; the parameters of record,
/// the moving average and the optimiser's state in `f32` (the master weights of mixed-precision
/// training). `f16` gradients are loss-scaled ([`LossScaler`]); `bf16` has `f32`'s exponent
/// range and needs no scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Precision {
    /// The type the pass stores its values in.
    pub compute: DType,
    /// The loss scale an `f16` pass starts from (a power of two; ignored for other types).
    pub initial_loss_scale: f32,
}

impl Precision {
    /// `f32` throughout: what every run did before mixed precision, bit for bit.
    pub const F32: Precision = Precision::new(DType::F32);

    /// `compute` with the default initial loss scale ([`LossScaler::DEFAULT_INITIAL`]).
    pub const fn new(compute: DType) -> Self {
        Self {
            compute,
            initial_loss_scale: LossScaler::DEFAULT_INITIAL,
        }
    }

    /// Whether the pass is loss-scaled: `f16` only.
    pub fn scaled(&self) -> bool {
        self.compute == DType::F16
    }

    /// A loss scaler for one replica, where the pass is scaled.
    pub fn scaler(&self) -> Option<LossScaler> {
        self.scaled()
            .then(|| LossScaler::new(self.initial_loss_scale))
    }
}

impl Default for Precision {
    fn default() -> Self {
        Precision::F32
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.compute.fmt(f)
    }
}

impl FromStr for Precision {
    type Err = UnknownDType;

    fn from_str(name: &str) -> Result<Self, UnknownDType> {
        name.parse().map(Precision::new)
    }
}

/// An initial loss scale that is not a power of two in `1..=2^64`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("a loss scale must be a power of two from 1 to 2^64 (so that scaling is exact), not {0}")]
pub struct BadLossScale(pub f32);

/// Checks an initial loss scale: a power of two (multiplying and dividing by it is exact) from
/// 1 to 2^64.
pub fn check_loss_scale(scale: f32) -> Result<f32, BadLossScale> {
    let power_of_two = scale.is_finite() && scale > 0.0 && scale.to_bits() & 0x007f_ffff == 0;
    match power_of_two && (1.0..=LossScaler::MAX).contains(&scale) {
        true => Ok(scale),
        false => Err(BadLossScale(scale)),
    }
}

/// PyTorch's `GradScaler` rule for one replica: the loss (and so every gradient) is multiplied
/// by `scale` before the backward pass; a pass whose gradients are not all finite halves the
/// scale and is not used; `GROWTH_INTERVAL` finite passes in a row double it.
///
/// Where `GradScaler` skips the optimiser step of an overflowing pass, tandem's replicas compute
/// that batch again at the halved scale: no examples are lost, and the decision needs no
/// agreement between workers (each replica scales its own pass and hands out unscaled `f32`
/// gradients), so sync runs stay bitwise reproducible and async workers never wait. The passes
/// thrown away are counted ([`LossScaler::overflows`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossScaler {
    scale: f32,
    finite_in_a_row: u32,
    overflows: u64,
}

impl LossScaler {
    /// `GradScaler`'s initial scale, 2^16.
    pub const DEFAULT_INITIAL: f32 = 65_536.0;
    /// Finite passes in a row after which the scale doubles (`GradScaler`'s).
    pub const GROWTH_INTERVAL: u32 = 2_000;
    /// The largest scale: 2^64 (doubling stops there).
    pub const MAX: f32 = 18_446_744_073_709_551_616.0;
    /// The smallest scale: 2^-64. A pass that overflows below it fails instead of halving again:
    /// its gradients are not finite at any scale (a NaN input, a diverged run).
    pub const MIN: f32 = 1.0 / Self::MAX;

    /// A scaler starting at `initial`.
    pub const fn new(initial: f32) -> Self {
        Self {
            scale: initial,
            finite_in_a_row: 0,
            overflows: 0,
        }
    }

    /// The scale the next pass multiplies its loss by.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// Passes thrown away because their gradients were not finite.
    pub fn overflows(&self) -> u64 {
        self.overflows
    }

    /// Records a pass: `Ok(true)` when its gradients are finite and may be used (the scale
    /// doubles after [`GROWTH_INTERVAL`](Self::GROWTH_INTERVAL) of them in a row), `Ok(false)`
    /// when they are not (the scale halves: compute the batch again), and an error when the
    /// scale is already at [`MIN`](Self::MIN).
    pub fn record(&mut self, finite: bool) -> Result<bool, NonFiniteGradients> {
        if finite {
            self.finite_in_a_row += 1;
            if self.finite_in_a_row == Self::GROWTH_INTERVAL {
                self.finite_in_a_row = 0;
                self.scale = (self.scale * 2.0).min(Self::MAX);
            }
            return Ok(true);
        }
        if self.scale <= Self::MIN {
            return Err(NonFiniteGradients { scale: self.scale });
        }
        self.overflows += 1;
        self.finite_in_a_row = 0;
        self.scale /= 2.0;
        Ok(false)
    }
}

/// Gradients that are not finite even at the smallest loss scale: the parameters or the data
/// hold a non-finite value, or training diverged.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("gradients not finite even at loss scale {scale:e}: the parameters or the data hold a non-finite value, or training diverged")]
pub struct NonFiniteGradients {
    /// The scale of the last pass.
    pub scale: f32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_halves_on_an_overflow_and_doubles_after_the_growth_interval() {
        let mut scaler = LossScaler::new(LossScaler::DEFAULT_INITIAL);
        assert_eq!(scaler.record(false), Ok(false));
        assert_eq!(scaler.scale(), 32_768.0);
        assert_eq!(scaler.overflows(), 1);
        for _ in 0..LossScaler::GROWTH_INTERVAL - 1 {
            assert_eq!(scaler.record(true), Ok(true));
        }
        assert_eq!(scaler.scale(), 32_768.0);
        // An overflow restarts the count.
        assert_eq!(scaler.record(false), Ok(false));
        for _ in 0..LossScaler::GROWTH_INTERVAL - 1 {
            scaler.record(true).unwrap();
        }
        assert_eq!(scaler.scale(), 16_384.0);
        scaler.record(true).unwrap();
        assert_eq!(scaler.scale(), 32_768.0);
        assert_eq!(scaler.overflows(), 2);
    }

    #[test]
    fn the_scale_stays_within_its_bounds() {
        let mut top = LossScaler::new(LossScaler::MAX);
        for _ in 0..LossScaler::GROWTH_INTERVAL {
            top.record(true).unwrap();
        }
        assert_eq!(top.scale(), LossScaler::MAX);
        let mut bottom = LossScaler::new(1.0);
        for _ in 0..64 {
            assert_eq!(bottom.record(false), Ok(false));
        }
        assert_eq!(bottom.scale(), LossScaler::MIN);
        let err = bottom.record(false).unwrap_err();
        assert_eq!(err.scale, LossScaler::MIN);
        assert_eq!(bottom.overflows(), 64);
    }

    #[test]
    fn initial_scales_are_powers_of_two_in_range() {
        for good in [1.0, 2.0, 65_536.0, LossScaler::MAX] {
            assert_eq!(check_loss_scale(good), Ok(good));
        }
        for bad in [
            0.0,
            -2.0,
            3.0,
            0.5,
            1e30,
            f32::NAN,
            f32::INFINITY,
            2.0 * LossScaler::MAX,
        ] {
            assert!(check_loss_scale(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_f16_is_scaled() {
        assert!(Precision::new(DType::F16).scaler().is_some());
        assert!(Precision::new(DType::BF16).scaler().is_none());
        assert!(Precision::F32.scaler().is_none());
        assert_eq!("bf16".parse::<Precision>().unwrap().compute, DType::BF16);
        assert_eq!(Precision::default(), Precision::F32);
    }
}
