//! Floating-point helpers: directed rounding, flush-to-zero, saturation, half precision.
//!
//! Directed rounding (`.rz/.rm/.rp`) is done by computing the round-to-nearest result together
//! with the sign of its error (exactly, by error-free transformations), then stepping one ulp
//! toward the wanted direction when the nearest result lies on the wrong side.

use crate::ir::Rnd;

/// Adjusts nearest result `r` whose exact value is above it (`err > 0`) or below (`err < 0`).
fn adjust64(r: f64, err: f64, rnd: Rnd) -> f64 {
    if r.is_nan() || err == 0.0 || err.is_nan() {
        return r;
    }
    match rnd {
        Rnd::Rm if err < 0.0 => r.next_down(),
        Rnd::Rp if err > 0.0 => r.next_up(),
        Rnd::Rz if err < 0.0 && r > 0.0 => r.next_down(),
        Rnd::Rz if err > 0.0 && r < 0.0 => r.next_up(),
        _ => r,
    }
}

/// Rounds the exact value `hi + lo` (|lo| tiny next to hi, or an f64 pair from an error-free
/// transformation) to f32 with `rnd`.
pub(crate) fn round32(hi: f64, lo: f64, rnd: Rnd) -> f32 {
    let f = hi as f32;
    if hi.is_nan() || matches!(rnd, Rnd::Rn | Rnd::Default | Rnd::Rni) {
        // hi is the f64 rounding of the exact value; rounding again to f32 is innocuous for
        // the basic operations (f64 has more than 2p+2 bits).
        return f;
    }
    if hi.is_infinite() {
        return f;
    }
    // The sign of (exact - f): hi - f is exact (both within an f32 ulp), then lo breaks ties.
    let d = hi - f as f64;
    let err = if d != 0.0 { d } else { lo };
    if err == 0.0 {
        return f;
    }
    match rnd {
        Rnd::Rm | Rnd::Rmi if err < 0.0 => f.next_down(),
        Rnd::Rp | Rnd::Rpi if err > 0.0 => f.next_up(),
        Rnd::Rz | Rnd::Rzi if err < 0.0 && f > 0.0 => f.next_down(),
        Rnd::Rz | Rnd::Rzi if err > 0.0 && f < 0.0 => f.next_up(),
        // Overflowed to infinity under a direction that must stay finite.
        Rnd::Rz | Rnd::Rzi if f.is_infinite() => f32::MAX.copysign(f),
        _ => f,
    }
}

fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

/// The sign of a zero sum under `rnd`: IEEE gives -0 only when rounding down (or both -0).
fn zero_sum_sign(a: f64, b: f64, rnd: Rnd) -> f64 {
    let both_neg = a.is_sign_negative() && b.is_sign_negative();
    let mixed = a.is_sign_negative() != b.is_sign_negative();
    if both_neg || (mixed && matches!(rnd, Rnd::Rm)) {
        -0.0
    } else {
        0.0
    }
}

/// f32 `a + b` with `rnd`.
pub(crate) fn add32(a: f32, b: f32, rnd: Rnd) -> f32 {
    if matches!(rnd, Rnd::Rn | Rnd::Default) {
        return a + b;
    }
    let (s, e) = two_sum(a as f64, b as f64);
    if s == 0.0 && e == 0.0 {
        return zero_sum_sign(a as f64, b as f64, rnd) as f32;
    }
    round32(s, e, rnd)
}

/// f32 `a * b` with `rnd` (exact in f64).
pub(crate) fn mul32(a: f32, b: f32, rnd: Rnd) -> f32 {
    if matches!(rnd, Rnd::Rn | Rnd::Default) {
        return a * b;
    }
    round32(a as f64 * b as f64, 0.0, rnd)
}

/// f32 fused `a * b + c` with one rounding.
pub(crate) fn fma32(a: f32, b: f32, c: f32, rnd: Rnd) -> f32 {
    if matches!(rnd, Rnd::Rn | Rnd::Default) {
        return a.mul_add(b, c);
    }
    let p = a as f64 * b as f64; // exact
    let (s, e) = two_sum(p, c as f64);
    if s == 0.0 && e == 0.0 {
        return zero_sum_sign(p, c as f64, rnd) as f32;
    }
    round32(s, e, rnd)
}

/// f32 `a / b` with `rnd` (IEEE correctly rounded).
pub(crate) fn div32(a: f32, b: f32, rnd: Rnd) -> f32 {
    if matches!(rnd, Rnd::Rn | Rnd::Default) {
        return a / b;
    }
    let (a64, b64) = (a as f64, b as f64);
    let q = a64 / b64;
    if !q.is_finite() || q == 0.0 {
        return round32(q, 0.0, rnd);
    }
    let r = (-q).mul_add(b64, a64); // exact remainder: a - q*b
    round32(q, r * b64.signum(), rnd)
}

/// f32 square root with `rnd`.
pub(crate) fn sqrt32(a: f32, rnd: Rnd) -> f32 {
    if matches!(rnd, Rnd::Rn | Rnd::Default) {
        return a.sqrt();
    }
    let x = a as f64;
    let r = x.sqrt();
    if !r.is_finite() || r == 0.0 {
        return r as f32;
    }
    round32(r, (-r).mul_add(r, x), rnd)
}

/// f64 `a + b` with `rnd`.
pub(crate) fn add64(a: f64, b: f64, rnd: Rnd) -> f64 {
    if matches!(rnd, Rnd::Rn | Rnd::Default) {
        return a + b;
    }
    let (s, e) = two_sum(a, b);
    if s == 0.0 && e == 0.0 {
        return zero_sum_sign(a, b, rnd);
    }
    if !s.is_finite() {
        return overflow64(s, rnd);
    }
    adjust64(s, e, rnd)
}

fn overflow64(s: f64, rnd: Rnd) -> f64 {
    if s.is_nan() {
        return s;
    }
    match rnd {
        Rnd::Rz => f64::MAX.copysign(s),
        Rnd::Rm if s > 0.0 => f64::MAX,
        Rnd::Rp if s < 0.0 => f64::MIN,
        _ => s,
    }
}

/// f64 `a * b` with `rnd`.
pub(crate) fn mul64(a: f64, b: f64, rnd: Rnd) -> f64 {
    let p = a * b;
    if matches!(rnd, Rnd::Rn | Rnd::Default) || p == 0.0 {
        return p;
    }
    if !p.is_finite() {
        return if a.is_finite() && b.is_finite() {
            overflow64(p, rnd)
        } else {
            p
        };
    }
    adjust64(p, a.mul_add(b, -p), rnd)
}

/// f64 fused `a * b + c` with `rnd`. The error's sign comes from a TwoProduct + TwoSum
/// expansion; exact except when the partial terms themselves lose bits (far out of range).
pub(crate) fn fma64(a: f64, b: f64, c: f64, rnd: Rnd) -> f64 {
    let r = a.mul_add(b, c);
    if matches!(rnd, Rnd::Rn | Rnd::Default) || !r.is_finite() {
        return if r.is_finite() || !(a.is_finite() && b.is_finite() && c.is_finite()) {
            r
        } else {
            overflow64(r, rnd)
        };
    }
    let p = a * b;
    let pe = a.mul_add(b, -p);
    let (s, se) = two_sum(p, c);
    if r == 0.0 && s == 0.0 && se == 0.0 && pe == 0.0 {
        return zero_sum_sign(p, c, rnd);
    }
    // exact - r = (s - r) + se + pe.
    let (t, te) = two_sum(s, -r);
    let err = t + (te + se + pe);
    adjust64(r, err, rnd)
}

/// f64 `a / b` with `rnd`.
pub(crate) fn div64(a: f64, b: f64, rnd: Rnd) -> f64 {
    let q = a / b;
    if matches!(rnd, Rnd::Rn | Rnd::Default) || q == 0.0 {
        return q;
    }
    if !q.is_finite() {
        return if a.is_finite() && b != 0.0 {
            overflow64(q, rnd)
        } else {
            q
        };
    }
    let r = (-q).mul_add(b, a);
    adjust64(q, r * b.signum(), rnd)
}

/// f64 square root with `rnd`.
pub(crate) fn sqrt64(a: f64, rnd: Rnd) -> f64 {
    let r = a.sqrt();
    if matches!(rnd, Rnd::Rn | Rnd::Default) || !r.is_finite() || r == 0.0 {
        return r;
    }
    adjust64(r, (-r).mul_add(r, a), rnd)
}

/// `.ftz`: a subnormal f32 becomes zero of the same sign.
#[inline]
pub(crate) fn ftz32(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

/// `.sat`: clamp to [0, 1], NaN to 0.
#[inline]
pub(crate) fn sat32(x: f32) -> f32 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(0.0, 1.0)
    }
}

/// `.sat` for f64.
pub(crate) fn sat64(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(0.0, 1.0)
    }
}

/// Rounds a float to an integral value (`.rni/.rzi/.rmi/.rpi`).
pub(crate) fn round_int(x: f64, rnd: Rnd) -> f64 {
    match rnd {
        Rnd::Rzi | Rnd::Rz => x.trunc(),
        Rnd::Rmi | Rnd::Rm => x.floor(),
        Rnd::Rpi | Rnd::Rp => x.ceil(),
        _ => x.round_ties_even(),
    }
}

/// An integer to f32 under `rnd`.
pub(crate) fn int_to_f32(v: i128, rnd: Rnd) -> f32 {
    let f = v as f32; // nearest
    if matches!(rnd, Rnd::Rn | Rnd::Default) {
        return f;
    }
    let back = f as f64 as i128; // f is an integer value below 2^128: exact
    let err: f64 = match v.cmp(&back) {
        std::cmp::Ordering::Greater => 1.0,
        std::cmp::Ordering::Less => -1.0,
        std::cmp::Ordering::Equal => 0.0,
    };
    round32(f as f64, err, rnd)
}

/// An integer to f64 under `rnd`.
pub(crate) fn int_to_f64(v: i128, rnd: Rnd) -> f64 {
    let f = v as f64;
    if matches!(rnd, Rnd::Rn | Rnd::Default) {
        return f;
    }
    let back = f as i128;
    let err = match v.cmp(&back) {
        std::cmp::Ordering::Greater => 1.0,
        std::cmp::Ordering::Less => -1.0,
        std::cmp::Ordering::Equal => 0.0,
    };
    adjust64(f, err, rnd)
}

/// IEEE half bits to f32 (exact).
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let man = (h & 0x3ff) as f32;
    match exp {
        0 => sign * man * 2f32.powi(-24),
        0x1f if man == 0.0 => sign * f32::INFINITY,
        0x1f => f32::NAN,
        e => sign * (1.0 + man / 1024.0) * 2f32.powi(e - 15),
    }
}

/// A 16-bit floating-point format: IEEE binary16 (`.f16`) or bfloat16 (`.bf16`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Half {
    F16,
    Bf16,
}

/// The canonical NaN of both 16-bit formats (what PTX's half-precision instructions return).
pub(crate) const HALF_NAN: u16 = 0x7fff;

impl Half {
    /// Stored significand bits.
    fn man_bits(self) -> i32 {
        match self {
            Half::F16 => 10,
            Half::Bf16 => 7,
        }
    }
    /// The largest exponent, which is also the bias.
    fn emax(self) -> i32 {
        match self {
            Half::F16 => 15,
            Half::Bf16 => 127,
        }
    }
    fn emin(self) -> i32 {
        1 - self.emax()
    }
    /// The value of `bits` (exact).
    pub(crate) fn value(self, bits: u16) -> f64 {
        match self {
            Half::F16 => f16_to_f32(bits) as f64,
            Half::Bf16 => f32::from_bits(u32::from(bits) << 16) as f64,
        }
    }
}

/// Rounds the exact value `hi + lo` (`lo` the error of the f64 `hi`, as an error-free
/// transformation leaves it, or 0) to `fmt` with `rnd` (the default is to nearest, ties to
/// even), as IEEE 754 does with one rounding: subnormals kept, overflow to infinity or to the
/// largest finite value as the direction says. NaN gives the canonical NaN.
pub(crate) fn round_half(hi: f64, lo: f64, fmt: Half, rnd: Rnd) -> u16 {
    if hi.is_nan() {
        return HALF_NAN;
    }
    let negative = hi.is_sign_negative();
    let sign: u16 = if negative { 0x8000 } else { 0 };
    let man = fmt.man_bits();
    let inf = ((2 * fmt.emax() + 1) << man) as u16;
    let max_finite = inf - 1;
    let (a, l) = if negative { (-hi, -lo) } else { (hi, lo) };
    // Whether rounding away from zero is rounding up in this direction.
    let away = match rnd {
        Rnd::Rp | Rnd::Rpi => !negative,
        Rnd::Rm | Rnd::Rmi => negative,
        _ => false,
    };
    let nearest = matches!(rnd, Rnd::Default | Rnd::Rn | Rnd::Rni);
    if a.is_infinite() {
        return sign | inf;
    }
    if a == 0.0 {
        return sign;
    }
    // The exponent of `a` (f64 subnormals lie far below every 16-bit format's range).
    let e = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    let qexp = e.max(fmt.emin()) - man;
    let quantum = 2f64.powi(qexp);
    let q = a / quantum;
    let n = q.floor();
    let frac = q - n;
    let rest = l / quantum;
    let m = if nearest {
        let up = frac > 0.5 || (frac == 0.5 && (rest > 0.0 || (rest == 0.0 && n % 2.0 == 1.0)));
        n + f64::from(u8::from(up))
    } else {
        // The exact magnitude lies in [floor, floor + 1), strictly above floor when `above`.
        let (floor, above) = if frac == 0.0 && rest < 0.0 {
            (n - 1.0, true)
        } else {
            (n, frac > 0.0 || rest > 0.0)
        };
        floor + f64::from(u8::from(away && above))
    };
    let one = 2f64.powi(man);
    let (m, qexp) = if m >= 2.0 * one {
        (m / 2.0, qexp + 1)
    } else {
        (m, qexp)
    };
    if m < one {
        // Subnormal (or zero): the quantum is the smallest one.
        return sign | m as u16;
    }
    let exponent = qexp + man;
    if exponent > fmt.emax() {
        return sign | if nearest || away { inf } else { max_finite };
    }
    sign | (((exponent + fmt.emax()) << man) as u16) | (m - one) as u16
}

/// `x op y` in `fmt`, both given as their bits, rounded once with `rnd`: what PTX's `add`,
/// `sub`, `mul` and `fma` do on each lane of `.f16`, `.f16x2`, `.bf16` and `.bf16x2` (the
/// products of two 16-bit values and their sums are computed exactly first: f64 holds a
/// product, and a two-sum holds a sum's error).
pub(crate) fn half_op(op: HalfOp, fmt: Half, rnd: Rnd, x: u16, y: u16, z: u16) -> u16 {
    let (a, b, c) = (fmt.value(x), fmt.value(y), fmt.value(z));
    let (p, addend) = match op {
        HalfOp::Add => (a, b),
        HalfOp::Sub => (a, -b),
        HalfOp::Mul => (a * b, 0.0),
        HalfOp::Fma => (a * b, c),
    };
    if op == HalfOp::Mul {
        return round_half(p, 0.0, fmt, rnd);
    }
    let (hi, lo) = two_sum(p, addend);
    if hi == 0.0 && lo == 0.0 && !hi.is_nan() {
        return round_half(zero_sum_sign(p, addend, rnd), 0.0, fmt, rnd);
    }
    round_half(hi, lo, fmt, rnd)
}

/// The 16-bit arithmetic of [`half_op`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HalfOp {
    Add,
    Sub,
    Mul,
    Fma,
}

#[cfg(test)]
mod half_tests {
    use super::*;

    /// Every pair of neighbouring finite values of each format, with points a quarter, half and
    /// three quarters of the way between them: each mode must give the neighbour its rule
    /// names (nearest: the closer, ties to the even one), in both signs.
    #[test]
    fn every_value_and_every_gap_rounds_as_its_mode_says() {
        for fmt in [Half::F16, Half::Bf16] {
            let inf = ((2 * fmt.emax() + 1) << fmt.man_bits()) as u16;
            for bits in 0..inf - 1 {
                let (lo, hi) = (fmt.value(bits), fmt.value(bits + 1));
                for sign in [1.0, -1.0] {
                    let s: u16 = if sign < 0.0 { 0x8000 } else { 0 };
                    let at = |x: f64, rnd| round_half(sign * x, 0.0, fmt, rnd);
                    for rnd in [Rnd::Rn, Rnd::Rz, Rnd::Rm, Rnd::Rp] {
                        assert_eq!(at(lo, rnd), s | bits, "{fmt:?} {bits:#x} exact");
                    }
                    let (toward, away) = (s | bits, s | (bits + 1));
                    let (down, up) = if sign > 0.0 {
                        (toward, away)
                    } else {
                        (away, toward)
                    };
                    for (x, nearest) in [
                        ((3.0 * lo + hi) / 4.0, toward),
                        ((lo + 3.0 * hi) / 4.0, away),
                        ((lo + hi) / 2.0, if bits % 2 == 0 { toward } else { away }),
                    ] {
                        assert_eq!(at(x, Rnd::Rn), nearest, "{fmt:?} {bits:#x} rn {x}");
                        assert_eq!(at(x, Rnd::Default), nearest);
                        assert_eq!(at(x, Rnd::Rz), toward, "{fmt:?} {bits:#x} rz {x}");
                        assert_eq!(at(x, Rnd::Rm), down, "{fmt:?} {bits:#x} rm {x}");
                        assert_eq!(at(x, Rnd::Rp), up, "{fmt:?} {bits:#x} rp {x}");
                    }
                }
            }
            // Past the largest finite value: infinity, or the largest where the direction
            // says so.
            let max = fmt.value(inf - 1);
            let beyond = max * 1.5;
            assert_eq!(round_half(beyond, 0.0, fmt, Rnd::Rn), inf);
            assert_eq!(round_half(beyond, 0.0, fmt, Rnd::Rz), inf - 1);
            assert_eq!(round_half(-beyond, 0.0, fmt, Rnd::Rp), 0x8000 | (inf - 1));
            assert_eq!(round_half(-beyond, 0.0, fmt, Rnd::Rm), 0x8000 | inf);
            assert_eq!(round_half(f64::NAN, 0.0, fmt, Rnd::Rn), HALF_NAN);
            assert_eq!(round_half(-0.0, 0.0, fmt, Rnd::Rn), 0x8000);
            // Below half the smallest subnormal: zero, or the smallest when rounding away.
            let tiny = fmt.value(1) / 4.0;
            assert_eq!(round_half(tiny, 0.0, fmt, Rnd::Rn), 0);
            assert_eq!(round_half(tiny, 0.0, fmt, Rnd::Rp), 1);
            assert_eq!(round_half(-tiny, 0.0, fmt, Rnd::Rm), 0x8001);
        }
    }

    /// The error term decides what the f64 part alone cannot: a tie, and an exact value just
    /// below a representable one.
    #[test]
    fn the_error_term_breaks_ties_and_directs() {
        let fmt = Half::F16;
        let (one, next) = (fmt.value(0x3c00), fmt.value(0x3c01));
        let mid = (one + next) / 2.0;
        assert_eq!(round_half(mid, 0.0, fmt, Rnd::Rn), 0x3c00);
        assert_eq!(round_half(mid, 1e-30, fmt, Rnd::Rn), 0x3c01);
        assert_eq!(round_half(next, -1e-30, fmt, Rnd::Rz), 0x3c00);
        assert_eq!(round_half(next, -1e-30, fmt, Rnd::Rp), 0x3c01);
        assert_eq!(round_half(one, 1e-30, fmt, Rnd::Rp), 0x3c01);
    }

    /// Lanes' arithmetic against the same operations in f64 rounded once, where f64 is exact.
    #[test]
    fn half_arithmetic_rounds_once_and_signs_zeros_as_ieee_does() {
        let fmt = Half::Bf16;
        let bits = |x: f64| round_half(x, 0.0, fmt, Rnd::Rn);
        let (a, b) = (bits(1.0), bits(2f64.powi(-8)));
        // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to the even, 1.
        assert_eq!(half_op(HalfOp::Add, fmt, Rnd::Rn, a, b, 0), a);
        assert_eq!(
            half_op(HalfOp::Add, fmt, Rnd::Rp, a, b, 0),
            bits(1.0 + 2f64.powi(-7))
        );
        // fma: 1 * 1 + 2^-8, the same tie, rounded once.
        assert_eq!(half_op(HalfOp::Fma, fmt, Rnd::Rn, a, a, b), a);
        // A sum f64 cannot hold: 2^60 * 2^60 + 2^-100 toward +inf steps past 2^120.
        let (big, small) = (bits(2f64.powi(60)), bits(2f64.powi(-100)));
        let up = half_op(HalfOp::Fma, fmt, Rnd::Rp, big, big, small);
        assert_eq!(fmt.value(up), 2f64.powi(120) * (1.0 + 2f64.powi(-7)));
        assert_eq!(
            half_op(HalfOp::Fma, fmt, Rnd::Rn, big, big, small),
            bits(2f64.powi(120))
        );
        let (plus, minus) = (bits(0.0), 0x8000);
        assert_eq!(half_op(HalfOp::Add, fmt, Rnd::Rn, plus, minus, 0), plus);
        assert_eq!(half_op(HalfOp::Add, fmt, Rnd::Rm, plus, minus, 0), minus);
        assert_eq!(half_op(HalfOp::Sub, fmt, Rnd::Rn, a, a, 0), plus);
        assert_eq!(half_op(HalfOp::Mul, fmt, Rnd::Rn, minus, a, 0), minus);
        let inf = bits(f64::INFINITY);
        assert_eq!(half_op(HalfOp::Sub, fmt, Rnd::Rn, inf, inf, 0), HALF_NAN);
    }
}
