//! `CommandRunner`: the only way detection runs a process.
//!
//! Vendor tools misbehave: they hang on a wedged driver, print megabytes of debug output, or
//! block on a full pipe while the caller waits for them to exit. The runner makes every run
//! bounded: tools are looked up on a fixed search path (a missing tool is an ordinary result,
//! not an error), the child gets no stdin, a scrubbed environment and its own process group,
//! stdout and stderr are drained (by the calling thread, see [`pipes`]) while it runs and
//! capped, and when the deadline passes or the output exceeds the cap the whole process group
//! is killed. A process the tool detached from its group (`setsid`) that still holds the
//! output pipes after the tool exits is killed too, after a short grace.
//!
//! A process that ends before its tools (`hwaccel detect` past its deadline) kills the groups
//! of the tools still running ([`kill_running_tools`]) instead of leaving them behind.

mod pipes;
mod sys;

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use pipes::Pipes;
use sys::kill_process_group;

/// Default time a tool may run.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default cap on a tool's stdout (and separately its stderr).
pub const DEFAULT_OUTPUT_CAP: usize = 8 << 20;

/// Longest wait for output before checking again whether the tool has exited; matters only
/// while its pipes stay open after it exited.
const POLL_TICK: Duration = Duration::from_millis(20);
/// How long the pipes may stay open after the tool exited before whatever holds them is
/// killed: a tool's own descendants normally finish writing and close them at once.
const DETACHED_GRACE: Duration = Duration::from_millis(200);
/// How long reading goes on after the holders were killed, for their last output and the
/// end of file; then reading stops whether or not the pipes closed.
const DETACHED_DRAIN: Duration = Duration::from_millis(200);

/// Variables that inject code into a child process; never passed on.
const SCRUBBED_ENV: &[&str] = &[
    "LD_PRELOAD",
    "LD_AUDIT",
    "LD_DEBUG",
    "LD_DEBUG_OUTPUT",
    "LD_PROFILE",
    "LD_SHOW_AUXV",
    "DYLD_INSERT_LIBRARIES",
    "DYLD_LIBRARY_PATH",
    "DYLD_FRAMEWORK_PATH",
    "MALLOC_CHECK_",
    "GCONV_PATH",
];

/// What a finished tool printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandOutput {
    /// Standard output, decoded lossily as UTF-8.
    pub stdout: String,
    /// Standard error, decoded lossily as UTF-8.
    pub stderr: String,
}

/// Why a tool gave no usable output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// The tool is not on the search path: the hardware's software is not installed.
    #[error("{tool} is not installed")]
    NotFound {
        /// The tool name.
        tool: String,
    },
    /// The process could not be started.
    #[error("{tool} could not be started: {reason}")]
    Spawn {
        /// The tool name.
        tool: String,
        /// The OS error.
        reason: String,
    },
    /// The tool ran past its deadline and was killed.
    #[error("{tool} did not finish within {timeout:?} and was killed")]
    TimedOut {
        /// The tool name.
        tool: String,
        /// The deadline it missed.
        timeout: Duration,
    },
    /// The tool printed more than the cap and was killed.
    #[error("{tool} printed more than {cap} bytes and was killed")]
    OutputTooLarge {
        /// The tool name.
        tool: String,
        /// The cap it exceeded.
        cap: usize,
    },
    /// The tool exited unsuccessfully.
    #[error("{tool} failed ({status}){}", stderr_suffix(.stderr))]
    Failed {
        /// The tool name.
        tool: String,
        /// Exit code or signal, in words.
        status: String,
        /// The last line of its stderr (or stdout), for the warning.
        stderr: String,
    },
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!(": {stderr}")
    }
}

impl CommandError {
    /// True when the tool is simply absent, which is not worth a warning.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }
}

/// Runs vendor tools with a search path, a deadline and an output cap.
#[derive(Debug, Clone)]
pub struct CommandRunner {
    search_path: Vec<PathBuf>,
    timeout: Duration,
    output_cap: usize,
}

impl Default for CommandRunner {
    fn default() -> Self {
        Self::from_env()
    }
}

impl CommandRunner {
    /// A runner searching `$PATH` with the default timeout and cap.
    pub fn from_env() -> Self {
        let path = std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/bin:/bin"));
        Self::new(std::env::split_paths(&path).collect())
    }

    /// A runner searching `extra` first, then `$PATH`.
    pub fn with_extra_paths(extra: &[PathBuf]) -> Self {
        let mut runner = Self::from_env();
        let mut search_path = extra.to_vec();
        search_path.append(&mut runner.search_path);
        runner.search_path = search_path;
        runner
    }

    /// A runner searching the given directories, in order.
    pub fn new(search_path: Vec<PathBuf>) -> Self {
        Self {
            search_path,
            timeout: DEFAULT_TIMEOUT,
            output_cap: DEFAULT_OUTPUT_CAP,
        }
    }

    /// Sets the per-run deadline.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the per-stream output cap in bytes.
    #[must_use]
    pub fn with_output_cap(mut self, cap: usize) -> Self {
        self.output_cap = cap;
        self
    }

    /// The per-run deadline.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The full path of `tool` on the search path, if it is an executable file there.
    pub fn find(&self, tool: &str) -> Option<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        if tool.contains('/') {
            return None;
        }
        self.search_path
            .iter()
            .map(|dir| dir.join(tool))
            .find(|candidate| {
                candidate
                    .metadata()
                    .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
            })
    }

    /// True when `tool` is on the search path.
    pub fn has(&self, tool: &str) -> bool {
        self.find(tool).is_some()
    }

    /// Runs `tool args...` and returns its output when it exits 0.
    pub fn run(&self, tool: &str, args: &[&str]) -> Result<CommandOutput, CommandError> {
        let program = self.find(tool).ok_or_else(|| CommandError::NotFound {
            tool: tool.to_string(),
        })?;
        self.run_program(tool, &program, args)
    }

    /// Runs a program already found with [`CommandRunner::find`].
    pub(super) fn run_program(
        &self,
        tool: &str,
        program: &Path,
        args: &[&str],
    ) -> Result<CommandOutput, CommandError> {
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Stable, parseable output regardless of the caller's locale.
            .env("LC_ALL", "C")
            // Its own process group, so a timeout kills the tool's children too.
            .process_group(0);
        for name in SCRUBBED_ENV {
            command.env_remove(name);
        }
        let mut child = spawn(&mut command).map_err(|err| CommandError::Spawn {
            tool: tool.to_string(),
            reason: err.to_string(),
        })?;
        let mut registered = Registered::new(&child);
        let deadline = Instant::now() + self.timeout;
        let mut pipes = Pipes::new(
            child.stdout.take().map(|p| File::from(OwnedFd::from(p))),
            child.stderr.take().map(|p| File::from(OwnedFd::from(p))),
            self.output_cap,
        );
        let timed_out = || CommandError::TimedOut {
            tool: tool.to_string(),
            timeout: self.timeout,
        };
        let too_large = || CommandError::OutputTooLarge {
            tool: tool.to_string(),
            cap: self.output_cap,
        };

        // Drain both pipes in this thread until they close. Nothing here blocks past the
        // deadline and no thread is left behind, whatever the tool's descendants do.
        let mut exited: Option<(ExitStatus, Instant)> = None;
        while !pipes.all_closed() {
            let now = Instant::now();
            if now >= deadline {
                stop(&mut child, &mut registered, exited.is_some(), &pipes);
                return Err(timed_out());
            }
            if exited.is_none() {
                exited = registered
                    .try_wait(&mut child)
                    .ok()
                    .flatten()
                    .map(|status| (status, now));
            }
            let mut wait = deadline.saturating_duration_since(now).min(POLL_TICK);
            if let Some((_, at)) = exited {
                let grace_end = at + DETACHED_GRACE;
                if now >= grace_end {
                    // The tool is gone but something it started (outside its process group,
                    // or a child it left running) still holds the pipes: kill what holds them
                    // and stop reading shortly after, so neither a process nor this run lingers.
                    pipes.kill_holders();
                    if pipes.drain_until(now + DETACHED_DRAIN).is_err() {
                        return Err(too_large());
                    }
                    break;
                }
                wait = wait.min(grace_end - now);
            }
            if pipes.poll(wait).is_err() {
                stop(&mut child, &mut registered, exited.is_some(), &pipes);
                return Err(too_large());
            }
        }
        let status = match exited {
            Some((status, _)) => status,
            // Both pipes are closed; the child has exited or is about to.
            None => loop {
                match registered.try_wait(&mut child) {
                    Ok(Some(status)) => break status,
                    Ok(None) if Instant::now() < deadline => {
                        thread::sleep(Duration::from_micros(200));
                    }
                    Ok(None) | Err(_) => {
                        registered.kill(&mut child);
                        return Err(timed_out());
                    }
                }
            },
        };
        let captured = pipes.into_output();
        let [stdout, stderr] = captured.map(lossy);
        if status.success() {
            return Ok(CommandOutput { stdout, stderr });
        }
        let status = match (status.code(), status.signal()) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(signal)) => format!("killed by signal {signal}"),
            (None, None) => "unknown status".to_string(),
        };
        let last_line = |text: &str| {
            text.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(str::trim)
                .map(str::to_string)
        };
        let message = last_line(&stderr)
            .or_else(|| last_line(&stdout))
            .unwrap_or_default();
        Err(CommandError::Failed {
            tool: tool.to_string(),
            status,
            stderr: message.chars().take(200).collect(),
        })
    }
}

/// Process groups of the tools running now. A tool's group id is its process id, which
/// names it only until it is reaped: a group is removed under this lock as its tool is
/// reaped, and [`kill_running_tools`] signals under it, so it never signals a reused id.
static RUNNING: Mutex<BTreeSet<libc::pid_t>> = Mutex::new(BTreeSet::new());

fn running() -> MutexGuard<'static, BTreeSet<libc::pid_t>> {
    RUNNING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Kills the process group of every tool running now, for a process about to exit without
/// waiting for the runs (their threads are left behind); returns how many were signalled.
pub fn kill_running_tools() -> usize {
    let groups = running();
    for &group in groups.iter() {
        kill_process_group(group);
    }
    groups.len()
}

/// One run's entry in [`RUNNING`], taken out when its tool is reaped (or the run ends).
struct Registered(Option<libc::pid_t>);

impl Registered {
    fn new(child: &Child) -> Self {
        let group = libc::pid_t::try_from(child.id()).ok();
        if let Some(group) = group {
            running().insert(group);
        }
        Self(group)
    }

    /// `child.try_wait()`, with the entry taken out in the same critical section when it
    /// reaps the tool.
    fn try_wait(&mut self, child: &mut Child) -> std::io::Result<Option<ExitStatus>> {
        let mut groups = running();
        let status = child.try_wait();
        if matches!(status, Ok(Some(_)))
            && let Some(group) = self.0.take()
        {
            groups.remove(&group);
        }
        status
    }

    /// Kills and reaps the tool's group (see [`kill_group`]), taking the entry out as it does.
    fn kill(&mut self, child: &mut Child) {
        let mut groups = running();
        kill_group(child);
        if let Some(group) = self.0.take() {
            groups.remove(&group);
        }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(group) = self.0.take() {
            running().remove(&group);
        }
    }
}

/// Times `exec` of a busy executable is retried.
const BUSY_RETRIES: u32 = 6;
/// The wait before the first retry; it doubles each time (5 + 10 + ... + 160 = 315 ms at
/// most in all, well inside a tool's timeout).
const BUSY_FIRST_WAIT: Duration = Duration::from_millis(5);

/// Starts `command`, retrying briefly while the executable is busy (`ETXTBSY`). A program
/// is busy while some process holds it open for writing: a package manager replacing the
/// tool, or — in any multi-threaded process — a child forked by another thread at the
/// moment a file was open for writing, which keeps that file descriptor until its own
/// `exec`. The window is short, so a few short waits get past it.
fn spawn(command: &mut Command) -> std::io::Result<Child> {
    let mut wait = BUSY_FIRST_WAIT;
    for _ in 0..BUSY_RETRIES {
        match command.spawn() {
            Err(err) if err.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                thread::sleep(wait);
                wait *= 2;
            }
            result => return result,
        }
    }
    command.spawn()
}

/// Ends a run early: kills the tool's group unless the tool was already reaped (its id could
/// then name someone else's group), and whatever else still holds the pipes.
fn stop(child: &mut Child, registered: &mut Registered, reaped: bool, pipes: &Pipes) {
    if !reaped {
        registered.kill(child);
    }
    pipes.kill_holders();
}

fn kill_group(child: &mut Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // The group may already be gone; that is fine.
        kill_process_group(pid);
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn lossy(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes)
        .unwrap_or_else(|err| String::from_utf8_lossy(err.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    fn tool_dir(scripts: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, body) in scripts {
            let path = dir.path().join(name);
            fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        }
        dir
    }

    #[test]
    fn missing_tool_is_not_found() {
        let dir = tool_dir(&[]);
        let runner = CommandRunner::new(vec![dir.path().to_path_buf()]);
        let err = runner.run("nvidia-smi", &[]).unwrap_err();
        assert!(err.is_not_found());
    }

    #[test]
    fn captures_output_and_scrubs_preload() {
        let dir = tool_dir(&[(
            "show",
            "echo \"out:$1\"; echo err >&2; echo \"preload=${LD_PRELOAD:-none}\"",
        )]);
        let runner = CommandRunner::new(vec![dir.path().to_path_buf()]);
        // Set for this test only through the child: the runner must remove it either way.
        let out = runner.run("show", &["x"]).unwrap();
        assert_eq!(out.stdout, "out:x\npreload=none\n");
        assert_eq!(out.stderr, "err\n");
    }

    #[test]
    fn failure_carries_exit_code_and_last_stderr_line() {
        let dir = tool_dir(&[("bad", "echo 'NVIDIA-SMI has failed' >&2; exit 9")]);
        let runner = CommandRunner::new(vec![dir.path().to_path_buf()]);
        match runner.run("bad", &[]).unwrap_err() {
            CommandError::Failed { status, stderr, .. } => {
                assert_eq!(status, "exit code 9");
                assert_eq!(stderr, "NVIDIA-SMI has failed");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_tool_busy_for_a_moment_is_started_once_it_is_free() {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("busy");
        // Held open for writing, the script cannot be executed (ETXTBSY) until it is closed.
        let mut writing = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o755)
            .open(&path)
            .unwrap();
        writing.write_all(b"#!/bin/sh\necho free\n").unwrap();
        let closer = thread::spawn(move || {
            thread::sleep(Duration::from_millis(10));
            drop(writing);
        });
        let runner = CommandRunner::new(vec![dir.path().to_path_buf()]);
        let out = runner.run("busy", &[]).unwrap();
        assert_eq!(out.stdout, "free\n");
        closer.join().unwrap();
    }

    #[test]
    fn hanging_tool_and_its_children_are_killed_at_the_deadline() {
        let dir = tool_dir(&[("hang", "sleep 30 & sleep 30")]);
        let runner = CommandRunner::new(vec![dir.path().to_path_buf()])
            .with_timeout(Duration::from_millis(300));
        let started = Instant::now();
        let err = runner.run("hang", &[]).unwrap_err();
        assert!(matches!(err, CommandError::TimedOut { .. }), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    /// A tool that starts a detached process (`setsid`, so outside the tool's process group)
    /// which keeps the tool's stdout open, prints that process's id and exits at once.
    const DETACHING_TOOL: &str = r#"pidfile="$(dirname "$0")/detached.$$"
setsid sh -c 'echo $$ > "$1.tmp"; mv "$1.tmp" "$1"; exec sleep 300' sh "$pidfile" &
while [ ! -s "$pidfile" ]; do sleep 0.01; done
cat "$pidfile"; rm -f "$pidfile""#;

    /// True while `pid` is a live process (not gone, not a zombie).
    fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        })
    }

    #[test]
    fn a_detached_process_holding_stdout_is_killed_and_the_run_ends() {
        let dir = tool_dir(&[("detach", DETACHING_TOOL)]);
        let runner = CommandRunner::new(vec![dir.path().to_path_buf()])
            .with_timeout(Duration::from_secs(10));
        for _ in 0..3 {
            let started = Instant::now();
            let out = runner.run("detach", &[]).unwrap();
            let elapsed = started.elapsed();
            // Grace and drain are 0.4 s; the old reader threads waited for the full deadline.
            assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}");
            let pid: u32 = out.stdout.trim().parse().unwrap();
            let gone_by = Instant::now() + Duration::from_secs(2);
            while alive(pid) && Instant::now() < gone_by {
                thread::sleep(Duration::from_millis(10));
            }
            assert!(!alive(pid), "detached process {pid} still runs");
        }
    }

    #[test]
    fn output_a_detached_process_prints_within_the_grace_is_kept() {
        let dir = tool_dir(&[(
            "late",
            "(setsid sh -c 'sleep 0.05; echo late' &) ; echo early",
        )]);
        let runner = CommandRunner::new(vec![dir.path().to_path_buf()]);
        let out = runner.run("late", &[]).unwrap();
        assert_eq!(out.stdout, "early\nlate\n");
    }

    #[test]
    fn flood_of_output_is_capped() {
        let dir = tool_dir(&[("flood", "yes nvidia")]);
        let runner = CommandRunner::new(vec![dir.path().to_path_buf()]).with_output_cap(1 << 20);
        let err = runner.run("flood", &[]).unwrap_err();
        assert!(
            matches!(err, CommandError::OutputTooLarge { .. }),
            "{err:?}"
        );
    }
}
