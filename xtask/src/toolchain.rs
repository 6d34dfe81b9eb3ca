//! Finding nvcc and ptxas, or installing the pinned CUDA toolchain from PyPI wheels.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

/// The wheels of the pinned toolchain. The committed PTX is nvcc 13.0.88's output: another
/// nvcc may write different (equally valid) PTX and so fail `build-kernels --check`.
const PINNED_WHEELS: &[&str] = &[
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
];

/// The release `nvcc --version` reports for the pinned toolchain.
pub const PINNED_RELEASE: &str = "V13.0.88";

/// Where the wheels install the toolkit (bin/, include/, nvvm/, lib/), below the pip target.
const WHEEL_TOOLKIT: &str = "nvidia/cu13";

/// The compilers the kernels are built with.
pub struct Toolchain {
    /// nvcc.
    pub nvcc: PathBuf,
    /// ptxas, beside nvcc.
    pub ptxas: PathBuf,
    /// The CCCL headers (libcu++, CUB), which the wheels put under include/cccl.
    pub cccl_include: Option<PathBuf>,
    /// The release nvcc reports, such as `V13.0.88`.
    pub release: String,
}

/// nvcc from `CUDA_PATH`, then `PATH`, else (or with `pinned`) the pinned wheels, installed
/// once into `target/cuda-toolchain/`.
pub fn find(root: &Path, pinned: bool) -> Result<Toolchain> {
    let installed = if pinned { None } else { installed_nvcc() };
    let nvcc = match installed {
        Some(nvcc) => nvcc,
        None => install_pinned(&root.join("target").join("cuda-toolchain"))?,
    };
    let bin = nvcc.parent().context("nvcc has no parent folder")?;
    let cccl = bin.join("../include/cccl");
    let version = crate::output(Command::new(&nvcc).arg("--version"))?;
    let release = version
        .split([',', ' ', '\n'])
        .find(|word| word.starts_with('V') && word[1..].starts_with(|c: char| c.is_ascii_digit()))
        .unwrap_or("unknown")
        .to_string();
    Ok(Toolchain {
        ptxas: bin.join("ptxas"),
        cccl_include: cccl.is_dir().then_some(cccl),
        nvcc,
        release,
    })
}

fn installed_nvcc() -> Option<PathBuf> {
    let from_cuda_path = env::var_os("CUDA_PATH").map(|dir| PathBuf::from(dir).join("bin"));
    let from_path = env::var_os("PATH")
        .map(|path| env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    from_cuda_path
        .into_iter()
        .chain(from_path)
        .map(|dir| dir.join("nvcc"))
        .find(|nvcc| nvcc.is_file())
}

/// Installs the pinned wheels into `dir` unless a previous run finished installing exactly
/// them there (a marker file records the list), and returns its nvcc.
fn install_pinned(dir: &Path) -> Result<PathBuf> {
    let marker = dir.join(".installed");
    let wanted = PINNED_WHEELS.join("\n");
    if fs::read_to_string(&marker).ok().as_deref() != Some(wanted.as_str()) {
        eprintln!(
            "installing the pinned CUDA toolchain into {}",
            dir.display()
        );
        if dir.exists() {
            fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        crate::run(
            Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .args(["--root-user-action=ignore"])
                // Exactly the listed wheels: their own requirements would pull in others.
                .args(["--no-deps", "--target"])
                .arg(dir)
                .args(PINNED_WHEELS),
        )
        .context("installing the CUDA toolchain wheels with pip (is python3 -m pip available?)")?;
        fs::write(&marker, wanted).with_context(|| format!("writing {}", marker.display()))?;
    }
    let nvcc = dir.join(WHEEL_TOOLKIT).join("bin").join("nvcc");
    anyhow::ensure!(nvcc.is_file(), "the wheels installed no {}", nvcc.display());
    Ok(nvcc)
}
