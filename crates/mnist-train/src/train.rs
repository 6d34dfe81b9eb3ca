//! The default command: train, with checkpoints, resume, metrics and a summary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;
use tandem_core::{ParamSpan, TrainState};
use tandem_model::Mlp;
use tandem_pool::DeviceSpec;
use tandem_strategy::checkpoint::{self, Checkpoint, CheckpointDir};
use tandem_strategy::{Hyper, Observer, Staleness, Stall, StepReport};

use crate::cli::{TrainArgs, DEFAULT_EPOCHS};
use crate::data::{self, Data};
use crate::output;
use crate::progress::{self, Progress};
use crate::session::{gpu_count, initial_state, Mode, RunConfig, Session};

/// The configuration the flags describe for a fresh run on `workers` workers; flags not given
/// take [`Hyper::default`]'s values.
pub fn config_from_args(
    args: &TrainArgs,
    workers: usize,
    training_examples: usize,
) -> Result<RunConfig> {
    let defaults = Hyper::default();
    let mut config = RunConfig {
        mode: args.mode().unwrap_or(Mode::Sync),
        workers,
        hyper: Hyper {
            batch_size: args.batch_size.map_or(defaults.batch_size, |b| b as usize),
            learning_rate: args.learning_rate.unwrap_or(defaults.learning_rate),
            lr_decay: args.lr_decay.unwrap_or(defaults.lr_decay),
            weight_decay: args.weight_decay.unwrap_or(defaults.weight_decay),
            ema_decay: args.ema_decay.unwrap_or(defaults.ema_decay),
            seed: args.seed.unwrap_or(defaults.seed),
            log_every: args.log_every,
        },
        end_step: 0,
        save_every: None,
    };
    config.end_step = match end_step(args, &config, training_examples)? {
        Some(end) => end,
        None => config.steps_for_epochs(DEFAULT_EPOCHS, training_examples)?,
    };
    config.save_every = Some(
        args.save_every
            .unwrap_or_else(|| config.epochs(training_examples).steps_per_epoch()),
    );
    Ok(config)
}

/// The length `--steps` or `--epochs` asks for, if either was given.
fn end_step(args: &TrainArgs, config: &RunConfig, training_examples: usize) -> Result<Option<u64>> {
    match (args.steps, args.epochs) {
        (Some(steps), _) => Ok(Some(steps)),
        (None, Some(epochs)) => config.steps_for_epochs(epochs, training_examples).map(Some),
        (None, None) => Ok(None),
    }
}

/// The flags that a resumed run takes from its checkpoint, given on the command line with a
/// different value: each is named with both values.
fn conflicts_with_checkpoint(args: &TrainArgs, saved: &RunConfig) -> Vec<String> {
    fn text(value: Option<impl ToString>) -> Option<String> {
        value.map(|v| v.to_string())
    }
    let h = &saved.hyper;
    let flags = [
        (
            "--sync/--async",
            text(args.mode().map(Mode::name)),
            saved.mode.name().to_string(),
        ),
        (
            "--batch-size",
            text(args.batch_size),
            h.batch_size.to_string(),
        ),
        (
            "--lr",
            text(args.learning_rate),
            h.learning_rate.to_string(),
        ),
        ("--lr-decay", text(args.lr_decay), h.lr_decay.to_string()),
        (
            "--weight-decay",
            text(args.weight_decay),
            h.weight_decay.to_string(),
        ),
        ("--ema-decay", text(args.ema_decay), h.ema_decay.to_string()),
        ("--seed", text(args.seed), h.seed.to_string()),
    ];
    let mut conflicts: Vec<String> = flags
        .into_iter()
        .filter_map(|(flag, given, saved)| {
            given
                .filter(|g| *g != saved)
                .map(|g| format!("{flag} {g} (the run has {saved})"))
        })
        .collect();
    if let Some(stddev) = args.init_stddev {
        conflicts.push(format!(
            "--init-stddev {stddev} (the initial weights of a resumed run are long gone)"
        ));
    }
    conflicts
}

/// Warns when CPU workers outnumber the cores: they would only take turns.
fn warn_about_oversubscription(spec: &DeviceSpec) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if let DeviceSpec::Cpu(workers) = spec {
        if *workers > cores {
            output::warn(format!(
                "warning: {workers} CPU workers on {cores} core(s): workers will share cores, \
                 which is slower than one worker per core"
            ));
        }
    }
}

/// Refuses a directory that holds checkpoints when the run would start a new lineage in it.
fn refuse_other_runs(dir: &CheckpointDir) -> Result<()> {
    if let Some((step, path)) = dir.checkpoints()?.pop() {
        bail!(
            "{} already holds checkpoints of a run (the newest: {}, step {step}); continue that \
             run with --resume {}, or choose another --checkpoint-dir",
            dir.path().display(),
            path.display(),
            dir.path().display()
        );
    }
    Ok(())
}

/// Whether two paths name the same directory.
fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Checks a checkpoint as this binary's: its metadata a valid run configuration, its step
/// within the run.
pub fn check_checkpoint(checkpoint: &Checkpoint) -> Result<RunConfig> {
    let config = RunConfig::from_metadata(&checkpoint.metadata, 0)?;
    config.check_step(checkpoint.state.step)?;
    Ok(config)
}

/// Where the run starts: a fresh state, or the newest valid checkpoint of `--resume`.
fn starting_point(
    args: &TrainArgs,
    data: &Data,
    target: Option<&CheckpointDir>,
) -> Result<(Session, Option<PathBuf>)> {
    warn_about_oversubscription(&args.devices);
    let layout = Mlp::MNIST.layout();
    let Some(resume) = &args.resume else {
        if let Some(dir) = target {
            refuse_other_runs(dir)?;
        }
        let workers = args.devices.resolve(gpu_count)?.len();
        let config = config_from_args(args, workers, data.train.len())?;
        let state = initial_state(
            args.init_stddev.unwrap_or(crate::cli::DEFAULT_INIT_STDDEV),
            config.hyper.seed,
        );
        return Ok((
            Session::open(&args.devices, config, &data.train, state)?,
            None,
        ));
    };
    let accept = |checkpoint: &Checkpoint| {
        check_checkpoint(checkpoint)
            .map(|_| ())
            .map_err(|e| format!("{e:#}"))
    };
    let (path, saved, skipped) = match target {
        Some(dir) if same_dir(dir.path(), resume) => dir.load_newest(&layout, accept)?,
        _ => {
            if let Some(dir) = target {
                refuse_other_runs(dir)?;
            }
            checkpoint::load_newest(resume, &layout, accept)?
        }
    };
    for reason in skipped {
        output::warn(format!("warning: skipped damaged checkpoint {reason}"));
    }
    let mut config = RunConfig::from_metadata(&saved.metadata, args.log_every)
        .with_context(|| format!("{}", path.display()))?;
    let conflicts = conflicts_with_checkpoint(args, &config);
    if !conflicts.is_empty() {
        bail!(
            "--resume {} continues the run as it was configured, but the command line changes \
             it: {}; drop these flags, or start a fresh run in another directory",
            resume.display(),
            conflicts.join(", ")
        );
    }
    let saved_workers = config.workers;
    if let Some(end) = end_step(args, &config, data.train.len())? {
        config.end_step = end;
    }
    if let Some(every) = args.save_every {
        config.save_every = Some(every);
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
        .map(|&n| (step / n + 1).saturating_mul(n))
        .fold(end, u64::min)
}

/// Writes the run's checkpoints into its directory.
struct Saver<'run> {
    dir: &'run CheckpointDir,
    layout: Vec<ParamSpan>,
    metadata: BTreeMap<String, String>,
    identity: &'static [&'static str],
    keep: usize,
}

impl Saver<'_> {
    fn save(&self, state: &TrainState) -> Result<PathBuf> {
        self.dir
            .save(
                state,
                &self.layout,
                &self.metadata,
                self.keep,
                self.identity,
            )
            .with_context(|| {
                format!(
                    "cannot save the checkpoint of step {} in {} (the checkpoints already \
                     there are intact)",
                    state.step,
                    self.dir.path().display()
                )
            })
    }
}

/// The observer of a training run: progress and stop requests, and the watchdog's reports.
struct RunObserver<'run> {
    progress: &'run Progress,
    saver: Option<&'run Saver<'run>>,
    stall_timeout: Duration,
}

impl Observer for RunObserver<'_> {
    fn on_log(&self, report: &StepReport) {
        self.progress.on_log(report);
    }

    fn should_stop(&self) -> bool {
        self.progress.should_stop()
    }

    fn stall_timeout(&self) -> Option<Duration> {
        Some(self.stall_timeout)
    }

    fn on_stall(&self, stall: &Stall) {
        output::warn(format!(
            "warning: worker {} ({}) has made no progress for {} s{} (Ctrl-C saves the last \
             consistent checkpoint and ends the run)",
            stall.worker,
            stall.device,
            stall.idle.as_secs(),
            stall
                .step
                .map(|s| format!(", at step {s}"))
                .unwrap_or_default()
        ));
    }

    fn on_abandon(&self, stalled: &[Stall], state: Option<&TrainState>) {
        // The hung workers' threads cannot be joined, so the process ends here, after saving
        // what is consistent.
        self.progress.finish();
        output::warn(abandon(self.saver, stalled, state));
        std::process::exit(130);
    }
}

/// Saves what a run given up on its hung workers can keep, and says so.
fn abandon(saver: Option<&Saver<'_>>, stalled: &[Stall], state: Option<&TrainState>) -> String {
    let names: Vec<String> = stalled
        .iter()
        .map(|s| format!("worker {} ({})", s.worker, s.device))
        .collect();
    let saved = match (saver, state) {
        (Some(saver), Some(state)) => match saver.save(state) {
            Ok(path) => format!(
                "checkpoint of step {} written to {}",
                state.step,
                path.display()
            ),
            Err(e) => format!("cannot save the last checkpoint: {e:#}"),
        },
        (None, _) => "no --checkpoint-dir, nothing saved".to_string(),
        (Some(_), None) => {
            "no consistent state to save; the last checkpoint written stays".to_string()
        }
    };
    format!(
        "stopped while {} made no progress: {saved}",
        names.join(", ")
    )
}

pub fn run(args: &TrainArgs) -> Result<()> {
    let wall = Instant::now();
    // The checkpoint directory before anything else: taken for this run, created and
    // test-written, so a run that could not save fails now rather than after an epoch.
    if let Some(resume) = args.resume.as_ref().filter(|dir| !dir.is_dir()) {
        // Checked before the directory is opened, which would create it.
        bail!("--resume {}: no such directory", resume.display());
    }
    let target = args.checkpoint_dir.as_ref().or(args.resume.as_ref());
    let checkpoint_dir = target.map(|d| CheckpointDir::open(d)).transpose()?;
    let data = data::load(args.data_dir.as_deref())?;
    let (mut session, resumed) = starting_point(args, &data, checkpoint_dir.as_ref())?;
    let config = session.config.clone();
    let start = session.state.step;
    if start >= config.end_step {
        bail!(
            "nothing to train: the run is at step {start} of {}; pass --steps or --epochs to go further",
            config.end_step
        );
    }
    // Checkpoints (unless --save-every says otherwise) and evaluations once an epoch.
    let epoch = config.epochs(data.train.len()).steps_per_epoch();
    let saver = checkpoint_dir.as_ref().map(|dir| Saver {
        dir,
        layout: session.layout(),
        metadata: config.to_metadata(),
        identity: config.identity_keys(),
        keep: args.keep,
    });
    let save_every = match &saver {
        Some(_) => config.save_every.unwrap_or(epoch),
        None => 0,
    };
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
    let observer = RunObserver {
        progress: &progress,
        saver: saver.as_ref(),
        stall_timeout: Duration::from_secs(args.stall_timeout),
    };

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
        let report = session.advance(to, &observer)?;
        progress.end_segment(&report);
        totals.add(&report);
        let step = session.state.step;
        if let Some(saver) = &saver {
            if report.stopped || step == config.end_step || step.is_multiple_of(save_every) {
                last_checkpoint = Some(saver.save(&session.state)?);
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
            }));
        }
        if report.stopped {
            progress.finish();
            if let Some(status) = output::failure_status() {
                // stdout was closed under the run: it stopped as after a Ctrl-C, and ends as
                // a closed pipe would end it, with nobody left to read a summary.
                std::process::exit(status);
            }
            match &last_checkpoint {
                Some(path) => out!(
                    "interrupted at step {step}: checkpoint written to {}",
                    path.display()
                ),
                None => out!("interrupted at step {step} (no --checkpoint-dir, nothing saved)"),
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
    out!("== summary ==");
    out!("mode:                {}", session.config.mode.name());
    out!(
        "devices:             {} [{}]",
        session.devices.len(),
        session.devices.join(", ")
    );
    out!(
        "steps:               {} ({} examples this run)",
        state.step,
        totals.examples
    );
    out!(
        "examples/sec:        {:.0}",
        totals.examples as f64 / totals.seconds.max(1e-9)
    );
    if totals.async_steps > 0 {
        let mean = totals.staleness_sum / totals.async_steps as f64;
        out!(
            "staleness:           mean {mean:.2}, max {}",
            totals.staleness_max
        );
    }
    for failure in &totals.failures {
        out!("worker failure:      {failure} (out for the rest of the run)");
    }
    data::print_accuracy(validation, test);
    if let Some(path) = checkpoint {
        out!("checkpoint:          {}", path.display());
    }
    out!("training time:       {:.1} s", totals.seconds);
    out!("wall time:           {:.1} s", wall.elapsed().as_secs_f64());
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tandem_pool::Device;

    use super::*;

    #[test]
    fn a_run_given_up_on_a_hung_worker_saves_its_consistent_state() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::open(tmp.path()).unwrap();
        let config = RunConfig {
            mode: Mode::Sync,
            workers: 2,
            hyper: Hyper::default(),
            end_step: 100,
            save_every: Some(10),
        };
        let saver = Saver {
            dir: &dir,
            layout: Mlp::MNIST.layout(),
            metadata: config.to_metadata(),
            identity: config.identity_keys(),
            keep: 3,
        };
        let stalled = [Stall {
            worker: 1,
            device: Device::Cpu { worker: 1 },
            step: Some(8),
            idle: Duration::from_secs(400),
        }];
        let mut state = initial_state(0.1, 1);
        state.step = 7;

        let said = abandon(Some(&saver), &stalled, Some(&state));
        let (step, path) = dir.checkpoints().unwrap().pop().expect("a checkpoint");
        assert_eq!(step, 7);
        let loaded = checkpoint::load(&path, &Mlp::MNIST.layout()).unwrap();
        assert_eq!(loaded.state, state);
        assert!(
            said.starts_with("stopped while worker 1 (cpu:1) made no progress"),
            "{said}"
        );
        assert!(
            said.contains(&format!("step 7 written to {}", path.display())),
            "{said}"
        );

        let said = abandon(Some(&saver), &stalled, None);
        assert!(said.contains("no consistent state"), "{said}");
        let said = abandon(None, &stalled, Some(&state));
        assert!(said.contains("nothing saved"), "{said}");
        assert_eq!(dir.checkpoints().unwrap().len(), 1);
    }
}
