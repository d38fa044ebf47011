//! Seats handed over in two phases, as the taking side sees them: offers
//! read and judged (the protocol gate, the placement), moves asked by
//! people, seats given back to a better-placed peer and the refusals
//! remembered.

use crate::watchdog::Progress;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use futures::StreamExt;

use crate::coord::StateBucket;
use crate::events::{DetachReason, Event};
use crate::seat::host::watched;
use crate::seat::host::{Acquired, HandOff, OfferNotice, notice_prefix};
use crate::seat::placement::matches_placement;
use crate::seat::placement::{self, Snapshot};

use super::{REFUSED_FOR, SeatEngine};

impl SeatEngine {
    /// Offers made to this node, as their notices arrive: each is
    /// considered (and taken) in its own task.
    pub(super) async fn offers_loop(self: Arc<Self>) {
        let prefix = notice_prefix(&self.cfg.node_id);
        loop {
            match self.store.watch(StateBucket::Handoffs, &prefix).await {
                Ok(mut stream) => {
                    while let Some(ev) = stream.next().await {
                        match ev {
                            Ok(crate::coord::Event::Put(e)) => {
                                match serde_json::from_slice::<OfferNotice>(&e.value) {
                                    Ok(n) => {
                                        // Watched until it ends: a take
                                        // holds the seat's lock and, won,
                                        // its lease.
                                        let pulse = crate::watchdog::Pulse::new();
                                        self.watchdog.follow(
                                            &format!("take-offer:{}", n.seat),
                                            pulse.clone(),
                                        );
                                        let me = self.clone();
                                        self.tasks.spawn("take-offer", async move {
                                            let _end = pulse.end_on_drop();
                                            me.consider_offer(n, &|| pulse.beat()).await
                                        });
                                    }
                                    Err(err) => {
                                        tracing::warn!(key = %e.key, error = %err, "an unreadable offer notice; ignored")
                                    }
                                }
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!(error = %e, "the offers watch failed; opening it again");
                                break;
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch for offers made to this node; trying again")
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The protocol gate refused a claim at `floor`: say so once for the
    /// pass it ends (`seat_claims_blocked_by_older_protocol`, naming the
    /// nodes below this node's protocol) and show it on the node's page.
    pub(super) async fn report_gate(&self, floor: u32) {
        self.set_claims_blocked_by(Some(floor));
        let nodes = self.nodes_below_protocol().await;
        self.events.emit(Event::SeatClaimsBlockedByOlderProtocol {
            floor,
            protocol: self.cfg.protocol,
            nodes,
        });
    }

    /// The protocol gate before taking an offer, judged from the live view
    /// of the lease bucket: `false` while a live presence or seat lease is
    /// held at a lower protocol (reported as by [`Self::report_gate`]) or
    /// the floor cannot be read. A claim judges the gate itself, and only
    /// once its seat reads free (spec § Mixed-version fleets: a claim on a
    /// seat a peer holds judges no gate); an offered seat is held by its
    /// giver, so a take asks first.
    pub(super) async fn protocol_gate_open(&self, progress: &Progress<'_>) -> bool {
        let floor = self.store.protocol_floor(self.cfg.protocol).await;
        progress();
        match floor {
            Ok(Some(floor)) => {
                self.report_gate(floor).await;
                false
            }
            Ok(None) => {
                self.set_claims_blocked_by(None);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "the protocol floor cannot be read; claiming nothing now");
                false
            }
        }
    }

    /// Take an offered seat if this node may run it now, calling
    /// `progress` as each step settles (the take's watchdog beat).
    pub(super) async fn consider_offer(&self, n: OfferNotice, progress: &Progress<'_>) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.host.is_draining() || self.withdrawn.load(SeqCst) || self.behind.load(SeqCst) {
            return;
        }
        let company = self.company();
        let Some(role) = company.roles.iter().find(|r| r.handle == n.seat) else {
            return;
        };
        if !matches_placement(&self.cfg.node_id, &self.cfg.labels, &role.placement) {
            return;
        }
        // Taking an offer makes this node the seat's holder: the gate holds
        // here as for a claim (the offer lapses, the giver runs the seat on).
        if !self.protocol_gate_open(progress).await {
            return;
        }
        match self.host.take_offer(&n.seat, &n.offer_id, progress).await {
            Ok(Acquired::Won {
                established: true, ..
            }) => {
                watched(progress, None, self.refresh_presence()).await;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(seat = %n.seat, error = %e, "an offered seat was not taken")
            }
        }
    }

    /// A person's move request wakes a pass at once on every node (the
    /// holder hands off, or the target claims a free seat).
    pub(super) async fn moves_loop(self: Arc<Self>) {
        let mut rx = self.events.subscribe();
        loop {
            match rx.recv().await {
                Ok(f) => {
                    if matches!(f.event, Event::SeatMoveRequested { .. }) {
                        self.early.notify_one();
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return,
            }
        }
    }

    pub(super) fn refused_for(&self, seat: &str) -> BTreeSet<String> {
        let mut r = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        r.retain(|_, (_, until)| *until > now);
        r.get(seat).map(|(n, _)| n.clone()).into_iter().collect()
    }

    pub(super) fn refuse(&self, seat: &str, node: &str) {
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                seat.to_string(),
                (node.to_string(), Instant::now() + REFUSED_FOR),
            );
    }

    /// Give `handle` back for `reason`: offered to a successor first when
    /// one is eligible (the two-phase handoff), released otherwise. Returns
    /// whether the seat left this node.
    pub(super) async fn give_back(
        &self,
        snap: &Snapshot,
        handle: &str,
        reason: DetachReason,
        offered: &Mutex<BTreeMap<String, usize>>,
        progress: &Progress<'_>,
    ) -> bool {
        let handoff = self.cfg.handoff;
        let voluntary = matches!(
            reason,
            DetachReason::Rebalance
                | DetachReason::PlacementMoved
                | DetachReason::Unserviceable
                | DetachReason::Drain
        );
        if handoff.two_phase
            && voluntary
            && let Some(spec) = snap.seats.iter().find(|s| s.handle == handle)
        {
            let to = {
                let o = offered.lock().unwrap_or_else(|e| e.into_inner());
                placement::successor(snap, spec, &self.refused_for(handle), &o)
            };
            if let Some(to) = to {
                *offered
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(to.clone())
                    .or_default() += 1;
                match self
                    .host
                    .hand_off(handle, &to, reason, handoff.timeout, progress)
                    .await
                {
                    HandOff::Taken { .. } | HandOff::Lost => return true,
                    HandOff::Withdrawn => {
                        self.refuse(handle, &to);
                        // A drain cannot wait for another pass.
                        if reason != DetachReason::Drain {
                            return false;
                        }
                    }
                    HandOff::NotOffered(why) => {
                        if self.host.is_offered(handle) {
                            // Another handoff of it (the sweep's, during a
                            // drain) is under way: it settles the seat.
                            return true;
                        }
                        tracing::info!(seat = handle, to = %to, why = %why, "no handoff; releasing the seat instead");
                    }
                }
            }
        }
        self.host.release_with(handle, reason, progress).await;
        true
    }

    /// The nodes holding a live presence or seat lease below this node's
    /// protocol, read from the live view the refusal was just judged from:
    /// the refusal names them (an unreadable view names none, and says so).
    pub(super) async fn nodes_below_protocol(&self) -> Vec<String> {
        let read = async {
            let now = self.store.now().await?;
            let leases = self.store.view("").await?;
            Ok::<_, crate::coord::StoreError>(crate::coord::lease::nodes_below(
                &leases,
                now,
                self.cfg.protocol,
            ))
        };
        match read.await {
            Ok(nodes) => nodes,
            Err(e) => {
                tracing::warn!(error = %e, "the nodes below this node's protocol cannot be read; the refusal names none");
                Vec::new()
            }
        }
    }

    pub(super) fn set_claims_blocked_by(&self, floor: Option<u32>) {
        *self
            .claims_blocked_by
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = floor;
    }
}
