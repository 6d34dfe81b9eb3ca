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
