//! The shared-memory race check ([`crate::Launch::race_check`]): compute-sanitizer's racecheck
//! semantics over this interpreter's schedule.
//!
//! Every byte of a block's shared memory has a shadow: the last plain store, the last two
//! distinct atomic accessors and the last two distinct readers, each as (thread, barrier
//! epoch, the thread's warp clock, PTX line). A whole-block barrier starts a new epoch, so
//! older records are void. Within a warp, `shfl.sync`/`vote.sync`/`bar.warp.sync` order the
//! lanes of their mask: each thread keeps a vector clock over the 32 lanes of its warp, joined
//! at every warp synchronisation it takes part in. Two accesses to a byte conflict when they
//! come from different threads in the same epoch, at least one is a plain store (atomics never
//! race with atomics, plain loads never with loads or atomics), and the earlier thread's clock
//! at its access is not below what the later thread has since learned of it.

use crate::Dim3;

/// What an access does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Load,
    Store,
    Atomic,
}

impl Kind {
    /// How messages name it: "load", "store", "atomic".
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Load => "load",
            Kind::Store => "store",
            Kind::Atomic => "atomic",
        }
    }
}

/// One recorded access; void unless `epoch` is the block's current one.
#[derive(Debug, Clone, Copy, Default)]
struct Acc {
    t: u32,
    epoch: u32,
    clock: u32,
    line: u32,
}

/// The shadow of one byte of shared memory.
#[derive(Debug, Clone, Copy, Default)]
struct Shadow {
    store: Acc,
    atomic: [Acc; 2],
    load: [Acc; 2],
}

/// A block's race-check state (one per worker, reused across its blocks).
pub(crate) struct RaceState {
    shadow: Vec<Shadow>,
    /// `nthreads * 32` warp clocks: `vc[t * 32 + l]` is what thread `t` knows of lane `l` of
    /// its warp (its own lane: its own clock).
    vc: Vec<u32>,
    epoch: u32,
    block: Dim3,
    /// PTX line of the instruction being executed (set by the interpreter before each one).
    pub line: u32,
}

/// Thread `t`'s coordinates in a block of dimensions `block`, as `(x,y,z)`.
pub(crate) fn thread_name(t: usize, block: Dim3) -> String {
    let (x, y) = (block.x as usize, block.y as usize);
    format!("({},{},{})", t % x, (t / x) % y, t / (x * y))
}

impl RaceState {
    pub fn new(shared: usize, nthreads: usize, block: Dim3) -> RaceState {
        RaceState {
            shadow: vec![Shadow::default(); shared],
            vc: vec![0; nthreads * 32],
            epoch: 0,
            block,
            line: 0,
        }
    }

    /// A new block starts: every record is void, every clock zero.
    pub fn start_block(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
        self.vc.fill(0);
    }

    /// A barrier of the whole block was released.
    pub fn barrier(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
    }

    /// The threads `lanes` (of one warp) synchronised: each ticks its own clock, then all learn
    /// what any of them knew.
    pub fn warp_sync(&mut self, lanes: &[usize]) {
        let mut joined = [0u32; 32];
        for &t in lanes {
            self.vc[t * 32 + t % 32] += 1;
            for (j, v) in joined.iter_mut().enumerate() {
                *v = (*v).max(self.vc[t * 32 + j]);
            }
        }
        for &t in lanes {
            self.vc[t * 32..t * 32 + 32].copy_from_slice(&joined);
        }
    }

    /// Whether record `a` is a live access by another thread that `t` is not ordered after.
    fn conflicts(&self, a: &Acc, t: usize) -> bool {
        a.epoch == self.epoch
            && a.t as usize != t
            && !(a.t as usize / 32 == t / 32 && self.vc[t * 32 + a.t as usize % 32] > a.clock)
    }

    /// Records thread `t`'s access of `len` bytes at shared offset `off`, or describes the race
    /// it completes. Accesses outside the shadow are ignored (the access itself reports them).
    pub fn access(&mut self, t: usize, off: u64, len: usize, kind: Kind) -> Result<(), String> {
        let Some(end) = off.checked_add(len as u64) else {
            return Ok(());
        };
        if end > self.shadow.len() as u64 {
            return Ok(());
        }
        let me = Acc {
            t: t as u32,
            epoch: self.epoch,
            clock: self.vc[t * 32 + t % 32],
            line: self.line,
        };
        for b in off as usize..end as usize {
            let s = self.shadow[b];
            let earlier: Option<(Acc, Kind)> = match kind {
                Kind::Load => self
                    .conflicts(&s.store, t)
                    .then_some((s.store, Kind::Store)),
                Kind::Atomic => self
                    .conflicts(&s.store, t)
                    .then_some((s.store, Kind::Store)),
                Kind::Store => {
                    if self.conflicts(&s.store, t) {
                        Some((s.store, Kind::Store))
                    } else if let Some(a) = s.atomic.iter().find(|a| self.conflicts(a, t)) {
                        Some((*a, Kind::Atomic))
                    } else {
                        s.load
                            .iter()
                            .find(|a| self.conflicts(a, t))
                            .map(|a| (*a, Kind::Load))
                    }
                }
            };
            if let Some((e, ek)) = earlier {
                return Err(format!(
                    "shared-memory race at shared offset {b:#x}: {} by thread {} at line {} and {} by thread {} at line {}, with no barrier between them",
                    ek.name(),
                    thread_name(e.t as usize, self.block),
                    e.line,
                    kind.name(),
                    thread_name(t, self.block),
                    self.line
                ));
            }
            let s = &mut self.shadow[b];
            match kind {
                Kind::Store => s.store = me,
                Kind::Atomic => push(&mut s.atomic, me, self.epoch),
                Kind::Load => push(&mut s.load, me, self.epoch),
            }
        }
        Ok(())
    }
}

/// Makes `me` the latest of two records, keeping the other one when it is a live record of a
/// different thread.
fn push(pair: &mut [Acc; 2], me: Acc, epoch: u32) {
    if pair[0].epoch == epoch && pair[0].t != me.t {
        pair[1] = pair[0];
    }
    pair[0] = me;
}
