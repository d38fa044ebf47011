//! What ownership looks like from outside (spec § What ownership looks like
//! from outside): every live node with its seats, roles, labels, protocol,
//! presence expiry and status, read from the coordination store.
//!
//! [`fleet_from_leases`] is pure; [`read_fleet`] does the two reads.

use std::collections::BTreeMap;

use app::api::{FleetView, HeldSeatView, NodeStatus, NodeView};

use crate::coord::lease::LeaseState;
use crate::coord::{Lease, Store, StoreError};

fn strings(l: &Lease, key: &str) -> Vec<String> {
    l.metadata
        .get(key)
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn flag(l: &Lease, key: &str) -> bool {
    l.metadata
        .get(key)
        .and_then(|v| v.as_bool())
        .unwrap_or(false)
}

/// Pure: the seats each incarnation holds (a committed tenure each), and
/// the incarnations whose seat leases say they are draining (a draining
/// node marks them before it gives its presence up).
fn seats_by_owner(
    seats: &[Lease],
) -> (
    BTreeMap<&str, Vec<HeldSeatView>>,
    std::collections::BTreeSet<&str>,
) {
    let mut by_owner: BTreeMap<&str, Vec<HeldSeatView>> = BTreeMap::new();
    let mut draining: std::collections::BTreeSet<&str> = Default::default();
    for s in seats {
        if flag(s, "draining") {
            draining.insert(s.owner.as_str());
        }
        // A claim's first write (no epoch minted yet) is no tenure: the
        // seat is listed once its epoch is (the Nodes page showed a new
        // seat "epoch 0" while its claim was in flight).
        if s.state == LeaseState::Claiming {
            continue;
        }
        if let Some(handle) = s.resource.strip_prefix("seat:") {
            by_owner
                .entry(s.owner.as_str())
                .or_default()
                .push(HeldSeatView {
                    handle: handle.to_string(),
                    epoch: s.epoch,
                    since: s.acquired_at.to_string(),
                });
        }
    }
    (by_owner, draining)
}

/// Pure: the fleet from the live presence and seat leases.
pub fn fleet_from_leases(
    answered_by: &str,
    company: &str,
    coordination: &str,
    presence: &[Lease],
    seats: &[Lease],
) -> FleetView {
    let (mut by_owner, draining) = seats_by_owner(seats);
    let mut nodes: Vec<NodeView> = presence
        .iter()
        .filter_map(|p| {
            let node_id = p.resource.strip_prefix("node:")?.to_string();
            let status = if flag(p, "draining") {
                NodeStatus::Draining
            } else if flag(p, "seats_withdrawn") {
                NodeStatus::Withdrawn
            } else if flag(p, "behind") {
                NodeStatus::Behind
            } else {
                NodeStatus::Serving
            };
            let mut seats = by_owner.remove(p.owner.as_str()).unwrap_or_default();
            seats.sort_by(|a, b| a.handle.cmp(&b.handle));
            Some(NodeView {
                node_id,
                incarnation: p.owner.clone(),
                version: p
                    .metadata
                    .get("version")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_string(),
                protocol: p.protocol,
                status,
                roles: strings(p, "roles"),
                labels: strings(p, "labels"),
                presence_expires_at: Some(p.expires_at.to_string()),
                seats,
                last_status: None,
            })
        })
        .collect();
    // A draining node gives its presence up first and keeps serving its
    // seats until each is handed over: show those seats under their owner,
    // draining when its seats say so. Without the mark the node renews its
    // seats and its presence is merely late (not recorded yet at boot, or a
    // renewal that failed): it is serving.
    for (owner, mut seats) in by_owner {
        seats.sort_by(|a, b| a.handle.cmp(&b.handle));
        let node_id = owner.split_once(':').map_or(owner, |(n, _)| n).to_string();
        nodes.push(NodeView {
            node_id,
            incarnation: owner.to_string(),
            version: String::new(),
            protocol: 0,
            status: if draining.contains(owner) {
                NodeStatus::Draining
            } else {
                NodeStatus::Serving
            },
            roles: Vec::new(),
            labels: Vec::new(),
            presence_expires_at: None,
            seats,
            last_status: None,
        });
    }
    nodes.sort_by(|a, b| {
        a.node_id
            .cmp(&b.node_id)
            .then(a.incarnation.cmp(&b.incarnation))
    });
    FleetView {
        answered_by: answered_by.to_string(),
        company: company.to_string(),
        coordination: coordination.to_string(),
        nodes,
        read_at: String::new(),
        stale: None,
        alarms: Vec::new(),
    }
}

/// Read the fleet from the store.
pub async fn read_fleet(
    store: &dyn Store,
    answered_by: &str,
    company: &str,
    coordination: &str,
) -> Result<FleetView, StoreError> {
    let presence = store.list("node:").await?;
    let seats = store.list("seat:").await?;
    Ok(fleet_from_leases(
        answered_by,
        company,
        coordination,
        &presence,
        &seats,
    ))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::coord::StoreTime;

    fn lease(resource: &str, owner: &str, flags: &[&str]) -> Lease {
        Lease {
            resource: resource.into(),
            owner: owner.into(),
            epoch: 3,
            acquired_at: StoreTime::from_unix_nanos(1_000_000_000),
            expires_at: StoreTime::from_unix_nanos(16_000_000_000),
            preferred: owner.split(':').next().unwrap_or_default().into(),
            protocol: 4,
            state: LeaseState::Held,
            metadata: flags
                .iter()
                .map(|f| (f.to_string(), serde_json::Value::Bool(true)))
                .collect(),
            revision: 1,
            ttl: Duration::from_secs(15),
            claim: String::new(),
            offer: None,
        }
    }

    fn statuses(presence: &[Lease], seats: &[Lease]) -> Vec<(String, NodeStatus)> {
        fleet_from_leases("a", "c", "embedded-kv", presence, seats)
            .nodes
            .into_iter()
            .map(|n| (n.node_id, n.status))
            .collect()
    }

    #[test]
    fn a_nodes_status_is_read_from_its_presence_draining_first_then_withdrawn_then_behind() {
        let presence = [
            lease("node:a", "a:1", &[]),
            lease("node:b", "b:1", &["draining", "seats_withdrawn", "behind"]),
            lease("node:c", "c:1", &["seats_withdrawn", "behind"]),
            lease("node:d", "d:1", &["behind"]),
        ];
        assert_eq!(
            statuses(&presence, &[]),
            [
                ("a".to_string(), NodeStatus::Serving),
                ("b".to_string(), NodeStatus::Draining),
                ("c".to_string(), NodeStatus::Withdrawn),
                ("d".to_string(), NodeStatus::Behind),
            ]
        );
    }

    #[test]
    fn seats_held_by_an_incarnation_without_presence_are_shown_under_it_as_draining() {
        // A draining node marks its seats, gives its presence up first and
        // keeps its seats until each is handed over.
        let presence = [lease("node:a", "a:1", &[])];
        let seats = [
            lease("seat:s2", "b:9", &["draining"]),
            lease("seat:s1", "b:9", &["draining"]),
            lease("seat:s3", "a:1", &[]),
        ];
        let fleet = fleet_from_leases("a", "c", "embedded-kv", &presence, &seats);
        let b = fleet.nodes.iter().find(|n| n.incarnation == "b:9").unwrap();
        assert_eq!(b.node_id, "b");
        assert_eq!(b.status, NodeStatus::Draining);
        assert_eq!(b.presence_expires_at, None);
        let held: Vec<_> = b.seats.iter().map(|s| s.handle.as_str()).collect();
        assert_eq!(held, ["s1", "s2"]);
        let a = fleet.nodes.iter().find(|n| n.node_id == "a").unwrap();
        assert_eq!(a.seats.len(), 1);
        assert_eq!(a.seats[0].epoch, 3);
    }

    #[test]
    fn a_seat_whose_claim_has_not_minted_its_epoch_is_not_shown_held() {
        let presence = [lease("node:a", "a:1", &[])];
        let mut claiming = lease("seat:s2", "a:1", &[]);
        claiming.state = LeaseState::Claiming;
        claiming.epoch = 0;
        let seats = [lease("seat:s1", "a:1", &[]), claiming];
        let fleet = fleet_from_leases("a", "c", "embedded-kv", &presence, &seats);
        let held: Vec<_> = fleet.nodes[0]
            .seats
            .iter()
            .map(|s| (s.handle.as_str(), s.epoch))
            .collect();
        assert_eq!(held, [("s1", 3)]);
    }

    #[test]
    fn a_live_node_whose_presence_is_late_is_serving_not_draining() {
        // Seats renewed, presence not recorded yet (a boot under load) or
        // its renewal failed: the node is serving.
        let seats = [lease("seat:s1", "b:9", &[])];
        assert_eq!(
            statuses(&[], &seats),
            [("b".to_string(), NodeStatus::Serving)]
        );
    }
}
