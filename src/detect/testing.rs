//! Test support: a detection context over a fixture host under `fixtures/hosts/<scenario>/`.
//!
//! A fixture host is a directory tree shaped like a host's root (`sys/`, `dev/`, `proc/`,
//! `etc/`...) plus `commands/`, which holds small executable scripts standing in for vendor
//! tools (`commands/nvidia-smi`) and is the only directory on the runner's search path. The
//! scripts print realistic captures kept next to them, quirks included.

use std::path::PathBuf;
use std::time::Duration;

use super::{Backend, CommandRunner, Context, Findings, HostRoot};

/// The directory of a fixture host scenario.
pub fn fixture_dir(scenario: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/hosts")
        .join(scenario)
}

/// A context over a fixture host, with only the fixture's `commands/` on the search path.
pub fn fixture_context(scenario: &str) -> Context {
    let dir = fixture_dir(scenario);
    assert!(
        dir.is_dir(),
        "no fixture host {scenario:?} at {}",
        dir.display()
    );
    let runner =
        CommandRunner::new(vec![dir.join("commands")]).with_timeout(Duration::from_secs(10));
    Context::new(HostRoot::new(dir), runner)
}

/// Runs one backend against a fixture host.
pub fn detect_on(backend: &dyn Backend, scenario: &str) -> Findings {
    backend.detect(&fixture_context(scenario))
}
