//! What ownership looks like from outside (seed § What ownership looks like
//! from outside): every live node with its seats, roles, labels, protocol,
//! presence expiry and status, read from the coordination store.
//!
//! [`fleet_from_leases`] is pure; [`read_fleet`] does the two reads.

use std::collections::BTreeMap;

use app::api::{FleetView, HeldSeatView, NodeStatus, NodeView};

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

/// Pure: the fleet from the live presence and seat leases.
pub fn fleet_from_leases(
    answered_by: &str,
    company: &str,
    coordination: &str,
    presence: &[Lease],
    seats: &[Lease],
) -> FleetView {
    let mut by_owner: BTreeMap<&str, Vec<HeldSeatView>> = BTreeMap::new();
    for s in seats {
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
    // seats until each is handed over: show those seats under their owner.
    for (owner, mut seats) in by_owner {
        seats.sort_by(|a, b| a.handle.cmp(&b.handle));
        let node_id = owner.split_once(':').map_or(owner, |(n, _)| n).to_string();
        nodes.push(NodeView {
            node_id,
            incarnation: owner.to_string(),
            version: String::new(),
            protocol: 0,
            status: NodeStatus::Draining,
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
