//! Detection on the fixture hosts under `fixtures/hosts/<scenario>/`, through the public
//! detection API (a `Detector` over the fixture's root, with only its `commands/` on the
//! tool search path), so integration tests and benches get the same reports as unit tests.
//!
//! The backends default to `all,-vulkan`, as the tests run the agent: no fixture host ships
//! a `vulkaninfo` that matters to a placement, and leaving it out keeps `backends` in the
//! reports the same as the agent's in the cluster tests.

use std::path::PathBuf;
use std::time::Duration;

use crate::detect::{BackendSelection, CommandRunner, Detector, HostRoot};
use crate::hardware::Report;

/// The backends a fixture report runs unless told otherwise.
pub const FIXTURE_BACKENDS: &str = "all,-vulkan";

/// Fixture tools are shell scripts; a loaded test machine can take seconds to start one.
const FIXTURE_TOOL_TIMEOUT: Duration = Duration::from_secs(10);

/// The root directory of fixture host `scenario`.
pub fn host_dir(scenario: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/hosts")
        .join(scenario)
}

/// A detector over fixture host `scenario` running the `selection` backends.
///
/// # Panics
/// When the fixture host does not exist (a typo in a test should not detect an empty host).
pub fn detector(scenario: &str, selection: &BackendSelection) -> Detector {
    let dir = host_dir(scenario);
    assert!(
        dir.is_dir(),
        "no fixture host {scenario:?} at {}",
        dir.display()
    );
    let runner = CommandRunner::new(vec![dir.join("commands")]).with_timeout(FIXTURE_TOOL_TIMEOUT);
    Detector::new(HostRoot::new(dir), runner, selection)
}

/// The report of fixture host `scenario` with the [`FIXTURE_BACKENDS`].
pub fn fixture_report(scenario: &str) -> Report {
    fixture_report_with(scenario, FIXTURE_BACKENDS)
}

/// The report of fixture host `scenario` with the backends of `selection`
/// (`--backends` syntax: `all`, `nvidia,cpu`, `all,-vulkan`).
///
/// # Panics
/// When `selection` names an unknown backend.
pub fn fixture_report_with(scenario: &str, selection: &str) -> Report {
    let selection: BackendSelection = selection
        .parse()
        .unwrap_or_else(|err| panic!("backend selection {selection:?}: {err}"));
    detector(scenario, &selection).run(false).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixture_report_holds_the_fixture_accelerators_and_leaves_vulkan_out() {
        let report = fixture_report("h100-8x-nvswitch");
        let gpus = report
            .devices
            .iter()
            .filter(|d| d.model.contains("H100"))
            .count();
        assert_eq!(gpus, 8, "{:?}", report.devices);
        assert!(!report.backends.iter().any(|b| b == "vulkan"));
        let with_vulkan = fixture_report_with("h100-8x-nvswitch", "all");
        assert!(with_vulkan.backends.iter().any(|b| b == "vulkan"));
        assert_eq!(with_vulkan.devices, report.devices);
    }

    #[test]
    #[should_panic(expected = "no fixture host")]
    fn a_missing_fixture_host_is_an_error_not_an_empty_host() {
        fixture_report("no-such-host");
    }
}
