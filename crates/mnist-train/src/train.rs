//! The default command: train, with checkpoints, resume, metrics and a summary. The run itself
//! is `tandem_train`'s; this wires the flags and MNIST into it and prints the summary.

use std::time::Instant;

use anyhow::{bail, Result};
use serde_json::json;
use tandem_model::Mlp;
use tandem_optim::{Chosen, RecordedOptimizer, OPTIMIZERS};
use tandem_train::{
    drive, print_summary, Checkpoints, Ended, Interrupt, Launch, Setup, Start, Trainer,
};

use crate::cli::{hidden_flag, TrainArgs, DEFAULT_INIT_STDDEV};
use crate::data::{self, Evaluator};
use crate::model::{self, Mnist};

/// How the run starts: fresh from the flags (defaults for those not given), or resumed with
/// the flags given as settings that must agree with the run's.
fn start(args: &TrainArgs, mlp: &Mlp) -> Result<Start<Chosen>> {
    if let (Some(dir), Some(stddev)) = (&args.run.resume, args.init_stddev) {
        bail!(
            "--resume {} continues the run as it was configured, but the command line changes \
             it: --init-stddev {stddev} (the initial weights of a resumed run are long gone); \
             drop it, or start a fresh run in another directory",
            dir.display()
        );
    }
    let stddev = args.init_stddev.unwrap_or(DEFAULT_INIT_STDDEV);
    // The default optimiser's learning rate scaled to the network's depth where `--lr` is not
    // given.
    let default_rate =
        |name: &str| (name == OPTIMIZERS[0].name).then(|| model::default_learning_rate(mlp));
    let params = |seed| model::initial_params(mlp, stddev, seed);
    Ok(args.run.start(default_rate, params)?)
}

/// The network to train: a fresh run's `--hidden` (the reference's by default); a resumed
/// run's own, as its checkpoints name it (`--hidden` may only repeat it). Across ranks, rank
/// 0's, which alone reads the checkpoints.
fn network(args: &TrainArgs, launch: &Launch) -> Result<Mlp> {
    let mut mlp = args.hidden.clone().unwrap_or_else(Mlp::mnist);
    if let (true, Some(dir)) = (launch.leads(), &args.run.resume) {
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
    if let Some(ranks) = launch.ranks() {
        let mut name = mlp.name().into_bytes();
        ranks.broadcast(&mut name);
        mlp = Mlp::from_name(&String::from_utf8_lossy(&name))?;
    }
    Ok(mlp)
}

/// Trains as the lead (alone or rank 0: the only rank that reads or writes checkpoints,
/// evaluates and reports) or as one of the other ranks; the process's exit status when it
/// must not be 0 (an interrupted run).
pub fn run(args: &TrainArgs, launch: &Launch) -> Result<Option<i32>> {
    let wall = Instant::now();
    // Before anything else: a run that could not save fails now rather than after an epoch.
    let checkpoints = match launch.leads() {
        true => Checkpoints::take(
            args.run.checkpoint_dir.as_deref(),
            args.run.resume.as_deref(),
            args.run.keep,
        )?,
        false => None,
    };
    let data = data::load(args.data_dir.as_deref())?;
    let mlp = network(args, launch)?;
    let model = Mnist {
        mlp: mlp.clone(),
        train: &data.train,
    };
    let setup = Setup {
        ranks: launch.ranks(),
        ..model::setup(&args.run.devices)
    };
    let mut trainer = Trainer::open(model, start(args, &mlp)?, &setup, checkpoints)?;
    let optimizer = trainer.config.optimizer.clone();
    let evaluator = match launch.leads() {
        true => Evaluator::for_run(args.eval_on, trainer.replica_devices()),
        false => Evaluator::Host, // never used: only the lead evaluates
    };
    let interrupt = Interrupt::on_ctrl_c()?;
    let ended = drive(
        &mut trainer,
        &args.run.shown(),
        &interrupt,
        &mut |segment, progress| {
            let validation =
                evaluator.accuracy(&mlp, segment.state, &optimizer, &data.validation)?;
            progress.record(json!({
                "kind": "eval",
                "step": segment.state.step,
                "wall_time": segment.totals.seconds,
                "validation_accuracy_averaged": validation.averaged,
                "validation_accuracy_raw": validation.raw,
                "loss_scale_overflows": segment.totals.loss_scaling.map(|s| s.overflows),
                "loss_scale": segment.totals.loss_scaling.map(|s| s.smallest),
            }));
            Ok(())
        },
    )?;
    let summary = match ended {
        Ended::Done(summary) => summary,
        Ended::Followed => return Ok(None),
        Ended::Stopped(status) => return Ok(Some(status)),
    };
    let validation = evaluator.accuracy(&mlp, &trainer.state, &optimizer, &data.validation)?;
    let test = evaluator.accuracy(&mlp, &trainer.state, &optimizer, &data.test)?;
    print_summary(
        &trainer,
        &summary,
        &data::accuracy_lines(validation, test),
        wall,
    );
    let chance = data::chance_accuracy(&data.test);
    let best = test.averaged.max(test.raw);
    let epoch = trainer.epochs().steps_per_epoch();
    if trainer.state.step >= epoch && best < chance + CHANCE_MARGIN && !args.allow_chance {
        // The run's own rate (its optimiser's, given or default): a resume keeps it.
        let rate = (optimizer.record().into_iter())
            .find(|(key, _)| *key == "learning_rate")
            .map(|(_, rate)| format!(" than this run's {rate}"))
            .unwrap_or_default();
        bail!(
            "the run ended at chance level: test accuracy {best:.4}, where always answering the \
             commonest digit gives {chance:.4}; it diverged or learnt nothing (try a fresh run \
             with a smaller --lr{rate}). Its checkpoints are kept; --allow-chance accepts such \
             a run"
        );
    }
    Ok(None)
}

/// How far above the commonest label's share a run's test accuracy must end (after an epoch
/// or more) not to count as chance level: a network that learnt anything is far above it.
const CHANCE_MARGIN: f64 = 0.05;
