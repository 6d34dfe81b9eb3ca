/// The one definition of an epoch, and every conversion between steps, examples and epochs.
///
/// **An epoch is one pass over the training set's `examples` examples**, drawn
/// `examples_per_step` at a time (synchronous: workers x batch size; asynchronous: one worker's
/// batch). Step `s` (counted from 0) draws positions `s * examples_per_step ..` of the data
/// order's stream ([`EpochOrder`](crate::EpochOrder)), whose epoch `e` is positions
/// `e * examples .. (e + 1) * examples`, one permutation of the data set. Everything else
/// follows from this:
///
/// * the learning-rate schedule's continuous epoch, [`epoch_at`](Self::epoch_at):
///   examples drawn before step `s`, divided by `examples`;
/// * the step that ends `k` epochs, [`end_step`](Self::end_step): the first by which `k *
///   examples` examples have been drawn, `ceil(k * examples / examples_per_step)` (`--epochs`);
/// * the whole number of steps in one epoch, [`steps_per_epoch`](Self::steps_per_epoch):
///   `end_step(1)`, rounded **up**, so that a stretch of that many steps covers every example
///   of some epoch at least once (the default checkpoint and evaluation cadence).
///
/// When `examples_per_step` divides `examples` (the default: 55,000 at 100 or 200 per step),
/// the three agree exactly: epoch `k` ends at step `k * steps_per_epoch()`, where
/// `epoch_at` is `k`. Otherwise an epoch ends mid-step; `end_step(k)` is the step that
/// completes it, and a cadence of `steps_per_epoch()` steps runs ahead of the epochs by
/// `steps_per_epoch() - examples / examples_per_step` (less than one step) per epoch.
///
/// ```
/// use tandem_strategy::Epochs;
///
/// let default = Epochs::new(55_000, 200); // 2 workers x 100
/// assert_eq!(default.steps_per_epoch(), 275);
/// assert_eq!(default.end_step(3), Some(825));
/// assert_eq!(default.epoch_at(550), 2.0);
///
/// let odd = Epochs::new(55_000, 192); // 3 workers x 64: 286.46 steps per epoch
/// assert_eq!(odd.steps_per_epoch(), 287);
/// assert_eq!(odd.end_step(2), Some(573));
/// assert!(odd.epoch_at(573) > 2.0 && odd.epoch_at(572) < 2.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Epochs {
    examples: u64,
    per_step: u64,
}

impl Epochs {
    /// Epochs of `examples` training examples at `examples_per_step` per global step (each at
    /// least 1: a count of 0 is taken as 1, so that nothing divides by zero).
    pub fn new(examples: usize, examples_per_step: u64) -> Self {
        Self {
            examples: (examples as u64).max(1),
            per_step: examples_per_step.max(1),
        }
    }

    /// Training examples in one epoch.
    pub fn examples(&self) -> u64 {
        self.examples
    }

    /// Examples drawn per global step.
    pub fn examples_per_step(&self) -> u64 {
        self.per_step
    }

    /// The data order's stream position of the first example step `step` (from 0) draws.
    pub fn position(&self, step: u64) -> u64 {
        step * self.per_step
    }

    /// Epochs completed before step `step` (from 0), continuously: `step * examples_per_step /
    /// examples`, the exponent of the learning-rate decay. Computed as `step / (examples /
    /// examples_per_step)` in `f64`, as tandem always has, so that schedules (and checkpoints
    /// resumed across versions) do not move by a bit.
    pub fn epoch_at(&self, step: u64) -> f64 {
        step as f64 / (self.examples as f64 / self.per_step as f64)
    }

    /// The first step count by which `examples` examples have been drawn:
    /// `ceil(examples / examples_per_step)`.
    pub fn steps_for(&self, examples: u64) -> u64 {
        examples.div_ceil(self.per_step)
    }

    /// The step count that completes `epochs` epochs (`None` on overflow): `ceil(epochs *
    /// examples / examples_per_step)`, the end of a run asked for in epochs.
    pub fn end_step(&self, epochs: u64) -> Option<u64> {
        epochs
            .checked_mul(self.examples)
            .map(|examples| self.steps_for(examples))
    }

    /// Whole steps in one epoch, rounded up (`end_step(1)`): the default cadence of checkpoints
    /// and evaluations. At least 1.
    pub fn steps_per_epoch(&self) -> u64 {
        self.steps_for(self.examples)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EpochOrder;

    #[test]
    fn a_dividing_batch_makes_every_definition_agree() {
        for per_step in [100, 200, 55_000] {
            let e = Epochs::new(55_000, per_step);
            let s = e.steps_per_epoch();
            assert_eq!(s * per_step, 55_000);
            for k in 0..5 {
                assert_eq!(e.end_step(k), Some(k * s));
                assert_eq!(e.epoch_at(k * s), k as f64);
            }
            // The old floor and the schedule's old formula, unchanged.
            assert_eq!(s, 55_000 / per_step);
            for step in [0, 1, 7, 274, 275, 12_345, 1 << 40] {
                let old = step as f64 / (55_000.0 / per_step as f64).max(1e-12);
                assert_eq!(e.epoch_at(step).to_bits(), old.to_bits());
            }
        }
    }

    #[test]
    fn a_non_dividing_batch_rounds_up_and_ends_epochs_where_the_data_order_does() {
        let e = Epochs::new(55_000, 192);
        assert_eq!((e.examples(), e.examples_per_step()), (55_000, 192));
        assert_eq!(e.steps_per_epoch(), 287); // 286.46 rounded up, not down to 286
        assert_eq!(e.end_step(1), Some(287));
        assert_eq!(e.end_step(2), Some(573)); // not 2 x 287
        assert_eq!(e.end_step(3), Some(860));
        assert_eq!(e.end_step(0), Some(0));
        assert_eq!(e.end_step(u64::MAX), None);
        for k in 1..50u64 {
            let end = e.end_step(k).unwrap();
            // The step that ends epoch k draws its last example, and not the one before.
            assert!(e.position(end) >= k * 55_000);
            assert!(e.position(end - 1) < k * 55_000);
            assert!(e.epoch_at(end) >= k as f64 && e.epoch_at(end - 1) < k as f64);
        }
        // A stretch of steps_per_epoch steps covers at least one epoch's examples.
        assert!(e.steps_per_epoch() * 192 >= 55_000);
        assert!((e.steps_per_epoch() - 1) * 192 < 55_000);
    }

    #[test]
    fn the_schedules_epoch_is_the_data_orders_permutation() {
        // Small set: 50 examples at 7 per step. The data order's permutation (stream position /
        // 50) of a step's first example is floor(epoch_at(step)).
        let e = Epochs::new(50, 7);
        let mut stream = vec![0u32; 7 * 40];
        EpochOrder::new(5, 50).fill(0, &mut stream);
        for step in 0..40u64 {
            let epoch = e.epoch_at(step).floor() as u64;
            assert_eq!(e.position(step) / 50, epoch, "step {step}");
        }
        // Every example appears in the steps up to end_step(1).
        let mut seen = stream[..e.position(e.end_step(1).unwrap()) as usize].to_vec();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 50);
    }

    #[test]
    fn degenerate_sizes_never_divide_by_zero() {
        let e = Epochs::new(0, 0);
        assert_eq!((e.examples(), e.examples_per_step()), (1, 1));
        assert_eq!(e.steps_per_epoch(), 1);
        assert_eq!(e.epoch_at(3), 3.0);
        // A global batch larger than the data set: one step is an epoch (and more).
        let big = Epochs::new(50, 64);
        assert_eq!(big.steps_per_epoch(), 1);
        assert_eq!(big.end_step(3), Some(3));
    }
}
