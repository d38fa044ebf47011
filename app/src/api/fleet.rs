//! The fleet as Settings › Nodes shows it: each live node, the seats it
//! holds, and what needs a person's attention.

use serde::{Deserialize, Serialize};

/// A node's standing in the fleet, as Settings › Nodes shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeStatus {
    Serving,
    Draining,
    Withdrawn,
    Behind,
    /// The roster could not be read: the page declines to guess.
    Unknown,
}

impl NodeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Serving => "serving",
            NodeStatus::Draining => "draining",
            NodeStatus::Withdrawn => "withdrawn",
            NodeStatus::Behind => "behind",
            NodeStatus::Unknown => "unknown",
        }
    }
}

/// One seat a node holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldSeatView {
    pub handle: String,
    pub epoch: u64,
    /// RFC 3339 timestamp of the tenure's start (the lease's `acquired_at`).
    pub since: String,
}

/// One live node of the fleet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    pub node_id: String,
    pub incarnation: String,
    pub version: String,
    pub protocol: u32,
    pub status: NodeStatus,
    pub roles: Vec<String>,
    pub labels: Vec<String>,
    /// RFC 3339 presence expiry; `None` when the node runs no presence lease
    /// (single node on local coordination).
    pub presence_expires_at: Option<String>,
    pub seats: Vec<HeldSeatView>,
    /// While the roster cannot be read (`status` is then `unknown`): the
    /// status it had when it was last read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status: Option<NodeStatus>,
}

/// The fleet as this node sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetView {
    /// The node that answered.
    pub answered_by: String,
    pub company: String,
    /// `local` (one node, in-process coordination) or `embedded-kv`.
    pub coordination: String,
    pub nodes: Vec<NodeView>,
    /// RFC 3339: when the roster shown was read.
    #[serde(default)]
    pub read_at: String,
    /// Set while the roster cannot be read: why, in a sentence. The nodes
    /// are then the ones last read (at `read_at`), each with status
    /// `unknown` and its `last_status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale: Option<String>,
    /// What needs a person's attention, most serious first.
    #[serde(default)]
    pub alarms: Vec<FleetAlarm>,
}

/// Something about the fleet a person should look at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FleetAlarm {
    /// A seat whose holder cannot prove its teardown (undead): it keeps the
    /// lease, so no node runs the seat until the teardown succeeds.
    Unproven {
        seat: String,
        /// The holder's node.
        node: String,
        epoch: u64,
        /// RFC 3339: when the teardown started failing, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        since: Option<String>,
        /// How long it has been failing at `FleetView::read_at`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seconds: Option<u64>,
    },
    /// Seats no live node may run: no node matches their placement.
    Unplaceable { seats: Vec<String> },
    /// Leases are held at a lower protocol than this node's: nodes of a
    /// higher protocol claim nothing until those nodes are gone.
    ProtocolFloor {
        /// The lowest protocol held.
        floor: u32,
        /// This node's protocol.
        protocol: u32,
        /// The nodes holding leases below `protocol`.
        nodes: Vec<String>,
        /// This node's last claim was refused for it.
        claims_blocked_here: bool,
    },
    /// Mail the queue gave up on is kept: it reaches no seat until an
    /// operator re-publishes it (the Dead letters page).
    DeadLetters { count: u64 },
}
