//! What the decoder refuses: each form it does not implement, or that `ptxas` rejects, beside
//! the nearest form it accepts, so that a refusal is shown to be about that one modifier,
//! type or operand and not about the instruction as a whole. A form the interpreter half
//! understood would run with the wrong meaning; refused, it names itself and its line.
use tandem_ptx::Module;

/// The line of `module`'s instruction.
const LINE: usize = 14;

fn module(instruction: &str) -> String {
    format!(
        ".version 9.0\n.target sm_80\n.address_size 64\n.visible .entry k()\n{{\n\t.reg .pred %p<9>;\n\t.reg .b16 %h<9>;\n\t.reg .b32 %r<40>;\n\t.reg .b64 %rd<20>;\n\t.reg .f32 %f<40>;\n\t.reg .f64 %fd<20>;\n\t.shared .align 8 .b8 buf[64];\nL:\n\t{instruction}\n\tret;\n}}\n"
    )
}

/// Whether `accepted` parses and `refused` fails on its line with a message containing
/// `message`; if not, what went otherwise.
fn check(accepted: &str, refused: &str, message: &str) -> Result<(), String> {
    if let Err(e) = Module::parse(&module(accepted)) {
        return Err(format!("`{accepted}` refused: {}", e.message));
    }
    match Module::parse(&module(refused)) {
        Ok(_) => Err(format!("`{refused}` accepted (beside `{accepted}`)")),
        Err(e) if e.line != LINE => Err(format!("`{refused}`: error on line {}", e.line)),
        Err(e) if !e.message.contains(message) => Err(format!(
            "`{refused}`: {:?} does not contain {message:?}",
            e.message
        )),
        Err(_) => Ok(()),
    }
}

/// Checks every pair, `refused` expected to be an unknown instruction named by its opcode.
fn check_unknown(pairs: &[(&str, &str)]) {
    let failures: Vec<String> = pairs
        .iter()
        .filter_map(|(accepted, refused)| {
            let opcode = refused.split([' ', ';']).next().unwrap_or_default();
            check(
                accepted,
                refused,
                &format!("unknown instruction `{opcode}`"),
            )
            .err()
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn integer_and_bit_instructions_refuse_other_types_modifiers_and_operand_counts() {
    check_unknown(&[
        ("add.u32 %r1, %r2, %r3;", "add.u32 %r1, %r2;"),
        ("add.s16 %h1, %h2, %h3;", "add.b32 %r1, %r2, %r3;"),
        ("sub.u64 %rd1, %rd2, %rd3;", "sub.u8 %h1, %h2, %h3;"),
        ("div.s64 %rd1, %rd2, %rd3;", "rem.b64 %rd1, %rd2, %rd3;"),
        ("max.u16 %h1, %h2, %h3;", "min.b16 %h1, %h2, %h3;"),
        (
            "mul.hi.s64 %rd1, %rd2, %rd3;",
            "mul.lo.b64 %rd1, %rd2, %rd3;",
        ),
        ("mul.wide.s16 %r1, %h2, %h3;", "mul.wide.b16 %r1, %h2, %h3;"),
        ("and.b16 %h1, %h2, %h3;", "and.u32 %r1, %r2, %r3;"),
        ("or.b64 %rd1, %rd2, %rd3;", "xor.s32 %r1, %r2, %r3;"),
        ("shl.b64 %rd1, %rd2, %r3;", "shl.u32 %r1, %r2, %r3;"),
        ("shr.s16 %h1, %h2, %r3;", "shr.f32 %f1, %f2, %r3;"),
        ("shr.b32 %r1, %r2, %r3;", "shr.pred %p1, %p2, %r3;"),
        (
            "add.sat.s32 %r1, %r2, %r3;",
            "sub.sat.s64 %rd1, %rd2, %rd3;",
        ),
        (
            "mad.lo.s16 %h1, %h2, %h3, %h4;",
            "mad.lo.b32 %r1, %r2, %r3, %r4;",
        ),
        (
            "mad24.lo.s32 %r1, %r2, %r3, %r4;",
            "mad24.lo.u64 %rd1, %rd2, %rd3, %rd4;",
        ),
        (
            "mad.hi.u64 %rd1, %rd2, %rd3, %rd4;",
            "mad.hi.u8 %h1, %h2, %h3, %h4;",
        ),
        (
            "mad.lo.s32 %r1, %r2, %r3, %r4;",
            "mad.rz.lo.s32 %r1, %r2, %r3, %r4;",
        ),
        ("add.u32 %r1, %r2, %r3;", "add.u32 %r1, %r2, %r3, %r4;"),
        ("add.u32 %r1, %r2, %r3;", "add.rn.u32 %r1, %r2, %r3;"),
        ("add.u32 %r1, %r2, %r3;", "add.ftz.u32 %r1, %r2, %r3;"),
        ("div.u32 %r1, %r2, %r3;", "div.approx.u32 %r1, %r2, %r3;"),
        ("div.u32 %r1, %r2, %r3;", "div.full.u32 %r1, %r2, %r3;"),
        ("max.s32 %r1, %r2, %r3;", "max.NaN.s32 %r1, %r2, %r3;"),
        ("mul.lo.u32 %r1, %r2, %r3;", "mul.u32 %r1, %r2, %r3;"),
        (
            "mul.wide.u32 %rd1, %r2, %r3;",
            "mul.wide.u64 %rd1, %rd2, %rd3;",
        ),
        (
            "mul24.lo.u32 %r1, %r2, %r3;",
            "mul24.lo.u64 %rd1, %rd2, %rd3;",
        ),
        ("min.relu.s32 %r1, %r2, %r3;", "min.relu.u32 %r1, %r2, %r3;"),
        ("min.s32 %r1, %r2, %r3;", "and.relu.b32 %r1, %r2, %r3;"),
        ("add.sat.s32 %r1, %r2, %r3;", "add.sat.u32 %r1, %r2, %r3;"),
        (
            "sub.sat.s32 %r1, %r2, %r3;",
            "mul.lo.sat.s32 %r1, %r2, %r3;",
        ),
        ("and.pred %p1, %p2, %p3;", "add.pred %p1, %p2, %p3;"),
        ("add.cc.u32 %r1, %r2, %r3;", "add.cc.u16 %h1, %h2, %h3;"),
        (
            "sub.cc.u64 %rd1, %rd2, %rd3;",
            "mul.lo.cc.u32 %r1, %r2, %r3;",
        ),
        ("addc.cc.u32 %r1, %r2, %r3;", "addc.cc.u16 %h1, %h2, %h3;"),
        ("subc.u64 %rd1, %rd2, %rd3;", "subc.f32 %f1, %f2, %f3;"),
        ("addc.u32 %r1, %r2, %r3;", "addc.u32 %r1, %r2;"),
        ("abs.s32 %r1, %r2;", "abs.rn.s32 %r1, %r2;"),
        ("abs.s32 %r1, %r2;", "abs.ftz.s32 %r1, %r2;"),
        ("popc.b32 %r1, %r2;", "popc.approx.b32 %r1, %r2;"),
        ("popc.b32 %r1, %r2;", "sqrt.u32 %r1, %r2;"),
        ("bfind.s64 %r1, %rd2;", "bfind.b32 %r1, %r2;"),
        (
            "bfind.shiftamt.u32 %r1, %r2;",
            "bfind.shiftamt.b64 %r1, %rd2;",
        ),
        ("not.pred %p1, %p2;", "abs.pred %p1, %p2;"),
        ("abs.s16 %h1, %h2;", "abs.u32 %r1, %r2;"),
        ("neg.s64 %rd1, %rd2;", "neg.b32 %r1, %r2;"),
        ("not.b16 %h1, %h2;", "not.u32 %r1, %r2;"),
        ("cnot.b64 %rd1, %rd2;", "cnot.pred %p1, %p2;"),
        ("popc.b64 %r1, %rd2;", "popc.u32 %r1, %r2;"),
        ("clz.b32 %r1, %r2;", "clz.s64 %r1, %rd2;"),
        ("brev.b64 %rd1, %rd2;", "brev.b16 %h1, %h2;"),
        ("not.b32 %r1, %r2;", "not.b32 %r1;"),
        ("addc.s64 %rd1, %rd2, %rd3;", "addc.b32 %r1, %r2, %r3;"),
        ("subc.cc.s32 %r1, %r2, %r3;", "subc.cc.f16x2 %r1, %r2, %r3;"),
        ("bfe.u32 %r1, %r2, %r3, %r4;", "bfe.u32 %r1, %r2, %r3;"),
        (
            "bfe.s64 %rd1, %rd2, %r3, %r4;",
            "bfe.b32 %r1, %r2, %r3, %r4;",
        ),
        (
            "bfe.u64 %rd1, %rd2, %r3, %r4;",
            "bfe.f32 %f1, %f2, %r3, %r4;",
        ),
        (
            "bfi.b32 %r1, %r2, %r3, %r4, %r5;",
            "bfi.b32 %r1, %r2, %r3, %r4;",
        ),
        (
            "bfi.b64 %rd1, %rd2, %rd3, %r4, %r5;",
            "bfi.u32 %r1, %r2, %r3, %r4, %r5;",
        ),
        (
            "prmt.b32 %r1, %r2, %r3, %r4;",
            "prmt.u32 %r1, %r2, %r3, %r4;",
        ),
        (
            "prmt.b32.rc16 %r1, %r2, %r3, %r4;",
            "prmt.b32.rc32 %r1, %r2, %r3, %r4;",
        ),
        (
            "prmt.b32.f4e %r1, %r2, %r3, %r4;",
            "prmt.b32.f4e %r1, %r2, %r3;",
        ),
        ("sad.u16 %h1, %h2, %h3, %h4;", "sad.u8 %r1, %r2, %r3, %r4;"),
        ("sad.s32 %r1, %r2, %r3, %r4;", "sad.f32 %f1, %f2, %f3, %f4;"),
        (
            "sad.u64 %rd1, %rd2, %rd3, %rd4;",
            "sad.pred %p1, %p2, %p3, %p4;",
        ),
        ("sad.u32 %r1, %r2, %r3, %r4;", "sad.u32 %r1, %r2, %r3;"),
        (
            "sad.s16 %h1, %h2, %h3, %h4;",
            "sad.f16x2 %r1, %r2, %r3, %r4;",
        ),
        (
            "sad.u64 %rd1, %rd2, %rd3, %rd4;",
            "sad.b64 %rd1, %rd2, %rd3, %rd4;",
        ),
        ("szext.wrap.u32 %r1, %r2, %r3;", "szext.u32 %r1, %r2, %r3;"),
        (
            "szext.clamp.s32 %r1, %r2, %r3;",
            "szext.clamp.b32 %r1, %r2, %r3;",
        ),
        (
            "bmsk.clamp.b32 %r1, %r2, %r3;",
            "bmsk.clamp.u32 %r1, %r2, %r3;",
        ),
        ("bmsk.wrap.b32 %r1, %r2, %r3;", "bmsk.wrap.b32 %r1, %r2;"),
        ("fns.b32 %r1, %r2, %r3, %r4;", "fns.u32 %r1, %r2, %r3, %r4;"),
        ("fns.b32 %r1, %r2, %r3, %r4;", "fns.b32 %r1, %r2, %r3;"),
        (
            "dp4a.u32.s32 %r1, %r2, %r3, %r4;",
            "dp4a.u32.u64 %r1, %r2, %r3, %r4;",
        ),
        (
            "dp4a.s32.u32 %r1, %r2, %r3, %r4;",
            "dp4a.b32.u32 %r1, %r2, %r3, %r4;",
        ),
        (
            "dp4a.s32.s32 %r1, %r2, %r3, %r4;",
            "dp4a.s32 %r1, %r2, %r3, %r4;",
        ),
        (
            "dp2a.lo.u32.u32 %r1, %r2, %r3, %r4;",
            "dp2a.u32.u32 %r1, %r2, %r3, %r4;",
        ),
        (
            "dp2a.hi.s32.s32 %r1, %r2, %r3, %r4;",
            "dp2a.hi.s32.s32 %r1, %r2, %r3;",
        ),
        (
            "lop3.b32 %r1, %r2, %r3, %r4, 0x96;",
            "lop3.u32 %r1, %r2, %r3, %r4, 0x96;",
        ),
        (
            "lop3.b32 %r1, %r2, %r3, %r4, 0x96;",
            "lop3.b32 %r1, %r2, %r3, %r4;",
        ),
        (
            "shf.l.wrap.b32 %r1, %r2, %r3, %r4;",
            "shf.l.b32 %r1, %r2, %r3, %r4;",
        ),
        (
            "shf.r.clamp.b32 %r1, %r2, %r3, %r4;",
            "shf.clamp.b32 %r1, %r2, %r3, %r4;",
        ),
        (
            "shf.r.wrap.b32 %r1, %r2, %r3, %r4;",
            "shf.r.wrap.u32 %r1, %r2, %r3, %r4;",
        ),
        (
            "shf.l.clamp.b32 %r1, %r2, %r3, %r4;",
            "shf.l.clamp.b32 %r1, %r2, %r3;",
        ),
        // mad: the carry forms, the integer forms.
        (
            "mad.lo.cc.u32 %r1, %r2, %r3, %r4;",
            "mad.wide.cc.u32 %rd1, %r2, %r3, %rd4;",
        ),
        (
            "madc.hi.u32 %r1, %r2, %r3, %r4;",
            "madc.u32 %r1, %r2, %r3, %r4;",
        ),
        (
            "madc.lo.cc.s64 %rd1, %rd2, %rd3, %rd4;",
            "madc.lo.cc.u16 %h1, %h2, %h3, %h4;",
        ),
        (
            "madc.lo.s32 %r1, %r2, %r3, %r4;",
            "madc.lo.sat.s32 %r1, %r2, %r3, %r4;",
        ),
        (
            "mad.hi.cc.u32 %r1, %r2, %r3, %r4;",
            "mad.hi.cc.f32 %f1, %f2, %f3, %f4;",
        ),
        (
            "mad.hi.cc.u32 %r1, %r2, %r3, %r4;",
            "mad.rn.hi.cc.u32 %r1, %r2, %r3, %r4;",
        ),
        (
            "mad.lo.u32 %r1, %r2, %r3, %r4;",
            "fma.lo.u32 %r1, %r2, %r3, %r4;",
        ),
        (
            "mad.lo.u32 %r1, %r2, %r3, %r4;",
            "mad.u32 %r1, %r2, %r3, %r4;",
        ),
        (
            "mad.lo.u32 %r1, %r2, %r3, %r4;",
            "mad.lo.ftz.u32 %r1, %r2, %r3, %r4;",
        ),
        (
            "mad.lo.u32 %r1, %r2, %r3, %r4;",
            "mad.lo.u32 %r1, %r2, %r3;",
        ),
        (
            "mad.wide.u32 %rd1, %r2, %r3, %rd4;",
            "mad.wide.u64 %rd1, %rd2, %rd3, %rd4;",
        ),
        (
            "mad.hi.sat.s32 %r1, %r2, %r3, %r4;",
            "mad.lo.sat.s32 %r1, %r2, %r3, %r4;",
        ),
        (
            "mad24.hi.sat.s32 %r1, %r2, %r3, %r4;",
            "mad.hi.sat.u32 %r1, %r2, %r3, %r4;",
        ),
        ("and.pred %p1, %p2, %p3;", "mad.lo.pred %p1, %p2, %p3, %p4;"),
    ]);
}

#[test]
fn float_instructions_refuse_integer_modifiers_and_unimplemented_forms() {
    check_unknown(&[
        ("add.f32 %f1, %f2, %f3;", "add.lo.f32 %f1, %f2, %f3;"),
        ("add.f32 %f1, %f2, %f3;", "add.cc.f32 %f1, %f2, %f3;"),
        ("div.rn.f32 %f1, %f2, %f3;", "rem.f32 %f1, %f2, %f3;"),
        ("min.NaN.f32 %f1, %f2, %f3;", "add.NaN.f32 %f1, %f2, %f3;"),
        (
            "max.f64 %fd1, %fd2, %fd3;",
            "max.relu.f64 %fd1, %fd2, %fd3;",
        ),
        ("copysign.f32 %f1, %f2, %f3;", "and.f32 %f1, %f2, %f3;"),
        // 16-bit floats: add, sub, mul and fma only, without .ftz, .sat or .relu.
        ("add.rn.f16 %h1, %h2, %h3;", "div.rn.f16 %h1, %h2, %h3;"),
        ("add.f16 %h1, %h2, %h3;", "add.ftz.f16 %h1, %h2, %h3;"),
        ("add.rn.f16x2 %r1, %r2, %r3;", "add.rz.f16x2 %r1, %r2, %r3;"),
        ("mul.rn.bf16 %h1, %h2, %h3;", "mul.rm.bf16 %h1, %h2, %h3;"),
        ("sub.f16x2 %r1, %r2, %r3;", "sub.sat.f16x2 %r1, %r2, %r3;"),
        ("mul.bf16 %h1, %h2, %h3;", "mul.relu.bf16 %h1, %h2, %h3;"),
        ("add.f16 %h1, %h2, %h3;", "add.approx.f16 %h1, %h2, %h3;"),
        ("add.f16 %h1, %h2, %h3;", "add.full.f16 %h1, %h2, %h3;"),
        ("add.f16 %h1, %h2, %h3;", "add.NaN.f16 %h1, %h2, %h3;"),
        ("add.f16 %h1, %h2, %h3;", "add.cc.f16 %h1, %h2, %h3;"),
        ("mul.bf16x2 %r1, %r2, %r3;", "mul.lo.bf16x2 %r1, %r2, %r3;"),
        (
            "fma.rn.f16 %h1, %h2, %h3, %h4;",
            "fma.f16 %h1, %h2, %h3, %h4;",
        ),
        (
            "fma.rn.bf16x2 %r1, %r2, %r3, %r4;",
            "mad.rn.bf16x2 %r1, %r2, %r3, %r4;",
        ),
        (
            "fma.rn.f16x2 %r1, %r2, %r3, %r4;",
            "fma.rn.ftz.f16x2 %r1, %r2, %r3, %r4;",
        ),
        (
            "fma.rn.f16 %h1, %h2, %h3, %h4;",
            "fma.rn.sat.f16 %h1, %h2, %h3, %h4;",
        ),
        (
            "fma.rn.bf16 %h1, %h2, %h3, %h4;",
            "fma.rn.relu.bf16 %h1, %h2, %h3, %h4;",
        ),
        (
            "fma.rn.bf16 %h1, %h2, %h3, %h4;",
            "fma.rn.lo.bf16 %h1, %h2, %h3, %h4;",
        ),
        // Packed 16-bit negation and absolute value are not integer ones.
        ("neg.s32 %r1, %r2;", "neg.f16x2 %r1, %r2;"),
        ("abs.s32 %r1, %r2;", "abs.bf16x2 %r1, %r2;"),
        ("abs.f32 %f1, %f2;", "abs.f16 %h1, %h2;"),
        ("sqrt.rn.f32 %f1, %f2;", "not.f32 %f1, %f2;"),
        ("cos.approx.f32 %f1, %f2;", "cos.approx.f16 %h1, %h2;"),
        ("tanh.approx.f32 %f1, %f2;", "tanh.approx.bf16x2 %r1, %r2;"),
        ("ex2.approx.f32 %f1, %f2;", "ex2.approx.f16x2 %r1, %r2;"),
        // fma and mad on floats.
        (
            "fma.rn.f32 %f1, %f2, %f3, %f4;",
            "fma.rn.lo.f32 %f1, %f2, %f3, %f4;",
        ),
        (
            "mad.rn.f64 %fd1, %fd2, %fd3, %fd4;",
            "mad24.f32 %f1, %f2, %f3, %f4;",
        ),
        (
            "fma.rn.f32 %f1, %f2, %f3, %f4;",
            "fma.rn.f32 %f1, %f2, %f3;",
        ),
        ("cvt.rn.f32.u32 %f1, %r1;", "cvt.rn.pred.u32 %p1, %r1;"),
        ("cvt.rn.f32.u32 %f1, %r1;", "cvt.rn.f32.pred %f1, %p1;"),
        ("cvt.rn.f32.u32 %f1, %r1;", "cvt.rn.f32.u32 %f1, %r1, %r2;"),
        ("cvt.rn.f32.u32 %f1, %r1;", "cvt.u32.f16x2 %r1, %r2;"),
        ("cvt.rn.f32.u32 %f1, %r1;", "cvt.rn.f32 %f1, %r1;"),
        (
            "cvt.rn.f16x2.f32 %r1, %f1, %f2;",
            "cvt.f16x2.f32 %r1, %f1, %f2;",
        ),
        (
            "cvt.rz.bf16x2.f32 %r1, %f1, %f2;",
            "cvt.rz.ftz.bf16x2.f32 %r1, %f1, %f2;",
        ),
        (
            "cvt.rn.f16x2.f32 %r1, %f1, %f2;",
            "cvt.rn.sat.f16x2.f32 %r1, %f1, %f2;",
        ),
        (
            "cvt.rn.f16x2.f32 %r1, %f1, %f2;",
            "cvt.rn.f16x2.f64 %r1, %fd1, %fd2;",
        ),
        (
            "cvt.rn.f16x2.f32 %r1, %f1, %f2;",
            "cvt.rn.f16x2.f32 %r1, %f1;",
        ),
        ("testp.finite.f32 %p1, %f1;", "testp.f32 %p1, %f1;"),
        (
            "testp.subnormal.f64 %p1, %fd1;",
            "testp.normal.u32 %p1, %r1;",
        ),
        (
            "testp.notanumber.f32 %p1, %f1;",
            "testp.number.f16 %p1, %h1;",
        ),
        (
            "testp.infinite.f32 %p1, %f1;",
            "testp.infinite.f32 %p1, %f1, %f2;",
        ),
    ]);
}

#[test]
fn comparisons_selections_and_moves_refuse_what_they_cannot_mean() {
    check_unknown(&[
        ("setp.lt.s32 %p1, %r1, %r2;", "setp.lt.pred %p1, %p2, %p3;"),
        ("mov.b16 %h1, {%h2, %h3};", "mov.f32 %f1, {%h2, %h3};"),
        ("setp.lt.f32 %p1, %f1, %f2;", "setp.lt.f16 %p1, %h1, %h2;"),
        ("setp.ltu.f32 %p1, %f1, %f2;", "setp.ltu.s32 %p1, %r1, %r2;"),
        (
            "setp.num.f64 %p1, %fd1, %fd2;",
            "setp.nan.u32 %p1, %r1, %r2;",
        ),
        ("setp.lo.u32 %p1, %r1, %r2;", "setp.lo.f32 %p1, %f1, %f2;"),
        (
            "setp.hs.u64 %p1, %rd1, %rd2;",
            "setp.hs.f64 %p1, %fd1, %fd2;",
        ),
        ("setp.ge.s32 %p1, %r1, %r2;", "setp.foo.s32 %p1, %r1, %r2;"),
        (
            "setp.lt.and.s32 %p1, %r1, %r2, %p2;",
            "setp.lt.and.s32 %p1, %r1, %r2;",
        ),
        (
            "setp.lt.s32 %p1|%p2, %r1, %r2;",
            "setp.lt.s32 %p1, %r1, %r2, %p2;",
        ),
        (
            "selp.u32 %r1, %r2, %r3, %p1;",
            "selp.u32 %r1, %r2, %r3, !%p1;",
        ),
        ("selp.u32 %r1, %r2, %r3, %p1;", "selp.u32 %r1, %r2, %r3;"),
        (
            "slct.u32.s32 %r1, %r2, %r3, %r4;",
            "slct.u32.u32 %r1, %r2, %r3, %r4;",
        ),
        (
            "slct.ftz.f32.f32 %f1, %f2, %f3, %f4;",
            "slct.f32 %f1, %f2, %f3, %f4;",
        ),
        (
            "mov.b64 {%r1, %r2}, %rd1;",
            "mov.b64 {%r1, %r2, %r3}, %rd1;",
        ),
        ("mov.b32 %r1, {%h1, %h2};", "mov.f64 %fd1, {%r1, %r2};"),
        (
            "mov.b64 %rd1, {%h1, %h2, %h3, %h4};",
            "mov.b8 %h1, {%h2, %h3};",
        ),
        ("mov.u32 %r1, %r2;", "mov %r1, %r2;"),
        ("mov.u32 %r1, %r2;", "mov.u32 %r1, %r2, %r3;"),
        ("activemask.b32 %r1;", "activemask.u32 %r1;"),
        ("activemask.b32 %r1;", "activemask.b32 %r1, %r2;"),
    ]);
}

#[test]
fn memory_instructions_refuse_spaces_and_types_they_cannot_use() {
    check_unknown(&[
        ("ld.global.u32 %r1, [%rd1];", "ld.global.pred %p1, [%rd1];"),
        ("st.global.u32 [%rd1], %r1;", "st.const.u32 [%rd1], %r1;"),
        ("ld.const.u32 %r1, [%rd1];", "ld.const.u32 %r1;"),
        (
            "ld.global.v2.u32 {%r1, %r2}, [%rd1];",
            "ld.global.v2 {%r1, %r2}, [%rd1];",
        ),
        ("cvta.to.global.u64 %rd1, %rd2;", "cvta.u64 %rd1, %rd2;"),
        ("cvta.shared.u32 %r1, %r2;", "cvta.shared.u16 %h1, %h2;"),
        ("cvta.local.b64 %rd1, %rd2;", "cvta.local.b64 %rd1;"),
        (
            "atom.global.add.u32 %r1, [%rd1], %r2;",
            "atom.global.add.u16 %h1, [%rd1], %h2;",
        ),
        (
            "atom.global.add.f32 %f1, [%rd1], %f2;",
            "atom.global.and.f32 %f1, [%rd1], %f2;",
        ),
        (
            "atom.shared.add.u32 %r1, [buf], %r2;",
            "atom.local.add.u32 %r1, [%rd1], %r2;",
        ),
        (
            "atom.add.u64 %rd1, [%rd2], %rd3;",
            "atom.param.add.u64 %rd1, [%rd2], %rd3;",
        ),
        (
            "atom.exch.b32 %r1, [%rd1], %r2;",
            "atom.const.exch.b32 %r1, [%rd1], %r2;",
        ),
        (
            "atom.global.cas.b32 %r1, [%rd1], %r2, %r3;",
            "red.global.cas.b32 [%rd1], %r2, %r3;",
        ),
        (
            "atom.global.cas.b32 %r1, [%rd1], %r2, %r3;",
            "atom.global.cas.b32 %r1, [%rd1], %r2;",
        ),
        (
            "red.global.add.u32 [%rd1], %r2;",
            "red.global.add.u32 %r1, [%rd1], %r2;",
        ),
        (
            "atom.global.inc.u32 %r1, [%rd1], %r2;",
            "atom.global.u32 %r1, [%rd1], %r2;",
        ),
        (
            "atom.global.max.s64 %rd1, [%rd2], %rd3;",
            "atom.global.max.pred %p1, [%rd2], %p3;",
        ),
        // Packed 16-bit atomics would otherwise be integer additions.
        (
            "atom.global.add.f32 %f1, [%rd1], %f2;",
            "atom.global.add.noftz.f16x2 %r1, [%rd1], %r2;",
        ),
        (
            "red.global.add.f32 [%rd1], %f2;",
            "red.global.add.noftz.bf16x2 [%rd1], %r2;",
        ),
    ]);
    let mismatch = "vector width and operand mismatch";
    for (accepted, refused) in [
        (
            "ld.global.v2.u32 {%r1, %r2}, [%rd1];",
            "ld.global.v2.u32 {%r1, %r2, %r3, %r4}, [%rd1];",
        ),
        (
            "st.global.v4.f32 [%rd1], {%f1, %f2, %f3, %f4};",
            "st.global.v4.f32 [%rd1], %f1;",
        ),
        (
            "st.global.v4.f32 [%rd1], {%f1, %f2, %f3, %f4};",
            "st.global.v4.f32 [%rd1], {%f1, %f2};",
        ),
    ] {
        check(accepted, refused, mismatch).unwrap();
    }
    check(
        "ld.global.u32 %r1, [%rd1];",
        "ld.global.u32 %r1, %rd1;",
        "expected an address",
    )
    .unwrap();
    check(
        "ld.global.u32 %r1, [%rd1];",
        "ld.global.u32 {%r1}, [%rd1];",
        "expected a destination register",
    )
    .unwrap();
}

#[test]
fn control_and_warp_instructions_refuse_unknown_modifiers_and_operands() {
    check_unknown(&[
        ("bra.uni L;", "bra.foo L;"),
        ("bra L;", "brx.idx %r1, L;"),
        ("ret.uni;", "ret.foo;"),
        ("exit;", "exit %r1;"),
        ("trap;", "trap.uni.foo;"),
        ("bar.warp.sync -1;", "bar.warp -1;"),
        ("bar.warp.sync -1;", "bar.warp.sync.foo -1;"),
        ("bar.warp.sync -1;", "bar.warp.sync -1, 32;"),
        ("bar.red.popc.u32 %r1, 0, %p1;", "bar.red.popc.u32 %r1, %p1;"),
        ("bar.red.popc.u32 %r1, 0, 64, %p1;", "bar.red.popc.u32 %r1, 0, 64, 3, %p1;"),
        ("bar.red.and.pred %p1, 0, %p2;", "bar.red.and.u32 %r1, 0, %p2;"),
        ("bar.red.or.pred %p1, 1, !%p2;", "bar.red.pred %p1, 1, %p2;"),
        ("bar.sync 0;", "bar.arrive 0;"),
        ("bar.cta.sync 0;", "bar.cta 0;"),
        ("barrier.sync 0;", "barrier 0;"),
        ("barrier.sync.aligned 0, 64;", "barrier.sync.aligned 0, 64, 1;"),
        ("bar.cta.sync 1;", "bar.sync;"),
        ("bar.sync 1;", "bar.sync.foo 1;"),
        ("membar.gl;", "membar.foo;"),
        ("fence.sc.gpu;", "fence.sc.gpu %r1;"),
        ("fence.acq_rel.cta;", "fence.mbarrier_init;"),
        ("shfl.sync.up.b32 %r1, %r2, 1, 0, -1;", "shfl.sync.b32 %r1, %r2, 1, 0, -1;"),
        ("shfl.sync.down.b32 %r1|%p1, %r2, 1, 31, -1;", "shfl.sync.down.u32 %r1, %r2, 1, 31, -1;"),
        ("shfl.sync.idx.b32 %r1, %r2, 1, 31, -1;", "shfl.sync.idx.b32 %r1, %r2, 1, 31;"),
        ("vote.sync.all.pred %p1, %p2, -1;", "vote.sync.all.b32 %r1, %p2, -1;"),
        ("vote.sync.ballot.b32 %r1, %p2, -1;", "vote.sync.ballot.pred %p1, %p2, -1;"),
        ("vote.sync.uni.pred %p1, !%p2, -1;", "vote.sync.pred %p1, %p2, -1;"),
        ("vote.sync.any.pred %p1, %p2, -1;", "vote.sync.any.pred %p1, %p2;"),
        (
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f5, %f6, %f7, %f8};",
            "mma.sync.m16n8k16.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f5, %f6, %f7, %f8};",
        ),
        (
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f5, %f6, %f7, %f8};",
            "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f5, %f6, %f7, %f8};",
        ),
        (
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f5, %f6, %f7, %f8};",
            "mma.sync.aligned.m16n8k16.col.row.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f5, %f6, %f7, %f8};",
        ),
        (
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f5, %f6, %f7, %f8};",
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.bf16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f5, %f6, %f7, %f8};",
        ),
        (
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f5, %f6, %f7, %f8};",
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6, %r7, %r8}, {%f5, %f6, %f7, %f8};",
        ),
    ]);
    for (accepted, refused, message) in [
        ("bra L;", "bra 3;", "bra needs a label"),
        (
            ".shared .b8 t[4];",
            ".shared .b8 t[4]:",
            "expected `;`, found `:`",
        ),
        // An address has one base and an offset; lists close with their own bracket.
        (
            "ld.global.u32 %r1, [%rd1+4];",
            "ld.global.u32 %r1, [%rd1+%rd2];",
            "bad address offset",
        ),
        (
            "ld.global.u32 %r1, [%rd1];",
            "ld.global.u32 %r1, [%rd1 %rd2];",
            "unexpected `%rd2` in address",
        ),
        (
            "add.u32 %r1, %r2, %r3;",
            "add.u32 %r1, %r2, %r3];",
            "unexpected `]` in operands",
        ),
        (
            "mov.b64 {%r1, %r2}, %rd1;",
            "mov.b64 {%r1, %r2), %rd1;",
            "unexpected `)` in vector",
        ),
        // Constant expressions are not implemented: refused, not read as one number.
        (
            "mov.u32 %r1, 1;",
            "mov.u32 %r1, 1-2;",
            "unexpected `-` in operands",
        ),
        ("bra L;", "bra M;", "unknown label `M`"),
        (
            "shfl.sync.up.b32 %r1, %r2, 1, 0, -1;",
            "shfl.up.b32 %r1, %r2, 1, 0, -1;",
            "shfl without .sync is not supported",
        ),
        (
            "vote.sync.any.pred %p1, %p2, -1;",
            "vote.any.pred %p1, %p2;",
            "vote without .sync is not supported",
        ),
        (
            "lop3.b32 %r1, %r2, %r3, %r4, 0x96;",
            "lop3.b32 %r1, %r2, %r3, %r4, %r5;",
            "lop3 needs an immediate table",
        ),
    ] {
        check(accepted, refused, message).unwrap();
    }
}
