use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use tandem_core::DType;
use tandem_model::Mlp;
use tandem_optim::check::learning_rate;
use tandem_pool::DeviceSpec;
use tandem_strategy::{AsyncRule, BatchScaling, Batches, StalenessBound, Warmup};
use tandem_train::cli::{async_bound, async_rule, async_warmup, lr_scaling, RunArgs, MAX_BATCH};

/// Train the TensorFlow multi-GPU MNIST example's network (784-500-10 ReLU, SGD with
/// exponential decay, L2 regularisation, a moving average of the weights) data-parallel across
/// several workers.
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
    /// `PATH: DIGIT (p = PROBABILITY)`, or `PATH: no digit found` for a blank image. Expects
    /// one dark digit on light paper or one light digit on a dark background per image.
    /// Images larger than 4096 pixels a side (or 64 MiB decoded) and truncated or damaged
    /// files are errors naming the file; the other images are still classified.
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

    /// Export a checkpoint's averaged parameters for inference in 16 bits (bf16 or f16): a
    /// safetensors file of one tensor per layer's weights and biases, named as in the
    /// checkpoint, half the size of the f32 parameters.
    ///
    /// `eval` and `predict` accept the file in place of a checkpoint. f16 holds values up to
    /// 65504 with 11 significant bits; bf16 any f32's range with 8. A parameter that f16 cannot
    /// hold is an error naming its layer. OUT is written atomically (replaced whole, never
    /// left half-written).
    Export(ExportArgs),
}

/// `mnist-train eval`.
#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    /// The checkpoint: a step-NNNNNNNNNN.safetensors written by training, a checkpoint
    /// directory (its newest valid checkpoint), or a file written by `export`.
    #[arg(long, value_name = "PATH")]
    pub checkpoint: PathBuf,

    /// Directory holding the four MNIST IDX files (gzip or plain) [default: $TANDEM_MNIST_DIR,
    /// else data/mnist under the current directory].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
}

/// `mnist-train export`.
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// The type to store the parameters in: bf16 or f16.
    #[arg(long, value_name = "TYPE", default_value = "bf16", value_parser = export_dtype)]
    pub dtype: DType,

    /// The checkpoint: a step-NNNNNNNNNN.safetensors written by training, or a checkpoint
    /// directory (its newest valid checkpoint).
    #[arg(value_name = "CHECKPOINT")]
    pub checkpoint: PathBuf,

    /// The file to write.
    #[arg(value_name = "OUT")]
    pub out: PathBuf,
}

/// `--dtype` of `export`: a 16-bit type.
fn export_dtype(text: &str) -> Result<DType, String> {
    match text.parse::<DType>() {
        Ok(DType::F32) => Err("an export is 16-bit: bf16 or f16 (a checkpoint is f32)".into()),
        Ok(dtype) => Ok(dtype),
        Err(e) => Err(e.to_string()),
    }
}

/// `mnist-train predict`.
#[derive(Debug, Clone, Args)]
pub struct PredictArgs {
    /// The checkpoint: a step-NNNNNNNNNN.safetensors written by training, a checkpoint
    /// directory (its newest valid checkpoint), or a file written by `export`.
    #[arg(long, value_name = "PATH")]
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
    /// core), cpu:N, sim:N (simulated workers), cuda:0,1 or cuda:0x4; with --workers, the
    /// kind of worker: cpu or sim.
    #[arg(long, default_value = "auto", value_name = "SPEC")]
    pub devices: DeviceSpec,

    /// Sweep over worker counts instead (e.g. 1,2,4,8,16; run in increasing order, each once):
    /// both modes at each count, on the kind of --devices (cpu or sim), and a scaling report
    /// (sweep.png, sweep.svg, sweep.md: final test accuracy, time and examples to 97% and 98%,
    /// staleness).
    #[arg(long, value_name = "N,N,...", value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=tandem_pool::MAX_REPLICAS as u64))]
    pub workers: Option<Vec<u64>>,

    /// Training budget of each mode, in passes over the 55,000 training examples.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub epochs: u64,

    /// Examples per worker per step.
    #[arg(long, default_value_t = Batches::DEFAULT.batch_size as u64, value_parser = clap::value_parser!(u64).range(1..=MAX_BATCH))]
    pub batch_size: u64,

    /// Seed of the initial weights and the data order (the same for both modes).
    #[arg(long, default_value_t = Batches::DEFAULT.seed)]
    pub seed: u64,

    /// Test-accuracy evaluations per epoch (points on each curve).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub evals_per_epoch: u64,

    /// Base learning rate of both modes, a finite number > 0 [default: 0.8].
    #[arg(long = "lr", alias = "learning-rate", value_name = "RATE", allow_negative_numbers = true, value_parser = learning_rate)]
    pub learning_rate: Option<f32>,

    /// What asynchronous updates do about staleness: scaled or plain (see the training
    /// command's --async-rule).
    #[arg(long, value_name = "RULE", default_value_t = AsyncRule::DEFAULT, value_parser = async_rule)]
    pub async_rule: AsyncRule,

    /// Asynchronous training's first epochs on one worker: auto or a number of epochs (see the
    /// training command's --async-warmup).
    #[arg(long, value_name = "EPOCHS", default_value_t = Warmup::Auto, allow_negative_numbers = true, value_parser = async_warmup)]
    pub async_warmup: Warmup,

    /// How stale an asynchronous update may be: none, wait:S or drop:S (see the training
    /// command's --async-bound).
    #[arg(long, value_name = "BOUND", default_value_t = StalenessBound::Unbounded, value_parser = async_bound)]
    pub async_bound: StalenessBound,

    /// How synchronous training's learning rate follows its global batch: auto or a factor
    /// (see the training command's --lr-scaling).
    #[arg(long, value_name = "SCALING", default_value_t = BatchScaling::Auto, value_parser = lr_scaling)]
    pub lr_scaling: BatchScaling,

    /// Directory holding the four MNIST IDX files (gzip or plain) [default: $TANDEM_MNIST_DIR,
    /// else data/mnist under the current directory].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
}

/// How to train: the run's flags, and the network's.
#[derive(Debug, Clone, Args)]
pub struct TrainArgs {
    #[command(flatten)]
    pub run: RunArgs,

    /// The network's hidden layers, their widths from the input on, each 1 to 65536: 500 (the
    /// reference's 784-500-10) or 256,128 (784-256-128-10); ReLU after each; with N of them,
    /// SGD's default --lr is divided by N [default: 500; when resuming, the run's own].
    #[arg(long, value_name = "N,N,...", allow_negative_numbers = true, value_parser = hidden)]
    pub hidden: Option<Mlp>,

    /// Standard deviation of the truncated-normal initial weights, in (0, 10] (a fresh run only)
    /// [default: 0.1].
    #[arg(long, value_name = "STDDEV", allow_negative_numbers = true, value_parser = init_stddev)]
    pub init_stddev: Option<f32>,

    /// Directory holding the four MNIST IDX files (gzip or plain) [default: $TANDEM_MNIST_DIR,
    /// else data/mnist under the current directory].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Where the accuracies (each evaluation's and the summary's) are computed: auto, on the
    /// run's first GPU where it trains on GPUs (the parameters and examples go there, a count
    /// comes back), else on the CPU; or cpu. A GPU evaluation that fails is redone on the CPU,
    /// with a warning.
    #[arg(long, value_name = "WHERE", value_enum, default_value_t = EvalOn::Auto, env = "TANDEM_EVAL_ON")]
    pub eval_on: EvalOn,

    /// Exit 0 even when a run of an epoch or more ends at chance level (a test accuracy within
    /// 5 points of always answering the commonest digit: it diverged or learnt nothing), which
    /// is otherwise an error after the summary (the checkpoints are kept).
    #[arg(long)]
    pub allow_chance: bool,
}

/// `--eval-on`: where a training run computes accuracy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EvalOn {
    /// On the run's first GPU where it trains on GPUs, else on the CPU.
    Auto,
    /// On the CPU.
    Cpu,
}

/// `--hidden`: widths joined by commas, an MNIST network with those hidden layers.
pub fn hidden(text: &str) -> Result<Mlp, String> {
    let widths = (text.split(','))
        .map(|w| match w.trim().parse::<usize>() {
            Ok(w) => Ok(w),
            Err(_) => Err(format!(
                "{w:?} is not a width: give the hidden layers' widths joined by commas, such as \
                 500 or 256,128"
            )),
        })
        .collect::<Result<Vec<usize>, String>>()?;
    Mlp::mnist_with(&widths).map_err(|e| e.to_string())
}

/// `--hidden` as a flag would give it: the widths joined by commas.
pub fn hidden_flag(mlp: &Mlp) -> String {
    let widths: Vec<String> = mlp.hidden().iter().map(usize::to_string).collect();
    widths.join(",")
}

/// `--init-stddev`: in (0, 10].
pub fn init_stddev(text: &str) -> Result<f32, tandem_optim::ValueError> {
    tandem_optim::parse_finite(
        text,
        |v| v > 0.0 && v <= 10.0,
        "the initial standard deviation must be in (0, 10]",
    )
}

/// The reference's standard deviation of the initial weights.
pub const DEFAULT_INIT_STDDEV: f32 = 0.1;

/// The defaults the help and the README state are the ones the code uses: [`Sgd::DEFAULT`],
/// [`Batches::DEFAULT`],
/// [`DEFAULT_EPOCHS`], [`DEFAULT_INIT_STDDEV`] and clap's own defaults.
#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use tandem_optim::Sgd;
    use tandem_train::cli::DEFAULT_EPOCHS;
    use tandem_train::DEFAULT_LOG_EVERY;

    use super::*;

    /// What each option without a stored default takes when not given, as its help and the
    /// README write it.
    fn stated_defaults() -> Vec<(&'static str, String)> {
        let (h, b) = (Sgd::DEFAULT, Batches::DEFAULT);
        vec![
            ("epochs", DEFAULT_EPOCHS.to_string()),
            ("batch-size", b.batch_size.to_string()),
            ("lr", h.learning_rate.to_string()),
            ("lr-decay", h.lr_decay.to_string()),
            ("weight-decay", h.weight_decay.to_string()),
            ("ema-decay", h.ema_decay.to_string()),
            ("init-stddev", DEFAULT_INIT_STDDEV.to_string()),
            ("hidden", hidden_flag(&Mlp::mnist())),
            ("async-rule", AsyncRule::DEFAULT.to_string()),
            ("async-warmup", Warmup::Auto.to_string()),
            ("async-bound", StalenessBound::Unbounded.to_string()),
            ("lr-scaling", BatchScaling::Auto.to_string()),
            ("seed", b.seed.to_string()),
        ]
    }

    /// `text` as a number, so that the README's `1e-4` equals `0.0001`.
    fn number(text: &str) -> f64 {
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{text:?} is not a number"))
    }

    #[test]
    fn the_help_states_the_defaults_the_code_uses() {
        let command = Cli::command();
        for (flag, value) in stated_defaults() {
            let arg = command
                .get_arguments()
                .find(|a| a.get_long() == Some(flag))
                .unwrap_or_else(|| panic!("no --{flag}"));
            let help = arg.get_help().expect("a help text").to_string();
            assert!(
                help.contains(&format!("[default: {value}")),
                "--{flag}: the help {help:?} does not state the default {value}"
            );
        }
        let compare = command.find_subcommand("compare").expect("compare");
        let default_of = |command: &clap::Command, flag: &str| -> String {
            let arg = command
                .get_arguments()
                .find(|a| a.get_long() == Some(flag))
                .unwrap_or_else(|| panic!("no --{flag}"));
            arg.get_default_values()[0].to_string_lossy().into_owned()
        };
        let b = Batches::DEFAULT;
        assert_eq!(default_of(compare, "batch-size"), b.batch_size.to_string());
        assert_eq!(default_of(compare, "seed"), b.seed.to_string());
        assert_eq!(
            default_of(&command, "log-every"),
            DEFAULT_LOG_EVERY.to_string()
        );
    }

    /// The long flags of `command` (help and version aside).
    fn flags(command: &clap::Command) -> Vec<String> {
        command
            .get_arguments()
            .filter_map(|a| a.get_long())
            .filter(|&long| long != "help" && long != "version")
            .map(|long| format!("--{long}"))
            .collect()
    }

    /// README names every flag: the training command's in its table, compare's in its list.
    #[test]
    fn the_readme_names_every_flag() {
        let readme = include_str!("../../../README.md");
        let command = Cli::command();
        for flag in flags(&command) {
            assert!(
                readme.contains(&format!("| `{flag}")) || readme.contains(&format!("/ `{flag}")),
                "README's flag table has no {flag}"
            );
        }
        let compare = command
            .find_subcommand("compare")
            .expect("a compare subcommand");
        let list = readme
            .split("Flags: ")
            .nth(1)
            .and_then(|rest| rest.split(';').next())
            .expect("README lists compare's flags after `Flags: `");
        let listed: Vec<String> = list
            .split(',')
            .map(|f| f.trim().trim_matches('`').to_owned())
            .collect();
        assert_eq!(listed, flags(compare), "README's list of compare's flags");
    }

    /// Every default in the README's flag table and its summary of the model is the code's.
    #[test]
    fn the_readme_states_the_defaults_the_code_uses() {
        let readme = include_str!("../../../README.md");
        let table: Vec<(&str, &str)> = readme
            .lines()
            .filter_map(|line| {
                let cells: Vec<&str> = line.split(" | ").collect();
                let flag = cells.first()?.strip_prefix("| `--")?;
                let flag = flag.split([' ', '`']).next()?;
                Some((flag, *cells.get(1)?))
            })
            .collect();
        let readme_default = |flag: &str| -> &str {
            table
                .iter()
                .find(|(f, _)| *f == flag)
                .unwrap_or_else(|| panic!("the README's flag table has no --{flag}"))
                .1
        };
        for (flag, value) in stated_defaults() {
            let readme = readme_default(flag);
            match value.parse::<f64>() {
                Ok(_) => assert_eq!(number(readme), number(&value), "the README's --{flag}"),
                // A name, such as a rule's.
                Err(_) => assert_eq!(readme, value, "the README's default of --{flag}"),
            }
        }
        let command = Cli::command();
        for flag in ["log-every", "keep", "stall-timeout"] {
            let arg = command
                .get_arguments()
                .find(|a| a.get_long() == Some(flag))
                .unwrap_or_else(|| panic!("no --{flag}"));
            let clap_default = arg.get_default_values()[0].to_string_lossy().into_owned();
            assert_eq!(
                number(readme_default(flag)),
                number(&clap_default),
                "the README's default of --{flag}"
            );
        }
        let h = Sgd::DEFAULT;
        let summary = format!(
            "(stddev {DEFAULT_INIT_STDDEV}), SGD with learning rate {} x {}^epoch, L2 \
             regularisation ",
            h.learning_rate, h.lr_decay
        );
        let prose = readme.split_whitespace().collect::<Vec<_>>().join(" ");
        let at = prose
            .find(&summary)
            .unwrap_or_else(|| panic!("the README does not summarise the model as {summary:?}"));
        let l2 = prose[at + summary.len()..]
            .split([',', ' '])
            .next()
            .unwrap_or_default();
        assert_eq!(number(l2) as f32, h.weight_decay, "the README's L2");
    }
}
