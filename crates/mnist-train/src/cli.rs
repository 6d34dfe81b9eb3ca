use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use tandem_pool::DeviceSpec;

/// Train the TensorFlow book's MNIST network (784-500-10 ReLU, SGD with exponential decay,
/// L2 regularisation, a moving average of the weights) data-parallel across several workers.
///
/// Synchronous mode (--sync, the default): every step, each worker computes gradients on its
/// own shard of the global batch (workers x --batch-size examples), the gradients are averaged
/// and one identical update is applied. Asynchronous mode (--async): each worker reads the
/// latest parameters, computes gradients on its own batch and applies its update at once,
/// without waiting for the others.
///
/// Training is the default command; the subcommands evaluate, use and compare what it trains.
#[derive(Debug, Parser)]
#[command(version, about, long_about, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub train: TrainArgs,
}

/// What to do instead of training.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Evaluate a checkpoint: validation and test accuracy of the averaged and raw parameters
    /// (as in the training summary), and the test set's confusion matrix.
    ///
    /// Loads a checkpoint written by training (--checkpoint-dir), computes validation and test
    /// accuracy of the moving average of the parameters ("averaged") and of the parameters
    /// themselves ("raw") exactly as the training summary does, and prints the 10x10 confusion
    /// matrix of the averaged parameters on the 10,000 test images: rows are true labels,
    /// columns predicted ones, with each digit's recall and precision.
    Eval(EvalArgs),

    /// Classify images of handwritten digits (PNG or JPEG, any size) with a checkpoint.
    ///
    /// Each image is converted to grey and inverted when its background is light (MNIST digits
    /// are white ink on black; the border's mean brightness decides), then normalised as MNIST
    /// was: a square frame centred on the digit, so that the digit fills 20 of 28 pixels
    /// without changing its aspect ratio, resized to 28x28, centre of mass in the middle. It
    /// is classified with the averaged parameters. Prints one line per image:
    /// `PATH: DIGIT (p = PROBABILITY)`. Expects one dark digit on light paper or one light
    /// digit on a dark background per image.
    Predict(PredictArgs),

    /// Train sync and then async with the same budget and devices, and write a report:
    /// compare.png, compare.svg and compare.md.
    ///
    /// Both modes train for --epochs x 55,000 examples on the same devices, in segments of
    /// 1/--evals-per-epoch epoch; between segments the test accuracy of the averaged parameters
    /// is measured and the training loss of the segment recorded. Evaluation does not count
    /// towards the wall time. The plots show test accuracy and loss against wall time and
    /// against examples seen; compare.md (also printed) holds final accuracy, throughput, time
    /// to 97% and 98% test accuracy and async staleness.
    Compare(CompareArgs),
}

/// `mnist-train eval`.
#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    /// The checkpoint file (a step-NNNNNNNNNN.safetensors written by training).
    #[arg(long, value_name = "FILE")]
    pub checkpoint: PathBuf,

    /// Directory holding the four MNIST IDX files (gzip or plain) [default: data/mnist of this
    /// repository].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
}

/// `mnist-train predict`.
#[derive(Debug, Clone, Args)]
pub struct PredictArgs {
    /// The checkpoint file (a step-NNNNNNNNNN.safetensors written by training).
    #[arg(long, value_name = "FILE")]
    pub checkpoint: PathBuf,

    /// PNG or JPEG images, one digit each.
    #[arg(value_name = "IMAGE", required = true)]
    pub images: Vec<PathBuf>,
}

/// `mnist-train compare`.
#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// Directory to write compare.png, compare.svg and compare.md into (created if missing).
    #[arg(long, value_name = "DIR", default_value = "report")]
    pub report: PathBuf,

    /// Devices, one replica each, for both modes: auto (all GPUs, else one CPU worker per
    /// core), cpu:N, cuda:0,1 or cuda:0x4.
    #[arg(long, default_value = "auto", value_name = "SPEC")]
    pub devices: DeviceSpec,

    /// Training budget of each mode, in passes over the 55,000 training examples.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub epochs: u64,

    /// Examples per worker per step.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=60000))]
    pub batch_size: u64,

    /// Seed of the initial weights and the data order (the same for both modes).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// Test-accuracy evaluations per epoch (points on each curve).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub evals_per_epoch: u64,

    /// Directory holding the four MNIST IDX files (gzip or plain) [default: data/mnist of this
    /// repository].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
}

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// A progress bar when stdout is a terminal, plain lines otherwise.
    Auto,
    /// The book's plain lines: `step N, loss = L (E examples/sec; S sec/batch)`.
    Plain,
}

/// How to train.
#[derive(Debug, Clone, Args)]
pub struct TrainArgs {
    /// Synchronous data parallelism: averaged gradients, one identical update per step (default).
    #[arg(long, conflicts_with = "asynchronous")]
    pub sync: bool,

    /// Asynchronous data parallelism: each worker updates the shared parameters on its own.
    #[arg(long = "async", id = "asynchronous")]
    pub asynchronous: bool,

    /// Devices, one replica each: auto (all GPUs, else one CPU worker per core), cpu:N,
    /// cuda:0,1 (GPUs 0 and 1) or cuda:0x4 (four replicas on GPU 0).
    #[arg(long, default_value = "auto", value_name = "SPEC")]
    pub devices: DeviceSpec,

    /// Passes over the 55,000 training examples [default: 100; when resuming, the checkpointed
    /// run's own length].
    #[arg(long, conflicts_with = "steps")]
    pub epochs: Option<u64>,

    /// Train for this many global steps instead of --epochs (sync: one step uses every
    /// worker's batch; async: one step is one worker's update).
    #[arg(long)]
    pub steps: Option<u64>,

    /// Examples per worker per step.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=60000))]
    pub batch_size: u64,

    /// Base learning rate.
    #[arg(long = "lr", alias = "learning-rate", default_value_t = 0.8)]
    pub learning_rate: f32,

    /// The learning rate is multiplied by this once per epoch (continuously).
    #[arg(long, default_value_t = 0.99)]
    pub lr_decay: f32,

    /// L2 regularisation coefficient on the weights.
    #[arg(long, default_value_t = 1e-4)]
    pub weight_decay: f32,

    /// Moving-average decay of the parameters (warmed up as min(decay, (1+step)/(10+step))).
    #[arg(long, default_value_t = 0.99)]
    pub ema_decay: f32,

    /// Standard deviation of the truncated-normal initial weights.
    #[arg(long, default_value_t = 0.1)]
    pub init_stddev: f32,

    /// Seed of the initial weights and the data order.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// Directory holding the four MNIST IDX files (gzip or plain) [default: data/mnist of this
    /// repository].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Print a progress line (and write a metrics record) every this many steps (0: never).
    #[arg(long, default_value_t = 1000)]
    pub log_every: u64,

    /// Progress display.
    #[arg(long, value_enum, default_value_t = LogFormat::Auto)]
    pub log_format: LogFormat,

    /// Write checkpoints (safetensors) into this directory.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,

    /// Save a checkpoint every this many steps [default: once per epoch], and always at the end.
    #[arg(long, value_name = "STEPS", requires = "checkpoint_dir", value_parser = clap::value_parser!(u64).range(1..))]
    pub save_every: Option<u64>,

    /// Keep only the newest this many checkpoints (0: keep all).
    #[arg(long, default_value_t = 3)]
    pub keep: usize,

    /// Continue from the newest valid checkpoint in DIR, with the configuration it was written
    /// with (mode, batch size, hyper-parameters, seed, length); new checkpoints go there too
    /// unless --checkpoint-dir says otherwise. --steps or --epochs extend the run.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,

    /// Append one JSON object per logged step and per evaluation to FILE.
    #[arg(long, value_name = "FILE")]
    pub metrics: Option<PathBuf>,
}

/// The default number of epochs: with the book's slowly decaying learning rate, test accuracy
/// plateaus around 98.2% with +-0.2% of noise after 30 epochs; by 100 it has settled above 98.3%
/// in both modes.
pub const DEFAULT_EPOCHS: u64 = 100;

impl TrainArgs {
    /// Whether asynchronous mode was asked for.
    pub fn is_async(&self) -> bool {
        self.asynchronous
    }
}
