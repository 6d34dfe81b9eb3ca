//! The run driver: opens replicas on devices, starts fresh or resumes, and trains a [`Plan`]
//! segment by segment with checkpoints, evaluations, progress and interruption.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use tandem_core::{ParamSpan, Replica, ReplicaError, TrainState};
use tandem_pool::{Device, DeviceSpec, GpuCount, WorkerPool};
use tandem_strategy::checkpoint::{self, Checkpoint, CheckpointDir};
use tandem_strategy::{
    asynchronous, sync, Batches, Observer, Staleness, Stall, StepReport, TrainReport,
};

use crate::config::{ModelId, RecordedOptimizer, RunConfig};
use crate::error::Conflict;
use crate::{output, Interrupt, Mode, Plan, Progress, RunError};

/// What the trainer needs of a model: its identity in checkpoints, its parameter layout, its
/// training set's size and a way to open a replica on a device.
pub trait Model {
    /// The replica it opens.
    type Replica: Replica;

    /// The format and model names recorded in its checkpoints.
    fn id(&self) -> ModelId;

    /// The parameter layout of its replicas.
    fn layout(&self) -> Vec<ParamSpan>;

    /// The number of training examples (what an epoch is).
    fn training_examples(&self) -> usize;

    /// Opens a replica on `device` for batches of `batch_size` examples.
    fn open(&self, device: &Device, batch_size: usize) -> Result<Self::Replica, ReplicaError>;
}

/// How long a fresh run trains, or how far a resumed one goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Length {
    /// Until this global step.
    Steps(u64),
    /// Until the first step by which this many passes over the training set are drawn.
    Epochs(u64),
}

/// A fresh run.
#[derive(Debug, Clone)]
pub struct Fresh<O> {
    /// Sync or async.
    pub mode: Mode,
    /// The optimiser.
    pub optimizer: O,
    /// Batch size and seed of the data order.
    pub batches: Batches,
    /// How long it trains.
    pub length: Length,
    /// Steps between checkpoints (`None`: once an epoch).
    pub save_every: Option<u64>,
    /// The initial parameters.
    pub params: Vec<f32>,
}

/// A setting given for a resumed run: accepted when it agrees with the run's checkpoint
/// metadata, an error naming it otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requested {
    /// The metadata key it sets, e.g. `learning_rate`.
    pub key: &'static str,
    /// How the user gave it, e.g. `--lr`.
    pub label: &'static str,
    /// Its value as metadata writes it.
    pub value: String,
}

/// A resumed run: from the newest valid checkpoint in `dir`, with the configuration it was
/// written with.
#[derive(Debug, Clone)]
pub struct Resume {
    /// The run's checkpoint directory.
    pub dir: PathBuf,
    /// Settings the user gave, which must agree with the run's.
    pub requested: Vec<Requested>,
    /// A new length (extends or shortens the run), if given.
    pub length: Option<Length>,
    /// A new checkpoint cadence, if given.
    pub save_every: Option<u64>,
}

impl Resume {
    /// A resume of the run in `dir` as it was configured, to its own end.
    pub fn from(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            requested: Vec::new(),
            length: None,
            save_every: None,
        }
    }
}

/// How a run starts.
#[derive(Debug, Clone)]
pub enum Start<O> {
    /// From initial parameters.
    Fresh(Fresh<O>),
    /// From a checkpoint.
    Resume(Resume),
}

/// Where a run's replicas live.
#[derive(Debug, Clone)]
pub struct Setup {
    /// One replica per device.
    pub devices: DeviceSpec,
    /// How many CUDA GPUs there are (asked only if `devices` needs it): the pool knows no CUDA.
    pub gpus: fn() -> GpuCount,
    /// The largest batch size a checkpoint may record.
    pub max_batch: u64,
}

impl Setup {
    /// Replicas on `devices`, in a build without CUDA (GPU specifications are refused), with
    /// batches of at most [`Setup::MAX_BATCH`].
    pub fn new(devices: DeviceSpec) -> Self {
        Self {
            devices,
            gpus: || GpuCount::NoCuda,
            max_batch: Self::MAX_BATCH,
        }
    }

    /// The largest batch [`Setup::new`] allows a checkpoint to record.
    pub const MAX_BATCH: u64 = 1 << 20;
}

/// The checkpoint directory a run writes into, held by it alone.
#[derive(Debug)]
pub struct Checkpoints {
    dir: CheckpointDir,
    keep: usize,
}

impl Checkpoints {
    /// Takes the directory a run writes into: `save_to`, else `resume`; `None` when neither
    /// is given. Called before anything else (before loading data), so that a run that could
    /// not save fails at once: the directory is created, locked and test-written. Checks
    /// first that `resume` exists (opening would create it). `keep`: how many of the run's
    /// checkpoints to keep (0: all).
    pub fn take(
        save_to: Option<&Path>,
        resume: Option<&Path>,
        keep: usize,
    ) -> Result<Option<Self>, RunError> {
        if let Some(resume) = resume.filter(|dir| !dir.is_dir()) {
            return Err(RunError::NoResumeDir(resume.to_owned()));
        }
        save_to
            .or(resume)
            .map(|dir| {
                Ok(Self {
                    dir: CheckpointDir::open(dir)?,
                    keep,
                })
            })
            .transpose()
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Refuses a directory that holds checkpoints when the run would start a new lineage in it.
    fn refuse_other_runs(&self) -> Result<(), RunError> {
        match self.dir.checkpoints()?.pop() {
            Some((step, newest)) => Err(RunError::OtherRun {
                dir: self.dir.path().to_owned(),
                newest,
                step,
            }),
            None => Ok(()),
        }
    }
}

/// Checks a checkpoint as one of `model`'s runs with optimiser `O`: its metadata a valid run
/// configuration, its step within the run, its optimiser state the optimiser's.
pub fn check_checkpoint<O: RecordedOptimizer>(
    checkpoint: &Checkpoint,
    model: &ModelId,
    max_batch: u64,
) -> Result<RunConfig<O>, String> {
    let config = RunConfig::<O>::from_metadata(&checkpoint.metadata, model, max_batch)?;
    config.check_step(checkpoint.state.step)?;
    if !checkpoint.state.fits(&config.optimizer) {
        return Err(format!(
            "its optimiser state is not the optimiser's ({})",
            config.optimizer.state_names().join(", ")
        ));
    }
    Ok(config)
}

/// How a run is watched: what it shows, what stops it, what happens to hung workers.
pub struct Watch<'a> {
    /// The bar or plain lines and the metrics file (`None`: nothing shown).
    pub progress: Option<&'a Progress>,
    /// How often the strategy reports steps when there is no `progress` (0: never); losses
    /// are averaged over the reported steps of each segment.
    pub log_every: u64,
    /// Stops the run cleanly after the current step, with a checkpoint.
    pub interrupt: &'a Interrupt,
    /// How long a worker may go without finishing a step before it is reported as stalled.
    pub stall_timeout: Option<Duration>,
    /// Called when a stop cannot be honoured because workers hang (their threads cannot be
    /// stopped), after the last consistent state was saved, with what happened; typically
    /// prints it and ends the process. `None`: the message is printed and the run waits.
    pub on_abandon: Option<fn(&str) -> !>,
}

impl<'a> Watch<'a> {
    /// Nothing shown, no stall watch; `interrupt` still stops the run.
    pub fn quiet(interrupt: &'a Interrupt) -> Self {
        Self {
            progress: None,
            log_every: 0,
            interrupt,
            stall_timeout: None,
            on_abandon: None,
        }
    }
}

/// One finished segment, as the evaluation hook sees it.
pub struct Segment<'a> {
    /// The state at the end of the segment.
    pub state: &'a TrainState,
    /// The segment's report.
    pub report: &'a TrainReport,
    /// Mean of the losses the strategy reported during the segment, if it reported any.
    pub mean_loss: Option<f64>,
    /// The run's totals so far, this segment included.
    pub totals: &'a Totals,
}

/// Why an evaluation hook failed: any error.
pub type EvaluateError = Box<dyn std::error::Error + Send + Sync>;

/// Throughput and failures over all segments of a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    /// Examples trained on, by all workers.
    pub examples: u64,
    /// Training time (evaluation and checkpoints excluded), in seconds.
    pub seconds: f64,
    staleness_sum: f64,
    staleness_max: u64,
    async_steps: u64,
    /// Workers that failed while the others carried on (asynchronous).
    pub failures: Vec<String>,
}

impl Totals {
    fn add(&mut self, report: &TrainReport) {
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

    /// Examples per second of training time.
    pub fn examples_per_sec(&self) -> f64 {
        self.examples as f64 / self.seconds.max(1e-9)
    }

    /// Staleness over every asynchronous update (`None` for synchronous runs).
    pub fn staleness(&self) -> Option<Staleness> {
        (self.async_steps > 0).then(|| Staleness {
            mean: self.staleness_sum / self.async_steps as f64,
            max: self.staleness_max,
        })
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Over all segments.
    pub totals: Totals,
    /// The last checkpoint written, if any.
    pub last_checkpoint: Option<PathBuf>,
    /// Whether it stopped early (interrupted, or stdout closed), with a checkpoint if it has
    /// a directory.
    pub stopped: bool,
}

/// A run: its configuration, one replica per device, and the state of record.
pub struct Trainer<M: Model, O> {
    model: M,
    /// What defines the run.
    pub config: RunConfig<O>,
    /// The state of record.
    pub state: TrainState,
    pool: WorkerPool<M::Replica>,
    checkpoints: Option<Checkpoints>,
    resumed_from: Option<PathBuf>,
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

/// Whether two paths name the same directory.
fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

impl<M: Model, O: RecordedOptimizer> Trainer<M, O> {
    /// Starts a run of `model` on `setup`'s devices: fresh, or resumed from the newest valid
    /// checkpoint of [`Resume::dir`] (damaged ones are skipped with a warning). It writes
    /// checkpoints into `checkpoints`; a fresh run refuses a directory that holds a run's
    /// checkpoints, and so does a resume into another directory than its own.
    pub fn open(
        model: M,
        start: Start<O>,
        setup: &Setup,
        checkpoints: Option<Checkpoints>,
    ) -> Result<Self, RunError> {
        warn_about_oversubscription(&setup.devices);
        let devices = setup
            .devices
            .resolve_noting(setup.gpus, |note| output::warn(format!("warning: {note}")))?;
        let examples = model.training_examples();
        let (config, state, resumed_from) = match start {
            Start::Fresh(fresh) => {
                if let Some(target) = &checkpoints {
                    target.refuse_other_runs()?;
                }
                let mut config = RunConfig {
                    mode: fresh.mode,
                    workers: devices.len(),
                    optimizer: fresh.optimizer,
                    batches: fresh.batches,
                    end_step: 0,
                    save_every: fresh.save_every,
                };
                config.end_step = end_step(&config, fresh.length, examples)?;
                let epoch = config.epochs(examples).steps_per_epoch();
                config.save_every = Some(config.save_every.unwrap_or(epoch));
                let state = TrainState::new(fresh.params, &config.optimizer);
                (config, state, None)
            }
            Start::Resume(resume) => {
                let (path, config, state) =
                    resume_from(&model, &resume, setup, checkpoints.as_ref(), devices.len())?;
                (config, state, Some(path))
            }
        };
        let batch = config.batches.batch_size;
        let pool = WorkerPool::new(devices, |device| {
            model
                .open(device, batch)
                .map_err(|source| RunError::Replica {
                    device: device.to_string(),
                    source,
                })
        })?;
        Ok(Self {
            model,
            config,
            state,
            pool,
            checkpoints,
            resumed_from,
        })
    }

    /// The devices, one replica each, as `cpu:0`, `cuda:1`...
    pub fn device_names(&self) -> Vec<String> {
        self.pool.devices().iter().map(Device::to_string).collect()
    }

    /// The checkpoint the run resumed from, if it did.
    pub fn resumed_from(&self) -> Option<&Path> {
        self.resumed_from.as_deref()
    }

    /// The run's plan: to its end step, with a checkpoint at its cadence (when it has a
    /// checkpoint directory) and an evaluation every `evaluate_every` steps (0: none).
    pub fn plan(&self, evaluate_every: u64) -> Plan {
        let epoch = self
            .config
            .epochs(self.model.training_examples())
            .steps_per_epoch();
        Plan {
            end_step: self.config.end_step,
            save_every: match self.checkpoints {
                Some(_) => self.config.save_every.unwrap_or(epoch),
                None => 0,
            },
            evaluate_every,
            evaluate_at: Vec::new(),
        }
    }

    /// Trains `plan` segment by segment: a checkpoint where the plan says (and on a stop), and
    /// `evaluate` where it says. Returns when the plan's end is reached or the run stops
    /// early (interrupt, closed stdout), with a checkpoint.
    pub fn train(
        &mut self,
        plan: &Plan,
        watch: &Watch<'_>,
        evaluate: &mut dyn FnMut(&Segment<'_>) -> Result<(), EvaluateError>,
    ) -> Result<Summary, RunError> {
        let start = self.state.step;
        if start >= plan.end_step {
            return Err(RunError::NothingToTrain {
                step: start,
                end: plan.end_step,
            });
        }
        let saver = self.checkpoints.as_ref().map(|checkpoints| Saver {
            checkpoints,
            layout: self.model.layout(),
            metadata: self.config.to_metadata(&self.model.id()),
            identity: self.config.identity_keys(),
        });
        let observer = RunObserver {
            watch,
            log_every: watch
                .progress
                .map_or(watch.log_every, Progress::report_every),
            losses: Mutex::new((0.0, 0)),
            saver: saver.as_ref(),
        };
        let mut summary = Summary {
            totals: Totals::default(),
            last_checkpoint: None,
            stopped: false,
        };
        while self.state.step < plan.end_step {
            let to = plan.next_stop(self.state.step);
            let report = advance(&mut self.pool, &mut self.state, &self.config, to, &observer)?;
            if let Some(progress) = watch.progress {
                progress.end_segment(&report);
            }
            summary.totals.add(&report);
            let step = self.state.step;
            if let Some(saver) = &saver {
                if plan.saves_at(step, report.stopped) {
                    summary.last_checkpoint = Some(saver.save(&self.state)?);
                }
            }
            if plan.evaluates_at(step) {
                let segment = Segment {
                    state: &self.state,
                    report: &report,
                    mean_loss: observer.take_mean_loss(),
                    totals: &summary.totals,
                };
                evaluate(&segment).map_err(|source| RunError::Evaluate { step, source })?;
            }
            if report.stopped {
                summary.stopped = true;
                break;
            }
        }
        Ok(summary)
    }
}

/// The end step `length` gives `config` on `examples` training examples.
fn end_step<O: RecordedOptimizer>(
    config: &RunConfig<O>,
    length: Length,
    examples: usize,
) -> Result<u64, RunError> {
    match length {
        Length::Steps(steps) => Ok(steps),
        Length::Epochs(epochs) => config.steps_for_epochs(epochs, examples),
    }
}

/// The configuration and state a resume continues from, and the checkpoint they come from.
fn resume_from<M: Model, O: RecordedOptimizer>(
    model: &M,
    resume: &Resume,
    setup: &Setup,
    target: Option<&Checkpoints>,
    workers: usize,
) -> Result<(PathBuf, RunConfig<O>, TrainState), RunError> {
    let id = model.id();
    let layout = model.layout();
    let accept = |checkpoint: &Checkpoint| {
        check_checkpoint::<O>(checkpoint, &id, setup.max_batch).map(|_| ())
    };
    let (path, saved, skipped) = match target {
        Some(own) if same_dir(own.path(), &resume.dir) => own.dir.load_newest(&layout, accept)?,
        _ => {
            if let Some(other) = target {
                other.refuse_other_runs()?;
            }
            checkpoint::load_newest(&resume.dir, &layout, accept)?
        }
    };
    for reason in skipped {
        output::warn(format!("warning: skipped damaged checkpoint {reason}"));
    }
    let mut config = check_checkpoint::<O>(&saved, &id, setup.max_batch)
        .map_err(|reason| RunError::Config(format!("{}: {reason}", path.display())))?;
    let conflicts: Vec<Conflict> = resume
        .requested
        .iter()
        .filter_map(|r| {
            let saved = saved.metadata.get(r.key).cloned().unwrap_or_default();
            (r.value != saved).then(|| Conflict {
                label: r.label.to_string(),
                given: r.value.clone(),
                saved,
            })
        })
        .collect();
    if !conflicts.is_empty() {
        return Err(RunError::Conflicts {
            dir: resume.dir.clone(),
            conflicts,
        });
    }
    if config.mode == Mode::Sync && config.workers != workers {
        return Err(RunError::SyncWorkers {
            checkpoint: path,
            saved: config.workers,
            now: workers,
        });
    }
    config.workers = workers;
    if let Some(length) = resume.length {
        config.end_step = end_step(&config, length, model.training_examples())?;
    }
    if let Some(every) = resume.save_every {
        config.save_every = Some(every);
    }
    Ok((path, config, saved.state))
}

/// Trains until global step `to` (or until `observer` stops it) in the run's mode.
fn advance<R: Replica, O: RecordedOptimizer>(
    pool: &mut WorkerPool<R>,
    state: &mut TrainState,
    config: &RunConfig<O>,
    to: u64,
    observer: &dyn Observer,
) -> Result<TrainReport, RunError> {
    let train = match config.mode {
        Mode::Sync => sync::train::<R, O>,
        Mode::Async => asynchronous::train::<R, O>,
    };
    Ok(train(
        pool,
        state,
        &config.optimizer,
        &config.batches,
        to,
        observer,
    )?)
}

/// Writes a run's checkpoints into its directory.
struct Saver<'run> {
    checkpoints: &'run Checkpoints,
    layout: Vec<ParamSpan>,
    metadata: BTreeMap<String, String>,
    identity: Vec<&'static str>,
}

impl Saver<'_> {
    fn save(&self, state: &TrainState) -> Result<PathBuf, RunError> {
        let Checkpoints { dir, keep } = self.checkpoints;
        dir.save(state, &self.layout, &self.metadata, *keep, &self.identity)
            .map_err(|source| RunError::Save {
                step: state.step,
                dir: dir.path().to_owned(),
                source,
            })
    }
}

/// The strategy's observer during [`Trainer::train`]: progress, losses, stop requests and the
/// watchdog's reports.
struct RunObserver<'run> {
    watch: &'run Watch<'run>,
    log_every: u64,
    /// Sum and count of the losses reported in the current segment.
    losses: Mutex<(f64, u64)>,
    saver: Option<&'run Saver<'run>>,
}

impl RunObserver<'_> {
    /// The mean loss reported since the last call, if any.
    fn take_mean_loss(&self) -> Option<f64> {
        let mut guard = self.losses.lock().unwrap_or_else(|p| p.into_inner());
        let (sum, count) = std::mem::take(&mut *guard);
        (count > 0).then(|| sum / count as f64)
    }
}

impl Observer for RunObserver<'_> {
    fn log_every(&self) -> u64 {
        self.log_every
    }

    fn on_log(&self, report: &StepReport) {
        {
            let mut guard = self.losses.lock().unwrap_or_else(|p| p.into_inner());
            guard.0 += f64::from(report.loss);
            guard.1 += 1;
        }
        if let Some(progress) = self.watch.progress {
            progress.on_log(report);
        }
    }

    fn should_stop(&self) -> bool {
        self.watch.interrupt.requested() || output::closed()
    }

    fn stall_timeout(&self) -> Option<Duration> {
        self.watch.stall_timeout
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
        if let Some(progress) = self.watch.progress {
            progress.finish();
        }
        let message = abandon(self.saver, stalled, state);
        match self.watch.on_abandon {
            Some(end) => end(&message),
            None => output::warn(message),
        }
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
            Err(e) => format!("cannot save the last checkpoint: {e}"),
        },
        (None, _) => "no checkpoint directory, nothing saved".to_string(),
        (Some(_), None) => {
            "no consistent state to save; the last checkpoint written stays".to_string()
        }
    };
    format!(
        "stopped while {} made no progress: {saved}",
        names.join(", ")
    )
}
