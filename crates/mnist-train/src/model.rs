//! The MNIST model as the trainer sees it: a multi-layer perceptron of the run's hidden
//! layers, its replicas on CPU workers or CUDA GPUs, its identity in checkpoints (which name
//! its layers, so that a resume, `eval` and `predict` rebuild it), its initial parameters.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use rand::SeedableRng;
use tandem_checkpoint::{self as checkpoint, Checkpoint};
use tandem_core::Optimizer;
use tandem_core::{ParamSpan, Precision, Replica, ReplicaError};
use tandem_model::{Mlp, Network};
use tandem_optim::{Chosen, Sgd};
use tandem_pool::{Device, GpuCount};
use tandem_tensor::ExampleSet;
use tandem_train::{output, ModelId, RunConfig, Setup};

use tandem_train::cli::MAX_BATCH;

/// The checkpoint format this binary writes and reads.
pub const FORMAT: &str = "tandem-mlp-v1";

/// The model a checkpoint of `mlp` holds, as its metadata names it.
pub fn id(mlp: &Mlp) -> ModelId {
    ModelId {
        format: FORMAT.to_string(),
        model: mlp.name(),
    }
}

/// The initial parameters of a fresh run of `mlp`: truncated normal weights, zero biases.
pub fn initial_params(mlp: &Mlp, init_stddev: f32, seed: u64) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    mlp.init(init_stddev, &mut rng)
}

/// A fresh run's learning rate when `--lr` is not given: the reference's (`Sgd::DEFAULT`, 0.8)
/// for its one hidden layer (or none), divided by the number of hidden layers of a deeper
/// network. At 0.8 a 784-256-128-10 network diverged in both of two asynchronous runs on
/// `cpu:2` (a NaN loss at step 8,639; chance level at the end); at 0.4 it reached 0.9834.
pub fn default_learning_rate(mlp: &Mlp) -> f32 {
    Sgd::DEFAULT.learning_rate / mlp.hidden().len().max(1) as f32
}

/// The network a checkpoint file's metadata names (read from its header alone).
pub fn model_of(file: &Path) -> Result<Mlp> {
    let (_, metadata) =
        checkpoint::read_header(file).map_err(|e| anyhow!("cannot load the checkpoint: {e}"))?;
    let name = metadata.get("model").ok_or_else(|| {
        anyhow!(
            "{}: not a checkpoint of this model: its metadata names no model",
            file.display()
        )
    })?;
    let not_ours = |why: String| {
        anyhow!(
            "{}: not a checkpoint of a network this binary trains: {why}",
            file.display()
        )
    };
    let mlp = Mlp::from_name(name).map_err(|e| not_ours(e.to_string()))?;
    let mnist = Mlp::mnist();
    if (mlp.inputs(), mlp.classes()) != (mnist.inputs(), mnist.classes()) {
        return Err(not_ours(format!(
            "its model {name} does not take {} inputs to {} classes",
            mnist.inputs(),
            mnist.classes()
        )));
    }
    Ok(mlp)
}

/// The network of the run whose checkpoints are in `dir`: the one its newest checkpoint with a
/// readable header names; `None` where no header reads (the resume itself then says why).
pub fn model_in(dir: &Path) -> Result<Option<Mlp>> {
    let files = checkpoint::list(dir).map_err(|e| anyhow!("cannot resume: {e}"))?;
    for file in files.iter().rev() {
        if checkpoint::read_header(file).is_ok() {
            return model_of(file).map(Some);
        }
    }
    Ok(None)
}

/// How many CUDA GPUs this machine has, for resolving `--devices` (the pool knows no CUDA):
/// the driver's answer in a build with the `cuda` feature, "no CUDA" otherwise.
pub fn gpu_count() -> GpuCount {
    #[cfg(feature = "cuda")]
    return GpuCount::Driver(tandem_kernels::device_count().map_err(tandem_pool::DriverError::new));
    #[cfg(not(feature = "cuda"))]
    GpuCount::NoCuda
}

/// Where replicas go: `devices`, with this build's GPUs.
pub fn setup(devices: &tandem_pool::DeviceSpec) -> Setup {
    Setup {
        devices: devices.clone(),
        gpus: gpu_count,
        max_batch: MAX_BATCH,
        ranks: None,
    }
}

/// A network on the MNIST training split.
pub struct Mnist<'data> {
    /// The network.
    pub mlp: Mlp,
    /// The training split.
    pub train: &'data ExampleSet,
}

impl tandem_train::Model for Mnist<'_> {
    type Replica = Box<dyn Replica>;

    fn id(&self) -> ModelId {
        id(&self.mlp)
    }

    fn layout(&self) -> Vec<ParamSpan> {
        self.mlp.layout()
    }

    fn training_examples(&self) -> usize {
        self.train.len()
    }

    fn open(
        &self,
        device: &Device,
        batch: usize,
        precision: Precision,
    ) -> Result<Box<dyn Replica>, ReplicaError> {
        tandem_model::open_replica(self.mlp.clone(), device, self.train, batch, precision)
    }
}

/// Loads a checkpoint of an MNIST network and checks it whole (tensors, metadata, step,
/// optimiser state); every failure names the file. `path` is a checkpoint file, or a
/// checkpoint directory: then its newest valid checkpoint, newer damaged ones skipped with a
/// warning. Returns the file it loaded and the network it holds.
pub fn load_checkpoint(path: &Path) -> Result<(PathBuf, Checkpoint, RunConfig<Chosen>, Mlp)> {
    let (file, checkpoint, mlp) = if path.is_dir() {
        let mlp = model_in(path)?.ok_or_else(|| {
            anyhow!(
                "cannot load a checkpoint: {}: no checkpoint in it reads",
                path.display()
            )
        })?;
        let check =
            |c: &Checkpoint| tandem_train::check_checkpoint::<Chosen>(c, &id(&mlp), MAX_BATCH);
        let (file, checkpoint, skipped) =
            checkpoint::load_newest(path, &mlp.layout(), |c| check(c).map(|_| ()))
                .map_err(|e| anyhow!("cannot load a checkpoint: {e}"))?;
        for reason in skipped {
            output::warn(format!("warning: skipped damaged checkpoint {reason}"));
        }
        (file, checkpoint, mlp)
    } else {
        let mlp = model_of(path)?;
        // The checkpoint error already starts with the path.
        let checkpoint = checkpoint::load(path, &mlp.layout())
            .map_err(|e| anyhow!("cannot load the checkpoint: {e}"))?;
        (path.to_owned(), checkpoint, mlp)
    };
    let config = tandem_train::check_checkpoint::<Chosen>(&checkpoint, &id(&mlp), MAX_BATCH)
        .map_err(|e| {
            anyhow!(
                "{}: not a valid checkpoint of this model: {e}",
                file.display()
            )
        })?;
    Ok((file, checkpoint, config, mlp))
}

/// What `eval` and `predict` read: a checkpoint, or parameters exported from one.
pub enum Inference {
    /// A checkpoint: its file, state, configuration and network.
    Checkpoint(PathBuf, Box<Checkpoint>, Box<RunConfig<Chosen>>, Mlp),
    /// An export (`mnist-train export`): its file, parameters and network.
    Export(PathBuf, checkpoint::Export, Mlp),
}

impl Inference {
    /// Loads `path`: an export where the file says it is one, else a checkpoint file or
    /// directory ([`load_checkpoint`]). Either is checked whole; errors name the file.
    pub fn load(path: &Path) -> Result<Self> {
        let export = path.is_file()
            && checkpoint::is_export(path).map_err(|e| anyhow!("cannot load: {e}"))?;
        if !export {
            let (file, saved, config, mlp) = load_checkpoint(path)?;
            return Ok(Inference::Checkpoint(
                file,
                Box::new(saved),
                Box::new(config),
                mlp,
            ));
        }
        let mlp = model_of(path)?;
        let export = checkpoint::load_export(path, &mlp.layout())
            .map_err(|e| anyhow!("cannot load the export: {e}"))?;
        let format = export.metadata.get("format").map(String::as_str);
        if format != Some(FORMAT) {
            bail!(
                "{}: not an export of this binary's networks: its format is {format:?}, not \
                 {FORMAT:?}",
                path.display()
            );
        }
        Ok(Inference::Export(path.to_owned(), export, mlp))
    }

    /// The network.
    pub fn mlp(&self) -> &Mlp {
        match self {
            Inference::Checkpoint(.., mlp) | Inference::Export(.., mlp) => mlp,
        }
    }

    /// The parameters to classify with: a checkpoint's evaluated ones (its moving average),
    /// an export's.
    pub fn params(&self) -> Result<&[f32]> {
        match self {
            Inference::Checkpoint(_, saved, config, _) => {
                evaluated(&saved.state, &config.optimizer)
            }
            Inference::Export(_, export, _) => Ok(&export.params),
        }
    }
}

/// What evaluation and prediction use of a state of `optimizer`: the values it names for it
/// (SGD's and Adam's moving average), or the parameters.
pub fn evaluated<'s>(
    state: &'s tandem_core::TrainState,
    optimizer: &dyn Optimizer,
) -> Result<&'s [f32]> {
    state.evaluated(optimizer).ok_or_else(|| {
        anyhow::anyhow!(
            "the state has no {} for evaluation",
            optimizer.evaluated_slot().unwrap_or("parameters")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_pool::DeviceSpec;

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
