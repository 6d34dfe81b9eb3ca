//! Every optimiser by name, and the one a run chose.

use std::fmt;

use tandem_core::{DeviceUpdate, Optimizer, Piece};

use crate::{Adam, MetadataError, RecordedOptimizer, Sgd};

/// Reads an optimiser's configuration from recorded values.
type Configure = fn(&dyn Fn(&str) -> Option<String>) -> Result<Box<dyn Held>, MetadataError>;

/// One optimiser as command lines and checkpoints name it.
pub struct OptimizerKind {
    /// Its name (`--optimizer NAME`, and the metadata key [`Chosen::KEY`]).
    pub name: &'static str,
    /// One line for `--help`.
    pub about: &'static str,
    configure: Configure,
    defaults: fn() -> Vec<(&'static str, String)>,
}

impl OptimizerKind {
    /// The optimiser `O` under `name`, its configuration read by
    /// [`RecordedOptimizer::from_values`] and its defaults its `Default`'s.
    pub const fn of<O: RecordedOptimizer + Default + fmt::Debug + Send + 'static>(
        name: &'static str,
        about: &'static str,
    ) -> Self {
        OptimizerKind {
            name,
            about,
            configure: configure::<O>,
            defaults: defaults::<O>,
        }
    }

    /// Its default configuration, as metadata.
    pub fn defaults(&self) -> Vec<(&'static str, String)> {
        (self.defaults)()
    }
}

fn configure<O: RecordedOptimizer + fmt::Debug + Send + 'static>(
    value: &dyn Fn(&str) -> Option<String>,
) -> Result<Box<dyn Held>, MetadataError> {
    Ok(Box::new(O::from_values(value)?))
}

fn defaults<O: RecordedOptimizer + Default>() -> Vec<(&'static str, String)> {
    O::default().record()
}

/// Every optimiser a run may choose, the default first. **A new optimiser is one line here**
/// (and its module).
pub const OPTIMIZERS: &[OptimizerKind] = &[
    OptimizerKind::of::<Sgd>(
        "sgd",
        "SGD with L2 and a moving average (the reference's; the default)",
    ),
    OptimizerKind::of::<Adam>("adam", "Adam with L2 and a moving average"),
];

/// A name that is not in [`OPTIMIZERS`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown optimiser {0:?} (expected one of: {names})", names = names())]
pub struct UnknownOptimizer(pub String);

fn names() -> String {
    OPTIMIZERS
        .iter()
        .map(|k| k.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The kind named `name`.
fn kind(name: &str) -> Result<&'static OptimizerKind, UnknownOptimizer> {
    OPTIMIZERS
        .iter()
        .find(|k| k.name == name)
        .ok_or_else(|| UnknownOptimizer(name.to_owned()))
}

/// An optimiser held behind the registry: its own [`Optimizer`] and record.
trait Held: Optimizer + fmt::Debug + Send {
    fn held_record(&self) -> Vec<(&'static str, String)>;
    fn clone_box(&self) -> Box<dyn Held>;
}

impl<O: RecordedOptimizer + fmt::Debug + Send + 'static> Held for O {
    fn held_record(&self) -> Vec<(&'static str, String)> {
        RecordedOptimizer::record(self)
    }

    fn clone_box(&self) -> Box<dyn Held> {
        Box::new(self.clone())
    }
}

/// The optimiser a run chose from [`OPTIMIZERS`], with its configuration. Checkpoints record
/// its name under [`Chosen::KEY`] (but the default's, so that they read as those written
/// before optimisers had names) and its own keys beside it.
pub struct Chosen {
    kind: &'static OptimizerKind,
    optimizer: Box<dyn Held>,
}

impl Chosen {
    /// The metadata key of the optimiser's name.
    pub const KEY: &'static str = "optimizer";

    /// The optimiser `name` with its defaults but for `given` (metadata keys and their values
    /// as text, e.g. from flags); each value is checked, and a key the optimiser does not have
    /// is refused.
    pub fn configure(name: &str, given: &[(&str, String)]) -> Result<Self, ConfigureError> {
        let kind = kind(name)?;
        let defaults = kind.defaults();
        if let Some((key, _)) = given
            .iter()
            .find(|(key, _)| !defaults.iter().any(|(k, _)| k == key))
        {
            return Err(ConfigureError::NoSuchKey {
                optimizer: kind.name,
                key: (*key).to_owned(),
            });
        }
        let value = |key: &str| {
            let given = given.iter().find(|(k, _)| *k == key);
            let default = defaults.iter().find(|(k, _)| *k == key);
            given.or(default).map(|(_, v)| v.clone())
        };
        let optimizer = (kind.configure)(&value)?;
        Ok(Chosen { kind, optimizer })
    }

    /// `optimizer` as a choice of its kind `name`.
    pub fn of<O: RecordedOptimizer + fmt::Debug + Send + 'static>(
        name: &str,
        optimizer: O,
    ) -> Result<Self, UnknownOptimizer> {
        Ok(Chosen {
            kind: kind(name)?,
            optimizer: Box::new(optimizer),
        })
    }

    /// Its name in [`OPTIMIZERS`].
    pub fn name(&self) -> &'static str {
        self.kind.name
    }

    /// Whether it is the default optimiser.
    pub fn is_default(&self) -> bool {
        std::ptr::eq(self.kind, &OPTIMIZERS[0])
    }
}

/// A configuration [`Chosen::configure`] refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigureError {
    /// No such optimiser.
    #[error(transparent)]
    Unknown(#[from] UnknownOptimizer),
    /// A setting the optimiser does not have.
    #[error("{optimizer} has no setting {key}")]
    NoSuchKey {
        /// The optimiser.
        optimizer: &'static str,
        /// The setting.
        key: String,
    },
    /// A value refused.
    #[error("{0}")]
    Value(#[from] MetadataError),
}

impl Default for Chosen {
    /// The default optimiser at its defaults.
    fn default() -> Self {
        Chosen::configure(OPTIMIZERS[0].name, &[])
            .unwrap_or_else(|e| unreachable!("the default optimiser's own defaults are valid: {e}"))
    }
}

impl Clone for Chosen {
    fn clone(&self) -> Self {
        Chosen {
            kind: self.kind,
            optimizer: self.optimizer.clone_box(),
        }
    }
}

impl PartialEq for Chosen {
    fn eq(&self, other: &Self) -> bool {
        self.record() == other.record()
    }
}

impl fmt::Debug for Chosen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {:?}", self.kind.name, self.optimizer)
    }
}

impl Optimizer for Chosen {
    fn state_names(&self) -> &[&'static str] {
        self.optimizer.state_names()
    }

    fn initial_state(&self, name: &str, params: &[f32]) -> Vec<f32> {
        self.optimizer.initial_state(name, params)
    }

    fn update(&self, piece: Piece<'_, '_>, step: u64, epoch: f64) {
        self.optimizer.update(piece, step, epoch)
    }

    fn learning_rate(&self, epoch: f64) -> f32 {
        self.optimizer.learning_rate(epoch)
    }

    fn device_update(
        &self,
        step: u64,
        epoch: f64,
        weight_decay: bool,
        rate_scale: f32,
    ) -> Option<DeviceUpdate> {
        self.optimizer
            .device_update(step, epoch, weight_decay, rate_scale)
    }

    fn evaluated_slot(&self) -> Option<&'static str> {
        self.optimizer.evaluated_slot()
    }

    fn weight_decay(&self) -> f32 {
        self.optimizer.weight_decay()
    }
}

impl RecordedOptimizer for Chosen {
    fn record(&self) -> Vec<(&'static str, String)> {
        let name = (!self.is_default()).then(|| (Self::KEY, self.kind.name.to_owned()));
        name.into_iter()
            .chain(self.optimizer.held_record())
            .collect()
    }

    fn from_values(value: &dyn Fn(&str) -> Option<String>) -> Result<Self, MetadataError> {
        let kind = match value(Self::KEY) {
            None => &OPTIMIZERS[0],
            Some(name) => kind(&name).map_err(|e| MetadataError::invalid(Self::KEY, &name, e))?,
        };
        let optimizer = (kind.configure)(value)?;
        Ok(Chosen { kind, optimizer })
    }

    /// The record with the name, the default's too.
    fn settings(&self) -> Vec<(&'static str, String)> {
        let name = (Self::KEY, self.kind.name.to_owned());
        std::iter::once(name)
            .chain(self.optimizer.held_record())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup<'r>(record: &'r [(&'static str, String)]) -> impl Fn(&str) -> Option<String> + 'r {
        |key| {
            record
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
        }
    }

    /// The default records what `Sgd` records and nothing more (checkpoints of before the
    /// registry are its); every other optimiser records its name first.
    #[test]
    fn only_the_default_goes_unnamed_and_every_kind_reads_back() {
        let sgd = Chosen::default();
        assert_eq!(sgd.name(), "sgd");
        assert_eq!(RecordedOptimizer::record(&sgd), Sgd::DEFAULT.record());
        for kind in OPTIMIZERS {
            let chosen = Chosen::configure(kind.name, &[]).unwrap();
            let record = RecordedOptimizer::record(&chosen);
            assert_eq!(
                record.first().map(|(k, _)| *k) == Some(Chosen::KEY),
                !chosen.is_default()
            );
            let back = Chosen::from_values(&lookup(&record)).unwrap();
            assert_eq!(back, chosen);
            assert_eq!(back.name(), kind.name);
        }
        // A resume compares `--optimizer sgd` with the default's name, recorded or not.
        assert_eq!(sgd.settings()[0], (Chosen::KEY, "sgd".to_owned()));
        let adam = Chosen::configure("adam", &[]).unwrap();
        assert_eq!(adam.settings(), RecordedOptimizer::record(&adam));
        assert_eq!(adam.state_names(), Adam::DEFAULT.state_names());
        assert_eq!(adam.learning_rate(2.0), Adam::DEFAULT.learning_rate(2.0));
        assert_ne!(adam, Chosen::default());
    }

    /// One update of a piece from `optimizer`'s initial state: the parameters and the state
    /// after it.
    fn one_update(optimizer: &dyn Optimizer) -> (Vec<f32>, Vec<Vec<f32>>) {
        let mut params = vec![1.0f32, -0.5, 0.25];
        let mut state: Vec<Vec<f32>> = optimizer
            .state_names()
            .iter()
            .map(|name| optimizer.initial_state(name, &params))
            .collect();
        let mut slots: Vec<&mut [f32]> = state.iter_mut().map(|s| &mut s[..]).collect();
        optimizer.update(
            Piece {
                params: &mut params,
                state: &mut slots,
                grads: &[&[0.5, -1.0, 2.0], &[0.25, 0.0, -1.0]],
                weight_decay: true,
                rate_scale: 0.5,
            },
            3,
            1.25,
        );
        (params, state)
    }

    /// A choice answers every call as the optimiser it holds, whatever that is: the trainer
    /// and the strategies see only the choice.
    #[test]
    fn a_choice_answers_as_the_optimiser_it_holds() {
        let sgd = Sgd {
            learning_rate: 0.5,
            weight_decay: 0.25,
            ..Sgd::DEFAULT
        };
        let adam = Adam {
            weight_decay: 0.125,
            ..Adam::DEFAULT
        };
        let adam_unaveraged = Adam {
            ema_decay: None,
            ..Adam::DEFAULT
        };
        let held: [(&str, Box<dyn Optimizer>, String, Chosen); 3] = [
            (
                "sgd",
                Box::new(sgd),
                format!("{sgd:?}"),
                Chosen::of("sgd", sgd).unwrap(),
            ),
            (
                "adam",
                Box::new(adam),
                format!("{adam:?}"),
                Chosen::of("adam", adam).unwrap(),
            ),
            (
                "adam",
                Box::new(adam_unaveraged),
                format!("{adam_unaveraged:?}"),
                Chosen::of("adam", adam_unaveraged).unwrap(),
            ),
        ];
        for (name, inner, shown, chosen) in &held {
            assert_eq!(chosen.name(), *name);
            assert_eq!(chosen.state_names(), inner.state_names());
            for slot in inner.state_names() {
                assert_eq!(
                    chosen.initial_state(slot, &[1.5, -2.0]),
                    inner.initial_state(slot, &[1.5, -2.0])
                );
            }
            assert_eq!(one_update(chosen), one_update(&**inner));
            assert_eq!(
                chosen.device_update(7, 0.5, true, 0.5),
                inner.device_update(7, 0.5, true, 0.5)
            );
            assert_eq!(chosen.evaluated_slot(), inner.evaluated_slot());
            assert_eq!(chosen.learning_rate(2.5), inner.learning_rate(2.5));
            assert_eq!(chosen.weight_decay(), inner.weight_decay());
            // A copy is the same choice, and shows what it holds.
            assert_eq!(&chosen.clone(), chosen);
            assert_eq!(format!("{:?}", chosen.clone()), format!("{name}: {shown}"));
        }
        // `of` keeps the optimiser it is given, not its kind's defaults.
        assert_ne!(held[1].3, Chosen::configure("adam", &[]).unwrap());
        assert_eq!(held[1].3.weight_decay(), 0.125);
    }

    #[test]
    fn settings_override_defaults_and_unknown_ones_are_refused() {
        let fast = Chosen::configure("sgd", &[("learning_rate", "0.1".into())]).unwrap();
        assert_eq!(fast.learning_rate(0.0), 0.1);
        assert_eq!(fast.weight_decay(), Sgd::DEFAULT.weight_decay);
        let err = Chosen::configure("sgd", &[("beta1", "0.5".into())]).unwrap_err();
        assert_eq!(err.to_string(), "sgd has no setting beta1");
        let err = Chosen::configure("lion", &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown optimiser \"lion\" (expected one of: sgd, adam)"
        );
        let err = Chosen::configure("adam", &[("beta2", "2".into())]).unwrap_err();
        assert!(err.to_string().contains("beta2"), "{err}");
        let mut record = RecordedOptimizer::record(&Chosen::configure("adam", &[]).unwrap());
        record[0].1 = "lion".into();
        let err = Chosen::from_values(&lookup(&record)).unwrap_err();
        assert!(err.to_string().contains("optimizer = \"lion\""), "{err}");
    }
}
