//! Approvals: the tool calls a person allows before they run. A role's
//! `approve` patterns and `approve_destructive` name them
//! ([`needs_approval`]). Such a call is not executed when the agent asks
//! for it: its record (`approval:{seat}:{approval id}` in `crewlet_runs`)
//! keeps the tool, its arguments and the turn that asked,
//! `tool_approval_requested` is emitted, and the turn parks the way a
//! detached run parks it.
//!
//! A person's answer ([`Approvals::answer`], taken by any node) is written
//! in the record once, from `pending`, and told to the seat's holder on
//! the seat's control subject; the holder turns it into a
//! `tool_approval_answered` trigger and resumes under its own epoch
//! ([`resume_plan`]): an approved call runs there once (the record moves to
//! `running` under that epoch before the call, and keeps the call's
//! outcome after it, `ran`), a denied one reaches the agent as a failed
//! call naming who denied it and why, and the resume is recorded in the
//! completion ledger like a run's. A `running` record left by a holder at
//! an earlier epoch is never called again: the call's outcome is unknown,
//! and the agent is told so. An approval nobody answers within the role's
//! `approval_timeout_seconds` is denied as timed out by a timer of the
//! node that asked (and of each later holder, armed when it takes the
//! seat). Only an answer written through [`Approvals::answer`] counts:
//! nothing the agent, its mail or a tool server says approves a call.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::agent::Annotations;
use super::runs::ControlMessage;
use crate::config::RoleConfig;
use crate::coord::{KvError, StateBucket, Store, StoreError};
use crate::events::{Event, EventBus};
use crate::queue::{Queue, control_subject};
use crate::tasks::Tasks;

/// The inbox type a person's answer is resumed as.
pub const APPROVAL_ANSWERED: &str = super::envelope::ENGINE_TYPES[1];

/// The most of a call's arguments an event carries (the record keeps them
/// whole).
pub const ARGUMENTS_SHOWN: usize = 4 * 1024;

/// The largest arguments (as JSON) a person is asked to approve: past it
/// the call is refused before asking, so the card always shows them whole.
pub const ARGUMENTS_LIMIT: usize = 16 * 1024;

/// The most approvals one seat may have waiting for a person; a call past
/// it fails (it is not asked for).
pub const PENDING_LIMIT: usize = 20;

/// How long a resumed approval's record is kept (for the page and the
/// route) before the seat's next holder removes it.
pub const RAN_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    /// Waiting for a person.
    Pending,
    /// A person (or the timeout) answered; the holder has not resumed yet.
    Answered,
    /// An approved call is being run by the holder at `owner_epoch`.
    Running,
    /// The outcome the agent is told is recorded.
    Ran,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Approved,
    Denied,
    TimedOut,
}

impl Decision {
    pub fn name(self) -> &'static str {
        match self {
            Decision::Approved => "approved",
            Decision::Denied => "denied",
            Decision::TimedOut => "timed_out",
        }
    }
}

/// What the agent is told of the call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallOutcome {
    pub ok: bool,
    #[serde(default)]
    pub output: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl CallOutcome {
    pub fn failed(error: impl Into<String>) -> CallOutcome {
        CallOutcome {
            ok: false,
            output: Value::Null,
            error: Some(error.into()),
        }
    }
}

/// An approval's record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    pub approval_id: String,
    pub seat: String,
    /// The tool's full name (`fs.write_file`).
    pub tool: String,
    pub arguments: Value,
    /// The agent's id of the call, and the turn that asked.
    pub call_id: String,
    pub turn_id: String,
    /// The incarnation that holds the seat for this record, and its epoch.
    pub owner: String,
    pub owner_epoch: u64,
    pub state: ApprovalState,
    pub asked_at: String,
    /// Unix milliseconds at which the approval is denied as timed out.
    pub deadline_ms: u64,
    pub timeout_seconds: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<CallOutcome>,
    pub updated_at: String,
    /// What a built-in tool's call needs of the turn that asked, to run
    /// after its approval (an MCP call needs nothing of it).
    #[serde(default, skip_serializing_if = "AskedIn::is_empty")]
    pub asked_in: AskedIn,
}

/// The turn a call was asked in, as much of it as a built-in tool reads:
/// the work's key (its effects' identity) and each trigger's envelope with
/// its body cut to the hops an `a2a_message` counts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AskedIn {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_key: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub triggers: Vec<crate::engine::envelope::Envelope>,
}

impl AskedIn {
    /// Pure: what `work_key` and `triggers` leave a built-in call to read.
    pub fn of(work_key: Option<&str>, triggers: &[crate::engine::envelope::Envelope]) -> AskedIn {
        AskedIn {
            work_key: work_key.map(str::to_string),
            triggers: triggers
                .iter()
                .map(|t| crate::engine::envelope::Envelope {
                    body: match t.body.get("hops") {
                        Some(h) => serde_json::json!({ "hops": h }),
                        None => Value::Null,
                    },
                    ..t.clone()
                })
                .collect(),
        }
    }

    fn is_empty(&self) -> bool {
        self.work_key.is_none() && self.triggers.is_empty()
    }
}

/// The built-in tools a role's `approve` may name (the company file's
/// vocabulary, so the config owns it).
pub use crate::config::APPROVABLE_BUILT_INS;

/// Pure: must a person approve a call of the built-in `tool` for `role`?
/// Only when one of its `approve` entries names the tool itself.
pub fn built_in_needs_approval(role: &RoleConfig, tool: &str) -> bool {
    APPROVABLE_BUILT_INS.contains(&tool) && role.approve.iter().any(|p| p == tool)
}

/// Pure: does `pattern` (a role's `approve` entry) name `tool`? A full
/// name, a server's every tool (`fs.*`), or `*`.
pub fn matches(pattern: &str, tool: &str) -> bool {
    pattern == "*"
        || pattern == tool
        || pattern
            .strip_suffix(".*")
            .is_some_and(|server| tool.split_once('.').is_some_and(|(s, _)| s == server))
}

/// Pure: may a tool destroy what it touches, as far as the node lets a
/// tool server say? A server's annotations only add protection: a tool it
/// marks destructive may destroy; one it calls read-only or harmless is
/// believed only when the role's own `read_only` list names it (a hostile
/// server marks `wipe` read-only).
pub fn may_destroy(role: &RoleConfig, tool: &str, own: &Annotations) -> bool {
    own.destructive == Some(true) || !role.read_only.iter().any(|p| matches(p, tool))
}

/// Pure: must a person approve a call of `tool` (an MCP tool of `role`'s
/// seat, with its own annotations) before it runs?
pub fn needs_approval(role: &RoleConfig, tool: &str, own: &Annotations) -> bool {
    role.approve.iter().any(|p| matches(p, tool))
        || (role.approve_destructive && may_destroy(role, tool, own))
}

/// Pure: the approval's id — the same for every re-run of the same work
/// (a turn run again asks once), distinct per call.
pub fn approval_id(work: &str, seat: &str, call_id: &str) -> String {
    let mut h = Sha256::new();
    for part in [work, seat, call_id] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    format!("approval-{}", &hex::encode(h.finalize())[..24])
}

/// Why the approvals of a seat could not be read, asked or pruned.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApprovalsError {
    #[error(
        "seat {seat:?} already has {waiting} approvals waiting for a person (at most {PENDING_LIMIT}); answer them first"
    )]
    TooManyWaiting { seat: String, waiting: usize },
    #[error("approval {0} vanished")]
    Vanished(String),
    #[error("{0}")]
    Store(#[from] KvError),
}

impl From<StoreError> for ApprovalsError {
    fn from(e: StoreError) -> ApprovalsError {
        ApprovalsError::Store(e.into())
    }
}

/// Why an answer was not taken.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AnswerRefused {
    #[error("approval {0} is not asked for on this seat")]
    NotFound(String),
    #[error("approval {id} was already answered ({decision} by {by})")]
    AlreadyAnswered {
        id: String,
        decision: &'static str,
        by: String,
    },
    #[error("the approval store: {0}")]
    Store(String),
}

/// Pure: `r` answered with `decision` by `by`. Only a pending approval is
/// answered, once.
pub fn answer(
    r: &mut ApprovalRecord,
    decision: Decision,
    by: &str,
    reason: &str,
    now: &str,
) -> Result<(), AnswerRefused> {
    if r.state != ApprovalState::Pending {
        return Err(AnswerRefused::AlreadyAnswered {
            id: r.approval_id.clone(),
            decision: r.decision.map(Decision::name).unwrap_or("answered"),
            by: r.answered_by.clone().unwrap_or_default(),
        });
    }
    r.state = ApprovalState::Answered;
    r.decision = Some(decision);
    r.answered_by = Some(by.to_string());
    r.reason = Some(reason.to_string());
    r.answered_at = Some(now.to_string());
    Ok(())
}

/// Pure: what a denied (or timed-out) call tells the agent.
pub fn denial(r: &ApprovalRecord) -> CallOutcome {
    let by = r.answered_by.as_deref().unwrap_or("nobody");
    let reason = r.reason.as_deref().unwrap_or("");
    CallOutcome::failed(match r.decision {
        Some(Decision::TimedOut) => format!(
            "{}: nobody answered the approval within {} s; denied as timed out",
            r.tool, r.timeout_seconds
        ),
        _ if reason.is_empty() => format!("{}: denied by {by}", r.tool),
        _ => format!("{}: denied by {by}: {reason}", r.tool),
    })
}

/// What a holder at some epoch does with an answered approval.
#[derive(Clone, Debug, PartialEq)]
pub enum Resume {
    /// Run the approved call (claiming the record under this epoch first).
    Run,
    /// Tell the agent this outcome (a denial, or the one recorded).
    Deliver(CallOutcome),
    /// A holder at an earlier epoch began the call and never recorded its
    /// outcome: it is not run again, and the agent is told it is unknown.
    Lost,
    /// Nothing to resume (yet): why.
    Nothing(&'static str),
}

/// Pure: the resume of `r` by a holder at `epoch`.
pub fn resume_plan(r: &ApprovalRecord, epoch: u64) -> Resume {
    match r.state {
        ApprovalState::Pending => Resume::Nothing("nobody has answered it"),
        ApprovalState::Answered if r.decision == Some(Decision::Approved) => Resume::Run,
        ApprovalState::Answered => Resume::Deliver(denial(r)),
        ApprovalState::Running if r.owner_epoch < epoch => Resume::Lost,
        ApprovalState::Running => {
            Resume::Nothing("its call is running under this epoch or a later one")
        }
        ApprovalState::Ran => Resume::Deliver(
            r.outcome
                .clone()
                .unwrap_or_else(|| CallOutcome::failed("its outcome was not recorded")),
        ),
    }
}

/// Pure: the outcome of a call whose holder was lost while running it.
pub fn lost(r: &ApprovalRecord) -> CallOutcome {
    CallOutcome::failed(format!(
        "{}: the approved call was started by an earlier holder of the seat (epoch {}), which lost the seat before it recorded the outcome; it is not run again, and whether it took effect is unknown",
        r.tool, r.owner_epoch
    ))
}

/// Pure: `v` as at most `max` bytes of JSON text (cut, saying so).
pub fn shown(v: &Value, max: usize) -> Value {
    let text = v.to_string();
    if text.len() <= max {
        return v.clone();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Value::String(format!("{}… ({} bytes in all)", &text[..end], text.len()))
}

/// The wall clock in Unix milliseconds (an approval's deadline).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn key(seat: &str, id: &str) -> String {
    format!("approval:{seat}:{id}")
}

/// The approval records and their timers.
#[derive(Clone)]
pub struct Approvals {
    store: Arc<dyn Store>,
    queue: Arc<dyn Queue>,
    events: EventBus,
    tasks: Tasks,
    /// Approvals whose timer runs on this node.
    armed: Arc<Mutex<HashSet<String>>>,
}

impl Approvals {
    pub fn new(store: Arc<dyn Store>, queue: Arc<dyn Queue>, events: EventBus) -> Approvals {
        Approvals {
            store,
            queue,
            events,
            tasks: Tasks::new(),
            armed: Default::default(),
        }
    }

    /// Ask for `r`: its record is written unless the same work asked
    /// before (then that record is the answer, and nothing is asked
    /// again). A fresh ask is announced and its timer armed.
    pub async fn ask(&self, r: ApprovalRecord) -> Result<ApprovalRecord, ApprovalsError> {
        if let Some(asked) = self.get(&r.seat, &r.approval_id).await? {
            return Ok(asked);
        }
        let waiting = self
            .list(&r.seat)
            .await?
            .iter()
            .filter(|a| a.state == ApprovalState::Pending)
            .count();
        if waiting >= PENDING_LIMIT {
            return Err(ApprovalsError::TooManyWaiting {
                seat: r.seat.clone(),
                waiting,
            });
        }
        let v = Bytes::from(serde_json::to_vec(&r).unwrap_or_default());
        match self
            .store
            .create(StateBucket::Runs, &key(&r.seat, &r.approval_id), v)
            .await
        {
            Ok(_) => {
                self.events.emit(Event::ToolApprovalRequested {
                    seat: r.seat.clone(),
                    approval_id: r.approval_id.clone(),
                    tool: r.tool.clone(),
                    arguments: shown(&r.arguments, ARGUMENTS_SHOWN),
                    turn_id: r.turn_id.clone(),
                });
                self.arm(&r);
                Ok(r)
            }
            Err(KvError::AlreadyExists) => self
                .get(&r.seat, &r.approval_id)
                .await?
                .ok_or_else(|| ApprovalsError::Vanished(r.approval_id.clone())),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn get(
        &self,
        seat: &str,
        id: &str,
    ) -> Result<Option<ApprovalRecord>, ApprovalsError> {
        let e = self.store.get(StateBucket::Runs, &key(seat, id)).await?;
        Ok(e.and_then(|e| decoded(&e.key, &e.value)))
    }

    /// Every approval of `seat`, the newest first.
    pub async fn list(&self, seat: &str) -> Result<Vec<ApprovalRecord>, ApprovalsError> {
        let es = self
            .store
            .entries(StateBucket::Runs, &format!("approval:{seat}:"))
            .await?;
        let mut v: Vec<ApprovalRecord> = es
            .iter()
            .filter_map(|e| decoded(&e.key, &e.value))
            .filter(|r| r.seat == seat)
            .collect();
        v.sort_by(|a, b| b.asked_at.cmp(&a.asked_at));
        Ok(v)
    }

    /// Change `seat`'s approval `id`: `f` edits it (`Ok(false)` leaves it,
    /// `Err` refuses); tried again on a concurrent change.
    pub async fn update<E>(
        &self,
        seat: &str,
        id: &str,
        f: impl Fn(&mut ApprovalRecord) -> Result<bool, E>,
    ) -> Result<ApprovalRecord, Updated<E>> {
        for _ in 0..8 {
            let k = key(seat, id);
            let Some(e) = self
                .store
                .get(StateBucket::Runs, &k)
                .await
                .map_err(|e| Updated::Store(e.to_string()))?
            else {
                return Err(Updated::NotFound);
            };
            let Some(mut r) = decoded(&e.key, &e.value) else {
                return Err(Updated::NotFound);
            };
            if !f(&mut r).map_err(Updated::Refused)? {
                return Ok(r);
            }
            r.updated_at = crate::clock::now_rfc3339();
            let v = Bytes::from(serde_json::to_vec(&r).unwrap_or_default());
            match self
                .store
                .update(StateBucket::Runs, &k, v, e.revision)
                .await
            {
                Ok(_) => return Ok(r),
                Err(KvError::WrongRevision) => continue,
                Err(e) => return Err(Updated::Store(e.to_string())),
            }
        }
        Err(Updated::Store(
            "the record kept changing under the write".into(),
        ))
    }

    /// A person's (or the timeout's) answer: written once into the record,
    /// announced (`tool_approval_answered`), and told to the seat's holder.
    pub async fn answer(
        &self,
        seat: &str,
        id: &str,
        decision: Decision,
        by: &str,
        reason: &str,
    ) -> Result<ApprovalRecord, AnswerRefused> {
        let now = crate::clock::now_rfc3339();
        let r = self
            .update(seat, id, |r| {
                answer(r, decision, by, reason, &now).map(|_| true)
            })
            .await
            .map_err(|e| match e {
                Updated::NotFound => AnswerRefused::NotFound(id.to_string()),
                Updated::Refused(e) => e,
                Updated::Store(e) => AnswerRefused::Store(e),
            })?;
        self.events.emit(Event::ToolApprovalAnswered {
            seat: seat.to_string(),
            approval_id: id.to_string(),
            tool: r.tool.clone(),
            decision: decision.name().into(),
            by: by.to_string(),
        });
        self.tell_holder(seat, id).await;
        Ok(r)
    }

    /// Tell the seat's holder an approval has an answer to resume with
    /// (retried a few times; the next holder's recovery finds one whose
    /// message was lost).
    pub async fn tell_holder(&self, seat: &str, id: &str) {
        let msg = ControlMessage::ApprovalAnswered {
            approval_id: id.to_string(),
        };
        let body = Bytes::from(serde_json::to_vec(&msg).unwrap_or_default());
        let mut wait = Duration::from_millis(100);
        for _ in 0..5 {
            match self
                .queue
                .publish(&control_subject(seat), None, body.clone())
                .await
            {
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!(seat, approval_id = id, error = %e, "cannot tell the seat's holder of an answered approval; trying again");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
            }
        }
        tracing::warn!(
            seat,
            approval_id = id,
            "the seat's holder was not told of an answered approval; its next holder resumes it"
        );
    }

    /// Remove `seat`'s approvals resumed more than `kept` ago ([`RAN_KEPT`]
    /// as the holder calls it); how many went. A record changed meanwhile
    /// stays (its revision moved); one still waiting is never removed.
    pub async fn prune(&self, seat: &str, kept: Duration) -> Result<usize, ApprovalsError> {
        let cutoff = time::OffsetDateTime::now_utc() - kept;
        let es = self
            .store
            .entries(StateBucket::Runs, &format!("approval:{seat}:"))
            .await?;
        let mut gone = 0;
        for e in es {
            let Some(r) = decoded(&e.key, &e.value) else {
                continue;
            };
            let old = time::OffsetDateTime::parse(
                &r.updated_at,
                &time::format_description::well_known::Rfc3339,
            )
            .is_ok_and(|t| t <= cutoff);
            if r.state == ApprovalState::Ran && old {
                match self
                    .store
                    .delete(StateBucket::Runs, &e.key, e.revision)
                    .await
                {
                    Ok(()) => gone += 1,
                    Err(KvError::WrongRevision) => {}
                    Err(err) => return Err(err.into()),
                }
            }
        }
        Ok(gone)
    }

    /// Deny `r` as timed out at its deadline (the wall clock's, read now),
    /// unless someone answered first. One timer per approval on this node.
    pub fn arm(&self, r: &ApprovalRecord) {
        if r.state != ApprovalState::Pending
            || !self
                .armed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(r.approval_id.clone())
        {
            return;
        }
        let (me, seat, id) = (self.clone(), r.seat.clone(), r.approval_id.clone());
        let wait = Duration::from_millis(r.deadline_ms.saturating_sub(now_ms()));
        self.tasks.spawn("approval timer", async move {
            tokio::time::sleep(wait).await;
            match me.get(&seat, &id).await {
                Ok(Some(r)) if r.state == ApprovalState::Pending => {
                    match me
                        .answer(&seat, &id, Decision::TimedOut, "timeout", "")
                        .await
                    {
                        Ok(_) | Err(AnswerRefused::AlreadyAnswered { .. }) => {}
                        Err(e) => {
                            tracing::warn!(seat, approval_id = id, error = %e, "cannot time an approval out; its seat's next holder will")
                        }
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(seat, approval_id = id, error = %e, "cannot read an approval at its deadline; its seat's next holder will")
                }
            }
            me.armed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
        });
    }

    /// Stop every timer (the node is stopping; the next holder re-arms).
    pub async fn shutdown(&self) {
        self.tasks.shutdown().await;
    }
}

/// Why [`Approvals::update`] did not write.
#[derive(Debug)]
pub enum Updated<E> {
    NotFound,
    Refused(E),
    Store(String),
}

fn decoded(key: &str, v: &[u8]) -> Option<ApprovalRecord> {
    match serde_json::from_slice(v) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(key, error = %e, "an approval record cannot be read; left where it is");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> ApprovalRecord {
        ApprovalRecord {
            approval_id: "approval-1".into(),
            seat: "s".into(),
            tool: "fs.write_file".into(),
            arguments: serde_json::json!({"path": "/x"}),
            call_id: "c1".into(),
            turn_id: "t1".into(),
            owner: "i1".into(),
            owner_epoch: 3,
            state: ApprovalState::Pending,
            asked_at: "2026-12-01T00:00:00Z".into(),
            deadline_ms: 1_000,
            timeout_seconds: 60,
            decision: None,
            answered_by: None,
            reason: None,
            answered_at: None,
            outcome: None,
            updated_at: "2026-12-01T00:00:00Z".into(),
            asked_in: AskedIn::default(),
        }
    }

    fn ann(read_only: Option<bool>, destructive: Option<bool>) -> Annotations {
        Annotations {
            read_only,
            destructive,
            ..Default::default()
        }
    }

    #[test]
    fn a_pattern_names_a_tool_its_server_or_every_tool() {
        assert!(matches("fs.write_file", "fs.write_file"));
        assert!(!matches("fs.write_file", "fs.read_file"));
        assert!(matches("fs.*", "fs.read_file"));
        assert!(!matches("fs.*", "fsx.read_file"));
        assert!(matches("*", "git.commit"));
    }

    #[test]
    fn a_tool_servers_annotations_only_add_protection_and_the_roles_read_only_list_lowers_it() {
        let role = RoleConfig {
            approve_destructive: true,
            ..Default::default()
        };
        // Whatever the server says, a tool the role does not list as
        // read-only is approved first: a hostile server marks `wipe`
        // read-only and it is asked for all the same.
        assert!(needs_approval(&role, "fs.a", &ann(None, None)));
        assert!(needs_approval(&role, "fs.a", &ann(Some(false), Some(true))));
        assert!(needs_approval(&role, "fs.wipe", &ann(Some(true), None)));
        assert!(needs_approval(
            &role,
            "fs.wipe",
            &ann(Some(true), Some(false))
        ));
        let listed = RoleConfig {
            approve_destructive: true,
            read_only: vec!["fs.read_file".into(), "time.*".into()],
            ..Default::default()
        };
        assert!(!needs_approval(&listed, "fs.read_file", &ann(None, None)));
        assert!(!needs_approval(&listed, "time.now", &ann(None, None)));
        assert!(needs_approval(
            &listed,
            "fs.write_file",
            &ann(Some(true), None)
        ));
        // The server saying destructive adds protection the list cannot
        // take away.
        assert!(needs_approval(&listed, "time.now", &ann(None, Some(true))));
        let plain = RoleConfig::default();
        assert!(!needs_approval(&plain, "fs.a", &ann(None, Some(true))));
    }

    #[test]
    fn an_approval_is_answered_once() {
        let mut r = record();
        answer(&mut r, Decision::Denied, "ann", "no", "now").unwrap();
        assert_eq!(r.state, ApprovalState::Answered);
        let again = answer(&mut r, Decision::Approved, "bob", "yes", "later");
        assert_eq!(
            again,
            Err(AnswerRefused::AlreadyAnswered {
                id: "approval-1".into(),
                decision: "denied",
                by: "ann".into()
            })
        );
        assert_eq!(r.answered_by.as_deref(), Some("ann"));
    }

    #[test]
    fn only_an_approved_answer_runs_the_call_and_a_denial_names_who_and_why() {
        let mut r = record();
        assert_eq!(
            resume_plan(&r, 3),
            Resume::Nothing("nobody has answered it")
        );
        answer(&mut r, Decision::Approved, "ann", "ok", "now").unwrap();
        assert_eq!(resume_plan(&r, 4), Resume::Run);
        let mut d = record();
        answer(&mut d, Decision::Denied, "ann", "not today", "now").unwrap();
        let Resume::Deliver(o) = resume_plan(&d, 4) else {
            panic!("a denial is delivered");
        };
        assert!(!o.ok);
        assert_eq!(
            o.error.as_deref(),
            Some("fs.write_file: denied by ann: not today")
        );
        let mut t = record();
        answer(&mut t, Decision::TimedOut, "timeout", "", "now").unwrap();
        let Resume::Deliver(o) = resume_plan(&t, 4) else {
            panic!("a timeout is delivered");
        };
        assert!(o.error.unwrap().contains("timed out"));
    }

    #[test]
    fn a_call_begun_at_an_earlier_epoch_is_never_run_again() {
        let mut r = record();
        answer(&mut r, Decision::Approved, "ann", "ok", "now").unwrap();
        r.state = ApprovalState::Running;
        r.owner_epoch = 4;
        assert_eq!(resume_plan(&r, 5), Resume::Lost);
        assert!(matches!(resume_plan(&r, 4), Resume::Nothing(_)));
        r.state = ApprovalState::Ran;
        r.outcome = Some(CallOutcome {
            ok: true,
            output: serde_json::json!("done"),
            error: None,
        });
        assert_eq!(
            resume_plan(&r, 9),
            Resume::Deliver(r.outcome.clone().unwrap())
        );
    }

    #[test]
    fn the_same_work_asks_with_the_same_id_and_each_call_its_own() {
        assert_eq!(approval_id("w", "s", "c"), approval_id("w", "s", "c"));
        assert_ne!(approval_id("w", "s", "c"), approval_id("w", "s", "d"));
    }

    #[test]
    fn huge_arguments_are_cut_in_an_event_saying_so() {
        let v = serde_json::json!({"content": "x".repeat(10_000)});
        let s = shown(&v, 100);
        assert!(s.as_str().unwrap().ends_with("bytes in all)"));
        assert_eq!(
            shown(&serde_json::json!({"a": 1}), 100),
            serde_json::json!({"a": 1})
        );
    }
}
