//! Processes a cluster test starts itself (a controller binary under test) and what it reads
//! of them: a guard that ends the child with the test, a free loopback port, the peak RSS.

use std::process::Child;

use anyhow::Result;

/// Kills and reaps its child when dropped, so a failing test leaves no process behind.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A TCP port free on 127.0.0.1 right now (probed, not held: a tiny race).
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The peak resident set (`VmHWM` in /proc/<pid>/status) of a process, in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
