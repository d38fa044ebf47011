//! Every placement rule in the spec's words, and properties over random
//! fleets: shares cover every group some eligible node matches, and
//! simulated rounds converge without oscillating and never place a seat
//! outside its placement.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

fn pl(nodes: &[&str], labels: &[&str]) -> PlacementConfig {
    PlacementConfig {
        nodes: nodes.iter().map(|s| s.to_string()).collect(),
        labels: labels.iter().map(|s| s.to_string()).collect(),
    }
}

fn seat(h: &str, p: PlacementConfig) -> SeatSpec {
    SeatSpec {
        handle: h.into(),
        placement: p,
        preferred: None,
    }
}

fn seats(prefix: &str, n: usize, p: &PlacementConfig) -> Vec<SeatSpec> {
    (0..n)
        .map(|i| seat(&format!("{prefix}{i:03}"), p.clone()))
        .collect()
}

fn node(id: &str, labels: &[&str]) -> Presence {
    Presence {
        node_id: id.into(),
        labels: labels.iter().map(|s| s.to_string()).collect(),
        withdrawn: false,
        seats_held: Some(0),
    }
}

fn snap(me: &Presence, all: &[Presence], seats: Vec<SeatSpec>) -> Snapshot {
    Snapshot {
        node_id: me.node_id.clone(),
        labels: me.labels.clone(),
        seats,
        presence: all.to_vec(),
        claim_limit: 4,
        release_limit: 2,
        ..Snapshot::default()
    }
}

/// A seeded stream of pseudo-random numbers (a 64-bit LCG's high bits).
fn lcg(seed: u64) -> impl FnMut() -> usize {
    let mut rng = seed;
    move || {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 33) as usize
    }
}

fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_node_claims_up_to_its_fair_share_of_ceil_seats_over_live_nodes() {
    let a = node("a", &[]);
    let fleet = [a.clone(), node("b", &[]), node("c", &[])];
    let mut s = snap(&a, &fleet, seats("s", 10, &pl(&[], &[])));
    s.claim_limit = 100;
    let p = plan(&s);
    assert_eq!(p.capacity, 4, "ceil(10 / 3)");
    assert_eq!(p.claims.len(), 4);
}

#[test]
fn never_more_than_the_claim_limit_per_pass() {
    let a = node("a", &[]);
    let p = plan(&snap(
        &a,
        std::slice::from_ref(&a),
        seats("s", 20, &pl(&[], &[])),
    ));
    assert_eq!(p.capacity, 20);
    assert_eq!(p.claims.len(), 4, "claim_limit 4");
    assert!(p.cut, "the limit left free seats of this node's share");
}

#[test]
fn a_plan_is_cut_only_when_its_limit_left_seats_of_the_share_untried() {
    let a = node("a", &[]);
    let fleet = [a.clone(), node("b", &[])];
    // 10 seats over two nodes: a share of 5; a limit of 5 tries them all.
    let mut s = snap(&a, &fleet, seats("s", 10, &pl(&[], &[])));
    s.claim_limit = 5;
    let p = plan(&s);
    assert_eq!((p.claims.len(), p.cut), (5, false));
    // The share, not the free seats, is what the limit is held against.
    s.claim_limit = 4;
    let p = plan(&s);
    assert_eq!((p.claims.len(), p.cut), (4, true));
}

#[test]
fn a_plan_says_its_release_limit_cut_excess_off_only_when_it_did() {
    let a = node("a", &[]);
    let fleet = [a.clone(), node("b", &[])];
    // a holds all 10 seats of a fleet of two: 5 over its share.
    let ss = seats("s", 10, &pl(&[], &[]));
    let mut s = snap(&a, &fleet, ss.clone());
    s.held = ss.iter().map(|x| x.handle.clone()).collect();
    s.release_limit = 5;
    let p = plan(&s);
    assert_eq!((p.releases.len(), p.releases_cut), (5, false));
    s.release_limit = 2;
    let p = plan(&s);
    assert_eq!((p.releases.len(), p.releases_cut), (2, true));
}

#[test]
fn the_fleet_size_comes_from_presence_not_from_seat_ownership() {
    // Nobody has claimed anything yet: three live nodes still divide the seats.
    let a = node("a", &[]);
    let fleet = [a.clone(), node("b", &[]), node("c", &[])];
    let p = plan(&snap(&a, &fleet, seats("s", 6, &pl(&[], &[]))));
    assert_eq!(p.capacity, 2);
}

#[test]
fn a_node_counts_itself_before_its_presence_row_is_seen() {
    let a = node("a", &[]);
    let p = plan(&snap(&a, &[node("b", &[])], seats("s", 4, &pl(&[], &[]))));
    assert_eq!(p.capacity, 2, "ceil(4 / 2): itself and b");
}

#[test]
fn seats_whose_preferred_hint_names_this_node_are_claimed_first() {
    let a = node("a", &[]);
    let fleet = [a.clone(), node("b", &[])];
    let mut ss = seats("s", 4, &pl(&[], &[]));
    ss[3].preferred = Some("a".into());
    ss[2].preferred = Some("a".into());
    ss[0].preferred = Some("b".into());
    let p = plan(&snap(&a, &fleet, ss));
    assert_eq!(p.claims, vec!["s002", "s003"]);
}

/// A restarted node's seats, free, with the hint naming it; b holds two
/// of five and has room for one more.
fn restart_world() -> Snapshot {
    let b = node("b", &[]);
    let mut a = node("a", &[]);
    // The crashed incarnation's row still says what it held.
    a.seats_held = Some(3);
    let mut ss = seats("s", 5, &pl(&[], &[]));
    for s in &mut ss[..3] {
        s.preferred = Some("a".into());
    }
    for s in &mut ss[3..] {
        s.preferred = Some("b".into());
    }
    let mut snap = snap(&b, &[a, b.clone()], ss);
    snap.held = ["s003", "s004"].iter().map(|s| s.to_string()).collect();
    snap.leased_to = BTreeMap::from([("b".to_string(), 2)]);
    snap
}

#[test]
fn a_free_seat_whose_hint_names_a_serving_peer_with_room_is_left_to_it() {
    let mut snap = restart_world();
    let p = plan(&snap);
    assert!(
        p.claims.is_empty(),
        "b takes none of a's seats: {:?}",
        p.claims
    );
    let mut left = p.deferred.clone();
    left.sort();
    assert_eq!(left, vec!["s000", "s001", "s002"]);
    // Room is counted from the leases naming a, not its stale row.
    snap.leased_to.insert("a".into(), 2);
    let p = plan(&snap);
    assert_eq!(
        p.deferred.len(),
        1,
        "a has room for one more: {:?}",
        p.deferred
    );
    assert_eq!(p.claims.len(), 1, "b claims into its own room");
}

#[test]
fn a_seat_left_to_its_last_holder_is_claimed_after_the_bounded_passes() {
    let mut snap = restart_world();
    for h in ["s000", "s001", "s002"] {
        snap.deferred.insert(h.into(), DEFER_PASSES);
    }
    let p = plan(&snap);
    assert_eq!(
        p.claims.len(),
        1,
        "b's room, taken once the passes are spent"
    );
    assert!(p.deferred.is_empty());
}

#[test]
fn a_free_seat_whose_hint_names_a_fading_node_waits_one_recheck_then_is_claimed() {
    let mut snap = restart_world();
    snap.fading.insert("a".into());
    let p = plan(&snap);
    assert!(p.claims.is_empty(), "{:?}", p.claims);
    let mut left = p.rechecks.clone();
    left.sort();
    assert_eq!(left, vec!["s000", "s001", "s002"]);
    // The recheck: a is gone for good.
    snap.presence.retain(|p| p.node_id != "a");
    snap.rechecked = p.rechecks.iter().cloned().collect();
    let p = plan(&snap);
    assert!(p.rechecks.is_empty());
    assert_eq!(
        p.claims.len(),
        3,
        "b's share of five on its own, four a pass at most"
    );
}

#[test]
fn a_free_seat_whose_hint_names_a_withdrawn_node_is_claimed_at_once() {
    let mut snap = restart_world();
    for p in &mut snap.presence {
        if p.node_id == "a" {
            p.withdrawn = true;
        }
    }
    let p = plan(&snap);
    assert!(p.deferred.is_empty() && p.rechecks.is_empty());
    assert_eq!(p.claims.len(), 3);
}

#[test]
fn groups_with_the_fewest_matching_nodes_are_tried_first() {
    let a = node("a", &["gpu"]);
    let fleet = [a.clone(), node("b", &[]), node("c", &[])];
    let mut ss = seats("any", 6, &pl(&[], &[]));
    ss.extend(seats("gpu", 1, &pl(&[], &["gpu"])));
    let mut s = snap(&a, &fleet, ss);
    s.claim_limit = 1;
    let p = plan(&s);
    assert_eq!(
        p.claims,
        vec!["gpu000"],
        "the seat with the fewest other homes goes first"
    );
}

#[test]
fn a_share_bounds_its_own_group_only_the_satellite_example() {
    // A satellite labelled for one pinned seat: it may not fill up on
    // unpinned seats and leave the pinned one unserved.
    let sat = node("sat", &["pinned"]);
    let fleet = [sat.clone(), node("b", &[]), node("c", &[])];
    let mut ss = seats("u", 9, &pl(&[], &[]));
    ss.push(seat("pin", pl(&[], &["pinned"])));
    let mut s = snap(&sat, &fleet, ss);
    s.claim_limit = 100;
    let p = plan(&s);
    let pinned = p
        .groups
        .iter()
        .find(|g| g.placement.labels == ["pinned"])
        .unwrap();
    let open = p
        .groups
        .iter()
        .find(|g| g.placement.labels.is_empty())
        .unwrap();
    assert_eq!((pinned.share, open.share), (1, 3));
    assert_eq!(p.claims.len(), 4);
    assert_eq!(p.claims[0], "pin");
    // Room in one group is never room in another.
    s.held = set(&["u000", "u001", "u002"]);
    let p = plan(&s);
    assert_eq!(p.claims, vec!["pin"]);
}

#[test]
fn a_node_over_its_share_gives_back_the_excess_even_within_total_capacity() {
    // A node that booted alone holds every seat; a joiner appears.
    let a = node("a", &[]);
    let fleet = [a.clone(), node("b", &[])];
    let mut s = snap(&a, &fleet, seats("s", 6, &pl(&[], &[])));
    s.held = s.seats.iter().map(|x| x.handle.clone()).collect();
    let p = plan(&s);
    assert_eq!(p.capacity, 3);
    assert_eq!(p.releases.len(), 2, "release_limit 2");
    assert!(
        p.releases
            .iter()
            .all(|(_, r)| *r == ReleaseReason::Rebalance)
    );
    assert!(p.claims.is_empty());
}

#[test]
fn the_least_constrained_group_is_given_back_first() {
    let a = node("a", &["gpu"]);
    let fleet = [a.clone(), node("b", &["gpu"]), node("c", &[])];
    let mut ss = seats("any", 3, &pl(&[], &[]));
    ss.extend(seats("gpu", 4, &pl(&[], &["gpu"])));
    let mut s = snap(&a, &fleet, ss);
    s.held = set(&[
        "any000", "any001", "any002", "gpu000", "gpu001", "gpu002", "gpu003",
    ]);
    s.release_limit = 1;
    let p = plan(&s);
    assert_eq!(p.releases.len(), 1);
    assert!(p.releases[0].0.starts_with("any"), "{:?}", p.releases);
}

#[test]
fn seats_that_prefer_this_node_are_kept_when_giving_back() {
    let a = node("a", &[]);
    let fleet = [a.clone(), node("b", &[])];
    let mut ss = seats("s", 4, &pl(&[], &[]));
    ss[0].preferred = Some("a".into());
    ss[1].preferred = Some("a".into());
    let mut s = snap(&a, &fleet, ss);
    s.held = set(&["s000", "s001", "s002", "s003"]);
    let p = plan(&s);
    let given: BTreeSet<&str> = p.releases.iter().map(|(h, _)| h.as_str()).collect();
    assert_eq!(given, BTreeSet::from(["s002", "s003"]));
}

#[test]
fn a_stuck_seat_squeezes_the_unpinned_group_not_the_pinned_one() {
    let a = node("a", &["pinned"]);
    let fleet = [a.clone(), node("b", &[])];
    let mut ss = seats("u", 2, &pl(&[], &[]));
    ss.push(seat("pin", pl(&[], &["pinned"])));
    let mut s = snap(&a, &fleet, ss);
    s.held = set(&["u000"]);
    s.undead = set(&["stuck"]); // its role is gone: in no group at all
    let p = plan(&s);
    assert_eq!(p.capacity, 2, "pinned share 1 + unpinned share 1");
    assert_eq!(p.claims, vec!["pin"], "the pinned seat is claimed");
    assert_eq!(
        p.releases,
        vec![("u000".to_string(), ReleaseReason::Rebalance)]
    );
}

#[test]
fn withdrawn_nodes_are_excluded_from_every_share() {
    let a = node("a", &[]);
    let mut b = node("b", &[]);
    b.withdrawn = true;
    let p = plan(&snap(&a, &[a.clone(), b], seats("s", 4, &pl(&[], &[]))));
    assert_eq!(p.capacity, 4);
}

#[test]
fn an_unserviceable_node_gives_every_seat_back_and_claims_nothing() {
    let a = node("a", &[]);
    let mut s = snap(
        &a,
        &[a.clone(), node("b", &[])],
        seats("s", 4, &pl(&[], &[])),
    );
    s.unserviceable = true;
    s.held = set(&["s000"]);
    let p = plan(&s);
    assert_eq!(p.withheld, Some(Withheld::Unserviceable));
    assert_eq!(
        p.releases,
        vec![("s000".to_string(), ReleaseReason::Unserviceable)]
    );
    assert!(p.claims.is_empty());
}

#[test]
fn a_group_no_live_node_matches_is_reported_unplaceable() {
    let a = node("a", &[]);
    let mut ss = seats("s", 2, &pl(&[], &[]));
    ss.push(seat("orphan", pl(&["gone-node"], &[])));
    ss.push(seat("gpu", pl(&[], &["gpu"])));
    let p = plan(&snap(&a, std::slice::from_ref(&a), ss));
    assert_eq!(p.unplaceable, vec!["orphan", "gpu"]);
    assert!(!p.claims.contains(&"orphan".to_string()));
}

#[test]
fn a_draining_node_claims_nothing() {
    let a = node("a", &[]);
    let mut s = snap(&a, std::slice::from_ref(&a), seats("s", 3, &pl(&[], &[])));
    s.draining = true;
    let p = plan(&s);
    assert_eq!(p.withheld, Some(Withheld::Draining));
    assert!(p.claims.is_empty());
}

#[test]
fn a_node_that_is_behind_keeps_its_seats_and_claims_no_new_ones() {
    let a = node("a", &[]);
    let mut s = snap(&a, std::slice::from_ref(&a), seats("s", 3, &pl(&[], &[])));
    s.behind = true;
    s.held = set(&["s000"]);
    let p = plan(&s);
    assert_eq!(p.withheld, Some(Withheld::Behind));
    assert!(p.claims.is_empty() && p.releases.is_empty());
}

#[test]
fn fleet_full_when_presence_counts_cover_every_placeable_seat() {
    let mut a = node("a", &[]);
    a.seats_held = Some(1);
    let mut b = node("b", &[]);
    b.seats_held = Some(2);
    let mut s = snap(&a, &[a.clone(), b.clone()], seats("s", 3, &pl(&[], &[])));
    s.held = set(&["s000"]);
    // a has room for one more (share 2) but every seat is held: try none.
    let p = plan(&s);
    assert_eq!(p.withheld, Some(Withheld::FleetFull));
    assert!(p.claims.is_empty());
    // A count a row does not carry reads as zero, erring toward trying.
    b.seats_held = None;
    let p = plan(&snap(&a, &[a.clone(), b], seats("s", 3, &pl(&[], &[]))));
    assert_eq!(p.withheld, None);
}

#[test]
fn a_seat_whose_role_is_gone_is_released_as_role_gone() {
    let a = node("a", &[]);
    let mut s = snap(&a, std::slice::from_ref(&a), seats("s", 1, &pl(&[], &[])));
    s.held = set(&["s000", "removed"]);
    let p = plan(&s);
    assert_eq!(
        p.releases,
        vec![("removed".to_string(), ReleaseReason::RoleGone)]
    );
}

#[test]
fn a_seat_whose_placement_moved_away_is_released_as_placement_moved() {
    let a = node("a", &[]);
    let mut s = snap(
        &a,
        &[a.clone(), node("b", &[])],
        vec![seat("s", pl(&["b"], &[]))],
    );
    s.held = set(&["s"]);
    let p = plan(&s);
    assert_eq!(
        p.releases,
        vec![("s".to_string(), ReleaseReason::PlacementMoved)]
    );
}

#[test]
fn a_single_node_holds_every_seat() {
    let a = node("a", &[]);
    let mut s = snap(&a, std::slice::from_ref(&a), seats("s", 9, &pl(&[], &[])));
    let mut rounds = 0;
    while s.held.len() < 9 {
        let p = plan(&s);
        assert!(!p.claims.is_empty());
        s.held.extend(p.claims);
        rounds += 1;
    }
    assert_eq!(rounds, 3, "4 + 4 + 1 with claim_limit 4");
}

// ---- properties over random fleets ----

#[derive(Clone, Debug)]
struct World {
    nodes: Vec<Presence>,
    seats: Vec<SeatSpec>,
    /// seat → holder node id
    holder: BTreeMap<String, String>,
    undead: BTreeMap<String, String>,
}

fn arb_world() -> impl Strategy<Value = World> {
    let labels = prop::sample::subsequence(vec!["gpu", "eu"], 0..=2);
    let nodes = prop::collection::vec(labels, 1..6);
    (
        nodes,
        0usize..30,
        prop::collection::vec((0u8..6, 0u8..4), 0..30),
        0usize..3,
    )
        .prop_map(|(node_labels, n_seats, kinds, n_undead)| {
            let nodes: Vec<Presence> = node_labels
                .iter()
                .enumerate()
                .map(|(i, l)| node(&format!("n{i}"), l))
                .collect();
            let mut seats = Vec::new();
            for i in 0..n_seats {
                let (k, pin) = kinds.get(i).copied().unwrap_or((0, 0));
                let p = match k {
                    0..=2 => pl(&[], &[]),
                    3 => pl(&[], &["gpu"]),
                    4 => pl(&[], &["eu"]),
                    _ => pl(&[&format!("n{pin}")], &[]),
                };
                seats.push(seat(&format!("s{i:02}"), p));
            }
            let mut undead = BTreeMap::new();
            for (i, n) in nodes.iter().enumerate().take(n_undead) {
                undead.insert(format!("stuck{i}"), n.node_id.clone());
            }
            World {
                nodes,
                seats,
                holder: BTreeMap::new(),
                undead,
            }
        })
}

fn snapshot_for(w: &World, me: &Presence) -> Snapshot {
    let mut presence = w.nodes.clone();
    for p in &mut presence {
        let held = w.holder.values().filter(|h| **h == p.node_id).count()
            + w.undead.values().filter(|h| **h == p.node_id).count();
        p.seats_held = Some(held as u32);
    }
    Snapshot {
        node_id: me.node_id.clone(),
        labels: me.labels.clone(),
        seats: w.seats.clone(),
        presence,
        held: w
            .holder
            .iter()
            .filter(|(_, h)| **h == me.node_id)
            .map(|(s, _)| s.clone())
            .collect(),
        undead: w
            .undead
            .iter()
            .filter(|(_, h)| **h == me.node_id)
            .map(|(s, _)| s.clone())
            .collect(),
        held_elsewhere: w
            .holder
            .iter()
            .filter(|(_, h)| **h != me.node_id)
            .map(|(s, _)| s.clone())
            .collect(),
        claim_limit: 4,
        release_limit: 2,
        ..Snapshot::default()
    }
}

/// One round: every node plans against the world as it is when its turn
/// comes, then acts (claims win only on free seats). Returns whether
/// anything changed.
fn round(w: &mut World) -> bool {
    let mut changed = false;
    for me in w.nodes.clone() {
        let p = plan(&snapshot_for(w, &me));
        for (h, _) in p.releases {
            w.holder.remove(&h);
            changed = true;
        }
        for h in p.claims {
            if let std::collections::btree_map::Entry::Vacant(e) = w.holder.entry(h) {
                e.insert(me.node_id.clone());
                changed = true;
            }
        }
    }
    changed
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn shares_always_cover_every_group_some_eligible_live_node_matches(w in arb_world()) {
        let mut by_group: BTreeMap<PlacementKey, usize> = BTreeMap::new();
        for me in &w.nodes {
            let p = plan(&snapshot_for(&w, me));
            for g in &p.groups {
                *by_group.entry(PlacementKey::of(&g.placement)).or_default() += g.share;
            }
        }
        let first = plan(&snapshot_for(&w, &w.nodes[0]));
        for g in &first.groups {
            if g.matching_nodes > 0 {
                prop_assert!(by_group[&PlacementKey::of(&g.placement)] >= g.size,
                    "group {:?} of {} covered by {}", g.placement, g.size, by_group[&PlacementKey::of(&g.placement)]);
            }
        }
    }

    #[test]
    fn rounds_converge_without_oscillating_and_respect_placement(mut w in arb_world(), joiners in 0usize..3) {
        // Some nodes boot late: the first ones take everything first.
        let late: Vec<Presence> = w.nodes.split_off(w.nodes.len().saturating_sub(joiners).max(1));
        let mut quiet = 0;
        for _ in 0..60 {
            if !round(&mut w) { quiet += 1; if quiet == 2 { break; } } else { quiet = 0; }
        }
        w.nodes.extend(late);
        let mut settled = false;
        for _ in 0..80 {
            if !round(&mut w) && !round(&mut w) { settled = true; break; }
        }
        prop_assert!(settled, "no fixed point after 80 rounds: {:?}", w.holder);
        // Never outside its placement.
        for (s, h) in &w.holder {
            let spec = w.seats.iter().find(|x| &x.handle == s).unwrap();
            let n = w.nodes.iter().find(|n| &n.node_id == h).unwrap();
            prop_assert!(matches_placement(&n.node_id, &n.labels, &spec.placement), "{s} on {h}");
        }
        // Every placeable seat is held, unless the undead seats took the
        // only room of every node that may run it.
        let placeable_seats = placeable(&w.seats, &w.nodes);
        let stuck_anywhere = !w.undead.is_empty();
        for s in placeable_seats {
            prop_assert!(w.holder.contains_key(&s.handle) || stuck_anywhere, "{} unheld: {:?}", s.handle, w.holder);
        }
    }
}

fn claimed(p: &Plan) -> BTreeSet<String> {
    p.claims.iter().cloned().collect()
}

#[test]
fn a_better_ranked_node_with_room_takes_unpreferred_seats_first_for_a_bounded_time() {
    let (a, b) = (node("a", &[]), node("b", &[]));
    let fleet = [a.clone(), b.clone()];
    let mut s = snap(&a, &fleet, seats("s", 4, &pl(&[], &[])));
    s.ranking = vec!["b".into(), "a".into()];
    // What b, ranked first, tries this pass.
    let mut sb = snap(&b, &fleet, seats("s", 4, &pl(&[], &[])));
    sb.ranking = s.ranking.clone();
    let theirs = claimed(&plan(&sb));
    assert_eq!(theirs.len(), 2, "b's share");
    let p = plan(&s);
    assert!(
        claimed(&p).is_disjoint(&theirs),
        "a leaves b the seats b tries first: a {:?}, b {theirs:?}",
        p.claims
    );
    assert_eq!(
        p.claims.len(),
        2,
        "the rest would come back to a anyway: a claims them now"
    );
    assert!(
        p.deferred.iter().all(|h| theirs.contains(h)),
        "{:?}",
        p.deferred
    );
    // After DEFER_PASSES passes of b not taking them, a claims them.
    for h in &theirs {
        s.deferred.insert(h.clone(), DEFER_PASSES);
    }
    let p = plan(&s);
    assert_eq!(claimed(&p), theirs, "its share, no more: b's untaken seats");
    // A seat that prefers a is a's at once, ranking or not.
    let mut s2 = snap(&a, &fleet, seats("s", 4, &pl(&[], &[])));
    s2.ranking = vec!["b".into(), "a".into()];
    s2.seats[0].preferred = Some("a".into());
    let p2 = plan(&s2);
    assert_eq!(p2.claims.len(), 2);
    assert_eq!(p2.claims[0], "s000");
    // Ranked first, a defers to nobody.
    let mut s3 = snap(&a, &fleet, seats("s", 4, &pl(&[], &[])));
    s3.ranking = vec!["a".into(), "b".into()];
    let p3 = plan(&s3);
    assert_eq!(p3.claims.len(), 2);
    assert!(p3.deferred.is_empty());
}

#[test]
fn a_dead_better_ranked_nodes_seats_are_not_left_waiting_for_a_node_without_room() {
    // Three nodes, b ranked first; c died with its two seats. b has room
    // for one more: a leaves b the one seat b tries and claims the other
    // at once, so the dead node's seats are dark for the TTL and one pass,
    // not passes more.
    let (a, mut b) = (node("a", &[]), node("b", &[]));
    b.seats_held = Some(1);
    let mut a_now = a.clone();
    a_now.seats_held = Some(0);
    let fleet = [a_now.clone(), b.clone()];
    let mut s = snap(&a_now, &fleet, seats("s", 4, &pl(&[], &[])));
    s.held_elsewhere = ["s000".to_string(), "s001".to_string()].into();
    s.ranking = vec!["b".into(), "a".into()];
    // b holds s000; the dead node's s001 is still leased.
    let mut sb = snap(&b, &fleet, seats("s", 4, &pl(&[], &[])));
    sb.held = set(&["s000"]);
    sb.held_elsewhere = set(&["s001"]);
    sb.ranking = s.ranking.clone();
    let theirs = plan(&sb).claims;
    assert_eq!(theirs.len(), 1, "b has room for one");
    let p = plan(&s);
    assert_eq!(p.deferred, theirs, "a leaves b the seat b tries");
    let other: Vec<String> = ["s002", "s003"]
        .iter()
        .map(|h| h.to_string())
        .filter(|h| !theirs.contains(h))
        .collect();
    assert_eq!(p.claims, other, "and claims the other at once");
    // b at its share: a defers nothing.
    b.seats_held = Some(2);
    s.presence = vec![a_now, b];
    let p = plan(&s);
    assert!(p.deferred.is_empty());
    assert_eq!(claimed(&p), set(&["s002", "s003"]));
}

#[test]
fn nodes_sweeping_at_once_try_different_free_seats_not_the_same_first_ones() {
    // Fleets starting cold (nothing held, every presence seen): each node
    // plans the same pass against the same snapshot. Trying free seats in
    // one shared order, every node would try the same claim_limit seats
    // and all but one claim of each would lose (distinct / tried = 1 / n).
    let mut next = lcg(11);
    let (mut tried, mut distinct) = (0usize, 0usize);
    for _ in 0..200 {
        let n = 2 + next() % 4;
        let fleet: Vec<Presence> = (0..n)
            .map(|_| node(&format!("node-{}", next() % 100_000), &[]))
            .collect();
        let count = 40 + next() % 400;
        let mut pass = BTreeSet::new();
        for me in &fleet {
            let p = plan(&snap(me, &fleet, seats("s", count, &pl(&[], &[]))));
            tried += p.claims.len();
            pass.extend(p.claims);
        }
        distinct += pass.len();
    }
    let spread = distinct as f64 / tried as f64;
    assert!(
        spread > 0.9,
        "{distinct} distinct seats of {tried} tried ({spread:.2})"
    );
}

#[test]
fn the_ranking_never_changes_a_share() {
    // Random fleets: with any ranking, what a node may claim is bounded by
    // the same allowance as without one.
    let mut next = lcg(7);
    for _ in 0..300 {
        let n = 1 + next() % 4;
        let fleet: Vec<Presence> = (0..n)
            .map(|i| {
                let mut p = node(&format!("n{i}"), &[]);
                p.seats_held = Some((next() % 4) as u32);
                p
            })
            .collect();
        let me = fleet[next() % n].clone();
        let mut s = snap(&me, &fleet, seats("s", 1 + next() % 12, &pl(&[], &[])));
        s.claim_limit = 100;
        let unranked = plan(&s);
        let mut order: Vec<String> = fleet.iter().map(|p| p.node_id.clone()).collect();
        order.rotate_left(next() % n);
        s.ranking = order;
        let ranked = plan(&s);
        assert_eq!(ranked.capacity, unranked.capacity);
        assert!(ranked.claims.len() <= unranked.claims.len());
        assert!(
            ranked
                .claims
                .iter()
                .all(|c| unranked.claims.contains(c) || !s.held.contains(c))
        );
    }
}

#[test]
fn the_successor_is_the_best_ranked_matching_node_with_room() {
    let a = node("a", &[]);
    let mut b = node("b", &["gpu"]);
    let mut c = node("c", &["gpu"]);
    b.seats_held = Some(0);
    c.seats_held = Some(0);
    let fleet = [a.clone(), b.clone(), c.clone()];
    let gpu = pl(&[], &["gpu"]);
    let mut s = snap(&a, &fleet, seats("g", 4, &gpu));
    let seat = s.seats[0].clone();
    let none = BTreeSet::new();
    let offered = BTreeMap::new();
    // No ranking: the first by id.
    assert_eq!(successor(&s, &seat, &none, &offered), Some("b".into()));
    s.ranking = vec!["c".into(), "b".into(), "a".into()];
    assert_eq!(successor(&s, &seat, &none, &offered), Some("c".into()));
    // c full (its share of 4 over b and c is 2), b it is.
    s.presence[2].seats_held = Some(2);
    assert_eq!(successor(&s, &seat, &none, &offered), Some("b".into()));
    // What was already offered counts; a node that let an offer lapse is
    // excluded; nobody left means release-then-claim.
    let mut o = BTreeMap::new();
    o.insert("b".to_string(), 2usize);
    assert_eq!(successor(&s, &seat, &none, &o), None);
    assert_eq!(successor(&s, &seat, &set(&["b"]), &offered), None);
    // Never a node outside the seat's placement (a has no gpu label).
    let mut s2 = snap(&b, &fleet, seats("g", 4, &gpu));
    s2.presence[2].seats_held = Some(2);
    assert_eq!(successor(&s2, &s2.seats[0].clone(), &none, &offered), None);
}

#[test]
fn a_seat_moved_to_another_node_is_left_to_it() {
    let a = node("a", &[]);
    let fleet = [a.clone(), node("b", &[])];
    let mut s = snap(&a, &fleet, seats("s", 2, &pl(&[], &[])));
    s.moves.insert("s000".into(), "b".into());
    let p = plan(&s);
    assert!(!p.claims.contains(&"s000".to_string()), "{:?}", p.claims);
    s.moves.insert("s000".into(), "a".into());
    assert!(plan(&s).claims.contains(&"s000".to_string()));
}

/// Found by the dashboard's fleet test: a seat a person moved to a node
/// already at its share was given back for balance by that node, and its
/// old holder, seeing the move still standing, handed it over again: a
/// hand-off a second, both ways, for the request's two minutes. The target
/// keeps it while the request stands and gives back another.
#[test]
fn a_seat_moved_to_this_node_is_not_given_back_for_balance_while_the_request_stands() {
    let a = node("a", &[]);
    let fleet = [a.clone(), node("b", &[])];
    let mut s = snap(&a, &fleet, seats("s", 4, &pl(&[], &[])));
    // a holds one over its share of two; the highest handle goes first.
    s.held = set(&["s000", "s001", "s003"]);
    let given =
        |s: &Snapshot| -> Vec<String> { plan(s).releases.into_iter().map(|(h, _)| h).collect() };
    assert_eq!(given(&s), ["s003"]);
    s.moves.insert("s003".into(), "a".into());
    assert_eq!(given(&s), ["s001"], "the moved seat is kept, another goes");
}

#[test]
fn a_seat_this_node_could_not_establish_is_left_to_a_peer_and_retried_when_none_may_run_it() {
    let a = node("a", &[]);
    let fleet = [a.clone(), node("b", &[])];
    let mut s = snap(&a, &fleet, seats("s", 2, &pl(&[], &[])));
    s.handed_back = set(&["s000"]);
    let p = plan(&s);
    assert!(
        !p.claims.contains(&"s000".to_string()),
        "left to b: {:?}",
        p.claims
    );
    assert_eq!(p.claims, ["s001"], "the other seat is claimed as ever");
    // Alone, a tries it again at once: nobody else would.
    let mut alone = snap(&a, std::slice::from_ref(&a), seats("s", 2, &pl(&[], &[])));
    alone.handed_back = set(&["s000"]);
    assert!(plan(&alone).claims.contains(&"s000".to_string()));
    // A peer outside the seat's placement does not count.
    let gpu = pl(&[], &["gpu"]);
    let mut pinned = snap(
        &node("a", &["gpu"]),
        &[node("a", &["gpu"]), node("b", &[])],
        seats("g", 1, &gpu),
    );
    pinned.handed_back = set(&["g000"]);
    assert_eq!(plan(&pinned).claims, ["g000"]);
}

#[test]
fn seats_this_node_could_not_establish_are_tried_after_every_seat_not_tried_yet() {
    let a = node("a", &[]);
    let mut alone = snap(&a, std::slice::from_ref(&a), seats("s", 6, &pl(&[], &[])));
    alone.claim_limit = 4;
    // Four seats failed here, more than a pass's claims: the two never
    // tried come first, whatever the order would have been.
    alone.handed_back = set(&["s000", "s001", "s002", "s003"]);
    let p = plan(&alone);
    assert_eq!(p.claims.len(), 4);
    assert_eq!(
        p.claims[..2].iter().collect::<BTreeSet<_>>(),
        ["s004".to_string(), "s005".to_string()].iter().collect(),
        "{:?}",
        p.claims
    );
}
