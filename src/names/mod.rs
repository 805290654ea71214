//! Kubernetes naming rules, for every module that makes a name or a label: validity checks,
//! value sanitising, deterministic shortening with a hash suffix, and the readable slugs that
//! product names become. Pure: labels, the API's DRA names, placement labels, claim and
//! template names and metric values all come through here, so they follow one set of rules.
//!
//! The rules follow the apiserver's own (`IsQualifiedName`, `IsValidLabelValue`): a key is an
//! optional DNS-subdomain prefix (≤253) and `/` and a name (≤63); a name or a non-empty value
//! is `[A-Za-z0-9]` at both ends and `[-_.A-Za-z0-9]` inside, at most 63 characters.

pub mod keys;

use sha2::{Digest, Sha256};

/// The longest label name (the part after the prefix) or value.
pub const MAX_LABEL_LENGTH: usize = 63;
/// The longest label key prefix (a DNS subdomain).
pub const MAX_PREFIX_LENGTH: usize = 253;
/// Hex digits of the SHA-256 suffix appended to a shortened value: 40 bits, so two distinct
/// long values sharing their first characters collide with odds of about one in a trillion.
pub const HASH_SUFFIX_LENGTH: usize = 10;

/// True when `key` is a valid label key: `[prefix/]name`.
pub fn is_valid_label_key(key: &str) -> bool {
    match key.split_once('/') {
        Some((prefix, name)) => is_valid_dns_subdomain(prefix) && is_valid_label_name(name),
        None => is_valid_label_name(key),
    }
}

/// True when `value` is a valid label value. The empty string is valid to Kubernetes, though
/// this crate never produces one.
pub fn is_valid_label_value(value: &str) -> bool {
    value.is_empty() || is_valid_label_name(value)
}

/// True for a label name: 1–63 characters, alphanumeric at both ends, `-_.` allowed inside.
fn is_valid_label_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    bytes.len() <= MAX_LABEL_LENGTH
        && first.is_ascii_alphanumeric()
        && last.is_ascii_alphanumeric()
        && bytes.iter().all(|&b| is_name_byte(b))
}

/// True for a DNS label (RFC 1123): 1–63 lowercase letters, digits and `-`, alphanumeric at
/// both ends (the apiserver's rule for device names).
pub fn is_valid_dns_label(name: &str) -> bool {
    name.len() <= MAX_LABEL_LENGTH && !name.contains('.') && is_valid_dns_subdomain(name)
}

/// True for a DNS subdomain (RFC 1123): dot-separated lowercase labels, ≤253 in all.
pub fn is_valid_dns_subdomain(prefix: &str) -> bool {
    prefix.len() <= MAX_PREFIX_LENGTH
        && prefix.split('.').all(|part| {
            let bytes = part.as_bytes();
            matches!((bytes.first(), bytes.last()), (Some(f), Some(l))
                if is_lower_alnum(*f) && is_lower_alnum(*l))
                && bytes.iter().all(|&b| is_lower_alnum(b) || b == b'-')
        })
}

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')
}

/// Turns any string into a valid, non-empty label value, or `None` when nothing usable is
/// left (the caller drops the label and says why).
///
/// Characters outside `[-_.A-Za-z0-9]` become `-` (runs collapse to one), the ends are trimmed
/// to alphanumerics, and a result over 63 characters is shortened with
/// [`shorten_with_hash`] over the *original* text, so two long values that differ only past
/// the cut still get different labels.
pub fn sanitize_value(raw: &str) -> Option<String> {
    sanitize_value_noting_shortening(raw).map(|(value, _)| value)
}

/// [`sanitize_value`], also saying whether the value had to be shortened.
pub fn sanitize_value_noting_shortening(raw: &str) -> Option<(String, bool)> {
    let cleaned = replace_invalid(raw.trim(), '-');
    let trimmed = cleaned.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if trimmed.is_empty() {
        return None;
    }
    if trimmed.len() <= MAX_LABEL_LENGTH {
        return Some((trimmed.to_string(), false));
    }
    Some((shorten_with_hash(trimmed, raw, MAX_LABEL_LENGTH), true))
}

/// Replaces every character outside `[-_.A-Za-z0-9]` by `filler`, collapsing runs of
/// replaced characters into one so `A  /  B` reads `A-B`.
fn replace_invalid(raw: &str, filler: char) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut last_was_filler = false;
    for c in raw.chars() {
        if c.is_ascii() && is_name_byte(c as u8) {
            out.push(c);
            last_was_filler = false;
        } else if !last_was_filler {
            out.push(filler);
            last_was_filler = true;
        }
    }
    out
}

/// Shortens `text` (already made of label characters and starting alphanumeric) to at most
/// `max` bytes: its head, `-`, and the first [`HASH_SUFFIX_LENGTH`] hex digits of the SHA-256
/// of `identity`. The head loses trailing non-alphanumerics so the result stays valid.
///
/// For a 63-character limit that is 52 characters of head, which keeps a product name
/// recognisable. `identity` is what must stay distinguishable, usually the unsanitised input.
pub fn shorten_with_hash(text: &str, identity: &str, max: usize) -> String {
    let suffix = hash_hex(identity);
    let room = max.saturating_sub(HASH_SUFFIX_LENGTH + 1);
    let head = truncate_at_char_boundary(text, room)
        .trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    if head.is_empty() {
        return suffix;
    }
    format!("{head}-{suffix}")
}

/// The first [`HASH_SUFFIX_LENGTH`] lowercase hex digits of the SHA-256 of `text`.
pub fn hash_hex(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    let mut hex = String::with_capacity(HASH_SUFFIX_LENGTH);
    for byte in digest.iter() {
        if hex.len() >= HASH_SUFFIX_LENGTH {
            break;
        }
        hex.push_str(&format!("{byte:02x}"));
    }
    hex.truncate(HASH_SUFFIX_LENGTH);
    hex
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
pub fn truncate_at_char_boundary(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A lowercase slug: ASCII letters and digits, every other run of characters one `-`, no
/// `-` at either end (`NVIDIA H100 80GB HBM3` → `nvidia-h100-80gb-hbm3`). May be empty.
///
/// Dots become dashes too, so the slug is safe both as a label value and inside a key name
/// after a `.` separator, and reads the same in either place.
pub fn slugify(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keys_follow_the_apiserver_rules() {
        for good in [
            "hwaccel.io/present",
            "hwaccel.io/count.nvidia-h100-80gb-hbm3",
            "kubernetes.io/arch",
            "plain",
            "a/b",
            "hwaccel.io/precision.fp8",
            "x.y.z/A_b-c.D",
        ] {
            assert!(is_valid_label_key(good), "{good}");
        }
        let long_name = format!("hwaccel.io/{}", "a".repeat(64));
        let long_prefix = format!("{}.io/a", "a".repeat(251));
        for bad in [
            "",
            "hwaccel.io/",
            "/name",
            "Hwaccel.io/x",
            "hwaccel.io/-x",
            "hwaccel.io/x-",
            "hwaccel..io/x",
            "hwaccel.io/a/b",
            "hwaccel.io/a b",
            "hwaccel.io/ü",
            long_name.as_str(),
            long_prefix.as_str(),
        ] {
            assert!(!is_valid_label_key(bad), "{bad:?}");
        }
        assert!(is_valid_label_key(&format!(
            "hwaccel.io/{}",
            "a".repeat(63)
        )));
    }

    #[test]
    fn values_follow_the_apiserver_rules() {
        for good in ["", "true", "550.54.15", "NVIDIA-H100", "a", "a_b.c-d"] {
            assert!(is_valid_label_value(good), "{good:?}");
        }
        for bad in ["-a", "a.", "a b", "a/b", "a+b", "é", &"x".repeat(64)] {
            assert!(!is_valid_label_value(bad), "{bad:?}");
        }
    }

    #[test]
    fn sanitising_replaces_and_trims() {
        assert_eq!(
            sanitize_value("NVIDIA H100 80GB HBM3").as_deref(),
            Some("NVIDIA-H100-80GB-HBM3")
        );
        assert_eq!(sanitize_value("  (v5e)  ").as_deref(), Some("v5e"));
        assert_eq!(sanitize_value("a  //  b").as_deref(), Some("a-b"));
        assert_eq!(sanitize_value("550.54.15").as_deref(), Some("550.54.15"));
        assert_eq!(sanitize_value("---"), None);
        assert_eq!(sanitize_value(""), None);
        assert_eq!(sanitize_value("日本"), None);
    }

    #[test]
    fn long_values_keep_a_readable_head_and_a_hash() {
        let long = "Some Vendor Accelerator With An Extremely Long Marketing Name 128GB HBM3e PCIe";
        let value = sanitize_value(long).unwrap();
        assert_eq!(value.len(), MAX_LABEL_LENGTH);
        assert!(value.starts_with("Some-Vendor-Accelerator-With-An-Extremely-Long-Marke-"));
        assert!(value.ends_with(&hash_hex(long)));
        assert!(is_valid_label_value(&value));
        // Differing only past the cut still gives different values.
        let other = sanitize_value(&format!("{long} rev2")).unwrap();
        assert_ne!(value, other);
    }

    #[test]
    fn shortening_never_leaves_a_dash_before_the_hash() {
        // Position 52 falls on a run of dashes: the head must shed them.
        let text = format!("{}----{}", "a".repeat(50), "b".repeat(30));
        let short = shorten_with_hash(&text, &text, MAX_LABEL_LENGTH);
        assert!(short.starts_with(&format!("{}-", "a".repeat(50))));
        assert!(!short.contains("--"));
        assert!(is_valid_label_value(&short));
    }

    #[test]
    fn hash_is_sha256_prefix() {
        // SHA-256("abc") = ba7816bf8f01cfea...
        assert_eq!(hash_hex("abc"), "ba7816bf8f");
    }

    #[test]
    fn slugs_are_lowercase_dashes() {
        assert_eq!(slugify("NVIDIA H100 80GB HBM3"), "nvidia-h100-80gb-hbm3");
        assert_eq!(slugify("AMD Instinct MI300X"), "amd-instinct-mi300x");
        assert_eq!(slugify("  Tesla V100-SXM2-32GB  "), "tesla-v100-sxm2-32gb");
        assert_eq!(
            slugify("Intel(R) Data Center GPU Max 1550"),
            "intel-r-data-center-gpu-max-1550"
        );
        assert_eq!(slugify("v5.litepod"), "v5-litepod");
        assert_eq!(slugify("***"), "");
    }

    #[test]
    fn truncation_respects_utf8() {
        assert_eq!(truncate_at_char_boundary("aé", 2), "a");
        assert_eq!(truncate_at_char_boundary("abc", 5), "abc");
    }

    proptest! {
        #[test]
        fn sanitized_values_are_valid_and_non_empty(raw in ".*") {
            if let Some(value) = sanitize_value(&raw) {
                prop_assert!(!value.is_empty());
                prop_assert!(is_valid_label_value(&value), "{value:?}");
            }
        }

        #[test]
        fn sanitizing_is_deterministic_and_idempotent(raw in ".*") {
            let once = sanitize_value(&raw);
            prop_assert_eq!(&once, &sanitize_value(&raw));
            if let Some(value) = once {
                prop_assert_eq!(sanitize_value(&value), Some(value));
            }
        }

        #[test]
        fn shortened_text_fits(text in "[a-z0-9][-a-z0-9._]{0,200}", max in 11usize..100) {
            let short = shorten_with_hash(&text, &text, max);
            prop_assert!(short.len() <= max);
            prop_assert!(short.ends_with(&hash_hex(&text)));
        }

        #[test]
        fn slugs_are_valid_names_when_short(text in ".*") {
            let slug = slugify(&text);
            prop_assert!(slug.is_empty() || slug.len() > MAX_LABEL_LENGTH
                || is_valid_label_value(&slug));
            prop_assert!(slug.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
        }
    }
}
