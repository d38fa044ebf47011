//! Placement: which seats this node should claim and which it should give
//! back, as a pure function of one snapshot (spec § Placement).
//!
//! Placement is deliberately dumb. A node counts the live nodes from their
//! presence rows, computes its fair share of every placement group it
//! matches — ceil(group size / live nodes placing seats that match it) —
//! charges its undead seats first against what it may hold, hands the rest
//! to its groups most constrained first, claims up to each group's allowance
//! and gives back any excess. This module does no I/O and reads no clock:
//! the sweep builds the [`Snapshot`], this returns the [`Plan`], the sweep
//! performs it.

use std::collections::{BTreeMap, BTreeSet};

use crate::config::PlacementConfig;

pub use crate::config::matches_placement;

/// A seat of the active revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeatSpec {
    pub handle: String,
    pub placement: PlacementConfig,
    /// The stable node id the seat's lease last named as `preferred`, if
    /// known: stickiness, never a rule.
    pub preferred: Option<String>,
}

/// A live node as its presence row describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Presence {
    pub node_id: String,
    pub labels: Vec<String>,
    /// Gave its seats back because it cannot serve them; not counted.
    pub withdrawn: bool,
    /// Seat leases it holds (runs plus undead), counting only placeable
    /// seats; `None` when the row does not carry a readable count.
    pub seats_held: Option<u32>,
}

/// What this node knows at the start of a pass.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub node_id: String,
    pub labels: Vec<String>,
    /// Seats of the active revision.
    pub seats: Vec<SeatSpec>,
    /// Live presence rows (this node's own included when it has one).
    pub presence: Vec<Presence>,
    /// Seats this node holds and runs.
    pub held: BTreeSet<String>,
    /// Seats whose teardown failed: leased here, out of the held set.
    pub undead: BTreeSet<String>,
    /// Seats known to be held by a live lease of another owner.
    pub held_elsewhere: BTreeSet<String>,
    pub draining: bool,
    pub behind: bool,
    /// This node cannot serve its seats' work: give everything back.
    pub unserviceable: bool,
    pub claim_limit: usize,
    pub release_limit: usize,
    /// The fleet's effective node priority order, top first (empty: none).
    pub ranking: Vec<String>,
    /// Free seats this node left to a better-ranked node, with how many
    /// passes in a row it has done so.
    pub deferred: BTreeMap<String, u32>,
    /// Standing move requests: seat → the node it is to run on.
    pub moves: BTreeMap<String, String>,
    /// Seats this node claimed in its last passes and could not establish
    /// (its acquire hook failed, so it handed them back): left to a peer
    /// that may run them, tried again here only when none may.
    pub handed_back: BTreeSet<String>,
    /// Live seat leases by the stable node id they name: how much a node
    /// really holds, whatever its presence row (a crashed incarnation's row
    /// goes on saying what it held until it lapses).
    pub leased_to: BTreeMap<String, usize>,
    /// Nodes whose presence is fading: a row not renewed for two
    /// heartbeats, or one the last pass saw that is gone now. A node
    /// restarted with the same id claims its row the moment its earlier
    /// incarnation's lapses, which is also when that incarnation's seats
    /// come free.
    pub fading: BTreeSet<String>,
    /// Free seats this node left for a recheck in its last pass.
    pub rechecked: BTreeSet<String>,
}

/// How long after a pass that left seats for a recheck the recheck runs:
/// long enough for a restarted node to claim the presence row its earlier
/// incarnation's lapse freed (it claims it at that lapse), short enough
/// that a dead node's seats still move within about a TTL and a sweep.
pub const RECHECK_AFTER: std::time::Duration = std::time::Duration::from_millis(500);

/// A node leaves a free seat that prefers nobody here to a better-ranked
/// node with room for at most this many passes in a row, then claims it.
pub const DEFER_PASSES: u32 = 2;

/// How many passes a node leaves a seat it could not establish to its
/// peers before it tries the seat again itself.
pub const HANDED_BACK_PASSES: u32 = 2;

/// Why a seat is given back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReleaseReason {
    /// Over this node's share of the seat's group.
    Rebalance,
    /// The seat's role left the company.
    RoleGone,
    /// The seat's placement no longer matches this node.
    PlacementMoved,
    /// This node cannot serve its seats.
    Unserviceable,
}

impl ReleaseReason {
    /// The reason as `seat_detached` reports it.
    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseReason::Rebalance => "rebalance",
            ReleaseReason::RoleGone => "role_gone",
            ReleaseReason::PlacementMoved => "placement_moved",
            ReleaseReason::Unserviceable => "unserviceable",
        }
    }
}

/// Why a pass claims nothing it otherwise would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Withheld {
    Draining,
    Behind,
    Unserviceable,
    /// Every placeable seat is already held somewhere (the presence rows'
    /// `seats_held` cover them): try no seat at all.
    FleetFull,
}

/// One placement group as this node sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupView {
    pub placement: PlacementConfig,
    pub size: usize,
    /// Live, not withdrawn nodes whose id and labels match.
    pub matching_nodes: usize,
    /// ceil(size / matching_nodes) when this node matches, else 0.
    pub share: usize,
    /// What this node may hold of it after undead seats are charged.
    pub allowance: usize,
    pub held: usize,
}

/// What a pass should do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Seats to try, in order, at most `claim_limit`.
    pub claims: Vec<String>,
    /// The limit cut seats off `claims` that this node could have tried
    /// (the claim pace, `seat::pace`, reads it).
    pub cut: bool,
    /// Seats to give back, with why, at most `release_limit`.
    pub releases: Vec<(String, ReleaseReason)>,
    /// The limit cut seats off `releases` that this node would have given
    /// back (the give-back pace, `seat::pace::next_release`, reads it).
    pub releases_cut: bool,
    /// Seats no live node may run.
    pub unplaceable: Vec<String>,
    pub withheld: Option<Withheld>,
    /// The sum of this node's shares (what `seat_sweep` reports).
    pub capacity: usize,
    /// Seats this node holds or keeps undead, against that capacity.
    pub holding: usize,
    pub groups: Vec<GroupView>,
    /// Free seats left to a better-ranked node, or to the node their hint
    /// names, this pass.
    pub deferred: Vec<String>,
    /// Free seats left for one recheck [`RECHECK_AFTER`] from now, because the
    /// node their hint names is fading (back by then if it restarted, gone
    /// if it died).
    pub rechecks: Vec<String>,
}

fn ceil_div(a: usize, b: usize) -> usize {
    if b == 0 { 0 } else { a.div_ceil(b) }
}

/// The seats some live, not withdrawn node may run.
pub fn placeable<'a>(seats: &'a [SeatSpec], presence: &[Presence]) -> Vec<&'a SeatSpec> {
    seats
        .iter()
        .filter(|s| {
            presence
                .iter()
                .any(|p| !p.withdrawn && matches_placement(&p.node_id, &p.labels, &s.placement))
        })
        .collect()
}

/// Plan one pass.
pub fn plan(snap: &Snapshot) -> Plan {
    let live: Vec<&Presence> = snap.presence.iter().filter(|p| !p.withdrawn).collect();
    let mut plan = Plan {
        unplaceable: snap
            .seats
            .iter()
            .filter(|s| {
                !live
                    .iter()
                    .any(|p| matches_placement(&p.node_id, &p.labels, &s.placement))
            })
            .map(|s| s.handle.clone())
            .collect(),
        ..Plan::default()
    };
    let forced = forced_releases(snap);
    let forced_set: BTreeSet<String> = forced.iter().map(|(h, _)| h.clone()).collect();
    let mut views = group_views(snap, &live, &forced_set);

    // Undead seats are charged first; what is left goes to the groups most
    // constrained first, each up to its share.
    let capacity: usize = views.iter().map(|(g, _)| g.share).sum();
    let mut left = capacity.saturating_sub(snap.undead.len());
    for (g, _) in views.iter_mut() {
        g.allowance = g.share.min(left);
        left -= g.allowance;
    }
    plan.capacity = capacity;
    plan.holding = snap.held.len() + snap.undead.len();
    (plan.releases, plan.releases_cut) = releases(snap, &views, forced, &forced_set);
    plan.withheld = withheld(snap);
    if plan.withheld.is_none() {
        let mut claims = Vec::new();
        for (g, seats) in &views {
            if g.held < g.allowance {
                claims.extend(group_claims(snap, &live, g, seats, &mut plan));
            }
        }
        plan.cut = claims.len() > snap.claim_limit;
        claims.truncate(snap.claim_limit);
        plan.claims = claims;
    }
    plan.groups = views.into_iter().map(|(g, _)| g).collect();
    plan
}

/// Seats held that this node must give back whatever the shares say: its
/// role left the company, its placement no longer matches this node, or
/// this node cannot serve.
fn forced_releases(snap: &Snapshot) -> Vec<(String, ReleaseReason)> {
    let me = snap.node_id.as_str();
    let in_revision: BTreeMap<&str, &SeatSpec> =
        snap.seats.iter().map(|s| (s.handle.as_str(), s)).collect();
    let mut forced = Vec::new();
    for h in &snap.held {
        match in_revision.get(h.as_str()) {
            None => forced.push((h.clone(), ReleaseReason::RoleGone)),
            Some(s) if !matches_placement(me, &snap.labels, &s.placement) => {
                forced.push((h.clone(), ReleaseReason::PlacementMoved))
            }
            Some(_) if snap.unserviceable => forced.push((h.clone(), ReleaseReason::Unserviceable)),
            Some(_) => {}
        }
    }
    forced
}

/// The placement groups (the seats that share one placement) as this node
/// sees them, most constrained first: fewest matching nodes, then the
/// smaller group, then a stable order. Allowances are left at zero.
fn group_views<'a>(
    snap: &'a Snapshot,
    live: &[&Presence],
    forced: &BTreeSet<String>,
) -> Vec<(GroupView, Vec<&'a SeatSpec>)> {
    let me = snap.node_id.as_str();
    let mine = |p: &PlacementConfig| matches_placement(me, &snap.labels, p);
    let mut groups: BTreeMap<PlacementKey, Vec<&SeatSpec>> = BTreeMap::new();
    for s in &snap.seats {
        groups
            .entry(PlacementKey::of(&s.placement))
            .or_default()
            .push(s);
    }
    let mut views: Vec<(GroupView, Vec<&SeatSpec>)> = groups
        .into_values()
        .map(|seats| {
            let placement = seats[0].placement.clone();
            let matching = live
                .iter()
                .filter(|p| matches_placement(&p.node_id, &p.labels, &placement))
                .count();
            // This node counts itself even before its presence row is seen.
            let me_listed = live.iter().any(|p| p.node_id == me);
            let matching = if mine(&placement) && !me_listed && !snap.unserviceable {
                matching + 1
            } else {
                matching
            };
            let share = if mine(&placement) && !snap.unserviceable {
                ceil_div(seats.len(), matching)
            } else {
                0
            };
            let held = seats
                .iter()
                .filter(|s| snap.held.contains(&s.handle) && !forced.contains(&s.handle))
                .count();
            (
                GroupView {
                    placement,
                    size: seats.len(),
                    matching_nodes: matching,
                    share,
                    allowance: 0,
                    held,
                },
                seats,
            )
        })
        .collect();
    views.sort_by(|(a, _), (b, _)| {
        (a.matching_nodes, a.size, PlacementKey::of(&a.placement)).cmp(&(
            b.matching_nodes,
            b.size,
            PlacementKey::of(&b.placement),
        ))
    });
    views
}

/// The forced releases first, then each group's excess over its allowance,
/// least constrained groups first; the whole list bounded by the release
/// limit, and whether that bound cut any off.
fn releases(
    snap: &Snapshot,
    views: &[(GroupView, Vec<&SeatSpec>)],
    forced: Vec<(String, ReleaseReason)>,
    forced_set: &BTreeSet<String>,
) -> (Vec<(String, ReleaseReason)>, bool) {
    let me = snap.node_id.as_str();
    let mut releases = forced;
    for (g, seats) in views.iter().rev() {
        if g.held <= g.allowance {
            continue;
        }
        // A seat a person moved here is kept while the request stands: its
        // next pass finishes the request. (Given back for balance, its old
        // holder, seeing the request, handed it here again, pass after
        // pass, for the request's two minutes.)
        let mut mine_here: Vec<&&SeatSpec> = seats
            .iter()
            .filter(|s| {
                snap.held.contains(&s.handle)
                    && !forced_set.contains(&s.handle)
                    && snap.moves.get(&s.handle).map(String::as_str) != Some(me)
            })
            .collect();
        // Keep the seats that prefer this node; give back the others first.
        mine_here.sort_by_key(|s| {
            (
                s.preferred.as_deref() == Some(me),
                std::cmp::Reverse(s.handle.clone()),
            )
        });
        for s in mine_here.into_iter().take(g.held - g.allowance) {
            releases.push((s.handle.clone(), ReleaseReason::Rebalance));
        }
    }
    let limit = snap.release_limit.max(1);
    let cut = releases.len() > limit;
    releases.truncate(limit);
    (releases, cut)
}

/// Why this node claims nothing this pass, if it does not.
fn withheld(snap: &Snapshot) -> Option<Withheld> {
    if snap.unserviceable {
        Some(Withheld::Unserviceable)
    } else if snap.draining {
        Some(Withheld::Draining)
    } else if snap.behind {
        Some(Withheld::Behind)
    } else {
        let placeable_count = placeable(&snap.seats, &snap.presence).len();
        let held_sum: u64 = snap
            .presence
            .iter()
            .map(|p| p.seats_held.unwrap_or(0) as u64)
            .sum();
        (placeable_count > 0 && held_sum >= placeable_count as u64).then_some(Withheld::FleetFull)
    }
}

/// The seats of one group (`g`, `seats`) this node claims, up to its room
/// there; the ones it leaves to a better-ranked node or for a recheck are
/// noted in `plan`.
fn group_claims(
    snap: &Snapshot,
    live: &[&Presence],
    g: &GroupView,
    seats: &[&SeatSpec],
    plan: &mut Plan,
) -> Vec<String> {
    let me = snap.node_id.as_str();
    let mut free: Vec<&&SeatSpec> = seats
        .iter()
        .filter(|s| {
            !snap.held.contains(&s.handle)
                && !snap.undead.contains(&s.handle)
                && !snap.held_elsewhere.contains(&s.handle)
        })
        .collect();
    // A seat a person moved to another node is left to it.
    free.retain(|s| snap.moves.get(&s.handle).is_none_or(|to| to == me));
    // A seat this node could not establish is left to a peer that
    // may run it: claiming it straight back could win every race
    // for it and keep it dark (tried here again when no peer may).
    free.retain(|s| {
        !snap.handed_back.contains(&s.handle)
            || !live
                .iter()
                .any(|p| p.node_id != me && matches_placement(&p.node_id, &p.labels, &s.placement))
    });
    // Seats a person moved here first, then stickiness (seats whose
    // preferred hint names this node), then this node's own claim
    // order — and a seat this node could not establish (tried again
    // here because no peer may run it) after every seat not tried yet,
    // so seats that keep failing never take the whole claim limit and
    // starve the ones behind them.
    free.sort_by_cached_key(|s| {
        (
            snap.handed_back.contains(&s.handle),
            claim_order_key(me, s, &snap.moves),
        )
    });
    // The ranking: a seat that prefers nobody here goes first to a
    // better-ranked node with room, for a bounded number of passes —
    // as many seats as those nodes have room for, no more: the rest
    // would come back to this node anyway, and leaving them waits
    // out passes with the seats dark (a dead node's seats among
    // them). The seats left are the ones each such node tries
    // first in its own claim order, so the two do not race for the
    // same seats. It never changes how many seats this node may take.
    let sticky = sticky_leave(snap, &g.placement, &free);
    plan.rechecks
        .extend(sticky.rechecks.iter().map(|h| h.to_string()));
    let left_to_better: BTreeSet<&str> = {
        let leavable: Vec<&SeatSpec> = free
            .iter()
            .map(|s| **s)
            .filter(|s| {
                s.preferred.as_deref() != Some(me)
                    && snap.moves.get(&s.handle).map(String::as_str) != Some(me)
                    && snap.deferred.get(&s.handle).copied().unwrap_or(0) < DEFER_PASSES
                    && !sticky.rechecks.contains(s.handle.as_str())
            })
            .collect();
        let mut left: BTreeSet<&str> = sticky.left;
        for (node, room) in better_ranked_rooms(snap, &g.placement) {
            if left.len() == leavable.len() {
                break;
            }
            // The first `room` seats of that node's order (picked,
            // not sorted whole: thousands of free seats on a cold
            // fleet, one pick per better-ranked node).
            let mut theirs: Vec<(ClaimOrder, &SeatSpec)> = leavable
                .iter()
                .filter(|s| !left.contains(s.handle.as_str()))
                .map(|s| (claim_order_key(node, s, &snap.moves), *s))
                .collect();
            if room < theirs.len() {
                theirs.select_nth_unstable_by(room, |a, b| a.0.cmp(&b.0));
                theirs.truncate(room);
            }
            left.extend(theirs.into_iter().map(|(_, s)| s.handle.as_str()));
        }
        left
    };
    let mut take = Vec::new();
    for s in free {
        if take.len() >= g.allowance - g.held {
            break;
        }
        if sticky.rechecks.contains(s.handle.as_str()) {
            continue;
        }
        if left_to_better.contains(s.handle.as_str()) {
            plan.deferred.push(s.handle.clone());
            continue;
        }
        take.push(s.handle.clone());
    }
    take
}

/// What stickiness leaves of a group's free seats to other nodes.
struct StickyLeave<'a> {
    /// Left to the node their hint names (for at most [`DEFER_PASSES`]
    /// passes in a row).
    left: BTreeSet<&'a str>,
    /// Left for one recheck [`RECHECK_AFTER`] later.
    rechecks: BTreeSet<&'a str>,
}

/// Stickiness seen from a peer: a free seat whose hint names another node
/// is that node's to take back first. While the node is serving, matches
/// the seat and has room (counted from the leases naming it, not its row),
/// the seat is left to it for at most [`DEFER_PASSES`] passes; while its
/// presence is fading the seat is left for one recheck [`RECHECK_AFTER`] later,
/// by which time a restarted incarnation holds the row and a dead node's
/// row is gone. So a restarted node gets its seats back while a peer with
/// room sweeps at the same moment, and a dead node's seats still move
/// within a TTL, a sweep and [`RECHECK_AFTER`].
fn sticky_leave<'a>(
    snap: &Snapshot,
    placement: &PlacementConfig,
    free: &[&&'a SeatSpec],
) -> StickyLeave<'a> {
    let me = snap.node_id.as_str();
    let mut out = StickyLeave {
        left: BTreeSet::new(),
        rechecks: BTreeSet::new(),
    };
    let mut room: BTreeMap<&str, usize> = BTreeMap::new();
    for s in free {
        let Some(to) = s.preferred.as_deref().filter(|to| *to != me) else {
            continue;
        };
        if snap.moves.get(&s.handle).map(String::as_str) == Some(me) {
            continue;
        }
        if snap.fading.contains(to) {
            if !snap.rechecked.contains(&s.handle) {
                out.rechecks.insert(s.handle.as_str());
            }
            continue;
        }
        if snap.deferred.get(&s.handle).copied().unwrap_or(0) >= DEFER_PASSES {
            continue;
        }
        let Some(p) = snap.presence.iter().find(|p| {
            p.node_id == to && !p.withdrawn && matches_placement(&p.node_id, &p.labels, placement)
        }) else {
            continue;
        };
        let left = room.entry(to).or_insert_with(|| {
            capacity_of(snap, p).saturating_sub(snap.leased_to.get(to).copied().unwrap_or(0))
        });
        if *left > 0 {
            *left -= 1;
            out.left.insert(s.handle.as_str());
        }
    }
    out
}

/// Where `node` stands in `ranking` (unranked nodes after every ranked
/// one, by id).
fn rank_of<'a>(ranking: &[String], node: &'a str) -> (usize, &'a str) {
    (
        ranking.iter().position(|n| n == node).unwrap_or(usize::MAX),
        node,
    )
}

/// What a live node may hold in all: the sum of its shares of the groups
/// it matches (from this node's view of the fleet).
fn capacity_of(snap: &Snapshot, p: &Presence) -> usize {
    let live: Vec<&Presence> = snap.presence.iter().filter(|p| !p.withdrawn).collect();
    let mut groups: BTreeMap<PlacementKey, (PlacementConfig, usize)> = BTreeMap::new();
    for s in &snap.seats {
        groups
            .entry(PlacementKey::of(&s.placement))
            .or_insert_with(|| (s.placement.clone(), 0))
            .1 += 1;
    }
    groups
        .values()
        .filter(|(pl, _)| matches_placement(&p.node_id, &p.labels, pl))
        .map(|(pl, size)| {
            let matching = live
                .iter()
                .filter(|q| matches_placement(&q.node_id, &q.labels, pl))
                .count();
            ceil_div(*size, matching)
        })
        .sum()
}

fn has_room(snap: &Snapshot, p: &Presence, extra: usize) -> bool {
    p.seats_held
        .is_some_and(|h| (h as usize) + extra < capacity_of(snap, p))
}

/// The live nodes ranked above this one that match `placement`, best
/// first, each with how many more seats it has room for under its shares
/// (those with none left out).
fn better_ranked_rooms<'a>(
    snap: &'a Snapshot,
    placement: &PlacementConfig,
) -> Vec<(&'a str, usize)> {
    if snap.ranking.is_empty() {
        return Vec::new();
    }
    let me = rank_of(&snap.ranking, &snap.node_id);
    let mut better: Vec<&Presence> = snap
        .presence
        .iter()
        .filter(|p| {
            !p.withdrawn
                && p.node_id != snap.node_id
                && rank_of(&snap.ranking, &p.node_id) < me
                && matches_placement(&p.node_id, &p.labels, placement)
        })
        .collect();
    better.sort_by(|a, b| {
        rank_of(&snap.ranking, &a.node_id).cmp(&rank_of(&snap.ranking, &b.node_id))
    });
    better
        .into_iter()
        .filter_map(|p| {
            let room = capacity_of(snap, p).saturating_sub(p.seats_held? as usize);
            (room > 0).then_some((p.node_id.as_str(), room))
        })
        .collect()
}

/// A seat's place in a node's claim order (lower first).
type ClaimOrder = (bool, bool, u64, String);

/// Where a free seat comes in `node`'s claim order: seats a person moved
/// to the node first, then those whose preferred hint names it, then the
/// node's own permutation of the rest ([`claim_rank`]), the handle breaking
/// ties.
fn claim_order_key(node: &str, s: &SeatSpec, moves: &BTreeMap<String, String>) -> ClaimOrder {
    (
        moves.get(&s.handle).map(String::as_str) != Some(node),
        s.preferred.as_deref() != Some(node),
        claim_rank(node, &s.handle),
        s.handle.clone(),
    )
}

/// A free seat's place in `node`'s claim order: a pseudo-random number from
/// the node id and the handle (FNV-1a, then a SplitMix64 finish), so each
/// node tries free seats in an order of its own and nodes sweeping at the
/// same moment try different seats instead of all racing for the first
/// ones by handle. Fixed arithmetic: every build orders alike, so a node
/// can tell which seats a better-ranked peer will try first.
pub fn claim_rank(node: &str, handle: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.bytes().chain([0u8]).chain(handle.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Pure: the node a seat this node gives back is offered to — the
/// best-ranked live node, other than this one and those in `exclude`, that
/// matches the seat's placement and has room under its shares (counting
/// `offered`: what this node already offered it this pass). `None`: no
/// successor is eligible, and the seat is released for anyone to claim.
pub fn successor(
    snap: &Snapshot,
    seat: &SeatSpec,
    exclude: &BTreeSet<String>,
    offered: &BTreeMap<String, usize>,
) -> Option<String> {
    snap.presence
        .iter()
        .filter(|p| {
            !p.withdrawn
                && p.node_id != snap.node_id
                && !exclude.contains(&p.node_id)
                && matches_placement(&p.node_id, &p.labels, &seat.placement)
                && has_room(snap, p, offered.get(&p.node_id).copied().unwrap_or(0))
        })
        .min_by(|a, b| rank_of(&snap.ranking, &a.node_id).cmp(&rank_of(&snap.ranking, &b.node_id)))
        .map(|p| p.node_id.clone())
}

/// A placement as a sortable, comparable key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct PlacementKey(Vec<String>, Vec<String>);

impl PlacementKey {
    fn of(p: &PlacementConfig) -> PlacementKey {
        let mut n = p.nodes.clone();
        n.sort();
        n.dedup();
        let mut l = p.labels.clone();
        l.sort();
        l.dedup();
        PlacementKey(n, l)
    }
}

#[cfg(test)]
mod tests;
