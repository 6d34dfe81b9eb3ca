//! What defines a run, and how it is written into checkpoint metadata and read back from it.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use tandem_core::{check_loss_scale, DType, Precision};
use tandem_optim::{MetadataError, RecordedOptimizer};
use tandem_strategy::{
    AsyncRule, BatchScaling, Batches, Epochs, Exchange, StalenessBound, Strategy, Warmup,
};

use crate::{Mode, RunError};

/// The largest step a run may reach (and a checkpoint may hold).
pub const MAX_STEPS: u64 = 1_000_000_000_000;

/// The most workers a run may have in all, across its ranks (each rank's devices give at most
/// [`tandem_pool::MAX_REPLICAS`]).
pub const MAX_WORKERS: usize = 1 << 16;

/// What a checkpoint must have been written for: the caller's file format and model, recorded
/// as the metadata keys `format` and `model`. A resume refuses checkpoints of any other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelId {
    /// The checkpoint format, e.g. `"tandem-mlp-v1"`.
    pub format: String,
    /// The model, e.g. `"784-500-10"`.
    pub model: String,
}

impl ModelId {
    /// The format `format` and model `model`.
    pub fn new(format: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            format: format.into(),
            model: model.into(),
        }
    }
}

/// Everything that defines a run, as stored in checkpoint metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct RunConfig<O> {
    /// Sync or async.
    pub mode: Mode,
    /// What asynchronous updates do about staleness (recorded for asynchronous runs; a
    /// synchronous run has none and ignores it).
    pub async_rule: AsyncRule,
    /// How long an asynchronous run trains on one worker first (recorded for asynchronous runs).
    pub async_warmup: Warmup,
    /// How stale an asynchronous update may be (recorded for asynchronous runs).
    pub async_bound: StalenessBound,
    /// How a synchronous run's learning rate follows its global batch (recorded for
    /// synchronous runs).
    pub lr_scaling: BatchScaling,
    /// How many workers the run trains on (sync: part of its identity).
    pub workers: usize,
    /// The optimiser and its configuration.
    pub optimizer: O,
    /// The data order: batch size per worker and seed.
    pub batches: Batches,
    /// The global step the run ends at.
    pub end_step: u64,
    /// Steps between checkpoints; `None`: once per epoch ([`Epochs::steps_per_epoch`]).
    /// Fresh runs always record it.
    pub save_every: Option<u64>,
    /// What the replicas compute in (recorded when it is not `f32`, so that an `f32` run's
    /// checkpoints are those of the versions before mixed precision, byte for byte).
    pub precision: Precision,
    /// What a synchronous run across processes sends its gradients in (recorded when it is
    /// not `f32`).
    pub exchange: Exchange,
}

/// The metadata key of an asynchronous run's [`AsyncRule`].
pub const ASYNC_RULE: &str = "async_rule";
/// The metadata key of an asynchronous run's [`Warmup`].
pub const ASYNC_WARMUP: &str = "async_warmup";
/// The metadata key of an asynchronous run's [`StalenessBound`].
pub const ASYNC_BOUND: &str = "async_bound";
/// The metadata key of a synchronous run's [`BatchScaling`].
pub const LR_SCALING: &str = "lr_scaling";
/// The metadata key of a synchronous run's [`Exchange`] (absent: `f32`).
pub const EXCHANGE: &str = "exchange";
/// The metadata key of a run's [`Precision`] (its type's name; absent: `f32`).
pub const PRECISION: &str = "precision";
/// The metadata key of a loss-scaled (`f16`) run's initial loss scale.
pub const LOSS_SCALE: &str = "loss_scale";

/// The keys of a run's identity before the optimiser's: what a resume keeps fixed.
const RUN_KEYS: &[&str] = &["format", "model", "mode", "batch_size", "seed"];

impl<O: RecordedOptimizer> RunConfig<O> {
    /// How the run trains: its mode and how asynchronous updates treat staleness.
    pub fn strategy(&self) -> Strategy {
        Strategy {
            mode: self.mode,
            rule: self.async_rule,
            warmup: self.async_warmup,
            bound: self.async_bound,
            batch_scaling: self.lr_scaling,
            exchange: self.exchange,
        }
    }

    /// Training examples per global step: sync, every worker's batch; async, one.
    pub fn examples_per_step(&self) -> u64 {
        let batch = self.batches.batch_size as u64;
        match self.mode {
            Mode::Sync => batch * self.workers as u64,
            Mode::Async => batch,
        }
    }

    /// Epochs of `examples` training examples at this run's examples per step: every
    /// conversion between steps and epochs goes through it.
    pub fn epochs(&self, examples: usize) -> Epochs {
        Epochs::new(examples, self.examples_per_step())
    }

    /// The global step that ends `epochs` passes over `examples` ([`Epochs::end_step`]),
    /// within [`MAX_STEPS`].
    pub fn steps_for_epochs(&self, epochs: u64, examples: usize) -> Result<u64, RunError> {
        self.epochs(examples)
            .end_step(epochs)
            .filter(|&n| n <= MAX_STEPS)
            .ok_or(RunError::TooLong { epochs })
    }

    /// The run as checkpoint metadata, with `model`'s format and name.
    pub fn to_metadata(&self, model: &ModelId) -> BTreeMap<String, String> {
        let run = [
            ("format", model.format.clone()),
            ("model", model.model.clone()),
            ("mode", self.mode.name().to_string()),
            ("workers", self.workers.to_string()),
            ("end_step", self.end_step.to_string()),
            ("batch_size", self.batches.batch_size.to_string()),
            ("seed", self.batches.seed.to_string()),
        ];
        let optimizer = self.optimizer.record();
        let asynchronous = [
            (ASYNC_RULE, self.async_rule.to_string()),
            (ASYNC_WARMUP, self.async_warmup.to_string()),
            (ASYNC_BOUND, self.async_bound.to_string()),
        ];
        let asynchronous = asynchronous
            .into_iter()
            .filter(|_| self.mode == Mode::Async);
        let compressed =
            (self.exchange != Exchange::F32).then(|| (EXCHANGE, self.exchange.to_string()));
        let synchronous = [(LR_SCALING, self.lr_scaling.to_string())]
            .into_iter()
            .chain(compressed)
            .filter(|_| self.mode == Mode::Sync);
        let precision = self.precision;
        let narrow = [(PRECISION, precision.to_string())]
            .into_iter()
            .filter(|_| precision.compute != DType::F32);
        let scaled = [(LOSS_SCALE, precision.initial_loss_scale.to_string())]
            .into_iter()
            .filter(|_| precision.scaled());
        run.into_iter()
            .chain(asynchronous)
            .chain(synchronous)
            .chain(narrow)
            .chain(scaled)
            .chain(optimizer)
            .chain(self.save_every.map(|n| ("save_every", n.to_string())))
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    /// The metadata keys whose values make checkpoints one run's: what a resume keeps fixed,
    /// and what rotation compares (it deletes only checkpoints that agree on all of them). A
    /// sync run resumes only on the same number of workers, an async one on any.
    pub fn identity_keys(&self) -> Vec<&'static str> {
        let optimizer = self.optimizer.record();
        let mut keys: Vec<&'static str> = RUN_KEYS
            .iter()
            .copied()
            .chain(optimizer.iter().map(|(key, _)| *key))
            .collect();
        if self.mode == Mode::Sync {
            keys.push("workers");
        }
        if self.precision.compute != DType::F32 {
            keys.push(PRECISION);
        }
        keys
    }

    /// Reads and checks checkpoint metadata written for `model`, so that a file cannot make a
    /// run divide by zero or allocate without bound: every field must be in range, and present
    /// but for those added since the first format (the strategy's, the cadence, the exchange,
    /// the precision), which then take the values of the runs written before them.
    /// `max_batch` bounds the batch size.
    pub fn from_metadata(
        meta: &BTreeMap<String, String>,
        model: &ModelId,
        max_batch: u64,
    ) -> Result<Self, MetadataError> {
        let text = |key: &str| {
            meta.get(key)
                .map(String::as_str)
                .ok_or_else(|| MetadataError::Missing(key.to_owned()))
        };
        let integer = |key: &str, range: RangeInclusive<u64>| -> Result<u64, MetadataError> {
            let value = text(key)?;
            let n: u64 = value
                .parse()
                .map_err(|e| MetadataError::invalid(key, value, e))?;
            if range.contains(&n) {
                Ok(n)
            } else {
                Err(MetadataError::invalid(
                    key,
                    value,
                    format_args!("out of range {}..={}", range.start(), range.end()),
                ))
            }
        };
        for (key, expected) in [("format", &model.format), ("model", &model.model)] {
            let found = text(key)?;
            if found != expected {
                return Err(MetadataError::Other {
                    key: key.to_owned(),
                    found: found.to_owned(),
                    expected: expected.clone(),
                });
            }
        }
        let mode = match text("mode")? {
            "sync" => Mode::Sync,
            "async" => Mode::Async,
            other => return Err(MetadataError::invalid("mode", other, "unknown mode")),
        };
        let async_rule = match (mode, meta.get(ASYNC_RULE)) {
            (Mode::Sync, _) => AsyncRule::DEFAULT,
            // Written before the rule existed, when every update was at the full rate.
            (Mode::Async, None) => AsyncRule::Plain,
            (Mode::Async, Some(text)) => text
                .parse()
                .map_err(|e| MetadataError::invalid(ASYNC_RULE, text, e))?,
        };
        let async_warmup = match (mode, meta.get(ASYNC_WARMUP)) {
            (Mode::Sync, _) => Warmup::Auto,
            // Written before the warm-up existed.
            (Mode::Async, None) => Warmup::Epochs(0),
            (Mode::Async, Some(text)) => text
                .parse()
                .map_err(|e| MetadataError::invalid(ASYNC_WARMUP, text, e))?,
        };
        let async_bound = match (mode, meta.get(ASYNC_BOUND)) {
            // Written before bounds existed, or by a sync run.
            (Mode::Sync, _) | (Mode::Async, None) => StalenessBound::Unbounded,
            (Mode::Async, Some(text)) => text
                .parse()
                .map_err(|e| MetadataError::invalid(ASYNC_BOUND, text, e))?,
        };
        let lr_scaling = match (mode, meta.get(LR_SCALING)) {
            (Mode::Async, _) => BatchScaling::Auto,
            // Written before the scaling existed, when every sync run kept the rate.
            (Mode::Sync, None) => BatchScaling::Factor(1.0),
            (Mode::Sync, Some(text)) => text
                .parse()
                .map_err(|e| MetadataError::invalid(LR_SCALING, text, e))?,
        };
        let save_every = match meta.get("save_every") {
            // Written by versions that did not record the cadence: the default, once an epoch
            // (`Epochs::steps_per_epoch`, the same as theirs when the global batch divides the
            // training set; otherwise one step more, which moves checkpoints, not training).
            None => None,
            Some(_) => Some(integer("save_every", 1..=MAX_STEPS)?),
        };
        let exchange = match (mode, meta.get(EXCHANGE)) {
            // Written before 16-bit exchanges, by an f32 one, or by an async run.
            (Mode::Async, _) | (Mode::Sync, None) => Exchange::F32,
            (Mode::Sync, Some(text)) => text
                .parse()
                .map_err(|e| MetadataError::invalid(EXCHANGE, text, e))?,
        };
        let precision = match meta.get(PRECISION) {
            // Written before mixed precision, or by an f32 run.
            None => Precision::F32,
            Some(text) => text
                .parse::<Precision>()
                .map_err(|e| MetadataError::invalid(PRECISION, text, e))?,
        };
        let precision = match (precision.scaled(), meta.get(LOSS_SCALE)) {
            // Parsed, a scaled precision starts at the default scale.
            (false, _) | (true, None) => precision,
            (true, Some(text)) => Precision {
                initial_loss_scale: text
                    .parse::<f32>()
                    .map_err(|e| MetadataError::invalid(LOSS_SCALE, text, e))
                    .and_then(|scale| {
                        check_loss_scale(scale)
                            .map_err(|e| MetadataError::invalid(LOSS_SCALE, text, e))
                    })?,
                ..precision
            },
        };
        let config = Self {
            mode,
            async_rule,
            async_warmup,
            async_bound,
            lr_scaling,
            workers: integer("workers", 1..=MAX_WORKERS as u64)? as usize,
            optimizer: O::from_values(&|key| meta.get(key).cloned())?,
            batches: Batches {
                batch_size: integer("batch_size", 1..=max_batch)? as usize,
                seed: integer("seed", 0..=u64::MAX)?,
            },
            end_step: integer("end_step", 1..=MAX_STEPS)?,
            save_every,
            precision,
            exchange,
        };
        // Each step's first example is a position in the data order's stream (a u64): every
        // step's must be one.
        let per_step = config.examples_per_step();
        if config.end_step.checked_mul(per_step).is_none() {
            let end_step = config.end_step.to_string();
            let why = format!(
                "{end_step} steps of {per_step} examples each draw more than the 2^64 examples \
                 a data order counts"
            );
            return Err(MetadataError::invalid("end_step", &end_step, why));
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_optim::Sgd;

    fn model() -> ModelId {
        ModelId {
            format: "test-v1".into(),
            model: "2-1".into(),
        }
    }

    fn config(mode: Mode) -> RunConfig<Sgd> {
        RunConfig {
            mode,
            async_rule: AsyncRule::Scaled,
            async_warmup: Warmup::Auto,
            async_bound: StalenessBound::Unbounded,
            lr_scaling: BatchScaling::Auto,
            workers: 3,
            optimizer: Sgd {
                learning_rate: 0.25,
                ..Sgd::DEFAULT
            },
            batches: Batches {
                batch_size: 7,
                seed: 9,
            },
            end_step: 100,
            save_every: Some(10),
            precision: Precision::F32,
            exchange: Exchange::F32,
        }
    }

    /// A sync step draws every worker's batch, an async one a worker's.
    #[test]
    fn a_step_draws_the_batches_of_the_workers_it_waits_for() {
        assert_eq!(config(Mode::Sync).examples_per_step(), 3 * 7);
        assert_eq!(config(Mode::Async).examples_per_step(), 7);
        assert_eq!(config(Mode::Sync).epochs(42).steps_per_epoch(), 2);
    }

    #[test]
    fn metadata_round_trips_and_names_the_model() {
        for mode in [Mode::Sync, Mode::Async] {
            let meta = config(mode).to_metadata(&model());
            assert_eq!(meta["format"], "test-v1");
            assert_eq!(meta["learning_rate"], "0.25");
            let back = RunConfig::<Sgd>::from_metadata(&meta, &model(), 100).unwrap();
            assert_eq!(back, config(mode));
        }
        let other = ModelId {
            model: "3-1".into(),
            ..model()
        };
        let err =
            RunConfig::<Sgd>::from_metadata(&config(Mode::Sync).to_metadata(&model()), &other, 100)
                .unwrap_err();
        assert!(
            err.to_string()
                .contains("its model is \"2-1\", not \"3-1\""),
            "{err}"
        );
    }

    #[test]
    fn every_value_from_a_file_is_checked() {
        let good = config(Mode::Sync).to_metadata(&model());
        for (key, bad, says) in [
            ("workers", "0", "out of range"),
            ("workers", "100000", "out of range"),
            ("batch_size", "101", "out of range"),
            ("end_step", "0", "out of range"),
            ("save_every", "-1", "invalid digit"),
            ("learning_rate", "NaN", "not finite"),
            ("lr_decay", "1.5", "out of range"),
            ("ema_decay", "1", "out of range"),
            ("mode", "both", "unknown mode"),
        ] {
            let mut meta = good.clone();
            meta.insert(key.into(), bad.into());
            let err = RunConfig::<Sgd>::from_metadata(&meta, &model(), 100).unwrap_err();
            assert!(
                err.to_string().contains(key) && err.to_string().contains(says),
                "{key}={bad}: {err}"
            );
        }
        let mut rule = config(Mode::Async).to_metadata(&model());
        rule.insert(ASYNC_RULE.into(), "faster".into());
        let err = RunConfig::<Sgd>::from_metadata(&rule, &model(), 100).unwrap_err();
        assert!(
            err.to_string().contains("async_rule") && err.to_string().contains("\"faster\""),
            "{err}"
        );
        let mut bound = config(Mode::Async).to_metadata(&model());
        bound.insert(ASYNC_BOUND.into(), "wait:-3".into());
        let err = RunConfig::<Sgd>::from_metadata(&bound, &model(), 100).unwrap_err();
        assert!(
            err.to_string().contains("async_bound") && err.to_string().contains("\"wait:-3\""),
            "{err}"
        );
        let mut missing = good;
        missing.remove("seed");
        let err = RunConfig::<Sgd>::from_metadata(&missing, &model(), 100).unwrap_err();
        assert_eq!(err.to_string(), "its metadata has no seed");
        // Each value in range, but a sync run's last step would start past the data order's
        // 2^64 positions: 10^12 steps of 308 workers' 60,000 examples (307 fit). An async step
        // draws one batch: 65,536 workers fit.
        for (mode, workers, fits) in [
            (Mode::Sync, "307", true),
            (Mode::Sync, "308", false),
            (Mode::Async, "65536", true),
        ] {
            let mut long = config(mode).to_metadata(&model());
            for (key, value) in [
                ("workers", workers),
                ("batch_size", "60000"),
                ("end_step", "1000000000000"),
            ] {
                long.insert(key.into(), value.into());
            }
            match RunConfig::<Sgd>::from_metadata(&long, &model(), 60_000) {
                Ok(_) => assert!(fits, "{mode:?} on {workers}: read"),
                Err(e) => {
                    assert!(!fits, "{mode:?} on {workers}: {e}");
                    let said = e.to_string();
                    assert!(said.contains("end_step") && said.contains("2^64"), "{said}");
                }
            }
        }
    }

    /// Async runs record their rule, warm-up and bound, sync runs nothing of them; an async
    /// checkpoint written before the rule existed trained every update at the full rate.
    #[test]
    fn an_async_run_records_its_rule_and_older_ones_read_as_plain() {
        let sync = config(Mode::Sync).to_metadata(&model());
        assert!([ASYNC_RULE, ASYNC_WARMUP, ASYNC_BOUND]
            .iter()
            .all(|key| !sync.contains_key(*key)));
        let mut plain = config(Mode::Async);
        plain.async_rule = AsyncRule::Plain;
        plain.async_warmup = Warmup::Epochs(3);
        plain.async_bound = StalenessBound::Drop(2);
        let meta = plain.to_metadata(&model());
        assert_eq!(meta[ASYNC_RULE], "plain");
        assert_eq!(meta[ASYNC_WARMUP], "3");
        assert_eq!(meta[ASYNC_BOUND], "drop:2");
        assert_eq!(
            RunConfig::<Sgd>::from_metadata(&meta, &model(), 100).unwrap(),
            plain
        );
        let mut older = config(Mode::Async).to_metadata(&model());
        older.remove(ASYNC_RULE);
        older.remove(ASYNC_WARMUP);
        older.remove(ASYNC_BOUND);
        let read = RunConfig::<Sgd>::from_metadata(&older, &model(), 100).unwrap();
        assert_eq!(read.async_rule, AsyncRule::Plain);
        assert_eq!(read.async_warmup, Warmup::Epochs(0));
        assert_eq!(read.async_bound, StalenessBound::Unbounded);
    }

    /// Sync runs record their learning-rate scaling; one written before it existed kept the
    /// rate whatever its batch.
    #[test]
    fn a_sync_run_records_its_scaling_and_older_ones_read_as_none() {
        let mut scaled = config(Mode::Sync);
        scaled.lr_scaling = BatchScaling::Factor(1.5);
        let meta = scaled.to_metadata(&model());
        assert_eq!(meta[LR_SCALING], "1.5");
        assert_eq!(
            RunConfig::<Sgd>::from_metadata(&meta, &model(), 100).unwrap(),
            scaled
        );
        assert!(!config(Mode::Async)
            .to_metadata(&model())
            .contains_key(LR_SCALING));
        let mut older = meta;
        older.remove(LR_SCALING);
        let read = RunConfig::<Sgd>::from_metadata(&older, &model(), 100).unwrap();
        assert_eq!(read.lr_scaling, BatchScaling::Factor(1.0));
        let mut bad = config(Mode::Sync).to_metadata(&model());
        bad.insert(LR_SCALING.into(), "0".into());
        let err = RunConfig::<Sgd>::from_metadata(&bad, &model(), 100).unwrap_err();
        assert!(
            err.to_string().contains(LR_SCALING) && err.to_string().contains("\"0\""),
            "{err}"
        );
    }

    #[test]
    fn a_sync_runs_identity_includes_its_workers_and_the_optimisers_keys() {
        let sync = config(Mode::Sync).identity_keys();
        let asynchronous = config(Mode::Async).identity_keys();
        assert!(sync.contains(&"workers") && !asynchronous.contains(&"workers"));
        let record = Sgd::DEFAULT.record();
        for key in record.iter().map(|(key, _)| key).chain(&[
            "format",
            "model",
            "mode",
            "batch_size",
            "seed",
        ]) {
            assert!(sync.contains(key) && asynchronous.contains(key), "{key}");
        }
    }

    #[test]
    fn precision_is_recorded_when_it_is_not_f32_and_read_back() {
        let f32_run = config(Mode::Sync);
        let meta = f32_run.to_metadata(&model());
        assert!(!meta.contains_key(PRECISION) && !meta.contains_key(LOSS_SCALE));
        assert!(!f32_run.identity_keys().contains(&PRECISION));
        let read = RunConfig::<Sgd>::from_metadata(&meta, &model(), 100).unwrap();
        assert_eq!(read.precision, Precision::F32);
        for (dtype, scaled) in [(DType::BF16, false), (DType::F16, true)] {
            let run = RunConfig {
                precision: Precision {
                    compute: dtype,
                    initial_loss_scale: 1024.0,
                },
                ..config(Mode::Async)
            };
            let meta = run.to_metadata(&model());
            assert_eq!(meta[PRECISION], dtype.name());
            assert_eq!(meta.contains_key(LOSS_SCALE), scaled);
            assert!(run.identity_keys().contains(&PRECISION));
            let read = RunConfig::<Sgd>::from_metadata(&meta, &model(), 100).unwrap();
            assert_eq!(read.precision.compute, dtype);
            if scaled {
                assert_eq!(read.precision.initial_loss_scale, 1024.0);
            }
        }
        let compressed = RunConfig {
            exchange: Exchange::Bf16,
            ..config(Mode::Sync)
        };
        let meta = compressed.to_metadata(&model());
        assert_eq!(meta[EXCHANGE], "bf16");
        let read = RunConfig::<Sgd>::from_metadata(&meta, &model(), 100).unwrap();
        assert_eq!(read.exchange, Exchange::Bf16);
        assert!(!config(Mode::Sync)
            .to_metadata(&model())
            .contains_key(EXCHANGE));
        for (key, lie) in [
            (PRECISION, "fp8"),
            (LOSS_SCALE, "3"),
            (LOSS_SCALE, "inf"),
            (EXCHANGE, "f16"),
        ] {
            let mut meta = RunConfig {
                precision: Precision::new(DType::F16),
                ..config(Mode::Sync)
            }
            .to_metadata(&model());
            meta.insert(key.into(), lie.into());
            let err = RunConfig::<Sgd>::from_metadata(&meta, &model(), 100).unwrap_err();
            assert!(err.to_string().contains(key), "{err}");
        }
    }
}
