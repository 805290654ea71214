//! `HostRoot`: the only way detection reads the host's files.
//!
//! Every path a backend asks for is absolute in the host's view (`/sys/class/drm`) and is
//! resolved under a root directory: `/` on a bare machine, `/host` in the agent's pod (where
//! the host's `/sys`, `/dev` and `/proc` are mounted read-only), or a fixture tree in tests.
//! Reads are bounded so a strange file (a device node, a huge log) cannot stall or bloat a
//! detection run, and every method fails soft: absent means `None` or empty.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Largest file `HostRoot` reads; sysfs attributes are at most a page, config files a few KiB.
const MAX_FILE_BYTES: u64 = 1 << 20;
/// Initial read buffer: a page, the most a sysfs attribute holds.
const READ_CHUNK: usize = 4096;

/// A view of the host's filesystem rooted at a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoot {
    root: PathBuf,
}

impl Default for HostRoot {
    fn default() -> Self {
        Self::new("/")
    }
}

impl HostRoot {
    /// A host view rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves a host-absolute path (`/sys/...`) under the root.
    pub fn path(&self, host_path: impl AsRef<Path>) -> PathBuf {
        let host_path = host_path.as_ref();
        let relative = host_path.strip_prefix("/").unwrap_or(host_path);
        self.root.join(relative)
    }

    /// Reads a file as UTF-8 (lossy), up to 1 MiB. `None` when it is missing or unreadable.
    pub fn read(&self, host_path: impl AsRef<Path>) -> Option<String> {
        let file = fs::File::open(self.path(host_path)).ok()?;
        // `Take` hides the file's size, so an empty buffer would be filled by a chain of
        // doubling reads starting at 32 bytes; one page covers a sysfs attribute in one call.
        let mut bytes = Vec::with_capacity(READ_CHUNK);
        file.take(MAX_FILE_BYTES).read_to_end(&mut bytes).ok()?;
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Reads a file and trims surrounding whitespace and NUL bytes (device-tree strings end in
    /// NUL). `None` when missing or empty after trimming.
    pub fn read_trimmed(&self, host_path: impl AsRef<Path>) -> Option<String> {
        let text = self.read(host_path)?;
        let trimmed = text.trim_matches(|c: char| c.is_whitespace() || c == '\0');
        (!trimmed.is_empty()).then(|| trimmed.to_string())
    }

    /// Reads a file holding one integer, decimal or `0x` hexadecimal.
    pub fn read_u64(&self, host_path: impl AsRef<Path>) -> Option<u64> {
        parse_u64(&self.read_trimmed(host_path)?)
    }

    /// Sorted names of the entries of a directory; empty when it is missing.
    pub fn list(&self, host_path: impl AsRef<Path>) -> Vec<String> {
        let Ok(entries) = fs::read_dir(self.path(host_path)) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// True when the path exists (following links).
    pub fn exists(&self, host_path: impl AsRef<Path>) -> bool {
        self.path(host_path).exists()
    }

    /// The last component of a symlink's target (`device -> ../../0000:18:00.0` gives
    /// `0000:18:00.0`). Sysfs links are relative, so this works under any root.
    pub fn link_name(&self, host_path: impl AsRef<Path>) -> Option<String> {
        let target = fs::read_link(self.path(host_path)).ok()?;
        Some(target.file_name()?.to_string_lossy().into_owned())
    }
}

/// Parses a decimal or `0x`-prefixed hexadecimal integer.
pub fn parse_u64(text: &str) -> Option<u64> {
    let text = text.trim();
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_host_paths_under_the_root() {
        let host = HostRoot::new("/fixture");
        assert_eq!(
            host.path("/sys/class/drm"),
            PathBuf::from("/fixture/sys/class/drm")
        );
        assert_eq!(
            host.path("proc/cpuinfo"),
            PathBuf::from("/fixture/proc/cpuinfo")
        );
    }

    #[test]
    fn reads_fail_soft_and_trim() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("sys/x")).unwrap();
        fs::write(dir.path().join("sys/x/vendor"), "0x10de\n").unwrap();
        fs::write(dir.path().join("sys/x/model"), "apple,t8112\0").unwrap();
        let host = HostRoot::new(dir.path());
        assert_eq!(host.read_u64("/sys/x/vendor"), Some(0x10de));
        assert_eq!(
            host.read_trimmed("/sys/x/model").as_deref(),
            Some("apple,t8112")
        );
        assert_eq!(host.read("/sys/x/missing"), None);
        assert_eq!(host.list("/sys/x"), vec!["model", "vendor"]);
        assert!(host.list("/nope").is_empty());
    }

    #[test]
    fn parses_numbers() {
        assert_eq!(parse_u64("0x1ae0"), Some(0x1ae0));
        assert_eq!(parse_u64(" 42 "), Some(42));
        assert_eq!(parse_u64("forty"), None);
    }
}
