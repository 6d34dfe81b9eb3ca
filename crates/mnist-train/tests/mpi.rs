//! Training across processes under `mpirun` (the `mpi` feature): a run's result does not depend
//! on how its workers are spread over ranks, asynchronous training learns across ranks, and a
//! rank that dies or fails ends the whole job promptly. Needs Open MPI's `mpirun` (README).
#![cfg(feature = "mpi")]

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use tandem_checkpoint as checkpoint;

use common::{arg, command, data_dir, line_starting, stderr, stdout, succeed};

/// `mpirun -n <ranks>` of the binary with `args`, allowed to run as root (CI's containers) and
/// on more processes than cores.
fn mpirun(ranks: usize, args: &[&str]) -> Command {
    let mut mpirun = Command::new("mpirun");
    mpirun
        .args(["-n", &ranks.to_string(), "--oversubscribe"])
        .arg(env!("CARGO_BIN_EXE_mnist-train"))
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("TANDEM_MNIST_DIR", data_dir())
        .env("RUST_BACKTRACE", "0");
    mpirun
}

fn run(mut command: Command) -> Output {
    command
        .output()
        .expect("cannot run mpirun: install Open MPI (README)")
}

/// Runs `args` on `ranks` ranks to the end; returns stdout.
fn succeed_on(ranks: usize, args: &[&str]) -> String {
    let output = run(mpirun(ranks, args));
    assert!(
        output.status.success(),
        "mpirun -n {ranks} {args:?} failed:\n{}\n{}",
        stdout(&output),
        stderr(&output)
    );
    stdout(&output)
}

/// The bytes of the one checkpoint in `dir`.
fn checkpoint_in(dir: &Path) -> Vec<u8> {
    let files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    std::fs::read(&files[0]).unwrap()
}

/// A sync run of `steps` steps on `devices` per rank, into a fresh directory under `tmp`; the
/// checkpoint's bytes.
fn sync_checkpoint(tmp: &Path, ranks: usize, devices: &str, steps: &str) -> Vec<u8> {
    let dir = tmp.join(format!("{ranks}x{devices}-{}", rand_suffix()));
    let args = [
        "--sync",
        "--devices",
        devices,
        "--steps",
        steps,
        "--checkpoint-dir",
        arg(&dir),
    ];
    match ranks {
        1 => succeed(&args),
        _ => succeed_on(ranks, &args),
    };
    checkpoint_in(&dir)
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[test]
fn two_ranks_of_one_worker_train_bitwise_as_one_process_of_two() {
    let tmp = tempfile::tempdir().unwrap();
    let one = sync_checkpoint(tmp.path(), 1, "cpu:2", "60");
    let two = sync_checkpoint(tmp.path(), 2, "cpu:1", "60");
    // The whole file: tensors, and the metadata (2 workers either way).
    assert!(one == two, "the checkpoints differ");
}

#[test]
fn two_ranks_of_two_workers_train_bitwise_as_one_process_of_four_every_time() {
    let tmp = tempfile::tempdir().unwrap();
    let one = sync_checkpoint(tmp.path(), 1, "cpu:4", "50");
    let first = sync_checkpoint(tmp.path(), 2, "cpu:2", "50");
    let again = sync_checkpoint(tmp.path(), 2, "cpu:2", "50");
    assert!(first == again, "two identical 2 x 2 runs differ");
    assert!(one == first, "2 x 2 differs from 1 x 4");
}

/// `--exchange bf16` under `mpirun`: a bf16 run's exchange (gradients and parameters) is half
/// an f32 one's in bytes, as the summary measures them; the checkpoint resumes in it; it learns
/// as the f32 exchange does; and it stays bitwise reproducible. In one process it is refused.
#[test]
fn a_bf16_exchange_halves_the_bytes_between_two_ranks_and_trains() {
    let tmp = tempfile::tempdir().unwrap();
    let bytes_and_accuracy = |out: &str| -> (f64, f64) {
        let sent = line_starting(out, "exchanged:")["exchanged:".len()..]
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no bytes in:\n{out}"));
        let accuracy = line_starting(out, "test accuracy:")["test accuracy:".len()..]
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no accuracy in:\n{out}"));
        (sent, accuracy)
    };
    let quick = [
        "--sync",
        "--devices",
        "cpu:1",
        "--steps",
        "300",
        "--log-every",
        "0",
    ];
    let plain = succeed_on(2, &quick);
    let (f32_bytes, f32_accuracy) = bytes_and_accuracy(&plain);
    let runs: Vec<(String, Vec<u8>)> = (0..2)
        .map(|i| {
            let dir = tmp.path().join(format!("bf16-{i}"));
            let narrow = [
                "--precision",
                "bf16",
                "--exchange",
                "bf16",
                "--checkpoint-dir",
                arg(&dir),
                "--keep",
                "1",
            ];
            let out = succeed_on(2, &[&quick[..], &narrow].concat());
            (out, checkpoint_in(&dir))
        })
        .collect();
    let (bf16_bytes, bf16_accuracy) = bytes_and_accuracy(&runs[0].0);
    let ratio = bf16_bytes / f32_bytes;
    eprintln!("bytes per step: f32 {f32_bytes}, bf16 {bf16_bytes} ({ratio:.3}); accuracy {f32_accuracy} vs {bf16_accuracy}");
    // Half, but for the per-step loss and stop sums and the one f32 gather before the save.
    assert!((0.5..0.51).contains(&ratio), "{ratio}");
    assert!(bf16_accuracy > 0.9 && (bf16_accuracy - f32_accuracy).abs() < 0.01);
    assert!(runs[0].1 == runs[1].1, "two bf16-exchange runs differ");
    let dir = tmp.path().join("bf16-0");
    let newest = dir.join("step-0000000300.safetensors");
    let (_, metadata) = checkpoint::read_header(&newest).unwrap();
    assert_eq!(metadata["exchange"], "bf16");
    let resumed = succeed_on(
        2,
        &[
            "--resume",
            arg(&dir),
            "--steps",
            "320",
            "--log-every",
            "0",
            "--devices",
            "cpu:1",
        ],
    );
    assert!(
        line_starting(&resumed, "exchanged:").contains("bf16"),
        "{resumed}"
    );
    let alone = common::mnist_train(&["--devices", "cpu:1", "--steps", "2", "--exchange", "bf16"]);
    assert!(!alone.status.success());
    assert!(
        stderr(&alone).contains("this run is one process"),
        "{}",
        stderr(&alone)
    );
}

/// The logged figures of a run: its progress lines' steps and losses, and its metrics
/// records without their timings (which differ from run to run).
fn logged(stdout: &str, metrics: &Path) -> (Vec<String>, Vec<String>) {
    let lines = stdout
        .lines()
        .filter(|l| l.starts_with("step "))
        .map(|l| l.split(" (").next().unwrap_or(l).to_owned())
        .collect();
    let records = std::fs::read_to_string(metrics)
        .unwrap()
        .lines()
        .map(|line| {
            let mut record: serde_json::Value = serde_json::from_str(line).unwrap();
            for timing in ["wall_time", "examples_per_sec", "sec_per_batch"] {
                record.as_object_mut().unwrap().remove(timing);
            }
            record.to_string()
        })
        .collect();
    (lines, records)
}

#[test]
fn two_ranks_log_the_losses_and_metrics_of_one_process_on_as_many_workers() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |ranks: usize, devices: &str| {
        let metrics = tmp.path().join(format!("{ranks}.jsonl"));
        let args = [
            "--sync",
            "--devices",
            devices,
            "--steps",
            "300",
            "--log-every",
            "100",
            "--log-format",
            "plain",
            "--metrics",
            arg(&metrics),
        ];
        let out = match ranks {
            1 => succeed(&args),
            _ => succeed_on(ranks, &args),
        };
        logged(&out, &metrics)
    };
    let one = run(1, "cpu:2");
    let two = run(2, "cpu:1");
    assert_eq!(one.0.len(), 3, "{one:?}");
    assert_eq!(two, one);
}

#[test]
fn a_flag_given_to_rank_0_alone_changes_nothing_on_the_others() {
    // mpirun's MPMD form: rank 0 writes metrics (and so evaluates once an epoch), rank 1 does
    // not; both train rank 0's plan.
    let tmp = tempfile::tempdir().unwrap();
    let metrics = tmp.path().join("metrics.jsonl");
    let binary = env!("CARGO_BIN_EXE_mnist-train");
    let common = [
        "--sync",
        "--devices",
        "cpu:1",
        "--steps",
        "600",
        "--log-every",
        "0",
    ];
    let mut command = mpirun(1, &common);
    command
        .args(["--metrics", arg(&metrics), ":", "-n", "1", binary])
        .args(common);
    let output = run(command);
    assert!(output.status.success(), "{}", stderr(&output));
    let records = std::fs::read_to_string(&metrics).unwrap();
    // Evaluations once an epoch: 275 steps of 200 examples, so at 275, 550 and the end.
    assert_eq!(records.matches("\"kind\":\"eval\"").count(), 3, "{records}");
    assert!(line_starting(&stdout(&output), "steps:").starts_with("steps:               600"));
}

#[test]
fn more_workers_across_ranks_than_one_process_may_have_train() {
    // 258 in all: more than the 256 replicas one process's devices may give.
    let out = succeed_on(
        2,
        &["--devices", "cpu:129", "--steps", "2", "--log-every", "0"],
    );
    assert!(
        line_starting(&out, "devices:").starts_with("devices:             258 [2 ranks x"),
        "{out}"
    );
}

#[test]
fn asynchronous_training_across_ranks_learns_and_measures_staleness() {
    // An asynchronous run depends on timing: single runs of two epochs land at 0.967-0.976 in
    // one process as across ranks. The claim is about the typical run, the median of three.
    let mut accuracies: Vec<f64> = ["2", "3", "4"]
        .iter()
        .map(|seed| {
            let out = succeed_on(
                2,
                &[
                    "--async",
                    "--devices",
                    "cpu:1",
                    "--epochs",
                    "2",
                    "--seed",
                    seed,
                ],
            );
            assert!(out.contains("2 ranks x cpu:0"), "{out}");
            // 2 epochs of 55,000 examples in batches of 100, counted over both ranks.
            assert!(
                line_starting(&out, "steps:").contains("1100 (110000 examples"),
                "{out}"
            );
            let staleness = line_starting(&out, "staleness:");
            let max: u64 = staleness
                .rsplit(' ')
                .next()
                .and_then(|m| m.parse().ok())
                .unwrap_or_else(|| panic!("{staleness}"));
            // Each worker is a rank: an update can be stale only by the other's.
            assert!(max >= 1, "no update was ever stale across ranks: {out}");
            let test = line_starting(&out, "test accuracy:");
            test["test accuracy:".len()..]
                .split_whitespace()
                .next()
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("{test}"))
        })
        .collect();
    accuracies.sort_by(f64::total_cmp);
    assert!(accuracies[1] >= 0.97, "median of {accuracies:?}");
}

/// The pids of `mpirun`'s children (its ranks), with their ranks.
fn ranks_of(mpirun: u32) -> Vec<(u32, usize)> {
    let mut ranks = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let parent = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if parent != Some(mpirun) {
            continue;
        }
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        let rank = environ
            .split(|&b| b == 0)
            .filter_map(|v| std::str::from_utf8(v).ok())
            .find_map(|v| v.strip_prefix("OMPI_COMM_WORLD_RANK="))
            .and_then(|r| r.parse().ok());
        if let Some(rank) = rank {
            ranks.push((pid, rank));
        }
    }
    ranks
}

/// Starts a long sync run on 2 ranks, waits for its first progress line, and returns it with
/// its ranks' pids.
fn long_run(dir: &Path) -> (std::process::Child, Vec<(u32, usize)>) {
    long_run_with(dir, &[])
}

/// [`long_run`] with `extra` flags.
fn long_run_with(dir: &Path, extra: &[&str]) -> (std::process::Child, Vec<(u32, usize)>) {
    let flags = [
        "--sync",
        "--devices",
        "cpu:1",
        "--epochs",
        "30",
        "--log-every",
        "20",
        "--log-format",
        "plain",
        "--checkpoint-dir",
        arg(dir),
    ];
    let mut child = mpirun(2, &[&flags[..], extra].concat())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run mpirun");
    let stdout = child.stdout.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    let first = lines.find(|l| l.as_ref().is_ok_and(|l| l.starts_with("step ")));
    assert!(first.is_some(), "the run never reported a step");
    // Keep draining so that the run never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    let ranks = ranks_of(child.id());
    assert_eq!(ranks.len(), 2, "{ranks:?}");
    (child, ranks)
}

/// Waits for `child` to end, for at most `limit`; returns its status and how long it took.
fn wait_for(
    child: &mut std::process::Child,
    limit: Duration,
) -> (std::process::ExitStatus, Duration) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("the job did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn alive(pid: u32) -> bool {
    // A zombie is already dead: only its parent has not read its status yet.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|s| !s.trim_start().starts_with('Z'))
    })
}

/// Whether process `pid` is gone within 5 seconds: mpirun may exit a moment before the kill
/// it sent its ranks has taken effect, on a loaded machine.
fn gone_soon(pid: u32) -> bool {
    let start = Instant::now();
    while alive(pid) {
        if start.elapsed() > Duration::from_secs(5) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

#[test]
fn a_rank_killed_mid_run_ends_the_whole_job_promptly_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, ranks) = long_run(tmp.path());
    let mut stderr_pipe = child.stderr.take().unwrap();
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stderr_pipe, &mut text).ok();
        text
    });
    let (victim, _) = ranks.iter().find(|(_, rank)| *rank == 1).copied().unwrap();
    let status = Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let (status, took) = wait_for(&mut child, Duration::from_secs(30));
    let said = errors.join().unwrap();
    assert!(!status.success(), "{said}");
    assert!(took < Duration::from_secs(10), "took {took:?}: {said}");
    assert!(
        said.contains("rank 1"),
        "the job's end does not name rank 1: {said}"
    );
    for (pid, rank) in ranks {
        assert!(
            gone_soon(pid),
            "rank {rank} (pid {pid}) outlived the job by 5 s"
        );
    }
}

/// `kill -STOP` on rank 1: rank 0's stall report names it as the rank that gives no sign of
/// life (and not its own healthy worker alone).
#[test]
fn a_stopped_rank_is_named_in_rank_0s_stall_report() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, ranks) = long_run_with(tmp.path(), &["--stall-timeout", "5"]);
    let stderr_pipe = child.stderr.take().unwrap();
    let (line_tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let reader = std::io::BufReader::new(stderr_pipe);
        for line in std::io::BufRead::lines(reader).map_while(Result::ok) {
            let _ = line_tx.send(line);
        }
    });
    let (victim, _) = ranks.iter().find(|(_, rank)| *rank == 1).copied().unwrap();
    let signal = |name: &str, pid: u32| {
        let status = Command::new("kill").args([name, &pid.to_string()]).status();
        assert!(status.unwrap().success());
    };
    signal("-STOP", victim);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut said = Vec::new();
    let report = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains("has made no progress") => break Some(line),
            Ok(line) => said.push(line),
            Err(_) => break None,
        }
    };
    signal("-CONT", victim);
    for (pid, _) in &ranks {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    let _ = child.kill();
    let _ = child.wait();
    let report = report.unwrap_or_else(|| panic!("no stall was reported: {said:?}"));
    assert!(report.contains("on rank 0"), "{report}");
    assert!(
        report.contains("and rank 1 (for ") && report.contains("has given no sign of life"),
        "{report}"
    );
}

#[test]
fn ctrl_c_on_mpirun_stops_every_rank_with_a_checkpoint_that_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, ranks) = long_run(tmp.path());
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let (_, took) = wait_for(&mut child, Duration::from_secs(60));
    assert!(took < Duration::from_secs(10), "took {took:?}");
    for (pid, rank) in ranks {
        assert!(
            gone_soon(pid),
            "rank {rank} (pid {pid}) outlived the job by 5 s"
        );
    }
    let saved = checkpoint::list(tmp.path()).unwrap();
    let last = saved
        .last()
        .expect("no checkpoint written on the interrupt");
    let (step, _) = checkpoint::read_header(last).unwrap();
    // Every rank resumes from the checkpoint rank 0 reads, to a step past it.
    let end = (step + 10).to_string();
    let out = succeed_on(
        2,
        &[
            "--resume",
            arg(tmp.path()),
            "--checkpoint-dir",
            arg(tmp.path()),
            "--steps",
            &end,
        ],
    );
    assert!(
        line_starting(&out, "steps:").starts_with(&format!("steps:               {end} ")),
        "{out}"
    );
}

#[test]
fn ranks_that_disagree_on_their_devices_stop_at_once_with_an_error() {
    // MPMD: rank 0 with one worker, rank 1 with two.
    let mut command = mpirun(1, &["--sync", "--devices", "cpu:1", "--steps", "20"]);
    command
        .args([":", "-n", "1", "--oversubscribe"])
        .arg(env!("CARGO_BIN_EXE_mnist-train"))
        .args(["--sync", "--devices", "cpu:2", "--steps", "20"]);
    let start = Instant::now();
    let output = run(command);
    let said = stderr(&output);
    assert!(!output.status.success(), "{said}");
    assert!(start.elapsed() < Duration::from_secs(30));
    assert!(
        said.contains("the ranks disagree on their workers: from 1 to 2"),
        "{said}"
    );
    assert!(said.contains("error: rank "), "{said}");
}

#[test]
fn one_process_built_with_mpi_trains_as_without_it() {
    // No mpirun: one rank, the ordinary run.
    let out = command(&["--sync", "--devices", "cpu:1", "--steps", "5"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("devices:             1 [cpu:0]"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_worker_failing_on_a_rank_ends_the_job_naming_rank_worker_and_step() {
    // Diverges at once: every rank's worker fails on a NaN loss.
    let output = run(mpirun(
        2,
        &[
            "--sync",
            "--devices",
            "cpu:1",
            "--lr",
            "1e10",
            "--steps",
            "50",
        ],
    ));
    let said = stderr(&output);
    assert!(!output.status.success(), "{said}");
    assert!(
        said.contains("error: rank ")
            && said.contains(": worker 0 (cpu:0) failed at step ")
            && said.contains("training diverged"),
        "{said}"
    );
}
