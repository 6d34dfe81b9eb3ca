//! A hostile user against the training command: foreign and shared checkpoint directories,
//! unwritable ones, lying and damaged checkpoints, absurd flags, a closed stdout. Each test
//! reproduces a way a run used to lose work or crash.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tandem_checkpoint as checkpoint;
use tandem_model::{Mlp, Network};

use common::{arg, command, fail, mnist_train, stderr, stdout, succeed};

/// A quick sync run's flags: 2 workers of 10 examples, no progress lines.
fn quick(dir: &Path, steps: u64, save_every: u64) -> Vec<String> {
    [
        "--devices",
        "cpu:2",
        "--batch-size",
        "10",
        "--log-every",
        "0",
        "--checkpoint-dir",
        arg(dir),
        "--steps",
        &steps.to_string(),
        "--save-every",
        &save_every.to_string(),
    ]
    .map(String::from)
    .to_vec()
}

fn run_ok(args: &[String]) -> String {
    succeed(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn run_fail(args: &[String]) -> String {
    fail(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The checkpoint files of `dir`, by name.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("the directory")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    names.sort();
    names
}

fn step_file(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("step-{step:010}.safetensors"))
}

#[test]
fn a_fresh_run_refuses_a_directory_holding_another_runs_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("old");
    run_ok(&quick(&dir, 30, 10));
    let before: Vec<(String, Vec<u8>)> = names(&dir)
        .into_iter()
        .map(|n| (n.clone(), fs::read(dir.join(&n)).unwrap()))
        .collect();
    assert_eq!(before.len(), 3);
    // Used to train, rotate the old run's newer files... and delete its own.
    let message = run_fail(&quick(&dir, 5, 2));
    assert!(message.contains("already holds checkpoints"), "{message}");
    assert!(message.contains("--resume"), "{message}");
    let after: Vec<(String, Vec<u8>)> = names(&dir)
        .into_iter()
        .map(|n| (n.clone(), fs::read(dir.join(&n)).unwrap()))
        .collect();
    assert_eq!(before, after, "the old run's checkpoints changed");
}

#[test]
fn rotation_keeps_foreign_and_damaged_files_and_orders_by_step() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    run_ok(&quick(&dir, 20, 10));
    // Files that are not this run's checkpoints: a foreign name, a damaged file.
    fs::write(dir.join("step-best.safetensors"), b"mine, not tandem's").unwrap();
    let damaged = step_file(&dir, 15);
    fs::write(&damaged, b"\x08\0\0\0\0\0\0\0{}").unwrap();
    let mut resume = quick(&dir, 60, 10);
    resume.splice(6..8, ["--resume".to_string(), arg(&dir).to_string()]);
    resume.extend(["--keep".into(), "2".into()]);
    let out = run_ok(&resume);
    assert!(out.contains("step-0000000060.safetensors"), "{out}");
    assert_eq!(
        names(&dir),
        [
            "step-0000000015.safetensors",
            "step-0000000050.safetensors",
            "step-0000000060.safetensors",
            "step-best.safetensors",
        ]
    );
}

#[test]
fn a_second_run_on_a_directory_in_use_is_refused_naming_the_holder() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("shared");
    let mut args = quick(&dir, 1_000_000, 1000);
    args[5] = "1".into(); // --log-every
    let mut first = command(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Once it prints a step, it holds the directory.
    let mut lines = BufReader::new(first.stdout.take().unwrap()).lines();
    while let Some(Ok(line)) = lines.next() {
        if line.starts_with("step ") {
            break;
        }
    }
    let message = run_fail(&quick(&dir, 5, 1));
    let _ = first.kill();
    let _ = first.wait();
    assert!(message.contains("in use by another run"), "{message}");
    assert!(
        message.contains(&first.id().to_string()),
        "does not name process {}: {message}",
        first.id()
    );
    // The second run did not write into the first's directory.
    assert!(!step_file(&dir, 5).exists());
}

#[test]
fn an_unwritable_checkpoint_directory_fails_before_training() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    fs::write(&file, b"x").unwrap();
    for dir in [file.clone(), file.join("below")] {
        let output = mnist_train(
            &quick(&dir, 100_000, 100_000)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        );
        assert!(!output.status.success());
        let message = stderr(&output);
        assert!(message.contains(arg(&dir)), "{message}");
        assert!(!message.contains("panicked"), "{message}");
        // It failed before training: no run header.
        assert!(!stdout(&output).contains("tandem:"), "{}", stdout(&output));
    }
}

/// A read-only directory: by permissions where they bind (not root), else a read-only tmpfs
/// (root, as in CI, where permissions do not stop writes). Unmounted on drop.
struct ReadOnlyDir {
    path: PathBuf,
    mounted: bool,
}

impl ReadOnlyDir {
    fn new(parent: &Path) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let path = parent.join("read-only");
        fs::create_dir(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o555)).unwrap();
        if fs::write(path.join("probe"), b"x").is_err() {
            return Self {
                path,
                mounted: false,
            };
        }
        fs::remove_file(path.join("probe")).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "ro,size=1m", "tandem-test", arg(&path)])
            .status();
        assert!(
            status.is_ok_and(|s| s.success()),
            "cannot make a read-only directory: permissions do not bind and mount failed"
        );
        Self {
            path,
            mounted: true,
        }
    }
}

impl Drop for ReadOnlyDir {
    fn drop(&mut self) {
        if self.mounted {
            let _ = std::process::Command::new("umount")
                .arg(&self.path)
                .status();
        }
    }
}

#[test]
fn a_read_only_checkpoint_directory_fails_before_training() {
    let tmp = tempfile::tempdir().unwrap();
    let read_only = ReadOnlyDir::new(tmp.path());
    for dir in [read_only.path.clone(), read_only.path.join("run")] {
        let output = mnist_train(
            &quick(&dir, 100_000, 100_000)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        );
        let message = stderr(&output);
        assert!(!output.status.success(), "{message}");
        assert!(message.contains(arg(&read_only.path)), "{message}");
        assert!(!stdout(&output).contains("tandem:"), "{}", stdout(&output));
    }
}

/// A valid checkpoint of a quick run, with the step it holds.
fn trained_checkpoint(dir: &Path) -> PathBuf {
    run_ok(&quick(dir, 4, 4));
    step_file(dir, 4)
}

/// Rewrites `path` with its metadata changed by `edit`.
fn with_metadata(path: &Path, out: &Path, edit: impl Fn(&mut BTreeMap<String, String>)) {
    let layout = Mlp::mnist().layout();
    let mut saved = checkpoint::load(path, &layout).unwrap();
    edit(&mut saved.metadata);
    fs::write(
        out,
        checkpoint::to_bytes(&saved.state, &layout, &saved.metadata).unwrap(),
    )
    .unwrap();
}

#[test]
fn lying_metadata_is_rejected_by_eval_predict_and_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let good = trained_checkpoint(&tmp.path().join("good"));
    let digit = tmp.path().join("digit.png");
    image::GrayImage::from_fn(28, 28, |x, _| image::Luma([if x == 14 { 255 } else { 0 }]))
        .save(&digit)
        .unwrap();
    let lies: [(&str, &str); 9] = [
        ("batch_size", "0"),
        ("batch_size", "100000000"),
        ("workers", "0"),
        ("format", "someone-else-v9"),
        ("model", "784-10"),
        ("end_step", "2"),
        ("learning_rate", "NaN"),
        ("ema_decay", "1.5"),
        ("mode", "both"),
    ];
    for (key, value) in lies {
        let dir = tmp.path().join(format!("lie-{key}-{value}"));
        fs::create_dir(&dir).unwrap();
        let lying = step_file(&dir, 4);
        with_metadata(&good, &lying, |m| {
            m.insert(key.into(), value.into());
        });
        let message = fail(&["eval", "--checkpoint", arg(&lying)]);
        assert!(message.contains(arg(&lying)), "{key}={value}: {message}");
        assert!(message.contains(key), "{key}={value}: {message}");
        fail(&["predict", "--checkpoint", arg(&lying), arg(&digit)]);
        // Resuming skips it, says so, and finds nothing else.
        let message = fail(&["--resume", arg(&dir), "--log-every", "0"]);
        assert!(message.contains("no usable checkpoint"), "{message}");
        assert!(message.contains(key), "{key}={value}: {message}");
    }
    // A missing step is not step 0.
    let dir = tmp.path().join("no-step");
    fs::create_dir(&dir).unwrap();
    let bytes = fs::read(&good).unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let at = text.find("\"step\"").expect("the step in the header");
    let mut edited = bytes.clone();
    edited[at + 1..at + 5].copy_from_slice(b"stop");
    fs::write(step_file(&dir, 4), edited).unwrap();
    let message = fail(&["eval", "--checkpoint", arg(&step_file(&dir, 4))]);
    assert!(message.contains("step"), "{message}");
}

#[test]
fn non_finite_weights_are_damage_and_resume_falls_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    run_ok(&quick(&dir, 20, 10));
    let newest = step_file(&dir, 20);
    let mut bytes = fs::read(&newest).unwrap();
    // 400 bytes of 0xFF in the data section: NaNs.
    let end = bytes.len() - 1000;
    bytes[end - 400..end].fill(0xFF);
    fs::write(&newest, &bytes).unwrap();
    let message = fail(&["eval", "--checkpoint", arg(&newest)]);
    assert!(message.contains("non-finite"), "{message}");
    // predict used to answer `0 (p = NaN)` with it.
    let digit = tmp.path().join("digit.png");
    image::GrayImage::from_fn(28, 28, |x, _| image::Luma([if x == 14 { 255 } else { 0 }]))
        .save(&digit)
        .unwrap();
    let message = fail(&["predict", "--checkpoint", arg(&newest), arg(&digit)]);
    assert!(message.contains("non-finite"), "{message}");
    let output = mnist_train(&["--resume", arg(&dir), "--steps", "30", "--log-every", "0"]);
    let said = stderr(&output);
    assert!(output.status.success(), "{said}");
    assert!(
        said.contains("skipped") && said.contains(arg(&newest)),
        "{said}"
    );
    assert!(
        stdout(&output).contains("steps 10..30"),
        "{}",
        stdout(&output)
    );
}

#[test]
fn absurd_flags_are_refused_with_the_reason() {
    let cases: [(&[&str], &str); 14] = [
        (&["--lr", "NaN"], "not finite"),
        (&["--lr", "inf"], "not finite"),
        (&["--lr", "-0.8"], "must be > 0"),
        (&["--lr=-0.8"], "must be > 0"),
        (&["--lr", "0"], "must be > 0"),
        (&["--lr-decay=-1"], "(0, 1]"),
        (&["--weight-decay", "NaN"], "not finite"),
        (&["--init-stddev", "NaN"], "not finite"),
        (&["--ema-decay", "1.5"], "[0, 1)"),
        (&["--ema-decay", "-3"], "[0, 1)"),
        (&["--ema-decay", "NaN"], "not finite"),
        (&["--epochs", "18446744073709551615"], "epochs"),
        (&["--devices", "cpu:5000"], "256"),
        (&["--save-every", "10"], "--checkpoint-dir"),
    ];
    for (flags, reason) in cases {
        let output = mnist_train(flags);
        let message = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{flags:?}: {message}");
        assert!(message.contains(reason), "{flags:?}: {message}");
        assert!(
            !message.contains("unexpected argument"),
            "{flags:?}: {message}"
        );
    }
}

#[test]
fn resume_refuses_conflicting_flags_and_keeps_the_runs_cadence() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    run_ok(&quick(&dir, 6, 3));
    for (flags, named) in [
        (vec!["--async"], "--sync/--async"),
        (vec!["--batch-size", "20"], "--batch-size"),
        (vec!["--lr", "0.5"], "--lr"),
        (vec!["--seed", "7"], "--seed"),
        (vec!["--init-stddev", "0.2"], "--init-stddev"),
    ] {
        let mut args = vec!["--resume", arg(&dir), "--steps", "9"];
        args.extend(flags);
        let message = fail(&args);
        assert!(message.contains(named), "{args:?}: {message}");
    }
    // The same values as the run's are no conflict.
    let mut args = vec!["--resume", arg(&dir), "--steps", "8", "--batch-size", "10"];
    args.extend(["--log-every", "0", "--save-every", "4", "--keep", "0"]);
    succeed(&args);
    // --save-every with --resume (no --checkpoint-dir) sets the cadence, and a later resume
    // keeps it.
    succeed(&[
        "--resume",
        arg(&dir),
        "--steps",
        "16",
        "--log-every",
        "0",
        "--keep",
        "0",
    ]);
    assert_eq!(
        names(&dir),
        [
            "step-0000000003.safetensors",
            "step-0000000006.safetensors",
            "step-0000000008.safetensors",
            "step-0000000012.safetensors",
            "step-0000000016.safetensors",
        ]
    );
}

#[test]
fn oversubscribed_cpu_workers_are_a_warning() {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()) + 1;
    let spec = format!("cpu:{workers}");
    let output = mnist_train(&["--devices", &spec, "--steps", "1", "--log-every", "0"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("share cores"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn a_metrics_file_that_fails_is_one_warning_naming_it_and_training_goes_on() {
    let output = mnist_train(&[
        "--steps",
        "30",
        "--log-every",
        "1",
        "--metrics",
        "/dev/full",
        "--devices",
        "cpu:2",
    ]);
    let message = stderr(&output);
    assert!(output.status.success(), "{message}");
    assert_eq!(message.matches("/dev/full").count(), 1, "{message}");
    assert!(stdout(&output).contains("== summary =="));
}

/// Starts a run with stdout piped, reads `lines` lines, closes the pipe and waits.
fn close_stdout_after(args: &[&str], lines: usize) -> (std::process::ExitStatus, String) {
    let mut child = command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut reader = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        for _ in 0..lines {
            line.clear();
            reader.read_line(&mut line).unwrap();
        }
    }
    let output = child.wait_with_output().unwrap();
    (output.status, stderr(&output))
}

#[test]
fn a_closed_stdout_stops_training_quietly_after_saving() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let mut args = quick(&dir, 1_000_000, 1_000_000);
    args[5] = "1".into(); // --log-every
    let (status, message) =
        close_stdout_after(&args.iter().map(String::as_str).collect::<Vec<_>>(), 2);
    assert_eq!(status.code(), Some(141), "{message}");
    assert!(
        !message.contains("panicked") && !message.contains("failed"),
        "{message}"
    );
    // The work done is saved, as after a Ctrl-C.
    let saved = checkpoint::CheckpointDir::open(&dir)
        .unwrap()
        .checkpoints()
        .unwrap();
    assert_eq!(saved.len(), 1, "{saved:?}");

    let good = trained_checkpoint(&tmp.path().join("eval"));
    // Closed before eval has loaded anything, so that its first line meets a closed pipe
    // rather than a pipe buffer.
    let (status, message) = close_stdout_after(&["eval", "--checkpoint", arg(&good)], 0);
    assert_eq!(status.code(), Some(141), "{message}");
    assert!(!message.contains("panicked"), "{message}");
}

#[test]
fn identical_runs_write_identical_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    run_ok(&quick(&a, 5, 5));
    run_ok(&quick(&b, 5, 5));
    assert_eq!(
        fs::read(step_file(&a, 5)).unwrap(),
        fs::read(step_file(&b, 5)).unwrap()
    );
}
