//! Checkpoint directories: rotation that keeps a run's files, the lock, the write probe, the
//! sweep of stale temporary files, whole-file validation and deterministic bytes.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{file_with_metadata, layout};
use safetensors::Dtype;
use tandem_checkpoint::{
    self as checkpoint, read_header, save_in_dir, to_bytes, CheckpointDir, CheckpointError,
};
use tandem_core::{ParamSpan, Slot, TrainState};

fn state(step: u64) -> TrainState {
    let params: Vec<f32> = (0..9)
        .map(|i| i as f32 * 0.37 - 1.0 + step as f32)
        .collect();
    TrainState {
        slots: vec![Slot {
            name: "ema".into(),
            values: params.iter().map(|p| p * 0.5).collect(),
        }],
        params,
        step,
    }
}

fn meta(run: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("run".to_string(), run.to_string()),
        ("mode".to_string(), "sync".to_string()),
        ("end_step".to_string(), "1000".to_string()),
    ])
}

const IDENTITY: &[&str] = &["run", "mode"];

/// A checkpoint directory opened in a fresh temporary one (which goes when it is dropped).
fn open_fresh() -> (tempfile::TempDir, CheckpointDir) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CheckpointDir::open(tmp.path()).unwrap();
    (tmp, dir)
}

/// Saves [`state`]`(step)` of the run `run` in `dir`, keeping `keep` older files of the run.
#[track_caller]
fn save_step(dir: &CheckpointDir, step: u64, run: &str, keep: usize) -> PathBuf {
    dir.save(&state(step), &layout(), &meta(run), keep, IDENTITY)
        .unwrap()
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != ".tandem.lock")
        .collect();
    names.sort();
    names
}

fn step_name(step: u64) -> String {
    format!("step-{step:010}.safetensors")
}

#[test]
fn a_fresh_run_keeps_its_own_files_beside_another_runs_higher_steps() {
    for through_save_in_dir in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        {
            let other = CheckpointDir::open(tmp.path()).unwrap();
            for step in [100, 200, 300] {
                save_step(&other, step, "other", 0);
            }
        }
        for step in [10, 20, 30, 40] {
            if through_save_in_dir {
                save_in_dir(tmp.path(), &state(step), &layout(), &meta("fresh"), 2).unwrap();
            } else {
                let dir = CheckpointDir::open(tmp.path()).unwrap();
                save_step(&dir, step, "fresh", 2);
            }
        }
        assert_eq!(
            names(tmp.path()),
            [30, 40, 100, 200, 300].map(step_name),
            "through save_in_dir: {through_save_in_dir}"
        );
    }
}

#[test]
fn foreign_names_and_damaged_files_neither_count_nor_get_deleted() {
    let (tmp, dir) = open_fresh();
    // A copy under another name: byte for byte this run's, but not a step file.
    let seven = save_step(&dir, 7, "run", 0);
    fs::copy(&seven, tmp.path().join("step-best.safetensors")).unwrap();
    // This run's files, damaged: a truncated one below the new steps and one above them, and
    // one whose header is fine but whose values are not (NaN).
    let bytes = fs::read(&seven).unwrap();
    fs::write(tmp.path().join(step_name(5)), &bytes[..bytes.len() - 4]).unwrap();
    fs::write(tmp.path().join(step_name(99)), &bytes[..100]).unwrap();
    let mut nan = bytes.clone();
    let end = nan.len();
    nan[end - 4..].copy_from_slice(&[0xFF; 4]);
    fs::write(&seven, &nan).unwrap();
    for step in [10, 20, 30] {
        save_step(&dir, step, "run", 2);
    }
    assert_eq!(
        names(tmp.path()),
        [
            step_name(5),
            step_name(7),
            step_name(20),
            step_name(30),
            step_name(99),
            "step-best.safetensors".to_string()
        ]
    );
    let steps: Vec<u64> = dir.checkpoints().unwrap().iter().map(|c| c.0).collect();
    assert_eq!(steps, [5, 7, 20, 30, 99]);
}

#[test]
fn steps_order_by_value_not_by_name() {
    let (tmp, dir) = open_fresh();
    for step in [9_999_999_999, 10_000_000_000, 10_000_000_001] {
        save_step(&dir, step, "run", 2);
    }
    let steps: Vec<u64> = dir.checkpoints().unwrap().iter().map(|c| c.0).collect();
    assert_eq!(steps, [10_000_000_000, 10_000_000_001]);
    let (path, newest, skipped) = dir.load_newest(&layout(), |_| Ok::<_, String>(())).unwrap();
    assert_eq!(newest.state.step, 10_000_000_001);
    assert!(path.ends_with("step-10000000001.safetensors"));
    assert!(skipped.is_empty());
    let (_, newest, _) =
        checkpoint::load_newest(tmp.path(), &layout(), |_| Ok::<_, String>(())).unwrap();
    assert_eq!(newest.state.step, 10_000_000_001);
    let listed = checkpoint::list(tmp.path()).unwrap();
    assert!(listed[1].ends_with("step-10000000001.safetensors"));
}

#[test]
fn the_new_file_is_never_deleted_nor_any_newer_one() {
    let (tmp, dir) = open_fresh();
    for step in [10, 20, 30] {
        save_step(&dir, step, "run", 0);
    }
    // A run resumed from an earlier point: its new file is below existing ones.
    save_step(&dir, 15, "run", 2);
    assert_eq!(names(tmp.path()), [10, 15, 20, 30].map(step_name));
    save_step(&dir, 15, "run", 1);
    assert_eq!(names(tmp.path()), [15, 20, 30].map(step_name));
}

#[test]
fn an_identity_key_missing_on_either_side_means_another_run() {
    let (tmp, dir) = open_fresh();
    let mut without_mode = meta("run");
    without_mode.remove("mode");
    dir.save(&state(10), &layout(), &without_mode, 0, IDENTITY)
        .unwrap();
    save_step(&dir, 20, "run", 1);
    dir.save(&state(30), &layout(), &without_mode, 1, IDENTITY)
        .unwrap();
    assert_eq!(names(tmp.path()), [10, 20, 30].map(step_name));
}

#[test]
fn a_held_directory_is_locked_and_a_released_one_is_taken_over() {
    let tmp = tempfile::tempdir().unwrap();
    // Another process's lock, as it looks from here: a locked file with its pid.
    let mut held = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(tmp.path().join(".tandem.lock"))
        .unwrap();
    held.try_lock().unwrap();
    writeln!(held, "999999").unwrap();
    let live_temp = tmp
        .path()
        .join(".tandem-tmp-step-0000000001.safetensors-abcdef");
    fs::write(&live_temp, b"a live writer's bytes").unwrap();
    let path = tmp.path().to_owned();
    // Under a deadline: an open that waited for ever on another's lock must fail the test.
    let err = tandem_testkit::within("opening a locked directory", move || {
        CheckpointDir::open(&path).map(|_| ())
    })
    .unwrap_err();
    assert!(
        matches!(&err, CheckpointError::Locked { holder, .. } if holder == "process 999999"),
        "{err}"
    );
    let message = err.to_string();
    assert!(
        message.starts_with(&tmp.path().display().to_string()),
        "{message}"
    );
    assert!(message.contains("process 999999"), "{message}");
    assert!(live_temp.exists(), "a locked-out open swept a live temp");
    // The holder is gone (as the OS does for a dead process): the directory is taken over.
    drop(held);
    let first = CheckpointDir::open(tmp.path()).unwrap();
    assert!(!live_temp.exists());
    let pid = std::process::id().to_string();
    let lock = fs::read_to_string(tmp.path().join(".tandem.lock")).unwrap();
    assert_eq!(lock.trim(), pid);
    // A second run while the first lives is refused, named by the first's pid.
    match CheckpointDir::open(tmp.path()) {
        Err(CheckpointError::Locked { holder, .. }) => assert_eq!(holder, format!("process {pid}")),
        other => panic!("{other:?}"),
    }
    drop(first);
    CheckpointDir::open(tmp.path()).unwrap();
}

#[test]
fn an_unwritable_path_fails_at_open_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    fs::write(&file, b"not a directory").unwrap();
    for (path, says) in [
        (file.clone(), "it exists and is not a directory"),
        (file.join("below"), "Not a directory"),
    ] {
        let err = CheckpointDir::open(&path).unwrap_err();
        assert!(matches!(err, CheckpointError::Io { .. }), "{err}");
        let message = err.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains(says), "{message}");
    }
}

/// A directory where the lock can be taken (its file exists and is writable) but no checkpoint
/// can be written: by permissions where they bind (not root), else a full file system (root, as
/// in CI, where permissions do not stop writes). Unmounted on drop.
struct LockableButFull {
    path: PathBuf,
    mounted: bool,
}

impl LockableButFull {
    fn new(parent: &Path) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let path = parent.join("full");
        fs::create_dir(&path).unwrap();
        drop(CheckpointDir::open(&path).unwrap()); // leaves the lock file
        fs::set_permissions(&path, fs::Permissions::from_mode(0o555)).unwrap();
        if fs::write(path.join("probe"), b"x").is_err() {
            return Self {
                path,
                mounted: false,
            };
        }
        fs::remove_file(path.join("probe")).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tandem-test"])
            .arg(&path)
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            mounted,
            "permissions do not bind and tmpfs cannot be mounted"
        );
        drop(CheckpointDir::open(&path).unwrap());
        // Fill it: what a page of the lock file frees when it is rewritten is all there is.
        let _ = fs::write(path.join("filler"), vec![0u8; 1 << 20]);
        Self { path, mounted }
    }
}

impl Drop for LockableButFull {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.path).status();
        }
    }
}

#[test]
fn a_directory_that_takes_the_lock_but_no_checkpoint_fails_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    let full = LockableButFull::new(tmp.path());
    let err = CheckpointDir::open(&full.path).expect_err("opened a directory it cannot write");
    assert!(matches!(err, CheckpointError::Io { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("cannot write checkpoints here"),
        "{message}"
    );
    assert!(
        message.contains(&full.path.display().to_string()),
        "{message}"
    );
}

#[test]
fn a_lock_this_process_releases_meanwhile_is_waited_for_not_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let first = CheckpointDir::open(tmp.path()).unwrap();
    // Released after a moment, as when a child being spawned let go of an inherited lock.
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(first);
    });
    let second = CheckpointDir::open(tmp.path());
    release.join().unwrap();
    assert!(second.is_ok(), "{:?}", second.err());
}

#[test]
fn open_sweeps_only_its_own_stale_temporary_files() {
    let tmp = tempfile::tempdir().unwrap();
    for name in [
        ".tandem-tmp-step-0000000042.safetensors-Xy12Ab",
        ".tmpabc",
        "notes.txt",
    ] {
        fs::write(tmp.path().join(name), b"left behind").unwrap();
    }
    let dir = CheckpointDir::open(tmp.path()).unwrap();
    assert_eq!(names(tmp.path()), [".tmpabc", "notes.txt"]);
    // Saving leaves no temporary file either.
    save_step(&dir, 1, "run", 0);
    assert_eq!(names(tmp.path()), [".tmpabc", "notes.txt", &step_name(1)]);
}

/// The offset in the file of the first byte of tensor `name`.
fn data_offset(path: &Path, name: &str) -> usize {
    let bytes = fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    8 + n + header[name]["data_offsets"][0].as_u64().unwrap() as usize
}

#[test]
fn a_non_finite_value_anywhere_makes_the_file_damaged() {
    let (tmp, dir) = open_fresh();
    save_step(&dir, 2, "run", 0);
    let path = save_step(&dir, 3, "run", 0);
    let good = fs::read(&path).unwrap();
    for (tensor, value) in [
        ("params/w", [0xFF; 4]),
        ("ema/b", f32::INFINITY.to_le_bytes()),
    ] {
        let mut bytes = good.clone();
        let at = data_offset(&path, tensor);
        bytes[at..at + 4].copy_from_slice(&value);
        fs::write(&path, &bytes).unwrap();
        let err = checkpoint::load(&path, &layout()).unwrap_err();
        assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err}");
        let message = err.to_string();
        assert!(
            message.starts_with(&path.display().to_string())
                && message.contains("damaged")
                && message.contains(&format!("tensor {tensor} holds a non-finite value")),
            "{message}"
        );
        let (_, newest, skipped) = dir.load_newest(&layout(), |_| Ok::<_, String>(())).unwrap();
        assert_eq!(newest.state.step, 2);
        assert_eq!(skipped, [message]);
        // The header alone is fine: only a whole load finds the damage.
        assert_eq!(read_header(&path).unwrap().0, 3);
    }
    // A damaged state is not written at all.
    let mut bad = state(4);
    bad.slots[0].values[8] = f32::NAN;
    let err = dir
        .save(&bad, &layout(), &meta("run"), 1, IDENTITY)
        .unwrap_err();
    assert!(err.to_string().contains("ema/b"), "{err}");
    assert!(!tmp.path().join(step_name(4)).exists());
    assert_eq!(names(tmp.path()), [2, 3].map(step_name));
}

/// Bytes this thread has read through system calls so far (`rchar` of /proc/thread-self/io:
/// per thread, so the tests running beside this one do not count).
fn bytes_read() -> u64 {
    std::fs::read_to_string("/proc/thread-self/io")
        .expect("/proc/thread-self/io (Linux)")
        .lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|n| n.trim().parse().ok())
        .expect("an rchar line")
}

#[test]
fn a_file_claiming_gigabytes_is_rejected_after_reading_only_its_header() {
    const SIX_GB: u64 = 6 << 30;
    let (tmp, dir) = open_fresh();
    // A valid checkpoint padded (sparsely) to 6 GB.
    let padded = save_step(&dir, 1, "run", 0);
    File::options()
        .write(true)
        .open(&padded)
        .unwrap()
        .set_len(SIX_GB)
        .unwrap();
    // A header describing one 6 GB tensor: once with a short file, once with a file of the size
    // it claims.
    let mut header = format!(
        r#"{{"__metadata__":{{"step":"1"}},"params/w":{{"dtype":"F32","shape":[{}],"data_offsets":[0,{SIX_GB}]}}}}"#,
        SIX_GB / 4
    )
    .into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(&header);
    bytes.extend([0; 64]);
    let short = tmp.path().join("huge-short.safetensors");
    fs::write(&short, &bytes).unwrap();
    let huge = tmp.path().join("huge.safetensors");
    fs::write(&huge, &bytes[..8 + header.len()]).unwrap();
    File::options()
        .write(true)
        .open(&huge)
        .unwrap()
        .set_len(8 + header.len() as u64 + SIX_GB)
        .unwrap();
    for (path, size_error) in [(&padded, true), (&short, true), (&huge, false)] {
        let before = bytes_read();
        let err = checkpoint::load(path, &layout()).unwrap_err();
        // Counted by the kernel rather than timed: the header, not the gigabytes behind it.
        let read = bytes_read() - before;
        assert!(read < 1 << 20, "read {read} bytes: {err}");
        let message = err.to_string();
        assert!(
            message.starts_with(&path.display().to_string()),
            "{message}"
        );
        if size_error {
            assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err}");
            assert!(message.contains("size"), "{message}");
            assert!(read_header(path).is_err());
        } else {
            assert!(matches!(err, CheckpointError::Mismatch { .. }), "{err}");
            assert_eq!(read_header(path).unwrap().0, 1);
        }
    }
}

#[test]
fn a_missing_or_malformed_step_is_an_error() {
    use std::collections::HashMap;
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(step_name(1));
    let mut cases: Vec<Option<HashMap<String, String>>> =
        vec![None, Some(HashMap::from([("mode".into(), "sync".into())]))];
    for step in ["", "-1", "+5", " 5", "12x", "18446744073709551616"] {
        cases.push(Some(HashMap::from([("step".into(), step.into())])));
    }
    for metadata in cases {
        fs::write(&path, file_with_metadata(|_| Dtype::F32, metadata.clone())).unwrap();
        let err = checkpoint::load(&path, &layout()).unwrap_err();
        assert!(
            matches!(err, CheckpointError::Corrupt { .. }),
            "{metadata:?}: {err}"
        );
        assert!(err.to_string().contains("step"), "{err}");
        assert!(read_header(&path).is_err(), "{metadata:?}");
    }
    // The same tensors with a step load.
    let metadata = HashMap::from([("step".into(), "18446744073709551615".into())]);
    fs::write(&path, file_with_metadata(|_| Dtype::F32, Some(metadata))).unwrap();
    assert_eq!(
        checkpoint::load(&path, &layout()).unwrap().state.step,
        u64::MAX
    );
}

#[test]
fn identical_states_serialise_to_identical_bytes() {
    let metadata: BTreeMap<String, String> = (0..12)
        .map(|i| (format!("key{i:02}"), format!("value {i}")))
        .collect();
    let bytes = to_bytes(&state(5), &layout(), &metadata).unwrap();
    // Every call builds fresh hash maps, each with its own random order.
    for _ in 0..5 {
        assert_eq!(to_bytes(&state(5), &layout(), &metadata).unwrap(), bytes);
    }
    let metadata2 = metadata.clone();
    let elsewhere = std::thread::spawn(move || to_bytes(&state(5), &layout(), &metadata2))
        .join()
        .unwrap()
        .unwrap();
    assert_eq!(elsewhere, bytes);
    let (_tmp, dir) = open_fresh();
    let path = dir.save(&state(5), &layout(), &metadata, 0, &[]).unwrap();
    assert_eq!(fs::read(&path).unwrap(), bytes);
    let loaded = checkpoint::load(&path, &layout()).unwrap();
    assert_eq!(loaded.metadata, metadata);
    assert_eq!(loaded.state, state(5));
    // Still a file safetensors reads.
    safetensors::SafeTensors::deserialize(&bytes).unwrap();
}

#[test]
fn load_newest_skips_what_accept_rejects_and_says_why() {
    let (tmp, dir) = open_fresh();
    save_step(&dir, 1, "mine", 0);
    let theirs = save_step(&dir, 2, "theirs", 0);
    let accept = |c: &checkpoint::Checkpoint| match c.metadata["run"].as_str() {
        "mine" => Ok(()),
        other => Err(format!("written by run {other}")),
    };
    let (_, newest, skipped) = dir.load_newest(&layout(), accept).unwrap();
    assert_eq!(newest.state.step, 1);
    assert_eq!(
        skipped,
        [format!("{}: written by run theirs", theirs.display())]
    );
    let none = dir
        .load_newest(&layout(), |_| Err("no".to_string()))
        .unwrap_err();
    assert!(
        matches!(&none, CheckpointError::NoneFound { skipped, .. } if skipped.len() == 2),
        "{none}"
    );
    assert_eq!(dir.path(), tmp.path());
}

#[test]
fn round_trip_is_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let path = save_in_dir(dir.path(), &state(42), &layout(), &meta("run"), 3).unwrap();
    let loaded = checkpoint::load(&path, &layout()).unwrap();
    assert_eq!(loaded.state, state(42));
    assert_eq!(loaded.metadata, meta("run"));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(loaded.state.slot("ema").unwrap()),
        bits(state(42).slot("ema").unwrap())
    );
    assert_eq!(read_header(&path).unwrap(), (42, meta("run")));
}

#[test]
fn keeps_only_the_newest_and_resumes_from_the_newest_valid() {
    let dir = tempfile::tempdir().unwrap();
    for step in [10, 20, 30, 40] {
        save_in_dir(dir.path(), &state(step), &layout(), &meta("run"), 3).unwrap();
    }
    let names: Vec<_> = checkpoint::list(dir.path())
        .unwrap()
        .iter()
        .map(|p| p.file_name().unwrap().to_owned())
        .collect();
    assert_eq!(
        names,
        [
            "step-0000000020.safetensors",
            "step-0000000030.safetensors",
            "step-0000000040.safetensors"
        ]
    );
    // Damage the newest: resuming falls back to the one before and says why.
    let newest = dir.path().join("step-0000000040.safetensors");
    let bytes = fs::read(&newest).unwrap();
    fs::write(&newest, &bytes[..bytes.len() / 2]).unwrap();
    let (path, loaded, skipped) =
        checkpoint::load_newest(dir.path(), &layout(), |_| Ok::<_, String>(())).unwrap();
    assert_eq!(loaded.state.step, 30);
    assert!(path.ends_with("step-0000000030.safetensors"));
    assert_eq!(skipped.len(), 1);
    assert!(
        skipped[0].contains("step-0000000040.safetensors"),
        "{}",
        skipped[0]
    );
}

#[test]
fn truncated_corrupted_and_mismatched_files_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = save_in_dir(dir.path(), &state(1), &layout(), &meta("run"), 0).unwrap();
    let good = fs::read(&path).unwrap();
    let bad = dir.path().join("bad.safetensors");
    let check = |bytes: &[u8], layout: &[ParamSpan], corrupt: bool| {
        fs::write(&bad, bytes).unwrap();
        let err = checkpoint::load(&bad, layout).unwrap_err();
        assert!(
            err.to_string().starts_with(&bad.display().to_string()),
            "{err}"
        );
        assert_eq!(
            matches!(err, CheckpointError::Corrupt { .. }),
            corrupt,
            "{err}"
        );
        assert_eq!(
            matches!(err, CheckpointError::Mismatch { .. }),
            !corrupt,
            "{err}"
        );
    };
    check(&good[..good.len() - 5], &layout(), true);
    check(&good[..3], &layout(), true);
    check(b"", &layout(), true);
    let mut garbled = good.clone();
    garbled[10] = b'}';
    check(&garbled, &layout(), true);
    let mut padded = good.clone();
    padded.extend([0; 8]);
    check(&padded, &layout(), true);
    check(&good, &common::weights_and_bias(vec![2, 4], 4), false);
    check(&good, &layout()[..1], false);
    let missing = checkpoint::load(&dir.path().join("nope.safetensors"), &layout()).unwrap_err();
    assert!(matches!(missing, CheckpointError::Io { .. }));
    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(
        checkpoint::load_newest(empty.path(), &layout(), |_| Ok::<_, String>(())),
        Err(CheckpointError::NoneFound { .. })
    ));
}

const CHILD_DIR: &str = "TANDEM_CHECKPOINT_TEST_CHILD_DIR";

/// The child process of the kill test (run by it, with `--ignored`): saves large checkpoints
/// until it is killed (or has saved 100).
#[test]
#[ignore = "the child process of kill_9_mid_write_leaves_only_loadable_checkpoints"]
fn child_writer() {
    let dir = std::env::var_os(CHILD_DIR).expect("run by the kill test, which names the directory");
    let dir = CheckpointDir::open(Path::new(&dir)).unwrap();
    let layout = big_layout();
    // Bounded, so that a writer whose parent died, or a rotation broken by a mutant, cannot
    // fill the disk: the parent kills it within a few saves.
    for step in 1..=100 {
        let values = vec![step as f32; layout[0].len()];
        let state = TrainState {
            params: values.clone(),
            slots: vec![Slot {
                name: "ema".into(),
                values,
            }],
            step,
        };
        dir.save(&state, &layout, &meta("child"), 3, IDENTITY)
            .unwrap();
    }
}

fn big_layout() -> Vec<ParamSpan> {
    vec![ParamSpan {
        name: "w".into(),
        shape: vec![1 << 21],
        weight_decay: false,
    }]
}

/// Whether `dir` holds a temporary file of a save in progress.
fn writing(dir: &Path) -> bool {
    fs::read_dir(dir).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(".tandem-tmp-step-"))
    })
}

/// A child process killed however the test ends, so that a failed assertion leaves no writer
/// behind.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn kill_9_mid_write_leaves_only_loadable_checkpoints() {
    let exe = std::env::current_exe().unwrap();
    // After the first checkpoint plus a delay, or (None) as soon as a save's temporary file
    // shows: in the middle of a write.
    for delay_ms in [Some(0), Some(70), Some(200), None, None] {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = KillOnDrop(
            Command::new(&exe)
                .args(["--exact", "child_writer", "--ignored", "--test-threads=1"])
                .env(CHILD_DIR, tmp.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let child = &mut child.0;
        let deadline = Instant::now() + Duration::from_secs(60);
        let ready = |dir: &Path| match delay_ms {
            Some(_) => checkpoint::list(dir).is_ok_and(|l| !l.is_empty()),
            None => writing(dir),
        };
        while !ready(tmp.path()) {
            assert!(child.try_wait().unwrap().is_none(), "the writer ended");
            assert!(Instant::now() < deadline, "the writer wrote nothing");
            std::thread::sleep(Duration::from_micros(200));
        }
        std::thread::sleep(Duration::from_millis(delay_ms.unwrap_or(0)));
        child.kill().unwrap(); // SIGKILL on Unix
        child.wait().unwrap();
        // The dead writer's lock went with it; its temporary file, if any, is swept.
        let dir = CheckpointDir::open(tmp.path()).unwrap();
        let left: Vec<PathBuf> = fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap() != ".tandem.lock")
            .collect();
        let files = dir.checkpoints().unwrap();
        assert_eq!(left.len(), files.len(), "{left:?}");
        // keep 3, plus the new file when killed before its rotation.
        assert!(files.len() <= 4, "{files:?}");
        for (step, path) in &files {
            let loaded = checkpoint::load(path, &big_layout()).unwrap();
            assert_eq!(loaded.state.step, *step);
            assert!(loaded.state.params.iter().all(|&v| v == *step as f32));
        }
    }
}

#[test]
fn a_state_that_does_not_fit_the_layout_is_not_saved() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CheckpointDir::open(tmp.path()).unwrap();
    let mut short_params = state(1);
    short_params.params.pop();
    let mut short_ema = state(1);
    short_ema.slots[0].values.pop();
    for bad in [short_params, short_ema] {
        let err = dir
            .save(&bad, &layout(), &meta("run"), 3, IDENTITY)
            .expect_err("saved a state of the wrong size");
        assert!(matches!(err, CheckpointError::Mismatch { .. }), "{err}");
    }
    assert!(dir.checkpoints().unwrap().is_empty());
}

/// `save_in_dir` takes every metadata key but `end_step` as the run's identity: a resumed run
/// that was extended rotates its own earlier files, and another run's are left alone.
#[test]
fn save_in_dir_rotates_the_extended_run_and_spares_another() {
    let tmp = tempfile::tempdir().unwrap();
    let mut other = meta("other");
    other.insert("end_step".into(), "1000".into());
    save_in_dir(tmp.path(), &state(5), &layout(), &other, 2).unwrap();
    save_in_dir(tmp.path(), &state(10), &layout(), &meta("run"), 2).unwrap();
    save_in_dir(tmp.path(), &state(20), &layout(), &meta("run"), 2).unwrap();
    let mut extended = meta("run");
    extended.insert("end_step".into(), "5000".into());
    save_in_dir(tmp.path(), &state(30), &layout(), &extended, 2).unwrap();
    assert_eq!(
        names(tmp.path()),
        [
            "step-0000000005.safetensors",
            "step-0000000020.safetensors",
            "step-0000000030.safetensors"
        ]
    );
}
