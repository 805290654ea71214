//! Test helper: the JSON lines the production subscriber ([`super::json_subscriber`]) writes,
//! captured on this thread, so a test can check what a log line says (its fields and the
//! spans it was logged in).

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

use tracing::subscriber::DefaultGuard;
use tracing_subscriber::EnvFilter;

/// Log lines written on this thread while it lives.
pub struct Capture {
    buffer: Arc<Mutex<Vec<u8>>>,
    _guard: DefaultGuard,
}

struct Writer(Arc<Mutex<Vec<u8>>>);

impl Write for Writer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    /// Starts capturing the lines `filter` (an `EnvFilter` directive such as
    /// `hwaccel=debug`) lets through, on this thread (a current-thread tokio test runs its
    /// spawned tasks here too).
    pub fn start(filter: &str) -> Self {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = Arc::clone(&buffer);
        let subscriber =
            super::json_subscriber(EnvFilter::new(filter), move || Writer(Arc::clone(&writer)));
        Self {
            buffer,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    /// Every line so far, parsed; a line that is not JSON is a failed test.
    pub fn lines(&self) -> Vec<serde_json::Value> {
        let text = self
            .buffer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        String::from_utf8_lossy(&text)
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
            .collect()
    }
}
