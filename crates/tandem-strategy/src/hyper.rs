/// Which examples each step trains on: batches of the [`EpochOrder`](crate::EpochOrder) that
/// `seed` shuffles. Its defaults are the TensorFlow multi-GPU MNIST example's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batches {
    /// Examples per worker per step.
    pub batch_size: usize,
    /// Seed of the data order.
    pub seed: u64,
}

/// `Default` is the type's `DEFAULT`: the reference's values.
macro_rules! default_is_the_reference {
    ($($name:ty),*) => {
        $(impl Default for $name {
            fn default() -> Self {
                Self::DEFAULT
            }
        })*
    };
}

default_is_the_reference!(Batches);

impl Batches {
    /// Batches of 100, seed 1.
    pub const DEFAULT: Batches = Batches {
        batch_size: 100,
        seed: 1,
    };
}

/// Whether an observer that asks for reports every `log_every` steps hears of global step
/// `step` (counted from 1): every `log_every`-th, never when `log_every` is 0.
pub(crate) fn reports(log_every: u64, step: u64) -> bool {
    step.is_multiple_of(log_every)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_every_nth_step_and_never_for_0() {
        let reported = |n| (1..=10).filter(|&s| reports(n, s)).collect::<Vec<u64>>();
        assert_eq!(reported(3), [3, 6, 9]);
        assert_eq!(reported(1), (1..=10).collect::<Vec<_>>());
        assert_eq!(reported(0), Vec::<u64>::new());
    }
}
