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

/// f32 bits to IEEE half bits, round to nearest even.
pub(crate) fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = m >> shift;
        let rem = m & ((1 << shift) - 1);
        let mid = 1 << (shift - 1);
        let r = if rem > mid || (rem == mid && half & 1 == 1) {
            half + 1
        } else {
            half
        };
        return sign | r as u16;
    }
    let half = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    let r = if rem > 0x1000 || (rem == 0x1000 && half & 1 == 1) {
        half + 1
    } else {
        half
    };
    sign | r as u16
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
