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

/// `hwaccel ARGS` run against the test cluster (its kubeconfig), off the async runtime;
/// fails with the command's stderr when it exits non-zero, else returns its stdout as JSON.
pub async fn hwaccel_json(
    cluster: &super::TestCluster,
    args: &[&str],
) -> Result<serde_json::Value> {
    let kubeconfig = cluster.env().kubeconfig.clone();
    let args: Vec<String> = args.iter().map(|arg| (*arg).to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_hwaccel"))
            .args(&args)
            .env("KUBECONFIG", kubeconfig)
            .output()
    })
    .await??;
    anyhow::ensure!(
        out.status.success(),
        "hwaccel failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}
