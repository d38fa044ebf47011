//! The sweep: every `sweep` interval (or sooner, after a company change)
//! the live presence rows and seat leases are read, [`placement::plan`]
//! says what to do, and the pass releases, claims and hands over.

use crate::watchdog::Progress;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use crate::company::Company;
use crate::events::{DetachReason, Event};
use crate::seat::host::watched;
use crate::seat::host::{Acquired, HandOff};
use crate::seat::placement::matches_placement;
use crate::seat::placement::{self, Snapshot, Withheld};
use crate::seat::{moves, pass};
use crate::watchdog::{beat_while, stamp_interval};

use super::{CLAIMS_AT_ONCE, Done, SeatEngine};

/// What a pass's steps came to.
#[derive(Default)]
struct Tally {
    claimed: usize,
    released: usize,
    /// The releases were advertised on the presence row before a claim.
    advertised_releases: bool,
    /// The protocol gate refused a claim, at this floor.
    gated: Option<u32>,
    /// Claims tried, and of those won and established ([`crate::seat::pace`]).
    tried: usize,
    won: usize,
    /// Seats the plan gave back, and of those handed over or let go.
    gave: usize,
    handed: usize,
}

impl SeatEngine {
    /// One placement pass, calling `progress` as each store call and each
    /// release or claim settles (the sweep loop's watchdog beat: a pass
    /// that gives back and claims several seats can outlast the TTL while
    /// every step of it returns).
    ///
    /// True when the next pass should run [`placement::RECHECK_AFTER`] later:
    /// the pass left seats for a recheck, or free seats wait for this
    /// node beyond its claim pace ([`crate::seat::pace`]).
    pub(super) async fn sweep_pass(&self, progress: &Progress<'_>) -> bool {
        let began = std::time::Instant::now();
        let Some((snap, plan, standing)) = self.plan_pass(progress).await else {
            return false;
        };
        self.note_plan(&plan);
        let refused: BTreeMap<String, String> = standing
            .iter()
            .filter_map(|(m, _)| {
                let r = self.refused_for(&m.seat);
                r.into_iter().next().map(|n| (m.seat.clone(), n))
            })
            .collect();
        let steps = pass::steps(&snap, &plan, &standing, &refused);
        if !steps.iter().any(|s| matches!(s, pass::Step::Claim { .. })) {
            self.set_claims_blocked_by(None);
        }
        let Tally {
            claimed,
            released,
            advertised_releases,
            gated,
            tried,
            won,
            gave,
            handed,
        } = self.run_steps(&snap, &steps, progress).await;
        match gated {
            // Once per pass, however many of its claims the gate refused.
            Some(floor) => self.report_gate(floor).await,
            // A claim won: the gate was open.
            None if claimed > 0 => self.set_claims_blocked_by(None),
            None => {}
        }
        if released > 0 && !advertised_releases {
            watched(progress, None, self.refresh_presence()).await;
            progress();
        }
        if claimed > 0 {
            // Advertise the new count at the end of the pass (beating
            // while the presence write waits, as above).
            watched(progress, None, self.refresh_presence()).await;
            progress();
        }
        self.events.emit(Event::SeatSweep {
            held: self.host.held().len(),
            undead: self.host.undead().len(),
            capacity: plan.capacity,
            claimed,
            released,
            fleet_full: plan.withheld == Some(Withheld::FleetFull),
            duration_ms: began.elapsed().as_millis() as u64,
        });
        let soon = self.next_paces(&snap, &plan, (tried, won), (gave, handed));
        !plan.rechecks.is_empty() || soon
    }

    /// Run a pass's steps in order — claims side by side, at most
    /// [`CLAIMS_AT_ONCE`] at a time — until they end or one stops the
    /// claims (a drain, the protocol gate).
    async fn run_steps(
        &self,
        snap: &Snapshot,
        steps: &[pass::Step],
        progress: &Progress<'_>,
    ) -> Tally {
        let mut t = Tally::default();
        let offered = Mutex::new(BTreeMap::new());
        let mut next = 0;
        while let Some(step) = steps.get(next) {
            if matches!(step, pass::Step::AnnounceBehind | pass::Step::Claim { .. })
                && t.released > 0
                && !t.advertised_releases
            {
                // A seat given back is advertised in the release itself. The
                // presence write (bounded store calls, maybe behind the
                // heartbeat's on the presence lock) is waited on beating: a
                // sweep waiting out a NATS election here was shot as wedged.
                watched(progress, None, self.refresh_presence()).await;
                progress();
                t.advertised_releases = true;
            }
            // Claims side by side, a few at a time: a restarted node's
            // seats are established together, not one after another.
            let run: Vec<&pass::Step> = steps[next..]
                .iter()
                .take_while(|s| matches!(s, pass::Step::Claim { .. }))
                .take(CLAIMS_AT_ONCE)
                .collect();
            let done = if run.is_empty() {
                next += 1;
                let done = self.execute(snap, step, &offered, progress).await;
                if matches!(step, pass::Step::Release { .. }) {
                    t.gave += 1;
                    t.handed += usize::from(matches!(done, Done::Released));
                }
                vec![done]
            } else {
                next += run.len();
                let done = futures::future::join_all(
                    run.iter()
                        .map(|s| self.execute(snap, s, &offered, progress)),
                )
                .await;
                t.tried += run.len();
                t.won += done.iter().filter(|d| matches!(d, Done::Claimed)).count();
                done
            };
            progress();
            let mut stop = false;
            for d in done {
                match d {
                    Done::Released => t.released += 1,
                    Done::Claimed => t.claimed += 1,
                    Done::Nothing => {}
                    Done::StopClaims => stop = true,
                    Done::Gated(floor) => {
                        t.gated = Some(floor);
                        stop = true;
                    }
                }
            }
            if stop {
                break;
            }
        }
        t
    }

    /// Read what a pass decides on and plan it: the roster, this node as it
    /// is now, the fleet's priority order, the standing moves, and — only
    /// when the pass would claim — the seat leases and last holders. `None`
    /// when the roster cannot be read (a pass concludes nothing then).
    pub(super) async fn plan_pass(
        &self,
        progress: &Progress<'_>,
    ) -> Option<(Snapshot, placement::Plan, Vec<(moves::MoveRequest, u64)>)> {
        let presence_leases = match self.store.list("node:").await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "the roster cannot be read; this pass concludes nothing");
                return None;
            }
        };
        progress();
        let mut snap = self.snapshot(&presence_leases, progress).await;
        let standing = match moves::standing(&*self.store).await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "move requests cannot be read; this pass acts on none");
                Vec::new()
            }
        };
        progress();
        snap.moves = standing
            .iter()
            .map(|(m, _)| (m.seat.clone(), m.to.clone()))
            .collect();
        let mut plan = placement::plan(&snap);
        // Only a pass that would claim reads the seat leases: a full node,
        // or a fleet whose presence counts say it is full, reads the
        // presence rows and nothing else (spec § Mixed-version fleets).
        if !plan.claims.is_empty() {
            let leases = self.store.list("seat:").await;
            progress();
            // The hint outlives the lease: a free seat's is its last
            // holder's, kept beside its epoch. Unread, there is no hint
            // this pass (stickiness, never a rule).
            let holders = match self.store.holders("seat:").await {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(error = %e, "the seats' last holders cannot be read; no stickiness this pass");
                    BTreeMap::new()
                }
            };
            progress();
            match leases {
                Ok(leases) => {
                    pass::with_seat_leases(&mut snap, &leases, &holders, &self.cfg.owner);
                    plan = placement::plan(&snap);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the seat leases cannot be read; claiming nothing this pass");
                    plan.claims.clear();
                }
            }
        }
        Some((snap, plan, standing))
    }

    /// Keep what the plan says for the next passes: the unplaceable seats
    /// (announced when they change), each deferred seat's count, and the
    /// seats left for a recheck.
    pub(super) fn note_plan(&self, plan: &placement::Plan) {
        {
            let mut last = self
                .last_unplaceable
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if *last != plan.unplaceable {
                if !plan.unplaceable.is_empty() {
                    self.events.emit(Event::SeatsUnplaceable {
                        seats: plan.unplaceable.clone(),
                    });
                }
                *last = plan.unplaceable.clone();
            }
        }
        {
            let mut d = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
            let before = std::mem::take(&mut *d);
            for h in &plan.deferred {
                d.insert(h.clone(), before.get(h).copied().unwrap_or(0) + 1);
            }
        }
        *self.rechecked.lock().unwrap_or_else(|e| e.into_inner()) =
            plan.rechecks.iter().cloned().collect();
    }

    /// A move done: its request removed, the pass beating while the store
    /// answers (it may wait out the store's bound).
    async fn finish_move(&self, seat: &str, revision: u64, progress: &Progress<'_>) {
        let every = stamp_interval(self.watchdog.threshold());
        beat_while(
            progress,
            every,
            None,
            moves::finish(&*self.store, seat, revision),
        )
        .await;
    }

    /// Carry out one step of a pass.
    pub(super) async fn execute(
        &self,
        snap: &Snapshot,
        step: &pass::Step,
        offered: &Mutex<BTreeMap<String, usize>>,
        progress: &Progress<'_>,
    ) -> Done {
        use pass::Step;
        match step {
            Step::Release { seat, reason } => {
                if self.give_back(snap, seat, *reason, offered, progress).await {
                    return Done::Released;
                }
            }
            Step::FinishMove { seat, revision } => {
                self.finish_move(seat, *revision, progress).await;
            }
            Step::HandOff {
                seat,
                to,
                revision: _,
            } => {
                if !self.host.held().contains(seat) {
                    return Done::Nothing;
                }
                match self
                    .host
                    .hand_off(
                        seat,
                        to,
                        DetachReason::Moved,
                        self.cfg.handoff.timeout,
                        progress,
                    )
                    .await
                {
                    HandOff::Taken { .. } | HandOff::Lost => return Done::Released,
                    HandOff::Withdrawn => self.refuse(seat, to),
                    HandOff::NotOffered(why) => {
                        tracing::warn!(seat = %seat, to = %to, why = %why, "cannot hand the seat to its requested node")
                    }
                }
            }
            Step::ClaimMoved { seat, revision } => {
                let free = matches!(self.store.lease(&format!("seat:{seat}")).await, Ok(None));
                progress();
                if free {
                    match self.host.claim_with(seat, progress).await {
                        Ok(Acquired::Won {
                            established: true, ..
                        }) => self.finish_move(seat, *revision, progress).await,
                        Ok(Acquired::Gated { floor }) => return Done::Gated(floor),
                        _ => {}
                    }
                }
            }
            Step::AnnounceBehind => self.events.emit(Event::SeatClaimsWithheld {
                reason: "behind".into(),
            }),
            Step::Claim { seat } => {
                // The claim judges the protocol gate once the seat reads
                // free; a refusal ends the pass.
                let claim = self.host.claim_with(seat, progress).await;
                progress();
                match claim {
                    Ok(Acquired::Won {
                        established: true, ..
                    }) => return Done::Claimed,
                    Ok(Acquired::Won {
                        established: false, ..
                    }) => {
                        // Handed back by its acquire hook: a peer gets the
                        // next passes at it.
                        self.handed_back
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(seat.clone(), placement::HANDED_BACK_PASSES);
                    }
                    Ok(Acquired::HeldBy(_)) => {}
                    Ok(Acquired::Gated { floor }) => return Done::Gated(floor),
                    Ok(Acquired::Draining) => return Done::StopClaims,
                    Err(e) => {
                        tracing::warn!(seat = %seat, error = %e, "claim failed; unknown ownership is not ownership")
                    }
                }
            }
        }
        Done::Nothing
    }

    pub(super) fn roles_i_may_run(&self, company: &Company) -> Vec<String> {
        company
            .roles
            .iter()
            .filter(|r| matches_placement(&self.cfg.node_id, &self.cfg.labels, &r.placement))
            .map(|r| r.handle.clone())
            .collect()
    }

    /// Seat leases held here (run or undead), counting only seats of the
    /// active revision: a lease on a seat whose role is gone stands in for
    /// no free one, or every node would read the fleet as full.
    pub(super) fn seats_held_count<'a>(&self, seats: impl IntoIterator<Item = &'a str>) -> usize {
        let seats: BTreeSet<&str> = seats.into_iter().collect();
        self.host
            .held()
            .into_iter()
            .chain(self.host.undead())
            .filter(|h| seats.contains(h.as_str()))
            .count()
    }

    /// The seats this node could not establish and still leaves to its
    /// peers, spending one pass of each one's wait (a seat leaves the set
    /// once its passes are spent).
    pub(super) fn spend_handed_back_pass(&self) -> BTreeSet<String> {
        let mut h = self.handed_back.lock().unwrap_or_else(|e| e.into_inner());
        let left: BTreeSet<String> = h.keys().cloned().collect();
        h.retain(|_, n| {
            *n -= 1;
            *n > 0
        });
        left
    }
}
