//! `build-kernels`: kernels/*.cu to the PTX that tandem-kernels embeds.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::toolchain::{self, Toolchain};

/// The virtual architecture of the committed PTX: compute_75 (Turing) is the oldest nvcc 13
/// accepts, so every GPU from the T4 on can JIT it; the kernels need nothing newer, except
/// those of a file whose first line names another ([`ARCH_LINE`]). Keep in step with
/// `tandem_kernels::ptx::PTX_TARGET`.
const PTX_ARCH: &str = "compute_75";

/// A source's first line `// nvcc-arch: compute_NN` compiles it for `compute_NN` instead of
/// [`PTX_ARCH`] (instructions older GPUs lack, such as tensor-core products); the loader then
/// loads it only on GPUs that have them. `kernels/conformance/build.sh` reads the same line.
const ARCH_LINE: &str = "// nvcc-arch: ";

/// The real architecture ptxas validates the PTX for (Hopper: the H100 and H200).
const CUBIN_ARCH: &str = "sm_90";

/// Compiles every kernel to PTX and validates it with ptxas; writes it to
/// `crates/tandem-kernels/ptx/`, or with `check` compares it with what is committed there.
pub fn build(root: &Path, check: bool, pinned: bool) -> Result<()> {
    let tc = toolchain::find(root, pinned)?;
    eprintln!("nvcc {} ({})", tc.release, tc.nvcc.display());
    if tc.release != toolchain::PINNED_RELEASE {
        eprintln!(
            "warning: the committed PTX comes from nvcc {}; this nvcc may write different PTX \
             (pass --pinned to use that release)",
            toolchain::PINNED_RELEASE
        );
    }
    let sources = sources(&root.join("kernels"))?;
    let committed = root.join("crates/tandem-kernels/ptx");
    let scratch = root.join("target/xtask-kernels");
    let out_dir = if check {
        scratch.join("ptx")
    } else {
        committed.clone()
    };
    for dir in [&out_dir, &scratch] {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }

    let mut stale = Vec::new();
    for (name, source) in &sources {
        let ptx = out_dir.join(format!("{name}.ptx"));
        compile(&tc, source, &ptx)?;
        validate(&tc, &ptx, &scratch.join(format!("{name}.cubin")))?;
        if check {
            let fresh = read(&ptx)?;
            let old = fs::read_to_string(committed.join(format!("{name}.ptx"))).ok();
            if old.as_deref() != Some(fresh.as_str()) {
                stale.push(format!("{name}.ptx"));
            }
        }
    }
    // PTX whose source is gone: stale in a check, removed in a build.
    for orphan in ptx_files(&committed)? {
        let stem = orphan
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        if !sources.iter().any(|(name, _)| name == stem) {
            if check {
                stale.push(format!("{stem}.ptx (no kernels/{stem}.cu)"));
            } else {
                fs::remove_file(&orphan)
                    .with_context(|| format!("removing {}", orphan.display()))?;
            }
        }
    }
    if !stale.is_empty() {
        bail!(
            "stale PTX in crates/tandem-kernels/ptx: {}; run `cargo xtask build-kernels` and commit",
            stale.join(", ")
        );
    }
    eprintln!(
        "{} {} kernel files ({PTX_ARCH} PTX unless a file names another, ptxas-validated for {CUBIN_ARCH})",
        if check { "checked" } else { "built" },
        sources.len()
    );
    Ok(())
}

/// `(name, path)` of every `*.cu` in `dir`, sorted by name.
fn sources(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "cu") {
            let name = path
                .file_stem()
                .and_then(|s| s.to_str())
                .with_context(|| format!("{} has no UTF-8 name", path.display()))?;
            found.push((name.to_string(), path.clone()));
        }
    }
    found.sort();
    if found.is_empty() {
        bail!("no kernels in {}", dir.display());
    }
    Ok(found)
}

fn ptx_files(dir: &Path) -> Result<Vec<PathBuf>> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "ptx") {
            found.push(path);
        }
    }
    Ok(found)
}

/// nvcc to PTX. No -lineinfo or -G: those embed the source path, and the output must be the
/// same text on every machine. -Werror: a kernel that warns is not committed.
fn compile(tc: &Toolchain, source: &Path, ptx: &Path) -> Result<()> {
    let text = read(source)?;
    let arch = arch_of(&text).with_context(|| format!("{}: its first line", source.display()))?;
    let mut nvcc = Command::new(&tc.nvcc);
    nvcc.args(["-ptx", &format!("-arch={arch}"), "-std=c++17"])
        .args(["-Werror", "all-warnings"]);
    if let Some(cccl) = &tc.cccl_include {
        nvcc.arg("-I").arg(cccl);
    }
    crate::run(nvcc.arg("-o").arg(ptx).arg(source))
}

/// The virtual architecture a kernel source asks for ([`ARCH_LINE`]), else [`PTX_ARCH`].
fn arch_of(source: &str) -> Result<&str> {
    let Some(arch) = source
        .lines()
        .next()
        .and_then(|l| l.strip_prefix(ARCH_LINE))
    else {
        return Ok(PTX_ARCH);
    };
    let digits = arch.strip_prefix("compute_").unwrap_or_default();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        bail!("`{ARCH_LINE}{arch}` names no virtual architecture (compute_NN)");
    }
    Ok(arch)
}

/// ptxas to a CUBIN_ARCH cubin: the same compilation the driver's JIT does on a Hopper GPU.
fn validate(tc: &Toolchain, ptx: &Path, cubin: &Path) -> Result<()> {
    crate::run(
        Command::new(&tc.ptxas)
            .args([&format!("-arch={CUBIN_ARCH}"), "--warning-as-error", "-o"])
            .arg(cubin)
            .arg(ptx),
    )
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_line_names_the_architecture() {
        assert_eq!(arch_of("// x\nkernel").unwrap(), PTX_ARCH);
        assert_eq!(arch_of("// nvcc-arch: compute_80\n").unwrap(), "compute_80");
        // Only the first line counts.
        assert_eq!(arch_of("\n// nvcc-arch: compute_80").unwrap(), PTX_ARCH);
        for bad in ["compute_", "sm_80", "compute_8a", ""] {
            assert!(arch_of(&format!("// nvcc-arch: {bad}")).is_err(), "{bad}");
        }
    }
}
