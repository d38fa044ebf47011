//! What a sweep pass reads before it plans: this node as it is now, what
//! it holds, the fleet's priority order over the nodes present, the
//! nodes whose presence is fading, and its claim and give-back paces (set
//! for the next pass from what this one did).

use std::collections::{BTreeMap, BTreeSet};

use crate::coord::Lease;
use crate::seat::pace;
use crate::seat::placement::{self, Presence, Snapshot};
use crate::seat::ranking;
use crate::watchdog::{Progress, beat_while, stamp_interval};

use super::{SeatEngine, presence_of, seat_specs};

impl SeatEngine {
    /// This pass's snapshot from the presence rows it read: this node as
    /// it is now, what it holds, the counts and hints it keeps between
    /// passes, and the fleet's priority order over the nodes present.
    pub(super) async fn snapshot(
        &self,
        presence_leases: &[Lease],
        progress: &Progress<'_>,
    ) -> Snapshot {
        let seats = self.with_company(seat_specs);
        let fading = self.fading(presence_leases).await;
        progress();
        let mut presence: Vec<Presence> = presence_leases.iter().filter_map(presence_of).collect();
        // This node as it is now, whatever its row said a heartbeat ago.
        presence.retain(|p| p.node_id != self.cfg.node_id);
        let withdrawn = self.withdrawn.load(std::sync::atomic::Ordering::SeqCst);
        if !self.host.is_draining() {
            presence.push(Presence {
                node_id: self.cfg.node_id.clone(),
                labels: self.cfg.labels.clone(),
                withdrawn,
                seats_held: Some(
                    self.seats_held_count(seats.iter().map(|s| s.handle.as_str())) as u32,
                ),
            });
        }
        let mut snap = Snapshot {
            node_id: self.cfg.node_id.clone(),
            labels: self.cfg.labels.clone(),
            seats,
            presence,
            held: self.host.held().into_iter().collect(),
            undead: self.host.undead().into_iter().collect(),
            held_elsewhere: BTreeSet::new(),
            draining: self.host.is_draining(),
            behind: self.behind.load(std::sync::atomic::Ordering::SeqCst),
            unserviceable: withdrawn,
            claim_limit: self.claim_pace.load(std::sync::atomic::Ordering::SeqCst),
            release_limit: self.release_pace.load(std::sync::atomic::Ordering::SeqCst),
            ranking: Vec::new(),
            deferred: self
                .deferred
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            moves: BTreeMap::new(),
            handed_back: self.spend_handed_back_pass(),
            leased_to: BTreeMap::new(),
            fading,
            rechecked: self
                .rechecked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        };
        snap.ranking = self.ranking(presence_leases, progress).await;
        progress();
        snap
    }

    /// The fleet's one priority order (never a private one), applied to
    /// the nodes present; an unreadable order ranks nobody. Each read may
    /// wait out the store's bound: the pass beats while it waits (a sweep
    /// reading when the nodes were first seen and then their order, each
    /// unanswered for 2 s, was shot as wedged: soak seed 12062).
    pub(super) async fn ranking(
        &self,
        presence_leases: &[Lease],
        progress: &Progress<'_>,
    ) -> Vec<String> {
        let every = stamp_interval(self.watchdog.threshold());
        let mut present =
            beat_while(progress, every, None, self.first_seen_kept(presence_leases)).await;
        if !present.iter().any(|(id, _)| *id == self.cfg.node_id) && !self.host.is_draining() {
            present.push((
                self.cfg.node_id.clone(),
                crate::coord::StoreTime::from_unix_nanos(i64::MAX),
            ));
        }
        match beat_while(progress, every, None, ranking::read(&*self.store)).await {
            Ok(order) => {
                let saved = order.map(|(o, _)| o.nodes).unwrap_or_default();
                ranking::effective_order(&saved, &present)
            }
            Err(e) => {
                tracing::warn!(error = %e, "the node order cannot be read; ranking nobody this pass");
                Vec::new()
            }
        }
    }

    /// The nodes whose presence is fading (see [`Snapshot::fading`]): rows
    /// not renewed for two heartbeats, and rows the last pass read that
    /// are gone now. Remembers this roster for the next pass.
    pub(super) async fn fading(&self, presence: &[Lease]) -> BTreeSet<String> {
        let roster: BTreeSet<String> = presence
            .iter()
            .filter_map(|l| l.resource.strip_prefix("node:").map(str::to_string))
            .filter(|id| *id != self.cfg.node_id)
            .collect();
        let mut fading: BTreeSet<String> = {
            let mut seen = self.roster_seen.lock().unwrap_or_else(|e| e.into_inner());
            let gone = seen.difference(&roster).cloned().collect();
            *seen = roster;
            gone
        };
        if let Ok(now) = self.store.now().await {
            let stale = self.cfg.heartbeat * 2;
            for l in presence {
                let left = l.expires_at.since(now);
                let Some(id) = l.resource.strip_prefix("node:") else {
                    continue;
                };
                if id != self.cfg.node_id && l.ttl.saturating_sub(left) > stale {
                    fading.insert(id.to_string());
                }
            }
        }
        fading
    }

    /// Set the next pass's claim and give-back paces from what this one
    /// did (`claims`: tried and won; `releases`: given back and handed
    /// over); true when either wants the next pass soon ([`pace`]).
    pub(super) fn next_paces(
        &self,
        snap: &Snapshot,
        plan: &placement::Plan,
        claims: (usize, usize),
        releases: (usize, usize),
    ) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        let pace = pace::next(
            self.cfg.claim_limit,
            pace::PassTally {
                limit: snap.claim_limit,
                cut: plan.cut,
                tried: claims.0,
                won: claims.1,
            },
        );
        self.claim_pace.store(pace.limit, SeqCst);
        let give = pace::next_release(
            self.cfg.release_limit,
            pace::PassTally {
                limit: snap.release_limit,
                cut: plan.releases_cut,
                tried: releases.0,
                won: releases.1,
            },
        );
        self.release_pace.store(give.limit, SeqCst);
        pace.soon || give.soon
    }
}
