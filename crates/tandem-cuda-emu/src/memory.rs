//! Device memory: allocations at fake device addresses, backed by host memory, and the
//! [`GlobalMemory`] view a launch gets of them.
//!
//! Device `d`'s allocations live from [`DEVICE_BASE`]` + d * `[`DEVICE_SPAN`] on: above 2^52,
//! which no x86-64 or AArch64 user-space pointer reaches, so a host pointer handed to a kernel
//! never resolves. Addresses are never reused, and each allocation is followed by an unmapped
//! gap at least as large as itself (1 MiB minimum), so an overrun or a use after free faults
//! instead of landing in a neighbour.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tandem_ptx::{Fault, GlobalMemory};

use crate::codes::*;

/// Where device 0's address range starts.
pub const DEVICE_BASE: u64 = 1 << 52;
/// The size of each device's address range.
pub const DEVICE_SPAN: u64 = 1 << 44;
/// Alignment of every allocation (the real driver's is at least 256).
const ALIGN: u64 = 256;
/// The smallest gap after an allocation.
const MIN_GAP: u64 = 1 << 20;

/// `m`'s guard, also after a thread panicked holding it: the driver goes on answering (a panic
/// in an entry point is its `CUDA_ERROR_UNKNOWN`, see [`crate::guard`]).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// [`lock`] for reading an `RwLock`.
fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// [`lock`] for writing an `RwLock`.
fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// One live device allocation.
#[derive(Debug)]
pub struct Allocation {
    /// The device address of its first byte.
    pub base: u64,
    /// Its size in bytes.
    pub size: u64,
    /// The device it is on.
    pub device: usize,
    /// The context that allocated it.
    pub ctx: u64,
    /// The host memory that backs it (`size` bytes; owned, freed on drop).
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: the backing memory is plain bytes owned by the allocation; concurrent kernel and copy
// accesses to it are the program's business, as on a GPU.
unsafe impl Send for Allocation {}
// SAFETY: as above.
unsafe impl Sync for Allocation {}

impl Allocation {
    /// The host address of the byte at device address `addr` (which must be inside).
    pub fn host(&self, addr: u64) -> *mut u8 {
        // The caller checked `addr` is within [base, base + size).
        self.ptr.wrapping_add((addr - self.base) as usize)
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // SAFETY: allocated in `Memory::allocate` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// Every device's allocations.
#[derive(Debug)]
pub struct Memory {
    live: RwLock<BTreeMap<u64, Arc<Allocation>>>,
    /// Per device: the next free address and the bytes in use.
    devices: Mutex<Vec<(u64, u64)>>,
    limit: u64,
}

impl Memory {
    /// No allocations on `devices` devices of `limit` bytes each.
    pub fn new(devices: usize, limit: u64) -> Memory {
        let next = (0..devices)
            .map(|d| (DEVICE_BASE + d as u64 * DEVICE_SPAN + MIN_GAP, 0))
            .collect();
        Memory {
            live: RwLock::new(BTreeMap::new()),
            devices: Mutex::new(next),
            limit,
        }
    }

    /// A new allocation of `size` bytes on `device` for context `ctx`, every byte 0xFF (NaN as
    /// f32 and f64), so that reading memory nobody wrote shows.
    pub fn allocate(&self, device: usize, ctx: u64, size: u64) -> Result<u64, CUresult> {
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut devices = lock(&self.devices);
        let (next, used) = devices.get_mut(device).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
        if used.saturating_add(size) > self.limit {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let rounded = size.div_ceil(ALIGN) * ALIGN;
        let gap = rounded.max(MIN_GAP).div_ceil(MIN_GAP) * MIN_GAP;
        let end = DEVICE_BASE + (device as u64 + 1) * DEVICE_SPAN;
        let base = *next;
        if base.saturating_add(rounded).saturating_add(gap) > end {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let layout =
            Layout::from_size_align(size as usize, 64).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
        // SAFETY: size is non-zero.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        // SAFETY: ptr covers size bytes.
        unsafe { std::ptr::write_bytes(ptr, 0xFF, size as usize) };
        *next = base + rounded + gap;
        *used += size;
        let allocation = Allocation {
            base,
            size,
            device,
            ctx,
            ptr,
            layout,
        };
        write(&self.live).insert(base, Arc::new(allocation));
        Ok(base)
    }

    /// The live allocation starting at `base` (`CUDA_ERROR_INVALID_VALUE` for anything else:
    /// freed, never allocated, or inside an allocation).
    pub fn get_base(&self, base: u64) -> Result<Arc<Allocation>, CUresult> {
        let live = read(&self.live);
        live.get(&base).cloned().ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// Removes the allocation at `base` (its memory goes when the last user lets go).
    pub fn free(&self, base: u64) -> Result<(), CUresult> {
        let removed = write(&self.live)
            .remove(&base)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let mut devices = lock(&self.devices);
        if let Some((_, used)) = devices.get_mut(removed.device) {
            *used -= removed.size;
        }
        Ok(())
    }

    /// Frees every allocation of context `ctx` (when it is destroyed).
    pub fn free_context(&self, ctx: u64) {
        let bases: Vec<u64> = {
            let live = read(&self.live);
            live.values()
                .filter(|a| a.ctx == ctx)
                .map(|a| a.base)
                .collect()
        };
        for base in bases {
            let _ = self.free(base);
        }
    }

    /// The live allocation holding all of `[addr, addr + len)`, if any.
    pub fn find(&self, addr: u64, len: u64) -> Option<Arc<Allocation>> {
        let live = read(&self.live);
        let (_, allocation) = live.range(..=addr).next_back()?;
        let end = addr.checked_add(len)?;
        (end <= allocation.base + allocation.size).then(|| allocation.clone())
    }

    /// Bytes in use and the total of `device`.
    pub fn info(&self, device: usize) -> (u64, u64) {
        let devices = lock(&self.devices);
        (devices.get(device).map_or(0, |d| d.1), self.limit)
    }

    /// The allocations a launch may use (those `allowed` accepts), as they are now.
    pub fn view(&self, allowed: impl Fn(&Allocation) -> bool) -> LaunchMemory {
        let live = read(&self.live);
        LaunchMemory {
            allocations: live.values().filter(|a| allowed(a)).cloned().collect(),
        }
    }
}

/// The device memory one launch may touch: a snapshot of the allowed live allocations, sorted
/// by address, that keeps them alive for the whole launch.
#[derive(Debug)]
pub struct LaunchMemory {
    allocations: Vec<Arc<Allocation>>,
}

impl GlobalMemory for LaunchMemory {
    fn resolve(&self, addr: u64, len: usize) -> Result<*mut u8, Fault> {
        let index = self.allocations.partition_point(|a| a.base <= addr);
        let allocation = index
            .checked_sub(1)
            .and_then(|i| self.allocations.get(i))
            .ok_or(Fault::IllegalAddress)?;
        let end = addr.checked_add(len as u64).ok_or(Fault::IllegalAddress)?;
        if end > allocation.base + allocation.size {
            return Err(Fault::IllegalAddress);
        }
        Ok(allocation.host(addr))
    }
}

/// Page-locked host memory: allocations of `cuMemAllocHost` / `cuMemHostAlloc`, by address.
#[derive(Debug, Default)]
pub struct Pinned {
    blocks: Mutex<BTreeMap<usize, Layout>>,
}

impl Pinned {
    /// `size` bytes of "pinned" host memory.
    pub fn allocate(&self, size: usize) -> Result<*mut u8, CUresult> {
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let layout = Layout::from_size_align(size, 4096).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        lock(&self.blocks).insert(ptr as usize, layout);
        Ok(ptr)
    }

    /// Frees the block at `ptr` (`CUDA_ERROR_INVALID_VALUE` if it is not one).
    pub fn free(&self, ptr: usize) -> Result<(), CUresult> {
        let layout = lock(&self.blocks)
            .remove(&ptr)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: allocated in `allocate` with this layout.
        unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        Ok(())
    }

    /// Whether `[ptr, ptr + len)` lies inside one pinned block.
    pub fn contains(&self, ptr: usize, len: usize) -> bool {
        let blocks = lock(&self.blocks);
        blocks
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&base, layout)| ptr.saturating_add(len) <= base + layout.size())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device's bytes in use follow its allocations to the limit, a byte past it fails, and
    /// freeing (one allocation, or a context's) gives them back to that device only.
    #[test]
    fn use_is_counted_to_the_limit_per_device() {
        let memory = Memory::new(2, 4096);
        let a = memory.allocate(0, 1, 1000).unwrap();
        let b = memory.allocate(0, 2, 3000).unwrap();
        assert_eq!(memory.info(0), (4000, 4096));
        assert_eq!(memory.allocate(0, 1, 97), Err(CUDA_ERROR_OUT_OF_MEMORY));
        let c = memory.allocate(0, 1, 96).unwrap();
        assert_eq!(memory.info(0), (4096, 4096));
        assert_eq!(memory.allocate(0, 1, 1), Err(CUDA_ERROR_OUT_OF_MEMORY));
        memory.allocate(1, 1, 4096).unwrap();
        assert_eq!(memory.allocate(2, 1, 1), Err(CUDA_ERROR_INVALID_DEVICE));
        assert_eq!(memory.allocate(0, 1, 0), Err(CUDA_ERROR_INVALID_VALUE));
        memory.free(b).unwrap();
        assert_eq!(memory.info(0), (1096, 4096));
        assert_eq!(memory.free(b), Err(CUDA_ERROR_INVALID_VALUE));
        // Context 1's allocations go, on both devices; context 2's stay.
        let d = memory.allocate(0, 2, 8).unwrap();
        memory.free_context(1);
        assert_eq!((memory.info(0).0, memory.info(1).0), (8, 0));
        for gone in [a, c] {
            assert!(memory.get_base(gone).is_err());
        }
        assert_eq!(memory.get_base(d).unwrap().size, 8);
    }

    /// Allocations are aligned, in the device's own range, never reused, and each is followed
    /// by an unused gap at least its size and 1 MiB, where an overrun finds nothing.
    #[test]
    fn allocations_are_aligned_apart_and_never_reused() {
        let memory = Memory::new(2, 1 << 30);
        let mut previous: Option<(u64, u64)> = None;
        for size in [1, 300, 1 << 20, 5 << 20, 256, 1] {
            let base = memory.allocate(1, 7, size).unwrap();
            assert_eq!(base % ALIGN, 0);
            assert!((DEVICE_BASE + DEVICE_SPAN..DEVICE_BASE + 2 * DEVICE_SPAN).contains(&base));
            if let Some((before, before_size)) = previous {
                assert!(
                    base >= before + before_size + before_size.max(MIN_GAP),
                    "{base:#x}"
                );
            }
            assert!(memory.find(base + size, 1).is_none());
            assert!(memory.find(base, size).is_some());
            memory.free(base).unwrap();
            previous = Some((base, size));
        }
    }
}
