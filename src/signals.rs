//! Waiting for the signals that ask a long-running process to stop.

/// Completes on SIGTERM (what the kubelet sends) or SIGINT (Ctrl-C).
pub async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut sigterm) => {
            tokio::select! {
                _ = sigterm.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        // Without a SIGTERM handler, Ctrl-C still works.
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
