//! The pre-decoded instruction set the interpreter executes: every operand is a register slot
//! (immediates, symbol addresses and special registers live in slots too), labels are
//! instruction indices, types and modifiers are resolved, so execution does no string work.

/// A register slot index into a thread's register file.
pub(crate) type Slot = u32;

/// A guard slot meaning "no predicate".
pub(crate) const NO_GUARD: Slot = u32::MAX;

/// Value types of instructions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ty {
    B8,
    B16,
    B32,
    B64,
    U8,
    U16,
    U32,
    U64,
    S8,
    S16,
    S32,
    S64,
    F16,
    /// bfloat16.
    Bf16,
    /// Two `.f16` lanes in a 32-bit register (lane 0 in the low half).
    F16x2,
    /// Two `.bf16` lanes.
    Bf16x2,
    F32,
    F64,
    Pred,
}

impl Ty {
    pub(crate) fn parse(s: &str) -> Option<Ty> {
        Some(match s {
            "b8" => Ty::B8,
            "b16" => Ty::B16,
            "b32" => Ty::B32,
            "b64" => Ty::B64,
            "u8" => Ty::U8,
            "u16" => Ty::U16,
            "u32" => Ty::U32,
            "u64" => Ty::U64,
            "s8" => Ty::S8,
            "s16" => Ty::S16,
            "s32" => Ty::S32,
            "s64" => Ty::S64,
            "f16" => Ty::F16,
            "bf16" => Ty::Bf16,
            "f16x2" => Ty::F16x2,
            "bf16x2" => Ty::Bf16x2,
            "f32" => Ty::F32,
            "f64" => Ty::F64,
            "pred" => Ty::Pred,
            _ => return None,
        })
    }
    pub(crate) fn bits(self) -> u32 {
        match self {
            Ty::B8 | Ty::U8 | Ty::S8 => 8,
            Ty::B16 | Ty::U16 | Ty::S16 | Ty::F16 | Ty::Bf16 => 16,
            Ty::B32 | Ty::U32 | Ty::S32 | Ty::F32 | Ty::F16x2 | Ty::Bf16x2 => 32,
            Ty::B64 | Ty::U64 | Ty::S64 | Ty::F64 => 64,
            Ty::Pred => 1,
        }
    }
    pub(crate) fn bytes(self) -> usize {
        (self.bits() as usize).div_ceil(8)
    }
    pub(crate) fn signed(self) -> bool {
        matches!(self, Ty::S8 | Ty::S16 | Ty::S32 | Ty::S64)
    }
    pub(crate) fn float(self) -> bool {
        matches!(self, Ty::F16 | Ty::Bf16 | Ty::F32 | Ty::F64)
    }
    /// The 16-bit format of a 16-bit float type, scalar or packed.
    pub(crate) fn half(self) -> Option<crate::float::Half> {
        match self {
            Ty::F16 | Ty::F16x2 => Some(crate::float::Half::F16),
            Ty::Bf16 | Ty::Bf16x2 => Some(crate::float::Half::Bf16),
            _ => None,
        }
    }
    /// Whether it packs two 16-bit lanes.
    pub(crate) fn packed(self) -> bool {
        matches!(self, Ty::F16x2 | Ty::Bf16x2)
    }
}

/// Rounding modifiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rnd {
    /// None given: the instruction's default (round to nearest even for float results).
    Default,
    Rn,
    Rz,
    Rm,
    Rp,
    Rni,
    Rzi,
    Rmi,
    Rpi,
}

/// State spaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Space {
    Generic,
    Global,
    Shared,
    Local,
    Param,
    Const,
}

/// Integer binary operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IOp {
    Add,
    Sub,
    AddSat,
    SubSat,
    MulLo,
    MulHi,
    MulWide,
    Mul24Lo,
    Mul24Hi,
    Div,
    Rem,
    Min,
    Max,
    /// `min.relu`/`max.relu` (s32): the result clamped below at 0.
    MinRelu,
    MaxRelu,
    And,
    Or,
    Xor,
    Shl,
    Shr,
}

/// Integer unary operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IUn {
    Abs,
    Neg,
    Not,
    Cnot,
    Popc,
    Clz,
    Brev,
    /// Index of the most significant non-sign bit (0xffffffff when none).
    Bfind,
    /// `bfind.shiftamt`: the left shift that makes that bit the most significant.
    BfindShift,
}

/// Float binary operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FOp {
    Add,
    Sub,
    Mul,
    Div,
    Min,
    Max,
    /// `min.NaN`/`max.NaN`: NaN when either input is NaN.
    MinNan,
    MaxNan,
    Copysign,
}

/// Float unary operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FUn {
    Abs,
    Neg,
    Sqrt,
    Rcp,
    Rsqrt,
    Ex2,
    Lg2,
    Sin,
    Cos,
    Tanh,
}

/// Comparisons of setp/selp-style instructions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Lo,
    Ls,
    Hi,
    Hs,
    Equ,
    Neu,
    Ltu,
    Leu,
    Gtu,
    Geu,
    Num,
    Nan,
}

/// Predicate combining operations of setp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BoolOp {
    And,
    Or,
    Xor,
}

/// Atomic operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtomOp {
    Add,
    Min,
    Max,
    Inc,
    Dec,
    And,
    Or,
    Xor,
    Exch,
    Cas,
}

/// Shuffle modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShflMode {
    Up,
    Down,
    Bfly,
    Idx,
}

/// `bar.red.{popc.u32,and.pred,or.pred} d, a{, b}, {!}c`: each released thread's `d` is the
/// reduction of the predicate `c` (negated with `neg`) over the threads the barrier releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BarRed {
    pub op: BarRedOp,
    pub d: Slot,
    pub c: Slot,
    pub neg: bool,
}

/// What `bar.red` computes: how many predicates are true, or whether all or any is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BarRedOp {
    Popc,
    And,
    Or,
}

/// Vote modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VoteMode {
    All,
    Any,
    Uni,
    Ballot,
}

/// A memory operand: the address is `regs[base] + off`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Addr {
    pub base: Slot,
    pub off: i64,
}

/// The memory a (vector) `ld` or `st` accesses: `n` values of `ty` in `space` from
/// `regs[base] + off` on. An [`Addr`]'s two fields rather than an `Addr`: the other three then
/// fill what would be its padding, and an instruction stays 56 bytes (64 with an `Addr`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Access {
    pub space: Space,
    pub ty: Ty,
    pub n: u8,
    pub base: Slot,
    pub off: i64,
}

/// Bytes copied between param areas around a `call`: (from, to, len) in func-param space.
pub(crate) type ParamCopy = (u32, u32, u32);

/// A decoded `call`.
#[derive(Debug, Clone)]
pub(crate) struct CallInfo {
    /// Function index in the module.
    pub func: usize,
    /// Caller argument params copied into the callee's formal params before the call.
    pub args: Vec<ParamCopy>,
    /// Callee return params copied into the caller's params after it returns.
    pub rets: Vec<ParamCopy>,
}

/// One decoded operation.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    // Hot, specialised forms.
    AddI32 {
        d: Slot,
        a: Slot,
        b: Slot,
    },
    AddI64 {
        d: Slot,
        a: Slot,
        b: Slot,
    },
    AddF32 {
        d: Slot,
        a: Slot,
        b: Slot,
    },
    MulF32 {
        d: Slot,
        a: Slot,
        b: Slot,
    },
    FmaF32 {
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
    },
    Mov {
        d: Slot,
        a: Slot,
        mask: u64,
    },
    /// `ld.shared.{u32,b32,f32}` (not vector): the hot load of tiled kernels.
    LdShared32 {
        d: Slot,
        addr: Addr,
    },
    /// `st.shared.{u32,s32,b32,f32}` (not vector).
    StShared32 {
        s: Slot,
        addr: Addr,
    },
    /// An unguarded [`Op::LdShared32`] (`d`, `[base+off]`) and the unguarded [`Op::FmaF32`]
    /// (`fd = fa * fb + fc`) right after it, executed as one: the hot pair of tiled matrix
    /// products. Built over the load's instruction; the fma keeps its own, which branches to it
    /// and the instruction count still see.
    LdSharedFma {
        d: Slot,
        base: Slot,
        off: i32,
        fd: Slot,
        fa: Slot,
        fb: Slot,
        fc: Slot,
    },
    /// A conditional branch on a predicate slot (folded guard).
    BraIf {
        p: Slot,
        neg: bool,
        target: u32,
    },

    IBin {
        op: IOp,
        ty: Ty,
        d: Slot,
        a: Slot,
        b: Slot,
    },
    AddCc {
        carry_in: bool,
        carry_out: bool,
        ty: Ty,
        sub: bool,
        d: Slot,
        a: Slot,
        b: Slot,
    },
    IUn {
        op: IUn,
        ty: Ty,
        d: Slot,
        a: Slot,
    },
    /// mad.lo/hi/wide (and mad24): `d = mulop(a, b) + c`, .sat for s32 hi.
    Mad {
        mul: IOp,
        ty: Ty,
        sat: bool,
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
    },
    /// mad{c}.{lo,hi}{.cc}: `d = (a * b).{lo,hi} + c (+ carry)`, optionally setting the carry.
    MadCc {
        hi: bool,
        carry_in: bool,
        carry_out: bool,
        ty: Ty,
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
    },
    Bfe {
        ty: Ty,
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
    },
    Bfi {
        ty: Ty,
        d: Slot,
        f: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
    },
    Prmt {
        /// 0: the default (selector) mode; 1..=6: f4e, b4e, rc8, ecl, ecr, rc16.
        mode: u8,
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
    },
    /// `sad`: `d = c + |a - b|`.
    Sad {
        ty: Ty,
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
    },
    /// `szext.{wrap,clamp}.{u32,s32}`: sign/zero-extend the low `b` bits of `a`.
    Szext {
        signed: bool,
        clamp: bool,
        d: Slot,
        a: Slot,
        b: Slot,
    },
    /// `bmsk.{wrap,clamp}.b32`: `b` one bits starting at bit `a`.
    Bmsk {
        clamp: bool,
        d: Slot,
        a: Slot,
        b: Slot,
    },
    /// `fns.b32 d, mask, base, offset`: the `offset`-th set bit of `mask` from `base`.
    Fns {
        d: Slot,
        mask: Slot,
        base: Slot,
        off: Slot,
    },
    /// `dp4a` (`half` None) and `dp2a.lo/.hi` (`half` Some(hi)): integer dot products.
    Dp {
        half: Option<bool>,
        a_signed: bool,
        b_signed: bool,
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
    },
    Lop3 {
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
        lut: u8,
    },
    Shf {
        left: bool,
        clamp: bool,
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
    },
    /// `add`, `sub`, `mul` or `fma` of `.f16`, `.bf16` or two packed lanes of either, each lane
    /// rounded once ([`crate::float::half_op`]); `c` is `fma`'s addend (unused otherwise).
    HalfArith {
        op: crate::float::HalfOp,
        fmt: crate::float::Half,
        lanes: u8,
        rnd: Rnd,
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
    },
    /// `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32`: a warp's 16x8 `D =
    /// A (16x16) . B (16x8) + C`, each lane holding its fragments as the PTX ISA lays them out
    /// (A in four `.b32` registers of two 16-bit values, B in two, C and D in four `.f32`).
    Mma {
        fmt: crate::float::Half,
        d: [Slot; 4],
        a: [Slot; 4],
        b: [Slot; 2],
        c: [Slot; 4],
    },
    /// `cvt.frnd.{f16x2,bf16x2}.f32 d, a, b`: `a` rounded into the high lane, `b` into the low.
    CvtPack {
        fmt: crate::float::Half,
        rnd: Rnd,
        d: Slot,
        a: Slot,
        b: Slot,
    },
    FBin {
        op: FOp,
        ty: Ty,
        rnd: Rnd,
        ftz: bool,
        sat: bool,
        d: Slot,
        a: Slot,
        b: Slot,
    },
    Fma {
        ty: Ty,
        rnd: Rnd,
        ftz: bool,
        sat: bool,
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
    },
    FUn {
        op: FUn,
        ty: Ty,
        rnd: Rnd,
        ftz: bool,
        d: Slot,
        a: Slot,
    },
    Testp {
        op: u8,
        ty: Ty,
        d: Slot,
        a: Slot,
    },
    Setp {
        cmp: Cmp,
        ty: Ty,
        ftz: bool,
        d: Slot,
        dn: Slot,
        a: Slot,
        b: Slot,
        comb: Option<(BoolOp, Slot, bool)>,
    },
    Selp {
        mask: u64,
        d: Slot,
        a: Slot,
        b: Slot,
        p: Slot,
    },
    Slct {
        ty: Ty,
        cty: Ty,
        ftz: bool,
        d: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
    },
    Pack {
        bits: u32,
        d: Slot,
        srcs: [Slot; 4],
        n: u8,
    },
    Unpack {
        bits: u32,
        dsts: [Slot; 4],
        n: u8,
        a: Slot,
    },
    Cvt {
        dty: Ty,
        sty: Ty,
        rnd: Rnd,
        sat: bool,
        ftz: bool,
        d: Slot,
        a: Slot,
    },
    Cvta {
        to: bool,
        space: Space,
        bits32: bool,
        d: Slot,
        a: Slot,
    },
    /// `ld` (not [`Op::LdShared32`]): `at.n` values into `d`.
    Ld {
        at: Access,
        d: [Slot; 4],
    },
    /// `st` (not [`Op::StShared32`]): `at.n` values from `s`.
    St {
        at: Access,
        s: [Slot; 4],
    },
    Atom {
        space: Space,
        op: AtomOp,
        ty: Ty,
        d: Slot,
        addr: Addr,
        b: Slot,
        c: Slot,
    },
    Bra {
        target: u32,
    },
    Call(Box<CallInfo>),
    Ret,
    Exit,
    Trap,
    Bar {
        id: Slot,
        count: Slot,
        aligned: bool,
        /// `bar.red`: the reduction of a predicate over the threads it releases.
        red: Option<BarRed>,
    },
    Shfl {
        mode: ShflMode,
        d: Slot,
        p: Slot,
        a: Slot,
        b: Slot,
        c: Slot,
        mask: Slot,
    },
    Vote {
        mode: VoteMode,
        d: Slot,
        a: Slot,
        neg: bool,
        mask: Slot,
    },
    /// `bar.warp.sync mask`: the lanes of `mask` wait for each other (exited or absent lanes
    /// count as arrived).
    WarpSync {
        mask: Slot,
    },
    Activemask {
        d: Slot,
    },
    Clock {
        d: Slot,
    },
    Nop,
}

/// One instruction: its guard, operation and PTX line.
#[derive(Debug, Clone)]
pub(crate) struct Inst {
    pub op: Op,
    /// Guard predicate slot, or [`NO_GUARD`].
    pub guard: Slot,
    /// Whether the guard is negated (`@!%p`).
    pub neg: bool,
    /// 1-based PTX line.
    pub line: u32,
}

/// Fuses hot instruction pairs into super-instructions (see [`Op::LdSharedFma`]). Every
/// instruction stays where it was, so branch targets and error lines are unchanged.
pub(crate) fn fuse(code: &mut [Inst]) {
    for i in 0..code.len().saturating_sub(1) {
        if code[i].guard != NO_GUARD || code[i + 1].guard != NO_GUARD {
            continue;
        }
        if let (&Op::LdShared32 { d, addr }, &Op::FmaF32 { d: fd, a, b, c }) =
            (&code[i].op, &code[i + 1].op)
        {
            if let Ok(off) = i32::try_from(addr.off) {
                code[i].op = Op::LdSharedFma {
                    d,
                    base: addr.base,
                    off,
                    fd,
                    fa: a,
                    fb: b,
                    fc: c,
                };
            }
        }
    }
}
