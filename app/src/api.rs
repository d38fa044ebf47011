//! The serde types the browser and the node exchange.
//!
//! Everything here crosses the wire: it is plain data, with no behaviour and
//! nothing that only one side could build. The node fills these from its
//! engine; the pages render them.

use serde::{Deserialize, Serialize};

/// What a signed-in person may do. Viewers read; operators act on seats;
/// admins also deploy (apply a company) and manage people. Ordered: each
/// role may do everything the one before it may.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Hash)]
#[serde(rename_all = "lowercase")]
pub enum PersonRole {
    Viewer,
    Operator,
    Admin,
}

impl PersonRole {
    pub const ALL: [PersonRole; 3] = [PersonRole::Viewer, PersonRole::Operator, PersonRole::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            PersonRole::Viewer => "viewer",
            PersonRole::Operator => "operator",
            PersonRole::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<PersonRole> {
        PersonRole::ALL.into_iter().find(|r| r.as_str() == s)
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
    /// The person must choose a new password before doing anything else
    /// (the first-start password, or one an admin reset).
    #[serde(default)]
    pub must_change_password: bool,
}

impl Person {
    /// May act on seats (pause, resume, stop, move, send): operators and
    /// admins.
    pub fn is_operator(&self) -> bool {
        self.role >= PersonRole::Operator
    }

    /// May deploy and manage people: admins only.
    pub fn is_admin(&self) -> bool {
        self.role == PersonRole::Admin
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
}

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
/// else.
pub fn rfc3339_seconds(at: &str) -> Option<f64> {
    let b = at.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || !at.ends_with('Z') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| at.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi) = (num(11..13)?, num(14..16)?);
    let sec: f64 = at.get(17..at.len() - 1)?.parse().ok()?;
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 {
        return None;
    }
    // Days from the civil date (proleptic Gregorian).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + h * 3_600 + mi * 60) as f64 + sec)
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

/// A person known to the node (never carries a password or its hash).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersonView {
    pub name: String,
    pub role: PersonRole,
    /// `file` (from the company file's `[[auth.users]]`) or `database`.
    /// Only people from the database can be changed on the dashboard.
    pub source: String,
    /// Their password must be changed at their next sign-in.
    #[serde(default)]
    pub must_change_password: bool,
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
    /// The node the action was taken through (every node keeps its own
    /// audit log; the Audit page gathers the fleet's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// The fleet's audit log as one node gathered it: the newest actions of
/// every node that answered, newest first, and the live nodes whose
/// actions are missing because they did not answer in time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditView {
    pub entries: Vec<AuditEntry>,
    /// The nodes whose actions are listed, the node asked first.
    pub answered: Vec<String>,
    /// Live nodes whose actions are not listed, each with why.
    pub silent: Vec<SilentNode>,
    /// Set when the fleet's roster could not be read: only this node's
    /// actions are listed, and this says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roster_error: Option<String>,
}

/// A live node that did not answer an audit read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SilentNode {
    pub node_id: String,
    pub why: String,
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
    /// The turn running now, when this node holds the seat and one runs
    /// (its turn id); `None` otherwise, or when a peer holds the seat.
    #[serde(default)]
    pub running_turn: Option<String>,
    /// The seat's detached runs (`crewlet_runs`), live ones first; read
    /// for the seats of the page shown only.
    #[serde(default)]
    pub runs: Vec<SeatRunView>,
}

/// A detached run as the Seats page shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeatRunView {
    pub run_id: String,
    /// `running`, `parked`, `finished`, `failed` or `ended`.
    pub state: String,
    /// The node whose child runs (or ran) the command.
    pub launcher_node: String,
}

/// The Seats row's line about a seat's detached runs: "1 run: running on
/// node-a", "2 runs: running on node-a, finished on node-b"; `None` when
/// it has none.
pub fn runs_summary(runs: &[SeatRunView]) -> Option<String> {
    if runs.is_empty() {
        return None;
    }
    let each: Vec<String> = runs
        .iter()
        .map(|r| format!("{} on {}", r.state, r.launcher_node))
        .collect();
    let n = runs.len();
    Some(format!(
        "{n} run{}: {}",
        if n == 1 { "" } else { "s" },
        each.join(", ")
    ))
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

// ---------------------------------------------------------------------------
// The node priority order and "move this seat now".

/// The fleet's node priority order (`GET /api/nodes/order`): what was
/// saved, and the order every node ranks the live fleet by now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeOrderView {
    /// The order as a person saved it (top first); empty when never saved.
    pub saved: Vec<String>,
    /// The live nodes, top priority first: the saved order over the nodes
    /// present, newcomers appended in first-seen order, absent ones dropped.
    pub effective: Vec<String>,
    /// Who saved it, and when (RFC 3339); `None` when never saved.
    pub set_by: Option<String>,
    pub set_at: Option<String>,
    /// The revision to save against (`PUT` with it); `None` when never saved.
    pub revision: Option<u64>,
}

/// A person's request that a seat run on a named node, as recorded
/// (`POST /api/seats/{handle}/move` answers it with 202).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRequestView {
    pub seat: String,
    /// The target node id.
    pub to: String,
    pub by: String,
    pub reason: String,
    /// RFC 3339, on the coordination store's clock.
    pub requested_at: String,
    /// When the request lapses if the target never takes the seat.
    pub until: String,
}

/// One handoff as Settings › Nodes shows it, built from the fleet's
/// `seat_offered`, `seat_offer_taken` and `seat_offer_withdrawn` events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandoffView {
    pub seat: String,
    /// The giver's epoch (the tenure offered).
    pub epoch: u64,
    /// The named successor, when known.
    pub to: Option<String>,
    /// The giver, when known.
    pub from: Option<String>,
    /// Why the seat was offered (`drain`, `rebalance`, `moved`, …).
    pub reason: Option<String>,
    pub state: HandoffState,
    /// RFC 3339 of the last event about it.
    pub at: String,
}

/// Where a handoff is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandoffState {
    Offered,
    /// The successor took it (a new epoch) after `dark_ms` with no turn
    /// admitted.
    Taken {
        epoch: u64,
        dark_ms: u64,
    },
    /// The giver took its offer back and resumed; `why` says what happened.
    Withdrawn {
        why: String,
    },
}

impl HandoffView {
    /// "offered → node-b", "taken by node-b · dark 42 ms", "withdrawn (timeout)".
    pub fn status(&self) -> String {
        let to = self.to.as_deref().unwrap_or("?");
        match &self.state {
            HandoffState::Offered => format!("offered → {to}"),
            HandoffState::Taken { dark_ms, .. } => {
                format!("taken by {to} · dark {dark_ms} ms")
            }
            HandoffState::Withdrawn { why } => format!("withdrawn ({why})"),
        }
    }

    pub fn state_name(&self) -> &'static str {
        match self.state {
            HandoffState::Offered => "offered",
            HandoffState::Taken { .. } => "taken",
            HandoffState::Withdrawn { .. } => "withdrawn",
        }
    }
}

/// Handoffs the Nodes page keeps.
pub const HANDOFFS_KEPT: usize = 20;

/// Pure: fold one fleet event (its name and JSON) into `list`, newest
/// first, keeping [`HANDOFFS_KEPT`]. An offer opens a row; a take or a
/// withdrawal settles the row of that seat and epoch (or opens one, when
/// the offer came before the page was open). Other events change nothing.
pub fn apply_handoff_event(list: &mut Vec<HandoffView>, name: &str, data: &str) {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(data) else {
        return;
    };
    let text = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    let num = |k: &str| v.get(k).and_then(|x| x.as_u64());
    let Some(seat) = text("seat") else {
        return;
    };
    let at = text("at").unwrap_or_default();
    // The tenure the event is about: the offered one.
    let offered_epoch = match name {
        "seat_offered" | "seat_offer_withdrawn" => num("epoch"),
        "seat_offer_taken" => num("from_epoch"),
        _ => return,
    };
    let Some(epoch) = offered_epoch else {
        return;
    };
    let found = list.iter().position(|h| h.seat == seat && h.epoch == epoch);
    let mut row = match found {
        Some(i) => list.remove(i),
        None => HandoffView {
            seat: seat.clone(),
            epoch,
            to: None,
            from: None,
            reason: None,
            state: HandoffState::Offered,
            at: at.clone(),
        },
    };
    row.at = at;
    match name {
        "seat_offered" => {
            row.to = text("to").or(row.to);
            row.from = text("node").or(row.from);
            row.reason = v
                .get("reason")
                .map(|r| match r.as_str() {
                    Some(s) => s.to_string(),
                    None => r.to_string(),
                })
                .or(row.reason);
        }
        "seat_offer_taken" => {
            // The taker says it: it is the named successor.
            row.to = text("node").or(row.to);
            row.from = text("from").or(row.from);
            row.state = HandoffState::Taken {
                epoch: num("epoch").unwrap_or_default(),
                dark_ms: num("dark_ms").unwrap_or_default(),
            };
        }
        _ => {
            row.to = text("to").or(row.to);
            row.from = text("node").or(row.from);
            row.state = HandoffState::Withdrawn {
                why: text("why").unwrap_or_default(),
            };
        }
    }
    list.insert(0, row);
    list.truncate(HANDOFFS_KEPT);
}

// ---------------------------------------------------------------------------
// Memory: a seat's memory answered by the node that holds it.

/// The node holding a seat, as a memory read names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryHolder {
    pub node_id: String,
    pub incarnation: String,
    pub epoch: u64,
}

/// The node that gave an answer: the epoch of the tenure it answered
/// under (none when it does not hold the seat), and whether it is the node
/// that was asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryAnswerer {
    pub node_id: String,
    pub incarnation: String,
    pub epoch: Option<u64>,
    pub local: bool,
}

/// Why a held seat's memory cannot be had right now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MemoryUnavailable {
    /// The holder is still replaying the seat's memory (establishing it).
    Hydrating,
    /// The holder is giving the seat back, or cannot prove its teardown.
    Releasing,
    /// The holder says it does not hold the seat: the lease moved.
    NotHeldHere,
    /// The holder did not answer within the budget.
    Silent { budget_ms: u64 },
    /// Nothing answers for the holder: its process is gone.
    NoResponder,
    /// The holder answered, but could not read the seat's memory.
    HolderFailed { message: String },
    /// The holder could not be asked, or its answer could not be read.
    AskFailed { message: String },
}

impl MemoryUnavailable {
    /// What the holder did, as the end of a sentence that starts with the
    /// holder's name: "did not answer within 2 s".
    pub fn sentence(&self) -> String {
        match self {
            MemoryUnavailable::Hydrating => "is still loading the seat's memory".into(),
            MemoryUnavailable::Releasing => "is giving the seat back".into(),
            MemoryUnavailable::NotHeldHere => "says it does not hold the seat (it moved)".into(),
            MemoryUnavailable::Silent { budget_ms } => {
                let budget = if budget_ms % 1000 == 0 {
                    format!("{} s", budget_ms / 1000)
                } else {
                    format!("{budget_ms} ms")
                };
                format!("did not answer within {budget}")
            }
            MemoryUnavailable::NoResponder => "is not running (nothing answers for it)".into(),
            MemoryUnavailable::HolderFailed { message } => {
                format!("could not read the seat's memory: {message}")
            }
            MemoryUnavailable::AskFailed { message } => format!("could not be asked: {message}"),
        }
    }

    /// The reason's name, as the JSON `kind` carries it.
    pub fn kind(&self) -> &'static str {
        match self {
            MemoryUnavailable::Hydrating => "hydrating",
            MemoryUnavailable::Releasing => "releasing",
            MemoryUnavailable::NotHeldHere => "not_held_here",
            MemoryUnavailable::Silent { .. } => "silent",
            MemoryUnavailable::NoResponder => "no_responder",
            MemoryUnavailable::HolderFailed { .. } => "holder_failed",
            MemoryUnavailable::AskFailed { .. } => "ask_failed",
        }
    }
}

/// One seat's answer, tagged by `state`: the seat's rows for a read
/// ([`SeatMemoryRead`]), its rows per table in an overview
/// ([`SeatMemoryCounts`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum MemoryAnswer<T> {
    /// The holder's own copy, answered by the holder.
    Held {
        handle: String,
        holder: MemoryHolder,
        answered_by: MemoryAnswerer,
        memory: T,
    },
    /// No node holds the seat: nothing is shown (a copy of unknown age is
    /// not the seat's memory).
    Unheld {
        handle: String,
        answered_by: MemoryAnswerer,
        memory: T,
    },
    /// The seat is held but its holder's copy cannot be had now: never
    /// shown as empty.
    Unavailable {
        handle: String,
        holder: MemoryHolder,
        answered_by: MemoryAnswerer,
        reason: MemoryUnavailable,
        /// The reason in words, naming the holder's node.
        why: String,
    },
}

impl<T> MemoryAnswer<T> {
    pub fn handle(&self) -> &str {
        match self {
            MemoryAnswer::Held { handle, .. }
            | MemoryAnswer::Unheld { handle, .. }
            | MemoryAnswer::Unavailable { handle, .. } => handle,
        }
    }

    pub fn answered_by(&self) -> &MemoryAnswerer {
        match self {
            MemoryAnswer::Held { answered_by, .. }
            | MemoryAnswer::Unheld { answered_by, .. }
            | MemoryAnswer::Unavailable { answered_by, .. } => answered_by,
        }
    }

    /// `held`, `unheld` or `unavailable`.
    pub fn state(&self) -> &'static str {
        match self {
            MemoryAnswer::Held { .. } => "held",
            MemoryAnswer::Unheld { .. } => "unheld",
            MemoryAnswer::Unavailable { .. } => "unavailable",
        }
    }

    /// Who answered, in words: "answered by node-b (holder, epoch 7)",
    /// "no node holds this seat", "holder node-c did not answer within 2 s".
    pub fn who_answered(&self) -> String {
        match self {
            MemoryAnswer::Held {
                holder,
                answered_by,
                ..
            } => {
                if answered_by.incarnation == holder.incarnation {
                    format!(
                        "answered by {} (holder, epoch {})",
                        answered_by.node_id,
                        answered_by.epoch.unwrap_or(holder.epoch)
                    )
                } else {
                    format!(
                        "answered by {} for the holder {} (epoch {})",
                        answered_by.node_id, holder.node_id, holder.epoch
                    )
                }
            }
            MemoryAnswer::Unheld { .. } => "no node holds this seat".to_string(),
            MemoryAnswer::Unavailable { holder, reason, .. } => {
                format!("holder {} {}", holder.node_id, reason.sentence())
            }
        }
    }
}

/// One diary note.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DiaryRow {
    pub id: String,
    pub content: String,
    pub work_key: Option<String>,
    pub created_at: String,
    pub expires_at: Option<String>,
}

/// One episode: a unit of work the seat did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EpisodeRow {
    pub id: String,
    pub work_key: Option<String>,
    pub summary: String,
    pub turn_id: String,
    pub created_at: String,
}

/// What the seat knows of one counterparty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CounterpartyRow {
    pub id: String,
    pub counterparty: String,
    pub interaction_count: i64,
    pub last_work_key: Option<String>,
    pub updated_at: String,
}

/// One skill.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SkillRow {
    pub id: String,
    pub name: String,
    pub state: String,
    pub use_count: i64,
    pub updated_at: String,
}

/// One version of a skill.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SkillVersionRow {
    pub id: String,
    pub skill_name: String,
    pub version: i64,
    pub body: String,
    pub created_at: String,
}

/// One onboarding marker.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MarkerRow {
    pub id: String,
    pub marker: String,
    pub value: String,
    pub updated_at: String,
}

/// One entry of the conversation ledger.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConversationRow {
    pub id: String,
    pub thread: String,
    pub message_id: Option<String>,
    pub author: String,
    pub text: String,
    pub at: String,
}

/// A seat's memory: the newest rows of each table, newest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SeatMemoryRows {
    pub diary: Vec<DiaryRow>,
    pub episodes: Vec<EpisodeRow>,
    pub counterparty_profiles: Vec<CounterpartyRow>,
    pub skills: Vec<SkillRow>,
    pub skill_versions: Vec<SkillVersionRow>,
    pub onboarding_markers: Vec<MarkerRow>,
    pub conversations: Vec<ConversationRow>,
}

/// A seat's rows per table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MemoryCounts {
    pub diary: u64,
    pub episodes: u64,
    pub counterparty_profiles: u64,
    pub skills: u64,
    pub skill_versions: u64,
    pub onboarding_markers: u64,
    pub conversations: u64,
}

impl MemoryCounts {
    /// The tables' names and counts, in the order pages list them.
    pub fn named(&self) -> [(&'static str, u64); 7] {
        [
            ("Diary", self.diary),
            ("Episodes", self.episodes),
            ("Counterparty profiles", self.counterparty_profiles),
            ("Skills", self.skills),
            ("Skill versions", self.skill_versions),
            ("Onboarding markers", self.onboarding_markers),
            ("Conversations", self.conversations),
        ]
    }

    pub fn total(&self) -> u64 {
        self.named().iter().map(|(_, n)| n).sum()
    }
}

/// A read of one seat's memory.
pub type SeatMemoryRead = MemoryAnswer<SeatMemoryRows>;
/// One seat of the memory overview.
pub type SeatMemoryCounts = MemoryAnswer<MemoryCounts>;

/// Rows of each table a memory read returns (the newest).
pub const MEMORY_ROWS_SHOWN: u32 = 100;

/// Seats on one page of the memory overview.
pub const MEMORY_PAGE_SIZE: u32 = 50;

/// One holder in the overview's coverage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderCoverage {
    pub node_id: String,
    pub incarnation: String,
    /// The node that was asked (its seats were read from its own store).
    pub local: bool,
    /// The seats it holds.
    pub seats: Vec<String>,
    /// Why it did not answer (unanswered only).
    #[serde(default)]
    pub reason: Option<MemoryUnavailable>,
    #[serde(default)]
    pub why: Option<String>,
}

/// Which holders answered the overview and which did not.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryCoverage {
    pub answered: Vec<HolderCoverage>,
    pub unanswered: Vec<HolderCoverage>,
}

/// Every seat's memory in one round: rows per table, who answered each,
/// and which holders answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryOverview {
    /// The node that was asked.
    pub node_id: String,
    pub incarnation: String,
    /// Every seat held or in the company, by handle.
    pub seats: Vec<SeatMemoryCounts>,
    pub coverage: MemoryCoverage,
}

/// One page of the memory overview, as the Memory page shows it: the
/// seats whose handle contains the query, with the coverage and the totals
/// of every seat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryOverviewPage {
    pub node_id: String,
    pub coverage: MemoryCoverage,
    /// Seats in the overview.
    pub total: usize,
    /// How many are held / unheld / unavailable.
    pub held: usize,
    pub unheld: usize,
    pub unavailable: usize,
    /// Rows per table over every seat answered.
    pub rows: MemoryCounts,
    /// Seats matching the query (every page together).
    pub matching: usize,
    /// The page shown (1-based; the last page when the one asked for is
    /// past the end).
    pub page: u32,
    pub pages: u32,
    pub seats: Vec<SeatMemoryCounts>,
}

impl MemoryOverviewPage {
    /// Page `page` of `overview`'s seats whose handle contains `query`
    /// (case-insensitive).
    pub fn of(overview: MemoryOverview, query: &str, page: u32) -> MemoryOverviewPage {
        let mut rows = MemoryCounts::default();
        let (mut held, mut unheld, mut unavailable) = (0, 0, 0);
        for s in &overview.seats {
            match s {
                MemoryAnswer::Held { memory, .. } => {
                    held += 1;
                    rows.add(memory);
                }
                MemoryAnswer::Unheld { memory, .. } => {
                    unheld += 1;
                    rows.add(memory);
                }
                MemoryAnswer::Unavailable { .. } => unavailable += 1,
            }
        }
        let total = overview.seats.len();
        let text = query.trim().to_lowercase();
        let matched: Vec<SeatMemoryCounts> = overview
            .seats
            .into_iter()
            .filter(|s| text.is_empty() || s.handle().to_lowercase().contains(&text))
            .collect();
        let matching = matched.len();
        let size = MEMORY_PAGE_SIZE as usize;
        let pages = matching.div_ceil(size).max(1) as u32;
        let page = page.clamp(1, pages);
        let seats = matched
            .into_iter()
            .skip((page as usize - 1) * size)
            .take(size)
            .collect();
        MemoryOverviewPage {
            node_id: overview.node_id,
            coverage: overview.coverage,
            total,
            held,
            unheld,
            unavailable,
            rows,
            matching,
            page,
            pages,
            seats,
        }
    }
}

impl MemoryCounts {
    fn add(&mut self, o: &MemoryCounts) {
        self.diary += o.diary;
        self.episodes += o.episodes;
        self.counterparty_profiles += o.counterparty_profiles;
        self.skills += o.skills;
        self.skill_versions += o.skill_versions;
        self.onboarding_markers += o.onboarding_markers;
        self.conversations += o.conversations;
    }
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
    fn the_overview_page_filters_pages_and_totals_every_seat() {
        let seat = |i: usize| -> SeatMemoryCounts {
            if i % 10 == 9 {
                MemoryAnswer::Unavailable {
                    handle: format!("seat-{i:03}"),
                    holder: holder("n2", 1),
                    answered_by: by("n1", None, true),
                    reason: MemoryUnavailable::NoResponder,
                    why: String::new(),
                }
            } else {
                MemoryAnswer::Held {
                    handle: format!("seat-{i:03}"),
                    holder: holder("n1", 1),
                    answered_by: by("n1", Some(1), true),
                    memory: MemoryCounts {
                        episodes: 2,
                        ..Default::default()
                    },
                }
            }
        };
        let overview = MemoryOverview {
            node_id: "n1".into(),
            incarnation: "n1:1".into(),
            seats: (0..120).map(seat).collect(),
            coverage: MemoryCoverage::default(),
        };
        let p = MemoryOverviewPage::of(overview.clone(), "", 3);
        assert_eq!(
            (p.total, p.held, p.unavailable, p.unheld),
            (120, 108, 12, 0)
        );
        assert_eq!(p.rows.episodes, 216);
        assert_eq!(
            (p.matching, p.page, p.pages, p.seats.len()),
            (120, 3, 3, 20)
        );
        assert_eq!(p.seats[0].handle(), "seat-100");
        let p = MemoryOverviewPage::of(overview.clone(), " SEAT-01", 9);
        assert_eq!((p.matching, p.page, p.pages), (10, 1, 1));
        assert_eq!(p.total, 120, "the totals are of every seat");
    }

    #[test]
    fn durations_read_as_words() {
        assert_eq!(duration_words(12), "12 s");
        assert_eq!(duration_words(60), "1 min");
        assert_eq!(duration_words(252), "4 min 12 s");
        assert_eq!(duration_words(7200), "2 h");
        assert_eq!(duration_words(7500), "2 h 5 min");
    }

    fn holder(node: &str, epoch: u64) -> MemoryHolder {
        MemoryHolder {
            node_id: node.into(),
            incarnation: format!("{node}:1"),
            epoch,
        }
    }

    fn by(node: &str, epoch: Option<u64>, local: bool) -> MemoryAnswerer {
        MemoryAnswerer {
            node_id: node.into(),
            incarnation: format!("{node}:1"),
            epoch,
            local,
        }
    }

    #[test]
    fn a_memory_answer_says_who_answered() {
        let held: SeatMemoryRead = MemoryAnswer::Held {
            handle: "a".into(),
            holder: holder("node-b", 7),
            answered_by: by("node-b", Some(7), false),
            memory: SeatMemoryRows::default(),
        };
        assert_eq!(held.who_answered(), "answered by node-b (holder, epoch 7)");
        let unheld: SeatMemoryRead = MemoryAnswer::Unheld {
            handle: "a".into(),
            answered_by: by("node-a", None, true),
            memory: SeatMemoryRows::default(),
        };
        assert_eq!(unheld.who_answered(), "no node holds this seat");
        let silent: SeatMemoryRead = MemoryAnswer::Unavailable {
            handle: "a".into(),
            holder: holder("node-c", 3),
            answered_by: by("node-a", None, true),
            reason: MemoryUnavailable::Silent { budget_ms: 2000 },
            why: "the holder node-c did not answer within 2000 ms".into(),
        };
        assert_eq!(
            silent.who_answered(),
            "holder node-c did not answer within 2 s"
        );
    }

    #[test]
    fn memory_answers_keep_the_memread_json_shape() {
        let v = serde_json::json!({
            "state": "unavailable", "handle": "a",
            "holder": {"node_id": "n1", "incarnation": "n1:1", "epoch": 4},
            "answered_by": {"node_id": "n2", "incarnation": "n2:1", "epoch": null, "local": true},
            "reason": {"kind": "silent", "budget_ms": 1500},
            "why": "the holder n1 did not answer within 1500 ms"
        });
        let a: SeatMemoryCounts = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(a.state(), "unavailable");
        assert_eq!(a.who_answered(), "holder n1 did not answer within 1500 ms");
        assert_eq!(serde_json::to_value(&a).unwrap(), v);
    }

    fn ev(v: serde_json::Value) -> String {
        v.to_string()
    }

    #[test]
    fn an_offer_then_its_take_is_one_row_marked_taken_with_its_dark_time() {
        let mut list = Vec::new();
        apply_handoff_event(
            &mut list,
            "seat_offered",
            &ev(
                serde_json::json!({"event": "seat_offered", "node": "a", "at": "t1",
                "seat": "s", "epoch": 4, "to": "b", "reason": "drain"}),
            ),
        );
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].status(), "offered → b");
        assert_eq!(list[0].reason.as_deref(), Some("drain"));
        apply_handoff_event(
            &mut list,
            "seat_offer_taken",
            &ev(
                serde_json::json!({"event": "seat_offer_taken", "node": "b", "at": "t2",
                "seat": "s", "epoch": 5, "from_epoch": 4, "from": "a", "dark_ms": 37}),
            ),
        );
        assert_eq!(list.len(), 1, "{list:?}");
        assert_eq!(
            list[0].state,
            HandoffState::Taken {
                epoch: 5,
                dark_ms: 37
            }
        );
        assert_eq!(list[0].status(), "taken by b · dark 37 ms");
        assert_eq!(list[0].from.as_deref(), Some("a"));
        assert_eq!(list[0].at, "t2");
    }

    #[test]
    fn a_withdrawn_offer_says_why_and_a_take_seen_alone_still_shows() {
        let mut list = Vec::new();
        apply_handoff_event(
            &mut list,
            "seat_offered",
            &ev(serde_json::json!({"seat": "s", "epoch": 2, "to": "b", "node": "a"})),
        );
        apply_handoff_event(
            &mut list,
            "seat_offer_withdrawn",
            &ev(serde_json::json!({"seat": "s", "epoch": 2, "to": "b", "why": "timeout"})),
        );
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].status(), "withdrawn (timeout)");
        // A take whose offer came before the page opened.
        apply_handoff_event(
            &mut list,
            "seat_offer_taken",
            &ev(
                serde_json::json!({"seat": "t", "epoch": 9, "from_epoch": 8, "from": "a",
                "dark_ms": 5, "node": "c"}),
            ),
        );
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].seat, "t");
        assert_eq!(list[0].status(), "taken by c · dark 5 ms");
        // Anything else changes nothing.
        apply_handoff_event(
            &mut list,
            "seat_claimed",
            &ev(serde_json::json!({"seat": "s"})),
        );
        apply_handoff_event(&mut list, "seat_offered", "not json");
        assert_eq!(list.len(), 2);
    }

    #[test]
    fn the_handoff_list_keeps_the_newest_twenty() {
        let mut list = Vec::new();
        for i in 0..30u64 {
            apply_handoff_event(
                &mut list,
                "seat_offered",
                &ev(serde_json::json!({"seat": format!("s{i}"), "epoch": 1, "to": "b"})),
            );
        }
        assert_eq!(list.len(), HANDOFFS_KEPT);
        assert_eq!(list[0].seat, "s29");
        assert_eq!(list[HANDOFFS_KEPT - 1].seat, "s10");
    }
}
