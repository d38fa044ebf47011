//! One sweep pass as a plan: the ordered steps a pass takes, decided from
//! its snapshot, the placement plan and the standing move requests, by
//! pure functions. `seat::engine` (the sweep) reads what the snapshot needs, asks
//! [`steps`] what to do and executes the steps in order; the tests below
//! assert the exact steps for a snapshot.
//!
//! The order is the seat layer's promise: give back first (the surplus is
//! room a peer waits for), then a person's moves (a holder hands a seat to
//! its target; the target claims it only once no live lease holds it),
//! then the withheld notice, then the claims, most constrained group
//! first, as [`super::placement::plan`] ordered them.

use std::collections::{BTreeMap, BTreeSet};

use super::moves::MoveRequest;
use super::placement::{Plan, ReleaseReason, Snapshot, Withheld};
use crate::coord::Lease;
use crate::events::DetachReason;

/// One thing a pass does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Give `seat` back (offered to a successor first when handoffs are
    /// two-phase).
    Release { seat: String, reason: DetachReason },
    /// A person moves a seat this node holds to `to`, a live serving node
    /// that has not just refused it: offer it there.
    HandOff {
        seat: String,
        to: String,
        revision: u64,
    },
    /// This node, the move's target, holds the seat: the request is done.
    FinishMove { seat: String, revision: u64 },
    /// This node is the move's target and does not hold the seat: claim it
    /// if no live lease holds it (a holder is never robbed), and finish the
    /// request once it is established here.
    ClaimMoved { seat: String, revision: u64 },
    /// Tell the fleet this node withholds its claims because it runs
    /// behind the fleet's protocol.
    AnnounceBehind,
    /// Claim `seat`. The protocol gate is asked before each claim, and a
    /// refusal, or a drain begun meanwhile, ends the claims.
    Claim { seat: String },
}

/// Why a placement release detaches its seat.
pub fn detach_reason(r: ReleaseReason) -> DetachReason {
    match r {
        ReleaseReason::Rebalance => DetachReason::Rebalance,
        ReleaseReason::RoleGone => DetachReason::RoleGone,
        ReleaseReason::PlacementMoved => DetachReason::PlacementMoved,
        ReleaseReason::Unserviceable => DetachReason::Unserviceable,
    }
}

/// Pure: the steps of one pass. `moves` are the standing move requests
/// with their revisions; `refused` names, per seat, the node that refused
/// its last offer recently (it is not offered there again yet).
pub fn steps(
    snap: &Snapshot,
    plan: &Plan,
    moves: &[(MoveRequest, u64)],
    refused: &BTreeMap<String, String>,
) -> Vec<Step> {
    let mut out: Vec<Step> = plan
        .releases
        .iter()
        .map(|(seat, r)| Step::Release {
            seat: seat.clone(),
            reason: detach_reason(*r),
        })
        .collect();
    let released: BTreeSet<&str> = plan.releases.iter().map(|(s, _)| s.as_str()).collect();
    let me = snap.node_id.as_str();
    for (m, revision) in moves {
        let held = snap.held.contains(&m.seat) && !released.contains(m.seat.as_str());
        if held {
            if m.to == me {
                out.push(Step::FinishMove {
                    seat: m.seat.clone(),
                    revision: *revision,
                });
            } else if refused.get(&m.seat) != Some(&m.to)
                && snap
                    .presence
                    .iter()
                    .any(|p| p.node_id == m.to && !p.withdrawn)
            {
                // Only to a live, serving target: an offer nobody can take
                // would leave the seat quiesced for the bound.
                out.push(Step::HandOff {
                    seat: m.seat.clone(),
                    to: m.to.clone(),
                    revision: *revision,
                });
            }
        } else if m.to == me && !released.contains(m.seat.as_str()) && plan.withheld.is_none() {
            out.push(Step::ClaimMoved {
                seat: m.seat.clone(),
                revision: *revision,
            });
        }
    }
    if plan.withheld == Some(Withheld::Behind) {
        out.push(Step::AnnounceBehind);
    }
    out.extend(
        plan.claims
            .iter()
            .map(|seat| Step::Claim { seat: seat.clone() }),
    );
    out
}

/// Pure: what the seat leases and the seats' last holders add to a pass's
/// snapshot once it would claim — each seat's `preferred` hint (its live
/// lease's, else its last holder's), the live leases naming each node, and
/// the seats held by another incarnation. `owner` is this incarnation.
pub fn with_seat_leases(
    snap: &mut Snapshot,
    leases: &[Lease],
    holders: &BTreeMap<String, String>,
    owner: &str,
) {
    let mut preferred: BTreeMap<&str, &str> = holders
        .iter()
        .filter_map(|(k, n)| k.strip_prefix("seat:").map(|h| (h, n.as_str())))
        .collect();
    snap.leased_to.clear();
    for l in leases {
        if let Some(h) = l.resource.strip_prefix("seat:") {
            preferred.insert(h, l.preferred.as_str());
            *snap.leased_to.entry(l.preferred.clone()).or_default() += 1;
        }
    }
    for s in &mut snap.seats {
        s.preferred = preferred.get(s.handle.as_str()).map(|p| p.to_string());
    }
    snap.held_elsewhere = leases
        .iter()
        .filter(|l| l.owner != owner)
        .filter_map(|l| l.resource.strip_prefix("seat:").map(str::to_string))
        .collect();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PlacementConfig;
    use crate::coord::{LeaseState, StoreTime};
    use crate::seat::placement::{Presence, SeatSpec, plan};

    fn node(id: &str) -> Presence {
        Presence {
            node_id: id.into(),
            labels: vec![],
            withdrawn: false,
            seats_held: None,
        }
    }

    fn snapshot(me: &str, seats: &[&str], nodes: &[&str], held: &[&str]) -> Snapshot {
        Snapshot {
            node_id: me.into(),
            labels: vec![],
            seats: seats
                .iter()
                .map(|h| SeatSpec {
                    handle: h.to_string(),
                    placement: PlacementConfig::default(),
                    preferred: None,
                })
                .collect(),
            presence: nodes.iter().map(|n| node(n)).collect(),
            held: held.iter().map(|h| h.to_string()).collect(),
            undead: BTreeSet::new(),
            held_elsewhere: BTreeSet::new(),
            draining: false,
            behind: false,
            unserviceable: false,
            claim_limit: 4,
            release_limit: 2,
            ranking: vec![],
            deferred: BTreeMap::new(),
            moves: BTreeMap::new(),
            handed_back: BTreeSet::new(),
            leased_to: BTreeMap::new(),
            fading: BTreeSet::new(),
            rechecked: BTreeSet::new(),
        }
    }

    fn request(seat: &str, to: &str) -> MoveRequest {
        MoveRequest {
            seat: seat.into(),
            to: to.into(),
            by: "ops".into(),
            reason: String::new(),
            requested_at: StoreTime::from_unix_nanos(0),
            until: StoreTime::from_unix_nanos(i64::MAX),
        }
    }

    fn claim(s: &str) -> Step {
        Step::Claim { seat: s.into() }
    }

    #[test]
    fn a_lone_node_claims_free_seats_in_the_plans_order_up_to_the_claim_limit_and_nothing_else() {
        let snap = snapshot("a", &["s1", "s2", "s3", "s4", "s5"], &["a"], &[]);
        let p = plan(&snap);
        assert_eq!(p.claims.len(), 4, "the claim limit");
        let want: Vec<Step> = p.claims.iter().map(|s| claim(s)).collect();
        assert_eq!(steps(&snap, &p, &[], &BTreeMap::new()), want);
    }

    #[test]
    fn a_node_over_its_share_gives_back_before_it_claims_anything() {
        // Four seats held alone; a peer joined: the share is two each, and
        // two go back (the release limit), then nothing is claimed.
        let snap = snapshot(
            "a",
            &["s1", "s2", "s3", "s4"],
            &["a", "b"],
            &["s1", "s2", "s3", "s4"],
        );
        let p = plan(&snap);
        let got = steps(&snap, &p, &[], &BTreeMap::new());
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got.iter().all(|s| matches!(
            s,
            Step::Release {
                reason: DetachReason::Rebalance,
                ..
            }
        )));
    }

    #[test]
    fn a_move_is_offered_by_its_holder_only_to_a_live_target_that_has_not_just_refused_it() {
        let snap = snapshot("a", &["s1", "s2"], &["a", "b"], &["s1"]);
        let p = plan(&snap);
        let moves = [(request("s1", "b"), 7), (request("s1", "gone"), 8)];
        let got = steps(&snap, &p, &moves, &BTreeMap::new());
        assert_eq!(
            got.iter()
                .filter(|s| !matches!(s, Step::Claim { .. }))
                .collect::<Vec<_>>(),
            [&Step::HandOff {
                seat: "s1".into(),
                to: "b".into(),
                revision: 7
            }]
        );
        let refused = BTreeMap::from([("s1".to_string(), "b".to_string())]);
        assert!(
            !steps(&snap, &p, &moves, &refused)
                .iter()
                .any(|s| matches!(s, Step::HandOff { .. })),
            "a target that refused the seat is not offered it again yet"
        );
    }

    #[test]
    fn the_moves_target_claims_a_seat_it_does_not_hold_and_finishes_one_it_does() {
        let snap = snapshot("b", &["s1", "s2"], &["a", "b"], &["s2"]);
        let mut p = plan(&snap);
        p.claims.clear();
        let moves = [(request("s1", "b"), 3), (request("s2", "b"), 4)];
        assert_eq!(
            steps(&snap, &p, &moves, &BTreeMap::new()),
            [
                Step::ClaimMoved {
                    seat: "s1".into(),
                    revision: 3
                },
                Step::FinishMove {
                    seat: "s2".into(),
                    revision: 4
                },
            ]
        );
        p.withheld = Some(Withheld::Behind);
        assert_eq!(
            steps(&snap, &p, &moves, &BTreeMap::new()),
            [
                Step::FinishMove {
                    seat: "s2".into(),
                    revision: 4
                },
                Step::AnnounceBehind,
            ],
            "a node that withholds its claims claims no moved seat either, and says why"
        );
    }

    #[test]
    fn a_seat_given_back_this_pass_is_neither_handed_off_nor_claimed_by_its_move() {
        let snap = snapshot("a", &["s1"], &["a", "b"], &["s1"]);
        let mut p = plan(&snap);
        p.releases = vec![("s1".into(), ReleaseReason::RoleGone)];
        p.claims.clear();
        let moves = [(request("s1", "b"), 1), (request("s1", "a"), 2)];
        assert_eq!(
            steps(&snap, &p, &moves, &BTreeMap::new()),
            [Step::Release {
                seat: "s1".into(),
                reason: DetachReason::RoleGone
            }]
        );
    }

    #[test]
    fn the_seat_leases_give_each_seat_its_hint_and_count_each_nodes_live_leases() {
        let mut snap = snapshot("a", &["s1", "s2", "s3"], &["a", "b"], &[]);
        let lease = |h: &str, owner: &str, preferred: &str| Lease {
            resource: format!("seat:{h}"),
            owner: owner.into(),
            epoch: 1,
            acquired_at: StoreTime::from_unix_nanos(0),
            expires_at: StoreTime::from_unix_nanos(i64::MAX),
            preferred: preferred.into(),
            protocol: 1,
            state: LeaseState::Held,
            metadata: Default::default(),
            revision: 1,
            ttl: std::time::Duration::from_secs(15),
            claim: String::new(),
            offer: None,
        };
        let leases = [lease("s1", "b:1", "b"), lease("s2", "a:9", "a")];
        let holders = BTreeMap::from([
            ("seat:s1".to_string(), "a".to_string()),
            ("seat:s3".to_string(), "b".to_string()),
        ]);
        with_seat_leases(&mut snap, &leases, &holders, "a:9");
        let hints: Vec<Option<&str>> = snap.seats.iter().map(|s| s.preferred.as_deref()).collect();
        assert_eq!(
            hints,
            [Some("b"), Some("a"), Some("b")],
            "a live lease's hint wins over the last holder's"
        );
        assert_eq!(
            snap.leased_to,
            BTreeMap::from([("a".into(), 1), ("b".into(), 1)])
        );
        assert_eq!(snap.held_elsewhere, BTreeSet::from(["s1".to_string()]));
    }
}
