//! Byte quantities as Kubernetes writes them (`128Ki`, `1Gi`, `500M`, `1073741824`) and rounding to extents.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
pub const GIB: u64 = 1024 * MIB;
pub const TIB: u64 = 1024 * GIB;

/// A size in bytes that reads and writes Kubernetes quantity strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid size {input:?}: write a whole number of bytes or a quantity such as 128Ki, 4Mi, 1Gi, 2Ti, 500M"
)]
pub struct ParseSizeError {
    pub input: String,
}

impl FromStr for ByteSize {
    type Err = ParseSizeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseSizeError {
            input: s.to_owned(),
        };
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (digits, suffix) = t.split_at(split);
        if digits.is_empty() {
            return Err(err());
        }
        let n: u64 = digits.parse().map_err(|_| err())?;
        let mult: u64 = match suffix {
            "" => 1,
            "Ki" => KIB,
            "Mi" => MIB,
            "Gi" => GIB,
            "Ti" => TIB,
            "Pi" => 1024 * TIB,
            "k" | "K" => 1_000,
            "M" => 1_000_000,
            "G" => 1_000_000_000,
            "T" => 1_000_000_000_000,
            _ => return Err(err()),
        };
        n.checked_mul(mult).map(ByteSize).ok_or_else(err)
    }
}

impl fmt::Display for ByteSize {
    /// The largest binary unit that divides the size exactly (`128Ki`, `1Gi`), else plain bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        for (unit, mult) in [("Ti", TIB), ("Gi", GIB), ("Mi", MIB), ("Ki", KIB)] {
            if v != 0 && v.is_multiple_of(mult) {
                return write!(f, "{}{unit}", v / mult);
            }
        }
        write!(f, "{v}")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Str(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Str(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Rounds `bytes` up to a whole number of extents of `extent_size` bytes (as lvcreate does).
/// Returns `None` on overflow or a zero extent size.
pub fn round_up_to_extent(bytes: u64, extent_size: u64) -> Option<u64> {
    if extent_size == 0 {
        return None;
    }
    bytes.div_ceil(extent_size).checked_mul(extent_size)
}

/// Rounds `bytes` down to a whole number of extents.
pub fn round_down_to_extent(bytes: u64, extent_size: u64) -> Option<u64> {
    if extent_size == 0 {
        return None;
    }
    Some(bytes / extent_size * extent_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_and_decimal_quantities() {
        assert_eq!("128Ki".parse::<ByteSize>().unwrap().0, 128 * KIB);
        assert_eq!("1Gi".parse::<ByteSize>().unwrap().0, GIB);
        assert_eq!("500M".parse::<ByteSize>().unwrap().0, 500_000_000);
        assert_eq!("4096".parse::<ByteSize>().unwrap().0, 4096);
    }

    #[test]
    fn rejects_garbage_and_overflow_with_a_hint() {
        for bad in ["", "Gi", "1.5Gi", "1Xi", "-1", "99999999999999Pi"] {
            let e = bad.parse::<ByteSize>().unwrap_err();
            assert!(e.to_string().contains("128Ki"), "{e}");
        }
    }

    #[test]
    fn displays_the_largest_exact_unit() {
        assert_eq!(ByteSize(128 * KIB).to_string(), "128Ki");
        assert_eq!(ByteSize(3 * GIB).to_string(), "3Gi");
        assert_eq!(ByteSize(1000).to_string(), "1000");
        assert_eq!(ByteSize(0).to_string(), "0");
    }

    #[test]
    fn rounds_to_extents() {
        assert_eq!(round_up_to_extent(1, 4 * MIB), Some(4 * MIB));
        assert_eq!(round_up_to_extent(4 * MIB, 4 * MIB), Some(4 * MIB));
        assert_eq!(round_up_to_extent(4 * MIB + 1, 4 * MIB), Some(8 * MIB));
        assert_eq!(round_down_to_extent(7 * MIB, 4 * MIB), Some(4 * MIB));
        assert_eq!(round_up_to_extent(u64::MAX, 4 * MIB), None);
        assert_eq!(round_up_to_extent(1, 0), None);
    }
}
