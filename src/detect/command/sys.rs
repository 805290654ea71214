//! The few process calls `std` does not offer: waiting on several pipes at once, signalling a
//! process or a process group, reaping a process by id, and finding which processes hold the
//! write end of a pipe.
//!
//! Each `unsafe` block is one libc call on plain integers or on a slice borrowed for the call.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

/// Waits until one of `fds` is readable or closed, or `timeout` passes. Returns how many
/// entries have events; an interrupted wait counts as none.
#[allow(unsafe_code)]
pub(super) fn poll(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<usize> {
    // Rounded up, so a wait of a few microseconds does not become a busy loop of 0 ms polls.
    let millis = libc::c_int::try_from(timeout.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
    let count = libc::nfds_t::try_from(fds.len()).unwrap_or(0);
    // SAFETY: `fds` is an exclusively borrowed, initialised slice of `count` pollfd entries that
    // outlives the call; poll only writes their `revents` fields.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), count, millis) };
    match usize::try_from(ready) {
        Ok(ready) => Ok(ready),
        Err(_) => {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                Ok(0)
            } else {
                Err(err)
            }
        }
    }
}

/// Sends SIGKILL to a process group; a group that is already gone is fine.
#[allow(unsafe_code)]
pub(super) fn kill_process_group(pgid: libc::pid_t) {
    // SAFETY: killpg only sends a signal; `pgid` is the group of a child we spawned with
    // `process_group(0)`, so it cannot address an unrelated group while the child is unreaped.
    unsafe {
        libc::killpg(pgid, libc::SIGKILL);
    }
}

/// Sends SIGKILL to one process; a process that is already gone is fine.
#[allow(unsafe_code)]
fn kill_process(pid: libc::pid_t) {
    // SAFETY: kill only sends a signal. `pid` is positive (checked by the caller), so it names
    // one process, never a group or every process.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// What reaping one process id found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reap {
    /// It had exited and is now reaped.
    Reaped,
    /// It is our child and still running (a signal is delivered asynchronously).
    Running,
    /// It is not our child (its parent is init or a subreaper), or it is gone.
    NotOurs,
}

/// Reaps `pid` if it is our child and has exited, without blocking.
#[allow(unsafe_code)]
fn try_reap(pid: libc::pid_t) -> Reap {
    let mut status: libc::c_int = 0;
    // SAFETY: waitpid writes one int through a pointer to a live local; `pid` is positive, so it
    // waits for that one process only and never steals another child's status.
    let result = unsafe { libc::waitpid(pid, &raw mut status, libc::WNOHANG) };
    match result {
        0 => Reap::Running,
        r if r == pid => Reap::Reaped,
        _ => Reap::NotOurs,
    }
}

/// Kills every process other than this one that holds the write end of one of the pipes with
/// the given inodes, and reaps those that are our children.
///
/// A process that a tool detached (`setsid`) has left the tool's process group, so killing the
/// group misses it; but it still holds our pipe, and that is how it is found: its
/// `/proc/<pid>/fd/<n>` link reads `pipe:[<inode>]` and the link's mode has the owner-write
/// bit when the descriptor is open for writing. When this process is PID 1 of a container (the
/// agent's pod) orphans are re-parented to it, so the killed processes are reaped here or they
/// would stay zombies. Returns the ids killed.
///
/// Best effort: a process `/proc` does not let us inspect (another user, `hidepid`) is not
/// found; the caller stops reading after a bound either way.
pub(super) fn kill_pipe_writers(inodes: &[u64]) -> Vec<libc::pid_t> {
    if inodes.is_empty() {
        return Vec::new();
    }
    let targets: Vec<String> = inodes.iter().map(|i| format!("pipe:[{i}]")).collect();
    let holds_write_end = |pid: libc::pid_t| -> bool {
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            return false;
        };
        fds.filter_map(Result::ok).any(|fd| {
            let path = fd.path();
            let is_target = fs::read_link(&path)
                .is_ok_and(|link| targets.iter().any(|t| link.as_os_str() == t.as_str()));
            is_target && fs::symlink_metadata(&path).is_ok_and(|meta| meta.mode() & 0o200 != 0)
        })
    };
    let me = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
    let Ok(processes) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut killed: Vec<libc::pid_t> = processes
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|&pid| pid > 0 && pid != me)
        .filter(|&pid| holds_write_end(pid))
        .collect();
    killed.sort_unstable();
    for &pid in &killed {
        kill_process(pid);
    }
    reap(&killed);
    killed
}

/// Total time spent waiting for killed children to exit before giving up on reaping them.
const REAP_WAIT: Duration = Duration::from_millis(100);

/// Reaps those of `pids` that are our children, waiting briefly for SIGKILL to take effect.
fn reap(pids: &[libc::pid_t]) {
    let mut pending: Vec<libc::pid_t> = pids.to_vec();
    let started = std::time::Instant::now();
    while !pending.is_empty() && started.elapsed() < REAP_WAIT {
        pending.retain(|&pid| try_reap(pid) == Reap::Running);
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
