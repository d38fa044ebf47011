//! Settings › Nodes as the node answers it: the fleet from the roster (the
//! live presence and seat leases), the alarms on top, and what to show
//! when the roster cannot be read.
//!
//! The alarms come from the roster, this node's own state and the fleet's
//! events:
//! - a seat whose teardown cannot be proven (undead), and for how long:
//!   this node's seat host says so of its own seats; for a peer's, the
//!   fleet's `seat_release_unproven` / `seat_still_unproven` events, while
//!   the roster shows that peer still holding that tenure;
//! - seats no live node may run (this node's last placement pass, which
//!   judges the whole fleet);
//! - a protocol floor: presence or seat leases held below this node's
//!   protocol (the roster), and whether this node's last claim was refused
//!   for it (its own state).
//!
//! The roster is never guessed at: [`LastRoster`] keeps the last one read,
//! and while the store cannot be read that one is shown, marked stale with
//! the time it was read and every node's status `unknown`.
//!
//! [`fleet_view`] and [`LastRoster::answer`] are pure.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use app::api::{FleetAlarm, FleetView, NodeStatus};

use crate::coord::{Lease, Store, StoreError};
use crate::web::live::SeatNote;
use crate::web::ownership::fleet_from_leases;
use crate::web::seats::node_of;

/// The live presence and seat leases, as read at one moment.
#[derive(Clone, Debug)]
pub struct Roster {
    pub presence: Vec<Lease>,
    pub seats: Vec<Lease>,
    /// Unix seconds (this node's clock) of the read.
    pub read_at: i64,
}

impl Roster {
    /// Read the roster from `store` (two reads); `now` is the Unix time it
    /// is stamped with.
    pub async fn read(store: &dyn Store, now: i64) -> Result<Roster, StoreError> {
        let presence = store.list("node:").await?;
        let seats = store.list("seat:").await?;
        Ok(Roster {
            presence,
            seats,
            read_at: now,
        })
    }
}

/// The last roster read, for the moments the store cannot be read.
#[derive(Default)]
pub struct LastRoster {
    last: Mutex<Option<Roster>>,
}

/// What a fleet answer is built from: a roster, and — when it is not the
/// current one — why the current one cannot be read.
#[derive(Clone, Debug)]
pub struct RosterAnswer {
    pub roster: Roster,
    pub stale: Option<String>,
}

impl LastRoster {
    /// The roster to show after a read that came to `read`: a fresh one
    /// (kept for later), else the last one read marked stale with why; an
    /// error only when no roster was ever read.
    pub fn answer(&self, read: Result<Roster, StoreError>) -> Result<RosterAnswer, StoreError> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        match read {
            Ok(roster) => {
                *last = Some(roster.clone());
                Ok(RosterAnswer {
                    roster,
                    stale: None,
                })
            }
            Err(e) => match last.as_ref() {
                Some(roster) => Ok(RosterAnswer {
                    roster: roster.clone(),
                    stale: Some(format!(
                        "the fleet's roster cannot be read right now ({e})."
                    )),
                }),
                None => Err(e),
            },
        }
    }
}

/// What this node knows besides the roster.
#[derive(Clone, Debug, Default)]
pub struct LocalFacts {
    /// This node's id and protocol.
    pub node_id: String,
    pub protocol: u32,
    /// Seats this node holds whose teardown is failing: handle, epoch, for
    /// how long.
    pub unproven_here: Vec<(String, u64, Duration)>,
    /// This node's last placement pass: seats no live node may run.
    pub unplaceable: Vec<String>,
    /// The protocol floor that refused this node's last claim.
    pub claims_blocked_by: Option<u32>,
    /// What the fleet's events said of seats held anywhere.
    pub notes: HashMap<String, SeatNote>,
    /// Unix seconds now.
    pub now: i64,
}

/// RFC 3339 (UTC, whole seconds) of Unix seconds.
pub fn rfc3339(unix: i64) -> String {
    chrono::DateTime::from_timestamp(unix, 0)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// The fleet as Settings › Nodes and `/query/fleet` show it.
pub fn fleet_view(
    answered_by: &str,
    company: &str,
    coordination: &str,
    answer: &RosterAnswer,
    facts: &LocalFacts,
) -> FleetView {
    let roster = &answer.roster;
    let mut view = fleet_from_leases(
        answered_by,
        company,
        coordination,
        &roster.presence,
        &roster.seats,
    );
    view.read_at = rfc3339(roster.read_at);
    if answer.stale.is_some() {
        for n in &mut view.nodes {
            n.last_status = Some(n.status);
            n.status = NodeStatus::Unknown;
        }
        view.stale = answer.stale.clone();
    }
    view.alarms = alarms(roster, facts);
    view
}

/// The alarms, most serious first: undead seats (longest first), a
/// protocol floor, unplaceable seats.
pub fn alarms(roster: &Roster, facts: &LocalFacts) -> Vec<FleetAlarm> {
    let mut out = Vec::new();

    // Undead seats: this node's own, then those the fleet's events name
    // while the roster shows that tenure still held.
    let mut undead: BTreeMap<String, (String, u64, Option<i64>)> = BTreeMap::new();
    for (seat, epoch, failing_for) in &facts.unproven_here {
        undead.insert(
            seat.clone(),
            (
                facts.node_id.clone(),
                *epoch,
                Some(facts.now - failing_for.as_secs() as i64),
            ),
        );
    }
    let leases: HashMap<&str, &Lease> = roster
        .seats
        .iter()
        .filter_map(|l| l.resource.strip_prefix("seat:").map(|h| (h, l)))
        .collect();
    for (seat, note) in &facts.notes {
        let Some((node, epoch)) = &note.unproven else {
            continue;
        };
        let still_held = leases
            .get(seat.as_str())
            .is_some_and(|l| node_of(&l.owner) == node && l.epoch == *epoch);
        if still_held && !undead.contains_key(seat) {
            undead.insert(seat.clone(), (node.clone(), *epoch, note.unproven_since));
        }
    }
    let mut undead: Vec<_> = undead.into_iter().collect();
    undead.sort_by(|(a, (_, _, sa)), (b, (_, _, sb))| {
        sa.unwrap_or(i64::MAX)
            .cmp(&sb.unwrap_or(i64::MAX))
            .then(a.cmp(b))
    });
    for (seat, (node, epoch, since)) in undead {
        out.push(FleetAlarm::Unproven {
            seat,
            node,
            epoch,
            since: since.map(rfc3339),
            seconds: since.map(|s| (facts.now - s).max(0) as u64),
        });
    }

    // The protocol floor: leases held below this node's protocol.
    let mut lower: BTreeSet<String> = BTreeSet::new();
    let mut floor: Option<u32> = None;
    for l in roster.presence.iter().chain(&roster.seats) {
        if l.protocol < facts.protocol {
            floor = Some(floor.map_or(l.protocol, |f| f.min(l.protocol)));
            lower.insert(l.node().to_string());
        }
    }
    if let Some(floor) = floor.or(facts.claims_blocked_by) {
        out.push(FleetAlarm::ProtocolFloor {
            floor,
            protocol: facts.protocol,
            nodes: lower.into_iter().collect(),
            claims_blocked_here: facts.claims_blocked_by.is_some(),
        });
    }

    if !facts.unplaceable.is_empty() {
        let mut seats = facts.unplaceable.clone();
        seats.sort();
        out.push(FleetAlarm::Unplaceable { seats });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::{LeaseState, StoreTime};

    fn lease(resource: &str, owner: &str, epoch: u64, protocol: u32) -> Lease {
        Lease {
            resource: resource.into(),
            owner: owner.into(),
            epoch,
            acquired_at: StoreTime::from_unix_nanos(0),
            expires_at: StoreTime::from_unix_nanos(0),
            preferred: owner.split(':').next().unwrap_or_default().into(),
            protocol,
            state: LeaseState::Held,
            metadata: Default::default(),
            revision: 1,
            ttl: Duration::from_secs(45),
            claim: String::new(),
            offer: None,
        }
    }

    fn roster() -> Roster {
        Roster {
            presence: vec![
                lease("node:n1", "n1:a", 1, 4),
                lease("node:n2", "n2:b", 1, 4),
            ],
            seats: vec![lease("seat:a", "n1:a", 3, 4), lease("seat:b", "n2:b", 5, 4)],
            read_at: 1_000,
        }
    }

    fn facts() -> LocalFacts {
        LocalFacts {
            node_id: "n1".into(),
            protocol: 4,
            now: 1_300,
            ..Default::default()
        }
    }

    #[test]
    fn a_quiet_fleet_has_no_alarms() {
        assert_eq!(alarms(&roster(), &facts()), Vec::new());
    }

    #[test]
    fn undead_seats_say_where_and_for_how_long_longest_first() {
        let mut f = facts();
        f.unproven_here = vec![("a".into(), 3, Duration::from_secs(60))];
        f.notes.insert(
            "b".into(),
            SeatNote {
                unproven: Some(("n2".into(), 5)),
                unproven_since: Some(1_000),
                last_error: None,
                running_turn: None,
            },
        );
        // A note about a tenure that is over says nothing.
        f.notes.insert(
            "c".into(),
            SeatNote {
                unproven: Some(("n2".into(), 1)),
                unproven_since: Some(900),
                last_error: None,
                running_turn: None,
            },
        );
        let got = alarms(&roster(), &f);
        assert_eq!(
            got,
            vec![
                FleetAlarm::Unproven {
                    seat: "b".into(),
                    node: "n2".into(),
                    epoch: 5,
                    since: Some(rfc3339(1_000)),
                    seconds: Some(300),
                },
                FleetAlarm::Unproven {
                    seat: "a".into(),
                    node: "n1".into(),
                    epoch: 3,
                    since: Some(rfc3339(1_240)),
                    seconds: Some(60),
                },
            ]
        );
    }

    #[test]
    fn a_lease_below_this_nodes_protocol_is_a_floor_naming_its_node() {
        let mut r = roster();
        r.presence.push(lease("node:old", "old:c", 1, 3));
        r.seats.push(lease("seat:z", "old:c", 2, 3));
        let mut f = facts();
        f.claims_blocked_by = Some(3);
        f.unplaceable = vec!["gpu-2".into(), "gpu-1".into()];
        assert_eq!(
            alarms(&r, &f),
            vec![
                FleetAlarm::ProtocolFloor {
                    floor: 3,
                    protocol: 4,
                    nodes: vec!["old".into()],
                    claims_blocked_here: true,
                },
                FleetAlarm::Unplaceable {
                    seats: vec!["gpu-1".into(), "gpu-2".into()],
                },
            ]
        );
    }

    #[test]
    fn rfc3339_is_whole_seconds_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_796_025_076), "2026-11-30T07:51:16Z");
    }
}
