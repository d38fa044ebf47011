//! The serde types the browser and the node exchange.
//!
//! Everything here crosses the wire: it is plain data, with no behaviour and
//! nothing that only one side could build. The node fills these from its
//! engine; the pages render them.

use serde::{Deserialize, Serialize};

/// What a signed-in person may do. Viewers read; operators act.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[serde(rename_all = "lowercase")]
pub enum PersonRole {
    Viewer,
    Operator,
}

impl PersonRole {
    pub fn as_str(self) -> &'static str {
        match self {
            PersonRole::Viewer => "viewer",
            PersonRole::Operator => "operator",
        }
    }

    pub fn parse(s: &str) -> Option<PersonRole> {
        match s {
            "viewer" => Some(PersonRole::Viewer),
            "operator" => Some(PersonRole::Operator),
            _ => None,
        }
    }
}

impl std::fmt::Display for PersonRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The identity a request acts under: a signed-in person, or an API token
/// (whose `name` is the token's name from the company file).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Person {
    pub name: String,
    pub role: PersonRole,
    /// True when the identity came from a bearer token rather than a session.
    #[serde(default)]
    pub via_token: bool,
}

impl Person {
    pub fn is_operator(&self) -> bool {
        self.role == PersonRole::Operator
    }
}

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
}

/// A person known to the node (never carries a password or its hash).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersonView {
    pub name: String,
    pub role: PersonRole,
    /// `file` (from the company file's `[[auth.users]]`) or `database`.
    pub source: String,
}

/// One audited action of a person.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub at: String,
    pub person: String,
    pub action: String,
    pub seat: Option<String>,
    pub reason: Option<String>,
    pub result: String,
}

/// The answer to adding a person: the generated password, shown once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewPerson {
    pub name: String,
    pub role: PersonRole,
    pub password: String,
}

/// What a person's pause, resume or stop of a seat came to, as the JSON API
/// answers it: `{"seat": "alpha", "result": "paused"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeatActionResult {
    pub seat: String,
    /// One short phrase: `paused`, `already paused (updated)`, `resumed`,
    /// `was not paused` or `stop requested`.
    pub result: String,
}

/// A seat's state, as the Seats page shows and filters it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SeatState {
    /// Held and running its inbox.
    Attached,
    /// Claimed; the holder is still establishing it (no turn runs yet).
    Establishing,
    /// A person paused it: its holder holds the inbox until a resume.
    Paused,
    /// Its holder's teardown is failing: the lease is kept, nothing runs.
    Undead,
    /// Nobody holds it right now.
    Unowned,
}

impl SeatState {
    pub const ALL: [SeatState; 5] = [
        SeatState::Attached,
        SeatState::Establishing,
        SeatState::Paused,
        SeatState::Undead,
        SeatState::Unowned,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SeatState::Attached => "attached",
            SeatState::Establishing => "establishing",
            SeatState::Paused => "paused",
            SeatState::Undead => "undead",
            SeatState::Unowned => "unowned",
        }
    }

    pub fn parse(s: &str) -> Option<SeatState> {
        SeatState::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

/// Who holds a seat, from its lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeatHolder {
    pub node_id: String,
    pub incarnation: String,
    pub epoch: u64,
    /// RFC 3339: the tenure's start (the lease's `acquired_at`).
    pub since: String,
}

/// A seat's pause: who, when, why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeatPauseView {
    pub by: String,
    /// RFC 3339.
    pub at: String,
    pub reason: Option<String>,
    pub stop_running_turn: bool,
}

/// One row of the Seats page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeatRow {
    pub handle: String,
    /// Where the seat may run: `any node`, or the nodes and labels its
    /// role's placement names.
    pub placement: String,
    pub holder: Option<SeatHolder>,
    pub state: SeatState,
    /// Messages waiting in (or delivered and not yet settled from) the
    /// seat's inbox; `None` when the queue could not say.
    pub pending: Option<u64>,
    pub pause: Option<SeatPauseView>,
    /// The last error that broke one of its turns, and the node it broke on.
    pub last_error: Option<String>,
    pub last_error_node: Option<String>,
}

/// What the Seats page asks for: a search over handles and holder nodes,
/// a state, and a page (1-based).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeatQuery {
    pub query: String,
    pub state: Option<SeatState>,
    pub page: u32,
}

/// One page of the active company's seats.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeatList {
    pub answered_by: String,
    pub company: String,
    pub revision: u64,
    /// Seats in the active revision.
    pub total: usize,
    /// Seats matching the query (every page together).
    pub matching: usize,
    /// The page shown (1-based; the last page when the one asked for is
    /// past the end).
    pub page: u32,
    pub pages: u32,
    pub page_size: u32,
    /// How many seats of the active revision are in each state (whatever
    /// the query).
    pub counts: Vec<(SeatState, usize)>,
    pub rows: Vec<SeatRow>,
}

/// Seats on one page of the Seats page.
pub const SEAT_PAGE_SIZE: u32 = 50;
