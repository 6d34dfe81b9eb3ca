//! Optimisers for [`tandem_core::Optimizer`], one module each: [`Sgd`] (the TensorFlow MNIST
//! example's SGD with exponential decay, L2 and a moving average of the parameters: the
//! default) and [`Adam`]. Each owns its configuration, its named state, its host arithmetic,
//! the description of its device update ([`Optimizer::device_update`]) and its checkpoint keys
//! ([`RecordedOptimizer`]).
//!
//! [`OPTIMIZERS`] names every one for command lines and checkpoints, and [`Chosen`] is the one
//! a run picked from it. **Adding an optimiser is its own module and one line in
//! [`OPTIMIZERS`]**; no strategy or trainer code changes.
//!
//! ```
//! use tandem_core::Optimizer;
//! use tandem_optim::{Chosen, RecordedOptimizer};
//!
//! // `--optimizer adam --lr 0.002`: Adam's defaults but the rate.
//! let adam = Chosen::configure("adam", &[("learning_rate", "0.002".into())]).unwrap();
//! assert_eq!(adam.name(), "adam");
//! assert_eq!(adam.learning_rate(0.0), 0.002);
//! // Its checkpoint metadata names it, and reads back as the same optimiser.
//! let record = adam.record();
//! let back = Chosen::from_values(&|key| {
//!     record.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone())
//! })
//! .unwrap();
//! assert_eq!(back, adam);
//! ```
#![warn(missing_docs)]

mod adam;
mod registry;
mod sgd;

pub use adam::{adam_update, Adam};
pub use registry::{Chosen, ConfigureError, OptimizerKind, UnknownOptimizer, OPTIMIZERS};
pub use sgd::Sgd;

use tandem_core::Optimizer;

/// A value that a command line or a file gives for a number, refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValueError {
    /// Not a number at all.
    #[error("{0:?} is not a number")]
    NotANumber(String),
    /// Infinite or NaN.
    #[error("{0} is not finite")]
    NotFinite(String),
    /// A number outside what the value allows; `rule` says what is allowed.
    #[error("{value} is out of range: {rule}")]
    OutOfRange {
        /// The number.
        value: f32,
        /// What is allowed, and why.
        rule: &'static str,
    },
}

/// Parses a finite `f32` (a flag or a metadata value) and checks it with `allowed`; `rule`
/// says what is allowed, for the error.
pub fn parse_finite(
    text: &str,
    allowed: impl Fn(f32) -> bool,
    rule: &'static str,
) -> Result<f32, ValueError> {
    let value: f32 = text
        .trim()
        .parse()
        .map_err(|_| ValueError::NotANumber(text.to_owned()))?;
    if !value.is_finite() {
        return Err(ValueError::NotFinite(text.to_owned()));
    }
    if !allowed(value) {
        return Err(ValueError::OutOfRange { value, rule });
    }
    Ok(value)
}

/// Recorded configuration (checkpoint metadata) that does not describe a run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    /// A key it must have is not there.
    #[error("its metadata has no {0}")]
    Missing(String),
    /// A key's value is refused.
    #[error("its metadata {key} = {value:?}: {reason}")]
    Invalid {
        /// The key.
        key: String,
        /// Its value, as recorded.
        value: String,
        /// Why it is refused.
        reason: String,
    },
    /// The file was written for something else: its `key` is `found`, not `expected`.
    #[error("its {key} is {found:?}, not {expected:?}")]
    Other {
        /// The key.
        key: String,
        /// Its value in the file.
        found: String,
        /// The value it must have.
        expected: String,
    },
}

impl MetadataError {
    /// `key`'s recorded `value`, refused for `reason`.
    pub fn invalid(key: &str, value: &str, reason: impl std::fmt::Display) -> Self {
        MetadataError::Invalid {
            key: key.to_owned(),
            value: value.to_owned(),
            reason: reason.to_string(),
        }
    }
}

/// An optimiser whose configuration a checkpoint records, so that a resumed run continues
/// with the same one.
pub trait RecordedOptimizer: Optimizer + Clone + PartialEq + Sized {
    /// Its configuration as metadata: each key with its value as text. The keys are part of a
    /// run's identity.
    fn record(&self) -> Vec<(&'static str, String)>;

    /// Reads and checks its configuration: `value(key)` gives the recorded text of each key.
    /// An error says which key and why.
    fn from_values(value: &dyn Fn(&str) -> Option<String>) -> Result<Self, MetadataError>;

    /// What a resumed run compares the settings given for it against: the record, and the
    /// values of keys that it leaves out (the default: the record).
    fn settings(&self) -> Vec<(&'static str, String)> {
        self.record()
    }
}

/// Reads the recorded `key` with `check`: the error names the key and the value.
pub fn read_value<T>(
    value: &dyn Fn(&str) -> Option<String>,
    key: &str,
    check: impl Fn(&str) -> Result<T, ValueError>,
) -> Result<T, MetadataError> {
    let text = value(key).ok_or_else(|| MetadataError::Missing(key.to_owned()))?;
    check(&text).map_err(|e| MetadataError::invalid(key, &text, e))
}

/// The checks that more than one optimiser's values share, for command lines and metadata
/// alike.
pub mod check {
    use super::{parse_finite as finite, ValueError};

    /// A learning rate: finite and positive.
    pub fn learning_rate(text: &str) -> Result<f32, ValueError> {
        finite(
            text,
            |v| v > 0.0,
            "the learning rate must be > 0 (a negative one climbs the loss)",
        )
    }

    /// The learning-rate decay factor per epoch: in (0, 1].
    pub fn lr_decay(text: &str) -> Result<f32, ValueError> {
        finite(
            text,
            |v| v > 0.0 && v <= 1.0,
            "the decay factor must be in (0, 1]: 1 keeps the rate constant",
        )
    }

    /// The L2 coefficient: finite and not negative.
    pub fn weight_decay(text: &str) -> Result<f32, ValueError> {
        finite(
            text,
            |v| v >= 0.0,
            "the L2 coefficient must be >= 0 (0 turns L2 off)",
        )
    }

    /// The moving-average decay: in [0, 1).
    pub fn ema_decay(text: &str) -> Result<f32, ValueError> {
        finite(
            text,
            |v| (0.0..1.0).contains(&v),
            "the moving-average decay must be in [0, 1): 1 would never move",
        )
    }
}

/// The test every optimiser's record passes: it reads back as `optimizer`, and each of `lies`
/// (a key and a value it refuses) is refused with an error naming the key.
#[cfg(test)]
pub(crate) fn check_record<O: RecordedOptimizer + std::fmt::Debug>(
    optimizer: &O,
    lies: &[(&str, &str)],
) {
    let record = optimizer.record();
    let get = |record: &[(&str, String)], key: &str| {
        record
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(O::from_values(&|k| get(&record, k)).as_ref(), Ok(optimizer));
    for (key, bad) in lies {
        let mut lying = record.clone();
        lying.iter_mut().find(|(k, _)| k == key).unwrap().1 = (*bad).into();
        let err = O::from_values(&|k| get(&lying, k)).unwrap_err();
        assert!(err.to_string().contains(key), "{key}: {err}");
    }
    let err = O::from_values(&|k| get(&record[1..], k)).unwrap_err();
    assert_eq!(err, MetadataError::Missing(record[0].0.to_owned()));
}

/// `min(ema_decay, (1 + step) / (10 + step))` (TensorFlow's `ExponentialMovingAverage` with
/// `num_updates`): the average follows the parameters closely while they move fast.
pub fn warmed_ema_decay(ema_decay: f32, step: u64) -> f32 {
    let warmup = (1.0 + step as f64) / (10.0 + step as f64);
    (warmup as f32).min(ema_decay)
}

/// `learning_rate * lr_decay ^ epoch` (TensorFlow's `exponential_decay`, not staircase),
/// where `epoch` is continuous.
pub fn decayed_rate(learning_rate: f32, lr_decay: f32, epoch: f64) -> f32 {
    (f64::from(learning_rate) * f64::from(lr_decay).powf(epoch)) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each check refuses the edge of its range that is outside it, and takes the one inside.
    #[test]
    fn the_checks_draw_their_lines_where_they_say() {
        assert!(check::learning_rate("0").is_err());
        assert_eq!(check::learning_rate("1e-30"), Ok(1e-30));
        assert!(check::lr_decay("0").is_err());
        assert_eq!(check::lr_decay("1"), Ok(1.0));
        assert!(check::lr_decay("1.0001").is_err());
        assert_eq!(check::weight_decay("0"), Ok(0.0));
        assert!(check::weight_decay("-1e-9").is_err());
        assert_eq!(check::ema_decay("0"), Ok(0.0));
        assert!(check::ema_decay("1").is_err());
        assert_eq!(
            check::learning_rate(" 0.5 "),
            Ok(0.5),
            "a value is read without the spaces around it"
        );
        assert_eq!(
            check::learning_rate("fast"),
            Err(ValueError::NotANumber("fast".into()))
        );
        assert_eq!(
            check::learning_rate("inf"),
            Err(ValueError::NotFinite("inf".into()))
        );
    }
}
