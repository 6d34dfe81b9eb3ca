use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use rand::SeedableRng;
use tandem_mnist::{Mnist, Split, PIXELS};
use tandem_model::{Mlp, MlpReplica};
use tandem_pool::{Device, Replica, WorkerPool};
use tandem_strategy::{asynchronous, sync, Hyper, TrainReport, TrainState};
use tandem_tensor::{CpuBackend, ExampleSet};

use crate::cli::TrainArgs;
use crate::log::ProgressLog;

/// The data sets as the model consumes them.
pub struct Data {
    pub train: ExampleSet,
    pub validation: ExampleSet,
    pub test: ExampleSet,
}

fn examples(split: Split) -> Result<ExampleSet> {
    ExampleSet::new(PIXELS, split.images, split.labels)
        .context("MNIST split with mismatched images and labels")
}

/// `data/mnist` of the current directory when it is there, else the repository's own copy.
pub fn default_data_dir() -> PathBuf {
    let local = PathBuf::from("data/mnist");
    if local.is_dir() {
        local
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/mnist")
    }
}

pub fn load_data(dir: Option<&Path>) -> Result<Data> {
    let dir = dir.map_or_else(default_data_dir, Path::to_path_buf);
    let mnist = Mnist::load(&dir)?;
    Ok(Data {
        train: examples(mnist.train)?,
        validation: examples(mnist.validation)?,
        test: examples(mnist.test)?,
    })
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

/// Accuracy of the averaged and the raw parameters on one split.
pub struct Accuracy {
    pub averaged: f64,
    pub raw: f64,
}

pub fn accuracy(state: &TrainState, examples: &ExampleSet) -> Result<Accuracy> {
    Ok(Accuracy {
        averaged: Mlp::MNIST.evaluate(&CpuBackend, &state.ema, examples)?,
        raw: Mlp::MNIST.evaluate(&CpuBackend, &state.params, examples)?,
    })
}

pub fn train(args: &TrainArgs) -> Result<()> {
    let wall = Instant::now();
    let data = load_data(args.data_dir.as_deref())?;
    let devices = args.devices.resolve()?;
    let workers = devices.len() as u64;
    let batch = args.batch_size as usize;
    let mode = if args.is_async() { "async" } else { "sync" };
    let examples_per_step = if args.is_async() {
        args.batch_size
    } else {
        args.batch_size * workers
    };
    let steps = match args.steps {
        Some(steps) => steps,
        None => (args.epochs * data.train.len() as u64).div_ceil(examples_per_step),
    };
    if steps == 0 {
        bail!("nothing to train: --epochs or --steps must be at least 1");
    }
    let names: Vec<String> = devices.iter().map(Device::to_string).collect();
    println!(
        "tandem: {mode} training on {} worker(s) [{}], batch {batch} per worker, {steps} steps",
        workers,
        names.join(", ")
    );
    let mut pool = WorkerPool::new(devices, |d| open_replica(d, &data.train, batch))?;
    let hyper = Hyper {
        batch_size: batch,
        learning_rate: args.learning_rate,
        lr_decay: args.lr_decay,
        weight_decay: args.weight_decay,
        ema_decay: args.ema_decay,
        seed: args.seed,
        log_every: args.log_every,
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.seed);
    let mut state = TrainState::new(Mlp::MNIST.init(args.init_stddev, &mut rng));
    let log = ProgressLog::new(state.step);
    let report = if args.is_async() {
        asynchronous::train(&mut pool, &mut state, &hyper, steps, &log)?
    } else {
        sync::train(&mut pool, &mut state, &hyper, steps, &log)?
    };
    summarise(mode, &names, &report, &state, &data, wall)
}

fn summarise(
    mode: &str,
    devices: &[String],
    report: &TrainReport,
    state: &TrainState,
    data: &Data,
    wall: Instant,
) -> Result<()> {
    let validation = accuracy(state, &data.validation)?;
    let test = accuracy(state, &data.test)?;
    println!("== summary ==");
    println!("mode:                {mode}");
    println!(
        "devices:             {} [{}]",
        devices.len(),
        devices.join(", ")
    );
    println!(
        "steps:               {} ({} examples)",
        state.step, report.examples
    );
    println!("examples/sec:        {:.0}", report.examples_per_sec());
    if let Some(s) = report.staleness {
        println!("staleness:           mean {:.2}, max {}", s.mean, s.max);
    }
    for failure in &report.failures {
        println!("worker failure:      {failure}");
    }
    println!(
        "validation accuracy: {:.4} averaged, {:.4} raw",
        validation.averaged, validation.raw
    );
    println!(
        "test accuracy:       {:.4} averaged, {:.4} raw",
        test.averaged, test.raw
    );
    println!("training time:       {:.1} s", report.elapsed.as_secs_f64());
    println!("wall time:           {:.1} s", wall.elapsed().as_secs_f64());
    Ok(())
}
