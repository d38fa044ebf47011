//! This node's presence (`node:{id}`): its metadata, renewed every
//! heartbeat with every seat lease it holds, and its first-seen time kept
//! for the node order.

use std::sync::Arc;

use serde_json::json;
use tokio::time::Instant;

use crate::coord::{Claim, ClaimRequest, Lease, Metadata, Renewal};
use crate::seat::host::watched;
use crate::seat::ranking;
use crate::watchdog::stamp_interval;

use super::{PRESENCE_LAPSE_MARGIN, SeatEngine, first_seen};

impl SeatEngine {
    pub(super) fn presence_metadata(&self) -> Metadata {
        let (held, roles) =
            self.with_company(|c| (self.seats_held_count(c.handles()), self.roles_i_may_run(c)));
        let mut m = Metadata::new();
        m.insert("labels".into(), json!(self.cfg.labels));
        m.insert("version".into(), json!(crate::VERSION));
        m.insert("roles".into(), json!(roles));
        m.insert("seats_held".into(), json!(held));
        m.insert(
            "seats_withdrawn".into(),
            json!(self.withdrawn.load(std::sync::atomic::Ordering::SeqCst)),
        );
        m.insert("draining".into(), json!(self.host.is_draining()));
        m.insert(
            "behind".into(),
            json!(self.behind.load(std::sync::atomic::Ordering::SeqCst)),
        );
        m
    }

    /// The live nodes with when each was first seen: its kept record (read
    /// again only when a live node is one the last read did not name), else
    /// its presence lease's `acquired_at` — the same on every node.
    pub(super) async fn first_seen_kept(
        &self,
        presence: &[Lease],
    ) -> Vec<(String, crate::coord::StoreTime)> {
        let live = first_seen(presence);
        let missing = {
            let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            live.iter().any(|(id, _)| !seen.contains_key(id))
        };
        if missing {
            match ranking::seen(&*self.store).await {
                Ok(kept) => *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = kept,
                Err(e) => tracing::debug!(error = %e, "cannot read when the nodes were first seen"),
            }
        }
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        ranking::first_seen_kept(live, &seen)
    }

    /// Keep this node's first-seen time (its presence lease's
    /// `acquired_at`) once: create-only, so an earlier incarnation's stands.
    pub(super) async fn keep_first_seen(&self, lease: &Lease) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.seen_kept.load(SeqCst) {
            return;
        }
        match ranking::remember(&*self.store, &self.cfg.node_id, lease.acquired_at).await {
            Ok(()) => self.seen_kept.store(true, SeqCst),
            Err(e) => {
                tracing::debug!(error = %e, "cannot keep when this node was first seen; next heartbeat")
            }
        }
    }

    /// Claim or renew the presence lease (with fresh metadata).
    pub async fn refresh_presence(&self) {
        if self.host.is_draining() {
            return;
        }
        let mut presence = self.presence.lock().await;
        let meta = self.presence_metadata();
        if let Some(lease) = presence.as_ref() {
            match self
                .store
                .renew(lease, &self.cfg.owner, Some(meta.clone()))
                .await
            {
                Renewal::Renewed(l) => {
                    self.keep_first_seen(&l).await;
                    *presence = Some(l);
                    self.presence_recorded.send_replace(true);
                    return;
                }
                Renewal::Lost => *presence = None,
                Renewal::Unknown(e) => {
                    tracing::warn!(error = %e, "cannot renew this node's presence");
                    return;
                }
            }
        }
        let req = ClaimRequest::new(
            format!("node:{}", self.cfg.node_id),
            self.cfg.owner.clone(),
            self.cfg.node_id.clone(),
        )
        .with_protocol(self.cfg.protocol)
        .with_metadata(meta);
        match self.store.claim(req).await {
            Ok(Claim::Won(l)) => {
                self.keep_first_seen(&l).await;
                *presence = Some(l);
                let first = !self.presence_recorded.send_replace(true);
                if first
                    && self
                        .presence_free_at
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .take()
                        .is_some()
                {
                    // A restarted node: its earlier incarnation's seats came
                    // free with that row, and this node takes them first.
                    self.early.notify_one();
                }
            }
            Ok(Claim::HeldBy(l)) => {
                tracing::info!(
                    owner = %l.owner,
                    "this node id's presence is still held by an earlier incarnation; waiting for it to lapse"
                );
                if let Ok(now) = self.store.now().await {
                    let left = l.expires_at.since(now);
                    *self
                        .presence_free_at
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) =
                        Some(Instant::now() + left + PRESENCE_LAPSE_MARGIN);
                }
            }
            // A presence claim judges no gate.
            Ok(Claim::Gated { .. }) => {}
            Err(e) => tracing::warn!(error = %e, "cannot claim this node's presence"),
        }
    }

    pub(super) async fn heartbeat_loop(self: Arc<Self>) {
        let stamp = stamp_interval(self.watchdog.threshold()).min(self.cfg.heartbeat);
        let beat = self.watchdog.watch("heartbeat");
        let mut next = Instant::now();
        loop {
            beat.beat();
            if Instant::now() >= next {
                next = Instant::now() + self.cfg.heartbeat;
                // Presence and seats side by side, beating as each store
                // call settles: a slow store is not a wedged loop.
                let progress = || beat.beat();
                tokio::join!(
                    async {
                        watched(&progress, None, self.refresh_presence()).await;
                        beat.beat();
                    },
                    self.host.heartbeat_with(self.store.lease_ttl(), &progress)
                );
                beat.beat();
                // An earlier incarnation's row is claimed as it lapses.
                if !*self.presence_recorded.borrow()
                    && let Some(at) = *self
                        .presence_free_at
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                {
                    next = next.min(at.max(Instant::now()));
                }
            }
            tokio::time::sleep(stamp.min(next.saturating_duration_since(Instant::now()))).await;
        }
    }
}
