//! The default command: train, with checkpoints, resume, metrics and a summary. The run itself
//! is `tandem_train`'s; this wires the flags and MNIST into it and prints the summary.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::json;
use tandem_model::Mlp;
use tandem_optim::{Chosen, OPTIMIZERS};
use tandem_strategy::{Batches, Ranks};
use tandem_train::{
    out, output, BatchScaling, Checkpoints, Fresh, Interrupt, Length, Mode, Progress, Requested,
    Resume, Setup, Start, Summary, Trainer, Warmup, Watch, ASYNC_BOUND, ASYNC_RULE, ASYNC_WARMUP,
    LR_SCALING,
};

use crate::cli::{hidden_flag, TrainArgs, DEFAULT_EPOCHS, DEFAULT_INIT_STDDEV};
use crate::data::{self, Accuracy, Data};
use crate::model::{self, Mnist};

/// How the run starts: fresh from the flags (defaults for those not given), or resumed with
/// the flags given as settings that must agree with the run's.
fn start(args: &TrainArgs, mlp: &Mlp) -> Result<Start<Chosen>> {
    let length = match (args.steps, args.epochs) {
        (Some(steps), _) => Some(Length::Steps(steps)),
        (None, Some(epochs)) => Some(Length::Epochs(epochs)),
        (None, None) => None,
    };
    let Some(dir) = &args.resume else {
        let batches = Batches::DEFAULT;
        let batches = Batches {
            batch_size: args.batch_size.map_or(batches.batch_size, |b| b as usize),
            seed: args.seed.unwrap_or(batches.seed),
        };
        return Ok(Start::Fresh(Fresh {
            mode: args.mode().unwrap_or(Mode::Sync),
            async_rule: args.async_rule.unwrap_or_default(),
            async_warmup: args.async_warmup.unwrap_or(Warmup::Auto),
            async_bound: args.async_bound.unwrap_or_default(),
            lr_scaling: args.lr_scaling.unwrap_or_default(),
            optimizer: fresh_optimizer(args, mlp)?,
            params: model::initial_params(
                mlp,
                args.init_stddev.unwrap_or(DEFAULT_INIT_STDDEV),
                batches.seed,
            ),
            batches,
            length: length.unwrap_or(Length::Epochs(DEFAULT_EPOCHS)),
            save_every: args.save_every,
        }));
    };
    if let Some(stddev) = args.init_stddev {
        bail!(
            "--resume {} continues the run as it was configured, but the command line changes \
             it: --init-stddev {stddev} (the initial weights of a resumed run are long gone); \
             drop it, or start a fresh run in another directory",
            dir.display()
        );
    }
    let requested = [
        given("mode", "--sync/--async", args.mode().map(Mode::name)),
        given(ASYNC_RULE, "--async-rule", args.async_rule),
        given(ASYNC_WARMUP, "--async-warmup", args.async_warmup),
        given(ASYNC_BOUND, "--async-bound", args.async_bound),
        given(LR_SCALING, "--lr-scaling", args.lr_scaling),
        given("batch_size", "--batch-size", args.batch_size),
        given(Chosen::KEY, "--optimizer", args.optimizer.as_ref()),
        given("learning_rate", "--lr", args.learning_rate),
        given("lr_decay", "--lr-decay", args.lr_decay),
        given("weight_decay", "--weight-decay", args.weight_decay),
        given("ema_decay", "--ema-decay", args.ema_decay),
        given("seed", "--seed", args.seed),
    ];
    Ok(Start::Resume(Resume {
        dir: dir.clone(),
        requested: requested.into_iter().flatten().collect(),
        length,
        save_every: args.save_every,
    }))
}

/// The network to train: a fresh run's `--hidden` (the reference's by default); a resumed
/// run's own, as its checkpoints name it (`--hidden` may only repeat it). Across ranks, rank
/// 0's, which alone reads the checkpoints.
fn network(args: &TrainArgs, ranks: Option<&dyn Ranks>) -> Result<Mlp> {
    let mut mlp = args.hidden.clone().unwrap_or_else(Mlp::mnist);
    let lead = ranks.is_none_or(|r| r.rank() == 0);
    if let (true, Some(dir)) = (lead, &args.resume) {
        if let Some(run) = model::model_in(dir)? {
            if args.hidden.as_ref().is_some_and(|asked| *asked != run) {
                bail!(
                    "--resume {} continues the run as it was configured, but the command line \
                     changes it: --hidden {} (the run's network is {}, --hidden {}); drop it, \
                     or start a fresh run in another directory",
                    dir.display(),
                    hidden_flag(&mlp),
                    run.name(),
                    hidden_flag(&run)
                );
            }
            mlp = run;
        }
    }
    if let Some(ranks) = ranks {
        let mut name = mlp.name().into_bytes();
        ranks.broadcast(&mut name);
        mlp = Mlp::from_name(&String::from_utf8_lossy(&name))?;
    }
    Ok(mlp)
}

/// A fresh run's optimiser: `--optimizer`'s at its defaults but for the flags given (the
/// default optimiser's learning rate scaled to the network's depth where `--lr` is not).
fn fresh_optimizer(args: &TrainArgs, mlp: &Mlp) -> Result<Chosen> {
    let name = args.optimizer.as_deref().unwrap_or(OPTIMIZERS[0].name);
    let default_rate = (name == OPTIMIZERS[0].name).then(|| model::default_learning_rate(mlp));
    let given: Vec<(&str, String)> = [
        ("learning_rate", args.learning_rate.or(default_rate)),
        ("lr_decay", args.lr_decay),
        ("weight_decay", args.weight_decay),
        ("ema_decay", args.ema_decay),
    ]
    .into_iter()
    .filter_map(|(key, value)| Some((key, value?.to_string())))
    .collect();
    Ok(Chosen::configure(name, &given)?)
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

/// Says why the run was given up on its hung workers (after saving what was consistent) and
/// ends the process as an interrupted one: their threads cannot be joined.
fn on_abandon(message: &str) -> ! {
    output::warn(message);
    std::process::exit(130);
}

/// The processes of this run: with the `mpi` feature, the `mpirun` job this process is a rank
/// of (one rank when started without `mpirun`).
#[cfg(feature = "mpi")]
fn ranks() -> Result<Option<Arc<dyn Ranks>>> {
    Ok(Some(Arc::new(tandem_strategy::mpi::MpiRanks::init()?)))
}

/// The processes of this run: this one alone, in a build without the `mpi` feature.
#[cfg(not(feature = "mpi"))]
fn ranks() -> Result<Option<Arc<dyn Ranks>>> {
    Ok(None)
}

/// Trains; the process's exit status when it must not be 0 (an interrupted run).
pub fn run(args: &TrainArgs) -> Result<Option<i32>> {
    let ranks = ranks()?;
    let Some(ranks) = ranks.filter(|r| r.ranks() > 1) else {
        return train(args, None);
    };
    match train(args, Some(ranks.clone())) {
        Ok(status) => Ok(status),
        // The other ranks would wait for this one forever: the whole job ends, and this
        // rank's error is what it printed last.
        Err(e) => {
            output::warn(format!(
                "error: rank {}: {}",
                ranks.rank(),
                crate::describe(&e)
            ));
            ranks.abort(1)
        }
    }
}

/// Trains as rank 0 (the only rank that reads or writes checkpoints, evaluates and reports) or
/// as one of the other ranks of `ranks`.
fn train(args: &TrainArgs, ranks: Option<Arc<dyn Ranks>>) -> Result<Option<i32>> {
    let wall = Instant::now();
    let lead = ranks.as_ref().is_none_or(|r| r.rank() == 0);
    // Before anything else: a run that could not save fails now rather than after an epoch.
    let checkpoints = match lead {
        true => Checkpoints::take(
            args.checkpoint_dir.as_deref(),
            args.resume.as_deref(),
            args.keep,
        )?,
        false => None,
    };
    let data = data::load(args.data_dir.as_deref())?;
    let mlp = network(args, ranks.as_deref())?;
    let model = Mnist {
        mlp: mlp.clone(),
        train: &data.train,
    };
    let setup = Setup {
        ranks: ranks.clone(),
        ..model::setup(&args.devices)
    };
    let mut trainer = Trainer::open(model, start(args, &mlp)?, &setup, checkpoints)?;
    let config = trainer.config.clone();
    let start = trainer.state.step;
    // Checkpoints at the run's cadence; evaluations once an epoch when there are metrics.
    let epoch = config.epochs(data.train.len()).steps_per_epoch();
    let plan = trainer.plan(if args.metrics.is_some() { epoch } else { 0 });
    if start >= plan.end_step {
        bail!(tandem_train::RunError::NothingToTrain {
            step: start,
            end: plan.end_step
        });
    }
    let interrupt = Interrupt::on_ctrl_c()?;
    if !lead {
        return follow(&mut trainer, &plan, args, &interrupt);
    }
    let progress = Progress::new(
        args.log_format.into(),
        args.log_every,
        start,
        config.end_step,
        args.metrics.as_deref(),
    )?;
    progress.println(&format!(
        "tandem: {} training on {} worker(s) [{}], batch {} per worker, steps {}..{}{}",
        config.mode.name(),
        config.workers,
        devices(&trainer, ranks.as_deref()),
        config.batches.batch_size,
        start,
        config.end_step,
        trainer
            .resumed_from()
            .map(|p| format!(", resumed from {}", p.display()))
            .unwrap_or_default()
    ));
    let watch = Watch {
        progress: Some(&progress),
        log_every: args.log_every,
        interrupt: &interrupt,
        stall_timeout: Some(Duration::from_secs(args.stall_timeout)),
        on_abandon: Some(on_abandon),
    };
    let summary = trainer.train(&plan, &watch, &mut |segment| {
        let validation = data::accuracy(&mlp, segment.state, &config.optimizer, &data.validation)?;
        progress.record(json!({
            "kind": "eval",
            "step": segment.state.step,
            "wall_time": segment.totals.seconds,
            "validation_accuracy_averaged": validation.averaged,
            "validation_accuracy_raw": validation.raw,
        }));
        Ok(())
    })?;
    progress.finish();
    if summary.stopped {
        if let Some(status) = output::failure_status() {
            // stdout was closed under the run: nobody is left to read a summary.
            return Ok(Some(status));
        }
        let step = trainer.state.step;
        match &summary.last_checkpoint {
            Some(path) => out!(
                "interrupted at step {step}: checkpoint written to {}",
                path.display()
            ),
            None => out!("interrupted at step {step} (no --checkpoint-dir, nothing saved)"),
        }
        return Ok(Some(130));
    }
    let test = summarise(&trainer, &mlp, &summary, &data, ranks.as_deref(), wall)?;
    let chance = data::chance_accuracy(&data.test);
    let best = test.averaged.max(test.raw);
    if trainer.state.step >= epoch && best < chance + CHANCE_MARGIN && !args.allow_chance {
        bail!(
            "the run ended at chance level: test accuracy {best:.4}, where always answering the \
             commonest digit gives {chance:.4}; it diverged or learnt nothing (try a smaller \
             --lr; the default is {} for this network). Its checkpoints are kept; \
             --allow-chance accepts such a run",
            model::default_learning_rate(&mlp)
        );
    }
    Ok(None)
}

/// How far above the commonest label's share a run's test accuracy must end (after an epoch
/// or more) not to count as chance level: a network that learnt anything is far above it.
const CHANCE_MARGIN: f64 = 0.05;

/// A rank other than 0: trains its part of the run, silently (rank 0 reports for all).
fn follow(
    trainer: &mut Trainer<Mnist<'_>, Chosen>,
    plan: &tandem_train::Plan,
    args: &TrainArgs,
    interrupt: &Interrupt,
) -> Result<Option<i32>> {
    let watch = Watch {
        progress: None,
        log_every: 0,
        interrupt,
        stall_timeout: Some(Duration::from_secs(args.stall_timeout)),
        on_abandon: Some(on_abandon),
    };
    let summary = trainer.train(plan, &watch, &mut |_| Ok(()))?;
    Ok(summary.stopped.then_some(130))
}

/// The run's devices: this process's, or every rank's (as many on each) across ranks.
fn devices(trainer: &Trainer<Mnist<'_>, Chosen>, ranks: Option<&dyn Ranks>) -> String {
    let mine = trainer.device_names().join(", ");
    match ranks {
        Some(ranks) => format!("{} ranks x {mine}", ranks.ranks()),
        None => mine,
    }
}

fn summarise(
    trainer: &Trainer<Mnist<'_>, Chosen>,
    mlp: &Mlp,
    summary: &Summary,
    data: &Data,
    ranks: Option<&dyn Ranks>,
    wall: Instant,
) -> Result<Accuracy> {
    let (state, totals) = (&trainer.state, &summary.totals);
    let optimizer = &trainer.config.optimizer;
    let validation = data::accuracy(mlp, state, optimizer, &data.validation)?;
    let test = data::accuracy(mlp, state, optimizer, &data.test)?;
    out!("== summary ==");
    let config = &trainer.config;
    // Every rank's.
    let workers = config.workers;
    match config.mode {
        Mode::Sync => {
            let examples = config.batches.batch_size as u64 * workers as u64;
            match config.lr_scaling.factor(examples) {
                1.0 => out!("mode:                sync"),
                factor => out!(
                    "mode:                sync, learning rate x{factor} for a global batch of \
                     {examples} (scaling {}, reached over the first {} epochs)",
                    config.lr_scaling,
                    BatchScaling::WARMUP_EPOCHS
                ),
            }
        }
        Mode::Async => out!(
            "mode:                async, rule {}, warm-up {} epoch(s) on one worker, bound {}",
            config.async_rule,
            config.async_warmup.epochs(workers),
            config.async_bound
        ),
    }
    out!(
        "devices:             {} [{}]",
        trainer.config.workers,
        devices(trainer, ranks)
    );
    out!(
        "steps:               {} ({} examples this run)",
        state.step,
        totals.examples
    );
    out!("examples/sec:        {:.0}", totals.examples_per_sec());
    if let Some(staleness) = totals.staleness() {
        out!(
            "staleness:           mean {:.2}, max {}{}",
            staleness.mean,
            staleness.max,
            match staleness.dropped {
                0 => String::new(),
                n => format!(", {n} too stale dropped"),
            }
        );
    }
    for failure in &totals.failures {
        out!("worker failure:      {failure} (out for the rest of the run)");
    }
    data::print_accuracy(validation, test);
    if let Some(path) = &summary.last_checkpoint {
        out!("checkpoint:          {}", path.display());
    }
    out!("training time:       {:.1} s", totals.seconds);
    out!("wall time:           {:.1} s", wall.elapsed().as_secs_f64());
    Ok(test)
}
