//! A vendor tool that detaches a process (`setsid`) which keeps the tool's stdout open must
//! cost nothing lasting: each run ends within its bound, the detached process is killed, and
//! the runner leaves no thread behind. Before the fix every such run left the process and two
//! reader threads blocked on the pipe for as long as the process lived.
//!
//! Its own test binary, with one test, so the thread count of the process is not disturbed
//! by other tests running in parallel.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::thread;
use std::time::{Duration, Instant};

use hwaccel::detect::CommandRunner;

/// Starts a detached `sleep` holding stdout, prints its process id and exits.
const DETACHING_TOOL: &str = r#"#!/bin/sh
pidfile="$(dirname "$0")/detached.$$"
setsid sh -c 'echo $$ > "$1.tmp"; mv "$1.tmp" "$1"; exec sleep 300' sh "$pidfile" &
while [ ! -s "$pidfile" ]; do sleep 0.01; done
cat "$pidfile"; rm -f "$pidfile"
"#;

/// How many times the tool runs.
const RUNS: usize = 8;

fn threads() -> usize {
    fs::read_dir("/proc/self/task").map_or(0, Iterator::count)
}

/// True while `pid` is a live process (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        !state.starts_with('Z') && !state.starts_with('X')
    })
}

#[test]
fn detached_tools_leak_neither_processes_nor_threads() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let tool = dir.path().join("detach");
    fs::write(&tool, DETACHING_TOOL)?;
    fs::set_permissions(&tool, fs::Permissions::from_mode(0o755))?;
    let runner =
        CommandRunner::new(vec![dir.path().to_path_buf()]).with_timeout(Duration::from_secs(10));

    let before = threads();
    let mut pids = Vec::new();
    for run in 0..RUNS {
        let started = Instant::now();
        let out = runner.run("detach", &[])?;
        let elapsed = started.elapsed();
        assert!(
            elapsed < Duration::from_secs(3),
            "run {run} took {elapsed:?}"
        );
        pids.push(out.stdout.trim().parse::<u32>()?);
    }
    let gone_by = Instant::now() + Duration::from_secs(2);
    while pids.iter().any(|&pid| alive(pid)) && Instant::now() < gone_by {
        thread::sleep(Duration::from_millis(10));
    }
    let living: Vec<u32> = pids.iter().copied().filter(|&pid| alive(pid)).collect();
    assert!(
        living.is_empty(),
        "detached processes still run: {living:?}"
    );
    let after = threads();
    assert!(
        after <= before,
        "threads grew from {before} to {after} over {RUNS} runs"
    );
    Ok(())
}
