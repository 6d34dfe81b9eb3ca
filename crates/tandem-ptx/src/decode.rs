//! Decoding one instruction's opcode, modifiers and operands into an [`Op`].

use crate::float::HalfOp;
use crate::ir::*;
use crate::parse::{Decoded, Parser, Raw, SINK};
use crate::ParseError;

/// `Err(None)`: an unknown instruction (the caller names it).
type R = Result<Decoded, Option<ParseError>>;

/// The modifiers after the base opcode; decoders remove what they understand.
struct Mods<'a>(Vec<&'a str>);

impl<'a> Mods<'a> {
    fn has(&mut self, m: &str) -> bool {
        match self.0.iter().position(|x| *x == m) {
            Some(i) => {
                self.0.remove(i);
                true
            }
            None => false,
        }
    }
    fn any(&mut self, list: &[&str]) -> Option<&'a str> {
        let i = self.0.iter().position(|x| list.contains(x))?;
        Some(self.0.remove(i))
    }
    fn drop_all(&mut self, list: &[&str]) {
        self.0.retain(|x| !list.contains(x));
    }
    fn rnd(&mut self) -> Rnd {
        match self.any(&["rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi"]) {
            Some("rn") => Rnd::Rn,
            Some("rz") => Rnd::Rz,
            Some("rm") => Rnd::Rm,
            Some("rp") => Rnd::Rp,
            Some("rni") => Rnd::Rni,
            Some("rzi") => Rnd::Rzi,
            Some("rmi") => Rnd::Rmi,
            Some("rpi") => Rnd::Rpi,
            _ => Rnd::Default,
        }
    }
    fn space(&mut self) -> Space {
        match self.any(&["global", "shared", "local", "param", "const"]) {
            Some("global") => Space::Global,
            Some("shared") => {
                self.drop_all(&["cta"]);
                Space::Shared
            }
            Some("local") => Space::Local,
            Some("param") => Space::Param,
            Some("const") => Space::Const,
            _ => Space::Generic,
        }
    }
    /// The single remaining modifier, a type.
    fn ty(&self) -> Option<Ty> {
        match self.0.as_slice() {
            [t] => Ty::parse(t),
            _ => None,
        }
    }
    /// The two remaining modifiers, both types.
    fn ty2(&self) -> Option<(Ty, Ty)> {
        match self.0.as_slice() {
            [a, b] => Some((Ty::parse(a)?, Ty::parse(b)?)),
            _ => None,
        }
    }
}

fn n_ops(ops: &[Raw], n: usize) -> Result<(), Option<ParseError>> {
    if ops.len() == n {
        Ok(())
    } else {
        Err(None)
    }
}

/// The sources `ops[1..=N]` (after the destination) as the types `tys`, in order.
fn srcs<const N: usize>(
    p: &mut Parser,
    ops: &[Raw],
    tys: [Ty; N],
    line: usize,
) -> Result<[Slot; N], ParseError> {
    let mut out = [SINK; N];
    for (i, ty) in tys.into_iter().enumerate() {
        out[i] = p.src(&ops[i + 1], ty, line)?;
    }
    Ok(out)
}

/// `op` is supported only in its `.sync` form.
fn need_sync(m: &mut Mods, op: &str, line: usize) -> Result<(), Option<ParseError>> {
    if m.has("sync") {
        return Ok(());
    }
    Err(Some(ParseError {
        line,
        message: format!("{op} without .sync is not supported"),
    }))
}

fn done(op: Op) -> R {
    Ok(Decoded::Op(op))
}

fn cmp(s: &str) -> Option<Cmp> {
    Some(match s {
        "eq" => Cmp::Eq,
        "ne" => Cmp::Ne,
        "lt" => Cmp::Lt,
        "le" => Cmp::Le,
        "gt" => Cmp::Gt,
        "ge" => Cmp::Ge,
        "lo" => Cmp::Lo,
        "ls" => Cmp::Ls,
        "hi" => Cmp::Hi,
        "hs" => Cmp::Hs,
        "equ" => Cmp::Equ,
        "neu" => Cmp::Neu,
        "ltu" => Cmp::Ltu,
        "leu" => Cmp::Leu,
        "gtu" => Cmp::Gtu,
        "geu" => Cmp::Geu,
        "num" => Cmp::Num,
        "nan" => Cmp::Nan,
        _ => return None,
    })
}

fn mask(ty: Ty) -> u64 {
    match ty.bits() {
        64 => u64::MAX,
        b => (1u64 << b) - 1,
    }
}

/// Decodes `base.mods... ops`.
pub(crate) fn decode(p: &mut Parser, base: &str, mods: &[&str], ops: &[Raw], line: usize) -> R {
    let mut m = Mods(mods.to_vec());
    match base {
        "add" | "sub" | "mul" | "div" | "rem" | "min" | "max" | "and" | "or" | "xor" | "shl"
        | "shr" | "mul24" | "copysign" => binary(p, base, &mut m, ops, line),
        "abs" | "neg" | "not" | "cnot" | "popc" | "clz" | "brev" | "bfind" | "sqrt" | "rcp"
        | "rsqrt" | "ex2" | "lg2" | "sin" | "cos" | "tanh" => unary(p, base, &mut m, ops, line),
        "addc" | "subc" => {
            n_ops(ops, 3)?;
            let cc = m.has("cc");
            let ty = m.ty().ok_or(None)?;
            if !matches!(ty, Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64) {
                return Err(None);
            }
            let d = p.dst(&ops[0], line)?;
            let [a, b] = srcs(p, ops, [ty, ty], line)?;
            done(Op::AddCc {
                carry_in: true,
                carry_out: cc,
                ty,
                sub: base == "subc",
                d,
                a,
                b,
            })
        }
        "mad" | "fma" | "mad24" | "madc" => mad(p, base, &mut m, ops, line),
        "mma" => mma(p, &mut m, ops, line),
        "bfe" => {
            n_ops(ops, 4)?;
            let ty = m.ty().ok_or(None)?;
            if !matches!(ty, Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64) {
                return Err(None);
            }
            let d = p.dst(&ops[0], line)?;
            let [a, b, c] = srcs(p, ops, [ty, Ty::U32, Ty::U32], line)?;
            done(Op::Bfe { ty, d, a, b, c })
        }
        "bfi" => {
            n_ops(ops, 5)?;
            let ty = m.ty().ok_or(None)?;
            if !matches!(ty, Ty::B32 | Ty::B64) {
                return Err(None);
            }
            let d = p.dst(&ops[0], line)?;
            let [f, a, b, c] = srcs(p, ops, [ty, ty, Ty::U32, Ty::U32], line)?;
            done(Op::Bfi { ty, d, f, a, b, c })
        }
        "prmt" => {
            n_ops(ops, 4)?;
            let mode = match m.any(&["f4e", "b4e", "rc8", "ecl", "ecr", "rc16"]) {
                None => 0,
                Some("f4e") => 1,
                Some("b4e") => 2,
                Some("rc8") => 3,
                Some("ecl") => 4,
                Some("ecr") => 5,
                Some(_) => 6,
            };
            if m.ty() != Some(Ty::B32) {
                return Err(None);
            }
            let d = p.dst(&ops[0], line)?;
            let [a, b, c] = srcs(p, ops, [Ty::B32; 3], line)?;
            done(Op::Prmt { mode, d, a, b, c })
        }
        "sad" => {
            n_ops(ops, 4)?;
            let ty = m.ty().ok_or(None)?;
            if !matches!(
                ty,
                Ty::U16 | Ty::S16 | Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64
            ) {
                return Err(None);
            }
            let d = p.dst(&ops[0], line)?;
            // c is unsigned in PTX; an immediate is read by its width alone, so `ty` serves.
            let [a, b, c] = srcs(p, ops, [ty; 3], line)?;
            done(Op::Sad { ty, d, a, b, c })
        }
        "szext" | "bmsk" => {
            n_ops(ops, 3)?;
            let clamp = match m.any(&["wrap", "clamp"]) {
                Some("clamp") => true,
                Some(_) => false,
                None => return Err(None),
            };
            let ty = m.ty().ok_or(None)?;
            let d = p.dst(&ops[0], line)?;
            let [a, b] = srcs(p, ops, [ty, Ty::U32], line)?;
            match (base, ty) {
                ("szext", Ty::U32 | Ty::S32) => done(Op::Szext {
                    signed: ty == Ty::S32,
                    clamp,
                    d,
                    a,
                    b,
                }),
                ("bmsk", Ty::B32) => done(Op::Bmsk { clamp, d, a, b }),
                _ => Err(None),
            }
        }
        "fns" => {
            n_ops(ops, 4)?;
            if m.ty() != Some(Ty::B32) {
                return Err(None);
            }
            let d = p.dst(&ops[0], line)?;
            let [mask, base, off] = srcs(p, ops, [Ty::B32, Ty::U32, Ty::S32], line)?;
            done(Op::Fns { d, mask, base, off })
        }
        "dp4a" | "dp2a" => {
            n_ops(ops, 4)?;
            let half = if base == "dp2a" {
                match m.any(&["lo", "hi"]) {
                    Some("lo") => Some(false),
                    Some(_) => Some(true),
                    None => return Err(None),
                }
            } else {
                None
            };
            let (ta, tb) = m.ty2().ok_or(None)?;
            if !matches!(ta, Ty::U32 | Ty::S32) || !matches!(tb, Ty::U32 | Ty::S32) {
                return Err(None);
            }
            let d = p.dst(&ops[0], line)?;
            // c is .s32 or .u32 by the sources' signs: 32 bits of an immediate either way.
            let [a, b, c] = srcs(p, ops, [ta, tb, Ty::B32], line)?;
            done(Op::Dp {
                half,
                a_signed: ta == Ty::S32,
                b_signed: tb == Ty::S32,
                d,
                a,
                b,
                c,
            })
        }
        "lop3" => {
            n_ops(ops, 5)?;
            if m.ty() != Some(Ty::B32) {
                return Err(None);
            }
            let Raw::Imm(crate::parse::Imm::Int(lut)) = ops[4] else {
                return Err(Some(ParseError {
                    line,
                    message: "lop3 needs an immediate table".into(),
                }));
            };
            let d = p.dst(&ops[0], line)?;
            let [a, b, c] = srcs(p, ops, [Ty::B32; 3], line)?;
            done(Op::Lop3 {
                d,
                a,
                b,
                c,
                lut: lut as u8,
            })
        }
        "shf" => {
            n_ops(ops, 4)?;
            let left = match m.any(&["l", "r"]) {
                Some("l") => true,
                Some(_) => false,
                None => return Err(None),
            };
            let clamp = match m.any(&["clamp", "wrap"]) {
                Some("clamp") => true,
                Some(_) => false,
                None => return Err(None),
            };
            if m.ty() != Some(Ty::B32) {
                return Err(None);
            }
            let d = p.dst(&ops[0], line)?;
            let [a, b, c] = srcs(p, ops, [Ty::B32, Ty::B32, Ty::U32], line)?;
            done(Op::Shf {
                left,
                clamp,
                d,
                a,
                b,
                c,
            })
        }
        "testp" => {
            n_ops(ops, 2)?;
            let op = match m.any(&[
                "finite",
                "infinite",
                "number",
                "notanumber",
                "normal",
                "subnormal",
            ]) {
                Some("finite") => 0,
                Some("infinite") => 1,
                Some("number") => 2,
                Some("notanumber") => 3,
                Some("normal") => 4,
                Some(_) => 5,
                None => return Err(None),
            };
            let ty = m
                .ty()
                .filter(|t| matches!(t, Ty::F32 | Ty::F64))
                .ok_or(None)?;
            let (d, a) = (p.dst(&ops[0], line)?, p.src(&ops[1], ty, line)?);
            done(Op::Testp { op, ty, d, a })
        }
        "setp" => setp(p, &mut m, ops, line),
        "selp" => {
            n_ops(ops, 4)?;
            let ty = m.ty().ok_or(None)?;
            let d = p.dst(&ops[0], line)?;
            let [a, b] = srcs(p, ops, [ty, ty], line)?;
            let (c, neg) = p.pred_src(&ops[3], line)?;
            if neg {
                return Err(None);
            }
            done(Op::Selp {
                mask: mask(ty),
                d,
                a,
                b,
                p: c,
            })
        }
        "slct" => {
            n_ops(ops, 4)?;
            let ftz = m.has("ftz");
            let (ty, cty) = m.ty2().ok_or(None)?;
            if !matches!(cty, Ty::S32 | Ty::F32) {
                return Err(None);
            }
            let d = p.dst(&ops[0], line)?;
            let [a, b, c] = srcs(p, ops, [ty, ty, cty], line)?;
            done(Op::Slct {
                ty,
                cty,
                ftz,
                d,
                a,
                b,
                c,
            })
        }
        "mov" => mov(p, &mut m, ops, line),
        "cvt" => {
            let rnd = m.rnd();
            let ftz = m.has("ftz");
            let sat = m.has("sat");
            let (dty, sty) = m.ty2().ok_or(None)?;
            if let (Some(fmt), true) = (dty.half(), dty.packed()) {
                // cvt.frnd.{f16x2,bf16x2}.f32 d, a, b: only the rounding modes (no .relu,
                // .satfinite), and one is required.
                n_ops(ops, 3)?;
                if sty != Ty::F32 || ftz || sat || matches!(rnd, Rnd::Default) {
                    return Err(None);
                }
                let d = p.dst(&ops[0], line)?;
                let [a, b] = srcs(p, ops, [Ty::F32, Ty::F32], line)?;
                return done(Op::CvtPack { fmt, rnd, d, a, b });
            }
            n_ops(ops, 2)?;
            // (A packed destination took the branch above.)
            if dty == Ty::Pred || sty == Ty::Pred || sty.packed() {
                return Err(None);
            }
            let (d, a) = (p.dst(&ops[0], line)?, p.src(&ops[1], sty, line)?);
            done(Op::Cvt {
                dty,
                sty,
                rnd,
                sat,
                ftz,
                d,
                a,
            })
        }
        "cvta" => {
            n_ops(ops, 2)?;
            let to = m.has("to");
            let space = m.space();
            if !matches!(
                space,
                Space::Global | Space::Shared | Space::Local | Space::Const | Space::Param
            ) {
                return Err(None);
            }
            let ty = m.ty().ok_or(None)?;
            if !matches!(ty, Ty::U32 | Ty::U64 | Ty::B32 | Ty::B64) {
                return Err(None);
            }
            let (d, a) = (p.dst(&ops[0], line)?, p.src(&ops[1], ty, line)?);
            done(Op::Cvta {
                to,
                space,
                bits32: ty.bits() == 32,
                d,
                a,
            })
        }
        "ld" | "ldu" | "st" => ld_st(p, base == "st", &mut m, ops, line),
        "atom" | "red" => atom(p, base == "red", &mut m, ops, line),
        "bra" | "brx" => {
            m.drop_all(&["uni"]);
            if !m.0.is_empty() || base == "brx" {
                return Err(None);
            }
            match ops {
                [Raw::Name(l)] => Ok(Decoded::Branch(l.clone())),
                _ => Err(Some(ParseError {
                    line,
                    message: "bra needs a label".into(),
                })),
            }
        }
        "call" => {
            m.drop_all(&["uni"]);
            if !m.0.is_empty() {
                return Err(None);
            }
            p.call_operands(ops, line)
        }
        "ret" | "exit" | "trap" => {
            m.drop_all(&["uni"]);
            if !m.0.is_empty() || !ops.is_empty() {
                return Err(None);
            }
            done(match base {
                "ret" => Op::Ret,
                "exit" => Op::Exit,
                _ => Op::Trap,
            })
        }
        "bar" | "barrier" => {
            if m.has("warp") {
                if !m.has("sync") || !m.0.is_empty() || ops.len() != 1 {
                    return Err(None);
                }
                let mask = p.src(&ops[0], Ty::U32, line)?;
                return done(Op::WarpSync { mask });
            }
            let aligned = base == "bar" || m.has("aligned");
            m.drop_all(&["cta"]);
            if m.has("red") {
                // bar.red.popc.u32 d, a{, b}, {!}c; bar.red.{and,or}.pred p, a{, b}, {!}c.
                let (op, ty) = match m.any(&["popc", "and", "or"]) {
                    Some("popc") => (BarRedOp::Popc, Ty::U32),
                    Some("and") => (BarRedOp::And, Ty::Pred),
                    Some(_) => (BarRedOp::Or, Ty::Pred),
                    None => return Err(None),
                };
                if m.ty() != Some(ty) || !(3..=4).contains(&ops.len()) {
                    return Err(None);
                }
                let d = p.dst(&ops[0], line)?;
                let id = p.src(&ops[1], Ty::U32, line)?;
                let count = match ops.len() {
                    4 => p.src(&ops[2], Ty::U32, line)?,
                    _ => SINK,
                };
                let (c, neg) = p.pred_src(&ops[ops.len() - 1], line)?;
                let red = Some(BarRed { op, d, c, neg });
                return done(Op::Bar {
                    id,
                    count,
                    aligned,
                    red,
                });
            }
            // {bar,barrier}{.cta}.sync{.aligned} a{, b}; `.arrive` is not implemented.
            if !m.has("sync") || !m.0.is_empty() || !(1..=2).contains(&ops.len()) {
                return Err(None);
            }
            let id = p.src(&ops[0], Ty::U32, line)?;
            let count = match ops.get(1) {
                Some(c) => p.src(c, Ty::U32, line)?,
                None => SINK,
            };
            done(Op::Bar {
                id,
                count,
                aligned,
                red: None,
            })
        }
        "membar" | "fence" => {
            m.drop_all(&[
                "cta", "gl", "sys", "gpu", "sc", "acq_rel", "proxy", "alias", "cluster",
            ]);
            if !m.0.is_empty() || !ops.is_empty() {
                return Err(None);
            }
            done(Op::Nop)
        }
        "prefetch" | "prefetchu" | "nanosleep" | "pmevent" => done(Op::Nop),
        "shfl" => {
            need_sync(&mut m, "shfl", line)?;
            let mode = match m.any(&["up", "down", "bfly", "idx"]) {
                Some("up") => ShflMode::Up,
                Some("down") => ShflMode::Down,
                Some("bfly") => ShflMode::Bfly,
                Some(_) => ShflMode::Idx,
                None => return Err(None),
            };
            if m.ty() != Some(Ty::B32) || ops.len() != 5 {
                return Err(None);
            }
            let (d, pd) = match &ops[0] {
                Raw::Pair(a, b) => (
                    p.dst(&Raw::Name(a.clone()), line)?,
                    p.dst(&Raw::Name(b.clone()), line)?,
                ),
                r => (p.dst(r, line)?, SINK),
            };
            let [a, b, c, mask] = srcs(p, ops, [Ty::B32; 4], line)?;
            done(Op::Shfl {
                mode,
                d,
                p: pd,
                a,
                b,
                c,
                mask,
            })
        }
        "vote" => {
            need_sync(&mut m, "vote", line)?;
            let mode = match m.any(&["all", "any", "uni", "ballot"]) {
                Some("all") => VoteMode::All,
                Some("any") => VoteMode::Any,
                Some("uni") => VoteMode::Uni,
                Some(_) => VoteMode::Ballot,
                None => return Err(None),
            };
            let want = if mode == VoteMode::Ballot {
                Ty::B32
            } else {
                Ty::Pred
            };
            if m.ty() != Some(want) {
                return Err(None);
            }
            n_ops(ops, 3)?;
            let d = p.dst(&ops[0], line)?;
            let (a, neg) = p.pred_src(&ops[1], line)?;
            let mask = p.src(&ops[2], Ty::B32, line)?;
            done(Op::Vote {
                mode,
                d,
                a,
                neg,
                mask,
            })
        }
        "activemask" => {
            n_ops(ops, 1)?;
            if m.ty() != Some(Ty::B32) {
                return Err(None);
            }
            done(Op::Activemask {
                d: p.dst(&ops[0], line)?,
            })
        }
        _ => Err(None),
    }
}

fn binary(p: &mut Parser, base: &str, m: &mut Mods, ops: &[Raw], line: usize) -> R {
    n_ops(ops, 3)?;
    let rnd = m.rnd();
    let ftz = m.has("ftz");
    let sat = m.has("sat");
    let approx = m.has("approx");
    let full = m.has("full");
    let cc = m.has("cc");
    let nan = m.has("NaN");
    let relu = m.has("relu");
    let lohi = m.any(&["lo", "hi", "wide"]);
    let ty = m.ty().ok_or(None)?;
    let d = p.dst(&ops[0], line)?;
    if let Some(fmt) = ty.half() {
        let op = match base {
            "add" => HalfOp::Add,
            "sub" => HalfOp::Sub,
            "mul" => HalfOp::Mul,
            _ => return Err(None),
        };
        // .ftz, .sat and .relu are not implemented: refused, not ignored; .rn is the one rounding.
        if ftz
            || sat
            || relu
            || approx
            || full
            || nan
            || cc
            || lohi.is_some()
            || !matches!(rnd, Rnd::Default | Rnd::Rn)
        {
            return Err(None);
        }
        let [a, b] = srcs(p, ops, [ty, ty], line)?;
        let lanes = if ty.packed() { 2 } else { 1 };
        return done(Op::HalfArith {
            op,
            fmt,
            lanes,
            rnd,
            d,
            a,
            b,
            c: b,
        });
    }
    if ty.float() {
        if lohi.is_some() || cc {
            return Err(None);
        }
        let op = match base {
            "add" => FOp::Add,
            "sub" => FOp::Sub,
            "mul" => FOp::Mul,
            "div" => FOp::Div,
            "min" if nan => FOp::MinNan,
            "max" if nan => FOp::MaxNan,
            "min" => FOp::Min,
            "max" => FOp::Max,
            "copysign" => FOp::Copysign,
            _ => return Err(None),
        };
        if relu || (nan && !matches!(op, FOp::MinNan | FOp::MaxNan)) {
            return Err(None);
        }
        let [a, b] = srcs(p, ops, [ty, ty], line)?;
        if op == FOp::Add && !ftz && !sat && matches!(rnd, Rnd::Default | Rnd::Rn) && ty == Ty::F32
        {
            return done(Op::AddF32 { d, a, b });
        }
        if op == FOp::Mul && !ftz && !sat && matches!(rnd, Rnd::Default | Rnd::Rn) && ty == Ty::F32
        {
            return done(Op::MulF32 { d, a, b });
        }
        return done(Op::FBin {
            op,
            ty,
            rnd,
            ftz,
            sat,
            d,
            a,
            b,
        });
    }
    if rnd != Rnd::Default || ftz || approx || full || nan {
        return Err(None);
    }
    let op = match (base, lohi) {
        ("add", None) if sat => IOp::AddSat,
        ("sub", None) if sat => IOp::SubSat,
        ("add", None) => IOp::Add,
        ("sub", None) => IOp::Sub,
        ("mul", Some("lo")) => IOp::MulLo,
        ("mul", Some("hi")) => IOp::MulHi,
        ("mul", Some("wide")) => IOp::MulWide,
        ("mul24", Some("lo")) => IOp::Mul24Lo,
        ("mul24", Some("hi")) => IOp::Mul24Hi,
        ("div", None) => IOp::Div,
        ("rem", None) => IOp::Rem,
        ("min", None) if relu => IOp::MinRelu,
        ("max", None) if relu => IOp::MaxRelu,
        _ if relu => return Err(None),
        ("min", None) => IOp::Min,
        ("max", None) => IOp::Max,
        ("and", None) => IOp::And,
        ("or", None) => IOp::Or,
        ("xor", None) => IOp::Xor,
        ("shl", None) => IOp::Shl,
        ("shr", None) => IOp::Shr,
        _ => return Err(None),
    };
    if !int_typed(op, ty) || sat && !matches!(op, IOp::AddSat | IOp::SubSat) {
        return Err(None);
    }
    let bty = if matches!(op, IOp::Shl | IOp::Shr) {
        Ty::U32
    } else {
        ty
    };
    let [a, b] = srcs(p, ops, [ty, bty], line)?;
    if cc {
        if !matches!(op, IOp::Add | IOp::Sub) || !matches!(ty.bits(), 32 | 64) {
            return Err(None);
        }
        return done(Op::AddCc {
            carry_in: false,
            carry_out: true,
            ty,
            sub: op == IOp::Sub,
            d,
            a,
            b,
        });
    }
    if op == IOp::Add && ty.bits() == 32 {
        return done(Op::AddI32 { d, a, b });
    }
    if op == IOp::Add && ty.bits() == 64 {
        return done(Op::AddI64 { d, a, b });
    }
    done(Op::IBin { op, ty, d, a, b })
}

/// Whether the PTX ISA gives integer operation `op` type `ty` (ptxas refuses the others).
fn int_typed(op: IOp, ty: Ty) -> bool {
    let bits = matches!(ty, Ty::B16 | Ty::B32 | Ty::B64);
    let arith = matches!(
        ty,
        Ty::U16 | Ty::U32 | Ty::U64 | Ty::S16 | Ty::S32 | Ty::S64
    );
    match op {
        IOp::And | IOp::Or | IOp::Xor => bits || ty == Ty::Pred,
        IOp::Shl => bits,
        IOp::Shr => bits || arith,
        IOp::AddSat | IOp::SubSat | IOp::MinRelu | IOp::MaxRelu => ty == Ty::S32,
        IOp::Mul24Lo | IOp::Mul24Hi => matches!(ty, Ty::U32 | Ty::S32),
        IOp::MulWide => arith && ty.bits() <= 32,
        IOp::Add
        | IOp::Sub
        | IOp::MulLo
        | IOp::MulHi
        | IOp::Div
        | IOp::Rem
        | IOp::Min
        | IOp::Max => arith,
    }
}

fn unary(p: &mut Parser, base: &str, m: &mut Mods, ops: &[Raw], line: usize) -> R {
    n_ops(ops, 2)?;
    let rnd = m.rnd();
    let ftz = m.has("ftz");
    let approx = m.has("approx");
    let shiftamt = base == "bfind" && m.has("shiftamt");
    m.drop_all(&["full"]);
    let ty = m.ty().ok_or(None)?;
    // No 16-bit float form is implemented; a packed one would otherwise pass as an integer.
    if ty.half().is_some() {
        return Err(None);
    }
    let d = p.dst(&ops[0], line)?;
    if ty.float() {
        let op = match base {
            "abs" => FUn::Abs,
            "neg" => FUn::Neg,
            "sqrt" => FUn::Sqrt,
            "rcp" => FUn::Rcp,
            "rsqrt" => FUn::Rsqrt,
            "ex2" => FUn::Ex2,
            "lg2" => FUn::Lg2,
            "sin" => FUn::Sin,
            "cos" => FUn::Cos,
            "tanh" => FUn::Tanh,
            _ => return Err(None),
        };
        let a = p.src(&ops[1], ty, line)?;
        return done(Op::FUn {
            op,
            ty,
            rnd,
            ftz,
            d,
            a,
        });
    }
    if rnd != Rnd::Default || ftz || approx {
        return Err(None);
    }
    let op = match base {
        "abs" => IUn::Abs,
        "neg" => IUn::Neg,
        "not" => IUn::Not,
        "cnot" => IUn::Cnot,
        "popc" => IUn::Popc,
        "clz" => IUn::Clz,
        "brev" => IUn::Brev,
        "bfind" if shiftamt => IUn::BfindShift,
        "bfind" => IUn::Bfind,
        _ => return Err(None),
    };
    // The types the PTX ISA gives each (ptxas refuses the others).
    let typed = match op {
        IUn::Abs | IUn::Neg => matches!(ty, Ty::S16 | Ty::S32 | Ty::S64),
        IUn::Not => matches!(ty, Ty::Pred | Ty::B16 | Ty::B32 | Ty::B64),
        IUn::Cnot => matches!(ty, Ty::B16 | Ty::B32 | Ty::B64),
        IUn::Popc | IUn::Clz | IUn::Brev => matches!(ty, Ty::B32 | Ty::B64),
        IUn::Bfind | IUn::BfindShift => matches!(ty, Ty::U32 | Ty::U64 | Ty::S32 | Ty::S64),
    };
    if !typed {
        return Err(None);
    }
    let a = p.src(&ops[1], ty, line)?;
    done(Op::IUn { op, ty, d, a })
}

fn mad(p: &mut Parser, base: &str, m: &mut Mods, ops: &[Raw], line: usize) -> R {
    n_ops(ops, 4)?;
    let rnd = m.rnd();
    let ftz = m.has("ftz");
    let sat = m.has("sat");
    let cc = m.has("cc");
    let lohi = m.any(&["lo", "hi", "wide"]);
    let ty = m.ty().ok_or(None)?;
    let d = p.dst(&ops[0], line)?;
    if cc || base == "madc" {
        // Extended-precision multiply-add: mad{c}.{lo,hi}{.cc}.{u32,s32,u64,s64}.
        let hi = match lohi {
            Some("lo") => false,
            Some("hi") => true,
            _ => return Err(None),
        };
        if sat || ftz || rnd != Rnd::Default || !matches!(ty, Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64)
        {
            return Err(None);
        }
        let [a, b, c] = srcs(p, ops, [ty; 3], line)?;
        return done(Op::MadCc {
            hi,
            carry_in: base == "madc",
            carry_out: cc,
            ty,
            d,
            a,
            b,
            c,
        });
    }
    if let Some(fmt) = ty.half() {
        // fma.rn{.ftz}{.sat}{.relu}.{f16,f16x2,bf16,bf16x2}: the rounding is required.
        if base != "fma" || ftz || sat || m.has("relu") || lohi.is_some() || rnd != Rnd::Rn {
            return Err(None);
        }
        let [a, b, c] = srcs(p, ops, [ty; 3], line)?;
        let lanes = if ty.packed() { 2 } else { 1 };
        return done(Op::HalfArith {
            op: HalfOp::Fma,
            fmt,
            lanes,
            rnd,
            d,
            a,
            b,
            c,
        });
    }
    if ty.float() {
        if lohi.is_some() || base == "mad24" {
            return Err(None);
        }
        let [a, b, c] = srcs(p, ops, [ty; 3], line)?;
        if ty == Ty::F32 && !ftz && !sat && matches!(rnd, Rnd::Rn | Rnd::Default) {
            return done(Op::FmaF32 { d, a, b, c });
        }
        return done(Op::Fma {
            ty,
            rnd,
            ftz,
            sat,
            d,
            a,
            b,
            c,
        });
    }
    if base == "fma" || rnd != Rnd::Default || ftz {
        return Err(None);
    }
    let mul = match (base, lohi) {
        ("mad", Some("lo")) => IOp::MulLo,
        ("mad", Some("hi")) => IOp::MulHi,
        ("mad", Some("wide")) => IOp::MulWide,
        ("mad24", Some("lo")) => IOp::Mul24Lo,
        ("mad24", Some("hi")) => IOp::Mul24Hi,
        _ => return Err(None),
    };
    if !int_typed(mul, ty) {
        return Err(None);
    }
    if sat && !(ty == Ty::S32 && matches!(mul, IOp::MulHi | IOp::Mul24Hi)) {
        return Err(None);
    }
    let cty = if mul == IOp::MulWide { wide(ty) } else { ty };
    let [a, b, c] = srcs(p, ops, [ty, ty, cty], line)?;
    done(Op::Mad {
        mul,
        ty,
        sat,
        d,
        a,
        b,
        c,
    })
}

/// The double-width type of `.wide` results.
pub(crate) fn wide(ty: Ty) -> Ty {
    match ty {
        Ty::S16 => Ty::S32,
        Ty::S32 => Ty::S64,
        Ty::U16 | Ty::B16 => Ty::U32,
        _ => Ty::U64,
    }
}

fn setp(p: &mut Parser, m: &mut Mods, ops: &[Raw], line: usize) -> R {
    let c = m.0.first().and_then(|s| cmp(s)).ok_or(None)?;
    m.0.remove(0);
    let comb = match m.any(&["and", "or", "xor"]) {
        Some("and") => Some(BoolOp::And),
        Some("or") => Some(BoolOp::Or),
        Some("xor") => Some(BoolOp::Xor),
        _ => None,
    };
    let ftz = m.has("ftz");
    let ty = m.ty().ok_or(None)?;
    if ty == Ty::Pred || ty.half().is_some() {
        return Err(None);
    }
    if !ty.float()
        && !matches!(
            c,
            Cmp::Eq
                | Cmp::Ne
                | Cmp::Lt
                | Cmp::Le
                | Cmp::Gt
                | Cmp::Ge
                | Cmp::Lo
                | Cmp::Ls
                | Cmp::Hi
                | Cmp::Hs
        )
    {
        return Err(None);
    }
    if ty.float() && matches!(c, Cmp::Lo | Cmp::Ls | Cmp::Hi | Cmp::Hs) {
        return Err(None);
    }
    let want = if comb.is_some() { 4 } else { 3 };
    n_ops(ops, want)?;
    let (d, dn) = match &ops[0] {
        Raw::Pair(a, b) => (
            p.dst(&Raw::Name(a.clone()), line)?,
            p.dst(&Raw::Name(b.clone()), line)?,
        ),
        r => (p.dst(r, line)?, SINK),
    };
    let [a, b] = srcs(p, ops, [ty, ty], line)?;
    let comb = match comb {
        Some(op) => {
            let (s, neg) = p.pred_src(&ops[3], line)?;
            Some((op, s, neg))
        }
        None => None,
    };
    done(Op::Setp {
        cmp: c,
        ty,
        ftz,
        d,
        dn,
        a,
        b,
        comb,
    })
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 {d}, {a}, {b}, {c}`, the
/// one shape and types implemented (the tensor-core product of 16-bit inputs with f32
/// accumulation); any other is refused by name.
fn mma(p: &mut Parser, m: &mut Mods, ops: &[Raw], line: usize) -> R {
    n_ops(ops, 4)?;
    need_sync(m, "mma", line)?;
    let fmt = match m.0.as_slice() {
        ["aligned", "m16n8k16", "row", "col", "f32", "f16", "f16", "f32"] => {
            crate::float::Half::F16
        }
        ["aligned", "m16n8k16", "row", "col", "f32", "bf16", "bf16", "f32"] => {
            crate::float::Half::Bf16
        }
        _ => return Err(None),
    };
    let names = |raw: &Raw, n: usize| -> Result<Vec<String>, Option<ParseError>> {
        match raw {
            Raw::Vec(v) if v.len() == n => Ok(v.clone()),
            _ => Err(None),
        }
    };
    let (dn, an, bn, cn) = (
        names(&ops[0], 4)?,
        names(&ops[1], 4)?,
        names(&ops[2], 2)?,
        names(&ops[3], 4)?,
    );
    let (mut d, mut a, mut b, mut c) = ([SINK; 4], [SINK; 4], [SINK; 2], [SINK; 4]);
    for i in 0..4 {
        d[i] = p.dst(&Raw::Name(dn[i].clone()), line)?;
        a[i] = p.src(&Raw::Name(an[i].clone()), Ty::B32, line)?;
        c[i] = p.src(&Raw::Name(cn[i].clone()), Ty::F32, line)?;
    }
    for i in 0..2 {
        b[i] = p.src(&Raw::Name(bn[i].clone()), Ty::B32, line)?;
    }
    done(Op::Mma { fmt, d, a, b, c })
}

/// The `{a, b}` or `{a, b, c, d}` parts of a `mov` packing or unpacking a `ty` register: bits
/// a part, the parts' slots (by `slot`, in order) and how many.
fn mov_parts(
    v: &[String],
    ty: Ty,
    mut slot: impl FnMut(&String) -> Result<Slot, ParseError>,
) -> Result<(u32, [Slot; 4], u8), Option<ParseError>> {
    let n = v.len();
    if !matches!(n, 2 | 4) || ty.bits() < 16 || ty.float() {
        return Err(None);
    }
    let mut slots = [SINK; 4];
    for (i, name) in v.iter().enumerate() {
        slots[i] = slot(name)?;
    }
    Ok((ty.bits() / n as u32, slots, n as u8))
}

fn mov(p: &mut Parser, m: &mut Mods, ops: &[Raw], line: usize) -> R {
    n_ops(ops, 2)?;
    let ty = m.ty().ok_or(None)?;
    match (&ops[0], &ops[1]) {
        (Raw::Vec(v), src) => {
            let (bits, dsts, n) = mov_parts(v, ty, |name| p.dst(&Raw::Name(name.clone()), line))?;
            let a = p.src(src, ty, line)?;
            done(Op::Unpack { bits, dsts, n, a })
        }
        (dst, Raw::Vec(v)) => {
            let (bits, srcs, n) = mov_parts(v, ty, |name| p.name_src(name, line))?;
            let d = p.dst(dst, line)?;
            done(Op::Pack { bits, d, srcs, n })
        }
        (dst, src) => {
            let d = p.dst(dst, line)?;
            if Parser::clock_name(src) {
                return done(Op::Clock { d });
            }
            let a = p.src(src, ty, line)?;
            done(Op::Mov {
                d,
                a,
                mask: mask(ty),
            })
        }
    }
}

fn ld_st(p: &mut Parser, st: bool, m: &mut Mods, ops: &[Raw], line: usize) -> R {
    n_ops(ops, 2)?;
    m.drop_all(&[
        "nc",
        "volatile",
        "relaxed",
        "weak",
        "ca",
        "cg",
        "cs",
        "lu",
        "cv",
        "wb",
        "wt",
        "gpu",
        "sys",
        "cta",
        "L1::evict_normal",
        "L1::evict_last",
        "L1::no_allocate",
        "L2::64B",
        "L2::128B",
        "L2::256B",
        "L1::evict_first",
        "L2::evict_first",
        "L2::evict_last",
        "L2::evict_normal",
    ]);
    let space = m.space();
    let n = match m.any(&["v2", "v4"]) {
        Some("v2") => 2,
        Some(_) => 4,
        None => 1,
    };
    let ty = m.ty().ok_or(None)?;
    if ty == Ty::Pred || (st && space == Space::Const) {
        return Err(None);
    }
    let (regs, addr) = if st {
        (&ops[1], &ops[0])
    } else {
        (&ops[0], &ops[1])
    };
    let addr = p.addr(addr, line)?;
    let mut slots = [SINK; 4];
    match (regs, n) {
        (Raw::Vec(v), n) if v.len() == n && n > 1 => {
            for (i, name) in v.iter().enumerate() {
                slots[i] = if st {
                    p.src(&Raw::Name(name.clone()), ty, line)?
                } else {
                    p.dst(&Raw::Name(name.clone()), line)?
                };
            }
        }
        (r, 1) => {
            slots[0] = if st {
                p.src(r, ty, line)?
            } else {
                p.dst(r, line)?
            }
        }
        _ => {
            return Err(Some(ParseError {
                line,
                message: "vector width and operand mismatch".into(),
            }))
        }
    }
    if space == Space::Shared && n == 1 {
        if st && ty.bits() == 32 && !ty.float() || st && ty == Ty::F32 {
            return done(Op::StShared32 { s: slots[0], addr });
        }
        if !st && matches!(ty, Ty::U32 | Ty::B32 | Ty::F32) {
            return done(Op::LdShared32 { d: slots[0], addr });
        }
    }
    let at = Access {
        space,
        ty,
        n: n as u8,
        base: addr.base,
        off: addr.off,
    };
    done(if st {
        Op::St { at, s: slots }
    } else {
        Op::Ld { at, d: slots }
    })
}

fn atom(p: &mut Parser, red: bool, m: &mut Mods, ops: &[Raw], line: usize) -> R {
    m.drop_all(&[
        "relaxed", "acquire", "release", "acq_rel", "gpu", "sys", "cta", "noftz",
    ]);
    let space = m.space();
    let op = match m.any(&[
        "add", "min", "max", "inc", "dec", "and", "or", "xor", "exch", "cas",
    ]) {
        Some("add") => AtomOp::Add,
        Some("min") => AtomOp::Min,
        Some("max") => AtomOp::Max,
        Some("inc") => AtomOp::Inc,
        Some("dec") => AtomOp::Dec,
        Some("and") => AtomOp::And,
        Some("or") => AtomOp::Or,
        Some("xor") => AtomOp::Xor,
        Some("exch") => AtomOp::Exch,
        Some(_) => AtomOp::Cas,
        None => return Err(None),
    };
    let ty = m.ty().ok_or(None)?;
    // Packed 16-bit atomics (`add.noftz.f16x2`) are not implemented: refused, not added as
    // integers.
    if !matches!(ty.bits(), 32 | 64) || ty.packed() {
        return Err(None);
    }
    if ty.float() && !matches!(op, AtomOp::Add | AtomOp::Exch | AtomOp::Min | AtomOp::Max) {
        return Err(None);
    }
    if matches!(space, Space::Param | Space::Local | Space::Const) || (red && op == AtomOp::Cas) {
        return Err(None);
    }
    let cas = op == AtomOp::Cas;
    let n = if red {
        2
    } else if cas {
        4
    } else {
        3
    };
    n_ops(ops, n)?;
    let (d, rest) = if red {
        (SINK, ops)
    } else {
        (p.dst(&ops[0], line)?, &ops[1..])
    };
    let addr = p.addr(&rest[0], line)?;
    let bty = if matches!(op, AtomOp::Inc | AtomOp::Dec) {
        Ty::U32
    } else {
        ty
    };
    let b = p.src(&rest[1], bty, line)?;
    let c = if cas {
        p.src(&rest[2], ty, line)?
    } else {
        SINK
    };
    done(Op::Atom {
        space,
        op,
        ty,
        d,
        addr,
        b,
        c,
    })
}
