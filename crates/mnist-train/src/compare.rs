//! `mnist-train compare`: trains sync and then async with the same budget of examples on the
//! same devices, measures test accuracy and training loss along the way, and writes a report:
//! `compare.png` and `compare.svg` (four panels) and `compare.md` (a table, also printed).
//! Training is `tandem_train`'s trainer, the report its `report` module's.

use anyhow::{bail, Context, Result};
use tandem_core::TrainState;
use tandem_model::{Mlp, Network};
use tandem_optim::Sgd;
use tandem_pool::DeviceSpec;
use tandem_strategy::Batches;
use tandem_tensor::CpuBackend;
use tandem_train::report::{self, Report, Run, Sweep, SweepPoint, Written};
use tandem_train::{out, EvaluateError, Fresh, Interrupt, Length, Mode, Start, Trainer};

use crate::cli::{CompareArgs, DEFAULT_INIT_STDDEV};
use crate::data::{self, Data};
use crate::model::{self, evaluated, Mnist};

/// The test accuracies whose first crossing the report times.
const MILESTONES: [f64; 2] = [0.97, 0.98];

/// `mnist-train compare`: trains both modes, then writes and prints the report.
pub fn run(args: &CompareArgs) -> Result<()> {
    // Create the report directory before training, so a bad path fails in a second, not after
    // minutes of training.
    std::fs::create_dir_all(&args.report).with_context(|| {
        format!(
            "{}: cannot create the report directory",
            args.report.display()
        )
    })?;
    let data = data::load(args.data_dir.as_deref())?;
    let interrupt = Interrupt::on_ctrl_c()?;
    if let Some(counts) = &args.workers {
        // In order, each once: the chart's axis and the table read left to right, small to
        // large.
        let mut counts = counts.clone();
        counts.sort_unstable();
        counts.dedup();
        return sweep(args, &counts, &data, &interrupt);
    }
    let mut runs = Vec::new();
    let mut devices = Vec::new();
    for mode in [Mode::Sync, Mode::Async] {
        let (run, names) = train(mode, args, &args.devices, &data, &interrupt)?;
        runs.push(run);
        devices = names;
    }
    let lr_note = args
        .learning_rate
        .map(|lr| format!(", learning rate {lr}"))
        .unwrap_or_default();
    let report = Report {
        title: format!("MNIST 784-500-10{lr_note}"),
        heading: format!("tandem: synchronous vs asynchronous data parallelism on MNIST{lr_note}"),
        devices,
        epochs: args.epochs,
        batch_size: args.batch_size as usize,
        seed: args.seed,
        evals_per_epoch: args.evals_per_epoch,
        budget: args.epochs * data.train.len() as u64,
        milestones: MILESTONES.to_vec(),
        runs,
    };
    print(&report::write(&report, &args.report)?);
    Ok(())
}

/// `compare --workers`: both modes at each worker count, on CPU or simulated workers, then
/// the scaling report.
fn sweep(args: &CompareArgs, counts: &[u64], data: &Data, interrupt: &Interrupt) -> Result<()> {
    let (kind, spec): (&str, fn(usize) -> DeviceSpec) = match args.devices {
        DeviceSpec::Sim(_) => ("sim", DeviceSpec::Sim),
        DeviceSpec::Cpu(_) => ("cpu", DeviceSpec::Cpu),
        ref other => bail!(
            "--workers sweeps CPU or simulated workers: give --devices cpu or --devices sim, \
             not {other}"
        ),
    };
    let mut points = Vec::new();
    for workers in counts.iter().map(|&n| n as usize) {
        let mut runs = Vec::new();
        let mut devices = Vec::new();
        for mode in [Mode::Sync, Mode::Async] {
            let (run, names) = train(mode, args, &spec(workers), data, interrupt)?;
            runs.push(run);
            devices = names;
        }
        points.push(SweepPoint {
            workers,
            devices,
            runs,
        });
    }
    let sweep = Sweep {
        title: "MNIST 784-500-10".into(),
        heading: format!(
            "tandem: synchronous vs asynchronous data parallelism on MNIST as workers grow ({kind})"
        ),
        kind: kind.into(),
        epochs: args.epochs,
        batch_size: args.batch_size as usize,
        seed: args.seed,
        settings: format!(
            "async rule {}, warm-up {}, bound {}; sync learning-rate scaling {}",
            args.async_rule, args.async_warmup, args.async_bound, args.lr_scaling
        ),
        milestones: MILESTONES.to_vec(),
        points,
    };
    print(&report::write_sweep(&sweep, &args.report)?);
    Ok(())
}

/// Prints a written report's table and files.
fn print(written: &Written) {
    out!();
    out!("{}", written.table.trim_end());
    out!();
    for path in written.paths() {
        out!("wrote {}", path.display());
    }
}

/// Trains one mode for the budget with the reference's hyper-parameters, evaluating between
/// segments.
fn train(
    mode: Mode,
    args: &CompareArgs,
    devices: &DeviceSpec,
    data: &Data,
    interrupt: &Interrupt,
) -> Result<(Run, Vec<String>)> {
    let start = Start::Fresh(Fresh {
        mode,
        async_rule: args.async_rule,
        async_warmup: args.async_warmup,
        async_bound: args.async_bound,
        lr_scaling: args.lr_scaling,
        optimizer: Sgd {
            learning_rate: args.learning_rate.unwrap_or(Sgd::DEFAULT.learning_rate),
            ..Sgd::DEFAULT
        },
        batches: Batches {
            batch_size: args.batch_size as usize,
            seed: args.seed,
        },
        length: Length::Epochs(args.epochs),
        save_every: None,
        params: model::initial_params(&Mlp::mnist(), DEFAULT_INIT_STDDEV, args.seed),
        precision: tandem_train::Precision::F32,
        exchange: tandem_train::Exchange::F32,
    });
    let model = Mnist {
        mlp: Mlp::mnist(),
        train: &data.train,
    };
    let mut trainer = Trainer::open(model, start, &model::setup(devices), None)?;
    let test_accuracy = |state: &TrainState| -> Result<f64, EvaluateError> {
        let averaged = evaluated(state, &Sgd::DEFAULT)?;
        Ok(Mlp::mnist().evaluate(&CpuBackend, averaged, &data.test)?)
    };
    let run = report::measure(
        &mut trainer,
        args.epochs,
        args.evals_per_epoch,
        interrupt,
        &test_accuracy,
    )
    .context("no report written")?;
    Ok((run, trainer.device_names()))
}
