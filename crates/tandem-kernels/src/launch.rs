//! The host-side rules of the CUDA backend's launches, which need no GPU and no driver and so
//! are tested in every build: how a product is split over k, and which parameter updates one
//! update launch joins.
// Used by the `cuda` feature's backend; without it only the tests use them.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use tandem_core::{DType, DeviceOp};

use crate::ptx::{MAX_UPDATE_SPANS, SPAN_TABLE};

/// `TILE` of `kernels/matmul.cu`: a block computes a `TILE x TILE` tile of C.
pub(crate) const TILE: usize = 32;
/// A matmul with fewer tiles of C than this is split over k until it has about this many
/// blocks (a few per multiprocessor on large GPUs), so that short walks over k run side by
/// side instead of one long walk per tile.
const SPLIT_BLOCKS: usize = 1024;
/// A walk over at most this many tiles of k is never split: it is short, and a split makes
/// each tile's last block wait on memory for the others' slices and add them (when this was
/// chosen, a `sum_splits` kernel did: about 2 us of a graph's node latency on an H200, against
/// a few tiles' walk). A weight gradient over a batch of 100 (4 tiles) stays unsplit.
const SHORT_WALK_TILES: usize = 4;

/// How a matmul with `blocks` tiles of C is split over its `k`: `count` splits of `k_split`
/// values of k each (a multiple of the tile, the last split shorter), or one split of all of k.
/// It depends on the shape alone, so that a shape's sums are always taken in the same order.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct KSplits {
    /// How many splits.
    pub count: usize,
    /// Values of k in each (the last may hold fewer).
    pub k_split: usize,
}

impl KSplits {
    /// The splits of a product of `blocks` tiles of C over `k`.
    pub fn of(blocks: usize, k: usize) -> KSplits {
        let tiles = k.div_ceil(TILE);
        let wanted = SPLIT_BLOCKS.div_ceil(blocks.max(1)).min(tiles);
        if wanted <= 1 || tiles <= SHORT_WALK_TILES {
            return KSplits {
                count: 1,
                k_split: k,
            };
        }
        let tiles_per_split = tiles.div_ceil(wanted);
        KSplits {
            count: tiles.div_ceil(tiles_per_split),
            k_split: tiles_per_split * TILE,
        }
    }
}

/// The spans, `(len, hyper)`, of the updates at the start of `ops` that one update launch can
/// apply (at least the first, at most [`MAX_UPDATE_SPANS`]): each runs the same kernel and
/// begins in every buffer (parameters, each state vector, each gradient vector, the rounded
/// copy) where the one before it ends, with gradients of the same type and a copy of the same
/// type or none. The sync update of a whole parameter
/// vector, one update per tensor, is then one kernel.
pub(crate) fn consecutive_spans(ops: &[DeviceOp]) -> Vec<(usize, u64)> {
    let mut spans = Vec::new();
    let mut first = None;
    let mut offset = 0; // values from the first update's addresses
    for op in ops.iter().take(MAX_UPDATE_SPANS) {
        let DeviceOp::Update {
            kernel,
            params,
            state,
            grads,
            grads_dtype,
            len,
            hyper,
            copy,
        } = op
        else {
            break;
        };
        let (k0, p0, s0, g0, d0, c0) =
            *first.get_or_insert((*kernel, *params, state, grads, *grads_dtype, *copy));
        let shifted = |these: &[u64], first: &[u64], dtype: DType| {
            these.len() == first.len()
                && these
                    .iter()
                    .zip(first)
                    .all(|(a, a0)| a.wrapping_sub(*a0) == dtype.bytes(offset) as u64)
        };
        let follows = *kernel == k0
            && *grads_dtype == d0
            && shifted(&[*params], &[p0], DType::F32)
            && shifted(state, s0, DType::F32)
            && shifted(grads, g0, d0)
            && match (copy, c0) {
                (None, None) => true,
                (Some(c), Some(c0)) => {
                    c.dtype == c0.dtype && shifted(&[c.params], &[c0.params], DType::F32)
                }
                _ => false,
            };
        if !follows {
            break;
        }
        spans.push((*len, *hyper));
        offset += len;
    }
    spans
}

/// An update kernel's `Spans` parameter for `spans` (`(len, hyper)` each): their ends, then
/// their values' addresses; and the count. `None` for no spans or more than the kernel
/// takes.
pub(crate) fn span_table(spans: &[(usize, u64)]) -> Option<([u64; SPAN_TABLE], u32)> {
    if spans.is_empty() || spans.len() > MAX_UPDATE_SPANS {
        return None;
    }
    let mut table = [0u64; SPAN_TABLE];
    let mut end = 0u64;
    for (i, &(len, hyper)) in spans.iter().enumerate() {
        end = end.saturating_add(len as u64);
        table[i] = end;
        table[MAX_UPDATE_SPANS + i] = hyper;
    }
    Some((table, spans.len() as u32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_core::RoundedCopy;

    /// An `sgd_ema_update` of `len` values at byte `at` of four buffers 10,000 bytes apart
    /// (the average's 1,000 bytes further when `ema_shift`), with `grads` gradient vectors.
    fn update_of(at: u64, len: usize, hyper: u64, ema_shift: bool, grads: u64) -> DeviceOp {
        DeviceOp::Update {
            kernel: "sgd_ema_update",
            params: at,
            state: vec![at + 10_000 + if ema_shift { 1_000 } else { 0 }],
            grads: (0..grads).map(|g| at + 20_000 + 10_000 * g).collect(),
            grads_dtype: DType::F32,
            len,
            hyper,
            copy: None,
        }
    }

    fn update(at: u64, len: usize, hyper: u64) -> DeviceOp {
        update_of(at, len, hyper, false, 2)
    }

    /// Updates join one launch while each starts, in every buffer, where the one before ends.
    #[test]
    fn updates_of_consecutive_spans_join_one_launch() {
        let ops = [
            update(0, 3, 1),
            update(12, 5, 2),
            update(32, 1, 1),
            update(40, 2, 2),
        ];
        assert_eq!(consecutive_spans(&ops), [(3, 1), (5, 2), (1, 1)]);
        let fewer_grads = update_of(32, 1, 1, false, 1);
        assert_eq!(consecutive_spans(&[update(0, 8, 1), fewer_grads]), [(8, 1)]);
        let elsewhere = update_of(32, 1, 1, true, 2);
        assert_eq!(consecutive_spans(&[update(0, 8, 1), elsewhere]), [(8, 1)]);
        // Only a later buffer breaks the run: the second gradient vector, or the third of
        // three, elsewhere.
        for broken in [1, 2] {
            let mut later = update_of(32, 1, 1, false, 3);
            if let DeviceOp::Update { grads, .. } = &mut later {
                grads[broken] += 4;
            }
            let first = update_of(0, 8, 1, false, 3);
            assert_eq!(consecutive_spans(&[first, later]), [(8, 1)], "{broken}");
        }
        let copy = DeviceOp::Copy {
            dst: 0,
            src: 0,
            len: 1,
            dtype: DType::F32,
        };
        assert_eq!(consecutive_spans(&[update(0, 8, 1), copy]), [(8, 1)]);
        // Another kernel, or another number of state vectors, is another launch.
        let mut adam = update(32, 1, 1);
        if let DeviceOp::Update { kernel, .. } = &mut adam {
            *kernel = "adam_update";
        }
        assert_eq!(consecutive_spans(&[update(0, 8, 1), adam]), [(8, 1)]);
        let mut more_state = update(32, 1, 1);
        if let DeviceOp::Update { state, .. } = &mut more_state {
            state.push(50_032);
        }
        assert_eq!(consecutive_spans(&[update(0, 8, 1), more_state]), [(8, 1)]);
        // Gradients of another type are another launch; a narrower type's next span begins
        // fewer bytes on in the gradients, and as far in the f32 parameters and state.
        let narrow = |at: u64, len| {
            let mut op = update(at, len, 1);
            if let DeviceOp::Update {
                grads, grads_dtype, ..
            } = &mut op
            {
                *grads_dtype = DType::BF16;
                for g in grads.iter_mut() {
                    *g -= at / 2;
                }
            }
            op
        };
        assert_eq!(
            consecutive_spans(&[update(0, 8, 1), narrow(32, 1)]),
            [(8, 1)]
        );
        assert_eq!(
            consecutive_spans(&[narrow(0, 8), narrow(32, 1)]),
            [(8, 1), (1, 1)]
        );
        assert_eq!(
            consecutive_spans(&[narrow(0, 8), update(32, 1, 1)]),
            [(8, 1)]
        );
        // A rounded copy joins where it too continues, in f32 slots, of the same type.
        let copied = |at: u64, len, dtype, shift: u64| {
            let mut op = update(at, len, 1);
            if let DeviceOp::Update { copy, .. } = &mut op {
                *copy = Some(RoundedCopy {
                    params: at + 60_000 + shift,
                    dtype,
                });
            }
            op
        };
        let bf16 = DType::BF16;
        assert_eq!(
            consecutive_spans(&[copied(0, 8, bf16, 0), copied(32, 1, bf16, 0)]),
            [(8, 1), (1, 1)]
        );
        for later in [
            copied(32, 1, DType::F16, 0),
            copied(32, 1, bf16, 4),
            update(32, 1, 1),
        ] {
            assert_eq!(consecutive_spans(&[copied(0, 8, bf16, 0), later]), [(8, 1)]);
        }
        assert_eq!(
            consecutive_spans(&[update(0, 8, 1), copied(32, 1, bf16, 0)]),
            [(8, 1)]
        );
        let many: Vec<_> = (0..20).map(|i| update(4 * i, 1, i)).collect();
        let joined = consecutive_spans(&many);
        assert_eq!(joined.len(), MAX_UPDATE_SPANS);
        assert_eq!(consecutive_spans(&many[MAX_UPDATE_SPANS..])[0], (1, 8));
        // The kernel's table: cumulative ends, then the addresses.
        let (table, count) = span_table(&[(3, 7), (5, 9)]).expect("two spans");
        assert_eq!(count, 2);
        assert_eq!(table[..2], [3, 8]);
        assert_eq!(table[MAX_UPDATE_SPANS..MAX_UPDATE_SPANS + 2], [7, 9]);
        assert!(span_table(&[]).is_none());
        assert!(span_table(&[(1, 0); MAX_UPDATE_SPANS + 1]).is_none());
    }

    /// The model's small products with long walks over k are split, large ones and short
    /// walks are not, and the splits of every shape cover k exactly in whole tiles.
    #[test]
    fn small_matmuls_are_split_over_k_in_whole_tiles() {
        let splits = |blocks, k| {
            let s = KSplits::of(blocks, k);
            (s.count, s.k_split)
        };
        // 100x500x784 (64 tiles of C): 13 splits of 2 tiles of k instead of 25 tiles in a row.
        assert_eq!(splits(64, 784), (13, 64));
        assert_eq!(splits(4, 500), (16, 32)); // 100x10x500
        assert_eq!(splits(400, 100), (1, 100)); // 784x500x100: 4 tiles of k, a short walk
        assert_eq!(splits(16, 100), (1, 100)); // 500x10x100
        assert_eq!(splits(16, 160), (5, 32)); // 5 tiles of k
        assert_eq!(splits(64, 10), (1, 10)); // one tile of k: nothing to split
        assert_eq!(splits(2048, 5000), (1, 5000)); // enough blocks already
        assert_eq!(splits(1, 0), (1, 0));
        for blocks in [1, 3, 17, 100, 1023, 1024, 5000] {
            for k in [1, 31, 32, 33, 100, 784, 1000, 4097, 100_000] {
                let KSplits { count, k_split } = KSplits::of(blocks, k);
                if count == 1 {
                    assert_eq!(k_split, k);
                } else {
                    assert_eq!(k_split % TILE, 0, "{blocks} {k}");
                    assert!(
                        (count - 1) * k_split < k && k <= count * k_split,
                        "{blocks} {k}"
                    );
                }
            }
        }
    }
}
