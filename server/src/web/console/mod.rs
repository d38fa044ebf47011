//! The node's answer to what the dashboard asks ([`Console`]).
//!
//! Every method that changes anything checks the acting person's role
//! again (the server functions check too) and writes an audit row with the
//! result, refused or not.
//!
//! One file a page, mirroring `app/src/api/`: `fleet`, `seats`,
//! `seat_actions`, `approvals`, `people`, `company`, `node_order`,
//! `dead_letters`. This file holds the console's parts, the checks and audit
//! rows every page shares, and the [`Console`] implementation — each method
//! one call into its page.

mod approvals;
mod company;
mod dead_letters;
mod fleet;
mod node_order;
mod people;
mod seat_actions;
mod seats;

use std::sync::Arc;

use sqlx::SqlitePool;

use app::api::{
    ApprovalView, AuditFilter, AuditView, DeadLetterActionResult, DeadLetterList, EffectView,
    EventPage, EventQuery, FleetView, MemoryOverview, MoveRequestView, NewPerson, NodeOrderView,
    Person, PersonRole, PersonView, SeatActionResult, SeatDetail, SeatList, SeatMemoryRead,
    SeatQuery,
};
use app::console::{Console, ConsoleError};

use crate::audit;
use crate::engine::runtime::TurnEngine;
use crate::identity::NodeInfo;
use crate::memory::memread::MemRead;
use crate::seat::engine::SeatEngine;
use crate::web::auth::Auth;
use crate::web::live::SeatNotes;
use crate::web::nodes::LastRoster;
use crate::web::unavailable::unavailable;

/// What the console reads from.
pub struct ConsoleParts {
    pub info: Arc<NodeInfo>,
    pub pool: SqlitePool,
    pub auth: Arc<Auth>,
    pub engine: Arc<SeatEngine>,
    pub turns: Arc<TurnEngine>,
    pub notes: Arc<SeatNotes>,
    /// Reads of a seat's memory, answered by its holder.
    pub memread: Arc<MemRead>,
    /// The fleet's audit log.
    pub audit: Arc<crate::audit::FleetAudit>,
    /// The fleet's events this node kept.
    pub history: crate::web::history::EventHistory,
    /// The last hour of this node and, asked, of its peers.
    pub trends: Arc<crate::trends::Trends>,
    /// What this node lets a company's seats do (its own file's
    /// `[node]`): a company that asks more is not applied here.
    pub policy: crate::config::AgentPolicy,
    /// This node's `node.environment` (drills are judged by it).
    pub environment: crate::config::Environment,
}

pub struct NodeConsole {
    info: Arc<NodeInfo>,
    pool: SqlitePool,
    auth: Arc<Auth>,
    engine: Arc<SeatEngine>,
    turns: Arc<TurnEngine>,
    notes: Arc<SeatNotes>,
    memread: Arc<MemRead>,
    fleet_audit: Arc<crate::audit::FleetAudit>,
    history: crate::web::history::EventHistory,
    trends: Arc<crate::trends::Trends>,
    /// The last roster read, shown (stale) while the store cannot be read.
    roster: LastRoster,
    policy: crate::config::AgentPolicy,
    environment: crate::config::Environment,
    /// Held while a company file is read and applied: one at a time, so
    /// admins sending large files cannot take every blocking thread.
    applying: tokio::sync::Mutex<()>,
}

impl NodeConsole {
    pub fn new(parts: ConsoleParts) -> NodeConsole {
        let ConsoleParts {
            info,
            pool,
            auth,
            engine,
            turns,
            notes,
            memread,
            audit: fleet_audit,
            history,
            trends,
            policy,
            environment,
        } = parts;
        NodeConsole {
            info,
            pool,
            auth,
            engine,
            turns,
            notes,
            memread,
            fleet_audit,
            history,
            trends,
            roster: LastRoster::default(),
            policy,
            environment,
            applying: tokio::sync::Mutex::new(()),
        }
    }

    /// `NotFound` unless `handle` is a seat of the active company.
    fn company_seat(&self, handle: &str) -> Result<(), ConsoleError> {
        if self.engine.company().handles().any(|h| h == handle) {
            Ok(())
        } else {
            Err(ConsoleError::NotFound(format!(
                "seat {handle:?} is not in the active company; check the handle (the Seats page lists them)."
            )))
        }
    }

    async fn audited(
        &self,
        actor: &Person,
        action: &str,
        reason: Option<&str>,
        result: &str,
    ) -> Result<(), ConsoleError> {
        audit::record(&self.pool, &actor.name, action, None, reason, result)
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "cannot write the audit log");
                ConsoleError::Unavailable(
                    "The audit log cannot be written, so nothing was done.".into(),
                )
            })
    }

    /// Write one audit row of `action` about `seat`.
    async fn audited_on(
        &self,
        actor: &Person,
        action: &str,
        seat: &str,
        reason: Option<&str>,
        result: &str,
    ) -> Result<(), ConsoleError> {
        audit::record(&self.pool, &actor.name, action, Some(seat), reason, result)
            .await
            .map_err(|e| unavailable("write the audit log", e))
    }

    /// Refuse (and audit) anyone but an admin: deploying and managing
    /// people are not operating.
    async fn admit_admin(
        &self,
        actor: &Person,
        action: &str,
        reason: &str,
        verb: &str,
    ) -> Result<(), ConsoleError> {
        if actor.is_admin() {
            return Ok(());
        }
        let reason = Some(reason).filter(|r| !r.is_empty());
        self.audited(actor, action, reason, "refused: not an admin")
            .await?;
        Err(ConsoleError::Forbidden(format!(
            "{} is {} {}: only admins may {verb}.",
            actor.name,
            if actor.role == PersonRole::Operator {
                "an"
            } else {
                "a"
            },
            actor.role
        )))
    }

    /// Refuse (and audit) a change to a person defined in the company file.
    async fn changeable(
        &self,
        actor: &Person,
        action: &str,
        name: &str,
    ) -> Result<(), ConsoleError> {
        if !self.auth.in_file(name) {
            return Ok(());
        }
        self.audited(
            actor,
            action,
            Some(&clip(name)),
            "refused: defined in the company file",
        )
        .await?;
        Err(ConsoleError::Invalid(format!(
            "{:?} is defined in the company file's [[auth.users]]: change it there.",
            clip(name)
        )))
    }
}

/// The longest reason a person may give for a pause or a stop.
pub const MAX_REASON_CHARS: usize = 500;

/// A name or handle as a message or an audit row shows it.
fn clip(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).take(64).collect()
}

#[async_trait::async_trait]
impl Console for NodeConsole {
    async fn fleet(&self) -> Result<FleetView, ConsoleError> {
        fleet::view(self).await
    }

    async fn memory(&self, handle: &str) -> Result<SeatMemoryRead, ConsoleError> {
        self.company_seat(handle)?;
        self.memread
            .read(handle)
            .await
            .map(crate::web::memory::seat_read)
            .map_err(|e| unavailable("read the seat's memory", e))
    }

    async fn memory_overview(&self) -> Result<MemoryOverview, ConsoleError> {
        self.memread
            .overview()
            .await
            .map_err(|e| unavailable("read the seats' memory", e))
    }

    async fn seats(&self, query: SeatQuery) -> Result<SeatList, ConsoleError> {
        seats::page(self, query, None).await
    }

    async fn seat(&self, handle: &str, before: Option<u64>) -> Result<SeatDetail, ConsoleError> {
        seats::detail(self, handle, before).await
    }

    async fn node_trends(&self) -> Result<app::api::FleetTrends, ConsoleError> {
        Ok(self.trends.fleet().await)
    }

    async fn outbox(&self, handle: &str, limit: usize) -> Result<Vec<EffectView>, ConsoleError> {
        seats::outbox(self, handle, limit).await
    }

    async fn events(&self, query: EventQuery) -> Result<EventPage, ConsoleError> {
        self.history
            .page(&query)
            .await
            .map_err(|e| unavailable("read the kept events", e))
    }

    async fn people(&self) -> Result<Vec<PersonView>, ConsoleError> {
        people::list(self).await
    }

    async fn add_person(
        &self,
        actor: &Person,
        name: &str,
        role: PersonRole,
    ) -> Result<NewPerson, ConsoleError> {
        people::add(self, actor, name, role).await
    }

    async fn remove_person(&self, actor: &Person, name: &str) -> Result<(), ConsoleError> {
        people::remove(self, actor, name).await
    }

    async fn set_person_role(
        &self,
        actor: &Person,
        name: &str,
        role: PersonRole,
    ) -> Result<(), ConsoleError> {
        people::set_role(self, actor, name, role).await
    }

    async fn reset_password(&self, actor: &Person, name: &str) -> Result<NewPerson, ConsoleError> {
        people::reset_password(self, actor, name).await
    }

    async fn apply_company(&self, actor: &Person, company_toml: &str) -> Result<u64, ConsoleError> {
        company::apply(self, actor, company_toml).await
    }

    async fn send_to_inbox(
        &self,
        actor: &Person,
        handle: &str,
        envelope_json: &str,
    ) -> Result<String, ConsoleError> {
        seat_actions::send_to_inbox(self, actor, handle, envelope_json).await
    }

    async fn pause(
        &self,
        actor: &Person,
        handle: &str,
        reason: Option<String>,
        stop_running_turn: bool,
    ) -> Result<SeatActionResult, ConsoleError> {
        seat_actions::pause(self, actor, handle, reason, stop_running_turn).await
    }

    async fn resume(&self, actor: &Person, handle: &str) -> Result<SeatActionResult, ConsoleError> {
        seat_actions::resume(self, actor, handle).await
    }

    async fn stop(
        &self,
        actor: &Person,
        handle: &str,
        reason: Option<String>,
    ) -> Result<SeatActionResult, ConsoleError> {
        seat_actions::stop(self, actor, handle, reason).await
    }

    async fn node_order(&self) -> Result<NodeOrderView, ConsoleError> {
        node_order::view(self).await
    }

    async fn save_node_order(
        &self,
        actor: &Person,
        nodes: Vec<String>,
        revision: Option<u64>,
    ) -> Result<NodeOrderView, ConsoleError> {
        node_order::save(self, actor, nodes, revision).await
    }

    async fn move_seat(
        &self,
        actor: &Person,
        handle: &str,
        node: &str,
        reason: &str,
    ) -> Result<MoveRequestView, ConsoleError> {
        node_order::move_seat(self, actor, handle, node, reason).await
    }

    async fn dead_letters(
        &self,
        seat: Option<&str>,
        limit: usize,
    ) -> Result<DeadLetterList, ConsoleError> {
        dead_letters::list(self, seat, limit).await
    }

    async fn dead_letter_count(&self) -> Result<u64, ConsoleError> {
        dead_letters::count(self).await
    }

    async fn requeue_dead_letter(
        &self,
        actor: &Person,
        id: u64,
    ) -> Result<DeadLetterActionResult, ConsoleError> {
        dead_letters::requeue(self, actor, id).await
    }

    async fn discard_dead_letter(
        &self,
        actor: &Person,
        id: u64,
    ) -> Result<DeadLetterActionResult, ConsoleError> {
        dead_letters::discard(self, actor, id).await
    }

    async fn approvals(&self, handle: &str) -> Result<Vec<ApprovalView>, ConsoleError> {
        approvals::list(self, handle).await
    }

    async fn answer_approval(
        &self,
        actor: &Person,
        handle: &str,
        approval_id: &str,
        approve: bool,
        reason: &str,
    ) -> Result<ApprovalView, ConsoleError> {
        approvals::answer(self, actor, handle, approval_id, approve, reason).await
    }

    async fn audit(&self, filter: AuditFilter, page: u32) -> Result<AuditView, ConsoleError> {
        self.fleet_audit
            .read_page(&filter, page)
            .await
            .map_err(|e| unavailable("read the audit log", e))
    }
}
