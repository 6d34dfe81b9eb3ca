//! What a synchronous run across ranks, or between GPU replicas, sends between them
//! ([`Exchange`]).

use std::fmt;
use std::str::FromStr;

/// The type a synchronous run across ranks, or between replicas on GPUs (the device store),
/// exchanges its gradients in.
///
/// `Bf16` divides each worker's gradients by the number of workers, rounds them to `bf16` and
/// sends those (half the bytes of `f32`); the owner of a share sums what arrives in `f32`, in
/// worker order as always, so a run stays bitwise reproducible for a seed and worker count.
/// The updated shares travel back in `bf16` too where the replicas compute in `bf16` (they
/// round the parameters to it anyway, so nothing they see changes), in `f32` otherwise; the
/// owner keeps its share's `f32` master values, gathered whole before a checkpoint. Between
/// GPU replicas in one process the same arithmetic runs on the devices: each replica's
/// gradients leave its step in `bf16`, and every replica sums all of them in `f32` in its
/// update (the copies to replicas on other GPUs move half the bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Exchange {
    /// `f32`, as computed.
    #[default]
    F32,
    /// `bf16`, divided by the worker count first.
    Bf16,
}

impl Exchange {
    /// Its name on the command line and in checkpoints.
    pub const fn name(self) -> &'static str {
        match self {
            Exchange::F32 => "f32",
            Exchange::Bf16 => "bf16",
        }
    }
}

/// The one gradient of a 16-bit exchange, into `sum` (cleared, then as long as a part): the
/// f32 sum from zero of `parts`, in their order (each already divided by the worker count, so
/// the sum is the mean). The device stores' update kernels sum the same way.
pub(crate) fn sum_in_order<'p>(
    parts: impl IntoIterator<Item = &'p [f32]>,
    len: usize,
    sum: &mut Vec<f32>,
) {
    sum.clear();
    sum.resize(len, 0.0);
    for part in parts {
        sum.iter_mut().zip(part).for_each(|(s, g)| *s += g);
    }
}

impl fmt::Display for Exchange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no [`Exchange`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown exchange type {0:?}: expected f32 or bf16")]
pub struct UnknownExchange(pub String);

impl FromStr for Exchange {
    type Err = UnknownExchange;

    fn from_str(name: &str) -> Result<Self, UnknownExchange> {
        [Exchange::F32, Exchange::Bf16]
            .into_iter()
            .find(|e| e.name() == name)
            .ok_or_else(|| UnknownExchange(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_others_are_refused() {
        for exchange in [Exchange::F32, Exchange::Bf16] {
            assert_eq!(exchange.to_string().parse(), Ok(exchange));
        }
        assert_eq!(
            "fp16".parse::<Exchange>(),
            Err(UnknownExchange("fp16".into()))
        );
        assert_eq!(Exchange::default(), Exchange::F32);
    }

    /// The sum is from zero, of the parts in their order: f32 addition is not associative, so
    /// another order would give another mean (and break reproducibility).
    #[test]
    fn a_16_bit_exchange_sums_its_parts_from_zero_in_their_order() {
        let parts: [&[f32]; 3] = [&[1e8, 0.5, 3.0], &[1.0, 0.25, -1.0], &[-1e8, 0.125, 0.0]];
        let mut sum = vec![7.0; 5];
        sum_in_order(parts, 3, &mut sum);
        // 1e8 + 1 is 1e8 in f32.
        assert_eq!(sum, [0.0, 0.875, 2.0]);
        sum_in_order([parts[0], parts[2], parts[1]], 3, &mut sum);
        assert_eq!(sum[0], 1.0, "1e8 - 1e8 + 1 in this order");
        sum_in_order(Vec::<&[f32]>::new(), 2, &mut sum);
        assert_eq!(sum, [0.0, 0.0], "no parts: zeros, as long as asked");
    }
}
