//! Parses a bare parameter count as people write it: `70B`, `8e9`, `1.5T`, `350M`.

use crate::plan::error::{PlanError, Result};

/// The largest count accepted (10^15 parameters): anything above is a typo, and keeping
/// counts this small keeps every byte figure derived from them far from overflow.
const MAX_PARAMS: f64 = 1e15;

/// Parses `70B`, `70b`, `8e9`, `1.5T`, `350M`, `7000000000` into a parameter count.
pub fn parse_param_count(text: &str) -> Result<u64> {
    let invalid = || PlanError::InvalidParamCount(text.to_string());
    let trimmed = text.trim();
    let (number, scale) = match trimmed.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&trimmed[..trimmed.len() - 1], 1e3),
        Some('M') => (&trimmed[..trimmed.len() - 1], 1e6),
        Some('B' | 'G') => (&trimmed[..trimmed.len() - 1], 1e9),
        Some('T') => (&trimmed[..trimmed.len() - 1], 1e12),
        _ => (trimmed, 1.0),
    };
    let value: f64 = number.trim().parse().map_err(|_| invalid())?;
    let count = value * scale;
    if !(1.0..=MAX_PARAMS).contains(&count) {
        return Err(invalid());
    }
    Ok(count.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_and_exponents() {
        assert_eq!(parse_param_count("70B").unwrap(), 70_000_000_000);
        assert_eq!(parse_param_count(" 8e9 ").unwrap(), 8_000_000_000);
        assert_eq!(parse_param_count("1.5t").unwrap(), 1_500_000_000_000);
        assert_eq!(parse_param_count("350M").unwrap(), 350_000_000);
        assert_eq!(parse_param_count("7000").unwrap(), 7000);
    }

    #[test]
    fn rejects_nonsense() {
        for bad in ["", "B", "-7B", "0", "abc", "1e30", "NaN", "inf", "7Q", "é"] {
            assert!(parse_param_count(bad).is_err(), "{bad:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in ".*") {
            let _ = parse_param_count(&s);
        }
    }
}
