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

/// Writes a file under a hand-built host root, creating its directories.
pub fn write_host_file(root: &std::path::Path, path: &str, text: &str) {
    let path = root.join(path);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, text).unwrap();
}

/// A temporary directory holding one executable script named `tool` (the script includes its
/// own `#!` line), to stand in for a vendor tool.
pub fn tool_dir(tool: &str, script: &str) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(tool);
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// A copy of fixture host `scenario`'s `sys/` tree whose only tool is `tool`, a `#!/bin/sh`
/// script running `body` (or no tool at all), and a context over it.
pub fn fixture_sysfs_with_tool(
    scenario: &str,
    tool: &str,
    body: Option<&str>,
) -> (tempfile::TempDir, Context) {
    let dir = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(fixture_dir(scenario).join("sys"))
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let commands = dir.path().join("commands");
    std::fs::create_dir_all(&commands).unwrap();
    if let Some(body) = body {
        use std::os::unix::fs::PermissionsExt;
        let path = commands.join(tool);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let ctx = Context::new(
        HostRoot::new(dir.path()),
        CommandRunner::new(vec![commands]),
    );
    (dir, ctx)
}

/// A context over a hand-built host root, searching only `tools` (or nothing) for tools.
pub fn context_at(root: &std::path::Path, tools: Option<&std::path::Path>) -> Context {
    let search_path = tools
        .map(std::path::Path::to_path_buf)
        .into_iter()
        .collect();
    Context::new(HostRoot::new(root), CommandRunner::new(search_path))
}
