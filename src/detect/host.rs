//! `HostRoot`: the only way detection reads the host's files.
//!
//! Every path a backend asks for is absolute in the host's view (`/sys/class/drm`) and is
//! resolved under a root directory: `/` on a bare machine, `/host` in the agent's pod (where
//! the host's `/sys`, `/dev` and `/proc` are mounted read-only), or a fixture tree in tests.
//! Reads are bounded so a strange file (a device node, a huge log) cannot stall or bloat a
//! detection run, and every method fails soft: absent means `None` or empty.
//!
//! Only regular files are read. A FIFO, socket or device node where a sysfs attribute or a
//! `/proc` file should be (a hostile or broken host tree) would block `open` or `read` for
//! ever, or have side effects; such a file is refused before it is opened, the open itself
//! never blocks (`O_NONBLOCK`), and the type is checked again on the open file, so swapping
//! the file in between does not help. Refused paths are kept, so the detector can report them
//! as a warning. Sysfs attributes and `/proc` files are regular files; no backend reads a
//! device node through here.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// Largest file `HostRoot` reads; sysfs attributes are at most a page, config files a few KiB.
const MAX_FILE_BYTES: u64 = 1 << 20;
/// Initial read buffer: a page, the most a sysfs attribute holds.
const READ_CHUNK: usize = 4096;

/// Most refused paths one host view remembers; a tree full of FIFOs gives a bounded warning.
const MAX_REFUSED: usize = 16;

/// A view of the host's filesystem rooted at a directory.
#[derive(Debug, Clone)]
pub struct HostRoot {
    root: PathBuf,
    /// Host paths that were not read because they are not regular files, shared by clones.
    refused: Arc<Mutex<Refused>>,
}

/// Two views are equal when they have the same root; what they refused is history.
impl PartialEq for HostRoot {
    fn eq(&self, other: &Self) -> bool {
        self.root == other.root
    }
}

impl Eq for HostRoot {}

/// The paths a host view refused to read, at most [`MAX_REFUSED`] of them named.
#[derive(Debug, Default)]
struct Refused {
    paths: BTreeSet<String>,
    more: usize,
}

impl Default for HostRoot {
    fn default() -> Self {
        Self::new("/")
    }
}

impl HostRoot {
    /// A host view rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            refused: Arc::default(),
        }
    }

    /// The same view with nothing refused yet, for one detection run: its clones share what
    /// they refuse with each other, not with earlier runs.
    #[must_use]
    pub fn fresh(&self) -> Self {
        Self::new(self.root.clone())
    }

    /// The host paths refused since the view was made (or this was last called), as warning
    /// lines in path order, and empties the record.
    pub fn take_refused(&self) -> Vec<String> {
        let refused =
            std::mem::take(&mut *self.refused.lock().unwrap_or_else(PoisonError::into_inner));
        let mut lines: Vec<String> = refused
            .paths
            .into_iter()
            .map(|path| format!("{path} is not a regular file and was not read"))
            .collect();
        if refused.more > 0 {
            lines.push(format!(
                "{} more paths are not regular files and were not read",
                refused.more
            ));
        }
        lines
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

    /// Reads a regular file as UTF-8 (lossy), up to 1 MiB. `None` when it is missing,
    /// unreadable or not a regular file (a FIFO, a device node: recorded as refused).
    pub fn read(&self, host_path: impl AsRef<Path>) -> Option<String> {
        let host_path = host_path.as_ref();
        match read_at_most(&self.path(host_path), MAX_FILE_BYTES) {
            Ok((bytes, _)) => Some(String::from_utf8_lossy(&bytes).into_owned()),
            Err(FileReadError::NotRegular { .. }) => {
                self.refuse(host_path);
                None
            }
            Err(_) => None,
        }
    }

    fn refuse(&self, host_path: &Path) {
        let mut refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        let path = host_path.display().to_string();
        if refused.paths.len() < MAX_REFUSED || refused.paths.contains(&path) {
            refused.paths.insert(path);
        } else {
            refused.more += 1;
        }
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

/// Why a file was not read by [`read_at_most`].
#[derive(Debug, thiserror::Error)]
pub enum FileReadError {
    /// Opening or reading failed (missing, no permission...).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The path is not a regular file; reading it could block for ever or have side effects.
    #[error("is a {kind}, not a regular file")]
    NotRegular {
        /// What it is, in words (`FIFO`, `socket`, `character device`...).
        kind: &'static str,
    },
}

/// Reads at most `limit` bytes of the regular file at `path`, without ever blocking on a
/// special file. Returns the bytes and whether the file holds more than `limit`.
///
/// The type is checked before opening (opening a device node can have side effects, opening
/// a FIFO for reading blocks until a writer appears), the open is non-blocking, and the type
/// is checked again on the open descriptor, which is what is then read.
pub fn read_at_most(path: &Path, limit: u64) -> Result<(Vec<u8>, bool), FileReadError> {
    regular(&fs::metadata(path)?.file_type())?;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    regular(&meta.file_type())?;
    // Most reads are sysfs attributes of a few bytes (whose size reads as a page or 0). They
    // are read into a page on the stack and copied out at their length: a page-sized heap
    // buffer per file costs musl's allocator an mmap and munmap of fresh pages each time
    // (about a third of a `detect` run's page faults). Longer files go on with a buffer
    // sized from their stated length.
    let mut reader = file.take(limit.saturating_add(1));
    let mut page = [0u8; READ_CHUNK];
    let mut filled = 0;
    while filled < page.len() {
        match reader.read(&mut page[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err.into()),
        }
    }
    let mut bytes = page[..filled].to_vec();
    if filled == page.len() {
        let expected = usize::try_from(meta.len().min(limit)).unwrap_or(0);
        bytes.reserve(expected.saturating_sub(filled).saturating_add(1));
        reader.read_to_end(&mut bytes)?;
    }
    let more = u64::try_from(bytes.len()).unwrap_or(u64::MAX) > limit;
    if more {
        bytes.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    Ok((bytes, more))
}

fn regular(kind: &fs::FileType) -> Result<(), FileReadError> {
    let kind = if kind.is_file() {
        return Ok(());
    } else if kind.is_dir() {
        // An ordinary miss (a backend probing a path that is a directory), not a refusal.
        return Err(io::Error::from(io::ErrorKind::IsADirectory).into());
    } else if kind.is_fifo() {
        "FIFO"
    } else if kind.is_socket() {
        "socket"
    } else if kind.is_char_device() {
        "character device"
    } else if kind.is_block_device() {
        "block device"
    } else {
        "special file"
    };
    Err(FileReadError::NotRegular { kind })
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

    fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success());
    }

    #[test]
    fn special_files_are_refused_without_blocking_and_recorded() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("proc")).unwrap();
        fs::create_dir_all(dir.path().join("sys/x")).unwrap();
        mkfifo(&dir.path().join("proc/cpuinfo"));
        mkfifo(&dir.path().join("sys/x/vendor"));
        fs::write(dir.path().join("proc/meminfo"), "MemTotal: 1 kB\n").unwrap();
        let host = HostRoot::new(dir.path());
        // Opening a FIFO for reading used to block until a writer came.
        assert_eq!(host.read("/proc/cpuinfo"), None);
        assert_eq!(host.read_u64("/sys/x/vendor"), None);
        assert_eq!(host.read("/proc/cpuinfo"), None);
        // A directory is an ordinary miss, not a refusal.
        assert_eq!(host.read("/sys/x"), None);
        assert!(host.read("/proc/meminfo").is_some());
        // A clone shares the record; a fresh view starts empty.
        assert!(host.fresh().take_refused().is_empty());
        assert_eq!(
            host.clone().take_refused(),
            [
                "/proc/cpuinfo is not a regular file and was not read",
                "/sys/x/vendor is not a regular file and was not read",
            ]
        );
        assert!(host.take_refused().is_empty());
        // A character device is refused before it is opened.
        let err = read_at_most(Path::new("/dev/null"), 10).unwrap_err();
        assert!(matches!(
            err,
            FileReadError::NotRegular {
                kind: "character device"
            }
        ));
    }

    #[test]
    fn refusals_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        for i in 0..40 {
            let name = format!("f{i:02}");
            mkfifo(&dir.path().join(&name));
            assert_eq!(host.read(format!("/{name}")), None);
        }
        let lines = host.take_refused();
        assert_eq!(lines.len(), MAX_REFUSED + 1);
        assert_eq!(
            lines.last().map(String::as_str),
            Some("24 more paths are not regular files and were not read")
        );
    }

    #[test]
    fn read_at_most_reports_what_is_past_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        fs::write(&path, "0123456789").unwrap();
        assert_eq!(
            read_at_most(&path, 10).unwrap(),
            (b"0123456789".to_vec(), false)
        );
        assert_eq!(read_at_most(&path, 4).unwrap(), (b"0123".to_vec(), true));
    }

    #[test]
    fn read_at_most_reads_whole_files_around_the_first_page() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        for len in [
            0,
            1,
            READ_CHUNK - 1,
            READ_CHUNK,
            READ_CHUNK + 1,
            3 * READ_CHUNK + 7,
        ] {
            let text: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            fs::write(&path, &text).unwrap();
            assert_eq!(read_at_most(&path, 1 << 20).unwrap(), (text.clone(), false));
            let cut = READ_CHUNK + 3;
            let expected = (text[..len.min(cut)].to_vec(), len > cut);
            assert_eq!(read_at_most(&path, cut as u64).unwrap(), expected, "{len}");
        }
    }

    #[test]
    fn parses_numbers() {
        assert_eq!(parse_u64("0x1ae0"), Some(0x1ae0));
        assert_eq!(parse_u64(" 42 "), Some(42));
        assert_eq!(parse_u64("forty"), None);
    }
}
