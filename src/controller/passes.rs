//! The "reconcile every placement" trigger, spaced so that each pass gets to run.
//!
//! kube-runtime's scheduler debounces per object: a request for an object that is already
//! scheduled moves it to `now + debounce`. A pass over every placement is such a request for
//! all of them, so passes that come faster than the debounce push every queued reconcile back
//! again and again. That is what a burst of new placements does: each reconcile that plans
//! older placements on its turn asks for a pass, and at 300 placements the scale run planned
//! them in waves half a second apart (all Planned 11.5 s after the first creation, the
//! controller idle most of that time). Spacing passes at least twice the debounce apart lets
//! each pass's reconciles come due and run before the next pass is sent; requests that
//! arrive meanwhile fold into that next pass, so none is lost.

use std::time::Duration;

use futures::Stream;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Passes from `requests`: the first at once, each later one at least `gap` after the one
/// before, with every request that came in between folded into it. Ends when every sender
/// is gone.
pub fn spaced(requests: mpsc::UnboundedReceiver<()>, gap: Duration) -> impl Stream<Item = ()> {
    futures::stream::unfold(
        (requests, None::<Instant>),
        move |(mut requests, last)| async move {
            requests.recv().await?;
            if let Some(last) = last {
                tokio::time::sleep_until(last + gap).await;
            }
            // Everything asked for while waiting is served by this one pass.
            while requests.try_recv().is_ok() {}
            Some(((), (requests, Some(Instant::now()))))
        },
    )
}

/// The gap between passes for a controller debouncing by `debounce`.
pub fn gap_for(debounce: Duration) -> Duration {
    debounce.saturating_mul(2)
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_first_pass_is_at_once_and_a_burst_becomes_one_more_pass_after_the_gap() {
        let (tx, rx) = mpsc::unbounded_channel();
        let gap = Duration::from_secs(1);
        let mut passes = Box::pin(spaced(rx, gap));
        let start = Instant::now();
        assert!(tx.send(()).is_ok());
        passes.next().await.expect("a pass");
        assert_eq!(start.elapsed(), Duration::ZERO);
        // A burst right after the first pass: one pass, a gap after the first.
        for _ in 0..50 {
            assert!(tx.send(()).is_ok());
        }
        passes.next().await.expect("a pass");
        assert_eq!(start.elapsed(), gap);
        // Nothing asked: no pass; a request long after the gap is served at once.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let asked = Instant::now();
        assert!(tx.send(()).is_ok());
        passes.next().await.expect("a pass");
        assert_eq!(asked.elapsed(), Duration::ZERO);
        drop(tx);
        assert!(passes.next().await.is_none(), "ends with its senders");
    }

    #[test]
    fn passes_are_spaced_twice_the_debounce() {
        assert_eq!(gap_for(Duration::from_millis(500)), Duration::from_secs(1));
        assert_eq!(gap_for(Duration::ZERO), Duration::ZERO);
    }
}
