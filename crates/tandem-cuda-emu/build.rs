//! Gives the shared library the real driver's SONAME, so that binaries linked against it ask
//! for `libcuda.so.1` and load whichever one the library path finds.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
