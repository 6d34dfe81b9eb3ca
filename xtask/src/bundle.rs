//! `gpu-bundle`: everything a GPU machine without a Rust toolchain needs to run the CUDA tests,
//! train on the GPU and time PyTorch beside it, in the ignored folder `gpu-bundle/`.
//!
//! The executables link against the CUDA driver stand-in here but record only its SONAME
//! (libcuda.so.1), so there they load the real driver.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result};

use crate::{emu, run};

const RUN_SH: &str = include_str!("../bundle/run.sh");

/// The test executables that need a GPU: tandem-kernels' `cuda` (every kernel against its CPU
/// twin) and tandem-integration's `model_gpu` (the whole model and the sync strategy). The
/// other tests of these crates read the source tree, which the bundle does not carry, or need
/// no GPU.
const GPU_TESTS: &[&str] = &["cuda", "model_gpu"];

/// Builds `gpu-bundle/`: `bin/mnist-train`, `tests/*` (the `--features cuda` test executables of
/// tandem-kernels and tandem-integration named in [`GPU_TESTS`]), `anchors/` (the PyTorch
/// anchor's GPU variants: eager, CUDA graph, `torch.compile`), `conformance/` (kernels/conformance's checker and PTX),
/// `data/mnist/` and `run.sh`.
pub fn build(root: &Path) -> Result<()> {
    let bundle = root.join("gpu-bundle");
    if bundle.exists() {
        fs::remove_dir_all(&bundle).with_context(|| format!("removing {}", bundle.display()))?;
    }
    let driver = emu::build(root)?;

    let binaries = cargo_executables(
        root,
        &driver,
        &[
            "build",
            "--release",
            "-p",
            "mnist-train",
            "--features",
            "cuda",
        ],
        |name, test| !test && name == "mnist-train",
    )?;
    copy_all(&binaries, &bundle.join("bin"))?;
    let tests = cargo_executables(
        root,
        &driver,
        &[
            "test",
            "--release",
            "-p",
            "tandem-kernels",
            "-p",
            "tandem-integration",
            "--features",
            "cuda",
            "--no-run",
        ],
        |name, test| test && GPU_TESTS.contains(&name),
    )?;
    anyhow::ensure!(
        tests.len() == GPU_TESTS.len(),
        "expected the test executables {GPU_TESTS:?}, cargo built {tests:?}"
    );
    copy_all(&tests, &bundle.join("tests"))?;
    // Debug information would make the bundle too large to send to the GPU machine (64 MiB
    // with the working tree).
    for folder in ["bin", "tests"] {
        for entry in
            fs::read_dir(bundle.join(folder)).with_context(|| format!("reading {folder}"))?
        {
            run(Command::new("strip")
                .arg("--strip-debug")
                .arg(entry?.path()))?;
        }
    }

    let anchors_src = root.join("../shared/anchors");
    let anchors = bundle.join("anchors");
    // It reads data/mnist beside its own folder.
    copy_all(&[anchors_src.join("torch_gpu_variants.py")], &anchors)?;
    // The conformance suite: its checker and the committed PTX it loads.
    let conformance: Vec<PathBuf> = fs::read_dir(root.join("kernels/conformance"))
        .context("reading kernels/conformance")?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|path| path.extension().is_some_and(|e| e == "ptx" || e == "py"))
        .collect();
    copy_all(&conformance, &bundle.join("conformance"))?;
    let data: Vec<PathBuf> = fs::read_dir(root.join("data/mnist"))
        .context("reading data/mnist")?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    copy_all(&data, &bundle.join("data/mnist"))?;
    write(&bundle.join("run.sh"), RUN_SH, true)?;
    eprintln!(
        "bundle ready ({:.1} MiB): copy {} to the GPU machine and run ./run.sh there",
        folder_size(&bundle)? as f64 / (1024.0 * 1024.0),
        bundle.display()
    );
    Ok(())
}

/// Runs `cargo ARGS` against the stand-in driver and returns the executables it built whose
/// target name and test-ness `keep` accepts.
fn cargo_executables(
    root: &Path,
    driver: &Path,
    args: &[&str],
    keep: impl Fn(&str, bool) -> bool,
) -> Result<Vec<PathBuf>> {
    let json = crate::output(
        Command::new(env!("CARGO"))
            .current_dir(root)
            .env("CUDA_LIBRARY_PATH", driver)
            .args(args)
            .arg("--message-format=json")
            .stderr(Stdio::inherit()),
    )?;
    let mut found = Vec::new();
    for line in json.lines() {
        let message: serde_json::Value =
            serde_json::from_str(line).context("parsing cargo's JSON messages")?;
        let name = message["target"]["name"].as_str().unwrap_or_default();
        let test = message["profile"]["test"] == true;
        if let Some(path) = message["executable"].as_str() {
            if message["reason"] == "compiler-artifact" && keep(name, test) {
                found.push(PathBuf::from(path));
            }
        }
    }
    anyhow::ensure!(
        !found.is_empty(),
        "cargo {} built none of the expected executables",
        args.join(" ")
    );
    Ok(found)
}

fn copy_all(files: &[PathBuf], dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for file in files {
        let name = file
            .file_name()
            .with_context(|| format!("{} has no file name", file.display()))?;
        fs::copy(file, dir.join(name))
            .with_context(|| format!("copying {} to {}", file.display(), dir.display()))?;
    }
    Ok(())
}

fn write(path: &Path, text: &str, executable: bool) -> Result<()> {
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    if executable {
        fs::set_permissions(path, fs::Permissions::from_mode(0o755))
            .with_context(|| format!("making {} executable", path.display()))?;
    }
    Ok(())
}

/// The total size of the files under `folder`.
fn folder_size(folder: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(folder).with_context(|| format!("reading {}", folder.display()))? {
        let entry = entry?;
        total += if entry.file_type()?.is_dir() {
            folder_size(&entry.path())?
        } else {
            entry.metadata()?.len()
        };
    }
    Ok(total)
}
