//! The node's answer to what the dashboard asks ([`Console`]).
//!
//! Every method that changes anything checks the acting person's role
//! again (the server functions check too) and writes an audit row with the
//! result, refused or not.

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
use crate::config::CoordinationType;
use crate::engine::pause::{self, PauseError, PauseRecord};
use crate::engine::runtime::TurnEngine;
use crate::events::Event;
use crate::identity::NodeInfo;
use crate::memory::memread::MemRead;
use crate::seat::sweep::SeatEngine;
use crate::web::auth::Auth;
use crate::web::dead_letters::DeadLetterAction;
use crate::web::live::SeatNotes;
use crate::web::nodes::{LocalFacts, Roster, RosterMemory, fleet_view};
use crate::web::seats::{SeatFacts, page_of, pause_record, seat_rows};
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
    roster: RosterMemory,
    policy: crate::config::AgentPolicy,
    environment: crate::config::Environment,
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
            roster: RosterMemory::default(),
            policy,
            environment,
        }
    }

    /// A seat's inbox depth over `hour`, from the node that holds it
    /// (nothing when no node does; why, when its holder cannot say).
    async fn inbox_hour(
        &self,
        handle: &str,
        hour: &[String],
    ) -> Result<Vec<app::api::InboxMinute>, String> {
        let lease = self
            .engine
            .store()
            .lease(&format!("seat:{handle}"))
            .await
            .map_err(|e| format!("the seat's holder cannot be read: {e}"))?;
        match lease {
            None => Ok(Vec::new()),
            Some(l) => self
                .trends
                .seat_inbox(handle, &l.owner, hour)
                .await
                .map_err(|why| format!("its holder's samples cannot be had: {why}")),
        }
    }

    /// One page of the seats matching `query` (only seat `only`, when
    /// given), each row read in full.
    async fn seat_page(
        &self,
        query: SeatQuery,
        only: Option<&str>,
    ) -> Result<SeatList, ConsoleError> {
        let company = self.engine.company();
        let store = self.engine.store();
        let (leases, pauses) = futures::join!(
            store.view("seat:"),
            store.entries(crate::coord::StateBucket::Pauses, "")
        );
        let leases = leases.map_err(|e| unavailable("read the seat leases", e))?;
        let pauses = pauses
            .map_err(|e| unavailable("read the pauses", e))?
            .into_iter()
            .map(|e| {
                let record = pause_record(&e.key, &e.value);
                (e.key, record)
            })
            .collect();
        let local = self.engine.host().status();
        let turns = self.turns.seats();
        let local_errors = turns
            .iter()
            .filter_map(|s| s.last_error.clone().map(|e| (s.handle.clone(), e)))
            .collect();
        let local_running = turns
            .into_iter()
            .filter_map(|s| s.running_turn.map(|t| (s.handle, t)))
            .collect();
        let notes = self.notes.snapshot();
        let rows = seat_rows(&SeatFacts {
            roles: &company.roles,
            leases: &leases,
            pauses: &pauses,
            me: self.info.incarnation.as_str(),
            local: &local,
            local_errors: &local_errors,
            local_running: &local_running,
            notes: &notes,
        });
        let total = rows.len();
        let rows = match only {
            Some(h) => rows.into_iter().filter(|r| r.handle == h).collect(),
            None => rows,
        };
        let mut paged = page_of(rows, &query);
        // Inbox depth for the page's seats only, asked all at once.
        let queue = self.engine.queue();
        let depths = futures::future::join_all(paged.rows.iter().map(|r| {
            let group = crate::queue::inbox_group(&r.handle);
            async move { queue.pending(&group).await.ok() }
        }))
        .await;
        // The detached runs of the page's seats only, read all at once; a
        // seat whose runs cannot be read shows none.
        let runs = self.turns.runs();
        let records = futures::future::join_all(
            paged
                .rows
                .iter()
                .map(|r| async move { runs.list(&r.handle).await.ok() }),
        )
        .await;
        let handles: Vec<String> = paged.rows.iter().map(|r| r.handle.clone()).collect();
        let approvals = crate::web::approvals::pending_of(self.turns.approvals(), &handles).await;
        let spends =
            futures::future::join_all(paged.rows.iter().map(|r| self.turns.spend(&r.handle))).await;
        // Whether Move… has anywhere to go: the live nodes, read once.
        let live = crate::seat::moves::live_targets(&**store).await.ok();
        for (row, spend) in paged.rows.iter_mut().zip(spends) {
            row.spend = spend.map(|(windows, held)| app::api::SeatSpendView { windows, held });
            let role = company.roles.iter().find(|r| r.handle == row.handle);
            if let (Some(role), Some(live)) = (role, live.as_deref()) {
                row.move_blocked = crate::seat::moves::move_blocked(
                    &row.handle,
                    &role.placement,
                    live,
                    row.holder.as_ref().map(|h| h.node_id.as_str()),
                );
            }
            let here = self.turns.tool_server_states(&row.handle);
            row.tool_servers = crate::web::seats::tool_server_views(
                role.map(|r| r.mcp.as_slice()).unwrap_or_default(),
                here.as_deref(),
                row.holder.as_ref().map(|h| h.node_id.as_str()),
            );
        }
        for (((row, depth), records), approvals) in paged
            .rows
            .iter_mut()
            .zip(depths)
            .zip(records)
            .zip(approvals)
        {
            row.approvals = approvals;
            row.pending = depth;
            row.runs = crate::web::seats::run_views(
                records
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(r, _)| r)
                    .collect(),
            );
        }
        Ok(SeatList {
            answered_by: self.info.node_id.clone(),
            company: company.name.clone(),
            revision: company.revision,
            total,
            matching: paged.matching,
            page: paged.page,
            pages: paged.pages,
            page_size: app::api::SEAT_PAGE_SIZE,
            counts: paged.counts,
            rows: paged.rows,
        })
    }

    /// What this node knows of the fleet besides the roster.
    fn local_facts(&self, now: i64) -> LocalFacts {
        LocalFacts {
            node_id: self.info.node_id.clone(),
            protocol: self.info.protocol,
            unproven_here: self
                .engine
                .host()
                .status()
                .into_iter()
                .filter_map(|s| s.unproven_for.map(|d| (s.handle, s.epoch, d)))
                .collect(),
            unplaceable: self.engine.unplaceable(),
            claims_blocked_by: self.engine.claims_blocked_by(),
            notes: self.notes.snapshot(),
            now,
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

    /// Judge every role of a company being applied against this node's own
    /// policy (programs found on this node): `Err` is the refusal a person
    /// reads — every role and program named, nothing applied, the refusal
    /// audited.
    async fn judge_company(
        &self,
        actor: &Person,
        roles: &[crate::config::RoleConfig],
    ) -> Result<(), ConsoleError> {
        let policy = self.policy.clone();
        let roles = roles.to_vec();
        let problems = tokio::task::spawn_blocking(move || {
            roles
                .iter()
                .flat_map(|r| policy.judge_role(r, &crate::config::programs::find_on_node))
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| unavailable("judge the company", e))?;
        if problems.is_empty() {
            return Ok(());
        }
        let shown = problems
            .iter()
            .take(10)
            .map(|p| format!("- {p}"))
            .collect::<Vec<_>>()
            .join("\n");
        let more = match problems.len() {
            n if n > 10 => format!("\n… and {} more", n - 10),
            _ => String::new(),
        };
        let first: String = problems[0].chars().take(300).collect();
        self.audited(
            actor,
            "company.apply",
            Some(&first),
            "refused: the node does not allow what the company asks",
        )
        .await?;
        Err(ConsoleError::Forbidden(format!(
            "This node does not allow what the company asks, so nothing was applied:\n{shown}{more}"
        )))
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
}

/// The longest reason a person may give for a pause or a stop.
pub const MAX_REASON_CHARS: usize = 500;

/// A name or handle as a message or an audit row shows it.
fn clip(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).take(64).collect()
}

impl NodeConsole {
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

/// A person's action on one seat, as the audit log names it.
#[derive(Clone, Copy)]
enum SeatAction {
    Pause,
    Resume,
    Stop,
}

impl SeatAction {
    fn audit_name(self) -> &'static str {
        match self {
            SeatAction::Pause => "seat.pause",
            SeatAction::Resume => "seat.resume",
            SeatAction::Stop => "seat.stop_turn",
        }
    }

    fn verb(self) -> &'static str {
        match self {
            SeatAction::Pause => "pause a seat",
            SeatAction::Resume => "resume a seat",
            SeatAction::Stop => "stop a seat's turn",
        }
    }
}

impl NodeConsole {
    /// Write one audit row about `seat`. A failure is reported to the person
    /// (the action, if done, stays done).
    async fn audited_seat(
        &self,
        actor: &Person,
        action: SeatAction,
        seat: &str,
        reason: Option<&str>,
        result: &str,
    ) -> Result<(), ConsoleError> {
        self.audited_on(actor, action.audit_name(), seat, reason, result)
            .await
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

    /// The checks every seat action passes before it is done: the person is
    /// an operator, the seat is in the active company, the reason is
    /// short. Each refusal is audited. Returns the trimmed reason (an empty
    /// one is none).
    async fn admit_seat_action(
        &self,
        actor: &Person,
        action: SeatAction,
        handle: &str,
        reason: Option<String>,
    ) -> Result<Option<String>, ConsoleError> {
        let reason = reason
            .map(|r| r.trim().to_string())
            .filter(|r| !r.is_empty());
        if !actor.is_operator() {
            self.audited_seat(
                actor,
                action,
                handle,
                reason.as_deref(),
                "refused: not an operator",
            )
            .await?;
            return Err(ConsoleError::Forbidden(format!(
                "{} is a viewer: only operators may {}.",
                actor.name,
                action.verb()
            )));
        }
        if !self.engine.company().handles().any(|h| h == handle) {
            let e = PauseError::NoSuchSeat(handle.to_string());
            self.audited_seat(
                actor,
                action,
                handle,
                reason.as_deref(),
                "refused: no such seat",
            )
            .await?;
            return Err(seat_failure(handle, e));
        }
        if let Some(r) = &reason {
            let n = r.chars().count();
            if n > MAX_REASON_CHARS {
                self.audited_seat(actor, action, handle, None, "refused: reason too long")
                    .await?;
                return Err(ConsoleError::Invalid(format!(
                    "reason: at most {MAX_REASON_CHARS} characters (this one has {n})."
                )));
            }
        }
        Ok(reason)
    }

    /// Audit a seat action the engine could not do, and say why.
    async fn failed_seat_action(
        &self,
        actor: &Person,
        action: SeatAction,
        handle: &str,
        reason: Option<&str>,
        e: PauseError,
    ) -> ConsoleError {
        let result = match (&e, action) {
            (PauseError::NoSuchSeat(_), _) => "refused: no such seat",
            (PauseError::Store(_), _) => "failed: the coordination store is unavailable",
            (PauseError::Queue(_), SeatAction::Pause) => {
                "failed: the pause is recorded, but the seat's holder could not be told"
            }
            (PauseError::Queue(_), SeatAction::Resume) => {
                "failed: the pause is removed, but the seat's holder could not be told"
            }
            (PauseError::Queue(_), SeatAction::Stop) => {
                "failed: the seat's control subject is unavailable"
            }
        };
        if let Err(audit_error) = self
            .audited_seat(actor, action, handle, reason, result)
            .await
        {
            return audit_error;
        }
        seat_failure(handle, e)
    }
}

/// The sentence a person sees for a seat action that was not done.
fn seat_failure(handle: &str, e: PauseError) -> ConsoleError {
    match e {
        PauseError::NoSuchSeat(_) => ConsoleError::NotFound(format!(
            "seat {handle:?} is not in the active company; check the handle (GET /query/fleet lists the seats held)."
        )),
        PauseError::Store(e) => unavailable("reach the coordination store", e),
        PauseError::Queue(e) => unavailable("reach the seat's control subject", e),
    }
}

impl NodeConsole {
    /// Re-publish or discard one dead letter: operators only, the seat it
    /// was sent to named in the audit row, refused or not.
    async fn dead_letter_action(
        &self,
        actor: &Person,
        action: DeadLetterAction,
        id: u64,
    ) -> Result<DeadLetterActionResult, ConsoleError> {
        let what = format!("dead letter {id}");
        if !actor.is_operator() {
            audit::record(
                &self.pool,
                &actor.name,
                action.audit_name(),
                None,
                Some(&what),
                "refused: not an operator",
            )
            .await
            .map_err(|e| unavailable("write the audit log", e))?;
            return Err(ConsoleError::Forbidden(format!(
                "{} is a viewer: only operators may {}.",
                actor.name,
                action.verb()
            )));
        }
        let done = crate::web::dead_letters::act(self.engine.queue().as_ref(), action, id).await;
        audit::record(
            &self.pool,
            &actor.name,
            action.audit_name(),
            done.seat.as_deref(),
            Some(&what),
            &done.audit_result,
        )
        .await
        .map_err(|e| unavailable("write the audit log", e))?;
        done.answer
    }
}

#[async_trait::async_trait]
impl Console for NodeConsole {
    async fn fleet(&self) -> Result<FleetView, ConsoleError> {
        let i = &self.info;
        let coordination = match i.coordination {
            CoordinationType::Local => "local",
            CoordinationType::EmbeddedKv => "embedded-kv",
        };
        let company = self.engine.company();
        let now = chrono::Utc::now().timestamp();
        let read = Roster::read(&**self.engine.store(), now).await;
        if let Err(e) = &read {
            tracing::warn!(error = %e, "the roster cannot be read");
        }
        let answer = self.roster.answer(read).map_err(|e| {
            ConsoleError::Unavailable(format!(
                "The fleet's roster cannot be read right now ({e}); node states are unknown."
            ))
        })?;
        let mut view = fleet_view(
            &i.node_id,
            &company.name,
            coordination,
            &answer,
            &self.local_facts(now),
        );
        // A queue that cannot be counted is the queue's own alarm, not this one.
        match self.engine.queue().dead_letter_count().await {
            Ok(0) => {}
            Ok(count) => view
                .alarms
                .push(app::api::FleetAlarm::DeadLetters { count }),
            Err(e) => tracing::warn!(error = %e, "the dead letters cannot be counted"),
        }
        Ok(view)
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
        self.seat_page(query, None).await
    }

    async fn seat(&self, handle: &str, before: Option<u64>) -> Result<SeatDetail, ConsoleError> {
        self.company_seat(handle)?;
        let list = self.seat_page(SeatQuery::default(), Some(handle)).await?;
        let row = list.rows.into_iter().next().ok_or_else(|| {
            ConsoleError::NotFound(format!("no seat {handle:?} in the active company"))
        })?;
        let timeline = self.events(EventQuery {
            before,
            seat: handle.to_string(),
            limit: app::api::EVENT_PAGE,
            ..Default::default()
        });
        let actions = self.fleet_audit.read_about(100, Some(handle));
        let outbox = self.outbox(handle, app::api::SEAT_OUTBOX_SHOWN);
        // The last hour, on this node's clock.
        let minutes = crate::trends::hour_to(time::OffsetDateTime::now_utc());
        let activity_to = minutes.last().cloned().unwrap_or_default();
        let activity = self.history.activity(handle, &minutes[0]);
        let inbox = self.inbox_hour(handle, &minutes);
        let (timeline, actions, outbox, activity, inbox) =
            futures::join!(timeline, actions, outbox, activity, inbox);
        let (inbox, inbox_error) = match inbox {
            Ok(v) => (v, None),
            Err(e) => (Vec::new(), Some(e)),
        };
        let (outbox, outbox_error) = match outbox {
            Ok(v) => (v, None),
            Err(e) => (Vec::new(), Some(e.to_string())),
        };
        Ok(SeatDetail {
            row,
            company: list.company,
            timeline: timeline?,
            actions: actions.map(|a| a.entries).unwrap_or_default(),
            outbox,
            outbox_error,
            activity: crate::web::history::fill_minutes(
                &minutes,
                activity.unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "a seat's activity cannot be read");
                    Vec::new()
                }),
            ),
            activity_to,
            inbox,
            inbox_error,
        })
    }

    async fn node_trends(&self) -> Result<app::api::FleetTrends, ConsoleError> {
        Ok(self.trends.fleet().await)
    }

    async fn outbox(&self, handle: &str, limit: usize) -> Result<Vec<EffectView>, ConsoleError> {
        self.company_seat(handle)?;
        let effects = self
            .turns
            .outbox()
            .recent(handle, limit.clamp(1, 1000))
            .await
            .map_err(|e| unavailable("read the outbox", e))?;
        Ok(effects
            .into_iter()
            .map(crate::web::seats::effect_view)
            .collect())
    }

    async fn events(&self, query: EventQuery) -> Result<EventPage, ConsoleError> {
        self.history
            .page(&query)
            .await
            .map_err(|e| unavailable("read the kept events", e))
    }

    async fn people(&self) -> Result<Vec<PersonView>, ConsoleError> {
        self.auth
            .people()
            .await
            .map_err(|e| unavailable("read the people list", e))
    }

    async fn add_person(
        &self,
        actor: &Person,
        name: &str,
        role: PersonRole,
    ) -> Result<NewPerson, ConsoleError> {
        let name = name.trim();
        let reason = format!("{} as {role}", clip(name));
        self.admit_admin(actor, "person.add", &reason, "add people")
            .await?;
        let bad = name.is_empty()
            || name.len() > 64
            || name.chars().any(|c| c.is_control() || c.is_whitespace());
        if bad {
            self.audited(actor, "person.add", Some(&reason), "refused: invalid name")
                .await?;
            return Err(ConsoleError::Invalid(
                "Name: use 1–64 characters with no spaces (for example \"alice\").".into(),
            ));
        }
        if self
            .auth
            .exists(name)
            .await
            .map_err(|e| unavailable("check the name", e))?
        {
            self.audited(actor, "person.add", Some(&reason), "refused: name taken")
                .await?;
            return Err(ConsoleError::Invalid(format!(
                "Name: {name:?} can already sign in. Pick another name."
            )));
        }
        let password = self
            .auth
            .add(name, role, &actor.name)
            .await
            .map_err(|e| unavailable("add the person", e))?;
        self.audited(actor, "person.add", Some(&reason), "ok")
            .await?;
        Ok(NewPerson {
            name: name.to_string(),
            role,
            password,
        })
    }

    async fn remove_person(&self, actor: &Person, name: &str) -> Result<(), ConsoleError> {
        const ACTION: &str = "person.remove";
        let shown = clip(name);
        self.admit_admin(actor, ACTION, &shown, "remove people")
            .await?;
        if name == actor.name {
            self.audited(actor, ACTION, Some(&shown), "refused: oneself")
                .await?;
            return Err(ConsoleError::Invalid(
                "You cannot remove yourself: ask another admin.".into(),
            ));
        }
        self.changeable(actor, ACTION, name).await?;
        let removed = self
            .auth
            .remove(name)
            .await
            .map_err(|e| unavailable("remove the person", e))?;
        if !removed {
            self.audited(actor, ACTION, Some(&shown), "refused: no such person")
                .await?;
            return Err(ConsoleError::NotFound(format!(
                "Nobody named {shown:?} can sign in here."
            )));
        }
        self.audited(actor, ACTION, Some(&shown), "ok").await
    }

    async fn set_person_role(
        &self,
        actor: &Person,
        name: &str,
        role: PersonRole,
    ) -> Result<(), ConsoleError> {
        const ACTION: &str = "person.set_role";
        let reason = format!("{} to {role}", clip(name));
        self.admit_admin(actor, ACTION, &reason, "change a person's role")
            .await?;
        if name == actor.name && role != PersonRole::Admin {
            self.audited(actor, ACTION, Some(&reason), "refused: oneself")
                .await?;
            return Err(ConsoleError::Invalid(
                "You cannot take away your own admin role: ask another admin.".into(),
            ));
        }
        self.changeable(actor, ACTION, name).await?;
        let changed = self
            .auth
            .set_role(name, role)
            .await
            .map_err(|e| unavailable("change the role", e))?;
        if !changed {
            self.audited(actor, ACTION, Some(&reason), "refused: no such person")
                .await?;
            return Err(ConsoleError::NotFound(format!(
                "Nobody named {:?} can sign in here.",
                clip(name)
            )));
        }
        self.audited(actor, ACTION, Some(&reason), "ok").await
    }

    async fn reset_password(&self, actor: &Person, name: &str) -> Result<NewPerson, ConsoleError> {
        const ACTION: &str = "person.reset_password";
        let shown = clip(name);
        self.admit_admin(actor, ACTION, &shown, "reset a password")
            .await?;
        self.changeable(actor, ACTION, name).await?;
        let standing = self
            .auth
            .standing(name)
            .await
            .map_err(|e| unavailable("read the person", e))?;
        let password = self
            .auth
            .reset_password(name)
            .await
            .map_err(|e| unavailable("reset the password", e))?;
        let (Some(password), Some(standing)) = (password, standing) else {
            self.audited(actor, ACTION, Some(&shown), "refused: no such person")
                .await?;
            return Err(ConsoleError::NotFound(format!(
                "Nobody named {shown:?} can sign in here."
            )));
        };
        self.audited(actor, ACTION, Some(&shown), "ok").await?;
        Ok(NewPerson {
            name: name.to_string(),
            role: standing.role,
            password,
        })
    }

    async fn apply_company(&self, actor: &Person, company_toml: &str) -> Result<u64, ConsoleError> {
        self.admit_admin(actor, "company.apply", "", "apply a company")
            .await?;
        // Parsing a large file is CPU work: off the async workers, so the
        // node keeps answering meanwhile.
        let text = company_toml.to_string();
        let environment = self.environment;
        let policy = self.policy.clone();
        let parsed = tokio::task::spawn_blocking(move || {
            crate::config::Config::parse_applied(
                "the applied company file",
                &text,
                environment,
                &policy,
            )
        })
        .await
        .map_err(|e| unavailable("read the company file", e))?;
        let config = match parsed {
            Ok(c) => c,
            Err(e) => {
                self.audited(actor, "company.apply", None, "refused: invalid file")
                    .await?;
                return Err(ConsoleError::Invalid(e.to_string()));
            }
        };
        self.judge_company(actor, &config.roles).await?;
        let store = self.engine.store().clone();
        match crate::company::apply_company(
            &*store,
            &config.company,
            &config.roles,
            &config.schedules,
        )
        .await
        {
            Ok(revision) => {
                let reason = format!("revision {revision}: {} seats", config.roles.len());
                self.audited(actor, "company.apply", Some(&reason), "ok")
                    .await?;
                Ok(revision)
            }
            Err(e) => {
                self.audited(actor, "company.apply", None, "failed: store unavailable")
                    .await?;
                Err(unavailable("apply the company", e))
            }
        }
    }

    async fn send_to_inbox(
        &self,
        actor: &Person,
        handle: &str,
        envelope_json: &str,
    ) -> Result<String, ConsoleError> {
        use crate::engine::envelope::Envelope;
        let refuse = |why: &str| format!("refused: {why}");
        if !actor.is_operator() {
            audit::record(
                &self.pool,
                &actor.name,
                "seat.send",
                Some(handle),
                None,
                &refuse("not an operator"),
            )
            .await
            .map_err(|e| unavailable("write the audit log", e))?;
            return Err(ConsoleError::Forbidden(format!(
                "{} is a viewer: only operators may send to a seat's inbox.",
                actor.name
            )));
        }
        if !self.engine.company().handles().any(|h| h == handle) {
            return Err(ConsoleError::Invalid(format!(
                "seat {handle:?} is not in the active company; check the handle (GET /query/fleet lists the seats held)."
            )));
        }
        let mut value: serde_json::Value = serde_json::from_str(envelope_json)
            .map_err(|e| ConsoleError::Invalid(format!("the envelope is not JSON: {e}")))?;
        let Some(obj) = value.as_object_mut() else {
            return Err(ConsoleError::Invalid(
                "the envelope must be a JSON object with at least \"type\"".into(),
            ));
        };
        if !obj.contains_key("id") {
            let r: u64 = rand::random();
            obj.insert("id".into(), serde_json::json!(format!("evt-{r:016x}")));
        }
        // Who sent it and when are the node's to say, not the caller's.
        obj.insert("from".into(), serde_json::json!(actor.name));
        obj.insert(
            "sent_at".into(),
            serde_json::json!(crate::clock::now_rfc3339()),
        );
        let envelope: Envelope = serde_json::from_value(value)
            .map_err(|e| ConsoleError::Invalid(format!("the envelope is not valid: {e}")))?;
        envelope
            .check()
            .map_err(|e| ConsoleError::Invalid(format!("the envelope is not valid: {e}")))?;
        if envelope.is_engines() {
            self.audited_on(
                actor,
                "seat.send",
                handle,
                Some(&format!("type {}", envelope.kind)),
                "refused: the engine's own type",
            )
            .await?;
            return Err(ConsoleError::Invalid(format!(
                "`type` {:?} is the engine's own (a run's completion or an approval's answer comes only from the engine); send a task_assigned, external_notification, a2a_request or a2a_message instead",
                envelope.kind
            )));
        }
        let fresh = self
            .engine
            .queue()
            .publish(
                &crate::queue::inbox_subject(handle),
                Some(&envelope.id),
                bytes::Bytes::from(envelope.encode()),
            )
            .await
            .map_err(|e| unavailable("publish to the inbox", e))?;
        let reason = format!("type {}, id {}", envelope.kind, envelope.id);
        let result = if fresh {
            "ok"
        } else {
            "duplicate id: not published again"
        };
        audit::record(
            &self.pool,
            &actor.name,
            "seat.send",
            Some(handle),
            Some(&reason),
            result,
        )
        .await
        .map_err(|e| unavailable("write the audit log", e))?;
        Ok(envelope.id)
    }

    async fn pause(
        &self,
        actor: &Person,
        handle: &str,
        reason: Option<String>,
        stop_running_turn: bool,
    ) -> Result<SeatActionResult, ConsoleError> {
        let action = SeatAction::Pause;
        let reason = self
            .admit_seat_action(actor, action, handle, reason)
            .await?;
        let record = PauseRecord {
            by: actor.name.clone(),
            at: crate::clock::now_rfc3339(),
            reason: reason.clone(),
            stop_running_turn,
        };
        let engine = &self.engine;
        let fresh = match pause::pause(&**engine.store(), &**engine.queue(), handle, record).await {
            Ok(fresh) => fresh,
            Err(e) => {
                return Err(self
                    .failed_seat_action(actor, action, handle, reason.as_deref(), e)
                    .await);
            }
        };
        engine.events().emit(Event::SeatPaused {
            seat: handle.to_string(),
            by: actor.name.clone(),
            reason: reason.clone(),
            stop_running_turn,
        });
        let mut result = if fresh {
            "paused".to_string()
        } else {
            "already paused (updated)".to_string()
        };
        if stop_running_turn {
            result.push_str("; the running turn stops at its next round");
        }
        self.audited_seat(actor, action, handle, reason.as_deref(), &result)
            .await?;
        Ok(SeatActionResult {
            seat: handle.to_string(),
            result,
        })
    }

    async fn resume(&self, actor: &Person, handle: &str) -> Result<SeatActionResult, ConsoleError> {
        let action = SeatAction::Resume;
        self.admit_seat_action(actor, action, handle, None).await?;
        let engine = &self.engine;
        let was_paused = match pause::resume(&**engine.store(), &**engine.queue(), handle).await {
            Ok(was) => was,
            Err(e) => {
                return Err(self
                    .failed_seat_action(actor, action, handle, None, e)
                    .await);
            }
        };
        let result = if was_paused {
            engine.events().emit(Event::SeatResumed {
                seat: handle.to_string(),
                by: actor.name.clone(),
            });
            "resumed"
        } else {
            "was not paused"
        };
        self.audited_seat(actor, action, handle, None, result)
            .await?;
        Ok(SeatActionResult {
            seat: handle.to_string(),
            result: result.to_string(),
        })
    }

    async fn stop(
        &self,
        actor: &Person,
        handle: &str,
        reason: Option<String>,
    ) -> Result<SeatActionResult, ConsoleError> {
        let action = SeatAction::Stop;
        let reason = self
            .admit_seat_action(actor, action, handle, reason)
            .await?;
        // Nothing to stop: said so (and audited), no stop is sent.
        let running = self
            .seat_page(SeatQuery::default(), Some(handle))
            .await
            .map(|l| l.rows.iter().any(|r| r.running_turn.is_some()))
            .unwrap_or(true);
        if !running {
            let result = "no turn was running";
            self.audited_seat(actor, action, handle, reason.as_deref(), result)
                .await?;
            return Ok(SeatActionResult {
                seat: handle.to_string(),
                result: result.to_string(),
            });
        }
        let engine = &self.engine;
        if let Err(e) = pause::stop(&**engine.queue(), handle, &actor.name).await {
            return Err(self
                .failed_seat_action(actor, action, handle, reason.as_deref(), e)
                .await);
        }
        engine.events().emit(Event::TurnStopRequested {
            seat: handle.to_string(),
            by: actor.name.clone(),
        });
        let result = "stop requested";
        self.audited_seat(actor, action, handle, reason.as_deref(), result)
            .await?;
        Ok(SeatActionResult {
            seat: handle.to_string(),
            result: result.to_string(),
        })
    }

    async fn node_order(&self) -> Result<NodeOrderView, ConsoleError> {
        crate::web::ranking::order_view(&**self.engine.store())
            .await
            .map_err(|e| crate::web::ranking::ranking_failure(e).0)
    }

    async fn save_node_order(
        &self,
        actor: &Person,
        nodes: Vec<String>,
        revision: Option<u64>,
    ) -> Result<NodeOrderView, ConsoleError> {
        use crate::seat::ranking;
        const ACTION: &str = "node_order.save";
        let asked = format!("order: {}", nodes.join(", "));
        if !actor.is_operator() {
            self.audited(actor, ACTION, Some(&asked), "refused: not an operator")
                .await?;
            return Err(ConsoleError::Forbidden(format!(
                "{} is a viewer: only operators may change the node order.",
                actor.name
            )));
        }
        let store = self.engine.store();
        match ranking::save(&**store, nodes.clone(), &actor.name, revision).await {
            Ok(saved) => {
                // Audited before it is announced: a page that refetches the
                // audit log on the event finds the row.
                let audited = self
                    .audited(
                        actor,
                        ACTION,
                        Some(&asked),
                        &format!("saved (revision {saved})"),
                    )
                    .await;
                self.engine.events().emit(Event::NodeOrderChanged {
                    nodes,
                    by: actor.name.clone(),
                });
                audited?;
                self.node_order().await
            }
            Err(e) => {
                let (e, result) = crate::web::ranking::ranking_failure(e);
                self.audited(actor, ACTION, Some(&asked), &result).await?;
                Err(e)
            }
        }
    }

    async fn move_seat(
        &self,
        actor: &Person,
        handle: &str,
        node: &str,
        reason: &str,
    ) -> Result<MoveRequestView, ConsoleError> {
        const ACTION: &str = "seat.move";
        let reason = reason.trim();
        let why = Some(reason).filter(|r| !r.is_empty());
        let audit_row = |result: String| async move {
            self.audited_on(actor, ACTION, handle, why, &result).await
        };
        if !actor.is_operator() {
            audit_row(format!("refused: not an operator (to {node})")).await?;
            return Err(ConsoleError::Forbidden(format!(
                "{} is a viewer: only operators may move a seat.",
                actor.name
            )));
        }
        let n = reason.chars().count();
        if n > MAX_REASON_CHARS {
            audit::record(
                &self.pool,
                &actor.name,
                ACTION,
                Some(handle),
                None,
                "refused: reason too long",
            )
            .await
            .map_err(|e| unavailable("write the audit log", e))?;
            return Err(ConsoleError::Invalid(format!(
                "reason: at most {MAX_REASON_CHARS} characters (this one has {n})."
            )));
        }
        let store = self.engine.store();
        match crate::seat::moves::request(&**store, handle, node, &actor.name, reason).await {
            Ok(req) => {
                let audited = audit_row(format!("requested: to {}", req.to)).await;
                self.engine.events().emit(Event::SeatMoveRequested {
                    seat: req.seat.clone(),
                    to: req.to.clone(),
                    by: req.by.clone(),
                    reason: req.reason.clone(),
                });
                audited?;
                Ok(crate::web::ranking::move_view(&req))
            }
            Err(e) => {
                let (e, result) = crate::web::ranking::move_failure(e);
                audit_row(result).await?;
                Err(e)
            }
        }
    }

    async fn dead_letters(
        &self,
        seat: Option<&str>,
        limit: usize,
    ) -> Result<DeadLetterList, ConsoleError> {
        crate::web::dead_letters::list(self.engine.queue().as_ref(), seat, limit).await
    }

    async fn dead_letter_count(&self) -> Result<u64, ConsoleError> {
        self.engine
            .queue()
            .dead_letter_count()
            .await
            .map_err(|e| unavailable("count the dead letters", e))
    }

    async fn requeue_dead_letter(
        &self,
        actor: &Person,
        id: u64,
    ) -> Result<DeadLetterActionResult, ConsoleError> {
        self.dead_letter_action(actor, DeadLetterAction::Requeue, id)
            .await
    }

    async fn discard_dead_letter(
        &self,
        actor: &Person,
        id: u64,
    ) -> Result<DeadLetterActionResult, ConsoleError> {
        self.dead_letter_action(actor, DeadLetterAction::Discard, id)
            .await
    }

    async fn approvals(&self, handle: &str) -> Result<Vec<ApprovalView>, ConsoleError> {
        if !self.engine.company().handles().any(|h| h == handle) {
            return Err(seat_failure(
                handle,
                PauseError::NoSuchSeat(handle.to_string()),
            ));
        }
        self.turns
            .approvals()
            .list(handle)
            .await
            .map(|v| v.iter().map(crate::web::approvals::approval_view).collect())
            .map_err(|e| unavailable("read the seat's approvals", e))
    }

    async fn answer_approval(
        &self,
        actor: &Person,
        handle: &str,
        approval_id: &str,
        approve: bool,
        reason: &str,
    ) -> Result<ApprovalView, ConsoleError> {
        use crate::engine::approvals::{AnswerRefused, Decision};
        let action = if approve { "tool.approve" } else { "tool.deny" };
        let reason = reason.trim();
        let n = reason.chars().count();
        let why = Some(reason).filter(|r| !r.is_empty() && n <= MAX_REASON_CHARS);
        let audit_row = |result: String| async move {
            self.audited_on(actor, action, handle, why, &result).await
        };
        if !actor.is_operator() {
            audit_row(format!("refused: not an operator ({approval_id})")).await?;
            return Err(ConsoleError::Forbidden(format!(
                "{} is a viewer: only operators may answer an approval.",
                actor.name
            )));
        }
        if reason.is_empty() || n > MAX_REASON_CHARS {
            audit_row(format!(
                "refused: no reason or too long a one ({approval_id})"
            ))
            .await?;
            return Err(ConsoleError::Invalid(format!(
                "reason: say why, in 1 to {MAX_REASON_CHARS} characters (this one has {n})."
            )));
        }
        if !self.engine.company().handles().any(|h| h == handle) {
            audit_row(format!("refused: no such seat ({approval_id})")).await?;
            return Err(seat_failure(
                handle,
                PauseError::NoSuchSeat(handle.to_string()),
            ));
        }
        let decision = if approve {
            Decision::Approved
        } else {
            Decision::Denied
        };
        match self
            .turns
            .approvals()
            .answer(handle, approval_id, decision, &actor.name, reason)
            .await
        {
            Ok(r) => {
                audit_row(format!("{} {} ({approval_id})", decision.name(), r.tool)).await?;
                Ok(crate::web::approvals::approval_view(&r))
            }
            Err(AnswerRefused::NotFound(_)) => {
                audit_row(format!("refused: no such approval ({approval_id})")).await?;
                Err(ConsoleError::NotFound(format!(
                    "seat {handle:?} has no approval {approval_id:?}; GET /api/seats/{handle}/approvals lists them."
                )))
            }
            Err(e @ AnswerRefused::AlreadyAnswered { .. }) => {
                audit_row(format!("refused: already answered ({approval_id})")).await?;
                Err(ConsoleError::Conflict(format!("{e}; reload to see it.")))
            }
            Err(AnswerRefused::Store(e)) => {
                audit_row(format!(
                    "failed: the coordination store is unavailable ({approval_id})"
                ))
                .await?;
                Err(unavailable("reach the coordination store", e))
            }
        }
    }

    async fn audit(&self, filter: AuditFilter, page: u32) -> Result<AuditView, ConsoleError> {
        self.fleet_audit
            .read_page(&filter, page)
            .await
            .map_err(|e| unavailable("read the audit log", e))
    }
}
