//! The element type of a buffer ([`DType`]): how many bytes a value takes and how it is
//! stored. Device memory is named by address, so the type travels with each allocation, copy
//! and replica residence instead of being assumed; byte arithmetic goes through it.

use std::fmt;
use std::str::FromStr;

/// How the values of a buffer are stored.
///
/// The parameters of record and the optimiser's state are always `F32` (the master copy that
/// mixed-precision training keeps); what a replica computes with may be narrower.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DType {
    /// IEEE 754 binary32.
    #[default]
    F32,
    /// bfloat16: binary32's sign and 8-bit exponent, 7 bits of mantissa.
    BF16,
    /// IEEE 754 binary16: 5-bit exponent, 10 bits of mantissa.
    F16,
}

impl DType {
    /// Every type, in the order of their names in messages.
    pub const ALL: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

    /// Bytes one value takes.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
        }
    }

    /// Bytes `len` values take.
    pub const fn bytes(self, len: usize) -> usize {
        self.size() * len
    }

    /// The address of value `index` of an array of this type at `base`.
    pub const fn at(self, base: u64, index: usize) -> u64 {
        base.wrapping_add(self.bytes(index) as u64)
    }

    /// Its name on the command line and in files: `f32`, `bf16` or `f16`.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no [`DType`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown element type {given:?}: expected one of f32, bf16, f16")]
pub struct UnknownDType {
    /// The name given.
    pub given: String,
}

impl FromStr for DType {
    type Err = UnknownDType;

    fn from_str(name: &str) -> Result<Self, UnknownDType> {
        DType::ALL
            .into_iter()
            .find(|dtype| dtype.name() == name)
            .ok_or_else(|| UnknownDType {
                given: name.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_those_of_the_rust_types_of_the_same_layout() {
        assert_eq!(DType::F32.size(), std::mem::size_of::<f32>());
        // bf16 and f16 are both 16-bit patterns.
        assert_eq!(DType::BF16.size(), std::mem::size_of::<u16>());
        assert_eq!(DType::F16.size(), std::mem::size_of::<u16>());
        assert_eq!(DType::BF16.bytes(3), 6);
        assert_eq!(DType::F32.at(0x1000, 3), 0x100c);
        assert_eq!(DType::F16.at(0x1000, 3), 0x1006);
    }

    #[test]
    fn names_round_trip_and_others_are_refused_by_name() {
        for dtype in DType::ALL {
            assert_eq!(dtype.to_string().parse::<DType>(), Ok(dtype));
        }
        let err = "fp16".parse::<DType>().unwrap_err();
        assert_eq!(err.given, "fp16");
        assert!(err.to_string().contains("f32, bf16, f16"), "{err}");
        assert_eq!(DType::default(), DType::F32);
    }
}
