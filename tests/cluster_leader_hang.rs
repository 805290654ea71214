//! A leader whose apiserver hangs gives leadership up within its renew deadline, so it cannot
//! go on writing as leader while a standby, seeing the Lease unchanged for a lease duration,
//! takes over. The hang is real: the test's kube-apiserver is frozen with SIGSTOP, so its
//! socket still accepts connections (the kernel completes them) but nothing ever answers, the
//! way a half-open connection or an overloaded apiserver behaves.
//!
//! Its own test binary, because it freezes the shared apiserver for a few seconds (cargo runs
//! test binaries one at a time).

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use hwaccel::controller::leader::{self, LeaseConfig};
use support::TestCluster;

/// Freezes the apiserver's process group while alive; thaws it when dropped, also when the
/// test fails, so the other tests find it running.
struct Frozen(String);

impl Frozen {
    fn apiserver(cluster: &TestCluster) -> Result<Self> {
        let pid_file = cluster.env().work.join("run/kube-apiserver.pid");
        let pid = std::fs::read_to_string(&pid_file)
            .with_context(|| format!("reading {}", pid_file.display()))?
            .trim()
            .to_string();
        let group = format!("-{pid}");
        let status = Command::new("kill")
            .args(["-STOP", "--", &group])
            .status()?;
        ensure!(status.success(), "SIGSTOP to the apiserver group {group}");
        Ok(Self(group))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", "--", &self.0]).status();
    }
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_leader_whose_apiserver_hangs_gives_up_within_the_renew_deadline() -> Result<()> {
    let cluster = TestCluster::new().await?;
    let config = LeaseConfig {
        lease_duration: Duration::from_secs(8),
        renew_deadline: Duration::from_secs(4),
        retry_period: Duration::from_millis(500),
        ..LeaseConfig::new(cluster.namespace(), "hang-test", "leader-a")
    };
    let lease_duration = config.lease_duration;
    let mut leadership = leader::acquire(cluster.client(), config, || {}).await?;
    // Renewals work while the apiserver answers.
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(
        !*leadership.lost.borrow(),
        "leadership lost with a working apiserver"
    );

    let frozen = Frozen::apiserver(&cluster)?;
    let since = Instant::now();
    let gave_up = tokio::time::timeout(Duration::from_secs(30), leadership.lost()).await;
    let waited = since.elapsed();
    drop(frozen);
    gave_up.context("the leader kept its leadership while every renewal hung")?;
    // A standby takes over no sooner than one lease duration after the Lease last changed;
    // the leader must have stopped before that.
    ensure!(
        waited < lease_duration,
        "leadership given up after {waited:?}, not before the {lease_duration:?} lease duration"
    );
    Ok(())
}
