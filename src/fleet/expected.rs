//! How many accelerators a node should have: an explicit count, its cloud instance type's
//! count, or the most it has been seen with, and how many of them are missing now.
//!
//! Three sources, strongest first:
//! 1. the Node annotation `hwaccel.io/expected-devices` (an operator's word, also how a
//!    permanent removal is acknowledged);
//! 2. the Node label `node.kubernetes.io/instance-type`, looked up in [`instance_type_count`]
//!    (a cloud node cannot have more accelerators than its type, and should not have fewer);
//! 3. the most accelerators this node has been seen with, so a device that falls off the bus
//!    on a bare-metal node is still noticed after the agent stops publishing it.
//!
//! Pure: the agent reads the Node and its last status and hands the strings in here.

use std::fmt;

/// The Node annotation that states the expected accelerator count outright.
pub use crate::names::keys::EXPECTED_DEVICES_ANNOTATION;
/// The well-known Node label naming the cloud instance type.
pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";
/// The largest count the annotation may state; no node has more accelerators than this, so a
/// larger value is a typo and trusting it would report a thousand phantom missing devices.
pub const MAX_EXPECTED_DEVICES: u32 = 1024;

/// Where an expected count comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExpectedSource {
    /// The `hwaccel.io/expected-devices` annotation.
    Annotation,
    /// The instance type table.
    InstanceType,
    /// The most devices the agent has seen on the node.
    Seen,
}

impl ExpectedSource {
    /// The name in `status.expectedSource` and the metric's `source` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Annotation => "annotation",
            Self::InstanceType => "instanceType",
            Self::Seen => "seen",
        }
    }

    /// The source named `name` (as [`Self::as_str`] spells it), if any.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Annotation, Self::InstanceType, Self::Seen]
            .into_iter()
            .find(|s| s.as_str() == name)
    }
}

impl fmt::Display for ExpectedSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The count a node should have, and where it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    /// Accelerators the node should have.
    pub count: u32,
    /// Where `count` comes from.
    pub source: ExpectedSource,
}

impl Expected {
    /// Accelerators missing when `present` are seen: never below zero (a node with more than
    /// expected is not missing anything).
    pub fn missing(&self, present: u32) -> u32 {
        self.count.saturating_sub(present)
    }
}

/// Why an `hwaccel.io/expected-devices` value was ignored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    /// Not a plain non-negative integer.
    #[error("{EXPECTED_DEVICES_ANNOTATION}={0:?} is not a whole number of devices; ignored")]
    NotANumber(String),
    /// Over [`MAX_EXPECTED_DEVICES`].
    #[error(
        "{EXPECTED_DEVICES_ANNOTATION}={0} is over the limit of {MAX_EXPECTED_DEVICES}; ignored"
    )]
    TooLarge(String),
}

/// Longest annotation text quoted back in an error, so a huge value does not flood logs.
const QUOTED_VALUE_LENGTH: usize = 32;

fn quoted(value: &str) -> String {
    crate::names::truncate_at_char_boundary(value, QUOTED_VALUE_LENGTH).to_string()
}

/// Reads the annotation: ASCII digits only (surrounding blanks allowed), at most
/// [`MAX_EXPECTED_DEVICES`]. Signs, decimals and units are refused rather than guessed at.
pub fn parse_annotation(value: &str) -> Result<u32, AnnotationError> {
    let digits = value.trim();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(AnnotationError::NotANumber(quoted(value)));
    }
    // Leading zeros are harmless; a value too long for u64 is certainly too large.
    match digits.parse::<u64>() {
        Ok(n) if n <= u64::from(MAX_EXPECTED_DEVICES) => {
            Ok(u32::try_from(n).unwrap_or(MAX_EXPECTED_DEVICES))
        }
        _ => Err(AnnotationError::TooLarge(quoted(digits))),
    }
}

/// Accelerators per instance type, counted the way this project's detector counts devices:
/// one per GPU, one per Neuron device (an Inferentia2 or Trainium chip, which is what
/// `neuron-ls` lists and the Neuron backend publishes, not per NeuronCore).
///
/// Sources (instance type pages of each cloud):
/// - AWS P4d/P4de/P5/P5e/P5en, G5/G6/G6e: "Accelerated computing instance specifications",
///   <https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html>.
/// - AWS Inf2, Trn1, Trn2: the same page, and the Neuron architecture pages
///   (<https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/inf2-arch.html>,
///   `trn1-arch.html`, `trn2-arch.html`: 12 Inferentia2 / 16 Trainium / 16 Trainium2 devices
///   on the largest sizes).
/// - GCP A2, A3, G2: "GPU machine types",
///   <https://cloud.google.com/compute/docs/gpus> and
///   <https://cloud.google.com/compute/docs/accelerator-optimized-machines>.
/// - Azure ND A100 v4, NDm A100 v4, ND H100 v5, ND H200 v5, ND MI300X v5: the size series
///   pages under <https://learn.microsoft.com/azure/virtual-machines/sizes/gpu-accelerated/>
///   (eight GPUs per VM in each).
const INSTANCE_TYPES: &[(&str, u32)] = &[
    // AWS, NVIDIA.
    ("p4d.24xlarge", 8),
    ("p4de.24xlarge", 8),
    ("p5.4xlarge", 1),
    ("p5.48xlarge", 8),
    ("p5e.48xlarge", 8),
    ("p5en.48xlarge", 8),
    ("g5.xlarge", 1),
    ("g5.2xlarge", 1),
    ("g5.4xlarge", 1),
    ("g5.8xlarge", 1),
    ("g5.16xlarge", 1),
    ("g5.12xlarge", 4),
    ("g5.24xlarge", 4),
    ("g5.48xlarge", 8),
    ("g6.xlarge", 1),
    ("g6.2xlarge", 1),
    ("g6.4xlarge", 1),
    ("g6.8xlarge", 1),
    ("g6.16xlarge", 1),
    ("g6.12xlarge", 4),
    ("g6.24xlarge", 4),
    ("g6.48xlarge", 8),
    ("g6e.xlarge", 1),
    ("g6e.2xlarge", 1),
    ("g6e.4xlarge", 1),
    ("g6e.8xlarge", 1),
    ("g6e.16xlarge", 1),
    ("g6e.12xlarge", 4),
    ("g6e.24xlarge", 4),
    ("g6e.48xlarge", 8),
    // AWS, Neuron devices (chips).
    ("inf2.xlarge", 1),
    ("inf2.8xlarge", 1),
    ("inf2.24xlarge", 6),
    ("inf2.48xlarge", 12),
    ("trn1.2xlarge", 1),
    ("trn1.32xlarge", 16),
    ("trn1n.32xlarge", 16),
    ("trn2.48xlarge", 16),
    ("trn2u.48xlarge", 16),
    // GCP.
    ("a2-highgpu-1g", 1),
    ("a2-highgpu-2g", 2),
    ("a2-highgpu-4g", 4),
    ("a2-highgpu-8g", 8),
    ("a2-megagpu-16g", 16),
    ("a2-ultragpu-1g", 1),
    ("a2-ultragpu-2g", 2),
    ("a2-ultragpu-4g", 4),
    ("a2-ultragpu-8g", 8),
    ("a3-highgpu-1g", 1),
    ("a3-highgpu-2g", 2),
    ("a3-highgpu-4g", 4),
    ("a3-highgpu-8g", 8),
    ("a3-megagpu-8g", 8),
    ("a3-ultragpu-8g", 8),
    ("g2-standard-4", 1),
    ("g2-standard-8", 1),
    ("g2-standard-12", 1),
    ("g2-standard-16", 1),
    ("g2-standard-32", 1),
    ("g2-standard-24", 2),
    ("g2-standard-48", 4),
    ("g2-standard-96", 8),
    // Azure (the label carries the size name; compared without case).
    ("standard_nd96asr_v4", 8),
    ("standard_nd96amsr_a100_v4", 8),
    ("standard_nd96isr_h100_v5", 8),
    ("standard_nd96isr_h200_v5", 8),
    ("standard_nd96isr_mi300x_v5", 8),
];

/// The accelerators an instance type comes with, when it is one of the well-known
/// accelerator types; `None` for anything else (a CPU type, an unknown or new type).
pub fn instance_type_count(instance_type: &str) -> Option<u32> {
    let wanted = instance_type.trim();
    INSTANCE_TYPES
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(wanted))
        .map(|(_, count)| *count)
}

/// What the agent knows when it decides the expected count.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExpectedInputs<'a> {
    /// The Node's `hwaccel.io/expected-devices` annotation, if set.
    pub annotation: Option<&'a str>,
    /// The Node's `node.kubernetes.io/instance-type` label, if set.
    pub instance_type: Option<&'a str>,
    /// The most accelerators detections of this agent have confirmed on the node while the
    /// `seen` source applied ([`next_seen_most`]); 0 at start.
    pub seen_most: u32,
    /// Accelerators published now (seen plus those kept while missing).
    pub published: u32,
}

/// The expected count, and the reason a malformed annotation was ignored (for a warning).
///
/// Precedence: annotation, then instance type, then seen. The seen count is the most
/// accelerators detection has confirmed ([`ExpectedInputs::seen_most`], so it only grows),
/// at least the published count (devices kept while missing count as expected, so their
/// absence shows at once).
///
/// Only this agent's own detections raise the mark (issue 35): the stored inventory and its
/// `status.expectedDevices` are not evidence (anyone who can write them may have forged
/// them), so a restarted agent starts from what it publishes, and a forged device raises
/// the count only while it is kept (the grace for a missing device), never after.
pub fn expected(inputs: &ExpectedInputs<'_>) -> (Expected, Option<AnnotationError>) {
    let mut ignored = None;
    if let Some(value) = inputs.annotation {
        match parse_annotation(value) {
            Ok(count) => {
                let expected = Expected {
                    count,
                    source: ExpectedSource::Annotation,
                };
                return (expected, None);
            }
            Err(err) => ignored = Some(err),
        }
    }
    if let Some(count) = inputs.instance_type.and_then(instance_type_count) {
        let expected = Expected {
            count,
            source: ExpectedSource::InstanceType,
        };
        return (expected, ignored);
    }
    let expected = Expected {
        count: inputs
            .seen_most
            .min(MAX_EXPECTED_DEVICES)
            .max(inputs.published),
        source: ExpectedSource::Seen,
    };
    (expected, ignored)
}

/// The mark after a cycle whose expected count was `expected` and whose detection
/// `confirmed` accelerators (seen by a detection, now or before and kept while missing;
/// not devices only seeded from the stored inventory). It grows while the `seen` source
/// applies; an annotation or instance type resets it, so when they stop applying the count
/// starts again from what is published.
pub fn next_seen_most(expected: Expected, seen_most: u32, confirmed: u32) -> u32 {
    match expected.source {
        ExpectedSource::Seen => seen_most.max(confirmed).min(MAX_EXPECTED_DEVICES),
        ExpectedSource::Annotation | ExpectedSource::InstanceType => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(count: u32) -> Expected {
        Expected {
            count,
            source: ExpectedSource::Seen,
        }
    }

    #[test]
    fn the_annotation_wins_over_everything() {
        let inputs = ExpectedInputs {
            annotation: Some("16"),
            instance_type: Some("p5.48xlarge"),
            seen_most: 8,
            published: 8,
        };
        let (expected, warning) = expected(&inputs);
        assert_eq!(expected.count, 16);
        assert_eq!(expected.source, ExpectedSource::Annotation);
        assert_eq!(expected.missing(8), 8);
        assert_eq!(warning, None);
    }

    #[test]
    fn the_annotation_may_acknowledge_a_smaller_node_and_zero() {
        let inputs = ExpectedInputs {
            annotation: Some(" 0 "),
            instance_type: Some("p4d.24xlarge"),
            seen_most: 8,
            published: 7,
        };
        let (expected, _) = expected(&inputs);
        assert_eq!((expected.count, expected.missing(7)), (0, 0));
    }

    #[test]
    fn bad_annotations_are_ignored_with_a_reason() {
        for bad in ["", "  ", "-1", "+8", "8.0", "eight", "8 gpus", "0x10", "８"] {
            assert!(
                matches!(parse_annotation(bad), Err(AnnotationError::NotANumber(_))),
                "{bad:?}"
            );
        }
        for big in ["1025", "4294967296", "99999999999999999999999999"] {
            assert!(
                matches!(parse_annotation(big), Err(AnnotationError::TooLarge(_))),
                "{big}"
            );
        }
        assert_eq!(parse_annotation("1024"), Ok(MAX_EXPECTED_DEVICES));
        assert_eq!(parse_annotation("008"), Ok(8));

        // Falls through to the instance type, and the warning says why.
        let inputs = ExpectedInputs {
            annotation: Some("lots"),
            instance_type: Some("g5.12xlarge"),
            seen_most: 0,
            published: 4,
        };
        let (expected, warning) = expected(&inputs);
        assert_eq!(expected.source, ExpectedSource::InstanceType);
        assert_eq!(expected.count, 4);
        let warning = warning.map(|w| w.to_string()).unwrap_or_default();
        assert!(warning.contains("hwaccel.io/expected-devices"), "{warning}");
    }

    #[test]
    fn a_huge_annotation_is_quoted_short() {
        let long = "9".repeat(10_000);
        let message = parse_annotation(&long)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(message.len() < 200, "{message}");
    }

    #[test]
    fn well_known_instance_types_have_their_counts() {
        assert_eq!(instance_type_count("p4d.24xlarge"), Some(8));
        assert_eq!(instance_type_count("p5en.48xlarge"), Some(8));
        assert_eq!(instance_type_count("g6e.xlarge"), Some(1));
        assert_eq!(instance_type_count("inf2.48xlarge"), Some(12));
        assert_eq!(instance_type_count("trn1.32xlarge"), Some(16));
        assert_eq!(instance_type_count("a3-megagpu-8g"), Some(8));
        assert_eq!(instance_type_count("g2-standard-24"), Some(2));
        assert_eq!(instance_type_count("Standard_ND96isr_H100_v5"), Some(8));
        assert_eq!(instance_type_count("Standard_ND96isr_MI300X_v5"), Some(8));
        assert_eq!(instance_type_count("m5.large"), None);
        assert_eq!(instance_type_count(""), None);
    }

    #[test]
    fn the_table_has_no_duplicates_and_only_sane_counts() {
        let mut names: Vec<String> = INSTANCE_TYPES
            .iter()
            .map(|(n, _)| n.to_ascii_lowercase())
            .collect();
        names.sort();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before);
        assert!(
            INSTANCE_TYPES
                .iter()
                .all(|(_, c)| (1..=MAX_EXPECTED_DEVICES).contains(c))
        );
    }

    #[test]
    fn the_instance_type_wins_over_seen() {
        let inputs = ExpectedInputs {
            annotation: None,
            instance_type: Some("p5.48xlarge"),
            seen_most: 9,
            published: 7,
        };
        let (expected, _) = expected(&inputs);
        assert_eq!(expected.source, ExpectedSource::InstanceType);
        assert_eq!(expected.missing(7), 1);
    }

    #[test]
    fn seen_remembers_the_most_and_starts_over_after_another_source() {
        let mut inputs = ExpectedInputs {
            published: 8,
            ..ExpectedInputs::default()
        };
        let first = expected(&inputs).0;
        assert_eq!(first, seen(8));
        inputs.seen_most = next_seen_most(first, 0, 8);
        // The device was dropped from the published set: still expected.
        inputs.published = 7;
        let second = expected(&inputs).0;
        assert_eq!(second, seen(8));
        assert_eq!(second.missing(7), 1);
        inputs.seen_most = next_seen_most(second, inputs.seen_most, 7);
        assert_eq!(inputs.seen_most, 8);
        // More than ever before: the count grows.
        inputs.published = 9;
        assert_eq!(expected(&inputs).0, seen(9));
        // While an annotation applies the mark is reset, so after it is removed its count
        // (or the mark from before it) is not carried into `seen`.
        let annotated = Expected {
            count: 16,
            source: ExpectedSource::Annotation,
        };
        inputs.seen_most = next_seen_most(annotated, 9, 9);
        inputs.published = 7;
        assert_eq!(expected(&inputs).0, seen(7));
        // A corrupt mark is bounded.
        inputs.seen_most = u32::MAX;
        assert_eq!(expected(&inputs).0.count, MAX_EXPECTED_DEVICES);
        assert_eq!(next_seen_most(seen(5), u32::MAX, 3), MAX_EXPECTED_DEVICES);
    }

    /// Issue 35: forged devices kept for the grace raise the count while they are kept, but
    /// the mark only follows confirmed devices, so once they expire the count is back to
    /// what the node has.
    #[test]
    fn devices_kept_but_never_confirmed_do_not_raise_the_mark() {
        // 40 detected, 8 seeded from a forged inventory and kept for the grace.
        let mut inputs = ExpectedInputs {
            published: 48,
            ..ExpectedInputs::default()
        };
        let during_grace = expected(&inputs).0;
        assert_eq!(during_grace, seen(48));
        inputs.seen_most = next_seen_most(during_grace, inputs.seen_most, 40);
        assert_eq!(inputs.seen_most, 40);
        // The grace is over: the forged devices are no longer published.
        inputs.published = 40;
        let after = expected(&inputs).0;
        assert_eq!((after.count, after.missing(40)), (40, 0));
    }

    #[test]
    fn missing_never_goes_below_zero() {
        assert_eq!(seen(4).missing(6), 0);
        assert_eq!(seen(4).missing(1), 3);
    }

    #[test]
    fn source_names_round_trip() {
        for source in [
            ExpectedSource::Annotation,
            ExpectedSource::InstanceType,
            ExpectedSource::Seen,
        ] {
            assert_eq!(ExpectedSource::parse(source.as_str()), Some(source));
        }
        assert_eq!(ExpectedSource::parse("guess"), None);
    }
}
