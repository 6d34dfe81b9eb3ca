mod common;

#[test]
fn tandem_modules_parse() {
    for name in [
        "elementwise",
        "gather",
        "matmul",
        "reduce",
        "softmax_xent",
        "update",
    ] {
        let m = common::module(&common::tandem_ptx(name));
        assert_eq!(m.version(), (9, 0));
        assert_eq!(m.target(), "sm_75");
        assert!(!m.kernel_names().is_empty(), "{name}");
        for k in m.kernel_names() {
            let k = m.kernel(&k).expect("kernel");
            assert!(k.param_bytes() > 0);
        }
    }
}

#[test]
fn conformance_modules_parse() {
    let dir = format!("{}/../../kernels/conformance", env!("CARGO_MANIFEST_DIR"));
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("kernels/conformance") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "ptx") {
            let text = std::fs::read_to_string(&p).expect("read");
            if let Err(e) = tandem_ptx::Module::parse(&text) {
                panic!("{}: {e}", p.display());
            }
            n += 1;
        }
    }
    assert!(n > 0);
}
