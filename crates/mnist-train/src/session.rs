//! A training run in progress: the worker pool, the state, the hyper-parameters, and how they
//! are written into and read back from checkpoint metadata.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Context, Result};
use rand::SeedableRng;
use tandem_core::{ParamSpan, Replica, TrainState};
use tandem_model::{Mlp, MlpReplica};
use tandem_pool::{Device, DeviceSpec, GpuCount, WorkerPool, MAX_REPLICAS};
use tandem_strategy::{asynchronous, sync, Epochs, Hyper, Observer, TrainReport};
use tandem_tensor::{CpuBackend, ExampleSet};

use crate::cli::{self, MAX_BATCH, MAX_STEPS};

/// Synchronous or asynchronous data parallelism.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Sync,
    Async,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Sync => "sync",
            Mode::Async => "async",
        }
    }

    fn parse(text: &str) -> Result<Self> {
        match text {
            "sync" => Ok(Mode::Sync),
            "async" => Ok(Mode::Async),
            other => bail!("unknown mode {other:?}"),
        }
    }
}

/// The checkpoint format this binary writes and reads.
pub const FORMAT: &str = "tandem-mlp-v1";

/// The model a checkpoint must hold, as its metadata names it.
fn model_name() -> String {
    let m = Mlp::MNIST;
    format!("{}-{}-{}", m.inputs, m.hidden, m.classes)
}

/// Everything that defines a run, as stored in checkpoint metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct RunConfig {
    pub mode: Mode,
    pub workers: usize,
    pub hyper: Hyper,
    pub end_step: u64,
    /// Steps between checkpoints; `None`: once per epoch ([`Epochs::steps_per_epoch`]). Fresh
    /// runs always record it.
    pub save_every: Option<u64>,
}

impl RunConfig {
    /// Training examples per global step.
    pub fn examples_per_step(&self) -> u64 {
        match self.mode {
            Mode::Sync => (self.hyper.batch_size * self.workers) as u64,
            Mode::Async => self.hyper.batch_size as u64,
        }
    }

    /// Epochs of `examples` training examples at this run's examples per step: every
    /// conversion between steps and epochs goes through it.
    pub fn epochs(&self, examples: usize) -> Epochs {
        Epochs::new(examples, self.examples_per_step())
    }

    /// The global step that ends `epochs` passes over `examples` ([`Epochs::end_step`]),
    /// within the longest run `--steps` allows.
    pub fn steps_for_epochs(&self, epochs: u64, examples: usize) -> Result<u64> {
        self.epochs(examples)
            .end_step(epochs)
            .filter(|&n| n <= MAX_STEPS)
            .with_context(|| format!("{epochs} epochs is more than {MAX_STEPS} steps"))
    }

    pub fn to_metadata(&self) -> BTreeMap<String, String> {
        let h = &self.hyper;
        [
            ("format", FORMAT.to_string()),
            ("model", model_name()),
            ("mode", self.mode.name().to_string()),
            ("workers", self.workers.to_string()),
            ("end_step", self.end_step.to_string()),
            ("batch_size", h.batch_size.to_string()),
            ("learning_rate", h.learning_rate.to_string()),
            ("lr_decay", h.lr_decay.to_string()),
            ("weight_decay", h.weight_decay.to_string()),
            ("ema_decay", h.ema_decay.to_string()),
            ("seed", h.seed.to_string()),
        ]
        .into_iter()
        .chain(self.save_every.map(|n| ("save_every", n.to_string())))
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// The metadata keys whose values make checkpoints one run's: what a resume keeps fixed.
    /// Rotation deletes only checkpoints that agree with the new one on all of them.
    pub fn identity_keys(&self) -> &'static [&'static str] {
        // `workers` last: a sync run resumes only on the same number of workers, async on any.
        const KEYS: &[&str] = &[
            "format",
            "model",
            "mode",
            "batch_size",
            "learning_rate",
            "lr_decay",
            "weight_decay",
            "ema_decay",
            "seed",
            "workers",
        ];
        match self.mode {
            Mode::Sync => KEYS,
            Mode::Async => &KEYS[..KEYS.len() - 1],
        }
    }

    /// Reads and checks checkpoint metadata: every field must be present and in the range the
    /// command line allows, so a file cannot make a run divide by zero or allocate without
    /// bound.
    pub fn from_metadata(meta: &BTreeMap<String, String>, log_every: u64) -> Result<Self> {
        fn text<'m>(meta: &'m BTreeMap<String, String>, key: &str) -> Result<&'m str> {
            meta.get(key)
                .map(String::as_str)
                .with_context(|| format!("its metadata has no {key}"))
        }
        fn checked<T>(
            meta: &BTreeMap<String, String>,
            key: &str,
            parse: impl Fn(&str) -> Result<T, String>,
        ) -> Result<T> {
            let value = text(meta, key)?;
            parse(value).map_err(|e| anyhow!("its metadata {key} = {value:?}: {e}"))
        }
        let integer = |range: std::ops::RangeInclusive<u64>| {
            move |text: &str| {
                let n: u64 = text.parse().map_err(|e| format!("{e}"))?;
                if range.contains(&n) {
                    Ok(n)
                } else {
                    Err(format!("out of range {}..={}", range.start(), range.end()))
                }
            }
        };
        for (key, expected) in [("format", FORMAT.to_string()), ("model", model_name())] {
            let found = text(meta, key)?;
            if found != expected {
                bail!("its {key} is {found:?}, not {expected:?}");
            }
        }
        let mode = checked(meta, "mode", |t| Mode::parse(t).map_err(|e| e.to_string()))?;
        let end_step = checked(meta, "end_step", integer(1..=MAX_STEPS))?;
        let save_every = match meta.get("save_every") {
            // Written by versions that did not record the cadence: the default, once an epoch
            // (`Epochs::steps_per_epoch`, the same as theirs when the global batch divides the
            // training set; otherwise one step more, which moves checkpoints, not training).
            None => None,
            Some(_) => Some(checked(meta, "save_every", integer(1..=MAX_STEPS))?),
        };
        Ok(Self {
            mode,
            workers: checked(meta, "workers", integer(1..=MAX_REPLICAS as u64))? as usize,
            end_step,
            save_every,
            hyper: Hyper {
                batch_size: checked(meta, "batch_size", integer(1..=MAX_BATCH))? as usize,
                learning_rate: checked(meta, "learning_rate", cli::learning_rate)?,
                lr_decay: checked(meta, "lr_decay", cli::lr_decay)?,
                weight_decay: checked(meta, "weight_decay", cli::weight_decay)?,
                ema_decay: checked(meta, "ema_decay", cli::ema_decay)?,
                seed: checked(meta, "seed", integer(0..=u64::MAX))?,
                log_every,
            },
        })
    }

    /// Checks a loaded checkpoint against its own metadata: its step within the run.
    pub fn check_step(&self, step: u64) -> Result<()> {
        if step > self.end_step {
            bail!("its step {step} is past its end_step {}", self.end_step);
        }
        Ok(())
    }
}

/// The initial state of a fresh run.
pub fn initial_state(init_stddev: f32, seed: u64) -> TrainState {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    TrainState::new(Mlp::MNIST.init(init_stddev, &mut rng))
}

/// How many CUDA GPUs this machine has, for resolving `--devices` (the pool knows no CUDA):
/// the driver's answer in a build with the `cuda` feature, "no CUDA" otherwise.
pub fn gpu_count() -> GpuCount {
    #[cfg(feature = "cuda")]
    return GpuCount::Driver(tandem_kernels::device_count().map_err(|e| e.to_string()));
    #[cfg(not(feature = "cuda"))]
    GpuCount::NoCuda
}

fn open_replica(device: &Device, train: &ExampleSet, batch: usize) -> Result<Box<dyn Replica>> {
    match device {
        Device::Cpu { .. } => Ok(Box::new(MlpReplica::new(
            Mlp::MNIST,
            CpuBackend,
            train,
            batch,
        )?)),
        #[cfg(feature = "cuda")]
        Device::Cuda { ordinal } => {
            let backend = tandem_kernels::CudaBackend::new(*ordinal)?;
            Ok(Box::new(MlpReplica::new(
                Mlp::MNIST,
                backend,
                train,
                batch,
            )?))
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda { .. } => bail!("{device} needs a build with `--features cuda`"),
    }
}

/// A run: its configuration, one replica per device, and the state of record.
pub struct Session {
    pub config: RunConfig,
    pub devices: Vec<String>,
    pub state: TrainState,
    pool: WorkerPool<Box<dyn Replica>>,
}

impl Session {
    /// Opens one replica per device of `spec`; `config.workers` is set from it.
    pub fn open(
        spec: &DeviceSpec,
        mut config: RunConfig,
        train: &ExampleSet,
        state: TrainState,
    ) -> Result<Self> {
        let devices = spec.resolve_noting(gpu_count, |note| {
            crate::output::warn(format!("warning: {note}"))
        })?;
        config.workers = devices.len();
        let names = devices.iter().map(Device::to_string).collect();
        let batch = config.hyper.batch_size;
        let pool = WorkerPool::new(devices, |d| open_replica(d, train, batch))?;
        Ok(Self {
            config,
            devices: names,
            state,
            pool,
        })
    }

    /// Trains until global step `to` (or until `observer` stops it).
    pub fn advance(&mut self, to: u64, observer: &dyn Observer) -> Result<TrainReport> {
        let train = match self.config.mode {
            Mode::Sync => sync::train::<Box<dyn Replica>>,
            Mode::Async => asynchronous::train::<Box<dyn Replica>>,
        };
        let report = train(
            &mut self.pool,
            &mut self.state,
            &self.config.hyper,
            to,
            observer,
        )?;
        Ok(report)
    }

    /// The replicas' parameter layout.
    pub fn layout(&self) -> Vec<ParamSpan> {
        Mlp::MNIST.layout()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where there are GPUs, `auto` and `cuda` resolve to them, without a note. Without one the
    /// test says `SKIPPED`, or fails where a device is required (`TANDEM_REQUIRE_GPU=1`: CI
    /// against the driver stand-in, a GPU machine).
    #[cfg(feature = "cuda")]
    #[test]
    fn auto_finds_the_gpus_where_there_are_some() {
        match tandem_kernels::device_count() {
            Ok(count) if count > 0 => {}
            outcome => {
                assert!(
                    std::env::var_os("TANDEM_REQUIRE_GPU").is_none_or(|v| v != "1"),
                    "TANDEM_REQUIRE_GPU=1 but no CUDA device: {outcome:?}"
                );
                use std::io::Write;
                let line = format!(
                    "SKIPPED: auto_finds_the_gpus_where_there_are_some: no CUDA device \
                     ({outcome:?})\n"
                );
                let _ = std::io::stderr().write_all(line.as_bytes());
                return;
            }
        }
        let mut note = None;
        let auto = DeviceSpec::Auto
            .resolve_noting(gpu_count, |n| note = Some(n.to_owned()))
            .unwrap();
        assert_eq!(note, None);
        assert!(!auto.is_empty());
        assert!(auto.iter().all(|d| matches!(d, Device::Cuda { .. })));
        assert_eq!(DeviceSpec::Cuda(vec![]).resolve(gpu_count).unwrap(), auto);
    }

    /// A build without CUDA answers `cuda` specifications with "built without CUDA", and `auto`
    /// with CPU workers.
    #[cfg(not(feature = "cuda"))]
    #[test]
    fn without_cuda_cuda_specs_say_so_and_auto_means_cpu_workers() {
        assert_eq!(gpu_count(), GpuCount::NoCuda);
        let err = "cuda:0x4"
            .parse::<DeviceSpec>()
            .unwrap()
            .resolve(gpu_count)
            .unwrap_err();
        assert!(err.to_string().contains("built without CUDA"), "{err}");
        let auto = DeviceSpec::Auto.resolve(gpu_count).unwrap();
        assert!(!auto.is_empty());
        assert!(auto.iter().all(|d| matches!(d, Device::Cpu { .. })));
    }
}
