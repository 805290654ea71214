//! The `hwaccel agent` process against a hostile environment, without a cluster: a fake
//! apiserver on 127.0.0.1 that accepts connections and never answers (a hung apiserver), and a
//! host tree with a FIFO where a file should be (reading it used to block detection for good).
//!
//! - every API call fails within `--api-timeout`, and an agent whose calls fail is live but
//!   not ready;
//! - the FIFO does not stall the detection loop, so `/healthz` stays ok past the loop's bound
//!   (`health::tests` cover the 503 for a loop that is overdue or ended);
//! - SIGTERM ends the process within `--shutdown-timeout`, in an API call or idle.

#![allow(clippy::expect_used)] // test helpers may panic on impossible setup errors

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A fake apiserver that accepts and holds every connection without ever answering.
fn hung_apiserver() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("address");
    std::thread::spawn(move || {
        let mut held = Vec::new();
        // Bounded: the agents in these tests open a few connections each.
        for stream in listener.incoming().take(1000) {
            held.push(stream);
        }
    });
    addr
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind 127.0.0.1")
        .local_addr()
        .expect("address")
}

/// A copy of a CPU-only host; with `stall`, its `/proc/cpuinfo` is a FIFO nobody writes, so
/// the first detection blocks on it.
fn host(dir: &Path, stall: bool) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hosts/cpu-only-vm");
    let host = dir.join("host");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(&fixture)
        .arg(&host)
        .status()
        .expect("cp");
    assert!(copied.success(), "copying the fixture");
    if stall {
        let cpuinfo = host.join("proc/cpuinfo");
        std::fs::remove_file(&cpuinfo).expect("remove cpuinfo");
        let made = Command::new("mkfifo")
            .arg(&cpuinfo)
            .status()
            .expect("mkfifo");
        assert!(made.success(), "mkfifo");
    }
    host
}

struct Agent {
    child: Child,
    metrics: SocketAddr,
    health: SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Agent {
    /// Starts `hwaccel agent` against `apiserver`, with `extra` flags.
    fn start(apiserver: SocketAddr, stall: bool, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: hung\n\
                 clusters: [{{name: hung, cluster: {{server: 'http://{apiserver}'}}}}]\n\
                 users: [{{name: u, user: {{token: t}}}}]\n\
                 contexts: [{{name: hung, context: {{cluster: hung, user: u}}}}]\n"
            ),
        )
        .expect("write kubeconfig");
        let host = host(dir.path(), stall);
        let log = dir.path().join("agent.log");
        let metrics = free_port();
        let health = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_hwaccel"))
            .arg("agent")
            .arg("--host-root")
            .arg(&host)
            .arg("--metrics-addr")
            .arg(metrics.to_string())
            .arg("--health-addr")
            .arg(health.to_string())
            .args(["--backends", "all,-vulkan", "--interval", "1s"])
            .args(["--hotplug-poll", "1s", "--max-backoff", "1s"])
            .args(["--tool-timeout-ms", "100"])
            .args(extra)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", dir.path())
            .env("KUBECONFIG", &kubeconfig)
            .env("NODE_NAME", "node-a")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start hwaccel agent");
        Self {
            child,
            metrics,
            health,
            log,
            _dir: dir,
        }
    }

    /// `(status, body)` of a GET (`/metrics` on the metrics port, the rest on the health
    /// port), or `None` while the server is not up.
    fn get(&self, path: &str) -> Option<(u16, String)> {
        let port = if path == "/metrics" {
            &self.metrics
        } else {
            &self.health
        };
        let mut stream = TcpStream::connect_timeout(port, Duration::from_secs(2)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(12)))
            .ok()?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let status = response.get(9..12)?.parse().ok()?;
        let body = response.split_once("\r\n\r\n")?.1.to_string();
        Some((status, body))
    }

    /// Polls `check` every 100 ms until it gives a value or `limit` passes.
    fn wait_for<T>(&mut self, limit: Duration, mut check: impl FnMut(&Self) -> Option<T>) -> T {
        let started = Instant::now();
        loop {
            if let Some(value) = check(self) {
                return value;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the agent exited ({status}): {}", self.log());
            }
            assert!(
                started.elapsed() < limit,
                "nothing after {limit:?}; log: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn detections(&self) -> u64 {
        let (_, body) = self.get("/metrics").unwrap_or_default();
        body.lines()
            .find_map(|line| line.strip_prefix("hwaccel_agent_detections_total "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Sends SIGTERM and returns how long the process took to exit, and its status.
    fn terminate(&mut self, limit: Duration) -> (Duration, std::process::ExitStatus) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(sent.success(), "kill -TERM");
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return (started.elapsed(), status);
            }
            assert!(
                started.elapsed() < limit,
                "still running {limit:?} after SIGTERM; log: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The agent's liveness bound for the flags above: interval and backoff 1 s, 12 tool timeouts
/// of 100 ms, 8 API timeouts (see `hwaccel::health::agent_loop_bound`).
fn bound(api_timeout: Duration) -> Duration {
    hwaccel::health::agent_loop_bound(
        Duration::from_secs(1),
        Duration::from_secs(1),
        Duration::from_millis(100),
        api_timeout,
    )
}

#[test]
fn against_a_hung_apiserver_every_call_fails_in_time_and_the_agent_is_live_but_not_ready() {
    let mut agent = Agent::start(hung_apiserver(), false, &["--api-timeout", "1s"]);
    // The first cycle's first call (the seed read) times out after 1 s; give it a few cycles.
    agent.wait_for(Duration::from_secs(20), |agent| {
        agent.log().contains("API timeout").then_some(())
    });
    let log = agent.log();
    assert!(log.contains("publishing failed"), "{log}");
    assert_eq!(agent.get("/readyz").map(|r| r.0), Some(503), "not ready");
    assert_eq!(
        agent.get("/healthz"),
        Some((200, "ok".into())),
        "a loop whose calls fail in time is still making progress"
    );
}

#[test]
fn a_fifo_in_the_host_tree_does_not_stall_the_agent_and_healthz_stays_ok() {
    // Before reads of special files were made safe, detection blocked on this FIFO for good
    // and /healthz turned 503 once the loop's bound passed. (The 503 itself, for a loop that
    // is overdue or has ended, is covered by `health::tests`.)
    let api_timeout = Duration::from_secs(1);
    let mut agent = Agent::start(hung_apiserver(), true, &["--api-timeout", "1s"]);
    let started = Instant::now();
    agent.wait_for(Duration::from_secs(20), |agent| {
        (agent.detections() > 0).then_some(())
    });
    let bound = bound(api_timeout);
    while started.elapsed() < bound + Duration::from_secs(2) {
        let health = agent.get("/healthz").map(|(status, _)| status);
        assert_eq!(health, Some(200), "{}", agent.log());
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(agent.detections() > 1, "detection keeps completing cycles");
}

#[test]
fn sigterm_ends_an_agent_stuck_in_detection_and_in_an_api_call_within_the_shutdown_timeout() {
    // An API timeout far longer than the test: the call is as good as hung.
    let flags = ["--api-timeout", "10m", "--shutdown-timeout", "3s"];
    for stall in [true, false] {
        let mut agent = Agent::start(hung_apiserver(), stall, &flags);
        agent.wait_for(Duration::from_secs(20), |agent| agent.get("/healthz"));
        // Let the loop get stuck: in the read, or in the first API call.
        std::thread::sleep(Duration::from_millis(500));
        let (took, status) = agent.terminate(Duration::from_secs(10));
        assert!(
            took < Duration::from_secs(4),
            "stall={stall}: exited after {took:?}; log: {}",
            agent.log()
        );
        assert!(!status.success(), "a forced stop exits non-zero");
        assert!(
            agent
                .log()
                .contains("graceful shutdown did not finish in time"),
            "stall={stall}: {}",
            agent.log()
        );
    }
}

#[test]
fn sigterm_ends_an_idle_agent_at_once_and_cleanly() {
    let mut agent = Agent::start(hung_apiserver(), false, &["--api-timeout", "1s"]);
    agent.wait_for(Duration::from_secs(20), |agent| {
        agent.log().contains("API timeout").then_some(())
    });
    // Between cycles (waiting out the backoff) the loop sees the stop at once.
    let (took, status) = agent.terminate(Duration::from_secs(10));
    assert!(took < Duration::from_secs(3), "exited after {took:?}");
    assert!(status.success(), "{status}: {}", agent.log());
}
