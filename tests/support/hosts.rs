//! Fixture hosts (`fixtures/hosts/<scenario>`) a test may change: a copy in a temp dir, and
//! an NVIDIA GPU taken off a copy.

use std::path::{Path, PathBuf};

use anyhow::Result;

/// `fixtures/hosts/<scenario>`.
pub fn fixture_host(scenario: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/hosts")
        .join(scenario)
}

/// Copies the tree `from` into `to` (over what is there), keeping links and modes.
pub fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .status()?;
    anyhow::ensure!(status.success(), "copying {}", from.display());
    Ok(())
}

/// A copy of a fixture host in a temp dir, removed when dropped.
pub fn copy_fixture(scenario: &str) -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    copy_tree(&fixture_host(scenario), dir.path())?;
    Ok(dir)
}

/// Removes one GPU from a host copy: its sysfs PCI function and its lines in every captured
/// tool output under `commands/` (the stand-in scripts themselves are left alone), which is
/// everything the NVIDIA backend reads.
pub fn remove_gpu(host: &Path, bus_id: &str) -> Result<()> {
    let function = host.join("sys/bus/pci/devices").join(bus_id);
    if function.is_symlink() || function.is_file() {
        std::fs::remove_file(&function)?;
    } else {
        std::fs::remove_dir_all(&function)?;
    }
    let short = bus_id.trim_start_matches("0000:").to_ascii_uppercase();
    for capture in captures_under(&host.join("commands"))? {
        let text = std::fs::read_to_string(&capture).unwrap_or_default();
        if text.to_ascii_uppercase().contains(&short) {
            let kept: String = text
                .lines()
                .filter(|line| !line.to_ascii_uppercase().contains(&short))
                .map(|line| format!("{line}\n"))
                .collect();
            std::fs::write(&capture, kept)?;
        }
    }
    Ok(())
}

/// The captured outputs under `dir`: files with an extension other than `.sh`.
pub fn captures_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            files.extend(captures_under(&path)?);
        } else if path.is_file() && path.extension().is_some_and(|e| e != "sh") {
            files.push(path);
        }
    }
    Ok(files)
}
