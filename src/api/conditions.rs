//! Status conditions in the standard `meta/v1 Condition` shape, merged the way Kubernetes
//! controllers do (`meta.SetStatusCondition`): one entry per type, and `lastTransitionTime`
//! moves only when the status flips, so re-asserting a condition writes nothing new.
//!
//! The clock is a parameter, so callers decide what "now" is and tests need no sleeping.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The inventory reflects a completed detection of this node.
pub const READY: &str = "Ready";
/// Something is wrong but the inventory is still published: a detector failed, a device is
/// unhealthy, or the last good devices are being kept while a detector misbehaves.
pub const DEGRADED: &str = "Degraded";
/// The node has fewer accelerators than it should (`status.expectedDevices`): detection no
/// longer sees some of them, even while their last good copy is still published.
pub const DEVICES_MISSING: &str = "DevicesMissing";

/// `True`, `False` or `Unknown`, as the API spells them.
pub fn status_text(status: Option<bool>) -> &'static str {
    match status {
        Some(true) => "True",
        Some(false) => "False",
        None => "Unknown",
    }
}

/// Longest condition message kept, in characters: enough for a list of devices or reasons,
/// short enough for `kubectl describe` (the API allows 32 KiB).
pub const MAX_MESSAGE_CHARS: usize = 1024;

/// A condition of `type_` with the given status, reason (CamelCase) and message (cut to
/// [`MAX_MESSAGE_CHARS`]).
pub fn condition(
    type_: &str,
    status: Option<bool>,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
    now: &Time,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: status_text(status).to_string(),
        reason: reason.to_string(),
        message: message.chars().take(MAX_MESSAGE_CHARS).collect(),
        observed_generation,
        last_transition_time: now.clone(),
    }
}

/// The condition of `type_`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// True when the condition of `type_` is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Sets `new` in `conditions`, keeping the existing `lastTransitionTime` when the status did
/// not change, and keeps the list sorted by type. Returns whether anything changed, so the
/// caller can skip a write when nothing did.
pub fn set(conditions: &mut Vec<Condition>, new: Condition) -> bool {
    let Some(existing) = conditions.iter_mut().find(|c| c.type_ == new.type_) else {
        conditions.push(new);
        conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
        return true;
    };
    let transition_time = if existing.status == new.status {
        existing.last_transition_time.clone()
    } else {
        new.last_transition_time.clone()
    };
    let merged = Condition {
        last_transition_time: transition_time,
        ..new
    };
    if *existing == merged {
        return false;
    }
    *existing = merged;
    true
}

/// Removes the condition of `type_`; returns whether there was one.
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    fn ready(status: bool, generation: i64, now: i64) -> Condition {
        condition(
            READY,
            Some(status),
            "Detected",
            "8 devices",
            Some(generation),
            &at(now),
        )
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_MESSAGE_CHARS + 10);
        let cut = condition(READY, Some(false), "Why", &long, None, &at(1));
        assert_eq!(cut.message.chars().count(), MAX_MESSAGE_CHARS);
        assert!(long.starts_with(&cut.message));
    }

    #[test]
    fn same_status_keeps_the_transition_time() {
        let mut conditions = Vec::new();
        assert!(set(&mut conditions, ready(true, 1, 100)));
        assert!(
            !set(&mut conditions, ready(true, 1, 200)),
            "nothing new to write"
        );
        assert_eq!(conditions[0].last_transition_time, at(100));
        // A newer generation is a change, but not a transition.
        assert!(set(&mut conditions, ready(true, 2, 300)));
        assert_eq!(conditions[0].last_transition_time, at(100));
        assert_eq!(conditions[0].observed_generation, Some(2));
    }

    #[test]
    fn status_flip_moves_the_transition_time() {
        let mut conditions = vec![ready(true, 1, 100)];
        assert!(set(&mut conditions, ready(false, 1, 500)));
        assert_eq!(conditions[0].status, "False");
        assert_eq!(conditions[0].last_transition_time, at(500));
    }

    #[test]
    fn message_change_is_a_change_without_transition() {
        let mut conditions = vec![ready(true, 1, 100)];
        let mut update = ready(true, 1, 900);
        update.message = "7 devices".into();
        assert!(set(&mut conditions, update));
        assert_eq!(conditions[0].message, "7 devices");
        assert_eq!(conditions[0].last_transition_time, at(100));
    }

    #[test]
    fn one_entry_per_type_sorted() {
        let mut conditions = Vec::new();
        set(&mut conditions, ready(true, 1, 1));
        let degraded = condition(DEGRADED, Some(false), "AllDetectorsOk", "", Some(1), &at(1));
        set(&mut conditions, degraded.clone());
        set(&mut conditions, degraded);
        let types: Vec<&str> = conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, [DEGRADED, READY]);
        assert!(is_true(&conditions, READY));
        assert!(!is_true(&conditions, DEGRADED));
        assert!(remove(&mut conditions, DEGRADED));
        assert!(!remove(&mut conditions, DEGRADED));
        assert_eq!(status_text(None), "Unknown");
    }
}
