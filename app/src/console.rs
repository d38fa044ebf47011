//! What the dashboard asks of the node (server side only).
//!
//! The UI never depends on the engine: the node implements [`Console`] and
//! hands an `Arc<dyn Console>` to the pages and server functions through
//! Leptos context. Every method that changes anything takes the acting
//! [`Person`]; the implementation audits it.

use std::sync::Arc;

use crate::api::{
    ApprovalView, AuditFilter, AuditView, DeadLetterActionResult, DeadLetterList, EffectView,
    EventPage, EventQuery, FleetView, MemoryOverview, MoveRequestView, NewPerson, NodeOrderView,
    Person, PersonRole, PersonView, SeatActionResult, SeatDetail, SeatList, SeatMemoryRead,
    SeatQuery,
};

/// A failure the dashboard shows to a person as a sentence.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// The request itself is wrong; the message says which field and why.
    #[error("{0}")]
    Invalid(String),
    /// The person may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// The thing acted on does not exist; the message names it.
    #[error("{0}")]
    NotFound(String),
    /// The thing acted on changed since the person read it; the message
    /// says to reload.
    #[error("{0}")]
    Conflict(String),
    /// Something the node depends on failed; the message says what.
    #[error("{0}")]
    Unavailable(String),
}

#[async_trait::async_trait]
pub trait Console: Send + Sync + 'static {
    /// Every live node's last hour (seats held, turns per minute, store
    /// p99), each node answering for its own.
    async fn node_trends(&self) -> Result<crate::api::FleetTrends, ConsoleError>;
    /// Every live node and its seats, with the alarms on top. While the
    /// roster cannot be read: the last roster read, marked stale (every
    /// node's status `unknown`), or `Unavailable` when none was ever read.
    async fn fleet(&self) -> Result<FleetView, ConsoleError>;
    /// One seat's memory, answered by the node that holds it (saying who
    /// answered, that nobody holds the seat, or why its holder's copy
    /// cannot be had). `NotFound` for a seat not in the active company.
    async fn memory(&self, handle: &str) -> Result<SeatMemoryRead, ConsoleError>;
    /// Every seat's rows per table in one round (one request per holder),
    /// with which holders answered and which did not.
    async fn memory_overview(&self) -> Result<MemoryOverview, ConsoleError>;
    /// One page of the active company's seats matching `query`: holder,
    /// state, pause, inbox depth (read for the page's seats only) and last
    /// turn error.
    async fn seats(&self, query: SeatQuery) -> Result<SeatList, ConsoleError>;
    /// One seat's page: its row, one page of its kept events (older than
    /// `before`, when given), people's actions on it and what it posted.
    /// `NotFound` for a seat not in the active company.
    async fn seat(&self, handle: &str, before: Option<u64>) -> Result<SeatDetail, ConsoleError>;
    /// The newest `limit` effects the seat posted, newest first.
    async fn outbox(&self, handle: &str, limit: usize) -> Result<Vec<EffectView>, ConsoleError>;
    /// One page of the fleet's events this node kept, newest first.
    async fn events(&self, query: EventQuery) -> Result<EventPage, ConsoleError>;
    /// Everybody who may sign in.
    async fn people(&self) -> Result<Vec<PersonView>, ConsoleError>;
    /// Add a person with a generated password, to be changed at their
    /// first sign-in (admins only; audited).
    async fn add_person(
        &self,
        actor: &Person,
        name: &str,
        role: PersonRole,
    ) -> Result<NewPerson, ConsoleError>;
    /// Remove a person of the database: their sessions and streams end
    /// (admins only; audited). Nobody removes themselves.
    async fn remove_person(&self, actor: &Person, name: &str) -> Result<(), ConsoleError>;
    /// Change a database person's role, in force from their next request
    /// (admins only; audited).
    async fn set_person_role(
        &self,
        actor: &Person,
        name: &str,
        role: PersonRole,
    ) -> Result<(), ConsoleError>;
    /// Give a database person a new generated password, to be changed at
    /// their next sign-in (admins only; audited).
    async fn reset_password(&self, actor: &Person, name: &str) -> Result<NewPerson, ConsoleError>;
    /// Page `page` (1: the newest; `AUDIT_PAGE` a page) of the fleet's
    /// audited actions `filter` admits, newest first (this node's, and
    /// every live peer's that answers in time).
    async fn audit(&self, filter: AuditFilter, page: u32) -> Result<AuditView, ConsoleError>;
    /// Validate a company file (TOML text) and make its `[company]` and
    /// `[[roles]]` the fleet's next active revision (admins only;
    /// audited). Returns the revision number.
    async fn apply_company(&self, actor: &Person, company_toml: &str) -> Result<u64, ConsoleError>;
    /// Publish one envelope (JSON: `type` required; `id`, `body`, `thread`,
    /// `message_id`, `from` optional) to a seat's inbox (operators only;
    /// audited). Returns the envelope's id.
    async fn send_to_inbox(
        &self,
        actor: &Person,
        handle: &str,
        envelope_json: &str,
    ) -> Result<String, ConsoleError>;
    /// Pause a seat fleet-wide: its holder holds the inbox until a resume;
    /// with `stop_running_turn` the running turn also stops at its next
    /// round (operators only; audited). Pausing a paused seat updates the
    /// pause (`already paused (updated)`).
    async fn pause(
        &self,
        actor: &Person,
        handle: &str,
        reason: Option<String>,
        stop_running_turn: bool,
    ) -> Result<SeatActionResult, ConsoleError>;
    /// Resume a paused seat (operators only; audited). Resuming a seat that
    /// is not paused answers `was not paused`.
    async fn resume(&self, actor: &Person, handle: &str) -> Result<SeatActionResult, ConsoleError>;
    /// Ask a seat's running turn to stop at its next round (operators only;
    /// audited).
    async fn stop(
        &self,
        actor: &Person,
        handle: &str,
        reason: Option<String>,
    ) -> Result<SeatActionResult, ConsoleError>;
    /// The fleet's node priority order: as saved, and as every node ranks
    /// the live fleet now.
    async fn node_order(&self) -> Result<NodeOrderView, ConsoleError>;
    /// Save `nodes` (top first) as the fleet's priority order, against the
    /// revision the person read (`None`: none was saved) — operators only,
    /// audited. `Conflict` when somebody saved since; `Invalid` naming a
    /// repeated or empty node id.
    async fn save_node_order(
        &self,
        actor: &Person,
        nodes: Vec<String>,
        revision: Option<u64>,
    ) -> Result<NodeOrderView, ConsoleError>;
    /// Ask that seat `handle` run on node `node` ("move this seat now"):
    /// its holder hands it over, or the node claims it once a lapsed lease
    /// is free — operators only, audited with the reason (required).
    /// `Invalid` with the reason for a node outside the seat's placement,
    /// not serving, unknown, or already holding it.
    async fn move_seat(
        &self,
        actor: &Person,
        handle: &str,
        node: &str,
        reason: &str,
    ) -> Result<MoveRequestView, ConsoleError>;
    /// The newest `limit` dead letters (only seat `seat`'s, when given),
    /// newest first, with how many are kept in all.
    async fn dead_letters(
        &self,
        seat: Option<&str>,
        limit: usize,
    ) -> Result<DeadLetterList, ConsoleError>;
    /// How many dead letters are kept (the menu's count).
    async fn dead_letter_count(&self) -> Result<u64, ConsoleError>;
    /// Publish dead letter `id` again to the inbox it was sent to and
    /// remove it from the dead letters (operators only; audited).
    /// `NotFound` when it was re-published or discarded already.
    async fn requeue_dead_letter(
        &self,
        actor: &Person,
        id: u64,
    ) -> Result<DeadLetterActionResult, ConsoleError>;
    /// Remove dead letter `id` for good (operators only; audited).
    /// `NotFound` when it is not there.
    async fn discard_dead_letter(
        &self,
        actor: &Person,
        id: u64,
    ) -> Result<DeadLetterActionResult, ConsoleError>;
    /// The seat's approvals (docs/agents.md § Tools, Approvals), the newest first.
    async fn approvals(&self, handle: &str) -> Result<Vec<ApprovalView>, ConsoleError>;
    /// Answer one of the seat's approvals: `approve` runs the call once, on
    /// whichever node holds the seat, else the agent is told it was denied
    /// — operators only, audited with the reason (required). `Conflict`
    /// when it was answered already.
    async fn answer_approval(
        &self,
        actor: &Person,
        handle: &str,
        approval_id: &str,
        approve: bool,
        reason: &str,
    ) -> Result<ApprovalView, ConsoleError>;
}

/// How the node hands the console to Leptos.
pub type SharedConsole = Arc<dyn Console>;
