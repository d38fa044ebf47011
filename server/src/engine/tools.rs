//! The engine's built-in tools, executed by the engine (never by the
//! agent) after the fence check: `post_outbox`, `a2a_message`,
//! `diary_write`, `episode_write`, `read_memory`, `run_detached` (which
//! starts a detached run and parks the turn: the round it ran in is the
//! turn's last, see [`super::turn::parks`]).
//!
//! Each tool carries its own annotations, and whether a call reached
//! outside the engine is decided by [`reached_outside`] over them:
//! `post_outbox` and `a2a_message` are open-world (the outbound effect, and
//! a colleague woken), the memory tools are not. A call refused before any
//! I/O (bad arguments, an unknown recipient, an unknown tool) reached
//! nothing.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::agent::{
    Annotations, Backing, ToolCall, ToolResult, ToolSpec, TurnInput, reached_outside,
};
use super::envelope::Envelope;
use super::outbox::{Effect, Outbox};
use super::routing;
use super::turn::Executed;
use crate::company::Company;
use crate::config::RoleConfig;
use crate::memory::MemoryStore;
use crate::metrics::{self, Update};
use crate::queue::Queue;

const fn own(read_only: bool, open_world: bool) -> Annotations {
    Annotations {
        read_only: Some(read_only),
        open_world: Some(open_world),
        destructive: None,
        idempotent: None,
    }
}

/// The built-in tools and their own annotations.
pub const BUILT_IN: [(&str, Annotations); 6] = [
    ("run_detached", own(false, true)),
    ("post_outbox", own(false, true)),
    ("a2a_message", own(false, true)),
    ("diary_write", own(false, false)),
    ("episode_write", own(false, false)),
    ("read_memory", own(true, false)),
];

/// A built-in tool's annotations; `None` for a name that is not one.
pub fn annotations_of(name: &str) -> Option<Annotations> {
    BUILT_IN.iter().find(|(n, _)| *n == name).map(|(_, a)| *a)
}

/// The built-in tools as an agent is told them.
pub fn built_in_specs() -> Vec<ToolSpec> {
    let text =
        |k: &str| json!({"type": "object", "properties": {k: {"type": "string"}}, "required": [k]});
    let described = |name: &str| -> (&'static str, Value) {
        match name {
            "run_detached" => (
                "Start a child process the node's [runs] allow, parking the turn until it finishes.",
                json!({"type": "object", "properties": {"argv": {"type": "array", "items": {"type": "string"}}, "timeout_seconds": {"type": "integer"}}, "required": ["argv"]}),
            ),
            "post_outbox" => (
                "Post one outbound effect on the seat's outbox.",
                json!({"type": "object"}),
            ),
            "a2a_message" => (
                "Send a message to another seat of the company.",
                json!({"type": "object", "properties": {"to": {"type": "string"}, "text": {"type": "string"}}, "required": ["to", "text"]}),
            ),
            "diary_write" => ("Write a line in the seat's diary.", text("text")),
            "episode_write" => ("Write this work's episode summary.", text("summary")),
            _ => (
                "Read the seat's latest diary lines and episodes.",
                json!({"type": "object", "properties": {"limit": {"type": "integer"}}}),
            ),
        }
    };
    BUILT_IN
        .iter()
        .map(|(name, a)| {
            let (description, input_schema) = described(name);
            ToolSpec {
                name: name.to_string(),
                description: description.to_string(),
                input_schema,
                annotations: *a,
            }
        })
        .collect()
}

/// The tool executor of one node.
#[derive(Clone)]
pub struct Tools {
    pub incarnation: String,
    pub runs: super::runs::Runs,
    pub supervisor: Arc<super::runs::Supervisor>,
    pub events: crate::events::EventBus,
    pub outbox: Arc<dyn Outbox>,
    pub queue: Arc<dyn Queue>,
    pub memory: MemoryStore,
    pub company: watch::Receiver<Company>,
    /// What `run_detached` may start here (the node's own
    /// `[[node.programs]]` rules that say `run`, and `[runs] allow`).
    pub programs: crate::config::Programs,
    /// The MCP servers of the seats held here.
    pub mcp: super::mcp::McpSeats,
    /// The calls waiting for a person's approval.
    pub approvals: super::approvals::Approvals,
    /// Each seat's role as it was established here and as its last turn
    /// began ([`Tools::surface`]): what judges a built-in call of a turn
    /// whose role a revision removed (a removed seat's last turns, an
    /// undead seat's in-flight turn, finish as they began — and post).
    pub roles_at_start: RolesAtStart,
}

/// Each seat's role as its last turn began.
#[derive(Clone, Default)]
pub struct RolesAtStart(Arc<std::sync::Mutex<std::collections::HashMap<String, RoleConfig>>>);

impl RolesAtStart {
    pub fn keep(&self, role: RoleConfig) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(role.handle.clone(), role);
    }

    fn of(&self, seat: &str) -> Option<RoleConfig> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(seat)
            .cloned()
    }
}

/// The most seats one chain of `a2a_message` mail may pass through: past
/// it, a loop (or an injected mail bouncing between seats) is stopped.
pub const A2A_HOP_LIMIT: u64 = 8;

/// Pure: may seat `from` (of `role`) mail seat `to` while answering
/// `triggers`? `Ok` is the hop count the new mail carries (`body.hops`):
/// one past the most any a2a trigger of the turn carried. Refused: a
/// self-send, a seat its role's `a2a_to` does not list, a chain at
/// [`A2A_HOP_LIMIT`].
pub fn a2a_verdict(
    role: Option<&RoleConfig>,
    from: &str,
    to: &str,
    triggers: &[Envelope],
) -> Result<u64, A2aRefused> {
    if to == from {
        return Err(A2aRefused::ItsOwnSeat(from.to_string()));
    }
    let Some(role) = role else {
        return Err(A2aRefused::NoRole(from.to_string()));
    };
    if !role.a2a_to.iter().any(|p| p == "*" || p == to) {
        return Err(A2aRefused::NotListed {
            from: from.to_string(),
            to: to.to_string(),
            listed: if role.a2a_to.is_empty() {
                "no seat".to_string()
            } else {
                role.a2a_to.join(", ")
            },
        });
    }
    let came = triggers
        .iter()
        .filter(|t| t.kind == "a2a_message")
        .map(|t| t.body.get("hops").and_then(Value::as_u64).unwrap_or(1))
        .max()
        .unwrap_or(0);
    if came >= A2A_HOP_LIMIT {
        return Err(A2aRefused::ChainStopped(came));
    }
    Ok(came + 1)
}

/// Why a seat may not send `a2a_message` where it asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum A2aRefused {
    #[error("seat {0:?} may not mail itself")]
    ItsOwnSeat(String),
    #[error("seat {0:?} has no role in the active company")]
    NoRole(String),
    #[error(
        "seat {from:?} may not mail seat {to:?}: its role's a2a_to lists {listed} (the company file decides whom a seat may mail)"
    )]
    NotListed {
        from: String,
        to: String,
        listed: String,
    },
    #[error(
        "this mail has passed through {0} seats already (at most {A2A_HOP_LIMIT}): the chain is stopped here"
    )]
    ChainStopped(u64),
}

/// The refusal of a call whose seat has no role: nothing says whether a
/// person must approve it, so it does not run.
fn no_role(call: &ToolCall, seat: &str) -> ToolResult {
    ToolResult::err(
        &call.id,
        format!(
            "{}: refused: seat {seat:?} has no role in the active company, so nothing says whether a person must approve the call",
            call.name
        ),
    )
}

/// Why a call failed: refused before any I/O (it reached nothing), or
/// failed in its I/O (it may have reached outside).
enum ToolError {
    Refused(String),
    Failed(String),
}

fn text_arg(call: &ToolCall, key: &str) -> Result<String, ToolError> {
    match call.args.get(key) {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
        Some(other) if !other.is_null() => Err(ToolError::Refused(format!(
            "{}: `{key}` must be a non-empty string, not {other}",
            call.name
        ))),
        _ => Err(ToolError::Refused(format!(
            "{}: `{key}` is required",
            call.name
        ))),
    }
}

impl Tools {
    fn effect(&self, turn: &TurnInput, kind: &str, body: Value) -> Effect {
        Effect {
            work_key: turn.work_key.clone(),
            trigger_ids: turn.triggers.iter().map(|t| t.id.clone()).collect(),
            seat: turn.seat.clone(),
            node: turn.node.clone(),
            incarnation: self.incarnation.clone(),
            epoch: turn.epoch,
            turn_id: turn.turn_id.clone(),
            kind: kind.to_string(),
            body,
            at: Some(crate::clock::now_rfc3339()),
        }
    }

    /// The id of an a2a message: the same for every re-run of the same
    /// work (so the queue's dedupe window collapses a repeat), distinct
    /// per call.
    fn a2a_id(turn: &TurnInput, call: &ToolCall, to: &str) -> String {
        let work = turn.work_key.as_deref().unwrap_or(&turn.turn_id);
        let mut h = Sha256::new();
        for part in [work, turn.seat.as_str(), to, call.id.as_str()] {
            h.update(part.as_bytes());
            h.update([0u8]);
        }
        format!("a2a-{}", &hex::encode(h.finalize())[..32])
    }

    /// The identity of an outbound effect: the same for every re-run of
    /// the same work (so the outbox keeps one), distinct per call.
    fn effect_id(turn: &TurnInput, call: &ToolCall) -> String {
        let work = turn.work_key.as_deref().unwrap_or(&turn.turn_id);
        let mut h = Sha256::new();
        for part in [
            work,
            turn.seat.as_str(),
            call.name.as_str(),
            call.id.as_str(),
        ] {
            h.update(part.as_bytes());
            h.update([0u8]);
        }
        format!("effect-{}", &hex::encode(h.finalize())[..32])
    }

    async fn run(&self, turn: &TurnInput, call: &ToolCall) -> Result<Value, ToolError> {
        match call.name.as_str() {
            "post_outbox" => self.post_outbox(turn, call).await,
            "a2a_message" => self.a2a_message(turn, call).await,
            "diary_write" => self.diary_write(turn, call).await,
            "episode_write" => self.episode_write(turn, call).await,
            "read_memory" => self.read_memory(turn, call).await,
            "run_detached" => self.run_detached(turn, call).await,
            other => Err(ToolError::Refused(format!(
                "no tool named {other:?}; the tools are post_outbox, a2a_message, diary_write, episode_write, read_memory, run_detached"
            ))),
        }
    }

    /// `post_outbox`: one effect in the outbox, keyed on the work.
    async fn post_outbox(&self, turn: &TurnInput, call: &ToolCall) -> Result<Value, ToolError> {
        let body = if call.args.is_null() {
            json!({})
        } else {
            call.args.clone()
        };
        self.outbox
            .post(
                &self.effect(turn, "post_outbox", body),
                &Self::effect_id(turn, call),
            )
            .await
            .map_err(|e| ToolError::Failed(e.to_string()))?;
        Ok(json!({"posted": true}))
    }

    /// `a2a_message`: mail to another seat of the company, routed by the org chart, its id keyed on the work.
    async fn a2a_message(&self, turn: &TurnInput, call: &ToolCall) -> Result<Value, ToolError> {
        let to = text_arg(call, "to")?;
        let text = text_arg(call, "text")?;
        let company = self.company.borrow().clone();
        let role = company.roles.iter().find(|r| r.handle == turn.seat);
        let hops = a2a_verdict(role, &turn.seat, &to, &turn.triggers)
            .map_err(|e| ToolError::Refused(format!("a2a_message: {e}")))?;
        let Some(route) = routing::resolve(&company, &to) else {
            return Err(ToolError::Refused(format!(
                "a2a_message: no seat {to:?} in the company {:?}",
                company.name
            )));
        };
        let id = Self::a2a_id(turn, call, &to);
        let envelope = Envelope {
            id: id.clone(),
            kind: "a2a_message".into(),
            body: json!({
                "text": text,
                "from_seat": turn.seat,
                "hops": hops,
                "from_agent_id": routing::agent_id(&company.name, &turn.seat).to_string(),
                "to_agent_id": route.agent_id.to_string(),
            }),
            thread: None,
            message_id: None,
            from: Some(turn.seat.clone()),
            sent_at: Some(crate::clock::now_rfc3339()),
        };
        self.queue
            .publish(
                &route.inbox_subject,
                Some(&id),
                Bytes::from(envelope.encode()),
            )
            .await
            .map_err(|e| ToolError::Failed(format!("a2a_message: {e}")))?;
        let effect = json!({"to": to, "agent_id": route.agent_id.to_string(), "envelope_id": id});
        if let Err(e) = self
            .outbox
            .post(
                &self.effect(turn, "a2a_message", effect.clone()),
                &Self::effect_id(turn, call),
            )
            .await
        {
            tracing::warn!(seat = %turn.seat, error = %e, "the a2a message went out; its outbox record did not");
        }
        Ok(effect)
    }

    /// `diary_write`: a line in the seat's diary.
    async fn diary_write(&self, turn: &TurnInput, call: &ToolCall) -> Result<Value, ToolError> {
        let text = text_arg(call, "text")?;
        let written = self
            .memory
            .diary_write(&turn.seat, &text, turn.work_key.as_deref())
            .await
            .map_err(|e| ToolError::Failed(format!("diary_write: {e}")))?;
        Ok(json!({"written": written}))
    }

    /// `episode_write`: the work's episode, keyed on the work.
    async fn episode_write(&self, turn: &TurnInput, call: &ToolCall) -> Result<Value, ToolError> {
        let summary = text_arg(call, "summary")?;
        let written = self
            .memory
            .episode_write(
                &turn.seat,
                turn.work_key.as_deref(),
                &summary,
                &turn.turn_id,
            )
            .await
            .map_err(|e| ToolError::Failed(format!("episode_write: {e}")))?;
        Ok(json!({"written": written}))
    }

    /// `read_memory`: the seat's latest diary lines and episodes.
    async fn read_memory(&self, turn: &TurnInput, call: &ToolCall) -> Result<Value, ToolError> {
        let limit = call
            .args
            .get("limit")
            .and_then(Value::as_u64)
            .unwrap_or(20)
            .min(200) as u32;
        let diary = self
            .memory
            .diary(&turn.seat, limit)
            .await
            .map_err(|e| ToolError::Failed(format!("read_memory: {e}")))?;
        let episodes = self
            .memory
            .episodes(&turn.seat, limit)
            .await
            .map_err(|e| ToolError::Failed(format!("read_memory: {e}")))?;
        Ok(json!({"diary": diary, "episodes": episodes}))
    }

    /// `run_detached`: a child process the node's own file allows, keyed on the work so a re-run launches nothing twice; the turn parks on it.
    async fn run_detached(&self, turn: &TurnInput, call: &ToolCall) -> Result<Value, ToolError> {
        let argv: Vec<String> = match call.args.get("argv") {
            Some(Value::Array(a)) if !a.is_empty() => a
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    ToolError::Refused("run_detached: `argv` must be a list of strings".into())
                })?,
            _ => {
                return Err(ToolError::Refused(
                    "run_detached: `argv` is required (a non-empty list of strings)".into(),
                ));
            }
        };
        // Only what the node's own file allows, whatever the agent
        // (or the mail it read) asked for.
        self.programs
            .judge(
                crate::config::ProgramUse::Run,
                &argv,
                &crate::config::programs::find_on_node,
            )
            .map_err(|e| ToolError::Refused(format!("run_detached: {e}")))?;
        let timeout = call
            .args
            .get("timeout_seconds")
            .and_then(Value::as_u64)
            .unwrap_or(3600)
            .clamp(1, 7 * 24 * 3600);
        // Keyed on the work: a re-run of the same turn finds the
        // run it started and launches nothing twice.
        let work = turn.work_key.as_deref().unwrap_or(&turn.turn_id);
        let mut h = Sha256::new();
        for part in [work, turn.seat.as_str(), call.id.as_str()] {
            h.update(part.as_bytes());
            h.update([0u8]);
        }
        let run_id = format!("run-{}", &hex::encode(h.finalize())[..24]);
        let now = crate::clock::now_rfc3339();
        let record = super::runs::RunRecord {
            run_id: run_id.clone(),
            seat: turn.seat.clone(),
            owner: self.incarnation.clone(),
            owner_epoch: turn.epoch,
            launcher: self.incarnation.clone(),
            launcher_node: turn.node.clone(),
            state: super::runs::RunState::Running,
            argv: argv.clone(),
            work_key: turn.work_key.clone(),
            result: None,
            resumed: false,
            created_at: now.clone(),
            updated_at: now,
        };
        let fresh = self
            .runs
            .create(&record)
            .await
            .map_err(|e| ToolError::Failed(format!("run_detached: {e}")))?;
        if fresh {
            if let Err(e) = self
                .supervisor
                .launch(&record, std::time::Duration::from_secs(timeout))
            {
                let _ = self
                    .runs
                    .mutate(&turn.seat, &run_id, turn.epoch, |r| {
                        r.state = super::runs::RunState::Failed;
                        r.result = Some(super::runs::RunResult {
                            error: Some(e.to_string()),
                            ..Default::default()
                        });
                        true
                    })
                    .await;
                return Err(ToolError::Failed(e.to_string()));
            }
            self.events.emit(crate::events::Event::RunStarted {
                seat: turn.seat.clone(),
                run_id: run_id.clone(),
                argv,
            });
        }
        Ok(json!({"run_id": run_id, "parked": true, "started": fresh}))
    }
}

/// Pure: what one executed call counts as in
/// `crewlet_tool_calls_total{tool, outcome}`: the tool by name when the
/// seat is given it (`known`; else `unknown`, so a model's invented names
/// never become series), and `parked` (a detached run or an approval),
/// `ok`, `failed` (sent, and it failed) or `refused` (refused before it
/// reached anything).
pub fn call_update(tool: &str, known: bool, done: &Executed) -> Update {
    let outcome = if done.parks.is_some() {
        "parked"
    } else if done.result.ok {
        "ok"
    } else if done.reached {
        "failed"
    } else {
        "refused"
    };
    let tool = if known { tool } else { "unknown" };
    Update::count2(
        metrics::TOOL_CALLS,
        ("tool", tool.to_string()),
        ("outcome", outcome.to_string()),
    )
}

#[async_trait::async_trait]
impl super::turn::ToolRunner for Tools {
    async fn execute(&self, turn: &TurnInput, call: &ToolCall) -> Executed {
        let known = annotations_of(&call.name).is_some()
            || self
                .mcp
                .get(&turn.seat)
                .is_some_and(|m| m.annotations(&call.name).is_some());
        let done = self.execute_call(turn, call).await;
        metrics::apply(&call_update(&call.name, known, &done));
        done
    }
}

impl Tools {
    /// Execute one call: a built-in tool here, any other through the
    /// seat's tool servers.
    async fn execute_call(&self, turn: &TurnInput, call: &ToolCall) -> Executed {
        // A tool's own annotations rule (the built-in's, or what its MCP
        // server listed); what the agent claimed about it cannot make an
        // outbound effect read-only.
        let Some(own) = annotations_of(&call.name) else {
            return self.execute_mcp(turn, call).await;
        };
        if super::approvals::APPROVABLE_BUILT_INS.contains(&call.name.as_str()) {
            // The role now, or as the turn began when a revision removed it
            // since; judged by nothing, the call does not run.
            let role = self
                .role_of(&turn.seat)
                .or_else(|| self.roles_at_start.of(&turn.seat));
            match role {
                None => return Executed::of(no_role(call, &turn.seat), false),
                Some(role) if super::approvals::built_in_needs_approval(&role, &call.name) => {
                    return self.ask_approval(turn, call, &role).await;
                }
                Some(_) => {}
            }
        }
        self.execute_built_in(turn, call, own).await
    }

    /// Run the built-in `call` (annotated `own`) now.
    async fn execute_built_in(
        &self,
        turn: &TurnInput,
        call: &ToolCall,
        own: Annotations,
    ) -> Executed {
        let counts = reached_outside(Backing::FirstParty, own);
        let (result, reached) = match self.run(turn, call).await {
            Ok(output) => (ToolResult::ok(&call.id, output), counts),
            Err(ToolError::Refused(e)) => (ToolResult::err(&call.id, e), false),
            // The call left: whether it landed is unknown, so a tool that
            // reaches outside counts.
            Err(ToolError::Failed(e)) => (ToolResult::err(&call.id, e), counts),
        };
        Executed {
            parks: super::turn::parks(call, &result),
            result,
            reached,
        }
    }

    /// A call of one of the seat's MCP tools: one its role says a person
    /// approves first is asked for and parks the turn; any other is called.
    async fn execute_mcp(&self, turn: &TurnInput, call: &ToolCall) -> Executed {
        let own = self
            .mcp
            .get(&turn.seat)
            .and_then(|m| m.annotations(&call.name));
        // Fail closed: a call whose role is gone (a company revision
        // removed it mid-turn) is judged by nothing, so it does not run.
        let Some(role) = self.role_of(&turn.seat) else {
            return Executed::of(no_role(call, &turn.seat), false);
        };
        if let Some(own) = own
            && super::approvals::needs_approval(&role, &call.name, &own)
        {
            return self.ask_approval(turn, call, &role).await;
        }
        self.call_mcp(&turn.seat, call).await
    }

    /// The role of `seat` in the active company.
    fn role_of(&self, seat: &str) -> Option<RoleConfig> {
        let company = self.company.borrow();
        company.roles.iter().find(|r| r.handle == seat).cloned()
    }

    /// Run an approved call of a built-in tool, in the turn it was asked
    /// in as its record keeps it, under `epoch` (the holder's, which
    /// claimed the record): its effects keep the identity they would have
    /// had, so a call run again after a crash posts nothing twice.
    pub async fn run_approved_built_in(
        &self,
        r: &super::approvals::ApprovalRecord,
        epoch: u64,
        node: &str,
    ) -> Executed {
        let call = ToolCall {
            id: r.call_id.clone(),
            name: r.tool.clone(),
            args: r.arguments.clone(),
            annotations: Default::default(),
        };
        let Some(own) = annotations_of(&call.name) else {
            return Executed::of(
                ToolResult::err(&call.id, format!("no built-in tool named {:?}", call.name)),
                false,
            );
        };
        let turn = TurnInput {
            turn_id: r.turn_id.clone(),
            seat: r.seat.clone(),
            epoch,
            node: node.to_string(),
            work_key: r.asked_in.work_key.clone(),
            triggers: r.asked_in.triggers.clone(),
            delivered: 1,
            tools: Vec::new(),
        };
        self.execute_built_in(&turn, &call, own).await
    }

    /// Ask a person to approve `call`: its record is written (once for the
    /// same work) and the turn parks on it. A call asked for before whose
    /// outcome is recorded is answered with it.
    async fn ask_approval(&self, turn: &TurnInput, call: &ToolCall, role: &RoleConfig) -> Executed {
        use super::approvals::{ApprovalRecord, ApprovalState, approval_id};
        // A person approves what they can read whole: arguments past the
        // bound are refused before anyone is asked.
        let size = call.args.to_string().len();
        if size > super::approvals::ARGUMENTS_LIMIT {
            return Executed::of(
                ToolResult::err(
                    &call.id,
                    format!(
                        "{}: refused: its arguments are {size} bytes, more than the {} a person is asked to approve; send smaller arguments",
                        call.name,
                        super::approvals::ARGUMENTS_LIMIT
                    ),
                ),
                false,
            );
        }
        let work = turn.work_key.as_deref().unwrap_or(&turn.turn_id);
        let now = crate::clock::now_rfc3339();
        let now_ms = super::approvals::now_ms();
        let record = ApprovalRecord {
            approval_id: approval_id(work, &turn.seat, &call.id),
            seat: turn.seat.clone(),
            tool: call.name.clone(),
            arguments: call.args.clone(),
            call_id: call.id.clone(),
            turn_id: turn.turn_id.clone(),
            owner: self.incarnation.clone(),
            owner_epoch: turn.epoch,
            state: ApprovalState::Pending,
            asked_at: now.clone(),
            deadline_ms: now_ms.saturating_add(role.approval_timeout_seconds.saturating_mul(1000)),
            timeout_seconds: role.approval_timeout_seconds,
            decision: None,
            answered_by: None,
            reason: None,
            answered_at: None,
            outcome: None,
            updated_at: now,
            asked_in: super::approvals::AskedIn::of(turn.work_key.as_deref(), &turn.triggers),
        };
        match self.approvals.ask(record).await {
            Ok(r) if r.state == ApprovalState::Ran => {
                let o = r.outcome.unwrap_or_else(|| {
                    super::approvals::CallOutcome::failed("its outcome was not recorded")
                });
                let mut result = ToolResult::ok(&call.id, o.output);
                result.ok = o.ok;
                result.error = o.error;
                Executed::of(result, false)
            }
            Ok(r) => Executed {
                result: ToolResult::ok(
                    &call.id,
                    json!({
                        "approval_id": r.approval_id,
                        "parked": true,
                        "waiting_for": "approval",
                    }),
                ),
                reached: false,
                parks: Some(r.approval_id),
            },
            Err(e) => Executed::of(
                ToolResult::err(
                    &call.id,
                    format!("{}: cannot ask for approval: {e}", call.name),
                ),
                false,
            ),
        }
    }

    /// Call one of `seat`'s MCP tools: classified by the tool's listed
    /// annotations; a call that was sent counts whether it succeeded or
    /// not (whether it landed is unknown).
    pub async fn call_mcp(&self, seat: &str, call: &ToolCall) -> Executed {
        let servers = self.mcp.get(seat);
        let Some(own) = servers.as_ref().and_then(|m| m.annotations(&call.name)) else {
            return Executed::of(
                ToolResult::err(&call.id, format!("no tool named {:?}", call.name)),
                false,
            );
        };
        let Some(servers) = servers else {
            return Executed::of(
                ToolResult::err(&call.id, "the seat has no tool servers"),
                false,
            );
        };
        let counts = reached_outside(Backing::Mcp, own);
        let (result, reached) = match servers.call(&call.name, &call.args).await {
            Ok(output) => (ToolResult::ok(&call.id, output), counts),
            Err((super::mcp::CallError::Unknown(e), _)) => (ToolResult::err(&call.id, e), false),
            Err((super::mcp::CallError::Failed(e), output)) => {
                let mut r = ToolResult::err(&call.id, e);
                r.output = output;
                (r, counts)
            }
        };
        Executed::of(result, reached)
    }

    /// The tools an agent of `seat` is told this turn.
    pub fn surface(&self, seat: &str) -> Vec<ToolSpec> {
        if let Some(role) = self.role_of(seat) {
            self.roles_at_start.keep(role);
        }
        let mut tools = built_in_specs();
        if let Some(m) = self.mcp.get(seat) {
            tools.extend(m.tools());
        }
        tools
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mail(kind: &str, hops: Option<u64>) -> Envelope {
        let mut body = json!({"text": "hi"});
        if let Some(h) = hops {
            body["hops"] = json!(h);
        }
        Envelope {
            id: "m".into(),
            kind: kind.into(),
            body,
            thread: None,
            message_id: None,
            from: Some("x".into()),
            sent_at: None,
        }
    }

    #[test]
    fn a2a_mail_goes_only_where_the_role_allows_never_to_itself_and_a_chain_stops() {
        let role = RoleConfig {
            handle: "desk".into(),
            a2a_to: vec!["billing".into()],
            ..RoleConfig::default()
        };
        let task = [mail("task_assigned", None)];
        assert_eq!(a2a_verdict(Some(&role), "desk", "billing", &task), Ok(1));
        // A mail that asks the seat to reach a privileged one.
        let e = a2a_verdict(Some(&role), "desk", "admin-agent", &task).unwrap_err();
        assert!(matches!(e, A2aRefused::NotListed { .. }), "{e}");
        assert!(e.to_string().contains("a2a_to lists billing"), "{e}");
        let e = a2a_verdict(Some(&role), "desk", "desk", &task).unwrap_err();
        assert_eq!(e, A2aRefused::ItsOwnSeat("desk".into()));
        assert!(e.to_string().contains("may not mail itself"), "{e}");
        let none = RoleConfig {
            handle: "desk".into(),
            ..RoleConfig::default()
        };
        let e = a2a_verdict(Some(&none), "desk", "billing", &task).unwrap_err();
        assert!(e.to_string().contains("lists no seat"), "{e}");
        assert_eq!(
            a2a_verdict(None, "desk", "billing", &task),
            Err(A2aRefused::NoRole("desk".into()))
        );
        let any = RoleConfig {
            a2a_to: vec!["*".into()],
            ..none
        };
        // Hops: one past the most an a2a trigger carried (one without the
        // count is one hop), until the limit.
        assert_eq!(
            a2a_verdict(Some(&any), "desk", "x", &[mail("a2a_message", None)]),
            Ok(2)
        );
        assert_eq!(
            a2a_verdict(
                Some(&any),
                "desk",
                "x",
                &[mail("a2a_message", Some(3)), mail("a2a_message", Some(6))]
            ),
            Ok(7)
        );
        let e = a2a_verdict(
            Some(&any),
            "desk",
            "x",
            &[mail("a2a_message", Some(A2A_HOP_LIMIT))],
        )
        .unwrap_err();
        assert_eq!(e, A2aRefused::ChainStopped(A2A_HOP_LIMIT));
        assert!(e.to_string().contains("chain is stopped"), "{e}");
    }

    fn labels(u: Update) -> Vec<(&'static str, String)> {
        match u {
            Update::Count { name, labels, by } => {
                assert_eq!((name, by), (metrics::TOOL_CALLS, 1));
                labels
            }
            other => panic!("not a count: {other:?}"),
        }
    }

    fn pair(tool: &str, outcome: &str) -> Vec<(&'static str, String)> {
        vec![("tool", tool.to_string()), ("outcome", outcome.to_string())]
    }

    #[test]
    fn a_tool_call_counts_by_tool_and_outcome_and_an_invented_tool_is_unknown() {
        let ok = Executed::of(ToolResult::ok("c", json!({})), true);
        assert_eq!(
            labels(call_update("post_outbox", true, &ok)),
            pair("post_outbox", "ok")
        );
        let failed = Executed::of(ToolResult::err("c", "timed out"), true);
        assert_eq!(
            labels(call_update("fs.write_file", true, &failed)),
            pair("fs.write_file", "failed")
        );
        let refused = Executed::of(ToolResult::err("c", "no tool named"), false);
        assert_eq!(
            labels(call_update("made_up", false, &refused)),
            pair("unknown", "refused")
        );
        let parked = Executed {
            result: ToolResult::ok("c", json!({"parked": true})),
            reached: false,
            parks: Some("approval-1".into()),
        };
        assert_eq!(
            labels(call_update("fs.write_file", true, &parked)),
            pair("fs.write_file", "parked")
        );
    }
}
