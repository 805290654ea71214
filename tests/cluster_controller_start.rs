//! The controller started where the hwaccel.io CRDs are missing, against a real
//! kube-apiserver: a second, minimal control plane (etcd and kube-apiserver from
//! `tests/cluster/up.sh`, in a temporary work dir) in which nobody installed the CRDs, so the
//! shared cluster's CRDs, which every other test needs, stay where they are. The controller
//! binary must exit at once, non-zero, naming both CRDs and how to install them, rather than
//! retry its watches forever.
//!
//! Run with the cluster up (for the built binaries): `tests/cluster/up.sh --full && cargo
//! test --test cluster_tier -- --ignored cluster_controller_start::`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::support::ClusterEnv;

/// How long the controller may take to give up: one discovery request, not a retry loop.
const EXIT_WITHIN: Duration = Duration::from_secs(30);

/// A minimal control plane of its own, brought down (`down.sh`) when dropped.
struct BareApiserver {
    work: tempfile::TempDir,
}

impl BareApiserver {
    fn up() -> Result<Self> {
        let work = tempfile::Builder::new()
            .prefix("hwaccel-bare-apiserver-")
            .tempdir()?;
        let bare = Self { work };
        let output = Command::new(script("up.sh"))
            .arg(bare.work.path())
            .stdin(Stdio::null())
            .output()
            .context("running tests/cluster/up.sh")?;
        if !output.status.success() {
            bail!(
                "up.sh for the bare apiserver failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(bare)
    }

    fn kubeconfig(&self) -> PathBuf {
        self.work.path().join("admin.kubeconfig")
    }
}

impl Drop for BareApiserver {
    fn drop(&mut self) {
        let _ = Command::new(script("down.sh"))
            .arg(self.work.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/cluster")
        .join(name)
}

#[test]
#[ignore = "needs cluster"]
fn a_controller_without_its_crds_exits_at_once_saying_so() -> Result<()> {
    // The shared cluster's env proves the tier's binaries are built; its apiserver is not used.
    ClusterEnv::load()?;
    let bare = BareApiserver::up()?;
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hwaccel"))
        .args([
            "controller",
            "--identity",
            "no-crds",
            "--metrics-addr",
            "127.0.0.1:0",
            "--health-addr",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ])
        .env("KUBECONFIG", bare.kubeconfig())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() > EXIT_WITHIN {
            let _ = child.kill();
            let output = child.wait_with_output()?;
            bail!(
                "the controller still runs after {EXIT_WITHIN:?} without its CRDs: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stderr = child
        .wait_with_output()
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())?;
    assert_eq!(status.code(), Some(1), "{stderr}");
    for expected in [
        "AcceleratorInventory (CRD acceleratorinventories.hwaccel.io)",
        "ModelPlacement (CRD modelplacements.hwaccel.io)",
        "kubectl apply --server-side",
    ] {
        assert!(stderr.contains(expected), "{expected} not in: {stderr}");
    }
    // It never got as far as leader election.
    assert!(!stderr.contains("became the leader"), "{stderr}");
    Ok(())
}
