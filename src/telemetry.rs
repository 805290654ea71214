//! Logging setup: JSON lines for the long-running agent and controller (what log pipelines in
//! a cluster expect), plain text for the one-shot CLI commands. `RUST_LOG` overrides the level.
//! `cli` makes [`LogFormat`] a flag value. Every line is bounded in size ([`bounded`]).

pub mod bounded;

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One JSON object per line.
    #[default]
    Json,
    /// Human-readable text.
    Text,
}

/// Installs the global tracing subscriber writing to stderr. `default_level` applies when
/// `RUST_LOG` is unset (e.g. `info`, or `hwaccel=debug,kube=info`). Calling it twice is
/// harmless: the second call does nothing.
pub fn init(format: LogFormat, default_level: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(bounded::BoundedStderr);
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
        LogFormat::Text => builder.with_target(false).try_init(),
    };
}
