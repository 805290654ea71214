//! Byte counts as a type of their own, so memory figures cannot be mixed up with parameter or
//! token counts, and so the arithmetic on them saturates instead of overflowing on absurd input.

use std::fmt;
use std::iter::Sum;
use std::ops::{Add, AddAssign};

use serde::{Deserialize, Serialize};

use crate::hardware::GIB;

/// A number of bytes. Serialises as a plain integer.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Bytes(pub u64);

impl Bytes {
    /// Zero bytes.
    pub const ZERO: Self = Self(0);

    /// Whole GiB.
    pub const fn gib(n: u64) -> Self {
        Self(n.saturating_mul(GIB))
    }

    /// Rounds a computed (non-negative) amount up to whole bytes; NaN and negatives become 0,
    /// and anything beyond `u64::MAX` saturates.
    pub fn from_f64(value: f64) -> Self {
        if value.is_nan() || value <= 0.0 {
            Self(0)
        } else if value >= u64::MAX as f64 {
            Self(u64::MAX)
        } else {
            Self(value.ceil() as u64)
        }
    }

    /// True for `u64::MAX`, where saturating arithmetic stops: the true figure may be larger,
    /// so such an amount must never count as fitting anywhere.
    pub const fn is_saturated(self) -> bool {
        self.0 == u64::MAX
    }

    /// The value in GiB, for display and ratios.
    pub fn as_gib(self) -> f64 {
        self.0 as f64 / GIB as f64
    }

    /// The value as a float, for ratios.
    pub fn as_f64(self) -> f64 {
        self.0 as f64
    }

    /// `self - other`, or zero when `other` is larger.
    pub fn saturating_sub(self, other: Self) -> Self {
        Self(self.0.saturating_sub(other.0))
    }

    /// `self * factor`, saturating.
    pub fn times(self, factor: u64) -> Self {
        Self(self.0.saturating_mul(factor))
    }

    /// `self / divisor`, rounded up (a share of a tensor split `divisor` ways still needs a
    /// whole byte); dividing by zero yields `self`.
    pub fn div_ceil(self, divisor: u64) -> Self {
        if divisor == 0 {
            self
        } else {
            Self(self.0.div_ceil(divisor))
        }
    }

    /// `self * fraction`, rounded down (used for the utilisation budget).
    pub fn fraction(self, fraction: f64) -> Self {
        let value = (self.0 as f64 * fraction).floor();
        if value.is_nan() || value <= 0.0 {
            Self(0)
        } else if value >= u64::MAX as f64 {
            Self(u64::MAX)
        } else {
            Self(value as u64)
        }
    }
}

impl Add for Bytes {
    type Output = Self;
    fn add(self, other: Self) -> Self {
        Self(self.0.saturating_add(other.0))
    }
}

impl AddAssign for Bytes {
    fn add_assign(&mut self, other: Self) {
        *self = *self + other;
    }
}

impl Sum for Bytes {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Self::ZERO, Add::add)
    }
}

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::output::human_bytes(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        assert_eq!(Bytes(u64::MAX) + Bytes(1), Bytes(u64::MAX));
        assert_eq!(Bytes(1).saturating_sub(Bytes(2)), Bytes::ZERO);
        assert_eq!(Bytes(7).div_ceil(2), Bytes(4));
        assert_eq!(Bytes(7).div_ceil(0), Bytes(7));
        assert_eq!(Bytes::from_f64(f64::NAN), Bytes::ZERO);
        assert_eq!(Bytes::from_f64(-3.0), Bytes::ZERO);
        assert_eq!(Bytes::from_f64(1e300), Bytes(u64::MAX));
        assert_eq!(Bytes::from_f64(2.1), Bytes(3));
    }

    #[test]
    fn fraction_never_exceeds_the_whole() {
        assert_eq!(Bytes(1000).fraction(0.9), Bytes(900));
        assert_eq!(Bytes(u64::MAX).fraction(1.0), Bytes(u64::MAX));
        assert_eq!(Bytes(10).fraction(-1.0), Bytes::ZERO);
        assert_eq!(Bytes::gib(80).to_string(), "80.0 GiB");
    }
}
