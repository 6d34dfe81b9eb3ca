//! The training command as a user runs it: metrics, async, a diverging run, Ctrl-C, and the
//! resume errors a user meets.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use serde_json::Value;
use tandem_checkpoint as checkpoint;
use tandem_model::{Mlp, Network};

use common::{arg, command, fail, line_starting, mnist_train, stderr, succeed};

/// The number after `prefix` on its line of `text`.
fn number_after(text: &str, prefix: &str) -> f64 {
    line_starting(text, prefix)[prefix.len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.trim_end_matches(',').parse().ok())
        .unwrap_or_else(|| panic!("no number after {prefix:?} in:\n{text}"))
}

#[test]
fn metrics_hold_every_logged_step_and_every_epochs_validation() {
    let tmp = tempfile::tempdir().unwrap();
    let metrics = tmp.path().join("run.jsonl");
    // 2 workers x 100: an epoch is 275 steps.
    succeed(&[
        "--steps",
        "600",
        "--devices",
        "cpu:2",
        "--log-every",
        "50",
        "--metrics",
        arg(&metrics),
    ]);
    let records: Vec<Value> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let of_kind =
        |kind: &str| -> Vec<&Value> { records.iter().filter(|r| r["kind"] == kind).collect() };
    let steps: Vec<u64> = of_kind("step")
        .iter()
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, (1..=12).map(|i| i * 50).collect::<Vec<_>>());
    let rates: Vec<f64> = of_kind("step")
        .iter()
        .map(|r| r["learning_rate"].as_f64().unwrap())
        .collect();
    assert!(rates.windows(2).all(|w| w[1] < w[0]), "{rates:?}");
    // The reference's schedule: 0.8 x 0.99^(step / 275).
    assert!(
        (rates[0] - 0.8 * 0.99f64.powf(49.0 / 275.0)).abs() < 1e-6,
        "{rates:?}"
    );
    let losses: Vec<f64> = of_kind("step")
        .iter()
        .map(|r| r["loss"].as_f64().unwrap())
        .collect();
    assert!(
        losses.iter().all(|l| l.is_finite() && *l > 0.0),
        "{losses:?}"
    );
    assert!(
        losses[11] < losses[0] / 2.0,
        "the loss did not fall: {losses:?}"
    );
    let evals: Vec<(u64, f64)> = of_kind("eval")
        .iter()
        .map(|r| {
            (
                r["step"].as_u64().unwrap(),
                r["validation_accuracy_averaged"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        evals.iter().map(|e| e.0).collect::<Vec<_>>(),
        [275, 550, 600]
    );
    assert!(evals.iter().all(|e| e.1 > 0.9 && e.1 <= 1.0), "{evals:?}");
}

#[test]
fn a_global_batch_that_does_not_divide_an_epoch_ends_epochs_where_the_data_does() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let metrics = tmp.path().join("run.jsonl");
    // 3 workers x 64 = 192 per step: 286.46 steps an epoch. Two epochs end at the first step
    // by which 110,000 examples are drawn (573); checkpoints and evaluations come every 287.
    let out = succeed(&[
        "--epochs",
        "2",
        "--devices",
        "cpu:3",
        "--batch-size",
        "64",
        "--log-every",
        "573",
        "--checkpoint-dir",
        arg(&dir),
        "--keep",
        "0",
        "--metrics",
        arg(&metrics),
    ]);
    assert!(
        line_starting(&out, "steps:").contains("573 (110016 examples"),
        "{out}"
    );
    let saved: Vec<u64> = checkpoint::CheckpointDir::open(&dir)
        .unwrap()
        .checkpoints()
        .unwrap()
        .into_iter()
        .map(|(step, _)| step)
        .collect();
    assert_eq!(saved, [287, 573]);
    let records: Vec<Value> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let evals: Vec<u64> = records
        .iter()
        .filter(|r| r["kind"] == "eval")
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    assert_eq!(evals, [287, 573]);
    // The schedule's epoch is continuous: step 573 (from 0: 572) has drawn 572 x 192 examples.
    let last = records.iter().find(|r| r["kind"] == "step").unwrap();
    assert_eq!(last["step"], 573);
    let rate = last["learning_rate"].as_f64().unwrap();
    assert!(
        (rate - 0.8 * 0.99f64.powf(572.0 * 192.0 / 55_000.0)).abs() < 1e-6,
        "{rate}"
    );
}

#[test]
fn async_training_learns_and_reports_staleness() {
    let out = succeed(&[
        "--async",
        "--steps",
        "600",
        "--devices",
        "cpu:2",
        "--log-every",
        "0",
    ]);
    assert_eq!(
        line_starting(&out, "mode:"),
        "mode:                async, rule scaled, warm-up 0 epoch(s) on one worker, bound none"
    );
    let staleness = number_after(&out, "staleness:           mean");
    assert!((0.0..10.0).contains(&staleness), "{out}");
    assert!(number_after(&out, "test accuracy:") > 0.9, "{out}");
    assert!(number_after(&out, "steps:") == 600.0, "{out}");
}

#[test]
fn a_diverging_run_fails_naming_the_step_and_keeps_its_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let message = fail(&[
        "--lr",
        "1e6",
        "--steps",
        "100",
        "--devices",
        "cpu:2",
        "--log-every",
        "0",
        "--checkpoint-dir",
        arg(&dir),
        "--save-every",
        "1",
    ]);
    assert!(message.contains("training diverged"), "{message}");
    assert!(message.contains("failed at step"), "{message}");
    // Every checkpoint written before the divergence is whole, with finite values.
    let saved = checkpoint::CheckpointDir::open(&dir)
        .unwrap()
        .checkpoints()
        .unwrap();
    assert!(!saved.is_empty(), "{message}");
    for (_, path) in saved {
        checkpoint::load(&path, &Mlp::mnist().layout()).unwrap();
    }
}

#[test]
fn a_run_that_ends_at_chance_level_says_so_and_fails_unless_allowed() {
    // --lr 5 kills every ReLU within the first steps: the loss stays finite, the network
    // answers one digit.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let chance = [
        "--lr",
        "5",
        "--epochs",
        "1",
        "--devices",
        "cpu:2",
        "--log-every",
        "0",
        "--checkpoint-dir",
        arg(&dir),
    ];
    let message = fail(&chance);
    assert!(message.contains("ended at chance level"), "{message}");
    assert!(message.contains("--allow-chance"), "{message}");
    // The rate to go below is the run's own, not a default it did not use.
    assert!(
        message.contains("smaller --lr than this run's 5)"),
        "{message}"
    );
    // The summary came first, and the run's checkpoint is kept.
    let saved = checkpoint::CheckpointDir::open(&dir)
        .unwrap()
        .checkpoints()
        .unwrap();
    assert_eq!(saved.len(), 1, "{message}");
    std::fs::remove_dir_all(&dir).unwrap();
    let out = succeed(&[&chance[..], &["--allow-chance"]].concat());
    assert!(number_after(&out, "test accuracy:") < 0.2, "{out}");
}

#[test]
fn an_error_names_its_cause_once() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("not-a-dir");
    std::fs::write(&file, "").unwrap();
    let message = fail(&["--checkpoint-dir", arg(&file.join("run")), "--steps", "1"]);
    assert!(!message.contains("Caused by"), "{message}");
    assert_eq!(message.trim().lines().count(), 1, "{message}");
}

#[test]
fn ctrl_c_saves_and_exits_130() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let mut child = command(&[
        "--steps",
        "1000000",
        "--devices",
        "cpu:2",
        "--log-every",
        "1",
        "--checkpoint-dir",
        arg(&dir),
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first_step = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.starts_with("step "));
    assert!(first_step.is_some(), "the run printed no step");
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "{rest:?}");
    let said = rest
        .iter()
        .find(|l| l.starts_with("interrupted at step"))
        .expect("a final line");
    let saved = checkpoint::CheckpointDir::open(&dir)
        .unwrap()
        .checkpoints()
        .unwrap();
    assert_eq!(saved.len(), 1);
    assert!(said.ends_with(&saved[0].1.display().to_string()), "{said}");
    assert!(said.contains(&format!("at step {}:", saved[0].0)), "{said}");
}

#[test]
fn resume_errors_say_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    succeed(&[
        "--steps",
        "4",
        "--devices",
        "cpu:2",
        "--log-every",
        "0",
        "--checkpoint-dir",
        arg(&dir),
    ]);
    let message = fail(&["--resume", arg(&dir), "--log-every", "0"]);
    assert!(
        message.contains("nothing to train: the run is at step 4 of 4"),
        "{message}"
    );
    assert!(message.contains("--steps"), "{message}");
    let message = fail(&["--resume", arg(&dir), "--steps", "8", "--devices", "cpu:1"]);
    assert!(message.contains("sync run on 2 worker(s)"), "{message}");
    assert!(message.contains("--devices cpu:2"), "{message}");
    let message = fail(&["--resume", arg(&tmp.path().join("nowhere")), "--steps", "8"]);
    assert!(message.contains("nowhere"), "{message}");
}

#[test]
fn a_resume_refuses_every_flag_that_would_change_the_run_and_takes_the_runs_own_values() {
    let tmp = tempfile::tempdir().unwrap();
    let short = ["--steps", "2", "--devices", "cpu:1", "--log-every", "0"];
    // Each flag, a value the run does not have, and how the refusal names it.
    let runs = [
        (
            "--sync",
            vec![
                (vec!["--async"], "--sync/--async async (the run has sync)"),
                (
                    vec!["--lr-scaling", "1.5"],
                    "--lr-scaling 1.5 (the run has auto)",
                ),
                (
                    vec!["--batch-size", "50"],
                    "--batch-size 50 (the run has 100)",
                ),
                (vec!["--lr", "0.5"], "--lr 0.5 (the run has 0.8)"),
                (
                    vec!["--lr-decay", "0.9"],
                    "--lr-decay 0.9 (the run has 0.99)",
                ),
                (
                    vec!["--weight-decay", "0.001"],
                    "--weight-decay 0.001 (the run has 0.0001)",
                ),
                (
                    vec!["--ema-decay", "0.9"],
                    "--ema-decay 0.9 (the run has 0.99)",
                ),
                (vec!["--seed", "7"], "--seed 7 (the run has 1)"),
                (
                    vec!["--optimizer", "adam"],
                    "--optimizer adam (the run has sgd)",
                ),
                (
                    vec!["--precision", "bf16"],
                    "--precision bf16 (the run has f32)",
                ),
                (vec!["--init-stddev", "0.2"], "--init-stddev 0.2"),
                (
                    vec!["--hidden", "256,128"],
                    "--hidden 256,128 (the run's network is 784-500-10, --hidden 500)",
                ),
            ],
        ),
        (
            "--async",
            vec![
                (vec!["--sync"], "--sync/--async sync (the run has async)"),
                (
                    vec!["--async-rule", "plain"],
                    "--async-rule plain (the run has scaled)",
                ),
                (
                    vec!["--async-warmup", "3"],
                    "--async-warmup 3 (the run has auto)",
                ),
                (
                    vec!["--async-bound", "wait:1"],
                    "--async-bound wait:1 (the run has none)",
                ),
            ],
        ),
    ];
    for (mode, changes) in runs {
        let dir = tmp.path().join(mode);
        succeed(&[&short[..], &[mode, "--checkpoint-dir", arg(&dir)]].concat());
        for (change, named) in changes {
            let resume = [&["--resume", arg(&dir), "--steps", "4"][..], &change].concat();
            let message = fail(&resume);
            assert!(message.contains(named), "{mode} run, {change:?}: {message}");
        }
    }
    // The run's own values are no change.
    let dir = tmp.path().join("--sync");
    succeed(&[
        "--resume",
        arg(&dir),
        "--steps",
        "4",
        "--lr",
        "0.8",
        "--lr-decay",
        "0.99",
        "--weight-decay",
        "1e-4",
        "--ema-decay",
        "0.99",
        "--seed",
        "1",
        "--batch-size",
        "100",
        "--sync",
        "--lr-scaling",
        "auto",
        "--hidden",
        "500",
        "--optimizer",
        "sgd",
        "--log-every",
        "0",
        "--devices",
        "cpu:1",
    ]);
}

/// `--optimizer adam` trains with Adam's own defaults, its checkpoints name it and hold its
/// moments, a resume continues it (refusing another optimiser or another of its values), and
/// `eval` reads the average it evaluates; a setting it does not have and an unknown optimiser
/// are refused by name.
#[test]
fn an_adam_run_records_its_optimiser_and_resumes_as_adam() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("adam");
    let quick = ["--devices", "cpu:2", "--log-every", "0"];
    let first = [&quick[..], &["--optimizer", "adam", "--steps", "300"]].concat();
    let out = succeed(&[&first[..], &["--checkpoint-dir", arg(&dir)]].concat());
    let trained = number_after(&out, "test accuracy:");
    assert!(trained > 0.9, "300 steps of Adam: {trained}\n{out}");
    let newest = dir.join("step-0000000300.safetensors");
    let (_, metadata) = checkpoint::read_header(&newest).unwrap();
    assert_eq!(metadata["optimizer"], "adam");
    assert_eq!(metadata["learning_rate"], "0.001");
    assert_eq!(metadata["beta2"], "0.999");
    let loaded = checkpoint::load(&newest, &Mlp::mnist().layout()).unwrap();
    let slots: Vec<&str> = loaded.state.slots.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(slots, ["m", "v", "ema"]);
    let resume = [
        "--resume",
        arg(&dir),
        "--steps",
        "400",
        "--devices",
        "cpu:2",
    ];
    for (change, named) in [
        (
            vec!["--optimizer", "sgd"],
            "--optimizer sgd (the run has adam)",
        ),
        (vec!["--lr", "0.8"], "--lr 0.8 (the run has 0.001)"),
    ] {
        let message = fail(&[&resume[..], &change].concat());
        assert!(message.contains(named), "{change:?}: {message}");
    }
    succeed(&[&resume[..], &["--optimizer", "adam", "--log-every", "0"]].concat());
    let (_, metadata) = checkpoint::read_header(&dir.join("step-0000000400.safetensors")).unwrap();
    assert_eq!(metadata["optimizer"], "adam");
    let eval = succeed(&["eval", "--checkpoint", arg(&dir)]);
    assert!(number_after(&eval, "test accuracy:") > 0.9, "{eval}");
    // An SGD run's checkpoints name no optimiser: they read as those of before optimisers had
    // names.
    let sgd = tmp.path().join("sgd");
    succeed(&[&quick[..], &["--steps", "2", "--checkpoint-dir", arg(&sgd)]].concat());
    let (_, metadata) = checkpoint::read_header(&sgd.join("step-0000000002.safetensors")).unwrap();
    assert!(!metadata.contains_key("optimizer"), "{metadata:?}");
    let message = fail(&[&quick[..], &["--optimizer", "lion", "--steps", "2"]].concat());
    assert!(message.contains("unknown optimiser \"lion\""), "{message}");
    assert!(message.contains("sgd, adam"), "{message}");
}

#[test]
fn a_sixteen_bit_run_records_its_precision_and_resumes_in_it() {
    let tmp = tempfile::tempdir().unwrap();
    let quick = ["--devices", "cpu:2", "--log-every", "0"];
    for precision in ["bf16", "f16"] {
        let dir = tmp.path().join(precision);
        let metrics = tmp.path().join(format!("{precision}.jsonl"));
        let first = [&quick[..], &["--precision", precision, "--steps", "300"]].concat();
        let out = succeed(
            &[
                &first[..],
                &["--checkpoint-dir", arg(&dir), "--metrics", arg(&metrics)],
            ]
            .concat(),
        );
        let trained = number_after(&out, "test accuracy:");
        assert!(trained > 0.9, "300 steps in {precision}: {trained}\n{out}");
        let line = line_starting(&out, "precision:");
        assert!(
            line.contains(&format!("{precision} (f32 master weights)")),
            "{line}"
        );
        let (_, metadata) =
            checkpoint::read_header(&dir.join("step-0000000300.safetensors")).unwrap();
        assert_eq!(metadata["precision"], precision);
        // f16 scales its loss: it says how, in the summary and in every evaluation record.
        let scaled = precision == "f16";
        assert_eq!(metadata.contains_key("loss_scale"), scaled, "{metadata:?}");
        assert_eq!(line.contains("overflowed pass(es)"), scaled, "{line}");
        let evaluation: Value = std::fs::read_to_string(&metrics)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .find(|r| r["kind"] == "eval")
            .unwrap();
        assert_eq!(
            evaluation["loss_scale_overflows"].is_u64(),
            scaled,
            "{evaluation}"
        );
        let resume = [
            "--resume",
            arg(&dir),
            "--steps",
            "400",
            "--devices",
            "cpu:2",
        ];
        let other = if scaled { "bf16" } else { "f16" };
        let message = fail(&[&resume[..], &["--precision", other]].concat());
        let named = format!("--precision {other} (the run has {precision})");
        assert!(message.contains(&named), "{message}");
        let again = succeed(&[&resume[..], &["--log-every", "0"]].concat());
        assert!(
            line_starting(&again, "precision:").contains(precision),
            "{again}"
        );
        let (_, metadata) =
            checkpoint::read_header(&dir.join("step-0000000400.safetensors")).unwrap();
        assert_eq!(metadata["precision"], precision);
        let eval = succeed(&["eval", "--checkpoint", arg(&dir)]);
        assert!(number_after(&eval, "test accuracy:") > 0.9, "{eval}");
    }
    // An f32 run's checkpoints name no precision: byte for byte those of before.
    let plain = tmp.path().join("f32");
    succeed(
        &[
            &quick[..],
            &["--steps", "2", "--checkpoint-dir", arg(&plain)],
        ]
        .concat(),
    );
    let (_, metadata) =
        checkpoint::read_header(&plain.join("step-0000000002.safetensors")).unwrap();
    assert!(!metadata.contains_key("precision"), "{metadata:?}");
    for (flags, says) in [
        (vec!["--precision", "f8"], "expected one of f32, bf16, f16"),
        (vec!["--loss-scale", "1000"], "a power of two"),
        (
            vec!["--loss-scale", "1024"],
            "--loss-scale sets the loss scale of --precision f16",
        ),
        (
            vec!["--precision", "bf16", "--loss-scale", "1024"],
            "computes in bf16",
        ),
    ] {
        let message = fail(&[&quick[..], &["--steps", "2"], &flags[..]].concat());
        assert!(message.contains(says), "{flags:?}: {message}");
    }
}

/// A network of other hidden layers trains, and its checkpoints name it: a resume, `eval` and
/// `predict` rebuild it from them without being told.
#[test]
fn a_deeper_network_trains_and_its_checkpoints_rebuild_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("deep");
    let quick = ["--devices", "cpu:2", "--log-every", "0", "--allow-chance"];
    let first = [&quick[..], &["--hidden", "64,32", "--steps", "30"]].concat();
    succeed(&[&first[..], &["--checkpoint-dir", arg(&dir)]].concat());
    let newest = dir.join("step-0000000030.safetensors");
    let (_, metadata) = checkpoint::read_header(&newest).unwrap();
    assert_eq!(metadata["model"], "784-64-32-10");
    // Two hidden layers: half the reference's default rate (README, --lr).
    assert_eq!(metadata["learning_rate"], "0.4");
    // 784 x 64 + 64 + 64 x 32 + 32 + 32 x 10 + 10 parameters: no tensor of the reference's.
    let layout = Mlp::mnist_with(&[64, 32]).unwrap().layout();
    let checkpoint = checkpoint::load(&newest, &layout).unwrap();
    assert_eq!(checkpoint.state.params.len(), 52_650);

    let resumed = succeed(&[&quick[..], &["--resume", arg(&dir), "--steps", "40"]].concat());
    assert!(resumed.contains("steps 30..40"), "{resumed}");
    let eval = succeed(&["eval", "--checkpoint", arg(&dir)]);
    assert!(eval.contains("step-0000000040"), "{eval}");
    assert!(eval.contains("step:                40 of 40"), "{eval}");
    // The same run trained in one go ends in the same checkpoint.
    let whole = tmp.path().join("whole");
    let again = [&quick[..], &["--hidden", "64,32", "--steps", "40"]].concat();
    succeed(&[&again[..], &["--checkpoint-dir", arg(&whole)]].concat());
    let bytes = |d: &std::path::Path| std::fs::read(d.join("step-0000000040.safetensors")).unwrap();
    assert_eq!(
        bytes(&dir),
        bytes(&whole),
        "resumed and uninterrupted runs differ"
    );

    // A checkpoint whose metadata names a network of other inputs or classes, or none, is
    // refused by name before its tensors are read.
    let bytes = std::fs::read(dir.join("step-0000000040.safetensors")).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    for (model, why) in [
        (
            "12-5-10",
            "its model 12-5-10 does not take 784 inputs to 10 classes",
        ),
        ("784-64-32-9", "does not take 784 inputs to 10 classes"),
        ("784-x-10", "is not a network's layer widths"),
        (
            "784-99999999-10",
            "a layer width of 99999999 is out of range",
        ),
    ] {
        header["__metadata__"]["model"] = Value::from(model);
        let mut text = serde_json::to_vec(&header).unwrap();
        text.resize(text.len().div_ceil(8) * 8, b' ');
        let lie = tmp.path().join(format!("{model}.safetensors"));
        let body = &bytes[8 + header_len..];
        let file = [&(text.len() as u64).to_le_bytes()[..], &text, body].concat();
        std::fs::write(&lie, file).unwrap();
        let message = fail(&["eval", "--checkpoint", arg(&lie)]);
        assert!(message.contains(why), "{model}: {message}");
    }

    for bad in ["0", "abc", "70000", "", "64,,32", "-5"] {
        let message = fail(&[&quick[..], &["--hidden", bad, "--steps", "1"]].concat());
        assert!(message.contains("--hidden"), "{bad:?}: {message}");
    }
}

#[test]
fn without_data_it_says_where_it_looked_and_how_to_point_at_the_files() {
    let elsewhere = tempfile::tempdir().unwrap();
    let output = command(&["--steps", "1"])
        .current_dir(elsewhere.path())
        .env_remove("TANDEM_MNIST_DIR")
        .output()
        .unwrap();
    let message = stderr(&output);
    assert!(!output.status.success(), "{message}");
    assert!(!message.contains("panicked"), "{message}");
    assert!(
        message.contains("no MNIST data in data/mnist")
            && message.contains("--data-dir")
            && message.contains("TANDEM_MNIST_DIR"),
        "{message}"
    );
    // The variable is the default when set.
    let out = command(&["--steps", "1", "--devices", "cpu:1", "--log-every", "0"])
        .current_dir(elsewhere.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

/// Async on many workers trains at the default flags with no warning to lower the rate, and
/// the summary says which rule and warm-up it used; the rule and warm-up are checked as flags
/// and kept by a resume, which refuses to change them.
/// Sync scales its learning rate above a global batch of 800 (here 9 workers of 100: x1.125),
/// says so, records it, and a resume keeps it; below, the summary says plain sync.
#[test]
fn sync_scales_its_rate_for_a_large_global_batch_and_a_resume_keeps_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let base = ["--sync", "--devices", "sim:9", "--log-every", "0"];
    let scaled = succeed(&[&base[..], &["--steps", "3", "--checkpoint-dir", arg(&dir)]].concat());
    line_starting(
        &scaled,
        "mode:                sync, learning rate x1.125 for a global batch of 900 (scaling auto",
    );
    let small = succeed(&[
        "--sync",
        "--devices",
        "sim:8",
        "--steps",
        "2",
        "--log-every",
        "0",
    ]);
    assert_eq!(line_starting(&small, "mode:"), "mode:                sync");
    let factor = succeed(&[&base[..], &["--steps", "2", "--lr-scaling", "1.5"]].concat());
    line_starting(
        &factor,
        "mode:                sync, learning rate x1.5 for a global batch",
    );
    for bad in ["0.5", "x", "65"] {
        let message = fail(&["--sync", "--steps", "1", "--lr-scaling", bad]);
        assert!(
            message.contains("expected auto or a factor"),
            "{bad}: {message}"
        );
    }
    let again = succeed(&[&base[..], &["--resume", arg(&dir), "--steps", "4"]].concat());
    line_starting(&again, "mode:                sync, learning rate x1.125");
    let message = fail(
        &[
            &base[..],
            &["--resume", arg(&dir), "--steps", "5", "--lr-scaling", "1"],
        ]
        .concat(),
    );
    assert!(message.contains("--lr-scaling"), "{message}");
}

#[test]
fn async_names_its_rule_and_a_resume_keeps_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let run = |extra: &[&str]| {
        let base = ["--async", "--devices", "sim:8", "--log-every", "0"];
        mnist_train(&[&base[..], extra].concat())
    };
    let default = run(&["--steps", "30", "--checkpoint-dir", arg(&dir)]);
    assert!(default.status.success(), "{}", stderr(&default));
    assert!(!stderr(&default).contains("--lr"), "{}", stderr(&default));
    let text = common::stdout(&default);
    line_starting(
        &text,
        "mode:                async, rule scaled, warm-up 5 epoch(s)",
    );
    let plain = succeed(&[
        "--async",
        "--devices",
        "sim:8",
        "--log-every",
        "0",
        "--steps",
        "30",
        "--async-rule",
        "plain",
        "--async-warmup",
        "0",
        "--async-bound",
        "drop:2",
    ]);
    line_starting(
        &plain,
        "mode:                async, rule plain, warm-up 0 epoch(s) on one worker, bound drop:2",
    );
    // 8 workers, none landing more than 2 stale: the others are dropped, and say so.
    let staleness = line_starting(&plain, "staleness:           mean ");
    assert!(
        staleness.contains("max 2,") && staleness.contains("too stale dropped"),
        "{staleness}"
    );
    for (flag, bad, says) in [
        ("--async-rule", "faster", "expected plain or scaled"),
        ("--async-warmup", "-2", "expected auto or a number"),
        ("--async-bound", "wait", "expected none, wait:S or drop:S"),
    ] {
        let message = fail(&["--async", "--steps", "1", flag, bad]);
        assert!(message.contains(says), "{flag} {bad}: {message}");
    }
    // A resume continues with the recorded rule, and refuses another.
    let again = run(&[
        "--resume",
        arg(&dir),
        "--steps",
        "40",
        "--async-rule",
        "scaled",
    ]);
    assert!(again.status.success(), "{}", stderr(&again));
    let message = fail(&[
        "--resume",
        arg(&dir),
        "--steps",
        "50",
        "--async-rule",
        "plain",
    ]);
    assert!(message.contains("--async-rule"), "{message}");
    let message = fail(&[
        "--resume",
        arg(&dir),
        "--steps",
        "50",
        "--async-warmup",
        "0",
    ]);
    assert!(message.contains("--async-warmup"), "{message}");
    let message = fail(&[
        "--resume",
        arg(&dir),
        "--steps",
        "50",
        "--async-bound",
        "wait:3",
    ]);
    assert!(message.contains("--async-bound"), "{message}");
}
