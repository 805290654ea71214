//! Kubernetes quantities for the inventory: integers written in the apiserver's own canonical
//! form, and read back.
//!
//! Canonical form matters for server-side apply: the apiserver re-serialises every quantity
//! canonically (`1024Mi` is stored as `1Gi`, `1000` as `1k`), so an agent that sent a
//! non-canonical spelling would see a difference on every read and write again forever.
//! These functions emit exactly what the apiserver would store.
//!
//! Reading is wider than writing: other parties (DRA drivers, users) write quantities in any
//! form the apiserver accepts, and it keeps some as written (`1e3` stays `1e3`), so every
//! form of the grammar reads (issue 35: a counter written `1e3` blocked its devices).

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

/// A quantity's exact value: `digits × 10^exp10 × 1024^exp1024`, never negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Exact {
    digits: u128,
    exp10: i64,
    exp1024: u32,
}

/// Longest exponent read after `e`/`E`; larger ones are refused rather than scaled (no
/// quantity of bytes or counts needs more, and the apiserver's own range ends far below).
const MAX_EXPONENT_DIGITS: usize = 6;

/// Reads a Kubernetes quantity in any form the apiserver accepts (and keeps as written):
/// `<sign><number><suffix>`, the number `123`, `1.5`, `1.` or `.5`, the suffix binary SI
/// (`Ki`..`Ei`), decimal SI (`m`, none, `k`, `M`, `G`, `T`, `P`, `E`) or a decimal exponent
/// (`e3`, `E-2`, `e+6`). The grammar is `resource.Quantity`'s (k8s.io/apimachinery
/// `pkg/api/resource/quantity.go`). Negative values are refused: nothing read here (bytes,
/// counts, counters) can be below zero.
fn parse_exact(text: &str) -> Option<Exact> {
    let text = text.trim();
    let (negative, text) = match text.as_bytes().first()? {
        b'+' => (false, &text[1..]),
        b'-' => (true, &text[1..]),
        _ => (false, text),
    };
    let number_end = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return None;
    }
    let (exp10, exp1024) = suffix_scale(suffix)?;
    // Trailing zeros of the fraction and leading zeros of the whole carry no value; what is
    // left must fit in u128 (38 significant digits, far more than any quantity needs).
    let fraction = fraction.trim_end_matches('0');
    let significant = format!("{whole}{fraction}");
    let significant = significant.trim_start_matches('0');
    let digits: u128 = if significant.is_empty() {
        0
    } else if significant.len() > 38 {
        return None;
    } else {
        significant.parse().ok()?
    };
    if negative && digits != 0 {
        return None;
    }
    let fraction_digits = i64::try_from(fraction.len()).ok()?;
    Some(Exact {
        digits,
        exp10: exp10.checked_sub(fraction_digits)?,
        exp1024,
    })
}

/// The scale a suffix stands for: (power of ten, power of 1024); `None` when it is none.
fn suffix_scale(suffix: &str) -> Option<(i64, u32)> {
    if let Some(exp) = BINARY_SUFFIXES.iter().skip(1).position(|s| *s == suffix) {
        return Some((0, u32::try_from(exp + 1).ok()?));
    }
    let decimal = match suffix {
        "m" => Some(-3),
        "" => Some(0),
        "k" => Some(3),
        "M" => Some(6),
        "G" => Some(9),
        "T" => Some(12),
        "P" => Some(15),
        "E" => Some(18),
        _ => None,
    };
    if let Some(exp10) = decimal {
        return Some((exp10, 0));
    }
    // A decimal exponent: `e` or `E`, then a signed integer (`1E` alone is exa, above).
    let exponent = suffix.strip_prefix(['e', 'E'])?;
    let (negative, digits) = match exponent.as_bytes().first()? {
        b'+' => (false, &exponent[1..]),
        b'-' => (true, &exponent[1..]),
        _ => (false, exponent),
    };
    if digits.is_empty()
        || digits.len() > MAX_EXPONENT_DIGITS
        || !digits.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let value: i64 = digits.parse().ok()?;
    Some((if negative { -value } else { value }, 0))
}

impl Exact {
    /// The value times `10^scale10` as a whole number, rounded down, and whether that is
    /// exact; `None` when it does not fit in u128.
    fn scaled(self, scale10: i64) -> Option<(u128, bool)> {
        if self.digits == 0 {
            return Some((0, true));
        }
        let mut value = self
            .digits
            .checked_mul(1024u128.checked_pow(self.exp1024)?)?;
        let exp10 = self.exp10.checked_add(scale10)?;
        if exp10 >= 0 {
            let factor = 10u128.checked_pow(u32::try_from(exp10).ok()?)?;
            value = value.checked_mul(factor)?;
            return Some((value, true));
        }
        // Dividing by more than u128 holds leaves nothing but a remainder.
        let Some(divisor) = u32::try_from(-exp10)
            .ok()
            .and_then(|e| 10u128.checked_pow(e))
        else {
            return Some((0, false));
        };
        Some((value / divisor, value % divisor == 0))
    }
}

/// The value of a quantity in thousandths, in any form Kubernetes accepts (see
/// `parse_exact`): `80Gi`, `1.5Gi`, `500m`, `1e3`, `2.5E-1`. A value finer than a
/// thousandth rounds up, as `Quantity.MilliValue` does. `None` for what is not a quantity,
/// a negative one, or one too large for u128.
pub fn parse_millis(quantity: &Quantity) -> Option<u128> {
    let (millis, exact) = parse_exact(&quantity.0)?.scaled(3)?;
    if exact {
        Some(millis)
    } else {
        millis.checked_add(1)
    }
}

/// The whole-unit value of a quantity (bytes, counts) in any form Kubernetes accepts; `None`
/// when it is not a quantity, not a whole number, or does not fit in `u64`.
pub fn parse_whole(quantity: &Quantity) -> Option<u64> {
    match parse_exact(&quantity.0)?.scaled(0)? {
        (value, true) => u64::try_from(value).ok(),
        (_, false) => None,
    }
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
        for bad in [
            "",
            "Gi",
            "-1",
            "1.2.3",
            "12Qi",
            ".",
            "1e",
            "1e+",
            "1e1.5",
            "1Ki3",
            "e3",
            "+",
            "1 k",
            "1E1234567",
            "--1",
        ] {
            assert_eq!(parse_millis(&q(bad)), None, "{bad}");
        }
        assert_eq!(parse_whole(&q("99999999999999999999999Ei")), None);
    }

    /// Issue 35: a counter the apiserver kept as `1e3` was "not a quantity". Every form of
    /// `resource.Quantity`'s grammar reads, with the value Kubernetes gives it.
    #[test]
    fn parses_every_form_kubernetes_accepts() {
        for (text, whole) in [
            ("1e3", 1000),
            ("1E3", 1000),
            ("1e+3", 1000),
            ("1.5e3", 1500),
            ("+80Gi", 80 << 30),
            ("-0", 0),
            ("0e-99", 0),
            (".5Ki", 512),
            ("1.Mi", 1 << 20),
            ("1.50000k", 1500),
            ("1E", 1_000_000_000_000_000_000),
            ("2Ei", 2 << 60),
            ("0.000001M", 1),
            ("85899345920", 85_899_345_920),
            ("80000000000e-3", 80_000_000),
        ] {
            assert_eq!(parse_whole(&q(text)), Some(whole), "{text}");
            assert_eq!(
                parse_millis(&q(text)),
                Some(u128::from(whole) * 1000),
                "{text}"
            );
        }
        assert_eq!(parse_whole(&q("15e-1")), None, "1.5 is not whole");
        assert_eq!(parse_millis(&q("15e-1")), Some(1500));
        // Finer than a thousandth: rounded up, as `MilliValue` does; never whole.
        assert_eq!(parse_millis(&q("1e-4")), Some(1));
        assert_eq!(parse_millis(&q("1.0001")), Some(1001));
        assert_eq!(parse_whole(&q("1.0001")), None);
        assert_eq!(parse_millis(&q("1e-99")), Some(1));
        assert_eq!(parse_millis(&q("250m")), Some(250));
        assert_eq!(parse_millis(&q("2.5e-1")), Some(250));
        assert_eq!(parse_whole(&q("1e30")), None, "over u64");
        assert_eq!(parse_millis(&q("1e30")), Some(10u128.pow(33)));
        assert_eq!(parse_millis(&q("1e40")), None, "over u128");
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
            let _ = parse_millis(&Quantity(text.clone()));
            let _ = parse_whole(&Quantity(text));
        }

        /// The exponent form and the plain form of one value read the same.
        #[test]
        fn exponents_read_as_the_plain_number(n in 0u64..1_000_000_000, e in 0u32..9) {
            let plain = u128::from(n) * 10u128.pow(e);
            prop_assert_eq!(parse_millis(&q(&format!("{n}e{e}"))), Some(plain * 1000));
            prop_assert_eq!(parse_millis(&q(&format!("{n}E+{e}"))), Some(plain * 1000));
            prop_assert_eq!(parse_millis(&q(&format!("{plain}e-{e}"))), Some(u128::from(n) * 1000));
        }
    }
}
