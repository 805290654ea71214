//! Draining a tool's stdout and stderr from the thread that runs it.
//!
//! Reader threads block in `read` until every writer of the pipe has closed it, and a process
//! the tool detaches (`setsid cmd &`) can keep the write end open for ever: every run then
//! left a process and two blocked threads behind. Polling both pipes from the calling thread
//! instead means reading stops whenever the runner decides (deadline, output cap, a short grace
//! after the tool exits), and nothing is left blocked. The pipes' inodes identify the
//! processes that still hold them, so those can be killed.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use super::sys;

/// Bytes read from a pipe in one call: the default Linux pipe buffer.
const CHUNK: usize = 64 * 1024;

/// A stream printed more than the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Overflow;

/// One open pipe.
#[derive(Debug)]
struct Stream {
    file: File,
    /// The pipe's inode, as `/proc/<pid>/fd` links name it (`pipe:[<inode>]`).
    inode: Option<u64>,
}

/// A tool's stdout and stderr while it runs, and what they printed so far.
#[derive(Debug)]
pub(super) struct Pipes {
    /// Index 0 is stdout, 1 is stderr; `None` once the pipe is closed (or never existed).
    streams: [Option<Stream>; 2],
    captured: [Vec<u8>; 2],
    cap: usize,
    chunk: Vec<u8>,
}

impl Pipes {
    /// Takes the read ends of a tool's stdout and stderr; each is capped at `cap` bytes.
    pub(super) fn new(stdout: Option<File>, stderr: Option<File>, cap: usize) -> Self {
        let stream = |file: File| {
            let inode = file.metadata().ok().map(|meta| meta.ino());
            Stream { file, inode }
        };
        Self {
            streams: [stdout.map(stream), stderr.map(stream)],
            captured: [Vec::new(), Vec::new()],
            cap,
            chunk: vec![0; CHUNK],
        }
    }

    /// True when both pipes have reached end of file (every writer closed them).
    pub(super) fn all_closed(&self) -> bool {
        self.streams.iter().all(Option::is_none)
    }

    /// Waits up to `wait` for output and reads what is there. A pipe at end of file, or one
    /// that fails, is closed.
    pub(super) fn poll(&mut self, wait: Duration) -> Result<(), Overflow> {
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(2);
        let mut which: Vec<usize> = Vec::with_capacity(2);
        for (index, stream) in self.streams.iter().enumerate() {
            if let Some(stream) = stream {
                fds.push(libc::pollfd {
                    fd: stream.file.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                which.push(index);
            }
        }
        if fds.is_empty() {
            return Ok(());
        }
        if sys::poll(&mut fds, wait).is_err() {
            // poll itself failed (it does not for valid descriptors): stop reading rather
            // than spin; what was captured so far stands.
            self.streams = [None, None];
            return Ok(());
        }
        for (fd, index) in fds.iter().zip(which) {
            if fd.revents != 0 {
                self.read_once(index)?;
            }
        }
        Ok(())
    }

    /// Keeps reading until both pipes close or `until` passes, then stops reading for good.
    pub(super) fn drain_until(&mut self, until: Instant) -> Result<(), Overflow> {
        loop {
            let now = Instant::now();
            if self.all_closed() || now >= until {
                break;
            }
            self.poll(until - now)?;
        }
        self.streams = [None, None];
        Ok(())
    }

    /// Kills the processes that still hold the write end of a pipe still open here.
    pub(super) fn kill_holders(&self) {
        let inodes: Vec<u64> = self
            .streams
            .iter()
            .flatten()
            .filter_map(|stream| stream.inode)
            .collect();
        sys::kill_pipe_writers(&inodes);
    }

    /// What stdout and stderr printed.
    pub(super) fn into_output(self) -> [Vec<u8>; 2] {
        self.captured
    }

    /// Reads once from a pipe that poll reported ready: data, end of file, or an error.
    fn read_once(&mut self, index: usize) -> Result<(), Overflow> {
        let Some(stream) = &mut self.streams[index] else {
            return Ok(());
        };
        match stream.file.read(&mut self.chunk) {
            Ok(0) => self.streams[index] = None,
            Ok(n) => {
                let captured = &mut self.captured[index];
                if captured.len() + n > self.cap {
                    return Err(Overflow);
                }
                captured.extend_from_slice(&self.chunk[..n]);
            }
            Err(err) if matches!(err.kind(), ErrorKind::Interrupted | ErrorKind::WouldBlock) => {}
            Err(_) => self.streams[index] = None,
        }
        Ok(())
    }
}
