//! Duration flags (`--interval`, `--hotplug-poll`, `--max-backoff`, `--api-timeout`,
//! `--shutdown-timeout`, `--inventory-grace`): one small grammar with explicit bounds.
//!
//! The grammar is a whole number without leading zeros followed by one unit, `s`, `m` or `h`
//! (`90s`, `5m`, `1h`). Compound forms (`1m30s`), fractions (`1.5m`), sub-second units
//! (`500ms`) and bare numbers are refused with a message that says what to write instead.
//! The chart's `values.schema.json` accepts exactly the same strings (`tests/chart.rs`
//! checks a table of values against both), so a value the schema lets through never makes
//! the agent crash-loop. Parsing is total: every input gives a value or an error, never a
//! panic (no float conversion, checked arithmetic).

use std::time::Duration;

/// The agent's `--interval`: at least 1 s (a detection costs CPU on the node, and every
/// vendor tool has a 5 s deadline), at most 24 h (labels must not lag behind for days).
pub const INTERVAL_BOUNDS: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(24 * 3600));

/// The agent's `--hotplug-poll`: at least 1 s, at most 1 h.
pub const HOTPLUG_POLL_BOUNDS: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(3600));

/// The agent's `--max-backoff`: at least 1 s, at most 1 h.
pub const MAX_BACKOFF_BOUNDS: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(3600));

/// `--api-timeout`: at least 1 s (a busy apiserver answers within that), at most 1 h.
pub const API_TIMEOUT_BOUNDS: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(3600));

/// `--shutdown-timeout`: at least 2 s (the graceful part takes 1.5 s less), at most 1 h.
pub const SHUTDOWN_TIMEOUT_BOUNDS: (Duration, Duration) =
    (Duration::from_secs(2), Duration::from_secs(3600));

/// The controller's `--inventory-grace`: at least 1 s, at most 24 h.
pub const INVENTORY_GRACE_BOUNDS: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(24 * 3600));

/// The controller's `--device-health-interval`: at least 1 s (each check is a reconcile and
/// a pod read per placement with pods), at most 10 minutes (the periodic resync a plan gets
/// anyway).
pub const DEVICE_HEALTH_INTERVAL_BOUNDS: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(600));

/// Why a duration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not `<number><unit>`.
    #[error(
        "invalid duration {text:?}: {why} (write a whole number and one unit: s, m or h, e.g. 90s, 5m, 1h)"
    )]
    Syntax {
        /// The input, cut to 40 characters.
        text: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Well formed, but outside the bounds.
    #[error("duration {text:?} is out of range: it must be between {min} and {max}")]
    OutOfRange {
        /// The input.
        text: String,
        /// Lower bound, as written in the docs.
        min: String,
        /// Upper bound, as written in the docs.
        max: String,
    },
}

/// Parses `--interval` (bounds: [`INTERVAL_BOUNDS`]).
pub fn parse_interval(text: &str) -> Result<Duration, DurationError> {
    parse_bounded(text, INTERVAL_BOUNDS)
}

/// Parses `--hotplug-poll` (bounds: [`HOTPLUG_POLL_BOUNDS`]).
pub fn parse_hotplug_poll(text: &str) -> Result<Duration, DurationError> {
    parse_bounded(text, HOTPLUG_POLL_BOUNDS)
}

/// Parses `--max-backoff` (bounds: [`MAX_BACKOFF_BOUNDS`]).
pub fn parse_max_backoff(text: &str) -> Result<Duration, DurationError> {
    parse_bounded(text, MAX_BACKOFF_BOUNDS)
}

/// Parses `--api-timeout` (bounds: [`API_TIMEOUT_BOUNDS`]).
pub fn parse_api_timeout(text: &str) -> Result<Duration, DurationError> {
    parse_bounded(text, API_TIMEOUT_BOUNDS)
}

/// Parses `--shutdown-timeout` (bounds: [`SHUTDOWN_TIMEOUT_BOUNDS`]).
pub fn parse_shutdown_timeout(text: &str) -> Result<Duration, DurationError> {
    parse_bounded(text, SHUTDOWN_TIMEOUT_BOUNDS)
}

/// Bounds of `--capacity-interval`: counting costs dozens of plans per model, so not more
/// often than every 10 seconds; and at least once a day.
pub const CAPACITY_INTERVAL_BOUNDS: (Duration, Duration) =
    (Duration::from_secs(10), Duration::from_secs(86_400));

/// Parses `--capacity-interval` (bounds: [`CAPACITY_INTERVAL_BOUNDS`]).
pub fn parse_capacity_interval(text: &str) -> Result<Duration, DurationError> {
    parse_bounded(text, CAPACITY_INTERVAL_BOUNDS)
}

/// Parses `--inventory-grace` (bounds: [`INVENTORY_GRACE_BOUNDS`]).
pub fn parse_inventory_grace(text: &str) -> Result<Duration, DurationError> {
    parse_bounded(text, INVENTORY_GRACE_BOUNDS)
}

/// Parses `--device-health-interval` (bounds: [`DEVICE_HEALTH_INTERVAL_BOUNDS`]).
pub fn parse_device_health_interval(text: &str) -> Result<Duration, DurationError> {
    parse_bounded(text, DEVICE_HEALTH_INTERVAL_BOUNDS)
}

/// Parses a duration and checks it lies within `(min, max)`, both inclusive.
pub fn parse_bounded(
    text: &str,
    (min, max): (Duration, Duration),
) -> Result<Duration, DurationError> {
    let value = parse(text)?;
    if value < min || value > max {
        return Err(DurationError::OutOfRange {
            text: shorten(text),
            min: format_secs(min.as_secs()),
            max: format_secs(max.as_secs()),
        });
    }
    Ok(value)
}

/// Parses `<number><unit>` without bounds. Numbers too large for a `Duration` are refused.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let syntax = |why| DurationError::Syntax {
        text: shorten(text),
        why,
    };
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(syntax("it does not start with a number"));
    }
    if digits.len() > 1 && digits.starts_with('0') {
        return Err(syntax("leading zeros are not allowed"));
    }
    let seconds_per_unit: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "" => return Err(syntax("the unit is missing")),
        "ms" | "us" | "µs" | "ns" => return Err(syntax("sub-second units are not accepted")),
        _ if unit.starts_with('.') => return Err(syntax("fractions are not accepted")),
        _ if unit.chars().skip(1).any(|c| c.is_ascii_digit()) => {
            return Err(syntax("compound durations are not accepted"));
        }
        _ => return Err(syntax("unknown unit")),
    };
    // More digits than any u64 has: refused before parsing (parse would fail anyway).
    let number: u64 = digits
        .parse()
        .map_err(|_| syntax("the number is too large"))?;
    let seconds = number
        .checked_mul(seconds_per_unit)
        .ok_or_else(|| syntax("the number is too large"))?;
    Ok(Duration::from_secs(seconds))
}

/// `86400` -> `24h`, `3600` -> `1h`, `90` -> `90s`: the bounds as a user would write them.
fn format_secs(secs: u64) -> String {
    if secs >= 3600 && secs.is_multiple_of(3600) {
        format!("{}h", secs / 3600)
    } else if secs >= 60 && secs.is_multiple_of(60) {
        format!("{}m", secs / 60)
    } else {
        format!("{secs}s")
    }
}

/// The input for an error message, cut so a huge flag value does not flood the log.
fn shorten(text: &str) -> String {
    const MAX: usize = 40;
    if text.chars().count() <= MAX {
        text.to_string()
    } else {
        let mut cut: String = text.chars().take(MAX).collect();
        cut.push('…');
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_one_number_and_one_unit() {
        assert_eq!(parse_interval("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_interval("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_interval("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_interval("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_interval("86400s"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_interval("1440m"), Ok(Duration::from_secs(86_400)));
    }

    #[test]
    fn refuses_everything_else_with_a_reason() {
        for (text, why) in [
            ("", "does not start with a number"),
            ("s", "does not start with a number"),
            ("-5s", "does not start with a number"),
            (" 60s", "does not start with a number"),
            ("60", "unit is missing"),
            ("060s", "leading zeros"),
            ("500ms", "sub-second"),
            ("500us", "sub-second"),
            ("1.5m", "fractions"),
            ("1m30s", "compound"),
            ("60s ", "unknown unit"),
            ("5d", "unknown unit"),
            ("99999999999999999999h", "too large"),
            ("18446744073709551615h", "too large"),
        ] {
            let err = parse_interval(text).expect_err(text).to_string();
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }

    #[test]
    fn bounds_are_inclusive_and_named_in_the_error() {
        for text in ["0s", "0m", "86401s", "1441m", "25h"] {
            let err = parse_interval(text).expect_err(text).to_string();
            assert!(err.contains("between 1s and 24h"), "{text:?}: {err}");
        }
        assert!(parse_hotplug_poll("2h").is_err());
        assert_eq!(parse_hotplug_poll("1h"), Ok(Duration::from_secs(3600)));
    }

    #[test]
    fn every_flag_has_its_own_bounds() {
        assert_eq!(parse_inventory_grace("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_inventory_grace("0s").is_err());
        assert!(parse_inventory_grace("25h").is_err());
        assert_eq!(
            parse_device_health_interval("1m"),
            Ok(Duration::from_secs(60))
        );
        assert!(parse_device_health_interval("0s").is_err());
        assert!(parse_device_health_interval("11m").is_err());
        assert!(
            parse_shutdown_timeout("1s").is_err(),
            "the graceful part needs 1.5 s"
        );
        assert_eq!(parse_api_timeout("10m"), Ok(Duration::from_secs(600)));
        assert!(parse_api_timeout("2h").is_err());
        assert!(parse_max_backoff("0s").is_err());
    }

    #[test]
    fn a_huge_input_is_cut_in_the_message() {
        let text = "9".repeat(10_000) + "h";
        let err = parse_interval(&text).expect_err("huge").to_string();
        assert!(err.len() < 300, "{err}");
    }
}
