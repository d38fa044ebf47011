//! The one place a node spawns a task, and who owns each.
//!
//! Two kinds of owner. A node-lived task belongs to [`Tasks`]: shutdown
//! cancels one token, every such task stops at its next await on it, and
//! [`Tasks::shutdown`] waits for all of them. A task whose life is shorter
//! than the node's (a mailbox's dispatch loop, one handler run, a child's
//! stderr reader) belongs to whoever holds the [`JoinHandle`] that
//! [`spawn_held`] returns; the holder awaits or aborts it, and a task whose
//! handle is dropped ends with the thing it serves (its stream, its turn).
//! No task in the node is spawned any other way: `server/tests/it/architecture.rs`
//! fails on a `tokio::spawn` outside this file.

use std::future::Future;

use tokio::task::JoinHandle;
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

/// Spawn a task owned by the returned handle rather than by the node: the
/// caller awaits it, aborts it, or drops the handle once the task ends with
/// what it serves. `name` is logged when it finishes.
pub fn spawn_held<F>(name: &'static str, fut: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(async move {
        let out = fut.await;
        tracing::trace!(task = name, "held task finished");
        out
    })
}
