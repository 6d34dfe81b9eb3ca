//! `mnist-train compare`: trains sync and then async with the same budget of examples on the
//! same devices, measures test accuracy and training loss along the way, and writes a report:
//! `compare.png` and `compare.svg` (four panels) and `compare.md` (a table, also printed).
//! Training is `tandem_train`'s trainer, the report its `report` module's.

use anyhow::{bail, Context, Result};
use tandem_core::TrainState;
use tandem_model::{Mlp, Network};
use tandem_optim::Sgd;
use tandem_pool::DeviceSpec;
use tandem_strategy::{Batches, Epochs};
use tandem_tensor::CpuBackend;
use tandem_train::report::{self, Point, Report, Run, Sweep, SweepPoint, Written};
use tandem_train::{out, Fresh, Interrupt, Length, Mode, Plan, Start, Trainer, Watch};

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

/// The global steps at which a run of `count` epochs stops to evaluate, `per_epoch` times an
/// epoch: equal shares of the budget of examples, each ending at the first step by which its
/// examples are drawn ([`Epochs::steps_for`]; the last at [`Epochs::end_step`]), without
/// repeats (a tiny budget may have fewer segments).
fn segment_ends(epochs: Epochs, count: u64, per_epoch: u64) -> Vec<u64> {
    let budget = count * epochs.examples();
    let segments = count * per_epoch;
    let end = epochs.steps_for(budget);
    let mut ends: Vec<u64> = (1..=segments)
        .map(|i| epochs.steps_for(budget * i / segments).min(end))
        .collect();
    ends.dedup();
    ends.retain(|&s| s > 0);
    ends
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
    let batches = Batches {
        batch_size: args.batch_size as usize,
        seed: args.seed,
    };
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
        batches,
        length: Length::Epochs(args.epochs),
        save_every: None,
        params: model::initial_params(&Mlp::mnist(), DEFAULT_INIT_STDDEV, args.seed),
    });
    let model = Mnist {
        mlp: Mlp::mnist(),
        train: &data.train,
    };
    let mut trainer = Trainer::open(model, start, &model::setup(devices), None)?;
    let config = trainer.config.clone();
    let epochs = config.epochs(data.train.len());
    let plan = Plan {
        evaluate_at: segment_ends(epochs, args.epochs, args.evals_per_epoch),
        ..Plan::to(config.end_step)
    };
    out!(
        "{}: {} worker(s) [{}], batch {} per worker, {} steps ({} examples)",
        mode.name(),
        config.workers,
        trainer.device_names().join(", "),
        batches.batch_size,
        config.end_step,
        config.end_step * config.examples_per_step()
    );
    let test_accuracy = |state: &TrainState| -> Result<f64> {
        Mlp::mnist()
            .evaluate(&CpuBackend, evaluated(state, &Sgd::DEFAULT)?, &data.test)
            .context("cannot evaluate on the test set")
    };
    let mut points = vec![Point {
        seconds: 0.0,
        examples: 0,
        accuracy: test_accuracy(&trainer.state)?,
        loss: None,
    }];
    // About 20 loss samples per segment, but never a sum of squares over all parameters (the
    // L2 term of a logged loss, which a GPU run reads back from the device) more often than
    // every 10th step: it would slow training down. A short segment still logs once.
    let per_segment = config.end_step / plan.evaluate_at.len().max(1) as u64;
    let watch = Watch {
        progress: None,
        log_every: (per_segment / 20).max(10).min(per_segment.max(1)),
        interrupt,
        stall_timeout: None,
        on_abandon: None,
    };
    let summary = trainer.train(&plan, &watch, &mut |segment| {
        // Evaluation happens here, between segments: outside the training time.
        let point = Point {
            seconds: segment.totals.seconds,
            examples: segment.totals.examples,
            accuracy: test_accuracy(segment.state)?,
            loss: segment.mean_loss,
        };
        points.push(point);
        let count = (points.len() - 1) as u64;
        if segment.state.step == plan.end_step || count.is_multiple_of(args.evals_per_epoch) {
            out!(
                "  epoch {:>5.2}: test accuracy {:.4}, loss {}, {:.1} s",
                epochs.epoch_at(segment.state.step),
                point.accuracy,
                point.loss.map_or("-".into(), |l| format!("{l:.4}")),
                point.seconds
            );
        }
        Ok(())
    })?;
    if summary.stopped {
        bail!("interrupted: no report written");
    }
    let run = Run {
        mode,
        points,
        staleness: summary.totals.staleness().map(|s| (s.mean, s.max)),
        failures: summary.totals.failures,
    };
    Ok((run, trainer.device_names()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_split_the_budget_into_whole_steps() {
        assert_eq!(segment_ends(Epochs::new(1000, 100), 1, 4), [3, 5, 8, 10]);
        assert_eq!(segment_ends(Epochs::new(1000, 300), 1, 4), [1, 2, 3, 4]);
        // More segments than steps: no repeats, no empty segment.
        assert_eq!(segment_ends(Epochs::new(200, 100), 1, 5), [1, 2]);
        assert_eq!(segment_ends(Epochs::new(55_000, 200), 10, 5).len(), 50);
        // A non-dividing batch: whole epochs end where Epochs says they do.
        let odd = Epochs::new(55_000, 192);
        let ends = segment_ends(odd, 3, 2);
        assert_eq!(ends[1], odd.end_step(1).unwrap());
        assert_eq!(ends[3], odd.end_step(2).unwrap());
        assert_eq!(ends[5], odd.end_step(3).unwrap());
    }
}
