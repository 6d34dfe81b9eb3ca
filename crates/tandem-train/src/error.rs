use std::path::PathBuf;

use tandem_checkpoint::CheckpointError;
use tandem_optim::MetadataError;
use tandem_pool::{DeviceError, MAX_REPLICAS};
use tandem_strategy::TrainError;

/// A flag or setting given for a resumed run that disagrees with the run's checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// How the user gave it, e.g. `--lr`.
    pub label: String,
    /// The value given.
    pub given: String,
    /// The run's value (empty where the run has none: a setting of the other mode).
    pub saved: String,
}

impl std::fmt::Display for Conflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Conflict {
            label,
            given,
            saved,
        } = self;
        match saved.is_empty() {
            true => write!(f, "{label} {given} (the run does not use it)"),
            false => write!(f, "{label} {given} (the run has {saved})"),
        }
    }
}

/// Why a checkpoint is not a run of this model and optimiser.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotThisRun {
    /// Its metadata is not a run configuration.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// Its step is past the end its metadata records.
    #[error("its step {step} is past its end_step {end}")]
    PastItsEnd {
        /// Its step.
        step: u64,
        /// Its end step.
        end: u64,
    },
    /// Its optimiser state is not the optimiser's.
    #[error("its optimiser state is not the optimiser's ({expected})")]
    OtherState {
        /// The optimiser's state vectors, by name.
        expected: String,
    },
}

/// Why a run could not start, go on or end as asked. Every variant says what to do about it
/// where there is something to do.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A length in epochs past [`MAX_STEPS`](crate::MAX_STEPS).
    #[error("{epochs} epochs is more than {max} steps", max = crate::MAX_STEPS)]
    TooLong {
        /// The epochs asked for.
        epochs: u64,
    },
    /// More workers across the ranks than a run may have.
    #[error(
        "{per_rank} worker(s) on each of {ranks} ranks is {workers} in all, more than the {max} \
         a run may have",
        max = crate::MAX_WORKERS
    )]
    TooManyWorkers {
        /// Workers on each rank.
        per_rank: usize,
        /// Ranks.
        ranks: usize,
        /// Their product.
        workers: usize,
    },
    /// The Ctrl-C handler could not be installed.
    #[error("cannot install the Ctrl-C handler: {0}")]
    CtrlC(#[source] ctrlc::Error),
    /// A checkpoint, or the run rank 0 sent, is not a run this trainer can continue.
    #[error("{}: {source}", .what.display())]
    NotARun {
        /// The file, or what sent it.
        what: PathBuf,
        /// Why.
        source: NotThisRun,
    },
    /// The run's own settings would write checkpoints that a resume refuses.
    #[error("the run's settings are not a run a resume could continue: {0}")]
    Unresumable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// `--devices` (or the caller's device list) cannot be used.
    #[error(transparent)]
    Devices(#[from] DeviceError),
    /// A replica could not be opened on its device.
    #[error("cannot open a replica on {device}: {source}")]
    Replica {
        /// The device.
        device: String,
        /// Why.
        source: tandem_core::ReplicaError,
    },
    /// Reading, writing or finding checkpoints failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A checkpoint could not be saved; the ones already there are intact.
    #[error("cannot save the checkpoint of step {step} in {dir} (the checkpoints already there are intact): {source}")]
    Save {
        /// The step.
        step: u64,
        /// The checkpoint directory.
        dir: PathBuf,
        /// Why.
        source: CheckpointError,
    },
    /// A fresh run would start a second lineage in a directory that holds a run's
    /// checkpoints.
    #[error(
        "{dir} already holds checkpoints of a run (the newest: {newest}, step {step}); continue \
         that run with --resume {dir}, or choose another --checkpoint-dir"
    )]
    OtherRun {
        /// The directory.
        dir: PathBuf,
        /// Its newest checkpoint.
        newest: PathBuf,
        /// That checkpoint's step.
        step: u64,
    },
    /// The resume directory does not exist.
    #[error("--resume {0}: no such directory")]
    NoResumeDir(PathBuf),
    /// A resume was asked to change what defines the run.
    #[error(
        "--resume {dir} continues the run as it was configured, but the command line changes \
         it: {}; drop these flags, or start a fresh run in another directory",
        .conflicts.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    Conflicts {
        /// The resume directory.
        dir: PathBuf,
        /// What differs.
        conflicts: Vec<Conflict>,
    },
    /// A sync run resumed on another number of workers: its data order and reduction would be
    /// another run's.
    #[error(
        "{checkpoint}: written by a sync run on {saved} worker(s), but the devices give {now}; a \
         sync run resumes exactly only on the same number (e.g. {})",
        devices_hint(*.saved, *.ranks)
    )]
    SyncWorkers {
        /// The checkpoint.
        checkpoint: PathBuf,
        /// Its run's workers.
        saved: usize,
        /// The workers the devices give now, every rank's.
        now: usize,
        /// The run's processes now (1: this one alone).
        ranks: usize,
    },
    /// The run is already at or past the step it was asked to reach.
    #[error("nothing to train: the run is at step {step} of {end}; pass --steps or --epochs to go further")]
    NothingToTrain {
        /// Where the run is.
        step: u64,
        /// Where it would end.
        end: u64,
    },
    /// A plan that would train past the run's configured end step.
    #[error(
        "the plan ends at step {plan}, past the run's end step {end}: a plan may train a run \
         only within its end (set a longer run with Length, or resume with a new length)"
    )]
    PlanPastEnd {
        /// Where the plan ends.
        plan: u64,
        /// Where the run ends.
        end: u64,
    },
    /// Training failed.
    #[error(transparent)]
    Train(#[from] TrainError),
    /// The caller's evaluation failed.
    #[error("evaluation at step {step} failed: {source}")]
    Evaluate {
        /// The step.
        step: u64,
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A run that must reach its end to be of use (a report's) was interrupted.
    #[error("interrupted at step {step}")]
    Interrupted {
        /// Where it stopped.
        step: u64,
    },
    /// The metrics file cannot be opened.
    #[error("cannot open the metrics file {path}: {source}")]
    Metrics {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// A `--devices` that gives `workers` workers on `ranks` processes of as many devices each,
/// or, where those cannot (a process holds at most [`MAX_REPLICAS`]), on the fewest ranks that
/// can.
fn devices_hint(workers: usize, ranks: usize) -> String {
    let r = ranks.max(1);
    if workers.is_multiple_of(r) && workers / r <= MAX_REPLICAS {
        return match r {
            1 => format!("--devices cpu:{workers}"),
            r => format!("--devices cpu:{} on each of the {r} ranks", workers / r),
        };
    }
    let why = match r {
        1 => format!("one process holds at most {MAX_REPLICAS} replicas"),
        r => format!("{workers} workers do not divide among {r} ranks of at most {MAX_REPLICAS}"),
    };
    let fewest = (workers.div_ceil(MAX_REPLICAS)..workers)
        .find(|&n| workers.is_multiple_of(n))
        .unwrap_or(workers);
    match fewest {
        1 => format!("--devices cpu:{workers} in one process; {why}"),
        n => format!("{n} ranks of --devices cpu:{}; {why}", workers / n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conflict_names_the_runs_value_or_says_it_has_none() {
        let conflict = |saved: &str| Conflict {
            label: "--async-rule".into(),
            given: "plain".into(),
            saved: saved.into(),
        };
        assert_eq!(
            conflict("scaled").to_string(),
            "--async-rule plain (the run has scaled)"
        );
        // A setting of the other mode (an async flag for a sync run), which the run lacks.
        assert_eq!(
            conflict("").to_string(),
            "--async-rule plain (the run does not use it)"
        );
    }

    #[test]
    fn the_devices_hint_counts_every_rank() {
        let hint = |saved, ranks| {
            RunError::SyncWorkers {
                checkpoint: "c".into(),
                saved,
                now: 4,
                ranks,
            }
            .to_string()
        };
        assert!(
            hint(2, 1).contains("(e.g. --devices cpu:2)"),
            "{}",
            hint(2, 1)
        );
        assert!(hint(2, 2).contains("--devices cpu:1 on each of the 2 ranks"));
        assert!(hint(6, 2).contains("--devices cpu:3 on each of the 2 ranks"));
        assert!(
            hint(3, 2).contains("--devices cpu:3 in one process; 3 workers do not divide among 2"),
            "{}",
            hint(3, 2)
        );
        // More than one process may hold: the fewest ranks that share them evenly, each
        // within the limit (every hint a --devices that parses).
        assert!(
            hint(512, 1).contains("2 ranks of --devices cpu:256; one process holds at most 256")
        );
        assert!(
            hint(600, 2).contains("3 ranks of --devices cpu:200"),
            "{}",
            hint(600, 2)
        );
        assert!(
            hint(257, 1).contains("257 ranks of --devices cpu:1"),
            "{}",
            hint(257, 1)
        );
        assert!(hint(65_536, 4).contains("256 ranks of --devices cpu:256"));
    }
}
