//! Module-scope `.global`/`.const` variables: parsing, initial bytes, addressing, the driver
//! contract of `run_with_globals`, and libdevice's sin/cos tables (the conformance PTX).
mod common;

use common::*;
use tandem_ptx::{ExecError, Launch, Module, VarSpace};

const HEAD: &str = ".version 9.0\n.target sm_75\n.address_size 64\n";

/// Allocates every module variable as the driver does, with its initial bytes.
fn alloc_globals(m: &Module, mem: &mut Mem) -> Vec<u64> {
    m.globals()
        .iter()
        .map(|g| mem.upload_u8(&g.initial))
        .collect()
}

fn launch_g(
    k: &tandem_ptx::Kernel,
    grid: u32,
    block: u32,
    args: &Args,
    mem: &Mem,
    globals: &[u64],
) -> Result<(), ExecError> {
    let l = Launch {
        grid: dim(grid, 1, 1),
        block: dim(block, 1, 1),
        dynamic_shared: 0,
        params: &args.0,
        threads: 2,
        race_check: false,
        profile: false,
    };
    tandem_ptx::run_with_globals(k, &l, mem, globals)
}

fn vars_module() -> String {
    format!(
        "{HEAD}
.global .align 4 .b8 tab[6] = {{1, 2, 3, 4, 5, 250}};
.visible .global .align 4 .u32 cnt;
.const .align 8 .f64 cf[3] = {{0d3FF0000000000000, 2.5, -1}};
.global .f32 fl[2] = {{0f3F800000, 0fC0000000}};
.global .align 8 .u64 big[2] = {{0xffffffffffffffff, 7}}, other = 9;
.const .s32 neg[3] = {{-5}};
.global .u16 m2[2][2] = {{{{1, 2}}, {{3, 4}}}};
.global .s8 sb = -1;
.global .align 16 .v4 .u32 vq[2] = {{{{1, 2, 3, 4}}, {{5, 6, 7, 8}}}};

.visible .entry k(.param .u64 out)
{{
	.reg .pred %p<3>;
	.reg .b32 %r<20>;
	.reg .b64 %rd<20>;
	.reg .f64 %fd<4>;
	.reg .f32 %f<4>;
	ld.param.u64 %rd1, [out];
	mov.u32 %r1, %tid.x;
	mul.wide.u32 %rd2, %r1, 64;
	add.s64 %rd1, %rd1, %rd2;
	// tab through a register, through [name+off] and through cvta.
	mov.u64 %rd3, tab;
	ld.global.u32 %r2, [%rd3];
	ld.global.u8 %r3, [tab+5];
	cvta.global.u64 %rd4, tab;
	ld.u16 %r4, [%rd4+4];
	st.global.u32 [%rd1], %r2;
	st.global.u32 [%rd1+4], %r3;
	st.global.u32 [%rd1+8], %r4;
	// const f64 and s32 (sign-extending load).
	ld.const.f64 %fd1, [cf+8];
	ld.const.f64 %fd2, [cf+16];
	add.f64 %fd3, %fd1, %fd2;
	st.global.f64 [%rd1+16], %fd3;
	ld.const.s32 %r5, [neg];
	ld.const.s32 %r6, [neg+4];
	st.global.u32 [%rd1+24], %r5;
	st.global.u32 [%rd1+28], %r6;
	mov.u64 %rd5, fl;
	ld.global.f32 %f1, [%rd5+4];
	st.global.f32 [%rd1+32], %f1;
	ld.global.u64 %rd6, [big+8];
	ld.global.u64 %rd7, [other];
	add.s64 %rd8, %rd6, %rd7;
	st.global.u64 [%rd1+40], %rd8;
	ld.global.u16 %r7, [m2+6];
	ld.global.s8 %r8, [sb];
	st.global.u32 [%rd1+48], %r7;
	st.global.u32 [%rd1+52], %r8;
	// every thread counts itself into the zero-initialised counter.
	atom.global.add.u32 %r9, [cnt], 1;
	ret;
}}

.visible .entry plain(.param .u64 out)
{{
	.reg .b64 %rd<3>;
	ld.param.u64 %rd1, [out];
	st.global.u64 [%rd1], 42;
	ret;
}}
"
    )
}

#[test]
fn module_variables_metadata_and_initial_bytes() {
    let m = module(&vars_module());
    let g = m.globals();
    let names: Vec<&str> = g.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(
        names,
        ["tab", "cnt", "cf", "fl", "big", "other", "neg", "m2", "sb", "vq"]
    );
    assert_eq!(g[0].initial, [1, 2, 3, 4, 5, 250]);
    assert_eq!(
        (g[0].size, g[0].align, g[0].space),
        (6, 4, VarSpace::Global)
    );
    assert_eq!((g[1].size, g[1].align), (4, 4));
    assert_eq!(g[1].initial, [0; 4]);
    assert_eq!(
        (g[2].size, g[2].align, g[2].space),
        (24, 8, VarSpace::Const)
    );
    let cf: Vec<f64> = g[2]
        .initial
        .chunks(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(cf, [1.0, 2.5, -1.0]);
    assert_eq!(g[3].initial, [0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0]);
    assert_eq!(g[4].initial[..8], [0xff; 8]);
    assert_eq!(g[4].initial[8..], [7, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!((g[5].size, g[5].align), (8, 8));
    assert_eq!(g[5].initial, [9, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(
        g[6].initial,
        [0xfb, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(g[7].initial, [1, 0, 2, 0, 3, 0, 4, 0]);
    assert_eq!(g[8].initial, [0xff]);
    // A vector's element is the vector: 2 of 4 u32s.
    assert_eq!((g[9].size, g[9].align), (32, 16));
    let vq: Vec<u32> = g[9]
        .initial
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(vq, [1, 2, 3, 4, 5, 6, 7, 8]);
    let k = m.kernel("k").unwrap();
    assert_eq!(k.globals_used(), [0, 1, 2, 3, 4, 5, 6, 7, 8]);
    assert!(m.kernel("plain").unwrap().globals_used().is_empty());
}

#[test]
fn module_variables_read_and_written_by_kernels() {
    let m = module(&vars_module());
    let k = m.kernel("k").unwrap();
    let mut mem = Mem::new();
    let addrs = alloc_globals(&m, &mut mem);
    let out = mem.alloc(64 * 40);
    launch_g(&k, 1, 40, &Args::new().u64(out), &mem, &addrs).expect("launch");
    let o = mem.u32s(out);
    for t in 0..40 {
        let r = &o[t * 16..t * 16 + 16];
        assert_eq!(r[0], 0x0403_0201, "thread {t}");
        assert_eq!(r[1], 250);
        assert_eq!(r[2], 0xfa05);
        assert_eq!(
            f64::from_bits(r[4] as u64 | (r[5] as u64) << 32),
            1.5,
            "2.5 + -1"
        );
        assert_eq!(r[6] as i32, -5);
        assert_eq!(r[7], 0);
        assert_eq!(f32::from_bits(r[8]), -2.0);
        assert_eq!(r[10] as u64 | (r[11] as u64) << 32, 16);
        assert_eq!(r[12], 4);
        assert_eq!(r[13], u32::MAX, "s8 -1 sign-extended");
    }
    assert_eq!(mem.u32s(addrs[1]), [40], "the counter");
}

#[test]
fn missing_module_variable_address_is_invalid_value() {
    let m = module(&vars_module());
    let k = m.kernel("k").unwrap();
    let mut mem = Mem::new();
    let out = mem.alloc(64);
    let e = launch(
        &k,
        dim(1, 1, 1),
        dim(1, 1, 1),
        &Args::new().u64(out),
        &mem,
        1,
    )
    .unwrap_err();
    match e {
        ExecError::InvalidValue(s) => assert!(s.contains("`tab`"), "{s}"),
        e => panic!("{e:?}"),
    }
    // Too few addresses: the first missing one is named.
    let addrs = alloc_globals(&m, &mut mem);
    let e = launch_g(&k, 1, 1, &Args::new().u64(out), &mem, &addrs[..4]).unwrap_err();
    match e {
        ExecError::InvalidValue(s) => assert!(s.contains("`big`"), "{s}"),
        e => panic!("{e:?}"),
    }
    // A kernel that uses none runs with plain `run`.
    let p = m.kernel("plain").unwrap();
    launch(
        &p,
        dim(1, 1, 1),
        dim(1, 1, 1),
        &Args::new().u64(out),
        &mem,
        1,
    )
    .expect("plain");
    assert_eq!(mem.u64s(out)[0], 42);
}

#[test]
fn module_variable_accesses_are_checked() {
    // Reading past the end of a variable's allocation is an illegal address.
    let src = format!(
        "{HEAD}.global .u32 v[2] = {{1, 2}};
.visible .entry k(.param .u64 out)
{{
	.reg .b32 %r<3>;
	ld.global.u32 %r1, [v+8];
	ret;
}}
"
    );
    let m = module(&src);
    let mut mem = Mem::new();
    let addrs = alloc_globals(&m, &mut mem);
    let k = m.kernel("k").unwrap();
    let e = launch_g(&k, 1, 1, &Args::new().u64(0), &mem, &addrs).unwrap_err();
    assert!(matches!(e, ExecError::IllegalAddress(_)), "{e:?}");
}

#[test]
fn unsupported_module_variables_are_parse_errors() {
    for (decl, want) in [
        (".global .u64 p = generic(x);", "address"),
        (".global .u64 p[2] = {x, 0};", "address"),
        (".extern .global .u32 x;", "extern"),
        (".global .u32 x[2] = {1, 2, 3};", "more than"),
        (".global .u32 x[];", "unsized"),
    ] {
        let src = format!("{HEAD}.global .u32 x;\n{decl}\n");
        let e = Module::parse(&src).expect_err(decl);
        assert_eq!(e.line, 5, "{decl}: {e}");
        assert!(e.message.contains(want), "{decl}: {e}");
    }
    // st.const is not an instruction.
    let src = format!(
        "{HEAD}.const .u32 c;\n.visible .entry k()\n{{\n\tst.const.u32 [c], 1;\n\tret;\n}}\n"
    );
    assert!(Module::parse(&src).is_err());
}

fn conformance(name: &str) -> Module {
    let p = format!(
        "{}/../../kernels/conformance/{name}.ptx",
        env!("CARGO_MANIFEST_DIR")
    );
    module(&std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}")))
}

#[test]
fn libdevice_f64_sin_cos_through_module_tables() {
    let m = conformance("f64_math");
    assert_eq!(
        m.globals()
            .iter()
            .map(|g| (g.name.as_str(), g.size, g.align))
            .collect::<Vec<_>>(),
        [
            ("__cudart_i2opi_f", 24, 4),
            ("__cudart_sin_cos_coeffs", 128, 16),
            ("__cudart_i2opi_d", 144, 8)
        ]
    );
    let k = m.kernel("f64_math").unwrap();
    let mut mem = Mem::new();
    let addrs = alloc_globals(&m, &mut mem);
    let xs: Vec<f64> = (0..64)
        .map(|i| i as f64 * std::f64::consts::FRAC_PI_4 + 0.001 * i as f64)
        .chain([0.0, 1e-300, 3.0, 100.0, 700.0])
        .collect();
    let n = xs.len();
    let xbits: Vec<u32> = xs
        .iter()
        .flat_map(|x| [x.to_bits() as u32, (x.to_bits() >> 32) as u32])
        .collect();
    let dx2 = mem.upload_u32(&xbits);
    let dy = mem.alloc(n * 8);
    let (a, b) = (1.25f64, -0.5f64);
    let args = Args::new()
        .u64(dx2)
        .u64(dy)
        .u32(n as u32)
        .u64(a.to_bits())
        .u64(b.to_bits());
    launch_g(&k, 2, 32, &args, &mem, &addrs).expect("launch");
    let ys = mem.f64s(dy);
    for (x, y) in xs.iter().zip(&ys) {
        let terms = [
            x.sqrt() * (x / 10.0).exp(),
            x.ln_1p(),
            a.mul_add(*x, b),
            x.sin() * x.cos(),
        ];
        let want: f64 = terms.iter().sum();
        let scale: f64 = terms.iter().map(|t| t.abs()).sum();
        assert!(
            (y - want).abs() <= 4e-16 * scale.max(f64::MIN_POSITIVE),
            "x {x}: got {y}, want {want}"
        );
    }
}

#[test]
fn libdevice_f32_sin_cos_with_large_arguments() {
    let m = conformance("f64_math");
    let k = m.kernel("trig_f32").unwrap();
    let mut mem = Mem::new();
    let addrs = alloc_globals(&m, &mut mem);
    let xs: Vec<f32> = [
        0.0, 0.5, -1.0, 3.0, 100.0, -1000.5, 1e5, 2e5, 1e6, -3.3e7, 1e10, 1e20, 3e38, -1e30,
    ]
    .to_vec();
    let n = xs.len();
    let dx = mem.upload_f32(&xs);
    let dout = mem.alloc(n * 8);
    let args = Args::new().u64(dx).u64(dout).u32(n as u32);
    launch_g(&k, 1, 32, &args, &mem, &addrs).expect("launch");
    let out = mem.f32s(dout);
    for (i, &x) in xs.iter().enumerate() {
        for (got, want) in [(out[i], (x as f64).sin()), (out[n + i], (x as f64).cos())] {
            let ulp = {
                let w = want as f32;
                (f32::from_bits(w.abs().to_bits() + 1) - w.abs()) as f64
            };
            assert!(
                (got as f64 - want).abs() <= 2.0 * ulp,
                "x {x}: got {got}, want {want}"
            );
        }
    }
}
