//! Every driver function cust_raw declares is exported by exactly one of the implemented
//! (src/api.rs) and unsupported (src/unsupported.rs) lists, and every error code the driver can
//! return is a variant of cust_raw's `CUresult` (CUDA 11.4's list, all that cust knows).
//!
//! cust_raw's bindings are found through `cargo metadata`; not finding them fails the test.
//! (`cargo xtask cuda-emu` checks the built library itself: every name exported, SONAME
//! `libcuda.so.1`.)
//! `REGENERATE_UNSUPPORTED=1` rewrites src/unsupported.rs from them first.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::bindings;

/// The `cu*` names declared (`pub fn cuName(`) in the bindings.
fn declared(bindings: &str) -> BTreeSet<String> {
    bindings
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("pub fn "))
        .filter_map(|rest| rest.split('(').next())
        .filter(|name| name.starts_with("cu"))
        .map(str::to_string)
        .collect()
}

/// The names defined in `api!` (`    fn cuName(`) of src/api.rs.
fn implemented() -> BTreeSet<String> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api.rs"))
        .expect("reading src/api.rs");
    text.lines()
        .filter_map(|line| line.strip_prefix("    fn "))
        .filter_map(|rest| rest.split('(').next())
        .filter(|name| name.starts_with("cu"))
        .map(str::to_string)
        .collect()
}

/// The names in src/unsupported.rs's `unsupported!` list.
fn unsupported(text: &str) -> BTreeSet<String> {
    let list = text
        .split("unsupported! {")
        .nth(1)
        .expect("the unsupported! list");
    list.split_whitespace()
        .filter(|w| w.starts_with("cu"))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_declared_function_is_exported_exactly_once() {
    let declared = declared(&bindings());
    assert!(
        declared.len() > 300,
        "only {} functions found",
        declared.len()
    );
    let implemented = implemented();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/unsupported.rs");
    let mut text = std::fs::read_to_string(&path).expect("reading src/unsupported.rs");
    if std::env::var_os("REGENERATE_UNSUPPORTED").is_some() {
        let head = text
            .split("unsupported! {")
            .next()
            .expect("a header")
            .to_string();
        let mut list = String::new();
        for name in declared.difference(&implemented) {
            list.push_str(&format!("    {name}\n"));
        }
        text = format!("{head}unsupported! {{\n{list}}}\n");
        std::fs::write(&path, &text).expect("writing src/unsupported.rs");
    }
    let unsupported = unsupported(&text);
    let both: Vec<_> = implemented.intersection(&unsupported).collect();
    assert!(
        both.is_empty(),
        "both implemented and unsupported: {both:?}"
    );
    let exported: BTreeSet<_> = implemented.union(&unsupported).cloned().collect();
    let missing: Vec<_> = declared.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "declared by cust_raw but not exported: {missing:?}"
    );
    let extra: Vec<_> = exported.difference(&declared).collect();
    assert!(
        extra.is_empty(),
        "exported but not declared by cust_raw: {extra:?}"
    );
}

#[test]
fn every_error_code_is_a_cuda_11_4_result() {
    let bindings = bindings();
    let start = bindings
        .find("pub enum cudaError_enum")
        .expect("the CUresult enum");
    let body = &bindings[start..start + bindings[start..].find('}').expect("its end")];
    for (name, value, _) in tandem_cuda_emu::codes::ALL {
        assert!(
            body.contains(&format!("{name} = {value},")),
            "{name} = {value} is not in cust_raw's CUresult"
        );
    }
}
