//! The fleet as Settings › Nodes words it: durations, the presence a node
//! has left, and the fleet shown while the page cannot follow it.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::api::{FleetView, NodeStatus, NodeView};

/// `4 min 12 s`, `2 h 5 min`, `12 s`.
pub fn duration_words(seconds: u64) -> String {
    let (h, m, s) = (seconds / 3600, (seconds % 3600) / 60, seconds % 60);
    match (h, m) {
        (0, 0) => format!("{s} s"),
        (0, _) if s == 0 => format!("{m} min"),
        (0, _) => format!("{m} min {s} s"),
        (_, 0) => format!("{h} h"),
        _ => format!("{h} h {m} min"),
    }
}

/// Seconds since 1970 of an RFC 3339 UTC timestamp as the node writes
/// them (`2026-11-30T08:02:11Z`, fractions allowed); `None` for anything
/// else (another separator, an offset other than `Z`, a date that is not
/// in the calendar).
pub fn rfc3339_seconds(at: &str) -> Option<f64> {
    if at.as_bytes().get(10) != Some(&b'T') || !at.ends_with('Z') {
        return None;
    }
    let t = OffsetDateTime::parse(at, &Rfc3339).ok()?;
    Some(t.unix_timestamp() as f64 + f64::from(t.nanosecond()) / 1e9)
}

/// Whole seconds a node's presence lease had left when the roster was
/// read (`read_at`), `ticks` seconds ago; `None` when it runs no presence
/// lease or a time cannot be read. Never below zero.
pub fn presence_left(node: &NodeView, read_at: &str, ticks: u64) -> Option<u64> {
    let expires = rfc3339_seconds(node.presence_expires_at.as_deref()?)?;
    let read = rfc3339_seconds(read_at)?;
    let left = (expires - read).floor() as i64 - ticks as i64;
    Some(left.max(0) as u64)
}

/// The fleet as the page shows it while it cannot follow the fleet (its
/// event stream is lost): nothing it shows can be trusted to be current,
/// so every node's status is `unknown` with the status last read beside
/// it, and `stale` says why. A fleet already stale is left as it is.
pub fn unfollowed(mut fleet: FleetView, why: &str) -> FleetView {
    if fleet.stale.is_some() {
        return fleet;
    }
    for n in &mut fleet.nodes {
        n.last_status = Some(n.status);
        n.status = NodeStatus::Unknown;
    }
    fleet.stale = Some(why.to_string());
    fleet
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(status: NodeStatus, expires: Option<&str>) -> NodeView {
        NodeView {
            node_id: "node-a".into(),
            incarnation: "node-a:1".into(),
            version: "0.1.0".into(),
            protocol: 4,
            status,
            roles: vec![],
            labels: vec![],
            presence_expires_at: expires.map(str::to_string),
            seats: vec![],
            last_status: None,
        }
    }

    #[test]
    fn rfc3339_seconds_reads_the_nodes_timestamps_and_nothing_else() {
        assert_eq!(rfc3339_seconds("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(rfc3339_seconds("2000-03-01T00:00:01Z"), Some(951_868_801.0));
        assert_eq!(
            rfc3339_seconds("2026-11-30T08:02:11.250Z"),
            Some(1_796_025_731.25)
        );
        for bad in [
            "",
            "yesterday",
            "2026-11-30 08:02:11Z",
            "2026-13-30T08:02:11Z",
            "2026-11-30T08:02:11+01:00",
            "2026-11-30t08:02:11Z",
            "2026-02-30T08:02:11Z",
        ] {
            assert_eq!(rfc3339_seconds(bad), None, "{bad}");
        }
    }

    #[test]
    fn presence_counts_down_from_the_roster_read_and_stops_at_zero() {
        let n = node(NodeStatus::Serving, Some("2026-11-30T08:00:15Z"));
        let read = "2026-11-30T08:00:05Z";
        assert_eq!(presence_left(&n, read, 0), Some(10));
        assert_eq!(presence_left(&n, read, 4), Some(6));
        assert_eq!(presence_left(&n, read, 30), Some(0));
        assert_eq!(
            presence_left(&node(NodeStatus::Serving, None), read, 0),
            None
        );
        assert_eq!(presence_left(&n, "not a time", 0), None);
    }

    #[test]
    fn a_fleet_the_page_cannot_follow_shows_every_status_unknown_with_the_last_one_beside_it() {
        let fleet = FleetView {
            answered_by: "node-a".into(),
            company: "c".into(),
            coordination: "embedded-kv".into(),
            nodes: vec![
                node(NodeStatus::Serving, None),
                node(NodeStatus::Draining, None),
            ],
            read_at: "2026-11-30T08:00:05Z".into(),
            stale: None,
            alarms: vec![],
        };
        let shown = unfollowed(fleet.clone(), "the event stream is lost");
        assert_eq!(shown.stale.as_deref(), Some("the event stream is lost"));
        assert_eq!(shown.read_at, fleet.read_at);
        let statuses: Vec<_> = shown
            .nodes
            .iter()
            .map(|n| (n.status, n.last_status))
            .collect();
        assert_eq!(
            statuses,
            [
                (NodeStatus::Unknown, Some(NodeStatus::Serving)),
                (NodeStatus::Unknown, Some(NodeStatus::Draining))
            ]
        );
        // A roster already unreadable keeps its own reason.
        let stale = FleetView {
            stale: Some("the store is unreachable".into()),
            ..shown.clone()
        };
        assert_eq!(unfollowed(stale.clone(), "other"), stale);
    }

    #[test]
    fn durations_read_as_words() {
        assert_eq!(duration_words(12), "12 s");
        assert_eq!(duration_words(60), "1 min");
        assert_eq!(duration_words(252), "4 min 12 s");
        assert_eq!(duration_words(7200), "2 h");
        assert_eq!(duration_words(7500), "2 h 5 min");
    }
}
