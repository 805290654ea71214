//! Ending a long-running command within its grace period, whatever it is doing.
//!
//! On SIGTERM the agent and the controller stop their loops and wait for them, but a loop can be
//! stuck where no stop request reaches it: a detection thread blocked on a read (a FIFO in the
//! host tree), an API call that never returns. Such a process once ignored SIGTERM for 10
//! minutes, until the kubelet killed it. So the wait is bounded twice:
//!
//! 1. [`finish_within`] waits for the graceful stop until shortly before the deadline (or a
//!    second signal), then gives up on it;
//! 2. the runtime is then dropped with [`close_runtime`], which does not wait for blocking
//!    threads (a plain drop of a tokio runtime waits for every one of them, for ever);
//! 3. a watchdog on its own OS thread, armed with the first signal, exits the process at the
//!    deadline whatever the runtime's threads are doing.
//!
//! The default timeout sits below the kubelet's grace period (`terminationGracePeriodSeconds`,
//! 30 s unless the pod sets it) so that the process ends by itself, with a log line saying
//! why, before the kubelet's SIGKILL.

use std::time::Duration;

/// Default for `--shutdown-timeout`: 5 s under the kubelet's default 30 s grace period.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(25);

/// What is kept back from the graceful wait for closing the runtime and exiting.
const EXIT_MARGIN: Duration = Duration::from_millis(1500);

/// Arms the hard deadline, then waits for `stopping` (the graceful stop, already requested)
/// until shortly before it. `None` when it did not finish in time or a second signal came; the
/// caller then returns at once and closes the runtime with [`close_runtime`].
pub async fn finish_within<T>(timeout: Duration, stopping: impl Future<Output = T>) -> Option<T> {
    arm_deadline(timeout);
    let patience = timeout.saturating_sub(EXIT_MARGIN);
    tokio::select! {
        finished = tokio::time::timeout(patience, stopping) => {
            if finished.is_err() {
                tracing::error!(
                    timeout_secs = timeout.as_secs_f64(),
                    "graceful shutdown did not finish in time; exiting without it"
                );
            }
            finished.ok()
        }
        () = crate::signals::terminated() => {
            tracing::warn!("second termination signal; exiting without finishing the graceful shutdown");
            None
        }
    }
}

/// Exits the process `timeout` from now if it is still running then. A plain thread, not a
/// task: the runtime's own threads may be the ones that are stuck.
pub fn arm_deadline(timeout: Duration) {
    let armed = std::thread::Builder::new()
        .name("hwaccel-shutdown-deadline".into())
        .spawn(move || {
            std::thread::sleep(timeout);
            tracing::error!(
                timeout_secs = timeout.as_secs_f64(),
                "shutdown deadline reached; exiting now"
            );
            std::process::exit(1);
        });
    if let Err(err) = armed {
        // Without a watchdog thread the bounded waits above still apply.
        tracing::warn!(error = %err, "could not start the shutdown watchdog");
    }
}

/// Drops the runtime without waiting for blocking threads that are stuck (they end with the
/// process).
pub fn close_runtime(runtime: tokio::runtime::Runtime) {
    runtime.shutdown_timeout(EXIT_MARGIN / 3);
}
