//! Kubernetes quantities for the inventory: integers written in the apiserver's own canonical
//! form, and read back.
//!
//! Canonical form matters for server-side apply: the apiserver re-serialises every quantity
//! canonically (`1024Mi` is stored as `1Gi`, `1000` as `1k`), so an agent that sent a
//! non-canonical spelling would see a difference on every read and write again forever.
//! These functions emit exactly what the apiserver would store.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const BINARY_SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
const DECIMAL_SUFFIXES: [&str; 7] = ["", "k", "M", "G", "T", "P", "E"];

/// A byte count: binary suffixes when the count is a whole number of KiB (`80Gi`,
/// `81559Mi`), plain decimal otherwise, as the apiserver canonicalises `BinarySI`.
pub fn bytes(count: u64) -> Quantity {
    if count == 0 || !count.is_multiple_of(1024) {
        return decimal(count);
    }
    let (mut mantissa, mut exponent) = (count, 0);
    while mantissa.is_multiple_of(1024) && exponent + 1 < BINARY_SUFFIXES.len() {
        mantissa /= 1024;
        exponent += 1;
    }
    Quantity(format!("{mantissa}{}", BINARY_SUFFIXES[exponent]))
}

/// A plain count (compute units) in canonical `DecimalSI` form: `132`, `1k`, `2500k`.
pub fn decimal(count: u64) -> Quantity {
    if count == 0 {
        return Quantity("0".to_string());
    }
    let (mut mantissa, mut exponent) = (count, 0);
    while mantissa.is_multiple_of(1000) && exponent + 1 < DECIMAL_SUFFIXES.len() {
        mantissa /= 1000;
        exponent += 1;
    }
    Quantity(format!("{mantissa}{}", DECIMAL_SUFFIXES[exponent]))
}

/// Thousandths (a CPU limit in millicores) in canonical form: `500m`, `1500m`, `2`.
pub fn millis(thousandths: u64) -> Quantity {
    if thousandths.is_multiple_of(1000) {
        decimal(thousandths / 1000)
    } else {
        Quantity(format!("{thousandths}m"))
    }
}

/// The value of a quantity in thousandths, for the forms this module writes plus decimal
/// fractions (`1.5Gi`); `None` for anything else (exponents, negatives, overflow) rather than
/// a guess.
pub fn parse_millis(quantity: &Quantity) -> Option<u128> {
    let text = quantity.0.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let multiplier_millis: u128 = match suffix {
        "m" => 1,
        "" => 1000,
        _ => {
            let binary = BINARY_SUFFIXES.iter().position(|s| *s == suffix);
            let decimal = DECIMAL_SUFFIXES.iter().position(|s| *s == suffix);
            match (binary, decimal) {
                (Some(exp), _) => 1000 * 1024u128.pow(u32::try_from(exp).ok()?),
                (None, Some(exp)) => 1000 * 1000u128.pow(u32::try_from(exp).ok()?),
                (None, None) => return None,
            }
        }
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut value = whole.checked_mul(multiplier_millis)?;
    if !fraction.is_empty() {
        let digits = u32::try_from(fraction.len()).ok()?;
        let scale = 10u128.checked_pow(digits)?;
        let numerator: u128 = fraction.parse().ok()?;
        value = value.checked_add(numerator.checked_mul(multiplier_millis)? / scale)?;
    }
    Some(value)
}

/// The whole-unit value of a quantity (bytes, counts); `None` when it is not a whole number
/// or does not fit in `u64`.
pub fn parse_whole(quantity: &Quantity) -> Option<u64> {
    let millis = parse_millis(quantity)?;
    if millis % 1000 != 0 {
        return None;
    }
    u64::try_from(millis / 1000).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn q(text: &str) -> Quantity {
        Quantity(text.to_string())
    }

    #[test]
    fn bytes_use_the_largest_exact_binary_suffix() {
        assert_eq!(bytes(80 << 30).0, "80Gi");
        assert_eq!(bytes(81559 << 20).0, "81559Mi");
        assert_eq!(bytes(1024 * 1000).0, "1000Ki");
        assert_eq!(bytes(1536).0, "1536");
        assert_eq!(bytes(3000).0, "3k");
        assert_eq!(bytes(0).0, "0");
        assert_eq!(bytes(1 << 62).0, "4Ei");
    }

    #[test]
    fn counts_and_millis_are_canonical_decimal() {
        assert_eq!(decimal(132).0, "132");
        assert_eq!(decimal(1000).0, "1k");
        assert_eq!(decimal(2_500_000).0, "2500k");
        assert_eq!(millis(500).0, "500m");
        assert_eq!(millis(1500).0, "1500m");
        assert_eq!(millis(2000).0, "2");
    }

    #[test]
    fn parses_what_people_write() {
        assert_eq!(parse_whole(&q("80Gi")), Some(80 << 30));
        assert_eq!(parse_whole(&q("1.5Gi")), Some(1536 << 20));
        assert_eq!(parse_whole(&q("2k")), Some(2000));
        assert_eq!(parse_whole(&q("500m")), None);
        assert_eq!(parse_millis(&q("500m")), Some(500));
        for bad in ["", "Gi", "1e3", "-1", "1.2.3", "12Qi", "."] {
            assert_eq!(parse_millis(&q(bad)), None, "{bad}");
        }
        assert_eq!(parse_whole(&q("99999999999999999999999Ei")), None);
    }

    proptest! {
        #[test]
        fn formatting_round_trips(n in any::<u64>()) {
            prop_assert_eq!(parse_whole(&bytes(n)), Some(n));
            prop_assert_eq!(parse_whole(&decimal(n)), Some(n));
            prop_assert_eq!(parse_millis(&millis(n)), Some(u128::from(n)));
        }

        #[test]
        fn parsing_never_panics(text in ".*") {
            let _ = parse_millis(&Quantity(text));
        }
    }
}
