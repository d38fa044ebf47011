//! The one owner of every task a node spawns.
//!
//! Shutdown cancels one token; every task spawned here stops at its next
//! await on that token, and [`Tasks::shutdown`] waits for all of them. No
//! task in the node is spawned any other way.

use std::future::Future;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Clone, Default)]
pub struct Tasks {
    token: CancellationToken,
    tracker: TaskTracker,
}

impl Tasks {
    pub fn new() -> Tasks {
        Tasks::default()
    }

    /// The token that says "stop".
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Spawn `fut`; it is dropped when shutdown begins.
    pub fn spawn<F>(&self, name: &'static str, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let token = self.token.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                _ = token.cancelled() => tracing::debug!(task = name, "task stopped"),
                _ = fut => tracing::debug!(task = name, "task finished"),
            }
        });
    }

    /// Spawn a task that watches the stop token itself, so it can finish
    /// its last step and give back what it holds; shutdown waits for it.
    pub fn spawn_owned<F, Fut>(&self, name: &'static str, f: F)
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let fut = f(self.token.clone());
        self.tracker.spawn(async move {
            fut.await;
            tracing::debug!(task = name, "task finished");
        });
    }

    /// Ask every task to stop and wait until they have.
    pub async fn shutdown(&self) {
        self.token.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}
