//! Floating-point helpers: directed rounding, flush-to-zero, saturation, half precision.
//!
//! Directed rounding (`.rz/.rm/.rp`) is done by computing the round-to-nearest result together
//! with the sign of its error (exactly, by error-free transformations), then stepping one ulp
//! toward the wanted direction when the nearest result lies on the wrong side.

use crate::ir::Rnd;

/// Adjusts nearest result `r` whose exact value is above it (`err > 0`) or below (`err < 0`);
/// an exact `r` (`err` 0) and NaN stay.
fn adjust64(r: f64, err: f64, rnd: Rnd) -> f64 {
    match rnd {
        Rnd::Rm | Rnd::Rmi if err < 0.0 => r.next_down(),
        Rnd::Rp | Rnd::Rpi if err > 0.0 => r.next_up(),
        Rnd::Rz | Rnd::Rzi if err < 0.0 && r > 0.0 => r.next_down(),
        Rnd::Rz | Rnd::Rzi if err > 0.0 && r < 0.0 => r.next_up(),
        _ => r,
    }
}

/// Rounds the exact value `hi + lo` (|lo| tiny next to hi, or an f64 pair from an error-free
/// transformation) to f32 with `rnd`. To nearest, `hi` alone decides: the callers' `hi` is the
/// nearest double to a basic operation's exact result on floats, which rounds to the right
/// float (a double has more than twice a float's bits and 2 more).
pub(crate) fn round32(hi: f64, lo: f64, rnd: Rnd) -> f32 {
    let f = hi as f32;
    if matches!(rnd, Rnd::Rn | Rnd::Default | Rnd::Rni) {
        // hi is the f64 rounding of the exact value; rounding again to f32 is innocuous for
        // the basic operations (f64 has more than 2p+2 bits).
        return f;
    }
    // The sign of (exact - f): hi - f is exact (both within an f32 ulp), then lo breaks ties.
    // A value past the largest float rounds to infinity, then one step back where the
    // direction must stay finite; NaN, an infinity (err NaN), an exact value (err 0) and the
    // rest stay.
    let d = hi - f as f64;
    let err = if d != 0.0 { d } else { lo };
    match rnd {
        Rnd::Rm | Rnd::Rmi if err < 0.0 => f.next_down(),
        Rnd::Rp | Rnd::Rpi if err > 0.0 => f.next_up(),
        Rnd::Rz | Rnd::Rzi if err < 0.0 && f > 0.0 => f.next_down(),
        Rnd::Rz | Rnd::Rzi if err > 0.0 && f < 0.0 => f.next_up(),
        _ => f,
    }
}

/// `a + b` and its rounding error, exactly while the sum is finite: Dekker's Fast2Sum on the
/// operands ordered by magnitude, whose intermediate differences cannot overflow (Knuth's
/// branch-free TwoSum can, near the largest double).
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let (a, b) = if a.abs() >= b.abs() { (a, b) } else { (b, a) };
    let s = a + b;
    (s, b - (s - a))
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
    // The double nearest the quotient of two floats is a float only when it is the exact
    // quotient (an inexact one is at least 2^-48 of itself from every float), so it alone
    // says on which side of its float the quotient lies.
    round32(a as f64 / b as f64, 0.0, rnd)
}

/// f32 square root with `rnd`.
pub(crate) fn sqrt32(a: f32, rnd: Rnd) -> f32 {
    if matches!(rnd, Rnd::Rn | Rnd::Default) {
        return a.sqrt();
    }
    // As for a quotient: the double nearest an inexact root of a float is no float.
    round32((a as f64).sqrt(), 0.0, rnd)
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
        // An infinite operand gives its infinity (or NaN) whatever the direction.
        return match a.is_finite() && b.is_finite() {
            true => overflow64(s, rnd),
            false => s,
        };
    }
    adjust64(s, e, rnd)
}

fn overflow64(s: f64, rnd: Rnd) -> f64 {
    if s.is_nan() {
        return s;
    }
    match rnd {
        Rnd::Rz | Rnd::Rzi => f64::MAX.copysign(s),
        Rnd::Rm | Rnd::Rmi if s.is_sign_positive() => f64::MAX,
        Rnd::Rp | Rnd::Rpi if s.is_sign_negative() => f64::MIN,
        _ => s,
    }
}

/// f64 `a * b` with `rnd`.
pub(crate) fn mul64(a: f64, b: f64, rnd: Rnd) -> f64 {
    let p = a * b;
    if matches!(rnd, Rnd::Rn | Rnd::Default) {
        return p;
    }
    if !p.is_finite() {
        return if a.is_finite() && b.is_finite() {
            overflow64(p, rnd)
        } else {
            p
        };
    }
    if p.abs() < TINY {
        // The product's error may lie below the smallest double (all of it when `p` is 0):
        // its sign is that of the error of both factors and `p` 2^1074 larger, where it is
        // exact (each factor is below 2^109 here, so nothing overflows; with a zero factor
        // the error is 0 or NaN, and `p` stays).
        let up = |x: f64| x * 2f64.powi(537);
        return adjust64(p, up(a).mul_add(up(b), -up(up(p))), rnd);
    }
    adjust64(p, a.mul_add(b, -p), rnd)
}

/// Below this, the rounding error of a product (or the residual of a quotient of a dividend
/// this small) may lie below the smallest double: 2^-966, where 2^-106 of it is still one.
const TINY: f64 = f64::from_bits((1023 - 966) << 52);

/// f64 fused `a * b + c` with `rnd`. The error's sign comes from a TwoProduct + TwoSum
/// expansion, scaled where a product's error or its size would leave the doubles.
pub(crate) fn fma64(a: f64, b: f64, c: f64, rnd: Rnd) -> f64 {
    let r = a.mul_add(b, c);
    if matches!(rnd, Rnd::Rn | Rnd::Default) || !r.is_finite() {
        return if r.is_finite() || !(a.is_finite() && b.is_finite() && c.is_finite()) {
            r
        } else {
            overflow64(r, rnd)
        };
    }
    if !(a * b).is_finite() {
        // The product overflows where the result does not: the same expansion at half the
        // scale. Halving `a` (above 1, as |b| is below 2^1024) and `r` is exact; `c` may lose
        // a subnormal's last bit, but the product and `r` differ by a multiple of 2^900 here,
        // so that bit cannot decide the sign.
        return adjust64(r, fma_error(a / 2.0, b, c / 2.0, r / 2.0), rnd);
    }
    let p = a * b;
    let err = if a != 0.0 && b != 0.0 && p.abs() < TINY {
        tiny_product_error(a, b, c, r, p)
    } else {
        fma_error(a, b, c, r)
    };
    if err == 0.0 && r == 0.0 {
        return zero_sum_sign(p, c, rnd);
    }
    adjust64(r, err, rnd)
}

/// [`fma_error`] for a nonzero product below [`TINY`] (`p`, its rounding, perhaps a signed
/// zero), whose own error may lie below the smallest double.
fn tiny_product_error(a: f64, b: f64, c: f64, r: f64, p: f64) -> f64 {
    if c.abs() < 2f64.powi(-51) {
        // Everything 2^1074 larger, where the product's error is a double and nothing
        // overflows (the product is below 2^108 there, `c` and `r`, within the product of
        // `c`, at most 2^1023).
        let up = |x: f64| x * 2f64.powi(537);
        return fma_error(up(a), up(b), up(up(c)), up(up(r)));
    }
    // `c` and `r` are close multiples of 2^-104 or more, so c - r is exact and, unless 0,
    // far larger than the product: its sign decides, or the product's.
    match c - r {
        0.0 => p.signum(),
        d => d,
    }
}

/// `a * b + c - r`, with the sign of the exact value (while `a * b` is finite): the exact
/// terms of a TwoProduct and two TwoSums, summed without rounding (a plain sum of them can
/// round to the other side of 0).
fn fma_error(a: f64, b: f64, c: f64, r: f64) -> f64 {
    let p = a * b;
    let pe = a.mul_add(b, -p);
    let (s, se) = two_sum(p, c);
    let (t, te) = two_sum(s, -r);
    exact_sum(&[pe, se, te, t])
}

/// A double with the sign of the exact sum of `terms` (0 for 0): the largest term of their
/// expansion (Shewchuk's, each term a double, none overlapping the next), whose sign is the
/// whole's, while no partial sum overflows.
fn exact_sum(terms: &[f64]) -> f64 {
    // The expansion, smallest term first.
    let mut expansion: Vec<f64> = Vec::with_capacity(terms.len());
    for &term in terms {
        let mut sum = term;
        let mut grown = Vec::with_capacity(expansion.len() + 1);
        for &e in &expansion {
            let (s, err) = two_sum(sum, e);
            if err != 0.0 {
                grown.push(err);
            }
            sum = s;
        }
        grown.push(sum);
        expansion = grown;
    }
    expansion
        .into_iter()
        .rev()
        .find(|&e| e != 0.0)
        .unwrap_or(0.0)
}

/// f64 `a / b` with `rnd`.
pub(crate) fn div64(a: f64, b: f64, rnd: Rnd) -> f64 {
    let q = a / b;
    if matches!(rnd, Rnd::Rn | Rnd::Default) {
        return q;
    }
    if !q.is_finite() {
        return if a.is_finite() && b != 0.0 {
            overflow64(q, rnd)
        } else {
            q
        };
    }
    if a.abs() < TINY {
        // The residual a - q * b, about 2^-53 of `a`, may lie below the smallest double: its
        // sign is that of the residual 2^900 larger, which is exact (|q| is below 2^108 here,
        // as |b| is at least the smallest double, so nothing overflows; a zero `a` or an
        // infinite `b` leaves a zero `q` exact, with a residual of 0 or NaN).
        let up = |x: f64| x * 2f64.powi(900);
        let r = (-up(q)).mul_add(b, up(a));
        return adjust64(q, if b < 0.0 { -r } else { r }, rnd);
    }
    // The quotient's error has the residual's sign, turned by a negative divisor (NaN beside
    // an infinite `b`, which leaves the zero `q`).
    let r = (-q).mul_add(b, a);
    adjust64(q, if b < 0.0 { -r } else { r }, rnd)
}

/// f64 square root with `rnd`.
pub(crate) fn sqrt64(a: f64, rnd: Rnd) -> f64 {
    let r = a.sqrt();
    if matches!(rnd, Rnd::Rn | Rnd::Default) || !r.is_finite() || r == 0.0 {
        return r;
    }
    // The residual a - r * r is exact only where its last bit is a double's: for a tiny `a`
    // (subnormal, say), the root of a * 2^200 is the root 2^100 larger, rounded alike.
    if a < 2f64.powi(-900) {
        return sqrt64(a * 2f64.powi(200), rnd) * 2f64.powi(-100);
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
    // Only the error term's sign matters: it is far below the quantum.
    let m = if nearest {
        let up = frac > 0.5 || (frac == 0.5 && (l > 0.0 || (l == 0.0 && n % 2.0 == 1.0)));
        n + f64::from(u8::from(up))
    } else {
        if frac == 0.0 && l < 0.0 && qexp + man <= fmt.emax() {
            // Just below `a`, which the format holds: away from zero that is `a`, toward zero
            // the value before it, one down in the bits (in the binade below when `a` is a
            // power of two, whose quantum is half `a`'s).
            let at = finite_bits(n, qexp, fmt);
            return sign | if away { at } else { at - 1 };
        }
        // Otherwise the exact magnitude lies in [n, n + 1): n toward zero, n + 1 away when
        // anything lies above n.
        n + f64::from(u8::from(away && (frac > 0.0 || l > 0.0)))
    };
    let one = 2f64.powi(man);
    let (m, qexp) = if m >= 2.0 * one {
        (m / 2.0, qexp + 1)
    } else {
        (m, qexp)
    };
    if qexp + man > fmt.emax() {
        return sign | if nearest || away { inf } else { max_finite };
    }
    sign | finite_bits(m, qexp, fmt)
}

/// The bits of `m * 2^qexp`, for a significand `m` (an integer) in `fmt`'s normal range at
/// that quantum, or below it at the smallest quantum (a subnormal).
fn finite_bits(m: f64, qexp: i32, fmt: Half) -> u16 {
    let man = fmt.man_bits();
    let one = 2f64.powi(man);
    if m < one {
        return m as u16;
    }
    (((qexp + man + fmt.emax()) << man) as u16) | (m - one) as u16
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

/// Every function above against rustc_apfloat (LLVM's APFloat in Rust: a second, independent
/// implementation of IEEE 754 arithmetic in every rounding direction), bit for bit, on special
/// values, random bit patterns and operands drawn to make ties and near-ties.
#[cfg(test)]
mod against_apfloat {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use rustc_apfloat::ieee::{BFloat, Double, Half as ApHalf, Quad, Single};
    use rustc_apfloat::{Float, FloatConvert, Round};

    use super::*;

    /// PTX's rounding modifiers and IEEE's directions, both spellings of the integer ones.
    const MODES: [(Rnd, Round); 8] = [
        (Rnd::Rn, Round::NearestTiesToEven),
        (Rnd::Rz, Round::TowardZero),
        (Rnd::Rm, Round::TowardNegative),
        (Rnd::Rp, Round::TowardPositive),
        (Rnd::Rni, Round::NearestTiesToEven),
        (Rnd::Rzi, Round::TowardZero),
        (Rnd::Rmi, Round::TowardNegative),
        (Rnd::Rpi, Round::TowardPositive),
    ];
    /// The modes the arithmetic instructions take.
    const ARITHMETIC: &[(Rnd, Round)] = MODES.split_at(4).0;
    const CASES: usize = 100_000;

    fn rng() -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(0x7a4d_e301)
    }

    /// Equal bits, or both NaN (PTX's NaN is canonical; which NaN IEEE gives is not fixed).
    fn same(ours: u128, ours_nan: bool, theirs: impl Float) -> bool {
        match ours_nan {
            true => theirs.is_nan(),
            false => ours == theirs.to_bits(),
        }
    }

    fn single(x: f32) -> Single {
        Single::from_bits(x.to_bits().into())
    }

    fn double(x: f64) -> Double {
        Double::from_bits(x.to_bits().into())
    }

    /// A float of `bits` bits, `exponent_bits` of them the exponent: special values, random
    /// patterns, and values whose biased exponent lies within `spread` below `top` (a pair
    /// drawn with one `top` is close enough to round, and often tie) with a mantissa whose
    /// low bits are often zero.
    fn draw(rng: &mut impl Rng, bits: u32, exponent_bits: u32, top: u64, spread: u64) -> u64 {
        let mantissa_bits = bits - 1 - exponent_bits;
        let max_exponent = (1u64 << exponent_bits) - 1;
        let sign = u64::from(rng.random::<bool>()) << (bits - 1);
        let full = if bits == 64 {
            u64::MAX
        } else {
            (1 << bits) - 1
        };
        match rng.random_range(0..8) {
            0 => {
                let special = [
                    0,
                    1,
                    (1 << mantissa_bits) - 1,
                    1 << mantissa_bits,
                    (max_exponent << mantissa_bits) - 1,
                    max_exponent << mantissa_bits,
                    (max_exponent << mantissa_bits) | 1,
                    (max_exponent - 1) << (mantissa_bits - 1), // 1.0's neighbourhood: 0.5
                ];
                sign | special[rng.random_range(0..special.len())]
            }
            1 => rng.random::<u64>() & full,
            _ => {
                let exponent = top
                    .saturating_sub(rng.random_range(0..=spread))
                    .min(max_exponent - 1);
                let zeros = rng.random_range(0..=mantissa_bits);
                let mantissa = (rng.random::<u64>() & ((1 << mantissa_bits) - 1)) >> zeros << zeros;
                sign | exponent << mantissa_bits | mantissa
            }
        }
    }

    fn draw32(rng: &mut impl Rng, top: u64, spread: u64) -> f32 {
        f32::from_bits(draw(rng, 32, 8, top, spread) as u32)
    }

    fn draw64(rng: &mut impl Rng, top: u64, spread: u64) -> f64 {
        f64::from_bits(draw(rng, 64, 11, top, spread))
    }

    #[test]
    fn f32_arithmetic_in_every_direction() {
        let mut rng = rng();
        for _ in 0..CASES {
            let top = rng.random_range(0..=255);
            let (a, b, c) = (
                draw32(&mut rng, top, 30),
                draw32(&mut rng, top, 30),
                draw32(&mut rng, top, 30),
            );
            // An addend near the product's size: the sums that cancel or tie.
            let near_product = draw32(&mut rng, (top * 2).saturating_sub(127), 30);
            for &(rnd, round) in ARITHMETIC {
                let (x, y, z) = (single(a), single(b), single(c));
                for (what, ours, theirs) in [
                    ("add", add32(a, b, rnd), x.add_r(y, round).value),
                    ("mul", mul32(a, b, rnd), x.mul_r(y, round).value),
                    ("div", div32(a, b, rnd), x.div_r(y, round).value),
                    ("fma", fma32(a, b, c, rnd), x.mul_add_r(y, z, round).value),
                    (
                        "fma near the product",
                        fma32(a, b, near_product, rnd),
                        x.mul_add_r(y, single(near_product), round).value,
                    ),
                ] {
                    assert!(
                        same(ours.to_bits().into(), ours.is_nan(), theirs),
                        "{what} {rnd:?} {a:e} {b:e} {c:e} {near_product:e}: {ours:e}, IEEE {}",
                        theirs
                    );
                }
            }
        }
    }

    #[test]
    fn f64_arithmetic_in_every_direction() {
        let mut rng = rng();
        for _ in 0..CASES {
            let top = rng.random_range(0..=2047);
            let (a, b, c) = (
                draw64(&mut rng, top, 60),
                draw64(&mut rng, top, 60),
                draw64(&mut rng, top, 60),
            );
            let near_product = draw64(&mut rng, (top * 2).saturating_sub(1023), 60);
            // A product past the largest double, brought back by an addend of the other sign.
            let (big_a, big_b) = (draw64(&mut rng, 1535, 0), draw64(&mut rng, 1535, 0));
            let back = draw64(&mut rng, 2046, 0).abs().copysign(-big_a * big_b);
            for &(rnd, round) in ARITHMETIC {
                let (x, y, z) = (double(a), double(b), double(c));
                for (what, ours, theirs) in [
                    ("add", add64(a, b, rnd), x.add_r(y, round).value),
                    ("mul", mul64(a, b, rnd), x.mul_r(y, round).value),
                    ("div", div64(a, b, rnd), x.div_r(y, round).value),
                    ("fma", fma64(a, b, c, rnd), x.mul_add_r(y, z, round).value),
                    (
                        "fma near the product",
                        fma64(a, b, near_product, rnd),
                        x.mul_add_r(y, double(near_product), round).value,
                    ),
                    (
                        "fma past the largest double",
                        fma64(big_a, big_b, back, rnd),
                        double(big_a)
                            .mul_add_r(double(big_b), double(back), round)
                            .value,
                    ),
                ] {
                    assert!(
                        same(ours.to_bits().into(), ours.is_nan(), theirs),
                        "{what} {rnd:?} {a:e} {b:e} {c:e} {near_product:e}: {ours:e}, IEEE {}",
                        theirs
                    );
                }
            }
        }
    }

    /// `.ftz` flushes exactly the subnormals (APFloat's), keeping the sign; `.sat` clamps to
    /// [0, 1] and takes NaN to 0.
    #[test]
    fn flushing_and_saturation() {
        let mut rng = rng();
        for _ in 0..CASES {
            let x = draw32(&mut rng, 1, 2);
            let flushed = ftz32(x);
            match single(x).is_denormal() {
                true => assert_eq!(flushed.to_bits(), x.to_bits() & 0x8000_0000, "{x:e}"),
                false => assert_eq!(flushed.to_bits(), x.to_bits(), "{x:e}"),
            }
        }
        for (x, saturated) in [(-0.5, 0.0), (0.25, 0.25), (1.5, 1.0), (f64::NAN, 0.0)] {
            assert_eq!(sat64(x), saturated);
            assert_eq!(sat32(x as f32), saturated as f32);
        }
        assert_eq!(sat64(f64::NEG_INFINITY), 0.0);
        assert_eq!(sat32(f32::INFINITY), 1.0);
    }

    /// A sum whose plain evaluation loses both small terms (1 + 2^-80 is 1, and 1 + 2^-53 a
    /// tie to 1) and ends at 0.
    #[test]
    fn sums_of_terms_are_exact() {
        let (tiny, half_ulp) = (2f64.powi(-80), 2f64.powi(-53));
        assert!(exact_sum(&[tiny, 1.0, half_ulp, -1.0]) > 0.0);
        assert!(exact_sum(&[-tiny, 1.0, -half_ulp, -1.0]) < 0.0);
        assert_eq!(exact_sum(&[1.0, tiny, -1.0, -tiny]), 0.0);
    }

    /// APFloat has no square root: a root is checked by squaring, exactly (an f32's or an
    /// f64's square, and their midpoints', fit binary128): the nearest lies between the
    /// squares of its midpoints with its neighbours, a directed one on the right side of `a`
    /// with its neighbour on the other.
    fn check_root(a: f64, rnd: Rnd, r: f64, up: fn(f64) -> f64, down: fn(f64) -> f64) {
        let quad = |x: f64| -> Quad { double(x).convert(&mut false).value };
        let square = |q: Quad| (q * q).value;
        let half = quad(0.5);
        let mid_square = |x: f64, y: f64| square(((quad(x) + quad(y)).value * half).value);
        if a.is_nan() || a < 0.0 {
            assert!(r.is_nan(), "sqrt {rnd:?} {a:e}: {r:e}");
            return;
        }
        if a == 0.0 || a.is_infinite() {
            assert_eq!(r.to_bits(), a.to_bits(), "sqrt {rnd:?} {a:e}");
            return;
        }
        let (r2, a) = (square(quad(r)), quad(a));
        let holds = match rnd {
            Rnd::Rn => mid_square(down(r), r) <= a && a <= mid_square(r, up(r)),
            Rnd::Rz | Rnd::Rm => r2 <= a && a < square(quad(up(r))),
            _ => square(quad(down(r))) < a && a <= r2,
        };
        assert!(holds, "sqrt {rnd:?} {a}: {r:e}");
    }

    #[test]
    fn square_roots_in_every_direction() {
        let mut rng = rng();
        for _ in 0..CASES {
            let top = rng.random_range(0..=2047);
            let (a32, a64) = (draw32(&mut rng, top / 8, 255), draw64(&mut rng, top, 2047));
            for &(rnd, _) in ARITHMETIC {
                check_root(
                    a32.into(),
                    rnd,
                    sqrt32(a32, rnd).into(),
                    |r| f64::from((r as f32).next_up()),
                    |r| f64::from((r as f32).next_down()),
                );
                check_root(a64, rnd, sqrt64(a64, rnd), f64::next_up, f64::next_down);
            }
        }
    }

    /// Integers to floats, and floats to integral values.
    #[test]
    fn conversions_in_every_direction() {
        let mut rng = rng();
        for _ in 0..CASES {
            let width = rng.random_range(1..=127);
            let v = rng.random::<i128>() >> (128 - width);
            let x = draw64(&mut rng, 1023 + 60, 70);
            for (rnd, round) in MODES {
                let ours = int_to_f32(v, rnd);
                let theirs = Single::from_i128_r(v, round).value;
                assert!(
                    same(ours.to_bits().into(), false, theirs),
                    "{v} {rnd:?}: {ours:e}"
                );
                let ours = int_to_f64(v, rnd);
                let theirs = Double::from_i128_r(v, round).value;
                assert!(
                    same(ours.to_bits().into(), false, theirs),
                    "{v} {rnd:?}: {ours:e}"
                );
                let ours = round_int(x, rnd);
                let theirs = double(x).round_to_integral(round).value;
                assert!(
                    same(ours.to_bits().into(), ours.is_nan(), theirs),
                    "{x:e} {rnd:?}"
                );
            }
        }
        for h in 0..=u16::MAX {
            let ours = f16_to_f32(h);
            let theirs: Single = ApHalf::from_bits(h.into()).convert(&mut false).value;
            assert!(
                same(ours.to_bits().into(), ours.is_nan(), theirs),
                "{h:#x}: {ours:e}"
            );
        }
    }

    /// `hi + lo` as one binary128 (exact: `lo` lies within 100 bits of `hi` here), rounded by
    /// APFloat into `F`.
    fn pair<F: Float>(hi: f64, lo: f64, round: Round) -> F
    where
        Quad: FloatConvert<F>,
    {
        let quad = |x: f64| -> Quad { double(x).convert(&mut false).value };
        // No error term: `hi` itself, a negative zero included (IEEE's -0 + 0 is +0).
        let exact = match lo {
            0.0 => quad(hi),
            _ => (quad(hi) + quad(lo)).value,
        };
        exact.convert_r(round, &mut false).value
    }

    /// A value with its error term: a random double, or the midpoint of two neighbouring
    /// values of a format `shift` bits shorter, then an error term a few bits long, up to 40
    /// bits below `hi`'s last, or none.
    fn draw_pair(rng: &mut impl Rng, top: u64, shift: u32) -> (f64, f64) {
        let mut hi = draw64(rng, top, 40);
        if rng.random::<bool>() && hi.is_finite() {
            let bits = hi.to_bits() >> shift << shift | 1 << (shift - 1);
            hi = f64::from_bits(bits);
        }
        let lo = match rng.random_range(0..3) {
            0 => 0.0,
            _ if !hi.is_normal() || hi.abs() == f64::MAX => 0.0,
            _ => {
                let ulp = hi.abs().next_up() - hi.abs();
                let scale = 2f64.powi(-rng.random_range(1..=40));
                (rng.random_range(-31..=31) as f64) * ulp * scale / 32.0
            }
        };
        (hi, lo)
    }

    /// The rounding of a value with its error term: to f32 (`cvt.f32.f64` and the basic
    /// operations), to f16 and to bf16.
    #[test]
    fn pairs_round_to_each_format_in_every_direction() {
        let mut rng = rng();
        for _ in 0..CASES {
            let top = rng.random_range(1023 - 160..=1023 + 160);
            let (hi, lo) = draw_pair(&mut rng, top, 29);
            let top = rng.random_range(1023 - 140..=1023 + 130);
            let (hi16, lo16) = draw_pair(&mut rng, top, 42);
            for (rnd, round) in MODES {
                // To nearest, round32 takes `hi` as the nearest double to the exact value.
                let lo = if matches!(rnd, Rnd::Rn | Rnd::Rni) {
                    0.0
                } else {
                    lo
                };
                let ours = round32(hi, lo, rnd);
                let theirs: Single = pair(hi, lo, round);
                assert!(
                    same(ours.to_bits().into(), ours.is_nan(), theirs),
                    "{hi:e} + {lo:e} {rnd:?}: {ours:e}, IEEE {theirs}"
                );
                for (fmt, theirs) in [
                    (Half::F16, pair::<ApHalf>(hi16, lo16, round).to_bits()),
                    (Half::Bf16, pair::<BFloat>(hi16, lo16, round).to_bits()),
                ] {
                    let ours = round_half(hi16, lo16, fmt, rnd);
                    let nan = hi16.is_nan();
                    assert!(
                        (nan && ours == HALF_NAN) || (!nan && u128::from(ours) == theirs),
                        "{fmt:?} {hi16:e} + {lo16:e} {rnd:?}: {ours:#x}, IEEE {theirs:#x}"
                    );
                }
            }
        }
    }

    /// Lanes' arithmetic in both 16-bit formats.
    #[test]
    fn half_arithmetic_in_every_direction() {
        fn check<F: Float>(fmt: Half, rng: &mut impl Rng) {
            let (exponent_bits, max) = match fmt {
                Half::F16 => (5, 31),
                Half::Bf16 => (8, 255),
            };
            for _ in 0..CASES {
                let top = rng.random_range(0..=max);
                let [x, y, z] = [(); 3].map(|()| draw(rng, 16, exponent_bits, top, 12) as u16);
                let [a, b, c] = [x, y, z].map(|h| F::from_bits(h.into()));
                for &(rnd, round) in ARITHMETIC {
                    for (op, theirs) in [
                        (HalfOp::Add, a.add_r(b, round).value),
                        (HalfOp::Sub, a.sub_r(b, round).value),
                        (HalfOp::Mul, a.mul_r(b, round).value),
                        (HalfOp::Fma, a.mul_add_r(b, c, round).value),
                    ] {
                        let ours = half_op(op, fmt, rnd, x, y, z);
                        assert!(
                            (theirs.is_nan() && ours == HALF_NAN)
                                || u128::from(ours) == theirs.to_bits(),
                            "{fmt:?} {op:?} {rnd:?} {x:#x} {y:#x} {z:#x}: {ours:#x}, IEEE {:#x}",
                            theirs.to_bits()
                        );
                    }
                }
            }
        }
        check::<ApHalf>(Half::F16, &mut rng());
        check::<BFloat>(Half::Bf16, &mut rng());
    }
}
