//! `mnist-train` on CUDA replicas, end to end: on a GPU, or on CPU-only machines through the
//! CUDA driver stand-in (`cargo xtask cuda-emu`; `.ci/cuda.sh` runs these with it, two emulated
//! devices). The stand-in interprets every kernel, so the runs are a few steps of small batches.
//!
//! Without a device these tests fail rather than skip when `TANDEM_REQUIRE_GPU=1` (CI).
#![cfg(feature = "cuda")]

mod common;

use std::path::{Path, PathBuf};

use common::{arg, data_dir, succeed};
use tandem_checkpoint as checkpoint;
use tandem_model::{Mlp, Network};
use tandem_optim::Sgd;

/// Steps and examples per replica of every run here.
const STEPS: &str = "4";
const BATCH: &str = "8";

/// Whether a CUDA device is present; `false` (a visible skip, see `tandem_testkit`) only when
/// CI does not require one.
fn gpu_present() -> bool {
    match tandem_kernels::device_count() {
        Ok(count) if count > 0 => true,
        outcome => {
            tandem_testkit::no_device(&format!("{outcome:?}"), tandem_testkit::gpu_required());
            false
        }
    }
}

/// Trains `mode` on `devices` into a fresh folder under `root` and returns the final checkpoint
/// and what the run printed.
fn train(root: &Path, mode: &str, devices: &str) -> (PathBuf, String) {
    let dir = root.join(format!("{mode}-{}", devices.replace([':', ','], "-")));
    let flags = [
        mode,
        "--devices",
        devices,
        "--steps",
        STEPS,
        "--batch-size",
        BATCH,
    ];
    let out = train_into(&dir, &flags);
    (dir.join(format!("step-{:010}.safetensors", 4)), out)
}

/// Trains with `flags` into `dir`, logging every step as plain lines; what the run printed.
fn train_into(dir: &Path, flags: &[&str]) -> String {
    let data = data_dir();
    let common = [
        "--log-every",
        "1",
        "--log-format",
        "plain",
        "--data-dir",
        arg(&data),
        "--checkpoint-dir",
        arg(dir),
    ];
    succeed(&[flags, &common[..]].concat())
}

/// The largest |a - b| / max(|b|, 1e-3) over two checkpoints' parameters and moving averages.
fn max_relative_difference(a: &Path, b: &Path) -> f64 {
    let layout = Mlp::mnist().layout();
    let (a, b) = (
        checkpoint::load(a, &layout).unwrap(),
        checkpoint::load(b, &layout).unwrap(),
    );
    let ema = |c: &checkpoint::Checkpoint| {
        c.state
            .slot(Sgd::AVERAGE)
            .expect("SGD's moving average")
            .to_vec()
    };
    let pairs = a.state.params.iter().zip(&b.state.params);
    let (ema_a, ema_b) = (ema(&a), ema(&b));
    let pairs = pairs.chain(ema_a.iter().zip(&ema_b));
    pairs
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).abs() / f64::from(y).abs().max(1e-3))
        .fold(0.0, f64::max)
}

#[test]
fn sync_on_two_gpu_replicas_equals_two_cpu_workers() {
    if !gpu_present() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let (gpu, out) = train(root.path(), "--sync", "cuda:0x2");
    assert!(out.contains("cuda:0"), "{out}");
    let (cpu, _) = train(root.path(), "--sync", "cpu:2");
    let difference = max_relative_difference(&gpu, &cpu);
    eprintln!("cuda:0x2 vs cpu:2 after {STEPS} steps: max relative difference {difference:e}");
    // Rounding only: the GPU splits the small products' sums over k and adds the splits (an
    // order the CPU's gemm does not share), and four steps at the default rate amplify it.
    // Measured on the stand-in: 1.5e-4, and 4.4e-5 with the products unsplit.
    assert!(difference <= 5e-4, "{difference}");
    // The comparison can fail: the first step alone moves the parameters by far more.
    let root2 = tempfile::tempdir().unwrap();
    let one_step = succeed(&[
        "--sync",
        "--devices",
        "cpu:2",
        "--steps",
        "1",
        "--batch-size",
        BATCH,
        "--data-dir",
        arg(&data_dir()),
        "--checkpoint-dir",
        arg(root2.path()),
    ]);
    assert!(!one_step.is_empty());
    let early = root2.path().join(format!("step-{:010}.safetensors", 1));
    assert!(max_relative_difference(&early, &cpu) > 1e-2);
}

/// A lone async replica has nobody's updates to race: the strategies give it the store of one
/// sync replica, its update inside its next step's graph. Its run is then a lone sync
/// replica's, bit for bit (same batches, rates and update kernel), with a staleness of 0.
#[test]
fn a_lone_async_gpu_replica_trains_as_a_lone_sync_one_bit_for_bit() {
    if !gpu_present() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let (sync, _) = train(root.path(), "--sync", "cuda:0");
    let (lone, out) = train(root.path(), "--async", "cuda:0");
    let staleness = out.lines().find(|l| l.starts_with("staleness:"));
    assert!(
        staleness.is_some_and(|l| l.ends_with("mean 0.00, max 0")),
        "{out}"
    );
    assert_eq!(max_relative_difference(&lone, &sync), 0.0);
    // The comparison can fail: two replicas' async updates are stale and land elsewhere.
    let (two, _) = train(root.path(), "--async", "cuda:0x2");
    assert!(max_relative_difference(&two, &sync) > 0.0);
}

#[test]
fn async_on_gpu_replicas_trains_and_reports_staleness() {
    if !gpu_present() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    for devices in ["cuda:0x2", "cuda:0,1"] {
        let (last, out) = train(root.path(), "--async", devices);
        assert!(last.is_file(), "{devices}: no final checkpoint:\n{out}");
        assert!(
            out.contains("staleness:"),
            "{devices}: no staleness line:\n{out}"
        );
    }
    // Longer, with the parameters of record on the device (one GPU): the loss falls, and
    // updates land while other workers compute (logging every step makes each worker wait for
    // its device once a step, so the two interleave).
    // Gentler than the default 0.8, which makes batches of 16 overshoot for a while.
    let longer = [
        "--async",
        "--devices",
        "cuda:0x2",
        "--steps",
        "16",
        "--batch-size",
        "16",
    ];
    let out = train_into(
        &root.path().join("longer"),
        &[&longer[..], &["--lr", "0.1"]].concat(),
    );
    let losses: Vec<f32> = out
        .lines()
        .filter_map(|l| {
            l.split("loss = ")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    // A step's line comes from the worker that made it; one that lands after a later step's
    // is not printed (how many do depends on timing: 11 of 16 have been seen).
    assert!(losses.len() >= 8, "{out}");
    let mean = |l: &[f32]| l.iter().sum::<f32>() / l.len() as f32;
    let (first, last) = (mean(&losses[..3]), mean(&losses[losses.len() - 3..]));
    assert!(last < first - 0.2, "the loss did not fall: {losses:?}");
    let staleness: f64 = line(&out, "staleness:")
        .split("mean ")
        .nth(1)
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no mean staleness in\n{out}"));
    assert!(staleness > 0.0, "{out}");
}

/// A synchronous run's replicas on one GPU are computed as one replica of their shards
/// (`tandem_strategy::sync::replicas_for`): `cuda:0x2` trains bit for bit as `cuda:0` with a batch
/// twice as large (the same examples and global batch, one update a step), and records its own
/// workers and batch. Replicas on separate GPUs stay apart, and agree with it within rounding
/// (the sums over the two shards run in another order).
#[test]
fn sync_replicas_on_one_gpu_train_as_one_replica_of_their_shards() {
    if !gpu_present() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let (two_replicas, out) = train(root.path(), "--sync", "cuda:0x2");
    assert!(out.contains("cuda:0, cuda:0"), "{out}");
    let dir = root.path().join("one-replica");
    let double = (2 * BATCH.parse::<usize>().unwrap()).to_string();
    let flags = ["--sync", "--devices", "cuda:0", "--steps", STEPS];
    train_into(&dir, &[&flags[..], &["--batch-size", &double]].concat());
    let one_replica = dir.join(format!("step-{:010}.safetensors", 4));
    assert_eq!(max_relative_difference(&two_replicas, &one_replica), 0.0);
    let (_, metadata) = checkpoint::read_header(&two_replicas).unwrap();
    assert_eq!(
        (&metadata["workers"][..], &metadata["batch_size"][..]),
        ("2", BATCH)
    );
    let (two_gpus, out) = train(root.path(), "--sync", "cuda:0,1");
    assert!(out.contains("cuda:1"), "{out}");
    let difference = max_relative_difference(&two_gpus, &two_replicas);
    eprintln!("cuda:0,1 vs cuda:0x2 after {STEPS} steps: max relative difference {difference:e}");
    // As `sync_on_two_gpu_replicas_equals_two_cpu_workers`: rounding only.
    assert!((0.0..=5e-4).contains(&difference), "{difference}");
}

/// `--exchange bf16` between GPU replicas: each replica's gradients leave its step divided by
/// the worker count and rounded to bf16, and every update sums them in f32 in worker order, so
/// two GPUs train as two replicas on one; the rounding shows against the f32 exchange, and the
/// run records its exchange; resumed on CPU workers it is refused until `--exchange f32`
/// changes it. Where the gradients meet on the host (more replicas than one update sums) it is
/// refused before any step, writing nothing; f16 replicas (loss-scaled, unscaled on the device)
/// exchange in bf16 too.
#[test]
fn a_bf16_exchange_between_gpu_replicas_trains_and_is_recorded() {
    if !gpu_present() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let mut last = Vec::new();
    for devices in ["cuda:0x2", "cuda:0,1"] {
        let dir = root.path().join(devices.replace([':', ','], "-"));
        let flags = ["--sync", "--devices", devices, "--exchange", "bf16"];
        train_into(
            &dir,
            &[&flags[..], &["--steps", STEPS, "--batch-size", BATCH]].concat(),
        );
        let checkpoint = dir.join(format!("step-{:010}.safetensors", 4));
        let (_, metadata) = checkpoint::read_header(&checkpoint).unwrap();
        assert_eq!(metadata["exchange"], "bf16", "{devices}");
        last.push(checkpoint);
    }
    let difference = max_relative_difference(&last[1], &last[0]);
    assert!(difference <= 1e-6, "{difference}");
    let (f32_exchange, _) = train(root.path(), "--sync", "cuda:0x2");
    let rounded = max_relative_difference(&last[0], &f32_exchange);
    assert!(
        rounded > 1e-6,
        "the bf16 exchange changed nothing: {rounded}"
    );

    // Resumed on CPU workers, where nothing is exchanged, the run's own exchange is refused
    // with what to do, and that trains (recording the exchange it now has).
    let gpu_run = root.path().join("cuda-0x2");
    let resume = [
        "--sync",
        "--devices",
        "cpu:2",
        "--steps",
        "6",
        "--resume",
        arg(&gpu_run),
    ];
    let message = common::fail(&resume);
    assert!(message.contains("--exchange f32"), "{message}");
    train_into(&gpu_run, &[&resume[..], &["--exchange", "f32"]].concat());
    let (_, metadata) =
        checkpoint::read_header(&gpu_run.join(format!("step-{:010}.safetensors", 6))).unwrap();
    assert!(!metadata.contains_key("exchange"), "{metadata:?}");

    let f16 = ["--sync", "--devices", "cuda:0x2", "--precision", "f16"];
    let dir = root.path().join("f16");
    train_into(
        &dir,
        &[&f16[..], &["--exchange", "bf16", "--steps", STEPS]].concat(),
    );
    let (_, metadata) =
        checkpoint::read_header(&dir.join(format!("step-{:010}.safetensors", 4))).unwrap();
    assert_eq!(metadata["exchange"], "bf16");

    let dir = root.path().join("seventeen");
    let data = data_dir();
    let message = common::fail(&[
        "--sync",
        "--devices",
        "cuda:0x17",
        "--exchange",
        "bf16",
        "--steps",
        STEPS,
        "--data-dir",
        arg(&data),
        "--checkpoint-dir",
        arg(&dir),
    ]);
    assert!(message.contains("--exchange bf16"), "{message}");
    assert!(!message.contains("panicked"), "{message}");
    assert!(!dir.join(format!("step-{:010}.safetensors", 4)).exists());
}

/// More sync replicas than one update kernel averages (16) keep the parameters of record on the
/// host, and train (16 on one GPU and 1 on another: uneven, so not computed as one replica of
/// each GPU's shards).
#[test]
fn sync_on_more_replicas_than_one_update_averages_trains() {
    if !gpu_present() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("seventeen");
    let flags = [
        "--sync",
        "--devices",
        "cuda:0x16,1",
        "--steps",
        "2",
        "--batch-size",
        "2",
    ];
    let out = train_into(&dir, &flags);
    assert!(out.contains("17 worker(s)"), "{out}");
    assert!(
        dir.join(format!("step-{:010}.safetensors", 2)).is_file(),
        "{out}"
    );
}

/// The lines of `text` that start with `label` (the summary's and `eval`'s accuracy lines).
fn line<'t>(text: &'t str, label: &str) -> &'t str {
    text.lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} line in\n{text}"))
}

/// The examples an accuracy line (`label 0.9812 averaged, 0.9790 raw`) counts correct, of
/// `examples`, for the averaged and the raw parameters.
fn correct(line: &str, examples: f64) -> [i64; 2] {
    let mut figures = (line.split_whitespace())
        .filter_map(|word| word.parse::<f64>().ok())
        .map(|accuracy| (accuracy * examples).round() as i64);
    let mut next = || {
        figures
            .next()
            .unwrap_or_else(|| panic!("two figures in {line:?}"))
    };
    [next(), next()]
}

/// Issue 30's device evaluation: a run on GPUs computes its accuracies there (`--eval-on
/// auto`, the default, here over the tests' `TANDEM_EVAL_ON=cpu`), and `eval` of its
/// checkpoint on the CPU counts the same examples correct, within 5 of a set (the products
/// sum in another order on each side, which may tip an example whose two best classes nearly
/// tie; on the stand-in none did).
#[test]
fn a_gpu_run_evaluates_on_its_gpu_as_the_cpu_evaluates_its_checkpoint() {
    if !gpu_present() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("on-gpu");
    let flags = [
        "--sync",
        "--devices",
        "cuda:0x2",
        "--steps",
        STEPS,
        "--batch-size",
        BATCH,
        "--eval-on",
        "auto",
    ];
    let out = train_into(&dir, &flags);
    let last = dir.join(format!("step-{:010}.safetensors", 4));
    let eval = succeed(&[
        "eval",
        "--checkpoint",
        arg(&last),
        "--data-dir",
        arg(&data_dir()),
    ]);
    for (label, examples) in [
        ("validation accuracy:", 5_000.0),
        ("test accuracy:", 10_000.0),
    ] {
        let (gpu, cpu) = (
            correct(line(&out, label), examples),
            correct(line(&eval, label), examples),
        );
        eprintln!("{label} GPU counts {gpu:?} correct, the CPU {cpu:?}");
        for (g, c) in gpu.into_iter().zip(cpu) {
            assert!((g - c).abs() <= 5, "{eval}\n{out}");
        }
    }
    // The comparison can fail: after 4 steps the run is far from both chance and the end.
    let [averaged, _] = correct(line(&out, "test accuracy:"), 10_000.0);
    assert!((1_500..9_000).contains(&averaged), "{out}");
}

#[test]
fn a_resumed_gpu_sync_run_equals_the_uninterrupted_one() {
    if !gpu_present() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let (whole, _) = train(root.path(), "--sync", "cuda:0x2");
    let (split, data) = (root.path().join("split"), data_dir());
    let run = |start: [&str; 4]| {
        let common = [
            "--devices",
            "cuda:0x2",
            "--batch-size",
            BATCH,
            "--data-dir",
            arg(&data),
        ];
        succeed(&[&start[..], &common[..]].concat())
    };
    run(["--steps", "2", "--checkpoint-dir", arg(&split)]);
    let out = run(["--steps", STEPS, "--resume", arg(&split)]);
    assert!(out.contains("resumed from"), "{out}");
    let resumed = split.join(format!("step-{:010}.safetensors", 4));
    assert_eq!(max_relative_difference(&resumed, &whole), 0.0);
}

#[test]
fn a_diverging_gpu_run_stops_naming_the_worker_and_step_with_no_checkpoint_after_it() {
    if !gpu_present() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let (dir, data) = (root.path().join("run"), data_dir());
    let message = common::fail(&[
        "--lr",
        "1e6",
        "--steps",
        "20",
        "--save-every",
        "1",
        "--devices",
        "cuda:0x2",
        "--batch-size",
        BATCH,
        "--data-dir",
        arg(&data),
        "--checkpoint-dir",
        arg(&dir),
    ]);
    assert!(message.contains("training diverged"), "{message}");
    assert!(message.contains("(cuda:0)"), "{message}");
    let failed: u64 = message
        .split("failed at step ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|step| step.parse().ok())
        .unwrap_or_else(|| panic!("no failing step named in {message}"));
    let saved = checkpoint::CheckpointDir::open(&dir)
        .unwrap()
        .checkpoints()
        .unwrap();
    assert!(!saved.is_empty(), "{message}");
    for (step, path) in saved {
        assert!(
            step < failed,
            "checkpoint of step {step}, the run failed at {failed}"
        );
        checkpoint::load(&path, &Mlp::mnist().layout()).unwrap();
    }
}

/// `--precision bf16|f16` on GPU replicas, both modes: the run trains on the device's 16-bit
/// kernels (tensor-core products), says its precision, records it in its checkpoints, and its
/// loss falls as on `cpu:2` in the same precision.
#[test]
fn a_sixteen_bit_run_trains_on_gpu_replicas_and_records_its_precision() {
    if !gpu_present() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    for precision in ["bf16", "f16"] {
        for mode in ["--sync", "--async"] {
            let dir = root.path().join(format!("{precision}{mode}"));
            let flags = [mode, "--devices", "cuda:0x2", "--precision", precision];
            let flags = [&flags[..], &["--steps", STEPS, "--batch-size", BATCH]].concat();
            let out = train_into(&dir, &flags);
            let line = common::line_starting(&out, "precision:");
            assert!(line.contains(precision), "{line}");
            let last = dir.join(format!("step-{:010}.safetensors", 4));
            let (_, metadata) = checkpoint::read_header(&last).unwrap();
            assert_eq!(metadata["precision"], precision, "{mode}");
            checkpoint::load(&last, &Mlp::mnist().layout()).unwrap();
        }
    }
}

/// A GPU without tensor cores for 16-bit products (compute capability below 8.0) refuses
/// `--precision bf16|f16` before any step, naming the precision and the device, and writes
/// nothing. Only the stand-in can pretend to be such a GPU (`TANDEM_EMU_CAPABILITY`); a real
/// driver ignores the variable, and there the test says it is skipped.
#[test]
fn a_gpu_without_tensor_cores_refuses_sixteen_bits_naming_both() {
    if !gpu_present() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    for precision in ["bf16", "f16"] {
        let dir = root.path().join(precision);
        let data = data_dir();
        let args = [
            "--devices",
            "cuda:0",
            "--precision",
            precision,
            "--steps",
            "2",
            "--data-dir",
            arg(&data),
            "--checkpoint-dir",
            arg(&dir),
        ];
        let output = common::command(&args)
            .env("TANDEM_EMU_CAPABILITY", "75")
            .output()
            .unwrap();
        if output.status.success() && !tandem_testkit::gpu_required() {
            tandem_testkit::skipped(
                &"this driver cannot pretend to be a GPU of compute capability 7.5",
            );
            return;
        }
        assert!(!output.status.success(), "an sm_75 GPU trained {precision}");
        let message = common::stderr(&output);
        assert!(
            message.contains(&format!(
                "--precision {precision} is not available on cuda:0"
            )) && message.contains("7.5"),
            "{message}"
        );
        assert!(!message.contains("panicked"), "{message}");
        let written = std::fs::read_dir(&dir).map_or(0, |d| {
            d.filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
            })
            .count()
        });
        assert_eq!(written, 0);
    }
    // The f32 kernels still load there: only the 16-bit module needs sm_80.
    let dir = root.path().join("f32");
    let args = ["--devices", "cuda:0", "--steps", "2", "--batch-size", BATCH];
    let data = data_dir();
    let paths = ["--data-dir", arg(&data), "--checkpoint-dir", arg(&dir)];
    let output = common::command(&[&args[..], &paths[..]].concat())
        .env("TANDEM_EMU_CAPABILITY", "75")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", common::stderr(&output));
}
