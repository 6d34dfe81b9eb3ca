//! Checks of the committed PTX that need no GPU and no `cuda` feature.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use tandem_kernels::ptx::{
    Kernel, MAX_GRADIENT_BUFFERS, MODULES, PTX_ISA_VERSION, PTX_TARGET, UPDATE,
};

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The stems of the files in `dir` ending in `.ext`.
fn stems(dir: &Path, ext: &str) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == ext))
        .map(|path| {
            path.file_stem()
                .expect("a file name")
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

/// The names of the `.entry` points a PTX text defines.
fn entries(ptx: &str) -> BTreeSet<&str> {
    ptx.lines()
        .filter_map(|line| line.split(".entry ").nth(1))
        .filter_map(|rest| rest.split('(').next())
        .collect()
}

#[test]
fn every_kernel_file_has_committed_ptx_and_a_module() {
    let sources = stems(&crate_dir().join("../../kernels"), "cu");
    let committed = stems(&crate_dir().join("ptx"), "ptx");
    let modules: BTreeSet<String> = MODULES.iter().map(|m| m.name.to_string()).collect();
    assert_eq!(sources, committed, "kernels/*.cu against ptx/*.ptx");
    assert_eq!(sources, modules, "kernels/*.cu against ptx::MODULES");
    for module in MODULES {
        let path = crate_dir().join("ptx").join(format!("{}.ptx", module.name));
        let text = fs::read_to_string(&path).expect("committed PTX");
        assert_eq!(
            text,
            module.ptx,
            "{} is not what is embedded",
            path.display()
        );
    }
}

#[test]
fn the_launch_code_names_exactly_the_ptx_entry_points() {
    for (index, module) in MODULES.iter().enumerate() {
        let named: BTreeSet<&str> = Kernel::ALL
            .iter()
            .filter(|k| k.module_index() == index)
            .map(|k| k.entry())
            .collect();
        assert_eq!(
            named,
            entries(module.ptx),
            "entry points of {}",
            module.name
        );
    }
}

#[test]
fn modules_are_compiled_for_the_documented_target() {
    for module in MODULES {
        assert!(
            module
                .ptx
                .contains(&format!("\n.version {PTX_ISA_VERSION}\n")),
            "{}: PTX ISA other than {PTX_ISA_VERSION}: update ptx::PTX_ISA_VERSION, \
             ptx::MIN_DRIVER and kernels/README.md",
            module.name
        );
        assert!(
            module.ptx.contains(&format!("\n.target {PTX_TARGET}\n")),
            "{}: target other than {PTX_TARGET}",
            module.name
        );
    }
}

#[test]
fn nothing_uses_atomics() {
    // Atomics would make the order of additions, and so the results, vary from run to run.
    for module in MODULES {
        for line in module.ptx.lines().map(str::trim_start) {
            assert!(
                !line.starts_with("atom.") && !line.starts_with("red."),
                "{}: {line}",
                module.name
            );
        }
    }
}

#[test]
fn the_gradient_table_has_the_size_the_rust_side_passes() {
    // `Grads` travels by value: 16 device pointers, as [u64; MAX_GRADIENT_BUFFERS] in Rust.
    let bytes = MAX_GRADIENT_BUFFERS * 8;
    for param in ["sgd_ema_update_param_2", "mean_gradients_param_1"] {
        assert!(
            UPDATE.contains(&format!(".param .align 8 .b8 {param}[{bytes}]")),
            "{param} is not {bytes} bytes"
        );
    }
}

/// The PTX parameter types of `entry`, in order (the size, `128`, for a by-value struct).
fn params<'a>(ptx: &'a str, entry: &str) -> Vec<&'a str> {
    let start = ptx
        .find(&format!(".entry {entry}("))
        .unwrap_or_else(|| panic!("no entry {entry}"));
    let list = &ptx[start..];
    let list = &list[..list.find(')').expect("a closing parenthesis")];
    list.lines()
        .filter_map(|line| line.trim().strip_prefix(".param "))
        .map(|decl| {
            let decl = decl.trim_end_matches(',');
            match decl.split_once('[') {
                // `.align 8 .b8 name[128]`: a struct passed by value; keep its size.
                Some((_, size)) => size.trim_end_matches(']'),
                None => decl.split_whitespace().next().unwrap_or("?"),
            }
        })
        .collect()
}

#[test]
fn kernel_parameters_match_what_the_launch_code_passes() {
    // Keep in step with the `args![...]` of each launch in src/backend.rs: pointers and size_t
    // are u64, unsigned and int u32, float f32, the gradient table 128 bytes.
    let expected: [(Kernel, &[&str]); 10] = [
        (Kernel::BiasAdd, &[".u64", ".u64", ".u64", ".u32", ".u32"]),
        (Kernel::ReluBackward, &[".u64", ".u64", ".u64"]),
        (
            Kernel::Gather,
            &[".u64", ".u64", ".u64", ".u32", ".u64", ".u64"],
        ),
        (
            Kernel::Matmul,
            &[
                ".u64", ".u64", ".u64", ".u64", ".u32", ".u32", ".u32", ".u32", ".u32",
            ],
        ),
        (Kernel::ColumnSum, &[".u64", ".u32", ".u32", ".u64"]),
        (Kernel::Mean, &[".u64", ".u64", ".u64"]),
        (
            Kernel::CountCorrect,
            &[".u64", ".u64", ".u32", ".u32", ".u64"],
        ),
        (
            Kernel::SoftmaxCrossEntropy,
            &[".u64", ".u64", ".u64", ".u64", ".u32", ".u32"],
        ),
        (
            Kernel::SgdEmaUpdate,
            &[
                ".u64", ".u64", "128", ".u32", ".u64", ".f32", ".f32", ".f32",
            ],
        ),
        (Kernel::MeanGradients, &[".u64", "128", ".u32", ".u64"]),
    ];
    for (kernel, types) in expected {
        assert_eq!(
            params(kernel.module().ptx, kernel.entry()),
            types,
            "{}",
            kernel.entry()
        );
    }
}
