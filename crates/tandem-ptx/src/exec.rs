//! The interpreter: blocks over host threads, threads of a block run one at a time up to their
//! next synchronising instruction (`bar.sync`, `shfl.sync`, `vote.sync`, `bar.warp.sync`), then
//! the scheduler performs the exchange or release, or reports the deadlock.

use std::sync::atomic::{
    AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
use std::sync::Mutex;

use crate::float::*;
use crate::ir::*;
use crate::parse::{CARRY, FPARAM_BASE, SINK};
use crate::race::{Kind, RaceState};
use crate::{
    Dim3, ExecError, GlobalMemory, Kernel, Launch, Profile, Stats, GENERIC_LOCAL_BASE,
    GENERIC_SHARED_BASE, WINDOW_SIZE,
};

/// Why a thread stopped running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Ready,
    /// At a `bar`/`barrier` (its pc).
    Bar,
    /// At a `shfl.sync`/`vote.sync` (its pc).
    Warp,
    Exited,
}

struct Thread {
    pc: u32,
    status: Status,
    /// (return pc, pc of the call instruction).
    stack: Vec<(u32, u32)>,
}

/// A memory access failure before it is dressed with the thread's coordinates.
enum MemErr {
    Illegal(String),
    Misaligned(String),
    Failed(String),
}

/// Resolved 4 KiB pages of global memory, direct-mapped by page number: (page address, host
/// pointer). Enough of them that a block whose threads each read rows of their own
/// (a product's operands) finds its pages again.
struct PageCache {
    entries: [(u64, usize); PAGES_CACHED],
}

const PAGE: u64 = 4096;
const PAGES_CACHED: usize = 64;

impl PageCache {
    fn new() -> PageCache {
        PageCache {
            entries: [(u64::MAX, 0); PAGES_CACHED],
        }
    }
    fn resolve(
        &mut self,
        mem: &dyn GlobalMemory,
        addr: u64,
        len: usize,
    ) -> Result<*mut u8, MemErr> {
        let page = addr & !(PAGE - 1);
        if addr - page + len as u64 <= PAGE {
            let entry = &mut self.entries[(page / PAGE) as usize % PAGES_CACHED];
            let (p, ptr) = *entry;
            if p == page {
                return Ok((ptr + (addr - page) as usize) as *mut u8);
            }
            if let Ok(ptr) = mem.resolve(page, PAGE as usize) {
                *entry = (page, ptr as usize);
                return Ok(ptr.wrapping_add((addr - page) as usize));
            }
        }
        mem.resolve(addr, len)
            .map_err(|_| MemErr::Illegal(format!("global address {addr:#x} ({len} bytes)")))
    }
}

/// Per-block memory.
struct BlockMem<'a> {
    shared: Vec<u8>,
    /// Every thread's local memory, `local_size` bytes each.
    local: Vec<u8>,
    local_size: usize,
    fparam: Vec<u8>,
    fparam_size: usize,
    params: &'a [u8],
    cache: PageCache,
    clock: u64,
    /// Instructions executed (guarded-off ones included).
    executed: u64,
    /// With [`Launch::profile`]: how many threads executed each instruction (by pc), guarded-off
    /// ones not counted.
    profile: Option<Vec<u64>>,
    /// The shared-memory race check's state, when [`Launch::race_check`] asks for it.
    race: Option<Box<RaceState>>,
}

fn read_le(bytes: &[u8]) -> u64 {
    let mut v = 0u64;
    for (i, b) in bytes.iter().enumerate() {
        v |= (*b as u64) << (8 * i);
    }
    v
}

fn write_le(bytes: &mut [u8], v: u64) {
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (v >> (8 * i)) as u8;
    }
}

fn slice_at<'b>(
    buf: &'b mut [u8],
    off: u64,
    len: usize,
    what: &str,
) -> Result<&'b mut [u8], MemErr> {
    let end = off.checked_add(len as u64);
    match end {
        Some(e) if e <= buf.len() as u64 => Ok(&mut buf[off as usize..e as usize]),
        _ => Err(MemErr::Illegal(format!(
            "{what} address {off:#x} ({len} bytes) outside the {} bytes of {what} memory",
            buf.len()
        ))),
    }
}

/// Which memory a generic-or-explicit access hits, with the window-relative address.
/// [`classify`]d, and `size`-aligned, or an error naming the `what` access.
#[inline]
fn classify_aligned(
    space: Space,
    addr: u64,
    size: usize,
    what: &str,
) -> Result<(Space, u64), MemErr> {
    let (space, addr) = classify(space, addr);
    if !addr.is_multiple_of(size as u64) {
        return Err(MemErr::Misaligned(format!(
            "{size}-byte {what} at {space:?} address {addr:#x}"
        )));
    }
    Ok((space, addr))
}

fn classify(space: Space, addr: u64) -> (Space, u64) {
    match space {
        Space::Generic => {
            if addr.wrapping_sub(GENERIC_SHARED_BASE) < WINDOW_SIZE {
                (Space::Shared, addr - GENERIC_SHARED_BASE)
            } else if addr.wrapping_sub(GENERIC_LOCAL_BASE) < WINDOW_SIZE {
                (Space::Local, addr - GENERIC_LOCAL_BASE)
            } else {
                (Space::Global, addr)
            }
        }
        // Module `.const` variables are device memory the driver allocated.
        Space::Const => (Space::Global, addr),
        s => (s, addr),
    }
}

impl BlockMem<'_> {
    /// Thread `t`'s function parameter space.
    fn fparams(&mut self, t: usize) -> &mut [u8] {
        let s = self.fparam_size;
        &mut self.fparam[t * s..(t + 1) * s]
    }

    /// Copies thread `t`'s function parameters `(from, to, len)` for a call or return.
    fn copy_fparams(&mut self, t: usize, copies: &[ParamCopy]) {
        let fp = self.fparams(t);
        for &(from, to, len) in copies {
            fp.copy_within(from as usize..(from + len) as usize, to as usize);
        }
    }

    /// The bytes of a non-global access for thread `t`.
    fn bytes(
        &mut self,
        space: Space,
        addr: u64,
        len: usize,
        write: bool,
        t: usize,
    ) -> Result<&mut [u8], MemErr> {
        match space {
            Space::Shared => slice_at(&mut self.shared, addr, len, "shared"),
            Space::Local => {
                let s = self.local_size;
                slice_at(&mut self.local[t * s..(t + 1) * s], addr, len, "local")
            }
            Space::Param if addr >= FPARAM_BASE => {
                slice_at(self.fparams(t), addr - FPARAM_BASE, len, "param")
            }
            Space::Param if write => Err(MemErr::Illegal(format!(
                "store to kernel parameter at {addr:#x}"
            ))),
            _ => Err(MemErr::Illegal(format!(
                "{space:?} address {addr:#x}: no such memory"
            ))),
        }
    }

    /// Where the `kind` access of `size` bytes at `addr` in `space` lands: [`classify_aligned`],
    /// and a global address resolved to host memory.
    #[inline(always)]
    fn place(
        &mut self,
        mem: &dyn GlobalMemory,
        space: Space,
        addr: u64,
        size: usize,
        kind: Kind,
    ) -> Result<Place, MemErr> {
        let (space, addr) = classify_aligned(space, addr, size, kind.name())?;
        Ok(match space {
            Space::Global => Place::Global(self.cache.resolve(mem, addr, size)?),
            _ => Place::Block(space, addr),
        })
    }

    /// The bytes of thread `t`'s `kind` access to the block's own memory, a shared one
    /// recorded for the race check.
    fn block_bytes(
        &mut self,
        space: Space,
        addr: u64,
        size: usize,
        kind: Kind,
        t: usize,
    ) -> Result<&mut [u8], MemErr> {
        if space == Space::Shared {
            self.race_access(t, addr, size, kind)?;
        }
        self.bytes(space, addr, size, kind != Kind::Load, t)
    }

    fn load(
        &mut self,
        mem: &dyn GlobalMemory,
        space: Space,
        addr: u64,
        size: usize,
        t: usize,
    ) -> Result<u64, MemErr> {
        match self.place(mem, space, addr, size, Kind::Load)? {
            // SAFETY: `resolve` vouches for `size` bytes at `p` for the launch; other host
            // threads may access them concurrently, hence atomic accesses when aligned.
            Place::Global(p) => unsafe { Ok(load_ptr(p, size)) },
            Place::Block(Space::Param, addr) if addr < FPARAM_BASE => {
                let end = addr
                    .checked_add(size as u64)
                    .filter(|&e| e <= self.params.len() as u64);
                match end {
                    Some(e) => Ok(read_le(&self.params[addr as usize..e as usize])),
                    None => Err(MemErr::Illegal(format!(
                        "param address {addr:#x} ({size} bytes) outside the parameters"
                    ))),
                }
            }
            Place::Block(space, addr) => {
                let b = self.block_bytes(space, addr, size, Kind::Load, t)?;
                Ok(read_le(b))
            }
        }
    }

    /// Records a shared access for the race check, if it is on.
    #[inline]
    fn race_access(&mut self, t: usize, addr: u64, size: usize, kind: Kind) -> Result<(), MemErr> {
        match self.race.as_deref_mut() {
            Some(rs) => rs.access(t, addr, size, kind).map_err(MemErr::Failed),
            None => Ok(()),
        }
    }

    fn store(
        &mut self,
        mem: &dyn GlobalMemory,
        space: Space,
        addr: u64,
        size: usize,
        v: u64,
        t: usize,
    ) -> Result<(), MemErr> {
        match self.place(mem, space, addr, size, Kind::Store)? {
            // SAFETY: as in `load`.
            Place::Global(p) => unsafe { store_ptr(p, size, v) },
            Place::Block(space, addr) => {
                write_le(self.block_bytes(space, addr, size, Kind::Store, t)?, v)
            }
        }
        Ok(())
    }

    fn atom(
        &mut self,
        mem: &dyn GlobalMemory,
        space: Space,
        addr: u64,
        f: &dyn Fn(u64) -> u64,
        size: usize,
        t: usize,
    ) -> Result<u64, MemErr> {
        match self.place(mem, space, addr, size, Kind::Atomic)? {
            Place::Global(p) => {
                if !(p as usize).is_multiple_of(size) {
                    return Err(MemErr::Misaligned(format!(
                        "atomic at {addr:#x}: host memory misaligned"
                    )));
                }
                // SAFETY: `p` is valid for `size` bytes (resolve) and aligned (checked).
                unsafe {
                    if size == 4 {
                        let a = AtomicU32::from_ptr(p as *mut u32);
                        let r = a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| {
                            Some(f(o as u64) as u32)
                        });
                        Ok(r.unwrap_or_else(|o| o) as u64)
                    } else {
                        let a = AtomicU64::from_ptr(p as *mut u64);
                        let r = a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| Some(f(o)));
                        Ok(r.unwrap_or_else(|o| o))
                    }
                }
            }
            Place::Block(Space::Shared, addr) => {
                let b = self.block_bytes(Space::Shared, addr, size, Kind::Atomic, t)?;
                let old = read_le(b);
                write_le(b, f(old));
                Ok(old)
            }
            Place::Block(space, addr) => Err(MemErr::Illegal(format!(
                "atomic on {space:?} address {addr:#x}"
            ))),
        }
    }
}

/// Where an access lands: global memory (the host pointer to its bytes), or the block's own
/// memory in `space` (at the window-relative address).
enum Place {
    Global(*mut u8),
    Block(Space, u64),
}

/// The element addresses of the vector `what` (load or store) `at`, which must be aligned to
/// the whole vector outside the parameter space.
#[inline(always)]
fn vector_addrs(r: &[u64], at: &Access, what: &str) -> Result<impl Iterator<Item = u64>, MemErr> {
    let (size, n) = (at.ty.bytes(), at.n as usize);
    let base = r[at.base as usize].wrapping_add(at.off as u64);
    if n > 1 && !base.is_multiple_of((size * n) as u64) && at.space != Space::Param {
        return Err(MemErr::Misaligned(format!(
            "{}-byte vector {what} at {base:#x}",
            size * n
        )));
    }
    Ok((0..n).map(move |i| base.wrapping_add((i * size) as u64)))
}

/// A shift amount or bit position: clamped to 32, or taken mod 32.
#[inline]
fn clamp_or_wrap(n: u32, clamp: bool) -> u32 {
    if clamp {
        n.min(32)
    } else {
        n & 31
    }
}

/// The carry flag's bit, when the instruction reads it.
#[inline]
fn carry_in_bit(r: &[u64], on: bool) -> u128 {
    if on {
        r[CARRY as usize] as u128 & 1
    } else {
        0
    }
}

/// The extended-precision addition of `add.cc`/`addc` (`sub.cc`/`subc` with `sub`) and of
/// `mad.cc`/`madc` (whose `x` is the product): `x + y + cin` on `ty`'s bits (with `sub`,
/// `x - y - cin`, `cin` a borrow), and the carry (borrow) out.
#[inline(always)]
fn add_cc(ty: Ty, (x, y): (u64, u64), cin: u128, sub: bool) -> (u64, u64) {
    let bits = ty.bits();
    let m = mask_of(bits);
    let (x, y) = ((x & m) as u128, (y & m) as u128);
    let (v, carry) = if sub {
        // Borrow semantics: d = x - y - borrow; the flag holds the borrow.
        let v = x.wrapping_sub(y).wrapping_sub(cin);
        (v, (x < y + cin) as u64)
    } else {
        let v = x + y + cin;
        (v, (v >> bits) as u64 & 1)
    };
    (v as u64 & m, carry)
}

/// The aligned, in-bounds 32-bit shared load at `a`, or None (the general path then reports
/// the fault).
#[inline(always)]
fn shared32(shared: &[u8], a: u64) -> Option<u32> {
    if a & 3 != 0 {
        return None;
    }
    let s = shared.get(usize::try_from(a).ok()?..)?;
    s.first_chunk::<4>().map(|b| u32::from_le_bytes(*b))
}

/// [`shared32`]'s bytes, to write.
#[inline(always)]
fn shared32_mut(shared: &mut [u8], a: u64) -> Option<&mut [u8; 4]> {
    if a & 3 != 0 {
        return None;
    }
    let s = shared.get_mut(usize::try_from(a).ok()?..)?;
    s.first_chunk_mut::<4>()
}

/// # Safety
/// `p` must be valid for `size` bytes.
unsafe fn load_ptr(p: *mut u8, size: usize) -> u64 {
    let aligned = (p as usize).is_multiple_of(size);
    unsafe {
        match size {
            1 => AtomicU8::from_ptr(p).load(Ordering::Relaxed) as u64,
            2 if aligned => AtomicU16::from_ptr(p as *mut u16).load(Ordering::Relaxed) as u64,
            4 if aligned => AtomicU32::from_ptr(p as *mut u32).load(Ordering::Relaxed) as u64,
            8 if aligned => AtomicU64::from_ptr(p as *mut u64).load(Ordering::Relaxed),
            _ => {
                let mut b = [0u8; 8];
                std::ptr::copy_nonoverlapping(p, b.as_mut_ptr(), size.min(8));
                u64::from_le_bytes(b)
            }
        }
    }
}

/// # Safety
/// `p` must be valid for `size` bytes.
unsafe fn store_ptr(p: *mut u8, size: usize, v: u64) {
    let aligned = (p as usize).is_multiple_of(size);
    unsafe {
        match size {
            1 => AtomicU8::from_ptr(p).store(v as u8, Ordering::Relaxed),
            2 if aligned => AtomicU16::from_ptr(p as *mut u16).store(v as u16, Ordering::Relaxed),
            4 if aligned => AtomicU32::from_ptr(p as *mut u32).store(v as u32, Ordering::Relaxed),
            8 if aligned => AtomicU64::from_ptr(p as *mut u64).store(v, Ordering::Relaxed),
            _ => {
                let b = v.to_le_bytes();
                std::ptr::copy_nonoverlapping(b.as_ptr(), p, size.min(8));
            }
        }
    }
}

#[inline]
fn mask_of(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// Sign-extends the low `bits` of `v`.
#[inline]
fn sx(v: u64, bits: u32) -> i64 {
    let s = 64 - bits;
    ((v << s) as i64) >> s
}

/// A register value read as an integer of `ty`, widened exactly.
#[inline]
fn int_val(v: u64, ty: Ty) -> i128 {
    let b = ty.bits();
    if ty.signed() {
        sx(v, b) as i128
    } else {
        (v & mask_of(b)) as i128
    }
}

#[inline]
fn f32v(v: u64) -> f32 {
    f32::from_bits(v as u32)
}

#[inline]
fn f32b(f: f32) -> u64 {
    f.to_bits() as u64
}

fn ibin(op: IOp, ty: Ty, a: u64, b: u64) -> u64 {
    let bits = ty.bits();
    let m = mask_of(bits);
    // Widened operands, computed only by the operations that need them.
    let ia = || int_val(a, ty);
    let ib = || int_val(b, ty);
    match op {
        IOp::Add => a.wrapping_add(b) & m,
        IOp::Sub => a.wrapping_sub(b) & m,
        IOp::AddSat => (sx(a, 32) + sx(b, 32)).clamp(i32::MIN as i64, i32::MAX as i64) as u64 & m,
        IOp::SubSat => (sx(a, 32) - sx(b, 32)).clamp(i32::MIN as i64, i32::MAX as i64) as u64 & m,
        IOp::MulLo => a.wrapping_mul(b) & m,
        IOp::MulHi => ((ia().wrapping_mul(ib()) >> bits) as u64) & m,
        IOp::MulWide => (ia().wrapping_mul(ib()) as u64) & mask_of(bits * 2),
        IOp::Mul24Lo => ((sx24(a, ty) * sx24(b, ty)) as u64) & m,
        IOp::Mul24Hi => (((sx24(a, ty) * sx24(b, ty)) >> 16) as u64) & m,
        IOp::Div => {
            if ib() == 0 {
                m
            } else {
                (ia().wrapping_div(ib()) as u64) & m
            }
        }
        IOp::Rem => {
            if ib() == 0 {
                a & m
            } else {
                (ia().wrapping_rem(ib()) as u64) & m
            }
        }
        IOp::Min => (ia().min(ib()) as u64) & m,
        IOp::Max => (ia().max(ib()) as u64) & m,
        IOp::MinRelu => (ia().min(ib()).max(0) as u64) & m,
        IOp::MaxRelu => (ia().max(ib()).max(0) as u64) & m,
        IOp::And => a & b & m,
        IOp::Or => (a | b) & m,
        IOp::Xor => (a ^ b) & m,
        IOp::Shl => {
            let s = b as u32;
            if s >= bits {
                0
            } else {
                (a << s) & m
            }
        }
        IOp::Shr => {
            let s = (b as u32).min(bits);
            if ty.signed() {
                // Widened to 128 bits, a shift by the whole width leaves the sign in every bit.
                (ia() >> s) as u64 & m
            } else if s >= bits {
                0
            } else {
                ((a & m) >> s) & m
            }
        }
    }
}

fn sx24(v: u64, ty: Ty) -> i64 {
    if ty.signed() {
        sx(v, 24)
    } else {
        (v & 0xff_ffff) as i64
    }
}

fn iun(op: IUn, ty: Ty, a: u64) -> u64 {
    let bits = ty.bits();
    let m = mask_of(bits);
    match op {
        IUn::Abs => (int_val(a, ty).unsigned_abs() as u64) & m,
        IUn::Neg => a.wrapping_neg() & m,
        IUn::Not => !a & m,
        IUn::Cnot => ((a & m) == 0) as u64,
        IUn::Popc => (a & m).count_ones() as u64,
        IUn::Clz => ((a & m).leading_zeros() - (64 - bits)) as u64,
        IUn::Brev => (a & m).reverse_bits() >> (64 - bits),
        IUn::Bfind | IUn::BfindShift => {
            let v = a & m;
            // For negative signed values the most significant non-sign bit is a 0 bit.
            let x = if ty.signed() && v >> (bits - 1) & 1 == 1 {
                !v & m
            } else {
                v
            };
            if x == 0 {
                0xffff_ffff
            } else {
                let idx = 63 - x.leading_zeros();
                if op == IUn::BfindShift {
                    (bits - 1 - idx) as u64
                } else {
                    idx as u64
                }
            }
        }
    }
}

/// A binary floating-point operation of `a` and `b` at the width of `$f`, whose correctly
/// rounded add, multiply and divide are `$add`, `$mul` and `$div`: what `fbin32` and `fbin64`
/// share.
macro_rules! fbin {
    ($f:ident, $add:ident, $mul:ident, $div:ident, $op:expr, $rnd:expr, $a:expr, $b:expr) => {{
        let (op, rnd, a, b): (FOp, Rnd, $f, $f) = ($op, $rnd, $a, $b);
        match op {
            FOp::Add => $add(a, b, rnd),
            FOp::Sub => $add(a, -b, rnd),
            FOp::Mul => $mul(a, b, rnd),
            FOp::Div => $div(a, b, rnd),
            FOp::Min => a.min(b),
            FOp::Max => a.max(b),
            FOp::MinNan if a.is_nan() || b.is_nan() => $f::NAN,
            FOp::MaxNan if a.is_nan() || b.is_nan() => $f::NAN,
            FOp::MinNan => a.min(b),
            FOp::MaxNan => a.max(b),
            FOp::Copysign => b.copysign(a),
        }
    }};
}

fn fbin32(op: FOp, rnd: Rnd, a: f32, b: f32) -> f32 {
    fbin!(f32, add32, mul32, div32, op, rnd, a, b)
}

fn fbin64(op: FOp, rnd: Rnd, a: f64, b: f64) -> f64 {
    fbin!(f64, add64, mul64, div64, op, rnd, a, b)
}

fn fun64(op: FUn, rnd: Rnd, a: f64) -> f64 {
    match op {
        FUn::Abs => a.abs(),
        FUn::Neg => -a,
        FUn::Sqrt => sqrt64(a, rnd),
        FUn::Rcp => div64(1.0, a, rnd),
        FUn::Rsqrt => 1.0 / a.sqrt(),
        FUn::Ex2 => a.exp2(),
        FUn::Lg2 => a.log2(),
        FUn::Sin => a.sin(),
        FUn::Cos => a.cos(),
        FUn::Tanh => a.tanh(),
    }
}

fn fun32(op: FUn, rnd: Rnd, a: f32) -> f32 {
    match op {
        FUn::Abs => a.abs(),
        FUn::Neg => -a,
        FUn::Sqrt => sqrt32(a, rnd),
        FUn::Rcp => div32(1.0, a, rnd),
        // The approximate functions: computed in f64 and rounded once (see the crate docs).
        _ => fun64(op, Rnd::Rn, a as f64) as f32,
    }
}

fn compare_int(c: Cmp, ty: Ty, a: u64, b: u64) -> bool {
    let (x, y) = (int_val(a, ty), int_val(b, ty));
    let (ux, uy) = (a & mask_of(ty.bits()), b & mask_of(ty.bits()));
    match c {
        Cmp::Eq => x == y,
        Cmp::Ne => x != y,
        Cmp::Lt => x < y,
        Cmp::Le => x <= y,
        Cmp::Gt => x > y,
        Cmp::Ge => x >= y,
        Cmp::Lo => ux < uy,
        Cmp::Ls => ux <= uy,
        Cmp::Hi => ux > uy,
        Cmp::Hs => ux >= uy,
        _ => false,
    }
}

fn compare_f(c: Cmp, x: f64, y: f64) -> bool {
    let nan = x.is_nan() || y.is_nan();
    match c {
        Cmp::Eq => x == y,
        Cmp::Ne => !nan && x != y,
        Cmp::Lt => x < y,
        Cmp::Le => x <= y,
        Cmp::Gt => x > y,
        Cmp::Ge => x >= y,
        Cmp::Equ => nan || x == y,
        Cmp::Neu => nan || x != y,
        Cmp::Ltu => nan || x < y,
        Cmp::Leu => nan || x <= y,
        Cmp::Gtu => nan || x > y,
        Cmp::Geu => nan || x >= y,
        Cmp::Num => !nan,
        Cmp::Nan => nan,
        _ => false,
    }
}

/// A float register value of `ty` as f64 (with `.ftz` for f32).
fn fval(v: u64, ty: Ty, ftz: bool) -> f64 {
    match ty {
        Ty::F32 if ftz => ftz32(f32v(v)) as f64,
        Ty::F32 => f32v(v) as f64,
        Ty::F16 | Ty::Bf16 => ty.half().map_or(f64::NAN, |fmt| fmt.value(v as u16)),
        _ => f64::from_bits(v),
    }
}

fn cvt(dty: Ty, sty: Ty, rnd: Rnd, sat: bool, ftz: bool, v: u64) -> u64 {
    let dm = mask_of(dty.bits());
    match (dty.float(), sty.float()) {
        (false, false) => {
            let x = int_val(v, sty);
            if sat {
                let (lo, hi) = int_range(dty);
                (x.clamp(lo, hi) as u64) & dm
            } else {
                (x as u64) & dm
            }
        }
        (true, false) => {
            let x = int_val(v, sty);
            match dty {
                Ty::F32 => f32b(sat_if32(int_to_f32(x, rnd), sat)),
                Ty::F64 => {
                    let f = int_to_f64(x, rnd);
                    (if sat { sat64(f) } else { f }).to_bits()
                }
                _ => {
                    // Exactly hi + lo, whatever the integer's width.
                    let hi = x as f64;
                    let lo = (x - hi as i128) as f64;
                    let (hi, lo) = if sat {
                        (hi.clamp(0.0, 1.0), 0.0)
                    } else {
                        (hi, lo)
                    };
                    half_bits(hi, lo, dty, rnd)
                }
            }
        }
        (false, true) => {
            let f = round_int(fval(v, sty, ftz), rnd);
            if f.is_nan() {
                return 0;
            }
            let (lo, hi) = int_range(dty);
            // Float-to-integer conversions saturate (PTX ISA, cvt).
            let x = if f <= lo as f64 {
                lo
            } else if f >= hi as f64 {
                hi
            } else {
                f as i128
            };
            (x as u64) & dm
        }
        (true, true) => {
            let x = fval(v, sty, ftz);
            let is_int_rnd = matches!(rnd, Rnd::Rni | Rnd::Rzi | Rnd::Rmi | Rnd::Rpi);
            match dty {
                Ty::F64 => {
                    let f = if is_int_rnd { round_int(x, rnd) } else { x };
                    (if sat { sat64(f) } else { f }).to_bits()
                }
                Ty::F32 => {
                    let f = if is_int_rnd {
                        round_int(x, rnd) as f32
                    } else {
                        round32(x, 0.0, rnd)
                    };
                    let f = if ftz { ftz32(f) } else { f };
                    f32b(sat_if32(f, sat))
                }
                _ => {
                    let (f, rnd) = if is_int_rnd {
                        (round_int(x, rnd), Rnd::Rn)
                    } else {
                        (x, rnd)
                    };
                    let f = if sat && !f.is_nan() {
                        f.clamp(0.0, 1.0)
                    } else if sat {
                        0.0
                    } else {
                        f
                    };
                    half_bits(f, 0.0, dty, rnd)
                }
            }
        }
    }
}

/// Bits below the largest term's leading bit that the tensor cores keep of each term.
const MMA_KEPT_BITS: i32 = 25;

/// The tensor cores' sum of one element of `mma.sync` with 16-bit operands and an f32
/// addend, as an H200 computes it (fitted to its results on 524,288 random elements in both
/// types, every one reproduced bit for bit; `kernels/conformance/check.py`'s `mma` checks the
/// rule on any GPU): the 16 products (exact) and the addend are aligned to the largest
/// exponent among them (a product's exponent is the sum of its factors', whatever its
/// significand), each term is cut toward zero below 2^-25 of that, the rest is summed exactly
/// and rounded to f32 toward zero. The PTX ISA leaves the order and precision of the sum to
/// the hardware; this is the only place the stand-in follows one GPU rather than the ISA.
fn mma_sum(pairs: impl Iterator<Item = (f64, f64)>, addend: f64) -> f32 {
    // Every value here (a 16-bit or f32 value as f64) is a normal f64: its exponent field is
    // floor(log2 |x|).
    let exponent = |x: f64| ((x.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    let mut terms = [(0.0f64, 0i32); 17];
    let mut largest = i32::MIN;
    let mut plain = addend;
    for (slot, (a, b)) in terms.iter_mut().zip(pairs) {
        let product = a * b;
        plain += product;
        if product != 0.0 {
            *slot = (product, exponent(a) + exponent(b));
            largest = largest.max(slot.1);
        }
    }
    if addend != 0.0 {
        terms[16] = (addend, exponent(addend));
        largest = largest.max(terms[16].1);
    }
    if largest == i32::MIN || !plain.is_finite() {
        // All zero (IEEE's sign of the sum), or an infinity or NaN among the terms.
        return plain as f32;
    }
    let unit = 2f64.powi(largest - MMA_KEPT_BITS);
    // Each cut term is a multiple of `unit` below 2^28 units: the sum is exact in f64.
    let sum: f64 = terms.iter().map(|&(t, _)| (t / unit).trunc() * unit).sum();
    round32(sum, 0.0, Rnd::Rz)
}

/// `hi + lo` rounded to the 16-bit type `ty` with `rnd`, as register bits.
fn half_bits(hi: f64, lo: f64, ty: Ty, rnd: Rnd) -> u64 {
    let fmt = ty.half().unwrap_or(Half::F16);
    u64::from(round_half(hi, lo, fmt, rnd))
}

fn sat_if32(f: f32, sat: bool) -> f32 {
    if sat {
        sat32(f)
    } else {
        f
    }
}

fn int_range(ty: Ty) -> (i128, i128) {
    let b = ty.bits();
    if ty.signed() {
        (-(1i128 << (b - 1)), (1i128 << (b - 1)) - 1)
    } else {
        (0, (1i128 << b) - 1)
    }
}

fn atom_apply(op: AtomOp, ty: Ty, old: u64, b: u64, c: u64) -> u64 {
    let m = mask_of(ty.bits());
    match (op, ty) {
        (AtomOp::Add, Ty::F32) => f32b(f32v(old) + f32v(b)),
        (AtomOp::Add, Ty::F64) => (f64::from_bits(old) + f64::from_bits(b)).to_bits(),
        (AtomOp::Min, Ty::F32) => f32b(f32v(old).min(f32v(b))),
        (AtomOp::Max, Ty::F32) => f32b(f32v(old).max(f32v(b))),
        (AtomOp::Min, Ty::F64) => f64::from_bits(old).min(f64::from_bits(b)).to_bits(),
        (AtomOp::Max, Ty::F64) => f64::from_bits(old).max(f64::from_bits(b)).to_bits(),
        (AtomOp::Add, _) => old.wrapping_add(b) & m,
        (AtomOp::Min, _) => (int_val(old, ty).min(int_val(b, ty)) as u64) & m,
        (AtomOp::Max, _) => (int_val(old, ty).max(int_val(b, ty)) as u64) & m,
        (AtomOp::Inc, _) => {
            let (o, b) = (old & m, b & m);
            if o >= b {
                0
            } else {
                o + 1
            }
        }
        (AtomOp::Dec, _) => {
            let (o, b) = (old & m, b & m);
            if o == 0 || o > b {
                b
            } else {
                o - 1
            }
        }
        (AtomOp::And, _) => old & b,
        (AtomOp::Or, _) => old | b,
        (AtomOp::Xor, _) => old ^ b,
        (AtomOp::Exch, _) => b,
        (AtomOp::Cas, _) => {
            if old & m == b & m {
                c
            } else {
                old
            }
        }
    }
}

/// What one launch shares across its workers.
struct Ctx<'a> {
    k: &'a Kernel,
    /// The kernel's register template with module variable addresses filled in.
    template: &'a [u64],
    code: &'a [Inst],
    launch: &'a Launch<'a>,
    mem: &'a dyn GlobalMemory,
    nslots: usize,
    nthreads: usize,
    /// Whether the host CPU has fused multiply-add instructions.
    fma: bool,
}

/// Why a thread's run stopped.
enum Stop {
    Sync,
    Exit,
}

fn dim_of(i: usize, d: Dim3) -> (u32, u32, u32) {
    let (x, y) = (d.x as usize, d.y as usize);
    ((i % x) as u32, ((i / x) % y) as u32, (i / (x * y)) as u32)
}

impl Ctx<'_> {
    fn where_(&self, block: usize, t: usize, line: u32) -> String {
        let b = dim_of(block, self.launch.grid);
        let th = dim_of(t, self.launch.block);
        format!(
            "kernel `{}` block ({},{},{}) thread ({},{},{}) line {line}",
            self.k.name, b.0, b.1, b.2, th.0, th.1, th.2
        )
    }

    fn mem_err(&self, e: MemErr, block: usize, t: usize, line: u32) -> ExecError {
        let w = self.where_(block, t, line);
        match e {
            MemErr::Illegal(s) => ExecError::IllegalAddress(format!("{w}: {s}")),
            MemErr::Misaligned(s) => ExecError::MisalignedAddress(format!("{w}: {s}")),
            MemErr::Failed(s) => ExecError::LaunchFailed(format!("{w}: {s}")),
        }
    }

    /// Runs thread `t` until it syncs or exits: the loop compiled with the host's FMA unit
    /// when it has one (so that `fma.rn.f32` is one instruction, not a call into libm's
    /// software-dispatched `fmaf`), else the portable one. Both compute the same, correctly
    /// rounded results.
    fn run_thread(
        &self,
        r: &mut [u64],
        th: &mut Thread,
        bm: &mut BlockMem,
        block: usize,
        t: usize,
    ) -> Result<Stop, ExecError> {
        let checked = bm.race.is_some() || bm.profile.is_some();
        #[cfg(target_arch = "x86_64")]
        if self.fma {
            // SAFETY: `self.fma` is set only when the CPU reports the FMA extension.
            return unsafe {
                match checked {
                    true => self.run_thread_fma::<true>(r, th, bm, block, t),
                    false => self.run_thread_fma::<false>(r, th, bm, block, t),
                }
            };
        }
        match checked {
            true => self.run_thread_checked(r, th, bm, block, t),
            false => self.run_thread_body::<false>(r, th, bm, block, t),
        }
    }

    /// The loop with the race check's recording and the profile's counting, kept out of line so
    /// that the unchecked loop is compiled as before.
    #[inline(never)]
    fn run_thread_checked(
        &self,
        r: &mut [u64],
        th: &mut Thread,
        bm: &mut BlockMem,
        block: usize,
        t: usize,
    ) -> Result<Stop, ExecError> {
        self.run_thread_body::<true>(r, th, bm, block, t)
    }

    /// The loop (checked with `RC`, as [`Self::run_thread_body`] says) on the host's FMA unit.
    ///
    /// # Safety
    /// The CPU must support FMA (`is_x86_feature_detected!("fma")`).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "fma")]
    unsafe fn run_thread_fma<const RC: bool>(
        &self,
        r: &mut [u64],
        th: &mut Thread,
        bm: &mut BlockMem,
        block: usize,
        t: usize,
    ) -> Result<Stop, ExecError> {
        self.run_thread_body::<RC>(r, th, bm, block, t)
    }

    /// The interpreter loop; with `RC` (the race check or the profile on: `bm.race` or
    /// `bm.profile` set) each instruction that runs is counted in the profile, and under the
    /// race check every shared access takes the general, recorded path.
    #[inline(always)]
    fn run_thread_body<const RC: bool>(
        &self,
        r: &mut [u64],
        th: &mut Thread,
        bm: &mut BlockMem,
        block: usize,
        t: usize,
    ) -> Result<Stop, ExecError> {
        let code = self.code;
        let mut pc = th.pc as usize;
        let mut count = 0u64;
        macro_rules! fail {
            ($e:expr) => {{
                let line = code.get(pc).map_or(0, |i| i.line);
                th.pc = pc as u32;
                bm.executed += count;
                return Err(self.mem_err($e, block, t, line));
            }};
        }
        // `?` for the interpreter: a memory error stops the thread through `fail!`.
        macro_rules! or_fail {
            ($r:expr) => {
                match $r {
                    Ok(v) => v,
                    Err(e) => fail!(e),
                }
            };
        }
        // Shared accesses take the general path only to be recorded for the race check.
        let recorded = RC && bm.race.is_some();
        loop {
            let Some(inst) = code.get(pc) else {
                fail!(MemErr::Failed("ran off the end of the code".into()));
            };
            count += 1;
            if RC {
                if let Some(rs) = bm.race.as_deref_mut() {
                    rs.line = inst.line;
                }
            }
            if inst.guard != NO_GUARD && ((r[inst.guard as usize] != 0) == inst.neg) {
                pc += 1;
                continue;
            }
            if RC {
                if let Some(profile) = bm.profile.as_deref_mut() {
                    profile[pc] += 1;
                    if matches!(inst.op, Op::LdSharedFma { .. }) {
                        profile[pc + 1] += 1; // the fused fma
                    }
                }
            }
            match &inst.op {
                &Op::AddI32 { d, a, b } => {
                    r[d as usize] = (r[a as usize].wrapping_add(r[b as usize])) & 0xffff_ffff
                }
                &Op::AddI64 { d, a, b } => {
                    r[d as usize] = r[a as usize].wrapping_add(r[b as usize])
                }
                &Op::AddF32 { d, a, b } => {
                    r[d as usize] = f32b(f32v(r[a as usize]) + f32v(r[b as usize]))
                }
                &Op::MulF32 { d, a, b } => {
                    r[d as usize] = f32b(f32v(r[a as usize]) * f32v(r[b as usize]))
                }
                &Op::FmaF32 { d, a, b, c } => {
                    r[d as usize] =
                        f32b(f32v(r[a as usize]).mul_add(f32v(r[b as usize]), f32v(r[c as usize])))
                }
                &Op::Mov { d, a, mask } => r[d as usize] = r[a as usize] & mask,
                &Op::LdShared32 { d, addr } => {
                    let a = r[addr.base as usize].wrapping_add(addr.off as u64);
                    let fast = if recorded {
                        None
                    } else {
                        shared32(&bm.shared, a)
                    };
                    r[d as usize] = match fast {
                        Some(v) => v as u64,
                        // Out of bounds or misaligned: the general path reports it.
                        None => or_fail!(bm.load(self.mem, Space::Shared, a, 4, t)),
                    };
                }
                &Op::LdSharedFma {
                    d,
                    base,
                    off,
                    fd,
                    fa,
                    fb,
                    fc,
                } => {
                    let a = r[base as usize].wrapping_add(off as i64 as u64);
                    let fast = if recorded {
                        None
                    } else {
                        shared32(&bm.shared, a)
                    };
                    r[d as usize] = match fast {
                        Some(v) => v as u64,
                        // Out of bounds or misaligned: the general path reports it.
                        None => or_fail!(bm.load(self.mem, Space::Shared, a, 4, t)),
                    };
                    r[fd as usize] = f32b(
                        f32v(r[fa as usize]).mul_add(f32v(r[fb as usize]), f32v(r[fc as usize])),
                    );
                    // The fma's own instruction is skipped, but counted.
                    count += 1;
                    pc += 2;
                    continue;
                }
                &Op::StShared32 { s, addr } => {
                    let a = r[addr.base as usize].wrapping_add(addr.off as u64);
                    let v = r[s as usize];
                    let fast = match recorded {
                        true => None,
                        false => shared32_mut(&mut bm.shared, a),
                    };
                    match fast {
                        Some(b) => *b = (v as u32).to_le_bytes(),
                        None => {
                            or_fail!(bm.store(self.mem, Space::Shared, a, 4, v, t));
                        }
                    }
                }
                &Op::BraIf { p, neg, target } => {
                    if (r[p as usize] != 0) != neg {
                        pc = target as usize;
                        continue;
                    }
                }
                &Op::IBin { op, ty, d, a, b } => {
                    r[d as usize] = ibin(op, ty, r[a as usize], r[b as usize])
                }
                &Op::AddCc {
                    carry_in,
                    carry_out,
                    ty,
                    sub,
                    d,
                    a,
                    b,
                } => {
                    let cin = carry_in_bit(r, carry_in);
                    let (v, carry) = add_cc(ty, (r[a as usize], r[b as usize]), cin, sub);
                    r[d as usize] = v;
                    if carry_out {
                        r[CARRY as usize] = carry;
                    }
                }
                &Op::IUn { op, ty, d, a } => r[d as usize] = iun(op, ty, r[a as usize]),
                &Op::Mad {
                    mul,
                    ty,
                    sat,
                    d,
                    a,
                    b,
                    c,
                } => {
                    let p = ibin(mul, ty, r[a as usize], r[b as usize]);
                    let rty = if mul == IOp::MulWide {
                        crate::decode::wide(ty)
                    } else {
                        ty
                    };
                    r[d as usize] = if sat {
                        (sx(p, 32) + sx(r[c as usize], 32)).clamp(i32::MIN as i64, i32::MAX as i64)
                            as u64
                            & 0xffff_ffff
                    } else {
                        p.wrapping_add(r[c as usize]) & mask_of(rty.bits())
                    };
                }
                &Op::MadCc {
                    hi,
                    carry_in,
                    carry_out,
                    ty,
                    d,
                    a,
                    b,
                    c,
                } => {
                    let op = if hi { IOp::MulHi } else { IOp::MulLo };
                    let p = ibin(op, ty, r[a as usize], r[b as usize]);
                    let cin = carry_in_bit(r, carry_in);
                    let (v, carry) = add_cc(ty, (p, r[c as usize]), cin, false);
                    r[d as usize] = v;
                    if carry_out {
                        r[CARRY as usize] = carry;
                    }
                }
                &Op::Bfe { ty, d, a, b, c } => {
                    let bits = ty.bits();
                    let pos = (r[b as usize] & 0xff) as u32;
                    let len = (r[c as usize] & 0xff) as u32;
                    let v = r[a as usize] & mask_of(bits);
                    let sbit = if ty.signed() {
                        if len == 0 {
                            false
                        } else {
                            (v >> (pos + len - 1).min(bits - 1)) & 1 == 1
                        }
                    } else {
                        false
                    };
                    let mut out = 0u64;
                    for i in 0..bits {
                        let bit = if i < len && pos + i < bits {
                            (v >> (pos + i)) & 1
                        } else {
                            sbit as u64
                        };
                        out |= bit << i;
                    }
                    r[d as usize] = out;
                }
                &Op::Bfi { ty, d, f, a, b, c } => {
                    let bits = ty.bits();
                    let pos = (r[b as usize] & 0xff) as u32;
                    let len = (r[c as usize] & 0xff) as u32;
                    let (mut out, fv) = (r[a as usize] & mask_of(bits), r[f as usize]);
                    for i in 0..len {
                        if pos + i >= bits {
                            break;
                        }
                        out = (out & !(1 << (pos + i))) | (((fv >> i) & 1) << (pos + i));
                    }
                    r[d as usize] = out;
                }
                &Op::Prmt { mode, d, a, b, c } => {
                    let bytes =
                        ((r[b as usize] & 0xffff_ffff) << 32) | (r[a as usize] & 0xffff_ffff);
                    let sel = r[c as usize];
                    let mut out = 0u64;
                    if mode != 0 {
                        // Source byte of d.b0..d.b3 for each mode and selector c[1:0] (PTX ISA).
                        const T: [[[u8; 4]; 4]; 6] = [
                            [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]],
                            [[0, 7, 6, 5], [1, 0, 7, 6], [2, 1, 0, 7], [3, 2, 1, 0]],
                            [[0, 0, 0, 0], [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]],
                            [[0, 1, 2, 3], [1, 1, 2, 3], [2, 2, 2, 3], [3, 3, 3, 3]],
                            [[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 2, 2], [0, 1, 2, 3]],
                            [[0, 1, 0, 1], [2, 3, 2, 3], [0, 1, 0, 1], [2, 3, 2, 3]],
                        ];
                        let row = T[mode as usize - 1][(sel & 3) as usize];
                        for (i, &s) in row.iter().enumerate() {
                            out |= ((bytes >> (8 * s)) & 0xff) << (8 * i);
                        }
                        r[d as usize] = out;
                        pc += 1;
                        continue;
                    }
                    for i in 0..4 {
                        let s = (sel >> (4 * i)) & 0xf;
                        let mut byte = (bytes >> (8 * (s & 7))) & 0xff;
                        if s & 8 != 0 {
                            byte = if byte & 0x80 != 0 { 0xff } else { 0 };
                        }
                        out |= byte << (8 * i);
                    }
                    r[d as usize] = out;
                }
                &Op::Sad { ty, d, a, b, c } => {
                    let m = mask_of(ty.bits());
                    let (x, y) = (int_val(r[a as usize], ty), int_val(r[b as usize], ty));
                    r[d as usize] = ((x - y).unsigned_abs() as u64).wrapping_add(r[c as usize]) & m;
                }
                &Op::Szext {
                    signed,
                    clamp,
                    d,
                    a,
                    b,
                } => {
                    let n = clamp_or_wrap(r[b as usize] as u32, clamp);
                    let v = r[a as usize] & 0xffff_ffff;
                    r[d as usize] = match n {
                        0 => 0,
                        32.. => v,
                        n if signed => sx(v, n) as u64 & 0xffff_ffff,
                        n => v & mask_of(n),
                    };
                }
                &Op::Bmsk { clamp, d, a, b } => {
                    let pos = clamp_or_wrap(r[a as usize] as u32, clamp);
                    let len = clamp_or_wrap(r[b as usize] as u32, clamp);
                    r[d as usize] = if pos >= 32 {
                        0
                    } else {
                        (mask_of(len) << pos) & 0xffff_ffff
                    };
                }
                &Op::Fns { d, mask, base, off } => {
                    let m = r[mask as usize] as u32;
                    let base = (r[base as usize] as u32).min(32) as i64;
                    let off = r[off as usize] as u32 as i32;
                    let mut out = 0xffff_ffffu64;
                    if off == 0 {
                        if base < 32 && m >> base & 1 == 1 {
                            out = base as u64;
                        }
                    } else {
                        let step = if off > 0 { 1 } else { -1 };
                        let mut left = off.unsigned_abs() - 1;
                        let mut pos = base;
                        while (0..32).contains(&pos) {
                            if m >> pos & 1 == 1 {
                                if left == 0 {
                                    out = pos as u64;
                                    break;
                                }
                                left -= 1;
                            }
                            pos += step;
                        }
                    }
                    r[d as usize] = out;
                }
                &Op::Dp {
                    half,
                    a_signed,
                    b_signed,
                    d,
                    a,
                    b,
                    c,
                } => {
                    let (x, y) = (r[a as usize], r[b as usize]);
                    let byte = |v: u64, i: u32, s: bool| {
                        let v = (v >> (8 * i)) & 0xff;
                        if s {
                            sx(v, 8)
                        } else {
                            v as i64
                        }
                    };
                    let mut acc = r[c as usize] as i64;
                    match half {
                        None => {
                            for i in 0..4 {
                                acc = acc.wrapping_add(byte(x, i, a_signed) * byte(y, i, b_signed));
                            }
                        }
                        Some(hi) => {
                            let first = if hi { 2 } else { 0 };
                            for i in 0..2 {
                                let h = (x >> (16 * i)) & 0xffff;
                                let h = if a_signed { sx(h, 16) } else { h as i64 };
                                acc = acc.wrapping_add(h * byte(y, first + i, b_signed));
                            }
                        }
                    }
                    r[d as usize] = acc as u64 & 0xffff_ffff;
                }
                &Op::Lop3 { d, a, b, c, lut } => {
                    let (x, y, z) = (
                        r[a as usize] as u32,
                        r[b as usize] as u32,
                        r[c as usize] as u32,
                    );
                    let mut out = 0u32;
                    for i in 0..8 {
                        if lut >> i & 1 == 1 {
                            let ta = if i & 4 != 0 { x } else { !x };
                            let tb = if i & 2 != 0 { y } else { !y };
                            let tc = if i & 1 != 0 { z } else { !z };
                            out |= ta & tb & tc;
                        }
                    }
                    r[d as usize] = out as u64;
                }
                &Op::Shf {
                    left,
                    clamp,
                    d,
                    a,
                    b,
                    c,
                } => {
                    let n = clamp_or_wrap(r[c as usize] as u32, clamp);
                    let v = ((r[b as usize] & 0xffff_ffff) << 32) | (r[a as usize] & 0xffff_ffff);
                    r[d as usize] = if left { (v << n) >> 32 } else { v >> n } & 0xffff_ffff;
                }
                &Op::HalfArith {
                    op,
                    fmt,
                    lanes,
                    rnd,
                    d,
                    a,
                    b,
                    c,
                } => {
                    let (x, y, z) = (r[a as usize], r[b as usize], r[c as usize]);
                    let mut out = 0u64;
                    for lane in 0..u32::from(lanes) {
                        let of = |v: u64| (v >> (16 * lane)) as u16;
                        let v = half_op(op, fmt, rnd, of(x), of(y), of(z));
                        out |= u64::from(v) << (16 * lane);
                    }
                    r[d as usize] = out;
                }
                &Op::CvtPack { fmt, rnd, d, a, b } => {
                    let round = |v: u64| u64::from(round_half(f32v(v) as f64, 0.0, fmt, rnd));
                    r[d as usize] = round(r[a as usize]) << 16 | round(r[b as usize]);
                }
                &Op::FBin {
                    op,
                    ty,
                    rnd,
                    ftz,
                    sat,
                    d,
                    a,
                    b,
                } => {
                    r[d as usize] = if ty == Ty::F32 {
                        let (x, y) = (f32v(r[a as usize]), f32v(r[b as usize]));
                        let (x, y) = if ftz { (ftz32(x), ftz32(y)) } else { (x, y) };
                        let mut v = fbin32(op, rnd, x, y);
                        if ftz {
                            v = ftz32(v);
                        }
                        f32b(sat_if32(v, sat))
                    } else {
                        let v = fbin64(
                            op,
                            rnd,
                            f64::from_bits(r[a as usize]),
                            f64::from_bits(r[b as usize]),
                        );
                        (if sat { sat64(v) } else { v }).to_bits()
                    };
                }
                &Op::Fma {
                    ty,
                    rnd,
                    ftz,
                    sat,
                    d,
                    a,
                    b,
                    c,
                } => {
                    r[d as usize] = if ty == Ty::F32 {
                        let f = |s: Slot| {
                            let v = f32v(r[s as usize]);
                            if ftz {
                                ftz32(v)
                            } else {
                                v
                            }
                        };
                        let mut v = fma32(f(a), f(b), f(c), rnd);
                        if ftz {
                            v = ftz32(v);
                        }
                        f32b(sat_if32(v, sat))
                    } else {
                        let v = fma64(
                            f64::from_bits(r[a as usize]),
                            f64::from_bits(r[b as usize]),
                            f64::from_bits(r[c as usize]),
                            rnd,
                        );
                        (if sat { sat64(v) } else { v }).to_bits()
                    };
                }
                &Op::FUn {
                    op,
                    ty,
                    rnd,
                    ftz,
                    d,
                    a,
                } => {
                    r[d as usize] = if ty == Ty::F32 {
                        let x = f32v(r[a as usize]);
                        let x = if ftz { ftz32(x) } else { x };
                        let v = fun32(op, rnd, x);
                        f32b(if ftz { ftz32(v) } else { v })
                    } else {
                        fun64(op, rnd, f64::from_bits(r[a as usize])).to_bits()
                    };
                }
                &Op::Testp { op, ty, d, a } => {
                    let x = fval(r[a as usize], ty, false);
                    let sub = if ty == Ty::F32 {
                        (x as f32).is_subnormal()
                    } else {
                        x.is_subnormal()
                    };
                    let norm = if ty == Ty::F32 {
                        (x as f32).is_normal()
                    } else {
                        x.is_normal()
                    };
                    r[d as usize] = match op {
                        0 => x.is_finite(),
                        1 => x.is_infinite(),
                        2 => !x.is_nan(),
                        3 => x.is_nan(),
                        4 => norm,
                        _ => sub,
                    } as u64;
                }
                Op::Setp {
                    cmp,
                    ty,
                    ftz,
                    d,
                    dn,
                    a,
                    b,
                    comb,
                } => {
                    let (x, y) = (r[*a as usize], r[*b as usize]);
                    let mut v = if ty.float() {
                        compare_f(*cmp, fval(x, *ty, *ftz), fval(y, *ty, *ftz))
                    } else {
                        compare_int(*cmp, *ty, x, y)
                    };
                    let mut vn = !v;
                    if let Some((op, p, neg)) = comb {
                        let q = (r[*p as usize] != 0) != *neg;
                        let f = |v: bool| match op {
                            BoolOp::And => v && q,
                            BoolOp::Or => v || q,
                            BoolOp::Xor => v ^ q,
                        };
                        (v, vn) = (f(v), f(vn));
                    }
                    r[*d as usize] = v as u64;
                    r[*dn as usize] = vn as u64;
                }
                &Op::Selp { mask, d, a, b, p } => {
                    r[d as usize] = if r[p as usize] != 0 {
                        r[a as usize]
                    } else {
                        r[b as usize]
                    } & mask
                }
                &Op::Slct {
                    ty,
                    cty,
                    ftz,
                    d,
                    a,
                    b,
                    c,
                } => {
                    let ge = if cty == Ty::F32 {
                        fval(r[c as usize], Ty::F32, ftz) >= 0.0
                    } else {
                        sx(r[c as usize], 32) >= 0
                    };
                    r[d as usize] =
                        if ge { r[a as usize] } else { r[b as usize] } & mask_of(ty.bits());
                }
                &Op::Pack { bits, d, srcs, n } => {
                    let mut v = 0u64;
                    for (i, s) in srcs.iter().take(n as usize).enumerate() {
                        v |= (r[*s as usize] & mask_of(bits)) << (bits as usize * i);
                    }
                    r[d as usize] = v;
                }
                &Op::Unpack { bits, dsts, n, a } => {
                    let v = r[a as usize];
                    for (i, s) in dsts.iter().take(n as usize).enumerate() {
                        r[*s as usize] = (v >> (bits as usize * i)) & mask_of(bits);
                    }
                }
                &Op::Cvt {
                    dty,
                    sty,
                    rnd,
                    sat,
                    ftz,
                    d,
                    a,
                } => r[d as usize] = cvt(dty, sty, rnd, sat, ftz, r[a as usize]),
                &Op::Cvta {
                    to,
                    space,
                    bits32,
                    d,
                    a,
                } => {
                    let v = r[a as usize];
                    let base = match space {
                        Space::Shared => GENERIC_SHARED_BASE,
                        Space::Local => GENERIC_LOCAL_BASE,
                        _ => 0,
                    };
                    let out = if to {
                        v.wrapping_sub(base)
                    } else {
                        v.wrapping_add(base)
                    };
                    r[d as usize] = if bits32 { out & 0xffff_ffff } else { out };
                }
                Op::Ld { at, d } => {
                    let (ty, size) = (at.ty, at.ty.bytes());
                    // 32-bit shared values (a vector's too) as `LdShared32` reads them.
                    let shared = !recorded && at.space == Space::Shared && size == 4;
                    for (a, dst) in or_fail!(vector_addrs(r, at, "load")).zip(d) {
                        let fast = if shared {
                            shared32(&bm.shared, a)
                        } else {
                            None
                        };
                        let v = match fast {
                            Some(v) => v as u64,
                            None => or_fail!(bm.load(self.mem, at.space, a, size, t)),
                        };
                        r[*dst as usize] = if ty.signed() {
                            sx(v, ty.bits()) as u64
                        } else {
                            v
                        };
                    }
                }
                Op::St { at, s } => {
                    let size = at.ty.bytes();
                    // As `StShared32` writes them.
                    let shared = !recorded && at.space == Space::Shared && size == 4;
                    for (a, src) in or_fail!(vector_addrs(r, at, "store")).zip(s) {
                        let v = r[*src as usize];
                        let fast = match shared {
                            true => shared32_mut(&mut bm.shared, a),
                            false => None,
                        };
                        match fast {
                            Some(b) => *b = (v as u32).to_le_bytes(),
                            None => or_fail!(bm.store(self.mem, at.space, a, size, v, t)),
                        }
                    }
                }
                &Op::Atom {
                    space,
                    op,
                    ty,
                    d,
                    addr,
                    b,
                    c,
                } => {
                    let a = r[addr.base as usize].wrapping_add(addr.off as u64);
                    let (bv, cv) = (r[b as usize], r[c as usize]);
                    let f = move |old: u64| atom_apply(op, ty, old, bv, cv);
                    r[d as usize] = or_fail!(bm.atom(self.mem, space, a, &f, ty.bytes(), t));
                }
                &Op::Bra { target } => {
                    pc = target as usize;
                    continue;
                }
                Op::Call(info) => {
                    let callee = &self.k.prog.funcs[info.func];
                    if th.stack.len() >= 64 || th.stack.iter().any(|&(_, c)| matches!(&code[c as usize].op, Op::Call(i) if i.func == info.func)) {
                        fail!(MemErr::Failed(format!("recursive call of `{}` is not supported", callee.name)));
                    }
                    bm.copy_fparams(t, &info.args);
                    th.stack.push(((pc + 1) as u32, pc as u32));
                    pc = callee.start as usize;
                    continue;
                }
                Op::Ret => match th.stack.pop() {
                    Some((ret, call)) => {
                        if let Op::Call(info) = &code[call as usize].op {
                            bm.copy_fparams(t, &info.rets);
                        }
                        pc = ret as usize;
                        continue;
                    }
                    None => {
                        th.pc = pc as u32;
                        bm.executed += count;
                        return Ok(Stop::Exit);
                    }
                },
                Op::Exit => {
                    th.pc = pc as u32;
                    bm.executed += count;
                    return Ok(Stop::Exit);
                }
                Op::Trap => fail!(MemErr::Failed("trap".into())),
                Op::Bar { .. } => {
                    th.pc = pc as u32;
                    th.status = Status::Bar;
                    bm.executed += count;
                    return Ok(Stop::Sync);
                }
                Op::Shfl { .. } | Op::Vote { .. } | Op::WarpSync { .. } | Op::Mma { .. } => {
                    th.pc = pc as u32;
                    th.status = Status::Warp;
                    bm.executed += count;
                    return Ok(Stop::Sync);
                }
                &Op::Activemask { d } => {
                    // Without a model of convergence: the lanes of the warp that have not exited.
                    r[d as usize] = self.active_guess(t);
                }
                &Op::Clock { d } => {
                    bm.clock += 1;
                    r[d as usize] = bm.clock;
                }
                Op::Nop => {}
            }
            pc += 1;
        }
    }

    fn active_guess(&self, t: usize) -> u64 {
        let w = t / 32 * 32;
        let n = (self.nthreads - w).min(32);
        mask_of(n as u32)
    }
}

fn has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Runs one launch.
pub(crate) fn run(
    k: &Kernel,
    launch: &Launch<'_>,
    mem: &dyn GlobalMemory,
    globals: &[u64],
) -> Result<Stats, ExecError> {
    let (g, b) = (launch.grid, launch.block);
    if [g.x, g.y, g.z, b.x, b.y, b.z].contains(&0) {
        return Err(ExecError::InvalidValue(format!(
            "kernel `{}`: a zero grid or block dimension",
            k.name
        )));
    }
    let nthreads = b.x as usize * b.y as usize * b.z as usize;
    if nthreads > 1024 {
        return Err(ExecError::InvalidValue(format!(
            "kernel `{}`: {nthreads} threads per block (at most 1024)",
            k.name
        )));
    }
    if launch.params.len() != k.param_bytes {
        return Err(ExecError::InvalidValue(format!(
            "kernel `{}`: {} bytes of parameters, the kernel takes {}",
            k.name,
            launch.params.len(),
            k.param_bytes
        )));
    }
    let nblocks = g.x as usize * g.y as usize * g.z as usize;
    let mut template = std::borrow::Cow::Borrowed(&k.template[..]);
    for &(slot, gi) in &k.global_slots {
        match globals.get(gi) {
            Some(&a) => template.to_mut()[slot as usize] = a,
            None => {
                return Err(ExecError::InvalidValue(format!(
                    "kernel `{}` uses module variable `{}` (index {gi}), but no device address was given for it ({} given)",
                    k.name,
                    k.prog.globals[gi].name,
                    globals.len()
                )))
            }
        }
    }
    let ctx = Ctx {
        k,
        template: &template,
        code: &k.prog.code,
        launch,
        mem,
        nslots: k.template.len(),
        nthreads,
        fma: has_fma(),
    };
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let first: Mutex<Option<(usize, ExecError)>> = Mutex::new(None);
    let total = AtomicU64::new(0);
    let profile = Mutex::new(vec![
        0u64;
        if launch.profile { k.prog.code.len() } else { 0 }
    ]);
    let workers = launch.threads.clamp(1, nblocks);
    let work = || {
        let mut bm = BlockMem {
            shared: vec![0; k.shared_bytes(launch.dynamic_shared)],
            local: vec![0; k.prog.local_bytes * nthreads],
            local_size: k.prog.local_bytes,
            fparam: vec![0; k.prog.fparam_bytes * nthreads],
            fparam_size: k.prog.fparam_bytes,
            params: launch.params,
            cache: PageCache::new(),
            clock: 0,
            executed: 0,
            profile: launch.profile.then(|| vec![0; k.prog.code.len()]),
            race: launch.race_check.then(|| {
                Box::new(RaceState::new(
                    k.shared_bytes(launch.dynamic_shared),
                    nthreads,
                    launch.block,
                ))
            }),
        };
        // Every thread's whole register file once; a block then starts afresh only the slots
        // the kernel writes (`Kernel::written`): a module's other entries can hold most of it.
        let mut regs = ctx.template.repeat(nthreads);
        let mut threads: Vec<Thread> = (0..nthreads)
            .map(|_| Thread {
                pc: 0,
                status: Status::Ready,
                stack: Vec::new(),
            })
            .collect();
        while !stop.load(Ordering::Relaxed) {
            let blk = next.fetch_add(1, Ordering::Relaxed);
            if blk >= nblocks {
                break;
            }
            if let Err(e) = ctx.run_block(blk, &mut bm, &mut regs, &mut threads) {
                stop.store(true, Ordering::Relaxed);
                let mut f = first.lock().unwrap_or_else(|p| p.into_inner());
                if f.as_ref().is_none_or(|(b, _)| blk < *b) {
                    *f = Some((blk, e));
                }
            }
        }
        total.fetch_add(bm.executed, Ordering::Relaxed);
        if let Some(counts) = bm.profile {
            let mut merged = profile.lock().unwrap_or_else(|p| p.into_inner());
            for (sum, count) in merged.iter_mut().zip(counts) {
                *sum += count;
            }
        }
    };
    if workers == 1 {
        work();
    } else {
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(work);
            }
        });
    }
    match first.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some((_, e)) => Err(e),
        None => Ok(Stats {
            instructions: total.load(Ordering::Relaxed),
            profile: launch.profile.then(|| {
                let counts = profile.into_inner().unwrap_or_else(|p| p.into_inner());
                profile_of(&k.prog.code, &counts)
            }),
        }),
    }
}

/// What the instructions of `code`, each executed `counts[pc]` times, did.
fn profile_of(code: &[Inst], counts: &[u64]) -> Profile {
    let mut p = Profile::default();
    for (inst, &n) in code.iter().zip(counts) {
        p.instructions += n;
        match &inst.op {
            Op::LdShared32 { .. } | Op::LdSharedFma { .. } => p.shared_loads += n,
            Op::StShared32 { .. } => p.shared_stores += n,
            Op::Ld { at, .. } | Op::St { at, .. } => {
                let bytes = n * at.n as u64 * at.ty.bytes() as u64;
                match (at.space, matches!(inst.op, Op::Ld { .. })) {
                    (Space::Shared, true) => p.shared_loads += n,
                    (Space::Shared, false) => p.shared_stores += n,
                    (Space::Global, true) => p.global_bytes_read += bytes,
                    (Space::Global, false) => p.global_bytes_written += bytes,
                    _ => {}
                }
            }
            Op::FmaF32 { .. } | Op::Fma { ty: Ty::F32, .. } => p.fmas += n,
            // m16n8k16: 16 * 8 * 16 multiply-adds a warp, a 32nd of them each lane's.
            Op::Mma { .. } => p.fmas += n * (16 * 8 * 16 / 32),
            _ => {}
        }
    }
    p
}

impl Ctx<'_> {
    fn run_block(
        &self,
        blk: usize,
        bm: &mut BlockMem,
        regs: &mut [u64],
        threads: &mut [Thread],
    ) -> Result<(), ExecError> {
        let (l, k) = (self.launch, self.k);
        let n = self.nthreads;
        let ns = self.nslots;
        bm.shared.fill(0);
        if let Some(rs) = bm.race.as_deref_mut() {
            rs.start_block();
        }
        bm.local.fill(0);
        bm.fparam.fill(0);
        let (bx, by, bz) = dim_of(blk, l.grid);
        let dyn_smem = l.dynamic_shared as u64;
        let total_smem = bm.shared.len() as u64;
        for (t, th) in threads.iter_mut().enumerate() {
            let r = &mut regs[t * ns..(t + 1) * ns];
            for slots in &k.written {
                r[slots.clone()].copy_from_slice(&self.template[slots.clone()]);
            }
            let (tx, ty, tz) = dim_of(t, l.block);
            let lane = (t % 32) as u64;
            let specials = [
                tx as u64,
                ty as u64,
                tz as u64,
                l.block.x as u64,
                l.block.y as u64,
                l.block.z as u64,
                bx as u64,
                by as u64,
                bz as u64,
                l.grid.x as u64,
                l.grid.y as u64,
                l.grid.z as u64,
                lane,
                (t / 32) as u64,
                n.div_ceil(32) as u64,
                0,
                1,
                0,
                1 << lane,
                (1 << lane) - 1,
                (2u64 << lane) - 1,
                !((2u64 << lane) - 1) & 0xffff_ffff,
                !((1u64 << lane) - 1) & 0xffff_ffff,
                dyn_smem,
                total_smem,
            ];
            r[..specials.len()].copy_from_slice(&specials);
            th.pc = k.start;
            th.status = Status::Ready;
            th.stack.clear();
        }
        loop {
            for t in 0..n {
                if threads[t].status != Status::Ready {
                    continue;
                }
                let r = &mut regs[t * ns..(t + 1) * ns];
                if let Stop::Exit = self.run_thread(r, &mut threads[t], bm, blk, t)? {
                    threads[t].status = Status::Exited;
                }
            }
            if threads.iter().all(|t| t.status == Status::Exited) {
                return Ok(());
            }
            let mut released = self.warp_syncs(blk, regs, threads, bm.race.as_deref_mut())?;
            if !released {
                released = self.barriers(blk, regs, threads, bm.race.as_deref_mut())?;
            }
            if !released {
                return Err(self.deadlock(blk, threads));
            }
        }
    }

    /// Performs every shuffle/vote whose whole membermask waits at it.
    fn warp_syncs(
        &self,
        blk: usize,
        regs: &mut [u64],
        threads: &mut [Thread],
        mut race: Option<&mut RaceState>,
    ) -> Result<bool, ExecError> {
        let (n, ns) = (self.nthreads, self.nslots);
        let mut released = false;
        for w in 0..n.div_ceil(32) {
            let lanes = w * 32..(w * 32 + 32).min(n);
            for t in lanes.clone() {
                if threads[t].status != Status::Warp {
                    continue;
                }
                let pc = threads[t].pc;
                let inst = &self.code[pc as usize];
                let mask = match inst.op {
                    Op::Shfl { mask, .. } | Op::Vote { mask, .. } => {
                        regs[t * ns + mask as usize] as u32
                    }
                    // `.aligned`: every lane of the warp executes it together.
                    Op::Mma { .. } => u32::MAX,
                    Op::WarpSync { mask } => {
                        let mask = regs[t * ns + mask as usize] as u32;
                        if self.warp_barrier(blk, w, t, mask, threads, race.as_deref_mut())? {
                            released = true;
                        }
                        continue;
                    }
                    _ => continue,
                };
                let lane = t % 32;
                if mask >> lane & 1 == 0 {
                    return Err(ExecError::LaunchFailed(format!(
                        "{}: lane {lane} executes a warp-synchronous instruction with membermask {mask:#010x}, which excludes it",
                        self.where_(blk, t, inst.line)
                    )));
                }
                let mut ready = true;
                for i in 0..32 {
                    if mask >> i & 1 == 0 {
                        continue;
                    }
                    let u = w * 32 + i;
                    if u >= n || threads[u].status == Status::Exited {
                        return Err(ExecError::LaunchFailed(format!(
                            "{}: lane {i} of membermask {mask:#010x} {} and can never reach this warp-synchronous instruction",
                            self.where_(blk, t, inst.line),
                            if u >= n { "does not exist (partial warp)" } else { "has exited" }
                        )));
                    }
                    if threads[u].status != Status::Warp || threads[u].pc != pc {
                        ready = false;
                    }
                }
                if !ready {
                    continue;
                }
                self.exchange(blk, w, mask, &inst.op, regs, inst.line)?;
                if let Some(rs) = race.as_deref_mut() {
                    let lanes: Vec<usize> = (0..32)
                        .filter(|i| mask >> i & 1 == 1)
                        .map(|i| w * 32 + i)
                        .collect();
                    rs.warp_sync(&lanes);
                }
                for i in 0..32 {
                    if mask >> i & 1 == 1 {
                        let th = &mut threads[w * 32 + i];
                        th.pc += 1;
                        th.status = Status::Ready;
                    }
                }
                released = true;
            }
        }
        Ok(released)
    }

    /// Releases the `bar.warp.sync` lane `t` (of warp `w`) waits at with `mask` once every
    /// live lane of the mask waits at one (exited and absent lanes count as arrived).
    fn warp_barrier(
        &self,
        blk: usize,
        w: usize,
        t: usize,
        mask: u32,
        threads: &mut [Thread],
        race: Option<&mut RaceState>,
    ) -> Result<bool, ExecError> {
        let lane = t % 32;
        if mask >> lane & 1 == 0 {
            return Err(ExecError::LaunchFailed(format!(
                "{}: lane {lane} executes bar.warp.sync with membermask {mask:#010x}, which excludes it",
                self.where_(blk, t, self.code[threads[t].pc as usize].line)
            )));
        }
        let lanes: Vec<usize> = (0..32)
            .filter(|i| mask >> i & 1 == 1)
            .map(|i| w * 32 + i)
            .filter(|&u| u < self.nthreads && threads[u].status != Status::Exited)
            .collect();
        let all_there = lanes.iter().all(|&u| {
            threads[u].status == Status::Warp
                && matches!(self.code[threads[u].pc as usize].op, Op::WarpSync { .. })
        });
        if !all_there {
            return Ok(false);
        }
        if let Some(rs) = race {
            rs.warp_sync(&lanes);
        }
        for &u in &lanes {
            threads[u].pc += 1;
            threads[u].status = Status::Ready;
        }
        Ok(true)
    }

    fn exchange(
        &self,
        blk: usize,
        w: usize,
        mask: u32,
        op: &Op,
        regs: &mut [u64],
        line: u32,
    ) -> Result<(), ExecError> {
        let ns = self.nslots;
        let reg = |regs: &[u64], lane: usize, s: Slot| regs[(w * 32 + lane) * ns + s as usize];
        match *op {
            Op::Shfl {
                mode,
                d,
                p,
                a,
                b,
                c,
                ..
            } => {
                let mut vals = [0u64; 32];
                for (i, v) in vals.iter_mut().enumerate() {
                    if mask >> i & 1 == 1 {
                        *v = reg(regs, i, a);
                    }
                }
                for lane in 0..32 {
                    if mask >> lane & 1 == 0 {
                        continue;
                    }
                    let bval = (reg(regs, lane, b) & 31) as i64;
                    let cv = reg(regs, lane, c);
                    let cval = (cv & 31) as i64;
                    let seg = ((cv >> 8) & 31) as i64;
                    let l = lane as i64;
                    let max_lane = (l & seg) | (cval & !seg);
                    let min_lane = l & seg;
                    let (j, pval) = match mode {
                        ShflMode::Up => (l - bval, l - bval >= max_lane),
                        ShflMode::Down => (l + bval, l + bval <= max_lane),
                        ShflMode::Bfly => (l ^ bval, (l ^ bval) <= max_lane),
                        ShflMode::Idx => {
                            let j = min_lane | (bval & !seg);
                            (j, j <= max_lane)
                        }
                    };
                    let j = if pval { j } else { l };
                    if !(0..32).contains(&j) || mask >> j & 1 == 0 {
                        return Err(ExecError::LaunchFailed(format!(
                            "{}: shfl.sync reads lane {j}, outside membermask {mask:#010x}",
                            self.where_(blk, w * 32 + lane, line)
                        )));
                    }
                    let base = (w * 32 + lane) * ns;
                    regs[base + d as usize] = vals[j as usize] & 0xffff_ffff;
                    regs[base + p as usize] = pval as u64;
                }
            }
            Op::Mma { fmt, d, a, b, c } => {
                // The fragments of the PTX ISA's m16n8k16 layouts for 16-bit A and B and f32 C
                // and D: lane = 4 * group + t; A's register r holds rows group (+8 for r odd),
                // columns 2t, 2t+1 (+8 for r >= 2); B's register r rows 2t, 2t+1 (+8 for r = 1)
                // of column group; C's and D's value i row group (+8 for i >= 2), column
                // 2t + i % 2.
                let (mut am, mut bm, mut cm) = ([[0f64; 16]; 16], [[0f64; 8]; 16], [[0f64; 8]; 16]);
                for lane in 0..32 {
                    let (g, t) = (lane / 4, lane % 4);
                    for (r, &slot) in a.iter().enumerate() {
                        let v = reg(regs, lane, slot);
                        let (row, col) = (g + 8 * (r % 2), 2 * t + 8 * (r / 2));
                        am[row][col] = fmt.value(v as u16);
                        am[row][col + 1] = fmt.value((v >> 16) as u16);
                    }
                    for (r, &slot) in b.iter().enumerate() {
                        let v = reg(regs, lane, slot);
                        let row = 2 * t + 8 * r;
                        bm[row][g] = fmt.value(v as u16);
                        bm[row + 1][g] = fmt.value((v >> 16) as u16);
                    }
                    for (i, &slot) in c.iter().enumerate() {
                        cm[g + 8 * (i / 2)][2 * t + i % 2] = f32v(reg(regs, lane, slot)) as f64;
                    }
                }
                for lane in 0..32 {
                    let (g, t) = (lane / 4, lane % 4);
                    for (i, &slot) in d.iter().enumerate() {
                        let (row, col) = (g + 8 * (i / 2), 2 * t + i % 2);
                        let pairs = (0..16).map(|k| (am[row][k], bm[k][col]));
                        let v = mma_sum(pairs, cm[row][col]);
                        regs[(w * 32 + lane) * ns + slot as usize] = f32b(v);
                    }
                }
            }
            Op::Vote {
                mode, d, a, neg, ..
            } => {
                let mut ballot = 0u32;
                for i in 0..32 {
                    if mask >> i & 1 == 1 && (reg(regs, i, a) != 0) != neg {
                        ballot |= 1 << i;
                    }
                }
                let v = match mode {
                    VoteMode::Ballot => ballot as u64,
                    VoteMode::All => (ballot == mask) as u64,
                    VoteMode::Any => (ballot != 0) as u64,
                    VoteMode::Uni => (ballot == mask || ballot == 0) as u64,
                };
                for lane in 0..32 {
                    if mask >> lane & 1 == 1 {
                        regs[(w * 32 + lane) * ns + d as usize] = v;
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Releases a barrier every live thread (or its thread count) has reached.
    fn barriers(
        &self,
        blk: usize,
        regs: &mut [u64],
        threads: &mut [Thread],
        mut race: Option<&mut RaceState>,
    ) -> Result<bool, ExecError> {
        let ns = self.nslots;
        let live = threads
            .iter()
            .filter(|t| t.status != Status::Exited)
            .count();
        let mut released = false;
        let waiting: Vec<usize> = (0..threads.len())
            .filter(|&t| threads[t].status == Status::Bar)
            .collect();
        let mut ids: Vec<u64> = Vec::new();
        for &t in &waiting {
            if let Op::Bar { id, .. } = self.code[threads[t].pc as usize].op {
                let v = regs[t * ns + id as usize] & 0xffff_ffff;
                if !ids.contains(&v) {
                    ids.push(v);
                }
            }
        }
        for id in ids {
            let group: Vec<usize> = waiting
                .iter()
                .copied()
                .filter(|&t| matches!(self.code[threads[t].pc as usize].op, Op::Bar { id: s, .. } if regs[t * ns + s as usize] & 0xffff_ffff == id))
                .collect();
            let Some(&first) = group.first() else {
                continue;
            };
            let Op::Bar { count, aligned, .. } = self.code[threads[first].pc as usize].op else {
                continue;
            };
            let need = if count == SINK {
                live
            } else {
                (regs[first * ns + count as usize] & 0xffff_ffff) as usize
            };
            if group.len() < need {
                continue;
            }
            if aligned {
                if let Some(&other) = group.iter().find(|&&t| threads[t].pc != threads[first].pc) {
                    return Err(ExecError::LaunchFailed(format!(
                        "{}: divergent bar.sync {id}: another thread waits at line {}",
                        self.where_(blk, first, self.code[threads[first].pc as usize].line),
                        self.code[threads[other].pc as usize].line
                    )));
                }
            }
            let released_threads = &group[..need.max(1).min(group.len())];
            self.reduce_at_barrier(regs, threads, released_threads);
            for &t in released_threads {
                threads[t].pc += 1;
                threads[t].status = Status::Ready;
            }
            if need >= live {
                // The whole block: every earlier shared access is ordered before every later one.
                if let Some(rs) = race.as_deref_mut() {
                    rs.barrier();
                }
            }
            released = true;
        }
        Ok(released)
    }

    /// `bar.red`: writes each of `released`'s `d` with the reduction of their predicates `c`
    /// (each thread's own instruction names its registers). A plain `bar` writes nothing.
    fn reduce_at_barrier(&self, regs: &mut [u64], threads: &[Thread], released: &[usize]) {
        let ns = self.nslots;
        let red_of = |t: usize| match self.code[threads[t].pc as usize].op {
            Op::Bar { red, .. } => red,
            _ => None,
        };
        let Some(BarRed { op, .. }) = released.first().and_then(|&t| red_of(t)) else {
            return;
        };
        let trues = (released.iter())
            .filter_map(|&t| red_of(t).map(|r| (regs[t * ns + r.c as usize] != 0) != r.neg))
            .filter(|&p| p)
            .count();
        let v = match op {
            BarRedOp::Popc => trues as u64,
            BarRedOp::And => u64::from(trues == released.len()),
            BarRedOp::Or => u64::from(trues > 0),
        };
        for &t in released {
            if let Some(r) = red_of(t) {
                regs[t * ns + r.d as usize] = v;
            }
        }
    }

    fn deadlock(&self, blk: usize, threads: &[Thread]) -> ExecError {
        let waiting: Vec<usize> = (0..threads.len())
            .filter(|&t| threads[t].status != Status::Exited)
            .collect();
        let Some(&t) = waiting.first() else {
            return ExecError::LaunchFailed(format!(
                "kernel `{}`: scheduler found no thread to run",
                self.k.name
            ));
        };
        let line = self.code[threads[t].pc as usize].line;
        let others: Vec<String> = waiting
            .iter()
            .filter(|&&u| threads[u].pc != threads[t].pc)
            .take(3)
            .map(|&u| {
                format!(
                    "thread {u} waits at line {}",
                    self.code[threads[u].pc as usize].line
                )
            })
            .collect();
        let exited = threads.len() - waiting.len();
        ExecError::LaunchFailed(format!(
            "{}: deadlock: the {} instruction here is never reached by the threads it waits for ({}; {exited} exited)",
            self.where_(blk, t, line),
            if threads[t].status == Status::Bar { "barrier" } else { "warp-synchronous" },
            if others.is_empty() { "all waiting threads are here".to_string() } else { others.join(", ") }
        ))
    }
}
