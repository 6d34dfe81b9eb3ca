//! The default command: train, with checkpoints, resume, metrics and a summary.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use serde_json::json;
use tandem_model::Mlp;
use tandem_strategy::{checkpoint, Hyper, Staleness, TrainState};

use crate::cli::{TrainArgs, DEFAULT_EPOCHS};
use crate::data::{self, Data};
use crate::progress::{self, Progress};
use crate::session::{initial_state, Mode, RunConfig, Session};

/// The configuration the flags describe, for `workers` workers.
pub fn config_from_args(args: &TrainArgs, workers: usize, training_examples: usize) -> RunConfig {
    let mut config = RunConfig {
        mode: if args.is_async() {
            Mode::Async
        } else {
            Mode::Sync
        },
        workers,
        hyper: Hyper {
            batch_size: args.batch_size as usize,
            learning_rate: args.learning_rate,
            lr_decay: args.lr_decay,
            weight_decay: args.weight_decay,
            ema_decay: args.ema_decay,
            seed: args.seed,
            log_every: args.log_every,
        },
        end_step: 0,
    };
    config.end_step = end_step(args, &config, training_examples).unwrap_or_else(|| {
        (DEFAULT_EPOCHS * training_examples as u64).div_ceil(config.examples_per_step())
    });
    config
}

/// The length `--steps` or `--epochs` asks for, if either was given.
fn end_step(args: &TrainArgs, config: &RunConfig, training_examples: usize) -> Option<u64> {
    args.steps.or_else(|| {
        args.epochs
            .map(|e| (e * training_examples as u64).div_ceil(config.examples_per_step()))
    })
}

/// Where the run starts: a fresh state, or the newest valid checkpoint of `--resume`.
fn starting_point(args: &TrainArgs, data: &Data) -> Result<(Session, Option<PathBuf>)> {
    let Some(dir) = &args.resume else {
        let workers = args.devices.resolve()?.len();
        let config = config_from_args(args, workers, data.train.len());
        let state = initial_state(args.init_stddev, args.seed);
        return Ok((
            Session::open(&args.devices, config, &data.train, state)?,
            None,
        ));
    };
    let (path, saved, skipped) = checkpoint::load_newest(dir, &Mlp::MNIST.layout())?;
    for reason in skipped {
        eprintln!("warning: skipped {reason}");
    }
    let mut config = RunConfig::from_metadata(&saved.metadata, args.log_every)
        .map_err(|e| anyhow::anyhow!("{}: {e:#}", path.display()))?;
    let saved_workers = config.workers;
    if let Some(end) = end_step(args, &config, data.train.len()) {
        config.end_step = end;
    }
    let session = Session::open(&args.devices, config, &data.train, saved.state)?;
    if session.config.mode == Mode::Sync && session.config.workers != saved_workers {
        bail!(
            "{}: written by a sync run on {saved_workers} worker(s), but --devices {} gives {}; \
             a sync run resumes exactly only on the same number (e.g. --devices cpu:{saved_workers})",
            path.display(),
            args.devices,
            session.config.workers
        );
    }
    Ok((session, Some(path)))
}

/// Segment ends: checkpoints, evaluations, the end.
fn next_stop(step: u64, end: u64, every: &[u64]) -> u64 {
    every
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| (step / n + 1) * n)
        .fold(end, u64::min)
}

pub fn run(args: &TrainArgs) -> Result<()> {
    let wall = Instant::now();
    let data = data::load(args.data_dir.as_deref())?;
    let (mut session, resumed) = starting_point(args, &data)?;
    let config = session.config.clone();
    let start = session.state.step;
    if start >= config.end_step {
        bail!(
            "nothing to train: the run is at step {start} of {}; pass --steps or --epochs to go further",
            config.end_step
        );
    }
    let checkpoint_dir = args.checkpoint_dir.clone().or_else(|| args.resume.clone());
    let epoch = config.steps_per_epoch(data.train.len());
    let save_every = checkpoint_dir
        .as_ref()
        .map_or(0, |_| args.save_every.unwrap_or(epoch));
    let eval_every = if args.metrics.is_some() { epoch } else { 0 };

    progress::install_interrupt_handler()?;
    let progress = Progress::new(
        args.log_format,
        args.log_every,
        start,
        config.end_step,
        args.metrics.as_deref(),
    )?;
    session.config.hyper.log_every = progress.report_every();

    progress.println(&format!(
        "tandem: {} training on {} worker(s) [{}], batch {} per worker, steps {}..{}{}",
        config.mode.name(),
        config.workers,
        session.devices.join(", "),
        config.hyper.batch_size,
        start,
        config.end_step,
        resumed
            .map(|p| format!(", resumed from {}", p.display()))
            .unwrap_or_default()
    ));

    let mut totals = Totals::default();
    let mut last_checkpoint = None;
    while session.state.step < config.end_step {
        let to = next_stop(
            session.state.step,
            config.end_step,
            &[save_every, eval_every],
        );
        let report = session.advance(to, &progress)?;
        progress.end_segment(&report);
        totals.add(&report);
        let step = session.state.step;
        if let Some(dir) = &checkpoint_dir {
            if report.stopped || step == config.end_step || step.is_multiple_of(save_every) {
                let path = checkpoint::save_in_dir(
                    dir,
                    &session.state,
                    &session.layout(),
                    &config.to_metadata(),
                    args.keep,
                )?;
                last_checkpoint = Some(path);
            }
        }
        if eval_every > 0 && (step.is_multiple_of(eval_every) || step == config.end_step) {
            let validation =
                data::accuracy(&session.state.params, &session.state.ema, &data.validation)?;
            progress.record(json!({
                "kind": "eval",
                "step": step,
                "wall_time": progress.training_time().as_secs_f64(),
                "validation_accuracy_averaged": validation.averaged,
                "validation_accuracy_raw": validation.raw,
            }))?;
        }
        if report.stopped {
            progress.finish();
            match &last_checkpoint {
                Some(path) => println!(
                    "interrupted at step {step}: checkpoint written to {}",
                    path.display()
                ),
                None => println!("interrupted at step {step} (no --checkpoint-dir, nothing saved)"),
            }
            std::process::exit(130);
        }
    }
    progress.finish();
    summarise(&session, &totals, &data, last_checkpoint, wall)
}

/// Throughput and failures over all segments.
#[derive(Default)]
struct Totals {
    examples: u64,
    seconds: f64,
    staleness_sum: f64,
    staleness_max: u64,
    async_steps: u64,
    failures: Vec<String>,
}

impl Totals {
    fn add(&mut self, report: &tandem_strategy::TrainReport) {
        self.examples += report.examples;
        self.seconds += report.elapsed.as_secs_f64();
        if let Some(Staleness { mean, max }) = report.staleness {
            self.staleness_sum += mean * report.steps as f64;
            self.staleness_max = self.staleness_max.max(max);
            self.async_steps += report.steps;
        }
        self.failures
            .extend(report.failures.iter().map(ToString::to_string));
    }
}

fn summarise(
    session: &Session,
    totals: &Totals,
    data: &Data,
    checkpoint: Option<PathBuf>,
    wall: Instant,
) -> Result<()> {
    let state: &TrainState = &session.state;
    let validation = data::accuracy(&state.params, &state.ema, &data.validation)?;
    let test = data::accuracy(&state.params, &state.ema, &data.test)?;
    println!("== summary ==");
    println!("mode:                {}", session.config.mode.name());
    println!(
        "devices:             {} [{}]",
        session.devices.len(),
        session.devices.join(", ")
    );
    println!(
        "steps:               {} ({} examples this run)",
        state.step, totals.examples
    );
    println!(
        "examples/sec:        {:.0}",
        totals.examples as f64 / totals.seconds.max(1e-9)
    );
    if totals.async_steps > 0 {
        let mean = totals.staleness_sum / totals.async_steps as f64;
        println!(
            "staleness:           mean {mean:.2}, max {}",
            totals.staleness_max
        );
    }
    for failure in &totals.failures {
        println!("worker failure:      {failure}");
    }
    data::print_accuracy(validation, test);
    if let Some(path) = checkpoint {
        println!("checkpoint:          {}", path.display());
    }
    println!("training time:       {:.1} s", totals.seconds);
    println!("wall time:           {:.1} s", wall.elapsed().as_secs_f64());
    Ok(())
}
