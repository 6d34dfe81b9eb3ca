//! A PTX parser and interpreter: runs the PTX that nvcc emits from ordinary CUDA C++ on the CPU.
//!
//! [`Module::parse`] reads and pre-decodes a module (failing on any instruction or directive it
//! does not know, naming it and its line); [`Kernel`] describes an entry point; [`run`] executes
//! one launch, every global access checked through [`GlobalMemory`].
//!
//! API CONTRACT (shared with tandem-cuda-emu; change only together).
//!
//! # What it runs
//!
//! - Module text: `.version`, `.target`, `.address_size 64`, `.entry`/`.func` (with return
//!   params and prototypes), `.param` lists (scalars, `.align N .b8 x[K]`), `.reg` with `%r<N>`
//!   ranges, `.shared` (static and `extern` dynamic) and `.local` variables, performance
//!   directives, `.pragma`, `.loc`/`.file`, `{ }` scopes, labels, `@%p`/`@!%p` guards.
//!   Module-scope `.global`/`.const` variables with or without initialisers (see "Module
//!   variables" below); an initialiser holding another variable's address, and `.extern`
//!   variables, are refused with a [`ParseError`].
//! - Integer: add/sub (.sat, .cc, addc/subc), mul/mad (.lo/.hi/.wide, 64-bit .hi),
//!   mad.cc/madc, mul24/mad24, div, rem, sad, abs, neg, min/max (and `.relu`),
//!   and/or/xor/not/cnot, shl/shr (amounts past the width clamp), popc, clz, brev, bfind
//!   (`.shiftamt`), fns, szext, bmsk, bfe, bfi, prmt (every mode), lop3, shf, dp4a, dp2a.
//! - Float (f32/f64): add/sub/mul/fma/mad/div/min/max (and `.NaN`)/abs/neg/sqrt/rcp/copysign with
//!   `.rn/.rz/.rm/.rp` (directed rounding exact via error-free transformations), `.ftz` (f32
//!   subnormal inputs and outputs flushed to signed zero), `.sat`; rsqrt, ex2, lg2, sin, cos,
//!   tanh; testp; setp (all comparisons, `.and/.or/.xor`, `%p|%q`), selp, slct, cvt (every int
//!   and float pairing, f16 and bf16 included, all rounding modes with one IEEE rounding,
//!   `.sat`; float-to-int saturates and NaN gives 0), cvta, mov (symbol addresses, vector
//!   pack/unpack).
//! - 16-bit floats (`float.rs`, `Half`): `cvt.frnd.{f16x2,bf16x2}.f32` (packing two),
//!   add/sub/mul and `fma`, rounded to nearest (`.rn`, the one rounding the ISA gives them; the
//!   others are refused), on `.f16`, `.bf16`, `.f16x2` and `.bf16x2`,
//!   each lane computed exactly and rounded once; NaN results are the canonical `0x7fff`.
//!   `.ftz`, `.sat` and `.relu` on them are refused rather than ignored.
//! - Tensor cores: `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32`, a
//!   warp-collective like `shfl.sync` (every lane must arrive), with the ISA's fragment layouts;
//!   the products are exact, and their sum with the addend is the H200's (the ISA leaves the
//!   order and precision of the accumulation to the hardware): aligned to the largest term,
//!   each cut below 2^-25 of it, rounded to f32 toward zero (`exec.rs`, `mma_sum`).
//! - Memory: ld/st/ldu in every state space and generic, `.v2/.v4`, every width, cache and
//!   ordering qualifiers accepted and ignored; atom/red (add, min, max, inc, dec, and, or,
//!   xor, exch, cas) on global (real host atomics) and shared memory. Every access is bounds-
//!   and natural-alignment-checked; generic addresses map `[GENERIC_SHARED_BASE, +WINDOW_SIZE)`
//!   to shared and `[GENERIC_LOCAL_BASE, +WINDOW_SIZE)` to local memory, anything else goes to
//!   [`GlobalMemory::resolve`].
//! - Control: bra, call (direct, non-recursive) with param passing, ret, exit, trap,
//!   bar.sync/barrier.sync (with thread counts), bar.red/barrier.red (popc, and, or over the
//!   released threads' predicates), bar.warp.sync, membar/fence (no-ops),
//!   shfl.sync (up/down/bfly/idx with clamp and segment mask, predicate output), vote.sync
//!   (all/any/uni/ballot), activemask, `%clock`/`%clock64` (a counter of the host thread
//!   running the launch's blocks, from 0 at each launch and one more at each read: it
//!   increases within a block, as an SM's clock does, and says nothing of time).
//!
//! # Module variables (driver side)
//!
//! A module's `.global` and `.const` variables live in device memory that the DRIVER owns:
//!
//! 1. when loading the module, allocate each of [`Module::globals`] (`size` bytes, aligned to
//!    `align`) as an ordinary device allocation that [`GlobalMemory::resolve`] accepts, and
//!    copy its `initial` bytes in (uninitialised variables are zeros there);
//! 2. keep the addresses in the same order (`addrs[i]` for `globals()[i]`), answer
//!    `cuModuleGetGlobal(name)` with them, and free them when the module is unloaded;
//! 3. launch with [`run_with_globals`]`(kernel, launch, memory, &addrs)`.
//!
//! The kernel then sees each variable at its address: `mov.u64 %rd, name`, `cvta.global`,
//! `ld.global [name+8]`, `ld.const [name]` (constant space is addressed like global memory)
//! all go through [`GlobalMemory::resolve`]. [`Kernel::globals_used`] says which variables a
//! kernel references.
//!
//! # Scheduling
//!
//! Each thread runs alone until it reaches `bar`, `shfl.sync`, `vote.sync` or `bar.warp.sync`,
//! or exits; when no thread can run, the warp exchanges whose whole membermask waits at the
//! same instruction are performed, then a barrier every live thread (exited threads count as arrived) waits at
//! is released. Anything else is a deadlock, reported as [`ExecError::LaunchFailed`] naming the
//! instruction and where the other threads wait; so is a `bar.sync` (aligned) reached at
//! different instructions, and a shuffle whose membermask names an exited or absent lane.
//!
//! `bar.warp.sync mask` waits like a shuffle for the lanes of its mask, except that exited and
//! absent lanes count as arrived.
//!
//! # Shared-memory race check
//!
//! With [`Launch::race_check`], the interpreter checks each block's `.shared` memory with
//! compute-sanitizer's racecheck semantics: two different threads of the block access the same
//! byte between two barriers of the whole block (`bar.sync`/`barrier.sync` that every live
//! thread takes part in), at least one of them a plain store (atomics, `atom`/`red`, never race
//! with atomics; loads never with loads or atomics), and the threads are not ordered by a
//! warp-level synchronisation (lanes of one warp are ordered by a `shfl.sync`, `vote.sync` or
//! `bar.warp.sync` both took part in, transitively). Generic accesses that land in shared
//! memory count. The first race fails the launch with [`ExecError::LaunchFailed`]:
//! "kernel `k` block (x,y,z) thread (x,y,z) line L2: shared-memory race at shared offset
//! 0x..: store by thread (x,y,z) at line L1 and load by thread (x,y,z) at line L2, with no
//! barrier between them" (the earlier access first).
//!
//! Races are found in this interpreter's schedule (threads run one at a time up to their next
//! synchronisation), which is one legal schedule: any two unordered conflicting accesses are
//! reported whichever ran first. Bookkeeping, allocated only when the check is on: per byte of
//! shared memory the last plain store, the last two distinct atomic accessors and the last two
//! distinct readers, each with its barrier epoch, warp clock and PTX line (so a store after
//! three or more readers checks the last two of them); per thread a vector clock over its
//! warp's lanes. Barriers of part of the block (a thread count below the live threads, or a
//! named barrier only some threads use) do not order anything here, so producer/consumer code
//! built on them is reported. With the check off the interpreter runs unchanged (the
//! instrumented loop is a separate, out-of-line instantiation); on, about 3 times slower.
//!
//! # Approximate instructions
//!
//! `.approx` (and `.full`) instructions are computed with the correctly rounded (or nearly so)
//! standard-library function, in f64 for f32 operands, then rounded once; they are therefore
//! at least as accurate as the bounds the PTX ISA promises, which are (for f32): `ex2.approx`
//! max relative error 2^-22 (for `.ftz`, |x| within the normal range); `lg2.approx` max
//! absolute error 2^-22.6 for x in [0.5, 2], relative 2^-22 elsewhere; `sin/cos.approx` max
//! absolute error 2^-20.9 in [-pi, pi]; `rcp.approx` and `sqrt.approx` max 1 ulp;
//! `rsqrt.approx` max relative error 2^-22.9; `div.approx` max 2 ulp for |divisor| in
//! [2^-126, 2^126]; `div.full` max 2 ulp; `tanh.approx` max relative error 2^-10.987.
//!
//! # What it cannot know
//!
//! Hardware timing (so `%clock` is only a counter and races resolve in this interpreter's
//! schedule, not the GPU's), the exact bits the hardware's approximate units return (results
//! of `.approx` instructions may differ from a GPU's in the last bits, within the bounds
//! above), and the values of undefined behaviour (integer division by zero gives all ones for
//! `div` and the dividend for `rem`).

use std::sync::Arc;

mod decode;
mod exec;
mod float;
mod ir;
mod lex;
mod parse;
mod race;

/// Start of the generic-address window that maps to the block's `.shared` memory
/// (`cvta.shared` adds it, `cvta.to.shared` subtracts it). The driver must not hand out global
/// addresses in `[GENERIC_SHARED_BASE, GENERIC_SHARED_BASE + WINDOW_SIZE)`.
pub const GENERIC_SHARED_BASE: u64 = 0x7FFF_0000_0000_0000;
/// Start of the generic-address window that maps to the thread's `.local` memory.
pub const GENERIC_LOCAL_BASE: u64 = 0x7FFE_0000_0000_0000;
/// Size of each generic window.
pub const WINDOW_SIZE: u64 = 1 << 40;

/// A parse or decode failure: the 1-based line and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    /// 1-based line of the module text.
    pub line: usize,
    /// What is wrong, naming the instruction or directive (e.g. "unknown instruction `foo.b32`").
    pub message: String,
}

/// One kernel parameter as the entry point declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    /// Byte offset in the packed parameter buffer (aligned to `align`).
    pub offset: usize,
    /// Size in bytes (`.u64` is 8; `.align 8 .b8 x[136]` is 136).
    pub size: usize,
    /// Alignment in bytes.
    pub align: usize,
}

/// An `.entry` of a parsed module.
#[derive(Debug)]
pub struct Kernel {
    prog: Arc<parse::Program>,
    name: String,
    params: Vec<Param>,
    param_bytes: usize,
    static_shared: usize,
    /// Where dynamic shared memory starts.
    dyn_offset: usize,
    /// The register file a thread starts with (constants and symbol addresses filled in).
    template: Vec<u64>,
    /// The slots of [`Kernel::template`] that its threads may write: every thread's own
    /// (special registers, the sink, the carry) and those of the functions it reaches. A block
    /// starts these afresh; the rest (other entries' registers, and constants) nothing writes.
    written: Vec<std::ops::Range<usize>>,
    /// First instruction.
    start: u32,
    /// Module variables (indices in [`Module::globals`]) the entry and its callees reference.
    globals: Vec<usize>,
    /// Template slots holding a module variable's address: (slot, variable index), filled per
    /// launch from the addresses [`run_with_globals`] is given.
    global_slots: Vec<(u32, usize)>,
}

impl Kernel {
    /// The entry's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The parameters in order, with their offsets in the packed buffer [`run`] takes.
    pub fn params(&self) -> &[Param] {
        &self.params
    }
    /// Total bytes of the packed parameter buffer (end of the last parameter, 0 if none).
    pub fn param_bytes(&self) -> usize {
        self.param_bytes
    }
    /// Bytes of statically declared `.shared` memory this entry uses (its own and the module's
    /// that it references).
    pub fn static_shared_bytes(&self) -> usize {
        self.static_shared
    }

    /// The module variables this entry (or a function it calls) references, as indices into
    /// [`Module::globals`], ascending. [`run_with_globals`] needs an address for each of them.
    pub fn globals_used(&self) -> &[usize] {
        &self.globals
    }

    /// Bytes of shared memory a block holds with `dynamic` dynamic bytes.
    fn shared_bytes(&self, dynamic: usize) -> usize {
        if dynamic == 0 {
            self.static_shared
        } else {
            self.dyn_offset + dynamic
        }
    }

    fn new(prog: &Arc<parse::Program>, fi: usize) -> Kernel {
        let f = &prog.funcs[fi];
        // Functions reachable from the entry, for the shared memory it uses.
        let mut reach = vec![fi];
        let mut i = 0;
        while i < reach.len() {
            for &c in &prog.funcs[reach[i]].calls {
                if !reach.contains(&c) {
                    reach.push(c);
                }
            }
            i += 1;
        }
        let mut shared_off: Vec<(usize, usize)> = Vec::new();
        let mut end = 0usize;
        let mut dyn_align = 16usize;
        for &r in &reach {
            for &s in &prog.funcs[r].shared {
                let sym = &prog.syms[s];
                if shared_off.iter().any(|&(x, _)| x == s) {
                    continue;
                }
                if sym.space == parse::SymSpace::DynShared {
                    dyn_align = dyn_align.max(sym.align);
                    continue;
                }
                let o = end.div_ceil(sym.align) * sym.align;
                shared_off.push((s, o));
                end = o + sym.size;
            }
        }
        let dyn_offset = end.div_ceil(dyn_align) * dyn_align;
        let mut globals: Vec<usize> = reach
            .iter()
            .flat_map(|&r| prog.funcs[r].globals.iter().copied())
            .collect();
        globals.sort_unstable();
        globals.dedup();
        let mut global_slots = Vec::new();
        let mut template = vec![0u64; prog.nslots as usize];
        for &(slot, src) in &prog.consts {
            template[slot as usize] = match src {
                parse::ConstSrc::Imm(v) => v,
                parse::ConstSrc::Sym(id) => {
                    let sym = &prog.syms[id];
                    match sym.space {
                        parse::SymSpace::Shared => shared_off
                            .iter()
                            .find(|x| x.0 == id)
                            .map_or(0, |x| x.1 as u64),
                        parse::SymSpace::DynShared => dyn_offset as u64,
                        parse::SymSpace::Local | parse::SymSpace::KernelParam => sym.offset as u64,
                        parse::SymSpace::FuncParam => parse::FPARAM_BASE + sym.offset as u64,
                        parse::SymSpace::Module => {
                            if globals.binary_search(&sym.offset).is_ok() {
                                global_slots.push((slot, sym.offset));
                            }
                            0
                        }
                    }
                }
            };
        }
        let mut written: Vec<std::ops::Range<usize>> = reach
            .iter()
            .map(|&r| &prog.funcs[r].slots)
            .map(|slots| slots.start as usize..slots.end as usize)
            .chain(std::iter::once(0..parse::FIRST_FREE as usize))
            .collect();
        written.sort_unstable_by_key(|r| r.start);
        let params: Vec<Param> = f
            .params
            .iter()
            .map(|&p| {
                let s = &prog.syms[p];
                Param {
                    offset: s.offset,
                    size: s.size,
                    align: s.align,
                }
            })
            .collect();
        global_slots.sort_unstable_by_key(|&(_, g)| g);
        let param_bytes = params.last().map_or(0, |p| p.offset + p.size);
        Kernel {
            prog: Arc::clone(prog),
            name: f.name.clone(),
            params,
            param_bytes,
            static_shared: end,
            dyn_offset,
            template,
            written,
            start: f.start,
            globals,
            global_slots,
        }
    }
}

/// A parsed, pre-decoded PTX module.
#[derive(Debug)]
pub struct Module {
    prog: Arc<parse::Program>,
    kernels: Vec<Arc<Kernel>>,
}

impl Module {
    /// Parses `text`. Any unknown directive or instruction is an error naming it and its line;
    /// never a panic, whatever the text.
    pub fn parse(text: &str) -> Result<Module, ParseError> {
        let prog = Arc::new(parse::parse(text)?);
        let kernels = (0..prog.funcs.len())
            .filter(|&i| prog.funcs[i].entry && prog.funcs[i].defined)
            .map(|i| Arc::new(Kernel::new(&prog, i)))
            .collect();
        Ok(Module { prog, kernels })
    }
    /// The `.version` directive: (major, minor), e.g. (9, 0).
    pub fn version(&self) -> (u32, u32) {
        self.prog.version
    }
    /// The `.target` directive's first architecture, e.g. "sm_75".
    pub fn target(&self) -> &str {
        &self.prog.target
    }
    /// The `.entry` called `name` (`.func`s are not kernels).
    pub fn kernel(&self, name: &str) -> Option<Arc<Kernel>> {
        self.kernels.iter().find(|k| k.name == name).cloned()
    }
    /// The module-scope `.global` and `.const` variables, in declaration order. The driver
    /// allocates each when it loads the module and passes the addresses to
    /// [`run_with_globals`] (see the crate docs, "Module variables").
    pub fn globals(&self) -> &[GlobalVariable] {
        &self.prog.globals
    }
    /// Names of every `.entry`, in file order.
    pub fn kernel_names(&self) -> Vec<String> {
        self.kernels.iter().map(|k| k.name.clone()).collect()
    }
}

/// The state space of a module variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VarSpace {
    /// `.global`: device memory kernels may read and write.
    Global,
    /// `.const`: constant memory (kernels only read it; the host writes it with
    /// `cuMemcpyHtoD` after `cuModuleGetGlobal`).
    Const,
}

/// A module-scope `.global` or `.const` variable (e.g. libdevice's `__cudart_i2opi_d` table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalVariable {
    /// The PTX name (what `cuModuleGetGlobal` looks up).
    pub name: String,
    /// `.global` or `.const`.
    pub space: VarSpace,
    /// Size in bytes (element size times every array dimension).
    pub size: usize,
    /// Alignment in bytes (`.align N`, else the element size).
    pub align: usize,
    /// The initial contents, exactly `size` bytes: the initialiser's values little-endian,
    /// zeros where there is no initialiser (or past its end), as CUDA does.
    pub initial: Vec<u8>,
}

/// Grid or block dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dim3 {
    /// x.
    pub x: u32,
    /// y.
    pub y: u32,
    /// z.
    pub z: u32,
}

/// Why a global access was refused by [`GlobalMemory::resolve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// No live allocation the launch may use covers the whole range (past the end, freed, a host
    /// pointer, another device's memory without peer access): `CUDA_ERROR_ILLEGAL_ADDRESS`.
    IllegalAddress,
}

/// The device memory a launch may touch. Implemented by the driver (tandem-cuda-emu); the
/// interpreter calls it for every `.global` (and generic-to-global) access.
pub trait GlobalMemory: Sync {
    /// A pointer to `len` bytes at device address `addr`, all inside one live allocation this
    /// launch may access, or why not. The pointer stays valid for the whole launch. Loads and
    /// stores alike: the one read-only space, `.const`, has no store instruction.
    fn resolve(&self, addr: u64, len: usize) -> Result<*mut u8, Fault>;
}

/// What a launch is asked to do.
#[derive(Debug, Clone, Copy)]
pub struct Launch<'a> {
    /// Blocks in the grid.
    pub grid: Dim3,
    /// Threads in a block.
    pub block: Dim3,
    /// Dynamic shared memory bytes (`extern __shared__`), after the static ones.
    pub dynamic_shared: usize,
    /// The packed parameters, laid out as [`Kernel::params`] says; exactly
    /// [`Kernel::param_bytes`] long.
    pub params: &'a [u8],
    /// Host threads to spread the blocks over (at least 1).
    pub threads: usize,
    /// Check the block's `.shared` memory for data races (see the crate docs, "Shared-memory
    /// race check"): a race fails the launch with [`ExecError::LaunchFailed`]. Off (`false`),
    /// nothing is recorded and the interpreter runs at full speed.
    pub race_check: bool,
    /// Count what the launch does ([`Profile`]): each instruction's executions, and from them
    /// the global bytes moved, the shared-memory accesses and the multiply-adds. Off, nothing
    /// is counted beyond [`Stats::instructions`]; on, the launch runs at the race check's speed.
    pub profile: bool,
}

/// How a launch failed. The driver maps each kind to its CUDA error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// A global, shared, local or param access out of bounds or to no live allocation:
    /// `CUDA_ERROR_ILLEGAL_ADDRESS` (700).
    #[error("illegal address: {0}")]
    IllegalAddress(String),
    /// A naturally misaligned access: `CUDA_ERROR_MISALIGNED_ADDRESS` (716).
    #[error("misaligned address: {0}")]
    MisalignedAddress(String),
    /// `trap`, or a thread that cannot proceed (a barrier or shuffle some threads/lanes of its
    /// mask never reach, a divergent `bar.sync`): `CUDA_ERROR_LAUNCH_FAILED` (719).
    #[error("launch failed: {0}")]
    LaunchFailed(String),
    /// The launch itself is malformed (parameter buffer size, zero dimensions):
    /// `CUDA_ERROR_INVALID_VALUE` (1).
    #[error("invalid launch: {0}")]
    InvalidValue(String),
}

/// Runs `kernel` once over the whole grid. Each error message names the kernel, the block and
/// thread, and the PTX line of the faulting instruction. The same as [`run_with_globals`] with
/// no module variable addresses (so a kernel that uses module variables fails with
/// [`ExecError::InvalidValue`]).
pub fn run(
    kernel: &Kernel,
    launch: &Launch<'_>,
    memory: &dyn GlobalMemory,
) -> Result<(), ExecError> {
    exec::run(kernel, launch, memory, &[]).map(|_| ())
}

/// [`run`] for a kernel whose module has `.global`/`.const` variables: `globals[i]` is the
/// device address the driver allocated for `module.globals()[i]` (every access to it then goes
/// through [`GlobalMemory::resolve`], so that allocation must be one `memory` resolves).
/// A kernel referencing a variable with no address here (`globals` too short) fails with
/// [`ExecError::InvalidValue`] naming it.
pub fn run_with_globals(
    kernel: &Kernel,
    launch: &Launch<'_>,
    memory: &dyn GlobalMemory,
    globals: &[u64],
) -> Result<(), ExecError> {
    exec::run(kernel, launch, memory, globals).map(|_| ())
}

/// What a launch did, from [`run_counted`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// PTX instructions executed over all threads (including those whose guard was false).
    pub instructions: u64,
    /// What they did, when [`Launch::profile`] asked for it.
    pub profile: Option<Profile>,
}

/// What a profiled launch's threads did, summed over them. Counted from the instructions that
/// ran (a guarded-off instruction counts nothing); a vector access is one access of all its
/// bytes. What the interpreter cannot know a GPU's cost of (caches, coalescing, bank
/// conflicts, timing) is not here.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    /// Instructions executed (guarded-off ones not included).
    pub instructions: u64,
    /// Bytes read by `ld.global` (`.nc` included).
    pub global_bytes_read: u64,
    /// Bytes written by `st.global`.
    pub global_bytes_written: u64,
    /// `ld.shared` instructions.
    pub shared_loads: u64,
    /// `st.shared` instructions.
    pub shared_stores: u64,
    /// f32 multiply-adds: each `fma.f32` one, each lane's `mma.sync.m16n8k16` its 64.
    pub fmas: u64,
}

impl std::ops::AddAssign for Profile {
    /// Sums two launches' counts (a kernel's over its launches).
    fn add_assign(&mut self, other: Profile) {
        self.instructions += other.instructions;
        self.global_bytes_read += other.global_bytes_read;
        self.global_bytes_written += other.global_bytes_written;
        self.shared_loads += other.shared_loads;
        self.shared_stores += other.shared_stores;
        self.fmas += other.fmas;
    }
}

/// [`run`], also counting the instructions executed (for measuring the interpreter) and, with
/// [`Launch::profile`], what they did.
pub fn run_counted(
    kernel: &Kernel,
    launch: &Launch<'_>,
    memory: &dyn GlobalMemory,
) -> Result<Stats, ExecError> {
    exec::run(kernel, launch, memory, &[])
}

/// [`run_with_globals`], also counting as [`run_counted`] does.
pub fn run_counted_with_globals(
    kernel: &Kernel,
    launch: &Launch<'_>,
    memory: &dyn GlobalMemory,
    globals: &[u64],
) -> Result<Stats, ExecError> {
    exec::run(kernel, launch, memory, globals)
}
