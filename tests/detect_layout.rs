//! The generated code layout for `hwaccel detect` (scripts/link/detect-layout.ld) is one
//! output section of unquoted section patterns that GNU ld and lld both read, placed before
//! `.text`, and covers the detection code (docs/decisions/0008-detect-code-layout.md). The
//! release musl build links with it (build.rs); a malformed script would break that link.

use std::fs;

const LAYOUT: &str = "scripts/link/detect-layout.ld";

fn patterns(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|line| line.starts_with("*("))
        .collect()
}

#[test]
fn the_layout_is_one_section_inserted_before_text() {
    let text = fs::read_to_string(LAYOUT).unwrap();
    assert!(
        text.starts_with("/*"),
        "the header comment says how it is made"
    );
    let code = text.split_once("*/").map_or("", |(_, code)| code);
    let body: Vec<&str> = code
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with("*("))
        .collect();
    assert_eq!(
        body,
        [
            "SECTIONS",
            "{",
            ".text.hwaccel_detect :",
            "{",
            "}",
            "}",
            "INSERT BEFORE .text;"
        ],
        "{text}"
    );
}

#[test]
fn every_pattern_is_an_unquoted_text_section_prefix() {
    let text = fs::read_to_string(LAYOUT).unwrap();
    let patterns = patterns(&text);
    assert!(patterns.len() > 100, "{} patterns", patterns.len());
    for pattern in &patterns {
        let name = pattern
            .strip_prefix("*(.text.")
            .and_then(|rest| rest.strip_suffix("*)"))
            .unwrap_or_else(|| panic!("not a section pattern: {pattern}"));
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.')),
            "characters a linker script lexer may not take unquoted: {pattern}"
        );
        // Hashes are cut off so that the script outlives code changes.
        assert!(
            !name.contains(".llvm.") && !regex_like_hash(name),
            "{pattern}"
        );
    }
    let mut sorted = patterns.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted, patterns, "patterns are sorted and unique");
}

#[test]
fn the_layout_covers_detection_output_and_the_detect_command() {
    let text = fs::read_to_string(LAYOUT).unwrap();
    for needle in [
        "7hwaccel6detect8Detector",
        "hwaccel..detect..backends..node..cpu",
        "7hwaccel6output7to_json",
        "7hwaccel3cli6detect3run",
        "12clap_builder6parser",
    ] {
        assert!(text.contains(needle), "{needle} missing from {LAYOUT}");
    }
}

/// A legacy Rust symbol hash (`17h` and 16 hex digits and `E`) at the end of the name.
fn regex_like_hash(name: &str) -> bool {
    name.len() > 20 && {
        let tail = &name[name.len() - 20..];
        tail.starts_with("17h")
            && tail.ends_with('E')
            && tail[3..19].chars().all(|c| c.is_ascii_hexdigit())
    }
}
