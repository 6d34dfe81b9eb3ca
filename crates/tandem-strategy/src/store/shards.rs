//! [`Shards`]: the parameters of record in one contiguous vector, with the optimiser's state, in
//! pieces that each have their own lock.
//!
//! Contiguous, so that synchronous replicas in host memory can compute from the parameters of
//! record themselves ([`Shards::lend`]) instead of each copying them first; locked piece by
//! piece, so that workers read and update different pieces at once.
//!
//! **Every access to a piece of the parameters holds that piece's lock**: its read lock to read
//! it, its write lock to write it, and every piece's read lock to lend the whole vector. The
//! pieces' ranges are disjoint and fixed, and the vector is never resized, so no write ever
//! overlaps a read or another write. This is the host store's only `unsafe`.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut, Range};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use tandem_core::{Optimizer, Piece};

/// The optimiser's state of one piece (its own vectors, one per slot), under the piece's lock.
pub(super) struct PieceState {
    pub state: Vec<Vec<f32>>,
}

/// One piece: where it is in the flat vectors and whether L2 applies to it.
#[derive(Debug, Clone)]
struct Span {
    range: Range<usize>,
    weight_decay: bool,
}

pub(super) struct Shards {
    /// Every parameter, piece after piece (see the module's invariant).
    params: UnsafeCell<Vec<f32>>,
    /// `params`' first value, taken once: pieces are reached through it, never through a
    /// reference to the whole vector that another piece's writer would alias.
    base: *mut f32,
    spans: Vec<Span>,
    locks: Vec<RwLock<PieceState>>,
}

// SAFETY: the parameters are only reached under the locks (the module's invariant), which order
// every write before any later read or write of the same piece, across threads.
unsafe impl Send for Shards {}
// SAFETY: as for `Send`.
unsafe impl Sync for Shards {}

impl Shards {
    /// `params` and each slot of `slots` (as long as `params`) cut into the pieces `ranges`
    /// (disjoint, covering `params` in order), each with whether L2 applies to it.
    pub fn new(mut params: Vec<f32>, slots: &[&[f32]], ranges: Vec<(Range<usize>, bool)>) -> Self {
        let locks = ranges
            .iter()
            .map(|(range, _)| {
                RwLock::new(PieceState {
                    state: slots.iter().map(|s| s[range.clone()].to_vec()).collect(),
                })
            })
            .collect();
        let spans = ranges
            .into_iter()
            .map(|(range, weight_decay)| Span {
                range,
                weight_decay,
            })
            .collect();
        Self {
            base: params.as_mut_ptr(),
            params: UnsafeCell::new(params),
            spans,
            locks,
        }
    }

    /// How many pieces.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Where piece `index` starts in the flat vectors.
    pub fn offset(&self, index: usize) -> usize {
        self.spans[index].range.start
    }

    /// Piece `index`, to read.
    pub fn read(&self, index: usize) -> ShardRead<'_> {
        // A poisoned piece was being updated by a worker that panicked in the optimiser; the
        // run fails with that worker's panic, and what the piece holds is still saved as it is.
        let guard = self.locks[index].read().unwrap_or_else(|p| p.into_inner());
        let span = &self.spans[index];
        // SAFETY: the range lies inside the vector, and this piece's read lock excludes its
        // writer (the module's invariant).
        let params = unsafe {
            std::slice::from_raw_parts(self.base.add(span.range.start), span.range.len())
        };
        ShardRead {
            guard,
            params,
            range: span.range.clone(),
            weight_decay: span.weight_decay,
        }
    }

    /// Piece `index`, to write.
    pub fn write(&self, index: usize) -> ShardWrite<'_> {
        let guard = self.locks[index].write().unwrap_or_else(|p| p.into_inner());
        let span = &self.spans[index];
        // SAFETY: the range lies inside the vector, and this piece's write lock excludes every
        // other access to it (the module's invariant).
        let params = unsafe {
            std::slice::from_raw_parts_mut(self.base.add(span.range.start), span.range.len())
        };
        ShardWrite {
            guard,
            params,
            range: span.range.clone(),
            weight_decay: span.weight_decay,
        }
    }

    /// Runs `use_params` with the whole vector, every piece read-locked meanwhile (writers of
    /// any piece wait until it returns).
    pub fn lend<T>(&self, use_params: impl FnOnce(&Vec<f32>) -> T) -> T {
        // In index order, and a writer holds one lock at a time: no cycle to deadlock on.
        let _guards: Vec<RwLockReadGuard<'_, PieceState>> = self
            .locks
            .iter()
            .map(|lock| lock.read().unwrap_or_else(|p| p.into_inner()))
            .collect();
        // SAFETY: every piece is read-locked, so no writer holds a part of the vector while
        // this shared reference lives.
        use_params(unsafe { &*self.params.get() })
    }
}

/// A read-locked piece: its parameters, its optimiser state (through `Deref`), its range.
pub(super) struct ShardRead<'a> {
    guard: RwLockReadGuard<'a, PieceState>,
    /// Private, and lent only for as long as the guard lives: a copy of the reference must not
    /// outlive the lock.
    params: &'a [f32],
    range: Range<usize>,
    weight_decay: bool,
}

impl ShardRead<'_> {
    /// The piece's parameters.
    pub fn params(&self) -> &[f32] {
        self.params
    }

    /// Whether L2 applies to the piece.
    pub fn weight_decay(&self) -> bool {
        self.weight_decay
    }

    /// Where the piece lies in the flat vectors.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }
}

impl Deref for ShardRead<'_> {
    type Target = PieceState;
    fn deref(&self) -> &PieceState {
        &self.guard
    }
}

/// A write-locked piece: its parameters, its optimiser state (through `Deref`), its range.
pub(super) struct ShardWrite<'a> {
    guard: RwLockWriteGuard<'a, PieceState>,
    /// Private, as [`ShardRead`]'s.
    params: &'a mut [f32],
    range: Range<usize>,
    weight_decay: bool,
}

impl ShardWrite<'_> {
    /// The piece's parameters.
    pub fn params(&self) -> &[f32] {
        self.params
    }

    /// The piece's parameters, to overwrite.
    pub fn params_mut(&mut self) -> &mut [f32] {
        self.params
    }

    /// Where the piece lies in the flat vectors.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// Applies `optimizer`'s update with `grads` (one per replica, each the gradients of the
    /// parameters from `base` on).
    pub fn update<O: Optimizer + ?Sized>(
        &mut self,
        optimizer: &O,
        grads: &[&[f32]],
        base: usize,
        at: super::UpdateAt,
    ) {
        let range = self.range.start - base..self.range.end - base;
        let parts: Vec<&[f32]> = grads.iter().map(|g| &g[range.clone()]).collect();
        let mut state: Vec<&mut [f32]> =
            self.guard.state.iter_mut().map(Vec::as_mut_slice).collect();
        let piece = Piece {
            params: &mut *self.params,
            state: &mut state,
            grads: &parts,
            weight_decay: self.weight_decay,
            rate_scale: at.rate_scale,
        };
        optimizer.update(piece, at.step, at.epoch);
    }
}

impl Deref for ShardWrite<'_> {
    type Target = PieceState;
    fn deref(&self) -> &PieceState {
        &self.guard
    }
}

impl DerefMut for ShardWrite<'_> {
    fn deref_mut(&mut self) -> &mut PieceState {
        &mut self.guard
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::store::UpdateAt;

    /// Writes into each parameter what its update was given: the sum of its gradients, plus
    /// its state, plus the rate's factor, plus 1000 where L2 applies; and records the step and
    /// epoch.
    struct Recording(Mutex<Vec<(u64, f64)>>);

    impl Optimizer for Recording {
        fn state_names(&self) -> &[&'static str] {
            &["s"]
        }
        fn initial_state(&self, _: &str, params: &[f32]) -> Vec<f32> {
            params.to_vec()
        }
        fn update(&self, piece: Piece<'_, '_>, step: u64, epoch: f64) {
            self.0.lock().unwrap().push((step, epoch));
            for (i, p) in piece.params.iter_mut().enumerate() {
                let grads: f32 = piece.grads.iter().map(|g| g[i]).sum();
                let l2 = if piece.weight_decay { 1000.0 } else { 0.0 };
                *p = grads + piece.state[0][i] + piece.rate_scale + l2;
            }
        }
        fn learning_rate(&self, _: f64) -> f32 {
            1.0
        }
    }

    /// Six parameters in pieces of 2, 3 and 1, L2 on the middle one; a state slot of tens.
    fn shards() -> Shards {
        let params = (0..6).map(|v| v as f32).collect();
        let slot: Vec<f32> = (0..6).map(|v| 10.0 * v as f32).collect();
        Shards::new(
            params,
            &[&slot],
            vec![(0..2, false), (2..5, true), (5..6, false)],
        )
    }

    #[test]
    fn each_piece_is_its_own_range_of_the_parameters_and_the_state() {
        let shards = shards();
        assert_eq!(shards.len(), 3);
        let expected = [(0..2, false), (2..5, true), (5..6, false)];
        for (index, (range, decayed)) in expected.into_iter().enumerate() {
            assert_eq!(shards.offset(index), range.start);
            let values: Vec<f32> = range.clone().map(|v| v as f32).collect();
            let tens: Vec<f32> = values.iter().map(|v| 10.0 * v).collect();
            let read = shards.read(index);
            assert_eq!(
                (read.range(), read.weight_decay()),
                (range.clone(), decayed)
            );
            assert_eq!(
                (read.params(), &read.state[0][..]),
                (&values[..], &tens[..])
            );
            drop(read);
            let write = shards.write(index);
            assert_eq!(write.range(), range);
            assert_eq!(
                (write.params(), &write.state[0][..]),
                (&values[..], &tens[..])
            );
        }
    }

    #[test]
    fn a_written_piece_is_what_the_lent_vector_and_later_reads_see() {
        let shards = shards();
        shards
            .write(1)
            .params_mut()
            .copy_from_slice(&[-1.0, -2.0, -3.0]);
        shards.write(2).state[0][0] = 99.0;
        shards.lend(|params| assert_eq!(params, &[0.0, 1.0, -1.0, -2.0, -3.0, 5.0]));
        assert_eq!(shards.read(1).params(), [-1.0, -2.0, -3.0]);
        assert_eq!(shards.read(2).state[0], [99.0]);
    }

    /// An update reads each replica's gradients at the piece's place in them (from `base`),
    /// with the piece's state, L2 flag and the update's step, epoch and rate.
    #[test]
    fn an_update_gives_the_optimiser_the_pieces_gradients_state_and_schedule() {
        let shards = shards();
        let optimizer = Recording(Mutex::new(Vec::new()));
        // Gradients of parameters 1.. (base 1): the piece 2..5 is at 1..4 in them.
        let first = [0.5, 1.0, 2.0, 3.0, 0.5];
        let second = [0.5, 10.0, 20.0, 30.0, 0.5];
        let at = UpdateAt {
            step: 7,
            epoch: 1.5,
            rate_scale: 0.25,
        };
        shards
            .write(1)
            .update(&optimizer, &[&first, &second], 1, at);
        assert_eq!(optimizer.0.lock().unwrap()[..], [(7, 1.5)]);
        let state = [20.0, 30.0, 40.0];
        let updated: Vec<f32> = (0..3)
            .map(|i| first[i + 1] + second[i + 1] + state[i] + 0.25 + 1000.0)
            .collect();
        assert_eq!(shards.read(1).params(), updated);
        assert_eq!(
            shards.read(0).params(),
            [0.0, 1.0],
            "other pieces untouched"
        );
        assert_eq!(shards.read(2).params(), [5.0]);
    }
}
