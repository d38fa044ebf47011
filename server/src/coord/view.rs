//! The live view of the leases bucket: a watch that takes in every write
//! (current values first, then changes), so the protocol gate costs the
//! same with ten leases held as with ten thousand.
//!
//! It owns one background task, started on demand and stopped once the view
//! has gone unused for `idle` (a minute as shipped), so a node that is not
//! claiming does not take in the fleet's heartbeats. An answer is given only
//! after the view has caught up with the bucket's last write as read from
//! the leader. Liveness is judged from `expires_at` on the store's clock:
//! server 2.9 sends no event when a key ages out.
//!
//! It must never answer from a view that is not level, never wait on the
//! stream's `last_seq` (after an expiry that points at a message that no
//! longer exists), and never outlive the owner's cancellation token.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;

use super::kv::{Backend, BucketId, RawEvent};
use super::lease::{Lease, LeaseRecord};
use super::{Revision, StoreError};
use crate::tasks::Tasks;

/// How often a waiting reader re-checks that the write it waits for still exists.
const RECHECK: Duration = Duration::from_millis(100);
/// How long a failed watch waits before it is opened again.
const REOPEN: Duration = Duration::from_millis(200);

#[derive(Default)]
struct ViewState {
    running: bool,
    leases: BTreeMap<String, Lease>,
    last_used: Option<tokio::time::Instant>,
}

/// The view, shared by every clone of its store.
pub struct LeaseView {
    state: Mutex<ViewState>,
    /// The highest revision applied; reset to 0 when the watch is reopened.
    applied: watch::Sender<Revision>,
    idle: Duration,
}

impl LeaseView {
    pub fn new(idle: Duration) -> Arc<LeaseView> {
        let (applied, _) = watch::channel(0);
        Arc::new(LeaseView {
            state: Mutex::new(ViewState::default()),
            applied,
            idle,
        })
    }

    fn lock(&self) -> MutexGuard<'_, ViewState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn running(&self) -> bool {
        self.lock().running
    }

    /// Mark a use, and start the task if it is not running.
    fn touch<B: Backend>(self: &Arc<Self>, backend: &Arc<B>, tasks: &Tasks) {
        let mut st = self.lock();
        st.last_used = Some(tokio::time::Instant::now());
        if st.running {
            return;
        }
        st.running = true;
        st.leases.clear();
        self.applied.send_replace(0);
        drop(st);
        let view = Arc::clone(self);
        let backend = Arc::clone(backend);
        tasks.spawn("coord_lease_view", async move { view.run(backend).await });
    }

    fn idle_expired(&self) -> bool {
        let st = self.lock();
        st.last_used.is_none_or(|t| t.elapsed() >= self.idle)
    }

    fn stop(&self) {
        let mut st = self.lock();
        st.running = false;
        st.leases.clear();
    }

    async fn run<B: Backend>(self: Arc<Self>, backend: Arc<B>) {
        let tick = (self.idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let mut idle_check = tokio::time::interval(tick);
        loop {
            let mut stream = match backend.watch(BucketId::Leases, "").await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "lease view: watch could not be opened");
                    tokio::time::sleep(REOPEN).await;
                    if self.idle_expired() {
                        self.stop();
                        return;
                    }
                    continue;
                }
            };
            loop {
                tokio::select! {
                    ev = stream.next() => match ev {
                        Some(Ok(ev)) => self.apply(ev, backend.lease_ttl()),
                        Some(Err(e)) => {
                            tracing::debug!(error = %e, "lease view: watch failed; reopening");
                            break;
                        }
                        None => break,
                    },
                    _ = idle_check.tick() => {
                        if self.idle_expired() {
                            tracing::debug!("lease view stopped: unused");
                            self.stop();
                            return;
                        }
                    }
                }
            }
            // Reopened from scratch: current values again, nothing stale kept.
            {
                let mut st = self.lock();
                st.leases.clear();
            }
            self.applied.send_replace(0);
            tokio::time::sleep(REOPEN).await;
        }
    }

    fn apply(&self, ev: RawEvent, ttl: Duration) {
        let rev = ev.revision();
        {
            let mut st = self.lock();
            match ev {
                RawEvent::Put(e) => match LeaseRecord::decode(&e.key, &e.value) {
                    Ok(rec) => {
                        let mut lease = Lease::resolve(rec, e.revision, e.written_at, Some(ttl));
                        lease.resource = e.key.clone();
                        st.leases.insert(e.key, lease);
                    }
                    Err(err) => {
                        tracing::warn!(key = %e.key, error = %err, "lease view: unreadable record ignored");
                        st.leases.remove(&e.key);
                    }
                },
                RawEvent::Delete { key, .. } => {
                    st.leases.remove(&key);
                }
            }
        }
        self.applied.send_if_modified(|a| {
            if rev > *a {
                *a = rev;
                true
            } else {
                false
            }
        });
    }

    /// Bring the view level with the bucket's last write (read from the
    /// leader), then hand `f` the leases it holds. Unbounded: the caller
    /// bounds it with the store timeout.
    pub async fn read<B: Backend, T>(
        self: &Arc<Self>,
        backend: &Arc<B>,
        tasks: &Tasks,
        f: impl FnOnce(&BTreeMap<String, Lease>) -> T,
    ) -> Result<T, StoreError> {
        self.touch(backend, tasks);
        if let Some(last) = backend.last_revision(BucketId::Leases, "").await? {
            let mut rx = self.applied.subscribe();
            loop {
                let waited = tokio::time::timeout(RECHECK, async {
                    rx.wait_for(|a| *a >= last).await.map(|_| ())
                })
                .await;
                match waited {
                    Ok(Ok(_)) => break,
                    Ok(Err(_)) => {
                        return Err(StoreError::Unavailable("the lease view stopped".into()));
                    }
                    Err(_) => {
                        // The write may have aged out before the view saw it.
                        if !backend.revision_exists(BucketId::Leases, last).await? {
                            break;
                        }
                        self.touch(backend, tasks);
                    }
                }
            }
        }
        let st = self.lock();
        Ok(f(&st.leases))
    }
}
