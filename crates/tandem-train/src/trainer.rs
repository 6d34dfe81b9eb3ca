//! The run driver: opens replicas on devices, starts fresh or resumes, and trains a [`Plan`]
//! segment by segment with checkpoints, evaluations, progress and interruption.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use tandem_checkpoint::{self as checkpoint, Checkpoint, CheckpointDir};
use tandem_collectives::{Collectives, SharedTransport};
use tandem_core::{LossScaler, ParamSpan, Precision, Replica, ReplicaError, TrainState};
use tandem_pool::{Device, DeviceSpec, GpuCount, WorkerPool};
use tandem_strategy::{
    AsyncRule, BatchScaling, Batches, Exchange, Observer, SilentRank, Staleness, StalenessBound,
    Stall, StepReport, TrainReport, Warmup,
};

use crate::config::{ModelId, RunConfig, MAX_WORKERS, PRECISION};
use crate::error::{Conflict, NotThisRun};
use crate::{output, Interrupt, Mode, Plan, Progress, RunError};
use tandem_optim::RecordedOptimizer;

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

    /// Opens a replica on `device` for batches of `batch_size` examples, computing in
    /// `precision` (a model that computes only in `f32` refuses the others with an error
    /// saying so).
    fn open(
        &self,
        device: &Device,
        batch_size: usize,
        precision: Precision,
    ) -> Result<Self::Replica, ReplicaError>;
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
    /// What asynchronous updates do about staleness (a synchronous run ignores it).
    pub async_rule: AsyncRule,
    /// How long an asynchronous run trains on one worker first (a synchronous run ignores it).
    pub async_warmup: Warmup,
    /// How stale an asynchronous update may be (a synchronous run ignores it).
    pub async_bound: StalenessBound,
    /// How a synchronous run's learning rate follows its global batch (an asynchronous run
    /// ignores it).
    pub lr_scaling: BatchScaling,
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
    /// What the replicas compute in (the parameters of record stay `f32`).
    pub precision: Precision,
    /// What a synchronous run across processes sends its gradients in.
    pub exchange: Exchange,
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
    /// A new exchange between workers, if given: a transport's choice, which a run resumed on
    /// other devices may need to change (a bf16 exchange between GPU replicas resumed on CPU
    /// workers, which exchange nothing).
    pub exchange: Option<Exchange>,
}

impl Resume {
    /// A resume of the run in `dir` as it was configured, to its own end.
    pub fn from(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            requested: Vec::new(),
            length: None,
            save_every: None,
            exchange: None,
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
    /// The processes of a run that spans several (`None`, or one rank: this process alone). An
    /// asynchronous run needs a transport with messages ([`SharedTransport::Ranks`]).
    /// Every rank opens the trainer with the same arguments and as many devices; rank 0 alone
    /// reads the checkpoint it resumes from and should be the only one given a checkpoint
    /// directory, and sends every rank the run's configuration and state.
    pub ranks: Option<SharedTransport>,
}

impl Setup {
    /// Replicas on `devices`, in a build without CUDA (GPU specifications are refused), with
    /// batches of at most [`Setup::MAX_BATCH`].
    pub fn new(devices: DeviceSpec) -> Self {
        Self {
            devices,
            gpus: || GpuCount::NoCuda,
            max_batch: Self::MAX_BATCH,
            ranks: None,
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
) -> Result<RunConfig<O>, NotThisRun> {
    let config = RunConfig::<O>::from_metadata(&checkpoint.metadata, model, max_batch)?;
    let step = checkpoint.state.step;
    if step > config.end_step {
        return Err(NotThisRun::PastItsEnd {
            step,
            end: config.end_step,
        });
    }
    if !checkpoint.state.fits(&config.optimizer) {
        return Err(NotThisRun::OtherState {
            expected: config.optimizer.state_names().join(", "),
        });
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
    dropped: u64,
    /// Workers that failed while the others carried on (asynchronous).
    pub failures: Vec<String>,
    /// The loss scaling of this process's replicas, where they scale (`f16`).
    pub loss_scaling: Option<LossScaling>,
    /// Steps trained.
    pub steps: u64,
    /// Across processes: the bytes this rank's collectives sent to the others while training
    /// ([`tandem_collectives::Collectives::sent_bytes`]).
    pub sent_bytes: Option<u64>,
}

/// The loss scaling of a run's replicas (this process's), since they were opened.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossScaling {
    /// Passes thrown away (and computed again at half the scale) because their gradients were
    /// not finite, over every replica.
    pub overflows: u64,
    /// The smallest replica's scale now.
    pub smallest: f32,
    /// The largest replica's scale now.
    pub largest: f32,
}

impl LossScaling {
    /// Over `scalers`, one a replica; `None` where none scales.
    pub fn over(scalers: impl IntoIterator<Item = LossScaler>) -> Option<Self> {
        scalers.into_iter().fold(None, |so_far, scaler| {
            let (overflows, scale) = (scaler.overflows(), scaler.scale());
            Some(match so_far {
                None => LossScaling {
                    overflows,
                    smallest: scale,
                    largest: scale,
                },
                Some(s) => LossScaling {
                    overflows: s.overflows + overflows,
                    smallest: s.smallest.min(scale),
                    largest: s.largest.max(scale),
                },
            })
        })
    }
}

impl Totals {
    fn add(&mut self, report: &TrainReport) {
        self.examples += report.examples;
        self.steps += report.steps;
        self.seconds += report.elapsed.as_secs_f64();
        if let Some(Staleness { mean, max, dropped }) = report.staleness {
            self.staleness_sum += mean * report.steps as f64;
            self.staleness_max = self.staleness_max.max(max);
            self.async_steps += report.steps;
            self.dropped += dropped;
        }
        self.failures
            .extend(report.failures.iter().map(ToString::to_string));
    }

    /// Across processes: the bytes this rank sent the others per step trained.
    pub fn sent_per_step(&self) -> Option<f64> {
        self.sent_bytes
            .map(|bytes| bytes as f64 / self.steps.max(1) as f64)
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
            dropped: self.dropped,
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
    /// The run's devices in this process, one per worker (the pool's, unless it batches).
    devices: Vec<Device>,
    /// Workers each replica of the pool computes ([`tandem_strategy::sync::replicas_for`]):
    /// 1, or the replicas a synchronous run has on each of its GPUs.
    shards: usize,
    checkpoints: Option<Checkpoints>,
    resumed_from: Option<PathBuf>,
    /// The run's processes, when there are several.
    ranks: Option<SharedTransport>,
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
    ///
    /// **Whatever the caller gives, a run that opens writes only checkpoints that its resume
    /// accepts**: the run's settings go through the checks a resume applies to a checkpoint
    /// (an error names the setting), and [`train`](Self::train) refuses a [`Plan`] past the
    /// run's end step.
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
        let ranks = setup.ranks.clone().filter(|r| r.ranks() > 1);
        // The run's workers: every rank's.
        let per_rank = devices.len();
        let rank_count = ranks.as_ref().map_or(1, |r| r.ranks());
        let workers = per_rank.saturating_mul(rank_count);
        if workers > MAX_WORKERS {
            return Err(RunError::TooManyWorkers {
                per_rank,
                ranks: rank_count,
                workers,
            });
        }
        if let Some(ranks) = ranks.as_ref().filter(|r| r.rank() != 0) {
            let (config, state) = from_rank0(&model, setup, &**ranks)?;
            return Self::with_pool(
                model,
                config,
                state,
                devices,
                checkpoints,
                None,
                Some(ranks.clone()),
            );
        }
        let (config, state, resumed_from) = match start {
            Start::Fresh(fresh) => {
                if let Some(target) = &checkpoints {
                    target.refuse_other_runs()?;
                }
                let mut config = RunConfig {
                    mode: fresh.mode,
                    async_rule: fresh.async_rule,
                    async_warmup: fresh.async_warmup,
                    async_bound: fresh.async_bound,
                    lr_scaling: fresh.lr_scaling,
                    workers,
                    optimizer: fresh.optimizer,
                    batches: fresh.batches,
                    end_step: 0,
                    save_every: fresh.save_every,
                    precision: fresh.precision,
                    exchange: fresh.exchange,
                };
                config.end_step = end_step(&config, fresh.length, examples)?;
                let epoch = config.epochs(examples).steps_per_epoch();
                config.save_every = Some(config.save_every.unwrap_or(epoch));
                let state = TrainState::new(fresh.params, &config.optimizer);
                (config, state, None)
            }
            Start::Resume(resume) => {
                let (path, config, state) = resume_from(
                    &model,
                    &resume,
                    setup,
                    checkpoints.as_ref(),
                    (workers, rank_count),
                )?;
                (config, state, Some(path))
            }
        };
        let mut bytes = as_a_resume_reads_it(&model, &config, &state, setup.max_batch)?;
        if let Some(ranks) = &ranks {
            ranks.broadcast(&mut bytes);
        }
        Self::with_pool(
            model,
            config,
            state,
            devices,
            checkpoints,
            resumed_from,
            ranks,
        )
    }

    /// The trainer of a run whose configuration and state are settled: a replica on each of
    /// `devices`.
    fn with_pool(
        model: M,
        config: RunConfig<O>,
        state: TrainState,
        devices: Vec<Device>,
        checkpoints: Option<Checkpoints>,
        resumed_from: Option<PathBuf>,
        ranks: Option<SharedTransport>,
    ) -> Result<Self, RunError> {
        let (batch, precision) = (config.batches.batch_size, config.precision);
        // Across processes every rank keeps a replica a worker (the collectives count them),
        // and no replica's batch exceeds what a run may record (a product's rows are bounded).
        let merged = tandem_strategy::sync::replicas_for(&config.strategy(), &devices);
        let fits = (batch as u64).saturating_mul(merged.1 as u64) <= Setup::MAX_BATCH;
        let (replicas, shards) = match ranks.is_none() && fits {
            true => merged,
            false => (devices.clone(), 1),
        };
        let pool = WorkerPool::new(replicas, |device| {
            model
                .open(device, batch.saturating_mul(shards), precision)
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
            devices,
            shards,
            checkpoints,
            resumed_from,
            ranks,
        })
    }

    /// The devices of this process, one replica each.
    pub fn replica_devices(&self) -> &[Device] {
        self.pool.devices()
    }

    /// The run's devices in this process, one a worker, as `cpu:0`, `cuda:1`...
    pub fn device_names(&self) -> Vec<String> {
        self.devices.iter().map(Device::to_string).collect()
    }

    /// The checkpoint the run resumed from, if it did.
    pub fn resumed_from(&self) -> Option<&Path> {
        self.resumed_from.as_deref()
    }

    /// The run's devices: this process's, or every rank's (as many on each) across ranks.
    pub fn devices(&self) -> String {
        let mine = self.device_names().join(", ");
        match &self.ranks {
            Some(ranks) => format!("{} ranks x {mine}", ranks.ranks()),
            None => mine,
        }
    }

    /// Whether this process leads the run: alone, or rank 0 (which alone reads and writes
    /// checkpoints and reports).
    pub fn leads(&self) -> bool {
        self.ranks.as_ref().is_none_or(|r| r.rank() == 0)
    }

    /// The run's epochs: passes over the model's training examples, in steps.
    pub fn epochs(&self) -> tandem_strategy::Epochs {
        self.config.epochs(self.model.training_examples())
    }

    /// The run's plan: to its end step, with a checkpoint at its cadence (when it has a
    /// checkpoint directory) and an evaluation every `evaluate_every` steps (0: none).
    pub fn plan(&self, evaluate_every: u64) -> Plan {
        let epoch = self.epochs().steps_per_epoch();
        Plan {
            end_step: self.config.end_step,
            // Across ranks every rank stops where rank 0 saves: the segments are collective.
            save_every: match (&self.checkpoints, &self.ranks) {
                (None, None) => 0,
                _ => self.config.save_every.unwrap_or(epoch),
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
        // Across ranks the segments are collective: every rank trains rank 0's plan, whatever
        // its own caller planned (flags given to one rank only, such as --metrics).
        let plan = &match self.ranks.as_deref() {
            Some(ranks) => rank0_plan(ranks, plan),
            None => plan.clone(),
        };
        let start = self.state.step;
        if plan.end_step > self.config.end_step {
            // Its checkpoints would lie past the end their metadata records.
            return Err(RunError::PlanPastEnd {
                plan: plan.end_step,
                end: self.config.end_step,
            });
        }
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
            rank: self.ranks.as_ref().map(|r| (r.rank(), r.ranks())),
        };
        let mut summary = Summary {
            totals: Totals::default(),
            last_checkpoint: None,
            stopped: false,
        };
        while self.state.step < plan.end_step {
            let to = plan.next_stop(self.state.step);
            let sent_before = self.ranks.as_ref().map(|r| r.sent_bytes());
            let report = advance(
                self.ranks.as_ref(),
                (&mut self.pool, self.shards),
                &mut self.state,
                &self.config,
                to,
                &observer,
            )?;
            if let Some(progress) = watch.progress {
                progress.end_segment(&report);
            }
            summary.totals.add(&report);
            if let (Some(ranks), Some(before)) = (&self.ranks, sent_before) {
                let sent = ranks.sent_bytes() - before;
                summary.totals.sent_bytes = Some(summary.totals.sent_bytes.unwrap_or(0) + sent);
            }
            summary.totals.loss_scaling = LossScaling::over(
                self.pool
                    .replicas()
                    .iter()
                    .filter_map(Replica::loss_scaling),
            );
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
    (workers, ranks): (usize, usize),
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
    let mut config = check_checkpoint::<O>(&saved, &id, setup.max_batch).map_err(|source| {
        RunError::NotARun {
            what: path.clone(),
            source,
        }
    })?;
    let mut recorded = config.to_metadata(&id);
    // Its precision as given on the command line, `f32` included.
    recorded.insert(PRECISION.to_owned(), config.precision.to_string());
    recorded.extend(
        config
            .optimizer
            .settings()
            .into_iter()
            .map(|(key, value)| (key.to_owned(), value)),
    );
    let conflicts: Vec<Conflict> = resume
        .requested
        .iter()
        .filter_map(|r| {
            // As the run's configuration writes it (a key older checkpoints lack has its value).
            let saved = recorded.get(r.key).cloned().unwrap_or_default();
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
            ranks,
        });
    }
    config.workers = workers;
    if let Some(length) = resume.length {
        config.end_step = end_step(&config, length, model.training_examples())?;
    }
    if let Some(every) = resume.save_every {
        config.save_every = Some(every);
    }
    if let Some(exchange) = resume.exchange {
        config.exchange = exchange;
    }
    Ok((path, config, saved.state))
}

/// Trains until global step `to` (or until `observer` stops it) in the run's mode, on `pool`,
/// whose replicas compute `shards` workers' batches each
/// ([`tandem_strategy::sync::replicas_for`]).
fn advance<R: Replica, O: RecordedOptimizer>(
    ranks: Option<&SharedTransport>,
    (pool, shards): (&mut WorkerPool<R>, usize),
    state: &mut TrainState,
    config: &RunConfig<O>,
    to: u64,
    observer: &dyn Observer,
) -> Result<TrainReport, RunError> {
    let optimizer = &config.optimizer;
    let batches = &Batches {
        batch_size: config.batches.batch_size * shards,
        ..config.batches
    };
    if let Some(ranks) = ranks {
        return Ok(tandem_strategy::train_across(
            ranks.transport(),
            config.strategy(),
            pool,
            state,
            optimizer,
            batches,
            to,
            observer,
        )?);
    }
    Ok(tandem_strategy::train(
        config.strategy(),
        pool,
        state,
        optimizer,
        batches,
        to,
        observer,
    )?)
}

/// Checks a run's configuration and state as a resume of its checkpoints will: writes them
/// as a checkpoint's bytes and reads those back through [`check_checkpoint`]. Every setting a
/// caller gives `open`, fresh or resumed, goes through this one set of checks, so that no run
/// writes checkpoints that its own resume refuses or skips. Returns the bytes (what rank 0
/// sends the other ranks).
fn as_a_resume_reads_it<M: Model, O: RecordedOptimizer>(
    model: &M,
    config: &RunConfig<O>,
    state: &TrainState,
    max_batch: u64,
) -> Result<Vec<u8>, RunError> {
    if state.step > config.end_step {
        return Err(RunError::NothingToTrain {
            step: state.step,
            end: config.end_step,
        });
    }
    let invalid = |e: Box<dyn std::error::Error + Send + Sync>| RunError::Unresumable(e);
    let metadata = config.to_metadata(&model.id());
    let bytes =
        checkpoint::to_bytes(state, &model.layout(), &metadata).map_err(|e| invalid(e.into()))?;
    let read = checkpoint::from_bytes(&bytes, Path::new("the run's settings"), &model.layout())
        .map_err(|e| invalid(e.into()))?;
    check_checkpoint::<O>(&read, &model.id(), max_batch).map_err(|e| invalid(e.into()))?;
    Ok(bytes)
}

/// Rank 0's `plan`, on every rank (rank 0 sends its own).
fn rank0_plan(ranks: &dyn Collectives, plan: &Plan) -> Plan {
    let mut bytes: Vec<u8> = [plan.end_step, plan.save_every, plan.evaluate_every]
        .into_iter()
        .chain(plan.evaluate_at.iter().copied())
        .flat_map(u64::to_le_bytes)
        .collect();
    ranks.broadcast(&mut bytes);
    let mut words = bytes
        .chunks_exact(8)
        .map(|word| u64::from_le_bytes(word.try_into().unwrap_or_default()));
    let mut next = || words.next().unwrap_or_default();
    Plan {
        end_step: next(),
        save_every: next(),
        evaluate_every: next(),
        evaluate_at: words.collect(),
    }
}

/// Every rank but 0: the run's configuration and state as rank 0 sent them, checked like a
/// checkpoint read from a file.
fn from_rank0<M: Model, O: RecordedOptimizer>(
    model: &M,
    setup: &Setup,
    ranks: &dyn Collectives,
) -> Result<(RunConfig<O>, TrainState), RunError> {
    let mut bytes = Vec::new();
    ranks.broadcast(&mut bytes);
    let source = Path::new("the run rank 0 sent");
    let received = checkpoint::from_bytes(&bytes, source, &model.layout())?;
    let config =
        check_checkpoint::<O>(&received, &model.id(), setup.max_batch).map_err(|reason| {
            RunError::NotARun {
                what: source.to_owned(),
                source: reason,
            }
        })?;
    Ok((config, received.state))
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
    /// This process's rank and the run's ranks, when there are several.
    rank: Option<(usize, usize)>,
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
        output::warn(stall_message(stall, self.rank, self.saver.is_some()));
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

/// What a stall report says; across ranks it names this process's rank, and that a stalled
/// worker may only be waiting for another rank: on rank 0, the ranks it has not heard from.
/// What a Ctrl-C then does depends on whether the run `saves` checkpoints.
fn stall_message(stall: &Stall, rank: Option<(usize, usize)>, saves: bool) -> String {
    let (whose, why) = match rank {
        None => (String::new(), String::new()),
        Some((rank, ranks)) => (
            format!(" on rank {rank}"),
            match stall.silent_ranks.as_slice() {
                [] => format!(
                    "; its steps wait for all {ranks} ranks, so another rank that stopped or \
                     hangs stalls it too: look for a rank whose workers stalled first, or that \
                     is gone"
                ),
                silent => format!(
                    "; its steps wait for all {ranks} ranks, and {} given no sign of life: \
                     stopped, hung as a whole, or gone",
                    silent_names(silent)
                ),
            },
        ),
    };
    let ctrl_c = match saves {
        true => "Ctrl-C saves the last consistent checkpoint and ends the run",
        false => "Ctrl-C ends the run; it has no checkpoint directory, so nothing is saved",
    };
    format!(
        "warning: worker {} ({}){whose} has made no progress for {} s{}{why} ({ctrl_c})",
        stall.worker,
        stall.device,
        stall.idle.as_secs(),
        stall
            .step
            .map(|s| format!(", at step {s}"))
            .unwrap_or_default()
    )
}

/// "rank 1 (for 40 s, last at step 8) has" or "ranks 1 (...) and 2 (...) have".
fn silent_names(silent: &[SilentRank]) -> String {
    let names: Vec<String> = silent
        .iter()
        .map(|s| {
            let step = s
                .step
                .map(|s| format!(", last at step {s}"))
                .unwrap_or_default();
            format!("{} (for {} s{step})", s.rank, s.silence.as_secs())
        })
        .collect();
    match names.as_slice() {
        [one] => format!("rank {one} has"),
        [first @ .., last] => format!("ranks {} and {last} have", first.join(", ")),
        [] => String::new(),
    }
}

/// Saves what a run given up on its hung workers can keep, and says so.
fn abandon(saver: Option<&Saver<'_>>, stalled: &[Stall], state: Option<&TrainState>) -> String {
    let names: Vec<String> = stalled
        .iter()
        .map(|s| format!("worker {} ({})", s.worker, s.device))
        .collect();
    let waiting = match stalled.iter().find(|s| !s.silent_ranks.is_empty()) {
        Some(stall) => format!(
            ", waiting for ranks of which {} given no sign of life",
            silent_names(&stall.silent_ranks)
        ),
        None => String::new(),
    };
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
        "stopped while {} made no progress{waiting}: {saved}",
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tandem_optim::Sgd;

    use super::*;
    use crate::scalar::{fresh, Fit, ScalarModel, LAYOUT, SCALAR, SLOPE};
    use crate::MAX_STEPS;

    /// Opens a trainer on `workers` CPU workers with checkpoints in `dir` (resuming from it
    /// when `start` is a resume) and trains it to its end.
    fn run(
        start: Start<Sgd>,
        dir: &Path,
        workers: usize,
    ) -> Result<Trainer<ScalarModel, Sgd>, RunError> {
        let resume = matches!(start, Start::Resume(_)).then_some(dir);
        let checkpoints = Checkpoints::take(Some(dir), resume, 0)?;
        let setup = Setup::new(DeviceSpec::Cpu(workers));
        let mut trainer = Trainer::open(SCALAR, start, &setup, checkpoints)?;
        let interrupt = Interrupt::new();
        let plan = trainer.plan(0);
        trainer.train(&plan, &Watch::quiet(&interrupt), &mut |_| Ok(()))?;
        Ok(trainer)
    }

    fn file_name(step: u64) -> String {
        format!("step-{step:010}.safetensors")
    }

    /// The steps of the checkpoints in `dir` (read without taking the directory).
    fn steps_in(dir: &Path) -> Vec<u64> {
        let mut steps: Vec<u64> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|entry| {
                let name = entry.unwrap().file_name().into_string().unwrap();
                name.strip_prefix("step-")?
                    .strip_suffix(".safetensors")?
                    .parse()
                    .ok()
            })
            .collect();
        steps.sort();
        steps
    }

    /// One of `values`, at random.
    fn pick<T: Clone>(rng: &mut impl rand::Rng, values: &[T]) -> T {
        values[rng.random_range(0..values.len())].clone()
    }

    /// `usual` nine times in ten, else one of `unusual`: most runs have most settings right.
    fn mostly<T: Clone>(rng: &mut impl rand::Rng, usual: T, unusual: &[T]) -> T {
        match rng.random_bool(0.9) {
            true => usual,
            false => pick(rng, unusual),
        }
    }

    /// A plan of `trainer`'s at random: its own, or one a caller changed, past its end too;
    /// never more than 12 steps from `start`, so that an accepted run of 10^12 steps ends.
    fn random_plan(rng: &mut impl rand::Rng, trainer: &Trainer<ScalarModel, Sgd>) -> Plan {
        let own = trainer.plan(pick(rng, &[0, 1, 3]));
        let start = trainer.state.step;
        let end = pick(
            rng,
            &[
                own.end_step,
                own.end_step.saturating_add(1),
                start + 1,
                start + 30,
            ],
        );
        Plan {
            end_step: mostly(rng, end.min(start + 12), &[0, start]),
            save_every: pick(rng, &[own.save_every, 0, 1, 5, u64::MAX]),
            ..own
        }
    }

    /// Random runs through the library, fresh then resumed with random settings and plans:
    /// each either fails at `open` or `train`, or leaves checkpoints that a plain resume
    /// continues from the newest one, skipping none.
    #[test]
    fn whatever_a_caller_asks_the_checkpoints_it_writes_resume() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(26);
        let steps = [0, 1, 7, 30, MAX_STEPS, MAX_STEPS + 1, u64::MAX];
        let lengths: Vec<Length> = steps
            .iter()
            .map(|&n| Length::Steps(n))
            .chain([0, 1, 3, u64::MAX].map(Length::Epochs))
            .collect();
        let cadences = [
            None,
            Some(0),
            Some(1),
            Some(3),
            Some(MAX_STEPS + 1),
            Some(u64::MAX),
        ];
        let (mut trained, mut refused) = (0, 0);
        for case in 0..150 {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("run");
            let workers = pick(&mut rng, &[1, 2]);
            let start = Start::Fresh(Fresh {
                mode: pick(&mut rng, &[Mode::Sync, Mode::Async]),
                optimizer: Sgd {
                    learning_rate: mostly(&mut rng, 0.5, &[0.0, -1.0, f32::NAN, f32::INFINITY]),
                    lr_decay: mostly(&mut rng, 0.99, &[0.0, 1.0, 1.5]),
                    weight_decay: mostly(&mut rng, 1e-4, &[0.0, -1.0]),
                    ema_decay: mostly(&mut rng, 0.99, &[0.0, 1.0]),
                },
                batches: Batches {
                    batch_size: mostly(&mut rng, 5, &[0, 1, Setup::MAX_BATCH as usize + 1]),
                    seed: pick(&mut rng, &[0, u64::MAX]),
                },
                length: mostly(&mut rng, Length::Steps(7), &lengths),
                save_every: mostly(&mut rng, Some(3), &cadences),
                params: mostly(
                    &mut rng,
                    vec![0.0],
                    &[vec![], vec![0.0, 1.0], vec![f32::NAN]],
                ),
                ..match fresh(Mode::Sync, 1) {
                    Start::Fresh(fresh) => fresh,
                    Start::Resume(_) => unreachable!(),
                }
            });
            let mut start = Some(start);
            // The fresh run, then up to two resumes with random settings.
            for _ in 0..3 {
                let Some(now) = start.take() else { break };
                let resume = matches!(now, Start::Resume(_)).then_some(dir.as_path());
                let checkpoints = Checkpoints::take(Some(&dir), resume, 0).unwrap();
                let setup = Setup::new(DeviceSpec::Cpu(workers));
                let Ok(mut trainer) = Trainer::open(SCALAR, now, &setup, checkpoints) else {
                    refused += 1;
                    break;
                };
                let plan = random_plan(&mut rng, &trainer);
                let interrupt = Interrupt::new();
                let trainer_result =
                    trainer.train(&plan, &Watch::quiet(&interrupt), &mut |_| Ok(()));
                let step = trainer.state.step;
                drop(trainer);
                if trainer_result.is_err() {
                    refused += 1;
                }
                let written = steps_in(&dir);
                let Some(&newest) = written.last() else { break };
                trained += 1;
                // A plain resume takes the newest checkpoint, whatever the run asked.
                let checkpoints = Checkpoints::take(Some(&dir), Some(&dir), 0).unwrap();
                let setup = Setup::new(DeviceSpec::Cpu(workers));
                match Trainer::<_, Sgd>::open(
                    SCALAR,
                    Start::Resume(Resume::from(&dir)),
                    &setup,
                    checkpoints,
                ) {
                    Ok(resumed) => assert_eq!(
                        resumed.resumed_from(),
                        Some(dir.join(file_name(newest)).as_path()),
                        "case {case}"
                    ),
                    Err(e) => assert!(
                        matches!(e, RunError::NothingToTrain { .. }) && newest == step,
                        "case {case}: a resume refuses the checkpoints of step {newest}: {e}"
                    ),
                }
                start = Some(Start::Resume(Resume {
                    length: pick(&mut rng, &[None, Some(Length::Steps(step + 5))])
                        .or(Some(pick(&mut rng, &lengths))),
                    save_every: pick(&mut rng, &cadences),
                    ..Resume::from(&dir)
                }));
            }
        }
        // Both outcomes were reached often enough to mean something.
        assert!(
            trained > 30 && refused > 30,
            "{trained} trained, {refused} refused"
        );
    }

    /// What a run left: its state and the mean loss of each evaluated segment.
    type Outcome = (TrainState, Vec<Option<f64>>);

    /// Trains `start` on `workers` CPU workers in each of `ranks` processes (threads standing in
    /// for them, [`tandem_collectives::threads`]; 1: this process alone), logging every step.
    /// Rank r trains `plan(r, trainer)`, as ranks given different flags would. Returns rank 0's
    /// outcome.
    fn on_ranks<M: Model>(
        model: impl Fn() -> M + Sync,
        start: &Start<Sgd>,
        (ranks, workers): (usize, usize),
        plan: impl Fn(usize, &Trainer<M, Sgd>) -> Plan + Sync,
    ) -> Outcome {
        let train = |rank: Option<SharedTransport>| {
            let setup = Setup {
                ranks: rank.clone(),
                ..Setup::new(DeviceSpec::Cpu(workers))
            };
            let mut trainer = Trainer::open(model(), start.clone(), &setup, None).unwrap();
            let plan = plan(rank.as_ref().map_or(0, |r| r.rank()), &trainer);
            let interrupt = Interrupt::new();
            let watch = Watch {
                log_every: 1,
                ..Watch::quiet(&interrupt)
            };
            let mut losses = Vec::new();
            trainer
                .train(&plan, &watch, &mut |segment| {
                    losses.push(segment.mean_loss);
                    Ok(())
                })
                .unwrap();
            (trainer.state, losses)
        };
        if ranks == 1 {
            return train(None);
        }
        std::thread::scope(|scope| {
            let threads: Vec<_> = tandem_collectives::threads::cluster(ranks)
                .into_iter()
                .map(|rank| scope.spawn(|| train(Some(SharedTransport::Ranks(Arc::new(rank))))))
                .collect();
            let mut outcomes = threads.into_iter().map(|t| t.join().unwrap());
            outcomes.next().unwrap()
        })
    }

    /// Rank 0 evaluates every 2 steps; the others ask for another plan, which rank 0's
    /// overrides.
    fn plans<M: Model>(rank: usize, trainer: &Trainer<M, Sgd>) -> Plan {
        match rank {
            0 => trainer.plan(2),
            _ => Plan {
                save_every: 5,
                ..trainer.plan(3)
            },
        }
    }

    #[test]
    fn a_sync_run_across_ranks_is_one_processs_in_state_and_logged_losses() {
        let start = fresh(Mode::Sync, 12);
        let one = on_ranks(|| SCALAR, &start, (1, 2), plans);
        let two = on_ranks(|| SCALAR, &start, (2, 1), plans);
        assert_eq!(two, one);
        // Six segments of two steps, each with its losses: the comparison saw them.
        assert_eq!(one.1.len(), 6);
        assert!(one.1.iter().all(Option::is_some), "{:?}", one.1);
    }

    #[test]
    fn an_async_run_across_ranks_keeps_the_schedule_and_the_moving_average_of_one_process() {
        let Start::Fresh(fresh) = fresh(Mode::Async, 30) else {
            unreachable!()
        };
        let start = Start::Fresh(Fresh {
            async_rule: AsyncRule::Plain,
            optimizer: Sgd {
                learning_rate: 0.5,
                lr_decay: 0.5,
                weight_decay: 0.0,
                ema_decay: 0.9,
            },
            ..fresh
        });
        // The reference is one worker, whose updates land in step order by construction: two
        // workers of one process may not (one can take step s + 1 and lock the shard while the
        // other holds step s, before its lock), which made this test fail about once in 100
        // runs. The gradient does not depend on the parameters, so staleness changes nothing
        // and the ranks' runs must equal it.
        let one = on_ranks(|| ScalarModel(Fit::Slope), &start, (1, 1), plans).0;
        // Across ranks each part applies its updates in step order on any interleaving: a few
        // runs, so that updates overtaking each other across ranks are seen.
        for _ in 0..5 {
            let two = on_ranks(|| ScalarModel(Fit::Slope), &start, (2, 1), plans).0;
            assert_eq!(two, one);
        }
        // The rate decayed (30 steps of 5 examples are 3.75 epochs of 40) and the average
        // lags the parameters: both were exercised.
        let undecayed = -30.0 * 0.5 * SLOPE;
        assert!(one.params[0] > undecayed * 0.5, "{:?}", one.params);
        let average = one.slots[0].values[0];
        assert!(average > one.params[0] + 0.02, "{average} {:?}", one.params);
    }

    #[test]
    fn an_async_run_on_several_workers_ends_after_its_epochs_with_a_checkpoint_each() {
        let tmp = tempfile::tempdir().unwrap();
        let Start::Fresh(fresh) = fresh(Mode::Async, 1) else {
            unreachable!()
        };
        // 40 examples in async steps of one batch of 5: 8 steps an epoch, whatever the
        // number of workers (a sync step would take both workers' batches).
        let start = Start::Fresh(Fresh {
            length: Length::Epochs(3),
            save_every: None,
            ..fresh
        });
        let trainer = run(start, tmp.path(), 2).unwrap();
        assert_eq!(trainer.config.end_step, 24);
        assert_eq!(trainer.config.save_every, Some(8));
        assert_eq!(trainer.state.step, 24);
        assert_eq!(steps_in(tmp.path()), [8, 16, 24]);
    }

    #[test]
    fn a_resumed_sync_run_ends_where_an_uninterrupted_one_does() {
        let tmp = tempfile::tempdir().unwrap();
        let whole = run(fresh(Mode::Sync, 10), &tmp.path().join("whole"), 2).unwrap();
        let split = tmp.path().join("split");
        run(fresh(Mode::Sync, 6), &split, 2).unwrap();
        assert_eq!(steps_in(&split), [4, 6]);
        let resume = Resume {
            length: Some(Length::Steps(10)),
            ..Resume::from(&split)
        };
        let resumed = run(Start::Resume(resume), &split, 2).unwrap();
        assert_eq!(
            resumed.resumed_from(),
            Some(split.join("step-0000000006.safetensors").as_path())
        );
        assert_eq!(steps_in(&split), [4, 6, 8, 10]);
        assert_eq!(resumed.state, whole.state);
        drop(resumed);
        // A finished run has nothing left to train.
        let err = run(Start::Resume(Resume::from(&split)), &split, 2)
            .err()
            .unwrap();
        assert!(
            matches!(err, RunError::NothingToTrain { step: 10, end: 10 }),
            "{err}"
        );
        // A finished run still opens (its state can be read, evaluated, extended by a later
        // resume); only training it is refused, as above.
        let checkpoints = Checkpoints::take(Some(&split), Some(&split), 0).unwrap();
        let setup = Setup::new(DeviceSpec::Cpu(2));
        let finished = Trainer::open(
            SCALAR,
            Start::<Sgd>::Resume(Resume::from(&split)),
            &setup,
            checkpoints,
        )
        .unwrap();
        assert_eq!(finished.state, whole.state);
        drop(finished);
        // A length short of the step already reached is refused when the trainer opens, before
        // any device is opened or step planned.
        let shorter = Resume {
            length: Some(Length::Steps(4)),
            ..Resume::from(&split)
        };
        let checkpoints = Checkpoints::take(Some(&split), Some(&split), 0).unwrap();
        let setup = Setup::new(DeviceSpec::Cpu(2));
        let err = Trainer::open(SCALAR, Start::<Sgd>::Resume(shorter), &setup, checkpoints)
            .err()
            .unwrap();
        assert!(
            matches!(err, RunError::NothingToTrain { step: 10, end: 4 }),
            "{err}"
        );
    }

    #[test]
    fn a_resume_keeps_the_runs_configuration_and_names_what_a_flag_would_change() {
        let tmp = tempfile::tempdir().unwrap();
        run(fresh(Mode::Sync, 4), tmp.path(), 2).unwrap();
        let requested = |key, label, value: &str| Requested {
            key,
            label,
            value: value.into(),
        };
        let resume = Resume {
            requested: vec![
                requested("learning_rate", "--lr", "0.5"),
                requested("mode", "--async", "async"),
                requested("seed", "--seed", "2"),
            ],
            length: Some(Length::Steps(8)),
            ..Resume::from(tmp.path())
        };
        let err = run(Start::Resume(resume), tmp.path(), 2).err().unwrap();
        let RunError::Conflicts { conflicts, .. } = &err else {
            panic!("{err}")
        };
        let labels: Vec<&str> = conflicts.iter().map(|c| c.label.as_str()).collect();
        assert_eq!(labels, ["--async", "--seed"]);
        assert!(
            err.to_string()
                .contains("--async async (the run has sync), --seed 2 (the run has 1)"),
            "{err}"
        );
        // Sync resumes only on its own number of workers; async on any.
        let on_three = run(
            Start::Resume(Resume {
                length: Some(Length::Steps(8)),
                ..Resume::from(tmp.path())
            }),
            tmp.path(),
            3,
        );
        assert!(matches!(
            on_three.err().unwrap(),
            RunError::SyncWorkers {
                saved: 2,
                now: 3,
                ..
            }
        ));
        let other = tmp.path().join("async");
        run(fresh(Mode::Async, 4), &other, 2).unwrap();
        let resumed = run(
            Start::Resume(Resume {
                length: Some(Length::Steps(8)),
                ..Resume::from(&other)
            }),
            &other,
            1,
        )
        .unwrap();
        assert_eq!((resumed.state.step, resumed.config.workers), (8, 1));
    }

    #[test]
    fn a_fresh_run_refuses_a_directory_with_a_runs_checkpoints() {
        let tmp = tempfile::tempdir().unwrap();
        run(fresh(Mode::Sync, 4), tmp.path(), 1).unwrap();
        let err = run(fresh(Mode::Sync, 4), tmp.path(), 1).err().unwrap();
        assert!(matches!(err, RunError::OtherRun { step: 4, .. }), "{err}");
        let missing = tmp.path().join("missing");
        let err = Checkpoints::take(None, Some(&missing), 0).err().unwrap();
        assert!(matches!(err, RunError::NoResumeDir(_)), "{err}");
        assert!(!missing.exists());
    }

    #[test]
    fn a_resume_skips_damaged_checkpoints_and_takes_the_newest_valid_one() {
        let tmp = tempfile::tempdir().unwrap();
        run(fresh(Mode::Sync, 8), tmp.path(), 1).unwrap();
        std::fs::write(
            tmp.path().join("step-0000000008.safetensors"),
            b"not a checkpoint",
        )
        .unwrap();
        let resume = Resume {
            length: Some(Length::Steps(9)),
            ..Resume::from(tmp.path())
        };
        let resumed = run(Start::Resume(resume), tmp.path(), 1).unwrap();
        assert_eq!(
            resumed.resumed_from(),
            Some(tmp.path().join("step-0000000004.safetensors").as_path())
        );
        assert_eq!(resumed.state.step, 9);
    }

    #[test]
    fn an_interrupt_stops_the_run_with_a_checkpoint_and_evaluations_follow_the_plan() {
        let tmp = tempfile::tempdir().unwrap();
        let checkpoints = Checkpoints::take(Some(tmp.path()), None, 0).unwrap();
        let setup = Setup::new(DeviceSpec::Cpu(1));
        let mut trainer =
            Trainer::open(SCALAR, fresh(Mode::Async, 1_000), &setup, checkpoints).unwrap();
        let interrupt = Interrupt::new();
        let mut evaluated = Vec::new();
        let plan = Plan {
            evaluate_every: 3,
            ..trainer.plan(0)
        };
        let summary = trainer
            .train(&plan, &Watch::quiet(&interrupt), &mut |segment| {
                evaluated.push(segment.state.step);
                if segment.state.step == 9 {
                    interrupt.request();
                }
                Ok(())
            })
            .unwrap();
        assert_eq!(evaluated, [3, 6, 9]);
        assert!(summary.stopped);
        // The run stops after the step under way when the request came: at or just after 9.
        let step = trainer.state.step;
        assert!((10..=12).contains(&step), "{step}");
        assert_eq!(
            summary.last_checkpoint,
            Some(tmp.path().join(file_name(step)))
        );
        assert_eq!(summary.totals.examples, step * 5);
    }

    #[test]
    fn a_run_given_up_on_a_hung_worker_saves_its_consistent_state() {
        let tmp = tempfile::tempdir().unwrap();
        let checkpoints = Checkpoints::take(Some(tmp.path()), None, 3)
            .unwrap()
            .unwrap();
        let saver = Saver {
            checkpoints: &checkpoints,
            layout: LAYOUT.clone(),
            metadata: BTreeMap::new(),
            identity: vec![],
        };
        let stalled = [Stall {
            worker: 1,
            device: Device::Cpu { worker: 1 },
            step: Some(8),
            idle: Duration::from_secs(400),
            silent_ranks: vec![],
        }];
        let mut state = TrainState::new(vec![0.5], &Sgd::DEFAULT);
        state.step = 7;

        let said = abandon(Some(&saver), &stalled, Some(&state));
        let path = tmp.path().join(file_name(7));
        assert_eq!(checkpoint::load(&path, &LAYOUT).unwrap().state, state);
        assert!(
            said.starts_with("stopped while worker 1 (cpu:1) made no progress"),
            "{said}"
        );
        assert!(
            said.contains(&format!("step 7 written to {}", path.display())),
            "{said}"
        );

        let alone = stall_message(&stalled[0], None, true);
        assert!(
            alone.starts_with(
                "warning: worker 1 (cpu:1) has made no progress for 400 s, at step 8 (Ctrl-C \
                 saves the last consistent checkpoint"
            ),
            "{alone}"
        );
        let unsaved = stall_message(&stalled[0], None, false);
        assert!(
            unsaved.ends_with(
                "(Ctrl-C ends the run; it has no checkpoint directory, so nothing is saved)"
            ),
            "{unsaved}"
        );
        let across = stall_message(&stalled[0], Some((0, 3)), true);
        assert!(across.contains("(cpu:1) on rank 0 has made"), "{across}");
        assert!(across.contains("wait for all 3 ranks"), "{across}");
        // On rank 0, the ranks it has not heard from are named.
        let silent = |rank, secs, step| SilentRank {
            rank,
            silence: Duration::from_secs(secs),
            step,
        };
        let quiet = Stall {
            silent_ranks: vec![silent(2, 412, Some(8))],
            ..stalled[0].clone()
        };
        let across = stall_message(&quiet, Some((0, 3)), true);
        assert!(
            across.contains("rank 2 (for 412 s, last at step 8) has given no sign of life"),
            "{across}"
        );
        let said = abandon(None, &[quiet], Some(&state));
        assert!(
            said.contains("waiting for ranks of which rank 2 (for 412 s"),
            "{said}"
        );
        let two = [silent(1, 6, None), silent(2, 9, Some(3))];
        assert_eq!(
            silent_names(&two),
            "ranks 1 (for 6 s) and 2 (for 9 s, last at step 3) have"
        );

        // The run's observer, told by the strategy that it gives up, saves through `abandon`.
        let interrupt = Interrupt::new();
        let watch = Watch::quiet(&interrupt);
        let observer = RunObserver {
            watch: &watch,
            log_every: 0,
            losses: Mutex::new((0.0, 0)),
            saver: Some(&saver),
            rank: None,
        };
        let mut later = state.clone();
        later.step = 9;
        observer.on_abandon(&stalled, Some(&later));
        assert_eq!(
            checkpoint::load(&tmp.path().join(file_name(9)), &LAYOUT)
                .unwrap()
                .state,
            later
        );
        std::fs::remove_file(tmp.path().join(file_name(9))).unwrap();

        let said = abandon(Some(&saver), &stalled, None);
        assert!(said.contains("no consistent state"), "{said}");
        let said = abandon(None, &stalled, Some(&state));
        assert!(said.contains("nothing saved"), "{said}");
        assert_eq!(steps_in(tmp.path()), [7]);
    }
}
