//! Integer and bit instructions: bfind, fns, szext, bmsk, dp4a/dp2a, prmt modes, sad,
//! min/max.relu, mul.hi.u64/s64, mad.cc/madc and sub.cc/subc chains,
//! add/sub.sat, mul24/mad24, shifts past the width, division by zero, abs/neg/not/cnot, unsigned
//! comparisons of signed types, float comparisons beside NaN, bfe/bfi, mad.hi.sat, lop3, shf, testp, setp with a predicate
//! combined into both results, slct, min/max.NaN; each against a Rust
//! reference over edge-case inputs.
mod common;

use common::*;

const HEAD: &str = ".version 9.0\n.target sm_80\n.address_size 64\n";

/// Runs `body` on one thread per input pair: `%rd10, %rd11` hold the pair (u64), `%r10, %r11`
/// their low halves; the body leaves results in `%rd20` (u64), stored at out[i].
fn run_pairs(body: &str, inputs: &[(u64, u64)]) -> Vec<u64> {
    let src = format!(
        "{HEAD}.visible .entry k(.param .u64 inp, .param .u64 out)
{{
	.reg .pred %p<4>;
	.reg .b32 %r<40>;
	.reg .b64 %rd<40>;
	.reg .f32 %f<8>;
	ld.param.u64 %rd1, [inp];
	ld.param.u64 %rd2, [out];
	mov.u32 %r1, %tid.x;
	mul.wide.u32 %rd3, %r1, 16;
	add.s64 %rd4, %rd1, %rd3;
	ld.global.u64 %rd10, [%rd4];
	ld.global.u64 %rd11, [%rd4+8];
	cvt.u32.u64 %r10, %rd10;
	cvt.u32.u64 %r11, %rd11;
	mov.u64 %rd20, 0;
{body}
	mul.wide.u32 %rd5, %r1, 8;
	add.s64 %rd6, %rd2, %rd5;
	st.global.u64 [%rd6], %rd20;
	ret;
}}
"
    );
    let m = module(&src);
    let k = m.kernel("k").unwrap();
    let mut mem = Mem::new();
    let words: Vec<u32> = inputs
        .iter()
        .flat_map(|&(a, b)| [a as u32, (a >> 32) as u32, b as u32, (b >> 32) as u32])
        .collect();
    let inp = mem.upload_u32(&words);
    let out = mem.alloc(inputs.len() * 8);
    launch(
        &k,
        dim(1, 1, 1),
        dim(inputs.len() as u32, 1, 1),
        &Args::new().u64(inp).u64(out),
        &mem,
        1,
    )
    .expect("launch");
    mem.u64s(out)
}

/// PTX folding `%rd<regs>` into `%rd20`: each step multiplies by `k`, then xors the next.
fn mix_ptx(regs: &[u32], k: u64) -> String {
    regs.iter()
        .map(|r| format!("\n\tmul.lo.u64 %rd20, %rd20, {k};\n\txor.b64 %rd20, %rd20, %rd{r};"))
        .collect()
}

/// [`mix_ptx`]'s fold of `rest` into `first`, in Rust.
fn mix(first: u64, rest: &[u64], k: u64) -> u64 {
    rest.iter().fold(first, |acc, &x| acc.wrapping_mul(k) ^ x)
}

const EDGE32: &[u32] = &[
    0,
    1,
    2,
    3,
    0x10,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0xffff_fffe,
    0x1234_5678,
    0x8765_4321,
    0x0001_0000,
    0xc000_0000,
    0x4000_0001,
];

/// Every pair of one of `firsts` and one of `seconds`, in that order.
fn every_pair(firsts: &[u64], seconds: &[u64]) -> Vec<(u64, u64)> {
    (firsts.iter())
        .flat_map(|&a| seconds.iter().map(move |&b| (a, b)))
        .collect()
}

fn pairs32() -> Vec<(u64, u64)> {
    let mut v = Vec::new();
    for (i, &a) in EDGE32.iter().enumerate() {
        v.push((a as u64, EDGE32[(i * 5 + 3) % EDGE32.len()] as u64));
    }
    v
}

fn bfind_ref(v: i128, bits: u32, shift: bool) -> u32 {
    // The highest bit that differs from the sign (signed) or is set (unsigned).
    let x = if v < 0 { !v } else { v };
    for i in (0..bits).rev() {
        if x >> i & 1 == 1 {
            return if shift { bits - 1 - i } else { i };
        }
    }
    u32::MAX
}

#[test]
fn bfind_all_types() {
    let inputs: Vec<(u64, u64)> = EDGE32
        .iter()
        .map(|&a| (a as u64, 0))
        .chain(
            [
                0u64,
                1,
                u64::MAX,
                1 << 63,
                (1 << 63) - 1,
                0xffff_ffff_0000_0000,
                0x0000_0001_0000_0000,
                0xfff0_0000_0000_0000,
            ]
            .map(|a| (a, 0)),
        )
        .collect();
    let body = "
	bfind.u32 %r20, %r10;
	bfind.shiftamt.u32 %r21, %r10;
	bfind.s32 %r22, %r10;
	bfind.shiftamt.s32 %r23, %r10;
	bfind.u64 %r24, %rd10;
	bfind.shiftamt.u64 %r25, %rd10;
	bfind.s64 %r26, %rd10;
	bfind.shiftamt.s64 %r27, %rd10;
	// out = u32 results packed 4 bits... no: each in its own byte, 0xff for none.
	prmt.b32 %r30, %r20, %r21, 0x0040;
	prmt.b32 %r31, %r22, %r23, 0x0040;
	prmt.b32 %r32, %r24, %r25, 0x0040;
	prmt.b32 %r33, %r26, %r27, 0x0040;
	prmt.b32 %r34, %r30, %r31, 0x5410;
	prmt.b32 %r35, %r32, %r33, 0x5410;
	mov.b64 %rd20, {%r34, %r35};";
    let out = run_pairs(body, &inputs);
    for (&(a, _), &o) in inputs.iter().zip(&out) {
        let b = |x: u32| (x & 0xff) as u64;
        let want = [
            bfind_ref(a as u32 as i128, 32, false),
            bfind_ref(a as u32 as i128, 32, true),
            bfind_ref(a as u32 as i32 as i128, 32, false),
            bfind_ref(a as u32 as i32 as i128, 32, true),
            bfind_ref(a as i128, 64, false),
            bfind_ref(a as i128, 64, true),
            bfind_ref(a as i64 as i128, 64, false),
            bfind_ref(a as i64 as i128, 64, true),
        ]
        .iter()
        .enumerate()
        .fold(0u64, |acc, (i, &x)| acc | b(x) << (8 * i));
        assert_eq!(o, want, "input {a:#x}");
    }
    // Spot values: the most significant set bit, none for 0 (and for -1 when signed).
    assert_eq!(bfind_ref(0, 32, false), u32::MAX);
    assert_eq!(bfind_ref(-1, 32, false), u32::MAX);
    assert_eq!(bfind_ref(0x10, 32, false), 4);
    assert_eq!(bfind_ref(0x10, 32, true), 27);
    assert_eq!(bfind_ref(-17, 32, false), 4);
}

#[test]
fn bfind_full_results() {
    // The none value is the full 0xffffffff, not a byte of it.
    let body = "
	bfind.u32 %r20, %r10;
	bfind.shiftamt.s64 %r21, %rd10;
	mov.b64 %rd20, {%r20, %r21};";
    let out = run_pairs(body, &[(0, 0), (u64::MAX, 0), (0x8000_0000, 0), (1, 0)]);
    assert_eq!(
        out,
        [
            u64::MAX,
            31 | (u32::MAX as u64) << 32,
            31 | 32 << 32,
            63 << 32
        ]
    );
}

/// The ffs sequence nvcc emits for `__ffs(x)`: brev, bfind.shiftamt, add 1 (0 for x = 0).
#[test]
fn ffs_sequence() {
    let inputs: Vec<(u64, u64)> = EDGE32.iter().map(|&a| (a as u64, 0)).collect();
    let body = "
	brev.b32 %r20, %r10;
	bfind.shiftamt.u32 %r21, %r20;
	add.s32 %r22, %r21, 1;
	cvt.u64.u32 %rd20, %r22;";
    let out = run_pairs(body, &inputs);
    for (&(a, _), &o) in inputs.iter().zip(&out) {
        let a = a as u32;
        let want = if a == 0 { 0 } else { a.trailing_zeros() + 1 };
        assert_eq!(o, want as u64, "ffs({a:#x})");
    }
}

fn fns_ref(mask: u32, base: u32, off: i32) -> u32 {
    if off == 0 {
        return if mask >> base & 1 == 1 {
            base
        } else {
            u32::MAX
        };
    }
    let mut n = 0;
    if off > 0 {
        for p in base..32 {
            if mask >> p & 1 == 1 {
                n += 1;
                if n == off {
                    return p;
                }
            }
        }
    } else {
        for p in (0..=base).rev() {
            if mask >> p & 1 == 1 {
                n += 1;
                if n == -off {
                    return p;
                }
            }
        }
    }
    u32::MAX
}

#[test]
fn fns_szext_bmsk() {
    let mut inputs = pairs32();
    inputs.extend([(0xf0f0, 33), (0xffff_ffff, 31), (0x8000_0001, 32), (5, 0)]);
    let body = "
	and.b32 %r12, %r11, 31;
	fns.b32 %r20, %r10, %r12, 2;
	fns.b32 %r21, %r10, %r12, -1;
	fns.b32 %r22, %r10, %r12, 0;
	fns.b32 %r23, %r10, 0, 3;
	szext.wrap.s32 %r24, %r10, %r11;
	szext.clamp.u32 %r25, %r10, %r11;
	bmsk.wrap.b32 %r26, %r11, %r10;
	bmsk.clamp.b32 %r27, %r11, %r10;
	szext.clamp.s32 %r28, %r10, 8;
	xor.b32 %r29, %r20, %r21;
	xor.b32 %r29, %r29, %r22;
	xor.b32 %r29, %r29, %r23;
	xor.b32 %r30, %r24, %r25;
	mov.b64 %rd21, {%r29, %r30};
	xor.b32 %r31, %r26, %r27;
	xor.b32 %r31, %r31, %r28;
	cvt.u64.u32 %rd22, %r31;
	shl.b64 %rd22, %rd22, 7;
	xor.b64 %rd20, %rd21, %rd22;";
    let out = run_pairs(body, &inputs);
    let szext = |v: u32, n: u32, clamp: bool, signed: bool| -> u32 {
        let n = if clamp { n.min(32) } else { n % 32 };
        match n {
            0 => 0,
            32 => v,
            n if signed => ((v << (32 - n)) as i32 >> (32 - n)) as u32,
            n => v & ((1 << n) - 1),
        }
    };
    let bmsk = |a: u32, b: u32, clamp: bool| -> u32 {
        let (a, b) = if clamp {
            (a.min(32), b.min(32))
        } else {
            (a % 32, b % 32)
        };
        if a >= 32 {
            return 0;
        }
        let m = if b >= 32 { u32::MAX } else { (1u32 << b) - 1 };
        m.checked_shl(a).unwrap_or(0)
    };
    for (&(a, b), &o) in inputs.iter().zip(&out) {
        let (a, b) = (a as u32, b as u32);
        let base = b & 31;
        let x = fns_ref(a, base, 2) ^ fns_ref(a, base, -1) ^ fns_ref(a, base, 0) ^ fns_ref(a, 0, 3);
        let y = szext(a, b, false, true) ^ szext(a, b, true, false);
        let z = bmsk(b, a, false) ^ bmsk(b, a, true) ^ szext(a, 8, true, true);
        let want = (x as u64 | (y as u64) << 32) ^ ((z as u64) << 7);
        assert_eq!(o, want, "a {a:#x} b {b:#x}");
    }
    // Spot values.
    assert_eq!(fns_ref(0b1011_0000, 0, 2), 5);
    assert_eq!(fns_ref(0b1011_0000, 6, -2), 4);
    assert_eq!(szext(0x80, 8, true, true), 0xffff_ff80);
    assert_eq!(bmsk(4, 3, true), 0x70);
}

#[test]
fn dp4a_dp2a_sad_relu_prmt_modes() {
    let inputs = pairs32();
    let body = "
	dp4a.u32.u32 %r20, %r10, %r11, 7;
	dp4a.s32.s32 %r21, %r10, %r11, -7;
	dp4a.s32.u32 %r22, %r10, %r11, %r10;
	dp2a.lo.u32.s32 %r23, %r10, %r11, 0;
	dp2a.hi.s32.u32 %r24, %r10, %r11, 1;
	sad.u32 %r25, %r10, %r11, 3;
	sad.s32 %r26, %r10, %r11, 3;
	max.relu.s32 %r27, %r10, %r11;
	min.relu.s32 %r28, %r10, %r11;
	prmt.b32.f4e %r29, %r10, %r11, %r11;
	prmt.b32.b4e %r30, %r10, %r11, %r11;
	prmt.b32.rc8 %r31, %r10, %r11, %r11;
	prmt.b32.ecl %r32, %r10, %r11, %r11;
	prmt.b32.ecr %r33, %r10, %r11, %r11;
	prmt.b32.rc16 %r34, %r10, %r11, %r11;
	mov.b64 %rd21, {%r20, %r21};
	mov.b64 %rd22, {%r22, %r23};
	mov.b64 %rd23, {%r24, %r25};
	mov.b64 %rd24, {%r26, %r27};
	mov.b64 %rd25, {%r28, %r29};
	mov.b64 %rd26, {%r30, %r31};
	mov.b64 %rd27, {%r32, %r33};
	cvt.u64.u32 %rd28, %r34;
	// Mix with distinct rotations so no result can cancel another.
	shf.l.wrap.b32 %r35, %r34, %r34, 0;
	xor.b64 %rd20, %rd21, 0;"
        .to_string()
        + &mix_ptx(&[22, 23, 24, 25, 26, 27, 28], 3);
    let out = run_pairs(&body, &inputs);
    let bytes = |v: u32| v.to_le_bytes();
    let dp4 = |a: u32, b: u32, sa: bool, sb: bool, c: u32| {
        let (x, y) = (bytes(a), bytes(b));
        (0..4).fold(c, |acc, i| {
            let p = if sa { x[i] as i8 as i32 } else { x[i] as i32 };
            let q = if sb { y[i] as i8 as i32 } else { y[i] as i32 };
            acc.wrapping_add(p.wrapping_mul(q) as u32)
        })
    };
    let dp2 = |a: u32, b: u32, sa: bool, sb: bool, hi: bool, c: u32| {
        let y = bytes(b);
        (0..2).fold(c, |acc, i| {
            let h = (a >> (16 * i)) as u16;
            let p = if sa { h as i16 as i32 } else { h as i32 };
            let yb = y[i + if hi { 2 } else { 0 }];
            let q = if sb { yb as i8 as i32 } else { yb as i32 };
            acc.wrapping_add(p.wrapping_mul(q) as u32)
        })
    };
    let prmt = |a: u32, b: u32, order: [usize; 4]| {
        let x = [bytes(a), bytes(b)].concat();
        u32::from_le_bytes(order.map(|i| x[i]))
    };
    for (&(a, b), &o) in inputs.iter().zip(&out) {
        let (a, b) = (a as u32, b as u32);
        let s = (b & 3) as usize;
        let f4e = [s, s + 1, s + 2, s + 3];
        let b4e = [s, (s + 7) % 8, (s + 6) % 8, (s + 5) % 8];
        let rc8 = [s; 4];
        let ecl = [s, s.max(1), s.max(2), 3];
        let ecr = [0, s.min(1), s.min(2), s];
        let h = 2 * (s & 1);
        let rc16 = [h, h + 1, h, h + 1];
        let (ia, ib) = (a as i32, b as i32);
        let r = [
            dp4(a, b, false, false, 7),
            dp4(a, b, true, true, -7i32 as u32),
            dp4(a, b, true, false, a),
            dp2(a, b, false, true, false, 0),
            dp2(a, b, true, false, true, 1),
            a.abs_diff(b).wrapping_add(3),
            ia.abs_diff(ib).wrapping_add(3),
            ia.max(ib).max(0) as u32,
            ia.min(ib).max(0) as u32,
            prmt(a, b, f4e),
            prmt(a, b, b4e),
            prmt(a, b, rc8),
            prmt(a, b, ecl),
            prmt(a, b, ecr),
            prmt(a, b, rc16),
        ];
        let w = |i: usize, j: usize| r[i] as u64 | (r[j] as u64) << 32;
        let rest = [
            w(2, 3),
            w(4, 5),
            w(6, 7),
            w(8, 9),
            w(10, 11),
            w(12, 13),
            r[14] as u64,
        ];
        let want = mix(w(0, 1), &rest, 3);
        assert_eq!(o, want, "a {a:#x} b {b:#x}: {r:x?}");
    }
}

#[test]
fn wide_multiply_hi_and_carry_chains() {
    let vals = [
        0u64,
        1,
        u64::MAX,
        1 << 63,
        0x1234_5678_9abc_def0,
        0xfedc_ba98_7654_3210,
        (1 << 32) + 7,
    ];
    let inputs = every_pair(&vals, &vals);
    // hi(a*b) unsigned and signed, and the 128-bit a*b + (b:a) via mad.lo.cc/madc.hi: the high
    // half of that sum, xored with the others.
    let body = "
	mul.hi.u64 %rd21, %rd10, %rd11;
	mul.hi.s64 %rd22, %rd10, %rd11;
	mad.lo.cc.u64 %rd23, %rd10, %rd11, %rd10;
	madc.hi.u64 %rd24, %rd10, %rd11, %rd11;
	mad.lo.cc.u32 %r20, %r10, %r11, %r11;
	madc.hi.cc.u32 %r21, %r10, %r11, %r10;
	addc.u32 %r22, 0, 0;
	mov.b64 %rd25, {%r20, %r21};
	cvt.u64.u32 %rd26, %r22;
	xor.b64 %rd20, %rd21, %rd23;"
        .to_string()
        + &mix_ptx(&[22, 24, 25, 26], 5);
    let out = run_pairs(&body, &inputs);
    for (&(a, b), &o) in inputs.iter().zip(&out) {
        let hu = ((a as u128 * b as u128) >> 64) as u64;
        let hs = ((a as i64 as i128 * b as i64 as i128) >> 64) as u64;
        let full = (a as u128 * b as u128).wrapping_add(((b as u128) << 64) | a as u128);
        let (lo, hi) = (full as u64, (full >> 64) as u64);
        let (a32, b32) = (a as u32 as u64, b as u32 as u64);
        let p = a32 * b32;
        // The u32 chain: r20 = lo32(p) + b (carry), r21 = hi32(p) + a + carry (carry out), r22 = carry.
        let r20 = (p & 0xffff_ffff) + b32;
        let r21 = (p >> 32) + a32 + (r20 >> 32);
        let v25 = (r20 & 0xffff_ffff) | (r21 & 0xffff_ffff) << 32;
        let v26 = r21 >> 32;
        let want = mix(hu ^ lo, &[hs, hi, v25, v26], 5);
        assert_eq!(o, want, "a {a:#x} b {b:#x}");
    }
}

#[test]
fn borrow_chains() {
    let vals = [
        0u64,
        1,
        2,
        u64::MAX,
        u64::MAX - 1,
        1 << 63,
        0x1_0000_0000,
        0xffff_ffff,
    ];
    let inputs = every_pair(&vals, &vals);
    // (b:a) - (a:b) in 128 bits through sub.cc/subc.cc, its borrow out as 0 - 0 - borrow; the
    // same in 32 bits with the low halves, the borrow out as 1 - 0 - borrow.
    let body = "
	sub.cc.u64 %rd21, %rd10, %rd11;
	subc.cc.u64 %rd22, %rd11, %rd10;
	subc.u64 %rd23, 0, 0;
	sub.cc.u32 %r20, %r10, %r11;
	subc.cc.u32 %r21, %r11, %r10;
	subc.u32 %r22, 1, 0;
	mov.b64 %rd25, {%r20, %r21};
	cvt.u64.u32 %rd26, %r22;
	xor.b64 %rd20, %rd21, %rd22;"
        .to_string()
        + &mix_ptx(&[23, 25, 26], 7);
    let out = run_pairs(&body, &inputs);
    for (&(a, b), &o) in inputs.iter().zip(&out) {
        let (m, s) = (
            u128::from(b) << 64 | u128::from(a),
            u128::from(a) << 64 | u128::from(b),
        );
        let d = m.wrapping_sub(s);
        let (a32, b32) = (a & 0xffff_ffff, b & 0xffff_ffff);
        let (m32, s32) = (b32 << 32 | a32, a32 << 32 | b32);
        let want = mix(
            d as u64 ^ (d >> 64) as u64,
            &[
                0u64.wrapping_sub(u64::from(m < s)),
                m32.wrapping_sub(s32),
                1 - u64::from(m32 < s32),
            ],
            7,
        );
        assert_eq!(o, want, "a {a:#x} b {b:#x}");
    }
}

#[test]
fn saturating_24_bit_shift_unary_and_division_by_zero() {
    let firsts = [
        0u64,
        1,
        0x7fff_ffff,
        0x8000_0000,
        0xffff_ffff,
        0x00ff_ffff,
        0x0080_0000,
        0x1234_5678,
        0xfedc_ba98,
        u64::MAX,
        1 << 63,
        0x1234_5678_9abc_def0,
    ];
    let seconds = [
        0u64,
        1,
        5,
        16,
        23,
        31,
        32,
        33,
        63,
        64,
        65,
        0xffff_ffff,
        0x0080_0001,
        0x7fff_ffff,
        0x8000_0000,
        0x00ff_fffe,
    ];
    let inputs = every_pair(&firsts, &seconds);
    let body = "
	add.sat.s32 %r20, %r10, %r11;
	sub.sat.s32 %r21, %r10, %r11;
	mul24.lo.u32 %r22, %r10, %r11;
	mul24.hi.u32 %r23, %r10, %r11;
	mul24.lo.s32 %r24, %r10, %r11;
	mul24.hi.s32 %r25, %r10, %r11;
	shr.s32 %r26, %r10, %r11;
	shr.u32 %r27, %r10, %r11;
	shl.b32 %r28, %r10, %r11;
	rem.u32 %r29, %r10, %r11;
	div.u32 %r30, %r10, %r11;
	abs.s32 %r31, %r10;
	neg.s32 %r32, %r10;
	not.b32 %r33, %r10;
	cnot.b32 %r34, %r10;
	mad24.lo.u32 %r35, %r10, %r11, %r11;
	mad24.hi.s32 %r36, %r10, %r11, %r10;
	shr.s64 %rd20, %rd10, %r11;"
        .to_string()
        + &(20..37)
            .map(|r| format!("\n\tcvt.u64.u32 %rd{}, %r{r};", r + 1))
            .collect::<String>()
        + "\n\tabs.s64 %rd38, %rd10;\n\tnot.b64 %rd39, %rd10;"
        + &mix_ptx(&(21..40).collect::<Vec<u32>>(), 3);
    let out = run_pairs(&body, &inputs);
    for (&(a, b), &o) in inputs.iter().zip(&out) {
        let (a32, b32) = (a as u32, b as u32);
        let (sa, sb) = (a32 as i32, b32 as i32);
        let (ua24, ub24) = (u64::from(a32 & 0xff_ffff), u64::from(b32 & 0xff_ffff));
        let signed24 = |x: u32| i64::from(((x << 8) as i32) >> 8);
        let (p, sp) = (ua24 * ub24, signed24(a32) * signed24(b32));
        let results32 = [
            sa.saturating_add(sb) as u32,
            sa.saturating_sub(sb) as u32,
            p as u32,
            (p >> 16) as u32,
            sp as u32,
            (sp >> 16) as u32,
            (sa >> b32.min(31)) as u32,
            a32.checked_shr(b32).unwrap_or(0),
            a32.checked_shl(b32).unwrap_or(0),
            a32.checked_rem(b32).unwrap_or(a32),
            a32.checked_div(b32).unwrap_or(u32::MAX),
            sa.unsigned_abs(),
            sa.wrapping_neg() as u32,
            !a32,
            u32::from(a32 == 0),
            (p as u32).wrapping_add(b32),
            ((sp >> 16) as u32).wrapping_add(a32),
        ];
        let shr64 = ((a as i64) >> b32.min(63)) as u64;
        let mut rest: Vec<u64> = results32.iter().map(|&v| u64::from(v)).collect();
        rest.extend([(a as i64).unsigned_abs(), !a]);
        let want = mix(shr64, &rest, 3);
        assert_eq!(o, want, "a {a:#x} b {b:#x}");
    }
}

#[test]
fn unsigned_comparisons_of_signed_values() {
    // lo/ls/hi/hs compare the bits as unsigned whatever the type says; lt/gt follow the type.
    let inputs: Vec<(u64, u64)> = pairs32()
        .into_iter()
        .chain([
            (0xffff_ffff, 1),
            (1, 0xffff_ffff),
            (0x8000_0000, 0x7fff_ffff),
            (5, 5),
        ])
        .collect();
    let body = "
	setp.lo.s32 %p1, %r10, %r11;
	selp.u32 %r20, 1, 0, %p1;
	setp.ls.s32 %p1, %r10, %r11;
	selp.u32 %r21, 2, 0, %p1;
	setp.hi.s32 %p1, %r10, %r11;
	selp.u32 %r22, 4, 0, %p1;
	setp.hs.s32 %p1, %r10, %r11;
	selp.u32 %r23, 8, 0, %p1;
	setp.lt.s32 %p1, %r10, %r11;
	selp.u32 %r24, 16, 0, %p1;
	setp.gt.u32 %p1, %r10, %r11;
	selp.u32 %r25, 32, 0, %p1;
	or.b32 %r20, %r20, %r21;
	or.b32 %r20, %r20, %r22;
	or.b32 %r20, %r20, %r23;
	or.b32 %r20, %r20, %r24;
	or.b32 %r20, %r20, %r25;
	cvt.u64.u32 %rd20, %r20;";
    let out = run_pairs(body, &inputs);
    for (&(a, b), &o) in inputs.iter().zip(&out) {
        let (a, b) = (a as u32, b as u32);
        let flags = [a < b, a <= b, a > b, a >= b, (a as i32) < (b as i32), a > b];
        let want: u64 = (flags.iter().enumerate())
            .map(|(i, &f)| u64::from(f) << i)
            .sum();
        assert_eq!(o, want, "a {a:#x} b {b:#x}");
    }
}

#[test]
fn float_comparisons_ordered_and_unordered() {
    let vals = [
        0.0f32,
        -0.0,
        1.0,
        -1.0,
        2.5,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(1),
        -f32::from_bits(0x7f_ffff),
    ];
    let bits: Vec<u64> = vals.iter().map(|v| v.to_bits().into()).collect();
    let inputs = every_pair(&bits, &bits);
    let cmps = [
        "eq", "ne", "lt", "le", "gt", "ge", "equ", "neu", "ltu", "leu", "gtu", "geu", "num", "nan",
    ];
    let mut body = "\tmov.b32 %f1, %r10;\n\tmov.b32 %f2, %r11;\n\tmov.u32 %r20, 0;".to_string();
    // The plain comparisons in bits 0-13, with .ftz (subnormal operands as zeros) in 14-27.
    let ftz = cmps.iter().map(|c| format!("{c}.ftz"));
    for (i, c) in (cmps.iter().map(|c| c.to_string())).chain(ftz).enumerate() {
        body += &format!(
            "\n\tsetp.{c}.f32 %p1, %f1, %f2;\n\tselp.u32 %r21, {}, 0, %p1;\n\tor.b32 %r20, %r20, %r21;",
            1u32 << i
        );
    }
    body += "\n\tcvt.u64.u32 %rd20, %r20;";
    let out = run_pairs(&body, &inputs);
    let flush = |x: f32| {
        if x.is_subnormal() {
            0.0 * x.signum()
        } else {
            x
        }
    };
    let flags = |x: f32, y: f32| {
        let nan = x.is_nan() || y.is_nan();
        // Ordered: false beside a NaN (ne too); unordered: true beside one.
        [
            x == y,
            !nan && x != y,
            x < y,
            x <= y,
            x > y,
            x >= y,
            nan || x == y,
            nan || x != y,
            nan || x < y,
            nan || x <= y,
            nan || x > y,
            nan || x >= y,
            !nan,
            nan,
        ]
    };
    for (&(a, b), &o) in inputs.iter().zip(&out) {
        let (x, y) = (f32::from_bits(a as u32), f32::from_bits(b as u32));
        let all = [flags(x, y), flags(flush(x), flush(y))].concat();
        let want: u64 = (all.iter().enumerate())
            .map(|(i, &f)| u64::from(f) << i)
            .sum();
        assert_eq!(o, want, "{x:e} {y:e}");
    }
}

#[test]
fn prmt_default_mode_picks_bytes_and_replicates_their_signs() {
    // The selector is b itself: four nibbles, each a byte of {b, a} (0-7), bit 3 asking for
    // that byte's sign bit in all eight bits.
    let inputs: Vec<(u64, u64)> = pairs32()
        .into_iter()
        .chain([
            (0x80ff_7f01, 0x0000_8c9a),
            (0x0102_8384, 0xffff_fedc),
            (0x7f80_0180, 0x1234_cdef),
        ])
        .collect();
    let out = run_pairs(
        "\tprmt.b32 %r20, %r10, %r11, %r11;\n\tcvt.u64.u32 %rd20, %r20;",
        &inputs,
    );
    for (&(a, b), &o) in inputs.iter().zip(&out) {
        let (a, b) = (a as u32, b as u32);
        let x = [a.to_le_bytes(), b.to_le_bytes()].concat();
        let pick = |i: u32| {
            let s = (b >> (4 * i)) & 0xf;
            let byte = x[(s & 7) as usize];
            match s & 8 {
                0 => byte,
                _ => ((byte as i8) >> 7) as u8,
            }
        };
        let want = u32::from_le_bytes([pick(0), pick(1), pick(2), pick(3)]);
        assert_eq!(o, u64::from(want), "a {a:#x} b {b:#x}");
    }
}

#[test]
fn lop3_applies_its_truth_table_bit_by_bit() {
    // xor of three, majority, and, or, a ? b : c, and a few without a name; c is a ^ b.
    let luts = [
        0x00u32, 0xff, 0x96, 0xe8, 0x80, 0xfe, 0xca, 0x5a, 0x3c, 0x01, 0x6b,
    ];
    let mut body = "\txor.b32 %r12, %r10, %r11;\n\tmov.u64 %rd20, 0;".to_string();
    for lut in luts {
        body += &format!("\n\tlop3.b32 %r20, %r10, %r11, %r12, {lut};\n\tcvt.u64.u32 %rd21, %r20;");
        body += &mix_ptx(&[21], 5);
    }
    let inputs = pairs32();
    let out = run_pairs(&body, &inputs);
    for (&(a, b), &o) in inputs.iter().zip(&out) {
        let (a, b) = (a as u32, b as u32);
        let c = a ^ b;
        // Each result bit is the table's entry at (a's bit, b's bit, c's bit) read as 3 bits.
        let lop3 = |lut: u32| {
            (0..32).fold(0u32, |out, i| {
                let at = (a >> i & 1) << 2 | (b >> i & 1) << 1 | (c >> i & 1);
                out | (lut >> at & 1) << i
            })
        };
        let results: Vec<u64> = luts.iter().map(|&l| u64::from(lop3(l))).collect();
        assert_eq!(o, mix(0, &results, 5), "a {a:#x} b {b:#x}");
    }
}

#[test]
fn funnel_shifts_wrap_and_clamp() {
    let inputs: Vec<(u64, u64)> = pairs32()
        .into_iter()
        .chain([
            (0x8000_0001, 0x1234_5678_0000_0000 | 31),
            (0xffff_0000, 0xdead_beef_0000_0000 | 32),
        ])
        .chain([
            (0x0f0f_0f0f, 0xa5a5_a5a5_0000_0000 | 33),
            (1, 0x8000_0000_0000_0000 | 64),
        ])
        .collect();
    // The funnel is (hi:lo) = (b's high word : a's low word); the amount is b's low word.
    let body = "
	mov.b64 {%r12, %r13}, %rd11;
	shf.l.wrap.b32 %r20, %r10, %r13, %r12;
	shf.r.wrap.b32 %r21, %r10, %r13, %r12;
	shf.l.clamp.b32 %r22, %r10, %r13, %r12;
	shf.r.clamp.b32 %r23, %r10, %r13, %r12;
	mov.b64 %rd20, {%r20, %r21};
	mov.b64 %rd21, {%r22, %r23};"
        .to_string()
        + &mix_ptx(&[21], 13);
    let out = run_pairs(&body, &inputs);
    for (&(a, b), &o) in inputs.iter().zip(&out) {
        let (lo, hi, n) = (a as u32, (b >> 32) as u32, b as u32);
        let funnel = u64::from(hi) << 32 | u64::from(lo);
        let left = |n: u32| (funnel.checked_shl(n).unwrap_or(0) >> 32) as u32;
        let right = |n: u32| funnel.checked_shr(n).unwrap_or(0) as u32;
        let (wrap, clamp) = (n % 32, n.min(32));
        let pair = |x: u32, y: u32| u64::from(x) | u64::from(y) << 32;
        let want = mix(
            pair(left(wrap), right(wrap)),
            &[pair(left(clamp), right(clamp))],
            13,
        );
        assert_eq!(o, want, "lo {lo:#x} hi {hi:#x} n {n}");
    }
}

#[test]
fn testp_combined_setp_and_slct() {
    let inputs: Vec<(u64, u64)> = pairs32()
        .into_iter()
        .chain([
            (0x7f80_0000, 3),
            (0xff80_0000, 2),
            (0x3f80_0000, 0x8000_0001),
            (0x0040_0000, 7),
        ])
        .collect();
    let body = "
	mov.b32 %f1, %r10;
	and.b32 %r12, %r11, 1;
	setp.ne.u32 %p3, %r12, 0;
	testp.finite.f32 %p1, %f1;
	selp.u32 %r20, 1, 0, %p1;
	testp.infinite.f32 %p1, %f1;
	selp.u32 %r21, 2, 0, %p1;
	testp.number.f32 %p1, %f1;
	selp.u32 %r22, 4, 0, %p1;
	testp.notanumber.f32 %p1, %f1;
	selp.u32 %r23, 8, 0, %p1;
	testp.normal.f32 %p1, %f1;
	selp.u32 %r24, 16, 0, %p1;
	testp.subnormal.f32 %p1, %f1;
	selp.u32 %r25, 32, 0, %p1;
	setp.lt.and.s32 %p1|%p2, %r10, %r11, %p3;
	selp.u32 %r26, 64, 0, %p1;
	selp.u32 %r27, 128, 0, %p2;
	setp.lt.or.s32 %p1|%p2, %r10, %r11, !%p3;
	selp.u32 %r28, 256, 0, %p1;
	selp.u32 %r29, 512, 0, %p2;
	setp.lt.xor.s32 %p1|%p2, %r10, %r11, %p3;
	selp.u32 %r30, 1024, 0, %p1;
	selp.u32 %r31, 2048, 0, %p2;
	slct.s32.s32 %r32, %r10, %r11, %r11;
	slct.u32.f32 %r33, %r10, %r11, %f1;
	mov.u64 %rd20, 0;"
        .to_string()
        + &(20..32)
            .map(|r| format!("\n\tcvt.u64.u32 %rd21, %r{r};\n\tor.b64 %rd20, %rd20, %rd21;"))
            .collect::<String>()
        + "\n\tmov.b64 %rd22, {%r32, %r33};"
        + &mix_ptx(&[22], 17);
    let out = run_pairs(&body, &inputs);
    for (&(a, b), &o) in inputs.iter().zip(&out) {
        let (a, b) = (a as u32, b as u32);
        let (x, q) = (f32::from_bits(a), b & 1 == 1);
        let lt = (a as i32) < (b as i32);
        let flags = [
            x.is_finite(),
            x.is_infinite(),
            !x.is_nan(),
            x.is_nan(),
            x.is_normal(),
            x.is_subnormal(),
            lt && q,
            !lt && q,
            lt || !q,
            !lt || !q,
            lt ^ q,
            !lt ^ q,
        ];
        let bits: u64 = (flags.iter().enumerate())
            .map(|(i, &f)| u64::from(f) << i)
            .sum();
        let slct_s = if b as i32 >= 0 { a } else { b };
        let slct_f = if x >= 0.0 { a } else { b };
        let want = mix(bits, &[u64::from(slct_s) | u64::from(slct_f) << 32], 17);
        assert_eq!(o, want, "a {a:#x} b {b:#x}");
    }
}

/// `bfe` as the PTX ISA defines it, from the field's width: the `len` bits at `pos` (those
/// inside the word), then the sign (signed: the field's top bit, or bit 31 past the word) above.
fn bfe_ref(a: u32, pos: u32, len: u32, signed: bool) -> u32 {
    let (pos, len) = (pos & 0xff, len & 0xff);
    let mask = |w: u32| if w >= 32 { u32::MAX } else { (1 << w) - 1 };
    let width = (pos + len).min(32).saturating_sub(pos);
    let field = if width == 0 {
        0
    } else {
        (a >> pos) & mask(width)
    };
    let top = (pos + len).saturating_sub(1).min(31);
    let negative = signed && len > 0 && (a >> top) & 1 == 1;
    if negative {
        field | !mask(width)
    } else {
        field
    }
}

#[test]
fn bit_fields_and_saturating_mad() {
    let fields = [
        (0u32, 0u32),
        (0, 1),
        (1, 4),
        (4, 8),
        (15, 16),
        (31, 1),
        (31, 2),
        (24, 8),
        (0, 32),
    ]
    .into_iter()
    .chain([(0, 33), (32, 4), (40, 8), (255, 200), (3, 255)]);
    let inputs: Vec<(u64, u64)> = EDGE32
        .iter()
        .flat_map(|&a| {
            // pos in bits 0-7 and len in 8-15 of b; the bits above must be ignored.
            fields
                .clone()
                .map(move |(pos, len)| (u64::from(a), u64::from(pos | len << 8 | 0xab_0000)))
        })
        .collect();
    let body = "
	shr.u32 %r12, %r11, 8;
	bfe.u32 %r20, %r10, %r11, %r12;
	bfe.s32 %r21, %r10, %r11, %r12;
	bfi.b32 %r22, %r11, %r10, %r11, %r12;
	mad.hi.sat.s32 %r23, %r10, %r11, %r11;
	mov.b64 %rd20, {%r20, %r21};
	mov.b64 %rd21, {%r22, %r23};"
        .to_string()
        + &mix_ptx(&[21], 11);
    let out = run_pairs(&body, &inputs);
    for (&(a, b), &o) in inputs.iter().zip(&out) {
        let (a, b) = (a as u32, b as u32);
        let (pos, len) = (b & 0xff, (b >> 8) & 0xff);
        let inserted = if pos >= 32 {
            a
        } else {
            let m = ((1u64 << len.min(32)) - 1) << pos & 0xffff_ffff;
            (u64::from(a) & !m | u64::from(b) << pos & m) as u32
        };
        let mad = ((i64::from(a as i32) * i64::from(b as i32)) >> 32) + i64::from(b as i32);
        let mad = mad.clamp(i32::MIN.into(), i32::MAX.into()) as u32;
        let first =
            u64::from(bfe_ref(a, pos, len, false)) | u64::from(bfe_ref(a, pos, len, true)) << 32;
        let want = mix(first, &[u64::from(inserted) | u64::from(mad) << 32], 11);
        assert_eq!(o, want, "a {a:#x} pos {pos} len {len}");
    }
}

#[test]
fn min_max_nan() {
    let nan = f32::NAN.to_bits() as u64;
    let one = 1f32.to_bits() as u64;
    let body = "
	mov.b32 %f1, %r10;
	mov.b32 %f2, %r11;
	max.NaN.f32 %f3, %f1, %f2;
	min.f32 %f4, %f1, %f2;
	mov.b32 %r20, %f3;
	mov.b32 %r21, %f4;
	mov.b64 %rd20, {%r20, %r21};";
    let out = run_pairs(body, &[(nan, one), (one, 2f32.to_bits() as u64)]);
    assert!(f32::from_bits(out[0] as u32).is_nan());
    assert_eq!(f32::from_bits((out[0] >> 32) as u32), 1.0);
    assert_eq!(f32::from_bits(out[1] as u32), 2.0);
    assert_eq!(f32::from_bits((out[1] >> 32) as u32), 1.0);
    // The other two: .NaN propagates a NaN operand, its absence returns the number.
    let body = body
        .replace("max.NaN", "max")
        .replace("min.f32", "min.NaN.f32");
    let out = run_pairs(&body, &[(one, nan), (one, 2f32.to_bits() as u64)]);
    assert_eq!(f32::from_bits(out[0] as u32), 1.0);
    assert!(f32::from_bits((out[0] >> 32) as u32).is_nan());
    assert_eq!(f32::from_bits(out[1] as u32), 2.0);
    assert_eq!(f32::from_bits((out[1] >> 32) as u32), 1.0);
    // xorsign.abs is refused rather than computed wrongly.
    let src = format!(
        "{HEAD}.visible .entry k()\n{{\n\t.reg .f32 %f<4>;\n\tmin.xorsign.abs.f32 %f1, %f2, %f3;\n\tret;\n}}\n"
    );
    assert!(tandem_ptx::Module::parse(&src).is_err());
}

/// Plain signed min and max (not their `.relu` forms), and `mad.wide` adding an immediate of
/// the wide type: all 64 bits of it.
#[test]
fn signed_min_max_and_a_wide_immediate_addend() {
    let inputs = pairs32();
    let body = "
	min.s32 %r20, %r10, %r11;
	max.s32 %r21, %r10, %r11;
	mov.b64 %rd21, {%r20, %r21};
	mad.wide.u32 %rd22, %r10, %r11, 0x500000003;
	xor.b64 %rd20, %rd21, 0;"
        .to_string()
        + &mix_ptx(&[22], 5);
    let out = run_pairs(&body, &inputs);
    for (&(a, b), &o) in inputs.iter().zip(&out) {
        let (ia, ib) = (a as u32 as i32, b as u32 as i32);
        let minmax = ia.min(ib) as u32 as u64 | (ia.max(ib) as u32 as u64) << 32;
        let wide = (a as u32 as u64 * b as u32 as u64).wrapping_add(0x5_0000_0003);
        assert_eq!(o, mix(minmax, &[wide], 5), "a {a:#x} b {b:#x}");
    }
}
