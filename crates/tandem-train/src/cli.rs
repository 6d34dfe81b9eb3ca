//! The command-line flags of a training run, for any model's binary (feature `cli`): flatten
//! [`RunArgs`] into its clap parser beside the model's own flags, and [`RunArgs::start`] turns
//! them into a fresh start or a resume.
//!
//! The hyper-parameter flags are options without a stored default: a fresh run takes the
//! optimiser's and [`Batches::DEFAULT`]'s values for those not given (their help states them),
//! and a resumed run takes the checkpoint's, so that a flag given with `--resume` can be told
//! apart from a default (and refused when it disagrees with the run being resumed).

use std::path::PathBuf;
use std::sync::LazyLock;
use std::time::Duration;

use clap::{ArgGroup, Args, ValueEnum};
use tandem_optim::check::{ema_decay, learning_rate, lr_decay, weight_decay};
use tandem_optim::{Chosen, ConfigureError, UnknownOptimizer, OPTIMIZERS};
use tandem_pool::DeviceSpec;
use tandem_strategy::{AsyncRule, BatchScaling, Batches, Exchange, StalenessBound, Warmup};

use tandem_core::{check_loss_scale, BadLossScale, DType, Precision, UnknownDType};

use crate::{
    Display, Fresh, Length, Mode, Requested, Resume, Shown, Start, ASYNC_BOUND, ASYNC_RULE,
    ASYNC_WARMUP, DEFAULT_LOG_EVERY, LOSS_SCALE, LR_SCALING, MAX_STEPS, PRECISION,
};

/// The longest run `--epochs` may ask for.
pub const MAX_EPOCHS: u64 = 100_000;
/// The largest per-worker batch `--batch-size` accepts.
pub const MAX_BATCH: u64 = 60_000;
/// The number of epochs a fresh run trains when neither `--epochs` nor `--steps` is given: on
/// MNIST, with the reference's slowly decaying learning rate, test accuracy plateaus around
/// 98.2% with +-0.2% of noise after 30 epochs; by 100 it has settled above 98.3% in both modes.
pub const DEFAULT_EPOCHS: u64 = 100;

/// `--optimizer`'s help: every optimiser of the registry with its defaults.
static OPTIMIZER_HELP: LazyLock<String> = LazyLock::new(|| {
    let each: Vec<String> = (OPTIMIZERS.iter())
        .map(|kind| {
            let defaults: Vec<String> = (kind.defaults().into_iter())
                .map(|(key, value)| format!("{key} {value}"))
                .collect();
            format!(
                "{}: {}, defaults {}",
                kind.name,
                kind.about,
                defaults.join(", ")
            )
        })
        .collect();
    format!(
        "The optimiser, one of {}; --lr, --lr-decay, --weight-decay and --ema-decay set those it has \
         [default: {}; when resuming, the run's own]",
        each.join("; "),
        OPTIMIZERS[0].name
    )
});

/// `--lr`'s help: each optimiser's default rate.
static LR_HELP: LazyLock<String> = LazyLock::new(|| {
    let each: Vec<String> = (OPTIMIZERS.iter())
        .filter_map(|kind| {
            let defaults = kind.defaults();
            let (_, rate) = defaults.iter().find(|(key, _)| *key == "learning_rate")?;
            Some(format!("{rate} with {}", kind.name))
        })
        .collect();
    format!(
        "Base learning rate, a finite number > 0 [default: {}]",
        each.join(", ")
    )
});

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// A progress bar when stdout and stderr are terminals (not under mpirun, whose stderr is
    /// a pipe), plain lines otherwise.
    Auto,
    /// The reference's plain lines: `step N, loss = L (E examples/sec; S sec/batch)`.
    Plain,
}

impl From<LogFormat> for Display {
    fn from(format: LogFormat) -> Self {
        match format {
            LogFormat::Auto => Display::Auto,
            LogFormat::Plain => Display::Plain,
        }
    }
}

/// How to train: mode, devices, length, batches, optimiser, checkpoints, resume, progress.
#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("checkpoint_target").args(["checkpoint_dir", "resume"]).multiple(true)))]
pub struct RunArgs {
    /// Synchronous data parallelism: averaged gradients, one identical update per step (default).
    #[arg(long, conflicts_with = "asynchronous")]
    pub sync: bool,

    /// Asynchronous data parallelism: each worker updates the shared parameters on its own.
    #[arg(long = "async", id = "asynchronous")]
    pub asynchronous: bool,

    /// What asynchronous updates do about staleness (the other updates that landed between a
    /// worker's read of the parameters and its update): scaled divides each update's learning
    /// rate by its staleness (at least 1), plain applies every update at the full rate (which
    /// diverges from about 4 workers) [default: scaled].
    #[arg(long, value_name = "RULE", value_parser = async_rule)]
    pub async_rule: Option<AsyncRule>,

    /// Asynchronous training's first epochs on one worker before the others join: auto (5 on
    /// 4 or more workers, where stale updates hurt, none on fewer) or a number of epochs (0:
    /// none) [default: auto].
    #[arg(long, value_name = "EPOCHS", allow_negative_numbers = true, value_parser = async_warmup)]
    pub async_warmup: Option<Warmup>,

    /// A limit S on how stale an asynchronous update may be: none; wait:S (at most S + 1
    /// workers compute at once, the others wait to read); or drop:S (an update more than S
    /// stale is dropped and its batch computed again from fresh parameters) [default: none].
    #[arg(long, value_name = "BOUND", value_parser = async_bound)]
    pub async_bound: Option<StalenessBound>,

    /// Synchronous training's learning rate as the global batch (every worker's batch) grows:
    /// auto (the rate times global batch / 800 above 800 examples, at most twice, as on 9 or
    /// more workers of 100) or a factor from 1 to 64 (1: none); a scaled rate grows linearly
    /// from the base over the first 5 epochs [default: auto].
    #[arg(long, value_name = "SCALING", value_parser = lr_scaling)]
    pub lr_scaling: Option<BatchScaling>,

    /// Devices, one replica each: auto (all GPUs, else one CPU worker per core), cpu:N,
    /// cuda:0,1 (GPUs 0 and 1), cuda:0x4 (four replicas on GPU 0) or sim:N (N simulated
    /// workers: exactly as N equally fast parallel workers would train, at one core's speed);
    /// at most 256 replicas. A sync run computes as many replicas on each GPU as one replica
    /// of their shards (same examples and averaged gradient, one update); async replicas on
    /// one GPU take turns on it (one stream), each update first in its worker's next step.
    #[arg(long, default_value = "auto", value_name = "SPEC")]
    pub devices: DeviceSpec,

    /// Passes over the training examples, 1 to 100000: the run ends at the first step by which
    /// that many examples are drawn (epochs x training examples / global batch, rounded up)
    /// [default: 100; when resuming, the checkpointed run's own length].
    #[arg(long, conflicts_with = "steps", value_parser = clap::value_parser!(u64).range(1..=MAX_EPOCHS))]
    pub epochs: Option<u64>,

    /// Train until this global step instead of --epochs, 1 to 10^12 (sync: one step uses every
    /// worker's batch; async: one step is one worker's update).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_STEPS))]
    pub steps: Option<u64>,

    /// Examples per worker per step, 1 to 60000 [default: 100].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_BATCH))]
    pub batch_size: Option<u64>,

    /// The optimiser, by name.
    #[arg(long, value_name = "NAME", value_parser = optimizer, help = OPTIMIZER_HELP.as_str())]
    pub optimizer: Option<String>,

    /// Base learning rate, a finite number > 0.
    #[arg(long = "lr", alias = "learning-rate", value_name = "RATE", allow_negative_numbers = true, value_parser = learning_rate, help = LR_HELP.as_str())]
    pub learning_rate: Option<f32>,

    /// The learning rate is multiplied by this once per epoch (continuously), in (0, 1]
    /// [default: 0.99].
    #[arg(long, value_name = "FACTOR", allow_negative_numbers = true, value_parser = lr_decay)]
    pub lr_decay: Option<f32>,

    /// L2 regularisation coefficient on the weights, finite and >= 0 [default: 0.0001].
    #[arg(long, value_name = "COEFF", allow_negative_numbers = true, value_parser = weight_decay)]
    pub weight_decay: Option<f32>,

    /// Moving-average decay of the parameters, in [0, 1) (warmed up as
    /// min(decay, (1+step)/(10+step))) [default: 0.99].
    #[arg(long, value_name = "DECAY", allow_negative_numbers = true, value_parser = ema_decay)]
    pub ema_decay: Option<f32>,

    /// What the replicas compute in: f32, or bf16 or f16 (mixed precision: weights,
    /// activations and gradients in 16 bits, products accumulated in f32; the parameters of
    /// record, their moving average and the optimiser's state in f32; f16 with a dynamic loss
    /// scale) [default: f32; when resuming, the run's own].
    #[arg(long, value_name = "TYPE", value_parser = precision)]
    pub precision: Option<DType>,

    /// f16's initial loss scale, a power of two from 1 to 2^64: halved (and the batch computed
    /// again) when a pass's gradients overflow, doubled after 2000 passes without [default:
    /// 65536; when resuming, the run's own].
    #[arg(long, value_name = "SCALE", value_parser = loss_scale)]
    pub loss_scale: Option<f32>,

    /// What a synchronous run across processes (under mpirun), or between GPU replicas, sends
    /// its gradients in: f32, or bf16 (divided by the worker count, rounded, summed in f32 on
    /// arrival: half the bytes; across processes the updated parameters travel in bf16 too
    /// where the run computes in bf16) [default: f32; when resuming, the run's own, which
    /// this changes].
    #[arg(long, value_name = "TYPE", value_parser = exchange)]
    pub exchange: Option<Exchange>,

    /// Seed of the initial weights and the data order [default: 1].
    #[arg(long)]
    pub seed: Option<u64>,

    /// Print a progress line (and write a metrics record) every this many steps (0: never).
    #[arg(long, default_value_t = DEFAULT_LOG_EVERY)]
    pub log_every: u64,

    /// Progress display.
    #[arg(long, value_enum, default_value_t = LogFormat::Auto)]
    pub log_format: LogFormat,

    /// Write checkpoints (safetensors) into this directory. It belongs to one run: a second run
    /// on it is refused while the first lives, and a fresh run refuses a directory that holds
    /// another run's checkpoints (continue that run with --resume, or choose another
    /// directory).
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,

    /// Save a checkpoint every this many steps [default: once per epoch, training examples /
    /// global batch rounded up; when resuming, the run's own cadence], and always at the end.
    #[arg(long, value_name = "STEPS", requires = "checkpoint_target", value_parser = clap::value_parser!(u64).range(1..=MAX_STEPS))]
    pub save_every: Option<u64>,

    /// Keep only the newest this many of the run's checkpoints (0: keep all).
    #[arg(long, default_value_t = 3)]
    pub keep: usize,

    /// Continue from the newest valid checkpoint in DIR, with the configuration it was written
    /// with (mode, batch size, hyper-parameters, seed, length, checkpoint cadence); damaged
    /// checkpoints are skipped with a warning. New checkpoints go there too unless
    /// --checkpoint-dir says otherwise. --steps or --epochs extend the run; a flag that
    /// disagrees with the checkpointed run (e.g. --async for a sync run) is an error. It
    /// trains on --devices as given now (not recorded): a sync run continues bit for bit on
    /// the devices it ran on.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,

    /// Append one JSON object per logged step and per evaluation to FILE.
    #[arg(long, value_name = "FILE")]
    pub metrics: Option<PathBuf>,

    /// Seconds a worker may go without finishing a step before it is reported as stalled; a
    /// Ctrl-C then saves the last consistent checkpoint and ends the run even though the worker
    /// hangs.
    #[arg(long, value_name = "SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub stall_timeout: u64,
}

/// `--async-rule`: a rule's name.
pub fn async_rule(text: &str) -> Result<AsyncRule, tandem_strategy::UnknownRule> {
    text.parse()
}

/// `--async-warmup`: auto or a number of epochs.
pub fn async_warmup(text: &str) -> Result<Warmup, tandem_strategy::InvalidWarmup> {
    text.parse()
}

/// `--async-bound`: none, wait:S or drop:S.
pub fn async_bound(text: &str) -> Result<StalenessBound, tandem_strategy::InvalidBound> {
    text.parse()
}

/// `--lr-scaling`: auto or a factor.
pub fn lr_scaling(text: &str) -> Result<BatchScaling, tandem_strategy::InvalidScaling> {
    text.parse()
}

/// `--precision`: `f32`, `bf16` or `f16`.
pub fn precision(text: &str) -> Result<DType, UnknownDType> {
    text.parse()
}

/// `--loss-scale`: a power of two from 1 to 2^64.
pub fn loss_scale(text: &str) -> Result<f32, String> {
    let scale: f32 = text.parse().map_err(|e| format!("{e}"))?;
    check_loss_scale(scale).map_err(|e: BadLossScale| e.to_string())
}

/// `--exchange`: `f32` or `bf16`.
pub fn exchange(text: &str) -> Result<Exchange, tandem_strategy::UnknownExchange> {
    text.parse()
}

/// `--optimizer`: a name in [`OPTIMIZERS`].
fn optimizer(text: &str) -> Result<String, UnknownOptimizer> {
    OPTIMIZERS
        .iter()
        .find(|kind| kind.name == text)
        .map(|kind| kind.name.to_owned())
        .ok_or_else(|| UnknownOptimizer(text.to_owned()))
}

impl RunArgs {
    /// The mode the flags ask for, if either was given.
    pub fn mode(&self) -> Option<Mode> {
        if self.asynchronous {
            Some(Mode::Async)
        } else if self.sync {
            Some(Mode::Sync)
        } else {
            None
        }
    }

    /// How the run is shown.
    pub fn shown(&self) -> Shown<'_> {
        Shown {
            display: self.log_format.into(),
            log_every: self.log_every,
            metrics: self.metrics.as_deref(),
            stall_timeout: Duration::from_secs(self.stall_timeout),
        }
    }

    /// How the run starts: fresh from the flags (defaults for those not given), its initial
    /// parameters `params(seed)` and its optimiser's learning rate `default_rate(name)` where
    /// `--lr` is not given and the model has one of its own; or resumed with the flags given
    /// as settings that must agree with the run's.
    pub fn start(
        &self,
        default_rate: impl Fn(&str) -> Option<f32>,
        params: impl FnOnce(u64) -> Vec<f32>,
    ) -> Result<Start<Chosen>, StartError> {
        let length = match (self.steps, self.epochs) {
            (Some(steps), _) => Some(Length::Steps(steps)),
            (None, Some(epochs)) => Some(Length::Epochs(epochs)),
            (None, None) => None,
        };
        let Some(dir) = &self.resume else {
            let batches = Batches::DEFAULT;
            let batches = Batches {
                batch_size: self.batch_size.map_or(batches.batch_size, |b| b as usize),
                seed: self.seed.unwrap_or(batches.seed),
            };
            let name = self.optimizer.as_deref().unwrap_or(OPTIMIZERS[0].name);
            let given: Vec<(&str, String)> = [
                ("learning_rate", self.learning_rate.or(default_rate(name))),
                ("lr_decay", self.lr_decay),
                ("weight_decay", self.weight_decay),
                ("ema_decay", self.ema_decay),
            ]
            .into_iter()
            .filter_map(|(key, value)| Some((key, value?.to_string())))
            .collect();
            let compute = self.precision.unwrap_or_default();
            let mut precision = Precision::new(compute);
            if let Some(scale) = self.loss_scale {
                if !precision.scaled() {
                    return Err(StartError::LossScaleUnused(compute));
                }
                precision.initial_loss_scale = scale;
            }
            return Ok(Start::Fresh(Fresh {
                mode: self.mode().unwrap_or(Mode::Sync),
                async_rule: self.async_rule.unwrap_or_default(),
                async_warmup: self.async_warmup.unwrap_or(Warmup::Auto),
                async_bound: self.async_bound.unwrap_or_default(),
                lr_scaling: self.lr_scaling.unwrap_or_default(),
                optimizer: Chosen::configure(name, &given)?,
                params: params(batches.seed),
                batches,
                length: length.unwrap_or(Length::Epochs(DEFAULT_EPOCHS)),
                save_every: self.save_every,
                precision,
                exchange: self.exchange.unwrap_or_default(),
            }));
        };
        let requested = [
            given("mode", "--sync/--async", self.mode().map(Mode::name)),
            given(ASYNC_RULE, "--async-rule", self.async_rule),
            given(ASYNC_WARMUP, "--async-warmup", self.async_warmup),
            given(ASYNC_BOUND, "--async-bound", self.async_bound),
            given(LR_SCALING, "--lr-scaling", self.lr_scaling),
            given("batch_size", "--batch-size", self.batch_size),
            given(Chosen::KEY, "--optimizer", self.optimizer.as_ref()),
            given("learning_rate", "--lr", self.learning_rate),
            given("lr_decay", "--lr-decay", self.lr_decay),
            given("weight_decay", "--weight-decay", self.weight_decay),
            given("ema_decay", "--ema-decay", self.ema_decay),
            given("seed", "--seed", self.seed),
            given(PRECISION, "--precision", self.precision),
            given(LOSS_SCALE, "--loss-scale", self.loss_scale),
        ];
        Ok(Start::Resume(Resume {
            dir: dir.clone(),
            requested: requested.into_iter().flatten().collect(),
            length,
            save_every: self.save_every,
            exchange: self.exchange,
        }))
    }
}

/// Flags that cannot start a run.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The optimiser flags.
    #[error(transparent)]
    Optimizer(#[from] ConfigureError),
    /// `--loss-scale` for a precision that is not loss-scaled.
    #[error("--loss-scale sets the loss scale of --precision f16, but this run computes in {0}, which is not scaled: drop it")]
    LossScaleUnused(DType),
}

/// A flag given for a resumed run, as the metadata key it would set.
fn given(
    key: &'static str,
    label: &'static str,
    value: Option<impl ToString>,
) -> Option<Requested> {
    value.map(|value| Requested {
        key,
        label,
        value: value.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    /// A binary's parser with nothing but the run's flags.
    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        run: RunArgs,
    }

    fn parse(args: &[&str]) -> Result<RunArgs, clap::Error> {
        let args = std::iter::once("train").chain(args.iter().copied());
        Flags::try_parse_from(args).map(|flags| flags.run)
    }

    /// The start the flags ask for, with a model that has no rate of its own and whose
    /// initial parameter is its seed.
    fn start(args: &[&str]) -> Result<Start<Chosen>, StartError> {
        parse(args)
            .unwrap()
            .start(|_| None, |seed| vec![seed as f32])
    }

    fn fresh(args: &[&str]) -> Fresh<Chosen> {
        match start(args).unwrap() {
            Start::Fresh(fresh) => fresh,
            Start::Resume(resume) => panic!("{resume:?}"),
        }
    }

    #[test]
    fn a_fresh_run_without_flags_takes_the_defaults() {
        let run = fresh(&[]);
        assert_eq!(run.mode, Mode::Sync);
        assert_eq!(run.async_rule, AsyncRule::default());
        assert_eq!(run.async_warmup, Warmup::Auto);
        assert_eq!(run.async_bound, StalenessBound::default());
        assert_eq!(run.lr_scaling, BatchScaling::default());
        assert_eq!(
            run.optimizer,
            Chosen::configure(OPTIMIZERS[0].name, &[]).unwrap()
        );
        assert_eq!(run.batches, Batches::DEFAULT);
        assert_eq!(run.params, [Batches::DEFAULT.seed as f32]);
        assert_eq!(run.length, Length::Epochs(DEFAULT_EPOCHS));
        assert_eq!(run.save_every, None);
        assert_eq!(run.precision, Precision::new(DType::F32));
        assert_eq!(run.exchange, Exchange::default());
    }

    #[test]
    fn a_fresh_run_takes_every_flag_given() {
        let run = fresh(&[
            "--async",
            "--async-rule",
            "plain",
            "--async-warmup",
            "2",
            "--async-bound",
            "wait:3",
            "--lr-scaling",
            "4",
            "--batch-size",
            "50",
            "--seed",
            "7",
            "--optimizer",
            "adam",
            "--lr",
            "0.01",
            "--weight-decay",
            "0",
            "--steps",
            "500",
            "--save-every",
            "100",
            "--checkpoint-dir",
            "checkpoints",
            "--precision",
            "f16",
            "--loss-scale",
            "1024",
            "--exchange",
            "bf16",
        ]);
        assert_eq!(run.mode, Mode::Async);
        assert_eq!(run.async_rule, "plain".parse().unwrap());
        assert_eq!(run.async_warmup, "2".parse().unwrap());
        assert_eq!(run.async_bound, "wait:3".parse().unwrap());
        assert_eq!(run.lr_scaling, "4".parse().unwrap());
        assert_eq!((run.batches.batch_size, run.batches.seed), (50, 7));
        assert_eq!(run.params, [7.0]);
        let given = [
            ("learning_rate", "0.01".into()),
            ("weight_decay", "0".into()),
        ];
        assert_eq!(run.optimizer, Chosen::configure("adam", &given).unwrap());
        assert_eq!(run.length, Length::Steps(500));
        assert_eq!(run.save_every, Some(100));
        assert_eq!(run.precision.compute, DType::F16);
        assert_eq!(run.precision.initial_loss_scale, 1024.0);
        assert_eq!(run.exchange, "bf16".parse().unwrap());
        assert_eq!(
            fresh(&["--sync", "--epochs", "3"]).length,
            Length::Epochs(3)
        );
    }

    #[test]
    fn the_models_rate_stands_where_lr_is_not_given() {
        let sgd_rate = |args: &[&str]| {
            let start = parse(args)
                .unwrap()
                .start(|name| (name == "sgd").then_some(0.25), |_| Vec::new());
            let Ok(Start::Fresh(run)) = start else {
                panic!("{start:?}")
            };
            run.optimizer
        };
        let with = |rate: &str| Chosen::configure("sgd", &[("learning_rate", rate.into())]);
        assert_eq!(sgd_rate(&[]), with("0.25").unwrap());
        assert_eq!(sgd_rate(&["--lr", "0.5"]), with("0.5").unwrap());
    }

    #[test]
    fn a_loss_scale_without_f16_is_refused() {
        for args in [
            &["--loss-scale", "1024"][..],
            &["--precision", "bf16", "--loss-scale", "1024"],
        ] {
            let refusal = start(args).unwrap_err();
            assert!(
                matches!(refusal, StartError::LossScaleUnused(_)),
                "{refusal}"
            );
        }
    }

    #[test]
    fn a_resumed_run_takes_the_flags_given_as_requests() {
        let args = [
            "--resume",
            "checkpoints",
            "--sync",
            "--batch-size",
            "50",
            "--lr",
            "0.5",
            "--precision",
            "bf16",
            "--exchange",
            "bf16",
            "--epochs",
            "4",
            "--save-every",
            "9",
        ];
        let Start::Resume(resume) = start(&args).unwrap() else {
            panic!("not a resume");
        };
        assert_eq!(resume.dir, PathBuf::from("checkpoints"));
        let requested: Vec<(&str, &str, &str)> = (resume.requested.iter())
            .map(|r| (r.key, r.label, r.value.as_str()))
            .collect();
        assert_eq!(
            requested,
            [
                ("mode", "--sync/--async", "sync"),
                ("batch_size", "--batch-size", "50"),
                ("learning_rate", "--lr", "0.5"),
                (PRECISION, "--precision", "bf16"),
            ]
        );
        assert_eq!(resume.length, Some(Length::Epochs(4)));
        assert_eq!(resume.save_every, Some(9));
        assert_eq!(resume.exchange, Some("bf16".parse().unwrap()));
    }

    #[test]
    fn values_are_checked_as_they_are_parsed() {
        for args in [
            &["--optimizer", "rmsprop"][..],
            &["--loss-scale", "3"],
            &["--loss-scale", "many"],
            &["--precision", "fp8"],
            &["--exchange", "f16"],
            &["--async-rule", "fast"],
            &["--async-warmup", "-1"],
            &["--async-bound", "wait"],
            &["--lr-scaling", "0"],
            &["--sync", "--async"],
        ] {
            assert!(parse(args).is_err(), "{args:?}");
        }
        assert_eq!(loss_scale("1024"), Ok(1024.0));
        assert_eq!(optimizer("adam").unwrap(), "adam");
    }

    #[test]
    fn how_the_run_is_shown_is_the_flags() {
        let args = parse(&[
            "--log-every",
            "5",
            "--log-format",
            "plain",
            "--metrics",
            "metrics.jsonl",
            "--stall-timeout",
            "9",
        ])
        .unwrap();
        let shown = args.shown();
        assert_eq!(shown.display, Display::Plain);
        assert_eq!(shown.log_every, 5);
        assert_eq!(shown.metrics, Some(std::path::Path::new("metrics.jsonl")));
        assert_eq!(shown.stall_timeout, Duration::from_secs(9));
        assert_eq!(parse(&[]).unwrap().shown().display, Display::Auto);
    }

    #[test]
    fn the_help_gives_each_optimisers_defaults() {
        let help = Flags::command().render_long_help().to_string();
        assert!(
            help.contains("[default: 0.8 with sgd, 0.001 with adam]"),
            "{help}"
        );
        assert!(help.contains("sgd: SGD with L2"), "{help}");
    }
}
