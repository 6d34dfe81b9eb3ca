//! Crashes at random moments: `kill -9` never leaves a damaged checkpoint, and a sync run
//! killed and resumed ends with checkpoint files byte for byte equal to an uninterrupted run's.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use tandem_checkpoint::{self as checkpoint, CheckpointDir};
use tandem_model::{Mlp, Network};

use common::{arg, command, succeed};

fn spawn(args: &[&str]) -> Child {
    command(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot run mnist-train")
}

/// The run's flags: sync on 2 workers, a checkpoint every `save_every` steps, the newest 3 kept
/// (so that a run left behind by a failed test cannot fill the disk).
fn run_args<'a>(
    dir_flag: &'a str,
    dir: &'a str,
    steps: &'a str,
    save_every: &'a str,
) -> Vec<&'a str> {
    vec![
        "--devices",
        "cpu:2",
        "--log-every",
        "0",
        "--keep",
        "3",
        dir_flag,
        dir,
        "--steps",
        steps,
        "--save-every",
        save_every,
    ]
}

fn checkpoints(dir: &Path) -> Vec<(u64, PathBuf)> {
    CheckpointDir::open(dir)
        .expect("the checkpoint directory")
        .checkpoints()
        .expect("its checkpoints")
}

#[test]
fn kill_9_at_random_moments_leaves_only_loadable_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let layout = Mlp::mnist().layout();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut killed_with_checkpoints = 0;
    for round in 0..24 {
        // Fresh until something was saved, then resumed: every round continues the run.
        let resume = dir.exists() && !checkpoints(&dir).is_empty();
        let flag = if resume {
            "--resume"
        } else {
            "--checkpoint-dir"
        };
        let mut child = spawn(&run_args(flag, arg(&dir), "1000000", "5"));
        // Past the data loading, into training and saving.
        sleep(Duration::from_millis(rng.random_range(300..1500)));
        child.kill().expect("kill -9");
        child.wait().expect("the killed run");
        let saved = checkpoints(&dir);
        for (step, path) in &saved {
            let loaded =
                checkpoint::load(path, &layout).unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert_eq!(loaded.state.step, *step, "{}", path.display());
        }
        killed_with_checkpoints += usize::from(!saved.is_empty());
    }
    assert!(
        killed_with_checkpoints >= 20,
        "only {killed_with_checkpoints} rounds saved anything"
    );
    // A clean resume after all that sweeps the temporary files the kills left.
    let newest = checkpoints(&dir).last().expect("a checkpoint").0;
    let end = (newest + 10).to_string();
    succeed(&run_args("--resume", arg(&dir), &end, "5"));
    let leftovers: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("step-") && !n.starts_with(".tandem.lock"))
        .collect();
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
}

/// Waits until `path` exists (or fails the test after a minute).
fn wait_for(path: &Path) {
    let started = Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{} never came",
            path.display()
        );
        sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_killed_and_resumed_sync_run_ends_bitwise_equal_to_an_uninterrupted_one() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    succeed(&run_args("--checkpoint-dir", arg(&whole), "1000", "100"));
    let last = "step-0000001000.safetensors";
    let expected = std::fs::read(whole.join(last)).unwrap();
    for signal in ["-KILL", "-TERM", "-INT"] {
        let dir = tmp.path().join(signal);
        let mut child = spawn(&run_args("--checkpoint-dir", arg(&dir), "1000", "100"));
        wait_for(&dir.join("step-0000000100.safetensors"));
        let status = std::process::Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        child.wait().unwrap();
        let interrupted_at = checkpoints(&dir).last().unwrap().0;
        assert!(
            interrupted_at < 1000,
            "{signal}: the run ended before the signal"
        );
        succeed(&run_args("--resume", arg(&dir), "1000", "100"));
        assert!(
            std::fs::read(dir.join(last)).unwrap() == expected,
            "{signal} at step {interrupted_at}: the resumed run's last checkpoint differs"
        );
    }
}
