//! A run as a command runs it: how `mpirun` launched the process, which rank leads, what a
//! failing rank does to the others ([`Launch`]); a [`Trainer`] driven through its plan with a
//! progress display, Ctrl-C and the stall watch ([`drive`]); the end-of-run summary
//! ([`print_summary`]). A binary that trains a model is its flags, its model and its
//! evaluation around these.

use std::path::Path;
use std::time::{Duration, Instant};

use tandem_collectives::SharedTransport;
use tandem_strategy::{Exchange, Mode};

use crate::{
    output, BatchScaling, Display, EvaluateError, Interrupt, Model, Precision, Progress,
    RecordedOptimizer, RunError, Segment, Summary, Totals, Trainer, Watch,
};

/// How many processes `mpirun` started with this one, as Open MPI (or a PMI launcher such as
/// MPICH's) tells each of them (1 without `mpirun`).
pub fn launched_ranks() -> usize {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .find_map(|name| std::env::var(name).ok()?.parse().ok())
        .unwrap_or(1)
}

/// Why this process cannot run what it was started for.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A one-process command started by `mpirun` on several: each would write the same
    /// outputs.
    #[error("{what} runs in one process; mpirun started {ranks}: run it without mpirun")]
    OneProcess {
        /// The command, as the user typed it.
        what: String,
        /// The processes `mpirun` started.
        ranks: usize,
    },
    /// Training under `mpirun` in a build without the transport: each process would train on
    /// its own, all into one directory.
    #[error(
        "mpirun started {ranks} processes, but this build has no MPI transport: each would \
         train on its own; build with --features mpi (README: Across processes and hosts)"
    )]
    NoTransport {
        /// The processes `mpirun` started.
        ranks: usize,
    },
    /// The MPI transport could not start.
    #[cfg(feature = "mpi")]
    #[error(transparent)]
    Mpi(#[from] tandem_mpi::MpiError),
}

/// The processes of one run: this one alone, or the `mpirun` job it is a rank of (with the
/// `mpi` feature). Rank 0 leads: it alone reads and writes checkpoints, evaluates and reports.
pub struct Launch {
    ranks: Option<SharedTransport>,
}

impl Launch {
    /// Joins the job `mpirun` started, or runs alone. `one_process`: the command, when it is
    /// one that must not run once per process (an evaluation, a report), refused under
    /// `mpirun`.
    pub fn init(one_process: Option<&str>) -> Result<Self, LaunchError> {
        let ranks = launched_ranks();
        if ranks > 1 {
            if let Some(what) = one_process {
                return Err(LaunchError::OneProcess {
                    what: what.to_owned(),
                    ranks,
                });
            }
            if !cfg!(feature = "mpi") {
                return Err(LaunchError::NoTransport { ranks });
            }
        }
        if one_process.is_some() {
            return Ok(Self::alone());
        }
        Self::join()
    }

    /// This process alone.
    pub fn alone() -> Self {
        Self { ranks: None }
    }

    #[cfg(feature = "mpi")]
    fn join() -> Result<Self, LaunchError> {
        let ranks = SharedTransport::Ranks(std::sync::Arc::new(tandem_mpi::MpiRanks::init()?));
        Ok(Self {
            ranks: (ranks.ranks() > 1).then_some(ranks),
        })
    }

    #[cfg(not(feature = "mpi"))]
    fn join() -> Result<Self, LaunchError> {
        Ok(Self::alone())
    }

    /// The run's processes when there are several (for [`Setup::ranks`](crate::Setup)).
    pub fn ranks(&self) -> Option<SharedTransport> {
        self.ranks.clone()
    }

    /// Whether this process leads the run (rank 0, or alone).
    pub fn leads(&self) -> bool {
        self.ranks.as_ref().is_none_or(|r| r.rank() == 0)
    }

    /// `result`, except that across ranks an error ends the whole job after printing it: the
    /// other ranks would wait for this one forever.
    pub fn or_abort<T, E: AsRef<dyn std::error::Error + Send + Sync>>(
        &self,
        result: Result<T, E>,
    ) -> Result<T, E> {
        match (result, &self.ranks) {
            (Err(e), Some(ranks)) => {
                let rank = ranks.rank();
                output::warn(format!("error: rank {rank}: {}", describe(e.as_ref())));
                ranks.abort(1)
            }
            (result, _) => result,
        }
    }
}

/// `error` and its causes in one line, each cause once: most errors already name their cause
/// in their own message, which a report of the whole chain would print a second time.
pub fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        let line = next.to_string();
        if !text.contains(&line) {
            text = format!("{text}: {line}");
        }
        cause = next.source();
    }
    text
}

/// How [`drive`] shows a run.
#[derive(Debug, Clone, Copy)]
pub struct Shown<'a> {
    /// The bar or plain lines.
    pub display: Display,
    /// A progress line and metrics record every this many steps (0: never).
    pub log_every: u64,
    /// A JSON-lines file the records are appended to; with one, the run evaluates once an
    /// epoch.
    pub metrics: Option<&'a Path>,
    /// How long a worker may go without finishing a step before it is reported as stalled.
    pub stall_timeout: Duration,
}

/// How a driven run ended.
#[derive(Debug)]
pub enum Ended {
    /// The lead reached the plan's end.
    Done(Summary),
    /// A rank other than the lead reached it (the lead reports for all).
    Followed,
    /// It stopped early; the process should exit with this status (130 for an interrupt,
    /// the output's failure status for a closed stdout). The lead has said so.
    Stopped(i32),
}

/// Trains `trainer` to its end: a checkpoint at its cadence, `evaluate` once an epoch when
/// there is a metrics file, `interrupt` (Ctrl-C's, from [`Interrupt::on_ctrl_c`]) stops it with
/// a checkpoint, stalled workers are reported and a run given up on them ends the process. The
/// lead shows the run (a header line, the progress); the other ranks train silently.
pub fn drive<M: Model, O: RecordedOptimizer>(
    trainer: &mut Trainer<M, O>,
    shown: &Shown<'_>,
    interrupt: &Interrupt,
    evaluate: &mut dyn FnMut(&Segment<'_>, &Progress) -> Result<(), EvaluateError>,
) -> Result<Ended, RunError> {
    let config = trainer.config.clone();
    let start = trainer.state.step;
    let epoch = trainer.epochs().steps_per_epoch();
    let plan = trainer.plan(if shown.metrics.is_some() { epoch } else { 0 });
    if start >= plan.end_step {
        return Err(RunError::NothingToTrain {
            step: start,
            end: plan.end_step,
        });
    }
    let mut watch = Watch {
        progress: None,
        log_every: 0,
        interrupt,
        stall_timeout: Some(shown.stall_timeout),
        on_abandon: Some(exit_abandoned),
    };
    if !trainer.leads() {
        let summary = trainer.train(&plan, &watch, &mut |_| Ok(()))?;
        return Ok(match summary.stopped {
            true => Ended::Stopped(130),
            false => Ended::Followed,
        });
    }
    let progress = Progress::new(
        shown.display,
        shown.log_every,
        start,
        config.end_step,
        shown.metrics,
    )?;
    progress.println(&format!(
        "tandem: {} training on {} worker(s) [{}], batch {} per worker, steps {}..{}{}",
        config.mode.name(),
        config.workers,
        trainer.devices(),
        config.batches.batch_size,
        start,
        config.end_step,
        trainer
            .resumed_from()
            .map(|p| format!(", resumed from {}", p.display()))
            .unwrap_or_default()
    ));
    (watch.progress, watch.log_every) = (Some(&progress), shown.log_every);
    let summary = trainer.train(&plan, &watch, &mut |segment| evaluate(segment, &progress))?;
    progress.finish();
    if !summary.stopped {
        return Ok(Ended::Done(summary));
    }
    if let Some(status) = output::failure_status() {
        // stdout was closed under the run: nobody is left to read a summary.
        return Ok(Ended::Stopped(status));
    }
    let step = trainer.state.step;
    match &summary.last_checkpoint {
        Some(path) => out!(
            "interrupted at step {step}: checkpoint written to {}",
            path.display()
        ),
        None => out!("interrupted at step {step} (no --checkpoint-dir, nothing saved)"),
    }
    Ok(Ended::Stopped(130))
}

/// Says why the run was given up on its hung workers (after saving what was consistent) and
/// ends the process as an interrupted one: their threads cannot be joined.
fn exit_abandoned(message: &str) -> ! {
    output::warn(message);
    std::process::exit(130);
}

/// Prints the summary of a finished run: mode, devices, steps, throughput, staleness and
/// failures, then `results` (the caller's lines: accuracy, say), the last checkpoint and the
/// times; `wall` is when the command started.
pub fn print_summary<M: Model, O: RecordedOptimizer>(
    trainer: &Trainer<M, O>,
    summary: &Summary,
    results: &[String],
    wall: Instant,
) {
    for line in summary_lines(trainer, summary, results, wall.elapsed()) {
        out!("{line}");
    }
}

/// The lines [`print_summary`] prints, `wall` the command's time so far.
fn summary_lines<M: Model, O: RecordedOptimizer>(
    trainer: &Trainer<M, O>,
    summary: &Summary,
    results: &[String],
    wall: Duration,
) -> Vec<String> {
    let (config, totals) = (&trainer.config, &summary.totals);
    let mut lines = vec!["== summary ==".to_owned()];
    let workers = config.workers;
    lines.push(match config.mode {
        Mode::Sync => {
            let examples = config.batches.batch_size as u64 * workers as u64;
            match config.lr_scaling.factor(examples) {
                1.0 => "mode:                sync".to_owned(),
                factor => format!(
                    "mode:                sync, learning rate x{factor} for a global batch of \
                     {examples} (scaling {}, reached over the first {} epochs)",
                    config.lr_scaling,
                    BatchScaling::WARMUP_EPOCHS
                ),
            }
        }
        Mode::Async => format!(
            "mode:                async, rule {}, warm-up {} epoch(s) on one worker, bound {}",
            config.async_rule,
            config.async_warmup.epochs(workers),
            config.async_bound
        ),
    });
    lines.push(format!(
        "devices:             {workers} [{}]",
        trainer.devices()
    ));
    if config.precision != Precision::F32 {
        lines.push(format!(
            "precision:           {}",
            precision_summary(config.precision, totals)
        ));
    }
    lines.push(format!(
        "steps:               {} ({} examples this run)",
        trainer.state.step, totals.examples
    ));
    lines.push(format!(
        "examples/sec:        {:.0}",
        totals.examples_per_sec()
    ));
    match (totals.sent_per_step(), config.exchange) {
        (Some(bytes), exchange) => lines.push(format!(
            "exchanged:           {bytes:.0} bytes sent per step by this rank (gradients in \
             {exchange})"
        )),
        (None, Exchange::F32) => {}
        (None, exchange) => lines.push(format!(
            "exchanged:           gradients in {exchange} between GPU replicas"
        )),
    }
    if let Some(staleness) = totals.staleness() {
        lines.push(format!(
            "staleness:           mean {:.2}, max {}{}",
            staleness.mean,
            staleness.max,
            match staleness.dropped {
                0 => String::new(),
                n => format!(", {n} too stale dropped"),
            }
        ));
    }
    for failure in &totals.failures {
        lines.push(format!(
            "worker failure:      {failure} (out for the rest of the run)"
        ));
    }
    lines.extend(results.iter().cloned());
    if let Some(path) = &summary.last_checkpoint {
        lines.push(format!("checkpoint:          {}", path.display()));
    }
    lines.push(format!("training time:       {:.1} s", totals.seconds));
    lines.push(format!("wall time:           {:.1} s", wall.as_secs_f64()));
    lines
}

/// The summary's precision: the type, and where the loss is scaled, this process's overflows
/// and scales.
fn precision_summary(precision: Precision, totals: &Totals) -> String {
    let Some(scaling) = totals.loss_scaling else {
        return format!("{precision} (f32 master weights)");
    };
    let scale = match scaling.smallest == scaling.largest {
        true => format!("{}", scaling.smallest),
        false => format!("{} to {}", scaling.smallest, scaling.largest),
    };
    format!(
        "{precision} (f32 master weights), loss scale now {scale}, {} overflowed pass(es) \
         skipped and computed again at half the scale",
        scaling.overflows
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tandem_collectives::threads::cluster;
    use tandem_optim::Sgd;
    use tandem_pool::DeviceSpec;

    use super::*;
    use crate::scalar::{fresh, ScalarModel, SCALAR};
    use crate::{Checkpoints, DType, Fresh, LossScaling, Setup, Start};

    /// A trainer of [`SCALAR`] replicas on `workers` CPU workers for `steps` steps, `adjust`ed
    /// from the test model's fresh start, checkpoints in `dir` when given.
    fn open_trainer(
        steps: u64,
        workers: usize,
        ranks: Option<SharedTransport>,
        dir: Option<&Path>,
        adjust: impl FnOnce(&mut Fresh<Sgd>),
    ) -> Trainer<ScalarModel, Sgd> {
        let Start::Fresh(mut fresh) = fresh(Mode::Sync, steps) else {
            unreachable!("a fresh start")
        };
        adjust(&mut fresh);
        let checkpoints = dir.map(|dir| Checkpoints::take(Some(dir), None, 0).unwrap());
        let setup = Setup {
            ranks,
            ..Setup::new(DeviceSpec::Cpu(workers))
        };
        Trainer::open(SCALAR, Start::Fresh(fresh), &setup, checkpoints.flatten()).unwrap()
    }

    const SHOWN: Shown<'static> = Shown {
        display: Display::Plain,
        log_every: 0,
        metrics: None,
        stall_timeout: Duration::from_secs(600),
    };

    fn no_evaluation(_: &Segment<'_>, _: &Progress) -> Result<(), EvaluateError> {
        Ok(())
    }

    #[test]
    fn drive_trains_to_the_end_then_has_nothing_to_train() {
        let tmp = tempfile::tempdir().unwrap();
        let mut trainer = open_trainer(6, 2, None, Some(tmp.path()), |_| {});
        let interrupt = Interrupt::new();
        let ended = drive(&mut trainer, &SHOWN, &interrupt, &mut no_evaluation).unwrap();
        let Ended::Done(summary) = ended else {
            panic!("{ended:?}")
        };
        assert_eq!(trainer.state.step, 6);
        assert!(!summary.stopped);
        assert_eq!(summary.totals.steps, 6);
        let again = drive(&mut trainer, &SHOWN, &interrupt, &mut no_evaluation);
        assert!(
            matches!(again, Err(RunError::NothingToTrain { step: 6, end: 6 })),
            "{again:?}"
        );
    }

    #[test]
    fn an_interrupted_drive_stops_after_one_step_with_status_130() {
        let tmp = tempfile::tempdir().unwrap();
        let mut trainer = open_trainer(6, 1, None, Some(tmp.path()), |_| {});
        let interrupt = Interrupt::new();
        interrupt.request();
        let ended = drive(&mut trainer, &SHOWN, &interrupt, &mut no_evaluation).unwrap();
        assert!(matches!(ended, Ended::Stopped(130)), "{ended:?}");
        assert_eq!(trainer.state.step, 1);
    }

    #[test]
    fn the_lead_is_done_and_the_other_ranks_follow() {
        let ended: Vec<Ended> = std::thread::scope(|scope| {
            let threads: Vec<_> = cluster(2)
                .into_iter()
                .map(|rank| {
                    scope.spawn(move || {
                        let ranks = SharedTransport::Ranks(Arc::new(rank));
                        let launch = Launch {
                            ranks: Some(ranks.clone()),
                        };
                        let mut trainer = open_trainer(4, 1, launch.ranks(), None, |_| {});
                        let ended =
                            drive(&mut trainer, &SHOWN, &Interrupt::new(), &mut no_evaluation)
                                .unwrap();
                        assert_eq!(launch.leads(), ranks.rank() == 0);
                        ended
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert!(matches!(ended[0], Ended::Done(_)), "{ended:?}");
        assert!(matches!(ended[1], Ended::Followed), "{ended:?}");
    }

    #[test]
    fn an_error_across_ranks_aborts_them_all() {
        let mut ranks = cluster(2).into_iter();
        let launch = Launch {
            ranks: Some(SharedTransport::Ranks(Arc::new(ranks.nth(1).unwrap()))),
        };
        let ok: Result<u8, Box<dyn std::error::Error + Send + Sync>> = Ok(3);
        assert_eq!(launch.or_abort(ok).unwrap(), 3);
        let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let err: Result<u8, Box<dyn std::error::Error + Send + Sync>> = Err("no disk".into());
            launch.or_abort(err)
        }));
        let message = failed.unwrap_err();
        assert_eq!(
            message.downcast_ref::<String>().map(String::as_str),
            Some("rank 1 aborted the cluster with status 1")
        );
        // Alone, an error is the caller's to report.
        let err: Result<u8, Box<dyn std::error::Error + Send + Sync>> = Err("no disk".into());
        assert!(Launch::alone().or_abort(err).is_err());
    }

    #[test]
    fn the_summary_says_how_the_run_went() {
        let tmp = tempfile::tempdir().unwrap();
        let mut trainer = open_trainer(4, 2, None, Some(tmp.path()), |fresh| {
            fresh.lr_scaling = BatchScaling::Factor(2.0);
            fresh.precision = Precision::new(DType::BF16);
        });
        let ended = drive(&mut trainer, &SHOWN, &Interrupt::new(), &mut no_evaluation).unwrap();
        let Ended::Done(summary) = ended else {
            panic!("{ended:?}")
        };
        let results = ["accuracy:            0.5".to_owned()];
        let lines = summary_lines(&trainer, &summary, &results, Duration::from_millis(2500));
        let text = lines.join("\n");
        let checkpoint = tmp.path().join("step-0000000004.safetensors");
        for expected in [
            "== summary ==".to_owned(),
            "mode:                sync, learning rate x2 for a global batch of 10 (scaling 2, \
             reached over the first 5 epochs)"
                .to_owned(),
            "devices:             2 [cpu:0, cpu:1]".to_owned(),
            "precision:           bf16 (f32 master weights)".to_owned(),
            "steps:               4 (40 examples this run)".to_owned(),
            results[0].clone(),
            format!("checkpoint:          {}", checkpoint.display()),
            "wall time:           2.5 s".to_owned(),
        ] {
            assert!(lines.contains(&expected), "no {expected:?} in\n{text}");
        }
        assert!(
            !text.contains("exchanged") && !text.contains("staleness"),
            "{text}"
        );

        // f32 at the configured rate: no factor and no precision line.
        let mut trainer = open_trainer(2, 1, None, None, |_| {});
        let ended = drive(&mut trainer, &SHOWN, &Interrupt::new(), &mut no_evaluation).unwrap();
        let Ended::Done(summary) = ended else {
            panic!("{ended:?}")
        };
        let lines = summary_lines(&trainer, &summary, &[], Duration::ZERO);
        assert_eq!(lines[1], "mode:                sync");
        assert!(
            !lines.iter().any(|l| l.starts_with("precision")),
            "{lines:?}"
        );
    }

    #[test]
    fn the_precision_line_names_the_loss_scales() {
        let mut totals = Totals::default();
        assert_eq!(
            precision_summary(Precision::new(DType::BF16), &totals),
            "bf16 (f32 master weights)"
        );
        totals.loss_scaling = Some(LossScaling {
            overflows: 3,
            smallest: 8192.0,
            largest: 8192.0,
        });
        let one_scale = precision_summary(Precision::new(DType::F16), &totals);
        assert!(
            one_scale.contains("loss scale now 8192, 3 overflowed"),
            "{one_scale}"
        );
        totals.loss_scaling = Some(LossScaling {
            overflows: 0,
            smallest: 4096.0,
            largest: 65536.0,
        });
        let scales = precision_summary(Precision::new(DType::F16), &totals);
        assert!(
            scales.contains("loss scale now 4096 to 65536, 0 overflowed"),
            "{scales}"
        );
    }

    /// Not a test of its own: what [`ranks_from_the_launcher`] runs (with `--ignored`) in a
    /// process started as `mpirun` would start it (the environment is the process's).
    #[test]
    #[ignore = "the child process of ranks_from_the_launcher"]
    fn under_mpirun_child() {
        let expected = std::env::var_os("TANDEM_TEST_RANKS")
            .expect("run by ranks_from_the_launcher, which sets it");
        let expected: usize = expected.to_str().unwrap().parse().unwrap();
        assert_eq!(launched_ranks(), expected);
        match Launch::init(Some("eval")) {
            Err(LaunchError::OneProcess { what, ranks }) => {
                assert_eq!((what.as_str(), ranks), ("eval", expected));
            }
            Ok(launch) => assert!(expected == 1 && launch.ranks().is_none()),
            Err(other) => panic!("{other}"),
        }
        // With the transport, init would join the job these variables only pretend exists.
        if cfg!(not(feature = "mpi")) {
            match Launch::init(None) {
                Err(LaunchError::NoTransport { ranks }) => assert_eq!(ranks, expected),
                Ok(launch) => assert!(expected == 1 && launch.leads()),
                Err(other) => panic!("{other}"),
            }
        }
    }

    #[test]
    fn ranks_from_the_launcher() {
        for (variables, expected) in [
            (&[("OMPI_COMM_WORLD_SIZE", "3")][..], 3),
            (&[("PMI_SIZE", "2")], 2),
            (&[("OMPI_COMM_WORLD_SIZE", "many"), ("PMI_SIZE", "4")], 4),
            (&[("OMPI_COMM_WORLD_SIZE", "1")], 1),
        ] {
            let output = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "launch::tests::under_mpirun_child",
                    "--ignored",
                    "--nocapture",
                ])
                .env_remove("OMPI_COMM_WORLD_SIZE")
                .env_remove("PMI_SIZE")
                .envs(variables.iter().copied())
                .env("TANDEM_TEST_RANKS", expected.to_string())
                .output()
                .unwrap();
            assert!(output.status.success(), "{variables:?}: {output:?}");
            // The child ran (a name that matched nothing would also succeed).
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(stdout.contains("1 passed"), "{variables:?}: {stdout}");
        }
    }

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Context(&'static str, #[source] std::io::Error);

    #[test]
    fn an_error_names_each_cause_once() {
        let named = Context("cannot save: disk full", std::io::Error::other("disk full"));
        assert_eq!(describe(&named), "cannot save: disk full");
        let unnamed = Context("cannot save", std::io::Error::other("disk full"));
        assert_eq!(describe(&unnamed), "cannot save: disk full");
    }

    #[test]
    fn a_one_process_command_runs_alone_without_mpirun() {
        // The test runs without mpirun: nothing to refuse, no ranks.
        let launch = Launch::init(Some("eval")).unwrap();
        assert!(launch.leads() && launch.ranks().is_none());
        assert_eq!(launched_ranks(), 1);
    }
}
