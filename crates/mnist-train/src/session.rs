//! A training run in progress: the worker pool, the state, the hyper-parameters, and how they
//! are written into and read back from checkpoint metadata.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use rand::SeedableRng;
use tandem_model::{Mlp, MlpReplica};
use tandem_pool::{Device, DeviceSpec, Replica, WorkerPool};
use tandem_strategy::{asynchronous, sync, Hyper, Observer, TrainReport, TrainState};
use tandem_tensor::{CpuBackend, ExampleSet};

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

/// Everything that defines a run, as stored in checkpoint metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct RunConfig {
    pub mode: Mode,
    pub workers: usize,
    pub hyper: Hyper,
    pub end_step: u64,
}

impl RunConfig {
    /// Training examples per global step.
    pub fn examples_per_step(&self) -> u64 {
        match self.mode {
            Mode::Sync => (self.hyper.batch_size * self.workers) as u64,
            Mode::Async => self.hyper.batch_size as u64,
        }
    }

    /// Global steps in one epoch of `examples` (at least 1).
    pub fn steps_per_epoch(&self, examples: usize) -> u64 {
        (examples as u64 / self.examples_per_step()).max(1)
    }

    pub fn to_metadata(&self) -> BTreeMap<String, String> {
        let h = &self.hyper;
        [
            ("format", "tandem-mlp-v1".to_string()),
            (
                "model",
                format!(
                    "{}-{}-{}",
                    Mlp::MNIST.inputs,
                    Mlp::MNIST.hidden,
                    Mlp::MNIST.classes
                ),
            ),
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
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    pub fn from_metadata(meta: &BTreeMap<String, String>, log_every: u64) -> Result<Self> {
        fn field<T: std::str::FromStr>(meta: &BTreeMap<String, String>, key: &str) -> Result<T>
        where
            T::Err: std::fmt::Display,
        {
            let text = meta
                .get(key)
                .with_context(|| format!("checkpoint metadata has no {key}"))?;
            text.parse()
                .map_err(|e| anyhow::anyhow!("checkpoint metadata {key} = {text:?}: {e}"))
        }
        Ok(Self {
            mode: Mode::parse(&field::<String>(meta, "mode")?)?,
            workers: field(meta, "workers")?,
            end_step: field(meta, "end_step")?,
            hyper: Hyper {
                batch_size: field(meta, "batch_size")?,
                learning_rate: field(meta, "learning_rate")?,
                lr_decay: field(meta, "lr_decay")?,
                weight_decay: field(meta, "weight_decay")?,
                ema_decay: field(meta, "ema_decay")?,
                seed: field(meta, "seed")?,
                log_every,
            },
        })
    }
}

/// The initial state of a fresh run.
pub fn initial_state(init_stddev: f32, seed: u64) -> TrainState {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    TrainState::new(Mlp::MNIST.init(init_stddev, &mut rng))
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
        let devices = spec.resolve()?;
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
    pub fn layout(&self) -> Vec<tandem_pool::ParamSpan> {
        Mlp::MNIST.layout()
    }
}
