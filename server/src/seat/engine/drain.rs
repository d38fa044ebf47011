//! A drain: every held seat handed to a peer (a few at a time) or, if
//! none takes it, released, before the node stops — within a bound that
//! does not grow with the seats held; what is left then is abandoned and
//! lapses at its TTL, as a dead owner's leases do.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use futures::StreamExt;

use crate::events::{DetachReason, Event};
use crate::seat::placement::{Presence, Snapshot};
use crate::seat::ranking;

use super::{DRAIN_HANDOFFS, SeatEngine, presence_of, seat_specs};

/// Pure: how long a drain offers its seats to successors. A seat not yet
/// offered by then is released (flushed, then given up; a peer claims it
/// on its next sweep), so a drain's length does not grow with the seats
/// held times the hand-off's bound when offers go untaken: a slow or
/// refusing successor (a loaded fleet, a protocol gate) once kept a
/// draining node of 20 seats past 30 s (chaos seed 5004 under load).
pub fn drain_offers_for(handoff_timeout: Duration) -> Duration {
    handoff_timeout * 2
}

/// Pure: how long a whole drain may take before the seats it has not
/// handed over or released are abandoned. The TTL: by then the leases the
/// drain's first renewal extended have lapsed, so going on gains a peer
/// nothing — and a stop ends within the TTL whatever the seats held and
/// whether or not the store answers (1,000 seats a node, the server gone
/// as the stop began: 87 s, past systemd's 90 s default, growing with the
/// seats). Never shorter than the offering time and one hand-off after it.
pub fn drain_bound(ttl: Duration, handoff_timeout: Duration) -> Duration {
    ttl.max(drain_offers_for(handoff_timeout) + handoff_timeout)
}

impl SeatEngine {
    /// Graceful shutdown is a drain: presence given up first, every seat
    /// released voluntarily, then the loops stop. No peer waits a TTL —
    /// unless the drain reaches [`drain_bound`]: then no further seat is
    /// begun, those under way get one hand-off's time to end, and what is
    /// left is abandoned (its leases lapse at their TTL) once its turn in
    /// flight, if any, has finished — for up to one more hand-off's time
    /// ([`crate::seat::host::SeatHost::let_go_at_bound`]).
    pub async fn drain(&self) {
        self.watchdog.disarm();
        self.host.begin_drain();
        self.events.emit(Event::NodeDraining {});
        let handoff = self.cfg.handoff.timeout;
        let bound = drain_bound(self.store.lease_ttl(), handoff);
        let stop_starting = AtomicBool::new(false);
        let work = self.let_every_seat_go(&stop_starting);
        tokio::pin!(work);
        if tokio::time::timeout(bound, &mut work).await.is_ok() {
            self.tasks.shutdown().await;
            return;
        }
        // Past the bound no seat starts being let go; the hand-offs and
        // releases under way get one hand-off's time to end, since one cut
        // in its teardown flushes no memory for its successor (chaos ci
        // profile under load: a release cut by the bound lost an episode).
        stop_starting.store(true, Ordering::SeqCst);
        let _ = tokio::time::timeout(handoff, &mut work).await;
        let left = self.host.held().len() + self.host.undead().len();
        tracing::warn!(
            seats = left,
            bound_ms = bound.as_millis() as u64,
            "the drain reached its bound: the seats not handed over or released are abandoned; their leases lapse at the TTL and a peer claims them then"
        );
        self.tasks.shutdown().await;
        self.host.let_go_at_bound(handoff).await;
    }

    /// The drain's work: give up presence, then offer or release every
    /// seat.
    /// Once `stop_starting` is set, no further seat is begun.
    async fn let_every_seat_go(&self, stop_starting: &AtomicBool) {
        // One renewal of every seat first, carrying the draining mark, so
        // the seats read as a draining node's once the presence is gone.
        self.host.heartbeat(self.store.lease_ttl()).await;
        if let Some(p) = self.presence.lock().await.take() {
            let _ = self.store.release(&p, &self.cfg.owner).await;
        }
        // Every seat is offered to a successor first (a drain is a
        // voluntary move), a few at a time, for a bounded time; released
        // when none is eligible, and once the offering time is over.
        let snap = self.drain_snapshot().await;
        let offered = Mutex::new(BTreeMap::new());
        let snap = &snap;
        let offered = &offered;
        let offers_until = Instant::now() + drain_offers_for(self.cfg.handoff.timeout);
        futures::stream::iter(self.host.held())
            .for_each_concurrent(DRAIN_HANDOFFS, |handle| async move {
                if stop_starting.load(Ordering::SeqCst) {
                    return;
                }
                match snap {
                    Some(snap) if Instant::now() < offers_until => {
                        self.give_back(snap, &handle, DetachReason::Drain, offered, &|| {})
                            .await;
                    }
                    _ => self.host.release(&handle, DetachReason::Drain).await,
                }
            })
            .await;
    }

    /// What a draining node knows for choosing successors: the live
    /// presence rows (this node's given up), the seats, the order.
    pub(super) async fn drain_snapshot(&self) -> Option<Snapshot> {
        if !self.cfg.handoff.two_phase {
            return None;
        }
        let leases = self.store.list("node:").await.ok()?;
        let presence: Vec<Presence> = leases
            .iter()
            .filter_map(presence_of)
            .filter(|p| p.node_id != self.cfg.node_id)
            .collect();
        let present = self.first_seen_kept(&leases).await;
        let saved = ranking::read(&*self.store)
            .await
            .ok()
            .flatten()
            .map(|(o, _)| o.nodes)
            .unwrap_or_default();
        let company = self.company();
        Some(Snapshot {
            node_id: self.cfg.node_id.clone(),
            labels: self.cfg.labels.clone(),
            seats: seat_specs(&company),
            presence,
            draining: true,
            ranking: ranking::effective_order(&saved, &present),
            ..Snapshot::default()
        })
    }
}
