//! `cuda-emu`: installs tandem's CPU stand-in for the CUDA driver (crates/tandem-cuda-emu) as
//! `target/cuda-emu/lib64/libcuda.so.1`, plus the `libcuda.so` link name.
//!
//! Binaries built with `--features cuda` link against it exactly as against NVIDIA's driver
//! and record only its SONAME (no rpath): `LD_LIBRARY_PATH` picks the stand-in at run time,
//! and on a GPU machine the same binaries load the real driver.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context, Result};

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
    check_exports(root, &fresh)?;
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

/// Fails unless `library` has the SONAME `libcuda.so.1` and exports every `cu*` function that
/// cust_raw declares (binaries bind every symbol at load: one missing would stop them there).
fn check_exports(root: &Path, library: &Path) -> Result<()> {
    let dynamic = crate::output(Command::new("readelf").arg("-d").arg(library))?;
    ensure!(
        dynamic.contains("[libcuda.so.1]"),
        "{}: its SONAME is not libcuda.so.1",
        library.display()
    );
    let symbols = crate::output(
        Command::new("nm")
            .args(["-D", "--defined-only"])
            .arg(library),
    )?;
    let exported: BTreeSet<&str> = symbols
        .lines()
        .filter_map(|line| line.split_whitespace().nth(2))
        .collect();
    let bindings = cust_raw_dir(root)?.join("src").join("cuda.rs");
    let text =
        fs::read_to_string(&bindings).with_context(|| format!("reading {}", bindings.display()))?;
    let declared = driver_functions(&text);
    ensure!(
        !declared.is_empty(),
        "found no driver functions in {}",
        bindings.display()
    );
    let missing: Vec<_> = declared.difference(&exported).collect();
    ensure!(
        missing.is_empty(),
        "{} does not export {missing:?}",
        library.display()
    );
    Ok(())
}

/// The folder of the cust_raw package this workspace resolves, from `cargo metadata`.
fn cust_raw_dir(root: &Path) -> Result<PathBuf> {
    let metadata = crate::cargo_metadata(root, "--all-features")?;
    let manifest = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "cust_raw")
        .and_then(|p| p["manifest_path"].as_str())
        .context("cargo metadata lists no cust_raw package (is cust a dependency?)")?;
    Path::new(manifest)
        .parent()
        .map(Path::to_path_buf)
        .context("cust_raw's manifest has no parent folder")
}

/// The names of the `cu*` functions declared (`pub fn cuName(`) in cust_raw's bindings.
fn driver_functions(bindings: &str) -> BTreeSet<&str> {
    bindings
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("pub fn "))
        .filter_map(|rest| rest.split('(').next())
        .filter(|name| name.starts_with("cu"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::driver_functions;

    #[test]
    fn finds_declared_driver_functions_only() {
        let text = "extern \"C\" {\n    pub fn cuInit(Flags: c_uint) -> CUresult;\n}\n\
                    pub fn helper() {}\n    pub fn cuMemAlloc_v2(p: *mut u64, n: usize) -> CUresult;\n";
        let names: Vec<_> = driver_functions(text).into_iter().collect();
        assert_eq!(names, ["cuInit", "cuMemAlloc_v2"]);
    }
}
