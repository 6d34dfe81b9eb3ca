//! `cuda-emu`: installs tandem's CPU stand-in for the CUDA driver (crates/tandem-cuda-emu) as
//! `target/cuda-emu/lib64/libcuda.so.1`, plus the `libcuda.so` link name.
//!
//! Binaries built with `--features cuda` link against it exactly as against NVIDIA's driver
//! and record only its SONAME (no rpath): `LD_LIBRARY_PATH` picks the stand-in at run time,
//! and on a GPU machine the same binaries load the real driver.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

/// Builds the stand-in (release: it interprets every kernel) and returns `target/cuda-emu`,
/// the folder to name in `CUDA_LIBRARY_PATH`; the library itself is in its `lib64/`.
pub fn build(root: &Path) -> Result<PathBuf> {
    crate::run(Command::new(env!("CARGO")).current_dir(root).args([
        "build",
        "--release",
        "--quiet",
        "-p",
        "tandem-cuda-emu",
    ]))?;
    let built = target_dir(root).join("release/libtandem_cuda_emu.so");
    let emu = root.join("target").join("cuda-emu");
    let lib64 = emu.join("lib64");
    fs::create_dir_all(&lib64).with_context(|| format!("creating {}", lib64.display()))?;
    let so1 = lib64.join("libcuda.so.1");
    // Replace rather than overwrite in place: a process may have the old one mapped.
    let fresh = lib64.join("libcuda.so.1.new");
    fs::copy(&built, &fresh)
        .with_context(|| format!("copying {} to {}", built.display(), fresh.display()))?;
    fs::rename(&fresh, &so1).with_context(|| format!("installing {}", so1.display()))?;
    // The linker looks for libcuda.so; binaries then ask for the SONAME, libcuda.so.1.
    let so = lib64.join("libcuda.so");
    if so.symlink_metadata().is_ok() {
        fs::remove_file(&so).with_context(|| format!("removing {}", so.display()))?;
    }
    std::os::unix::fs::symlink("libcuda.so.1", &so)
        .with_context(|| format!("linking {}", so.display()))?;
    eprintln!("CUDA driver stand-in in {}", lib64.display());
    Ok(emu)
}

/// Cargo's target folder: `CARGO_TARGET_DIR` when set, else `target/` in the workspace.
fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|dir| {
            if dir.is_absolute() {
                dir
            } else {
                root.join(dir)
            }
        })
        .unwrap_or_else(|| root.join("target"))
}
