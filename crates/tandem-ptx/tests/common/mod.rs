//! A Vec-backed [`GlobalMemory`] for the tests, at fake device addresses.
#![allow(dead_code)]

use tandem_ptx::{Dim3, ExecError, Fault, GlobalMemory, Kernel, Launch, Module};

/// Device allocations at 0x2000_0000_0000 + i * 2^32, each backed by its own buffer.
pub struct Mem {
    bufs: Vec<Box<[u64]>>,
    lens: Vec<usize>,
    /// Each buffer's address, taken once (the boxes never move their storage).
    ptrs: Vec<usize>,
}

pub const BASE: u64 = 0x2000_0000_0000;

impl Mem {
    pub fn new() -> Mem {
        Mem {
            bufs: Vec::new(),
            lens: Vec::new(),
            ptrs: Vec::new(),
        }
    }
    /// Allocates `bytes` (zeroed) and returns the device address.
    pub fn alloc(&mut self, bytes: usize) -> u64 {
        let mut b = vec![0u64; bytes.div_ceil(8)].into_boxed_slice();
        self.ptrs.push(b.as_mut_ptr() as usize);
        self.bufs.push(b);
        self.lens.push(bytes);
        BASE + ((self.bufs.len() as u64 - 1) << 32)
    }
    fn bytes(&mut self, addr: u64) -> &mut [u8] {
        let i = ((addr - BASE) >> 32) as usize;
        let len = self.lens[i];
        let v = &mut self.bufs[i];
        // SAFETY: a u64 buffer viewed as bytes.
        unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, len) }
    }
    pub fn upload_f32(&mut self, v: &[f32]) -> u64 {
        let a = self.alloc(v.len() * 4);
        for (c, x) in self.bytes(a).chunks_mut(4).zip(v) {
            c.copy_from_slice(&x.to_le_bytes());
        }
        a
    }
    pub fn upload_u32(&mut self, v: &[u32]) -> u64 {
        let a = self.alloc(v.len() * 4);
        for (c, x) in self.bytes(a).chunks_mut(4).zip(v) {
            c.copy_from_slice(&x.to_le_bytes());
        }
        a
    }
    pub fn upload_u8(&mut self, v: &[u8]) -> u64 {
        let a = self.alloc(v.len());
        self.bytes(a).copy_from_slice(v);
        a
    }
    pub fn f32s(&mut self, a: u64) -> Vec<f32> {
        self.bytes(a)
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
    pub fn u32s(&mut self, a: u64) -> Vec<u32> {
        self.bytes(a)
            .chunks(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
    pub fn f64s(&mut self, a: u64) -> Vec<f64> {
        self.bytes(a)
            .chunks(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect()
    }
    pub fn u64s(&mut self, a: u64) -> Vec<u64> {
        self.bytes(a)
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect()
    }
}

impl GlobalMemory for Mem {
    fn resolve(&self, addr: u64, len: usize) -> Result<*mut u8, Fault> {
        if addr < BASE {
            return Err(Fault::IllegalAddress);
        }
        let i = ((addr - BASE) >> 32) as usize;
        let off = ((addr - BASE) & 0xffff_ffff) as usize;
        let Some(&n) = self.lens.get(i) else {
            return Err(Fault::IllegalAddress);
        };
        if off.checked_add(len).is_none_or(|e| e > n) {
            return Err(Fault::IllegalAddress);
        }
        Ok((self.ptrs[i] + off) as *mut u8)
    }
}

/// Packs parameters as the kernel lays them out.
pub struct Args(pub Vec<u8>);

impl Args {
    pub fn new() -> Args {
        Args(Vec::new())
    }
    fn put(mut self, b: &[u8]) -> Args {
        let a = b.len();
        while !self.0.len().is_multiple_of(a) {
            self.0.push(0);
        }
        self.0.extend_from_slice(b);
        self
    }
    pub fn u64(self, v: u64) -> Args {
        self.put(&v.to_le_bytes())
    }
    pub fn u32(self, v: u32) -> Args {
        self.put(&v.to_le_bytes())
    }
    /// A by-value array of u64 (a struct of pointers), 8-aligned.
    pub fn u64s(mut self, v: &[u64]) -> Args {
        while !self.0.len().is_multiple_of(8) {
            self.0.push(0);
        }
        for x in v {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
        self
    }
    pub fn f32(self, v: f32) -> Args {
        self.put(&v.to_le_bytes())
    }
}

pub fn dim(x: u32, y: u32, z: u32) -> Dim3 {
    Dim3 { x, y, z }
}

/// A launch of `args` on `threads` host threads, without the shared-memory race check.
pub fn launch_of(grid: Dim3, block: Dim3, args: &Args, threads: usize) -> Launch<'_> {
    Launch {
        grid,
        block,
        dynamic_shared: 0,
        params: &args.0,
        threads,
        race_check: false,
        profile: false,
    }
}

/// Runs `k` with `args` on `threads` host threads.
pub fn launch(
    k: &Kernel,
    grid: Dim3,
    block: Dim3,
    args: &Args,
    mem: &Mem,
    threads: usize,
) -> Result<(), ExecError> {
    tandem_ptx::run(k, &launch_of(grid, block, args, threads), mem)
}

/// Parses a module, panicking with the error.
pub fn module(text: &str) -> Module {
    match Module::parse(text) {
        Ok(m) => m,
        Err(e) => panic!("{e}"),
    }
}

/// A tandem kernel module's text.
pub fn tandem_ptx(name: &str) -> String {
    let p = format!(
        "{}/../tandem-kernels/ptx/{name}.ptx",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}
