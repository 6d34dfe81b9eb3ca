//! A PTX parser and interpreter: runs the PTX that nvcc emits from ordinary CUDA C++ on the CPU.
//!
//! [`Module::parse`] reads and pre-decodes a module (failing on any instruction or directive it
//! does not know, naming it and its line); [`Kernel`] describes an entry point; [`run`] executes
//! one launch, every global access checked through [`GlobalMemory`].
//!
//! API CONTRACT (shared with tandem-cuda-emu; change only together):

use std::sync::Arc;

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
    // private: decoded body, registers, name, params, shared/local sizes
}

impl Kernel {
    /// The entry's name.
    pub fn name(&self) -> &str {
        todo!()
    }
    /// The parameters in order, with their offsets in the packed buffer [`run`] takes.
    pub fn params(&self) -> &[Param] {
        todo!()
    }
    /// Total bytes of the packed parameter buffer (end of the last parameter, 0 if none).
    pub fn param_bytes(&self) -> usize {
        todo!()
    }
    /// Bytes of statically declared `.shared` memory this entry uses (its own and the module's
    /// that it references).
    pub fn static_shared_bytes(&self) -> usize {
        todo!()
    }
}

/// A parsed, pre-decoded PTX module.
#[derive(Debug)]
pub struct Module {
    // private
}

impl Module {
    /// Parses `text`. Any unknown directive or instruction is an error naming it and its line;
    /// never a panic, whatever the text.
    pub fn parse(text: &str) -> Result<Module, ParseError> {
        let _ = text;
        todo!()
    }
    /// The `.version` directive: (major, minor), e.g. (9, 0).
    pub fn version(&self) -> (u32, u32) {
        todo!()
    }
    /// The `.target` directive's first architecture, e.g. "sm_75".
    pub fn target(&self) -> &str {
        todo!()
    }
    /// The `.entry` called `name` (`.func`s are not kernels).
    pub fn kernel(&self, name: &str) -> Option<Arc<Kernel>> {
        let _ = name;
        todo!()
    }
    /// Names of every `.entry`, in file order.
    pub fn kernel_names(&self) -> Vec<String> {
        todo!()
    }
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
    /// launch may access, or why not. The pointer stays valid for the whole launch.
    /// `write` says whether the access stores.
    fn resolve(&self, addr: u64, len: usize, write: bool) -> Result<*mut u8, Fault>;
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
/// thread, and the PTX line of the faulting instruction.
pub fn run(kernel: &Kernel, launch: &Launch<'_>, memory: &dyn GlobalMemory) -> Result<(), ExecError> {
    let _ = (kernel, launch, memory);
    todo!()
}
