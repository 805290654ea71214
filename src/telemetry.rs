//! Logging setup: JSON lines for the long-running agent and controller (what log pipelines in
//! a cluster expect), plain text for the one-shot CLI commands. `RUST_LOG` overrides the level.
//! `cli` makes [`LogFormat`] a flag value. Every line is bounded in size ([`bounded`]).

pub mod bounded;
#[cfg(test)]
pub(crate) mod capture;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;

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
    // A second call finds a subscriber installed and leaves it.
    let _ = match format {
        LogFormat::Json => json_subscriber(filter, bounded::BoundedStderr).try_init(),
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(bounded::BoundedStderr)
            .with_target(false)
            .finish()
            .try_init(),
    };
}

/// The JSON-lines subscriber: the event's fields flat, and under `spans` every span the line
/// was logged in with its fields, outermost first (`{"name":"reconcile","placement":"ml/p"}`),
/// which is how a line says which object it is about. `writer` is stderr in a pod and a
/// buffer in tests.
pub fn json_subscriber<W>(filter: EnvFilter, writer: W) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'writer> MakeWriter<'writer> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(true)
        .finish()
}
