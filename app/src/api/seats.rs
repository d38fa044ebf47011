//! The Seats page: one row per seat of the active company, the query that
//! filters them, and the answer to a person's action on a seat.

use serde::{Deserialize, Serialize};

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
    /// The role's MCP tool servers, with their state on this node.
    #[serde(default)]
    pub tool_servers: Vec<ToolServerView>,
    /// The seat's tool calls waiting for a person's approval; read for the
    /// seats of the page shown only.
    #[serde(default)]
    pub approvals: Vec<ApprovalView>,
    /// A model seat's spend in the current windows against its caps; read
    /// for the seats of the page shown only.
    #[serde(default)]
    pub spend: Option<SeatSpendView>,
    /// Why Move… cannot move it anywhere now (no other live node would
    /// take it), or `None` when some node would.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub move_blocked: Option<String>,
}

/// A model seat's tokens this day, ISO week and month (the company's
/// clock), each beside its cap when the role sets one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeatSpendView {
    /// `[(window id, spent, cap)]` for the day, the week and the month.
    pub windows: Vec<(String, u64, Option<u64>)>,
    /// Held for a reached cap.
    pub held: bool,
}

/// One of a seat's MCP tool servers as the Seats page shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolServerView {
    pub name: String,
    /// `stdio` (the seat's child) or `http` (a shared server).
    pub transport: String,
    /// `running` or `down` where this node holds the seat, `on {node}`
    /// where a peer does, `not running` where nobody does.
    pub state: String,
    /// How many tools it listed, where this node holds the seat.
    pub tools: Option<usize>,
}

/// A tool call a person approves before it runs, as the Seats page and
/// `GET /api/seats/{handle}/approvals` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalView {
    pub approval_id: String,
    pub seat: String,
    /// The tool's full name (`fs.write_file`).
    pub tool: String,
    pub arguments: serde_json::Value,
    /// The turn that asked.
    pub turn_id: String,
    /// `pending`, `answered`, `running` or `ran`.
    pub state: String,
    /// RFC 3339.
    pub asked_at: String,
    /// RFC 3339: when it is denied as timed out unless somebody answers.
    pub deadline: String,
    /// `approved`, `denied` or `timed_out`.
    pub decision: Option<String>,
    pub answered_by: Option<String>,
    pub reason: Option<String>,
    pub answered_at: Option<String>,
    /// What the agent was told, once the seat's holder resumed.
    pub outcome_ok: Option<bool>,
    pub outcome_error: Option<String>,
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

/// One thing a seat said or did: an outbound effect its turn posted, as
/// the seat page and `GET /api/seats/{handle}/outbox` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectView {
    pub turn_id: String,
    /// `post_outbox` (a reply) or `a2a_message`.
    pub kind: String,
    pub node: String,
    pub epoch: u64,
    /// The mail the turn answered.
    pub trigger_ids: Vec<String>,
    /// The effect's `text`, when it has one.
    pub text: Option<String>,
    /// The whole body, as JSON.
    pub body: String,
    /// RFC 3339: when the turn posted it (absent on older effects).
    pub at: Option<String>,
}

/// The seat page: the seat as the Seats page shows it, then its story.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeatDetail {
    pub row: SeatRow,
    pub company: String,
    /// The seat's kept events, newest first: one page, older ones asked
    /// for with `before`.
    pub timeline: crate::api::EventPage,
    /// People's actions on the seat (the fleet's audit log), newest first.
    pub actions: Vec<crate::api::AuditEntry>,
    /// What the seat posted, newest first.
    pub outbox: Vec<EffectView>,
    /// Why the outbox could not be read, when it could not.
    pub outbox_error: Option<String>,
    /// Its finished turns per minute over the last hour (minutes with
    /// none are left out), from the events the node kept.
    #[serde(default)]
    pub activity: Vec<ActivityMinute>,
    /// The minute the last hour ends at (`YYYY-MM-DDTHH:MM`, UTC), on the
    /// node's clock.
    #[serde(default)]
    pub activity_to: String,
    /// Its inbox depth per minute over the same hour, as its holder
    /// sampled it (empty when no node holds it).
    #[serde(default)]
    pub inbox: Vec<crate::api::InboxMinute>,
    /// Why the inbox's hour could not be had from its holder, when not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inbox_error: Option<String>,
}

/// One minute of a seat's turns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActivityMinute {
    /// `YYYY-MM-DDTHH:MM`, UTC.
    pub minute: String,
    pub turns: u64,
    /// Their mean duration.
    pub mean_ms: u64,
}

/// Effects the seat page shows.
pub const SEAT_OUTBOX_SHOWN: usize = 50;
