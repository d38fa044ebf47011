//! What a dispatch loop knows of its own subscription's depth — the
//! messages waiting for the seat, stored and not yet settled — without
//! asking the broker.
//!
//! A loop waiting in its fetch with nothing in hand has been given
//! everything the broker could give it: a message arriving ends the fetch
//! at once (JetStream's pull request, the twin's wake on every change). So
//! while it waits there, what still waits for the seat is only what the
//! loop itself handed back with a delay and is not yet due. Anywhere else
//! (a turn running, a closed gate, the first look after attach) mail may
//! be piling up unseen, and the loop says it does not know: the caller
//! asks the broker (one request for a seat that is working or paused —
//! cost that follows work, never one per idle seat per sweep).
//!
//! Not counted: deliveries a previous holder took and never settled (the
//! broker hands them back when their ack window runs out, and the loop
//! fetches them then).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A loop's depth, shared between the loop (which writes it) and its
/// [`Attachment`](super::Attachment) (which reads it).
#[derive(Clone, Default)]
pub(super) struct Depth(Arc<Mutex<Known>>);

#[derive(Default)]
struct Known {
    /// Fetches under way with nothing in hand ([`Depth::idle_while`]).
    idle_fetches: usize,
    /// When each delivery handed back with a delay is due again.
    delayed: Vec<Instant>,
}

impl Known {
    /// The depth at `now`, or `None` when the loop cannot know it.
    fn read(&self, now: Instant) -> Option<u64> {
        (self.idle_fetches > 0)
            .then(|| self.delayed.iter().filter(|due| **due > now).count() as u64)
    }
}

impl Depth {
    fn lock(&self) -> std::sync::MutexGuard<'_, Known> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Await `fetch`, the loop's fetch with nothing in hand: the depth is
    /// known until it ends (or is dropped).
    pub(super) async fn idle_while<F: std::future::Future>(&self, fetch: F) -> F::Output {
        self.lock().idle_fetches += 1;
        let _done = FetchEnd(self);
        fetch.await
    }

    /// Deliveries were handed back, each due again after its delay.
    pub(super) fn handed_back_after(&self, delays: &[Duration]) {
        if delays.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut known = self.lock();
        known.delayed.retain(|due| *due > now);
        known.delayed.extend(delays.iter().map(|d| now + *d));
    }

    /// The messages waiting for the seat, when the loop knows.
    pub(super) fn read(&self) -> Option<u64> {
        self.lock().read(Instant::now())
    }
}

/// Ends one idle fetch of a [`Depth`] when dropped.
struct FetchEnd<'a>(&'a Depth);

impl Drop for FetchEnd<'_> {
    fn drop(&mut self) {
        let mut known = self.0.lock();
        known.idle_fetches = known.idle_fetches.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_depth_is_known_only_while_the_loop_waits_in_its_fetch_and_counts_what_it_delayed() {
        let now = Instant::now();
        let mut known = Known::default();
        assert_eq!(known.read(now), None, "no fetch under way: unknown");
        known.idle_fetches = 1;
        assert_eq!(
            known.read(now),
            Some(0),
            "waiting with nothing in hand: empty"
        );
        known.delayed = vec![now + Duration::from_secs(5), now - Duration::from_secs(1)];
        assert_eq!(
            known.read(now),
            Some(1),
            "one hand-back still delayed, one due"
        );
        known.idle_fetches = 0;
        assert_eq!(known.read(now), None, "working or gated again: unknown");
    }

    #[tokio::test]
    async fn a_fetch_that_ends_or_is_dropped_leaves_the_depth_unknown() {
        let depth = Depth::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let fetch = {
            let depth = depth.clone();
            tokio::spawn(async move { depth.idle_while(rx).await })
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while depth.read().is_none() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the fetch never began"
            );
            tokio::task::yield_now().await;
        }
        depth.handed_back_after(&[Duration::from_secs(60)]);
        assert_eq!(depth.read(), Some(1));
        tx.send(()).expect("the fetch is waiting");
        fetch
            .await
            .expect("the fetch ends")
            .expect("it got its message");
        assert_eq!(depth.read(), None, "ended: unknown");

        let dropped = tokio::spawn({
            let depth = depth.clone();
            async move { depth.idle_while(std::future::pending::<()>()).await }
        });
        while depth.read().is_none() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the second fetch never began"
            );
            tokio::task::yield_now().await;
        }
        dropped.abort();
        let _ = dropped.await;
        assert_eq!(depth.read(), None, "dropped: unknown");
    }
}
