//! The turn engine of one node: the seat hooks that start a seat's agent,
//! attach its control subscription, attach its inbox already held when it
//! is paused — and the inbox handler that dispatches turns.
//!
//! Dispatch, per coalesced partition of a seat's waiting deliveries:
//! decode (what does not decode is poison) → types that run no turn are
//! logged and acked → `may_start` (else Defer) → the completion ledger is
//! read (fail open) and what it holds is skipped (`turn_trigger_skipped`) →
//! the turn runs its rounds under the fence → [`closing`] decides → the
//! ledger is written after the effects (fail open) → Ack, Nak or Defer.
//! One turn runs at a time per seat (the inbox attachment is serial).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::watch;

use super::agent::{Agent, TurnInput};
use super::approvals::{
    APPROVAL_ANSWERED, ApprovalRecord, ApprovalState, CallOutcome, Resume, Updated, lost,
    resume_plan,
};
use super::command::CommandAgent;
use super::echo::EchoAgent;
use super::envelope::Envelope;
use super::ledger::{self, SkipReason};
use super::outbox::Outbox;
use super::partition::{
    ClaimRefused, Closing, Entry, RetryPolicy, after_resume_claim, closing, disposition_name,
    plan_partition, retry_delay,
};
use super::pause::{self, ControlMessage, PAUSE_HOLD};
use super::runs::{
    Claim, RunCompletion, RunError, RunState, Runs, Supervisor, resume_claim, unsettled_before,
};
use super::tools::Tools;
use super::turn::{self, Ending, TurnGuard};
use crate::company::Company;
use crate::config::AgentConfig;
use crate::coord::{KvError, StateBucket, Store};
use crate::events::{Event, EventBus};
use crate::memory::MemoryStore;
use crate::memory::changelog::{self, Changelog};
use crate::queue::{
    Attachment, Delivery, Disposition, Handler, Queue, control_group, reflect_group,
    reflect_subject,
};
use crate::seat::host::{Fence, HookError, SeatContext, SeatHooks};

/// The inbox type a detached run's completion is resumed as.
pub const RUN_COMPLETED: &str = super::envelope::ENGINE_TYPES[0];

/// How often a seat held for a reached cap looks again (a company
/// revision may have raised the cap before its window reopens).
pub const BUDGET_RECHECK: Duration = Duration::from_secs(2);

/// Waiting deliveries of one seat coalesced into one partition, at most.
pub const PARTITION_LIMIT: usize = 16;
/// How many seats one memory cycle flushes at once.
const FLUSHES_AT_ONCE: usize = 8;

/// The work key of a run's resume: a digest of its trigger id
/// (`run:{run id}`), the same on every re-run of the resume — so the
/// effects and memory a resume run again by the seat's next holder writes
/// collapse onto the first run's.
pub fn resume_work_key(trigger_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(trigger_id.as_bytes());
    h.update([0u8]);
    hex::encode(h.finalize())
}

/// The variable naming [`Faults::held_teardown_file`].
pub const HOLD_TEARDOWN_VAR: &str = "CREWLET_FAULT_HOLD_TEARDOWN";

/// Faults a drill (or a test) can switch on.
#[derive(Debug, Default)]
pub struct Faults {
    /// After a turn's effects and its ledger record, never answer the
    /// queue: what a node that dies before the ack leaves behind
    /// (`CREWLET_FAULT_STALL_BEFORE_ACK=1`).
    pub stall_before_ack: AtomicBool,
    /// The seats whose release fails (`children`: "held by a fault"), as
    /// a child stuck in the kernel leaves it: the seat goes undead until
    /// the fault is lifted. Drills and tests of the undead alarm.
    pub held_teardown: Mutex<std::collections::BTreeSet<String>>,
    /// A file naming, one per line, more seats whose release fails while
    /// the file exists (`CREWLET_FAULT_HOLD_TEARDOWN={path}`): a drill
    /// lifts the fault by removing the file.
    pub held_teardown_file: Option<std::path::PathBuf>,
}

impl Faults {
    /// Whether `seat`'s release is held by a fault.
    fn teardown_held(&self, seat: &str) -> bool {
        if lock(&self.held_teardown).contains(seat) {
            return true;
        }
        let Some(path) = &self.held_teardown_file else {
            return false;
        };
        std::fs::read_to_string(path)
            .map(|text| text.lines().any(|line| line.trim() == seat))
            .unwrap_or(false)
    }
}

/// What the turn engine is built from.
pub struct TurnSetup {
    pub node_id: String,
    pub incarnation: String,
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn Queue>,
    pub outbox: Arc<dyn Outbox>,
    pub memory: MemoryStore,
    pub changelog: Arc<dyn Changelog>,
    pub events: EventBus,
    pub company: watch::Receiver<Company>,
    /// The mailboxes' ack window (`stream.ack_wait_seconds`): how long a
    /// finished turn keeps trying to record its completion.
    pub ack_wait: Duration,
    /// How long a failed turn's mail waits before it runs again
    /// (`stream.retry_delay_seconds`, `stream.retry_delay_max_seconds`).
    pub retry: RetryPolicy,
    /// What the node lets a seat's payload do (its own file's drills,
    /// command agents and `[runs] allow`).
    pub policy: crate::config::AgentPolicy,
}

/// One seat as the engine runs it.
struct SeatRuntime {
    handle: String,
    agent: Arc<dyn Agent>,
    fence: Mutex<Option<Fence>>,
    /// The running turn's id, if one runs.
    running: Mutex<Option<String>>,
    /// A person's stop of the running turn: (turn id, who).
    stop: Mutex<Option<(String, String)>>,
    last_error: Mutex<Option<String>>,
    /// One turn at a time per seat (an inbox turn or a run's resume).
    turn_lock: tokio::sync::Mutex<()>,
}

/// Pure: how long a finished turn keeps trying to record its completion.
/// Every renewal of the seat's lease extends the turn's deliveries while
/// the turn (its recording included) runs, and renewals come at least twice
/// a window (`stream.ack_wait_seconds` ≥ 2 × `coordination.heartbeat_seconds`),
/// so at any moment at least half a window is left of the last extension;
/// the record is tried until a tenth of the window before that ends.
pub fn record_budget(ack_wait: Duration) -> Duration {
    (ack_wait / 2).saturating_sub(ack_wait / 10)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A seat as the engine reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeatTurns {
    pub handle: String,
    pub running_turn: Option<String>,
    pub last_error: Option<String>,
}

/// What one memory changelog cycle did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlushReport {
    /// Rows published.
    pub rows: usize,
    /// Seats whose rows could not be published.
    pub failed: usize,
}

/// The turn engine. Give it to the seat host as its hooks.
pub struct TurnEngine {
    me: Weak<TurnEngine>,
    node_id: String,
    store: Arc<dyn Store>,
    queue: Arc<dyn Queue>,
    outbox: Arc<dyn Outbox>,
    changelog: Arc<dyn Changelog>,
    events: EventBus,
    company: watch::Receiver<Company>,
    ack_wait: Duration,
    retry: RetryPolicy,
    tools: Tools,
    seats: Mutex<HashMap<String, Arc<SeatRuntime>>>,
    runs: Runs,
    supervisor: Arc<Supervisor>,
    /// Each held seat's change sequence at its last complete flush.
    flushed_at: Mutex<HashMap<String, i64>>,
    /// The seats' windowed token counters.
    budgets: super::budget::Budgets,
    /// The seats held for a reached cap, each with a timer that releases
    /// the hold once there is room.
    budget_held: Mutex<std::collections::BTreeSet<String>>,
    timers: crate::tasks::Tasks,
    pub faults: Faults,
    policy: crate::config::AgentPolicy,
}

impl TurnEngine {
    pub fn new(s: TurnSetup) -> Arc<TurnEngine> {
        let runs = Runs::new(s.store.clone());
        let budgets = super::budget::Budgets::new(s.store.clone());
        let supervisor = Arc::new(
            Supervisor::new(runs.clone(), s.queue.clone()).confined(s.policy.confinement.clone()),
        );
        Arc::new_cyclic(|me| TurnEngine {
            me: me.clone(),
            node_id: s.node_id,
            runs: runs.clone(),
            supervisor: supervisor.clone(),
            tools: Tools {
                roles_at_start: Default::default(),
                incarnation: s.incarnation,
                runs,
                supervisor,
                events: s.events.clone(),
                outbox: s.outbox.clone(),
                queue: s.queue.clone(),
                memory: s.memory,
                company: s.company.clone(),
                programs: s.policy.programs.clone(),
                mcp: Default::default(),
                approvals: super::approvals::Approvals::new(
                    s.store.clone(),
                    s.queue.clone(),
                    s.events.clone(),
                ),
            },
            store: s.store,
            queue: s.queue,
            outbox: s.outbox,
            changelog: s.changelog,
            events: s.events,
            company: s.company,
            ack_wait: s.ack_wait,
            retry: s.retry,
            seats: Mutex::new(HashMap::new()),
            flushed_at: Mutex::new(HashMap::new()),
            budgets,
            budget_held: Mutex::new(Default::default()),
            timers: crate::tasks::Tasks::new(),
            faults: Faults {
                held_teardown_file: std::env::var_os(HOLD_TEARDOWN_VAR).map(Into::into),
                ..Faults::default()
            },
            policy: s.policy,
        })
    }

    /// The children of the detached runs this node launched.
    pub fn supervisor(&self) -> &Arc<Supervisor> {
        &self.supervisor
    }

    /// The run records in the coordination store.
    pub fn runs(&self) -> &Runs {
        &self.runs
    }

    /// The approvals asked for and answered (a person's answer is taken
    /// here on any node).
    pub fn approvals(&self) -> &super::approvals::Approvals {
        &self.tools.approvals
    }

    pub fn outbox(&self) -> &Arc<dyn Outbox> {
        &self.outbox
    }

    pub fn memory(&self) -> &MemoryStore {
        &self.tools.memory
    }

    /// The seats whose agent runs here, with their running turn and last
    /// error.
    pub fn seats(&self) -> Vec<SeatTurns> {
        let mut v: Vec<SeatTurns> = lock(&self.seats)
            .values()
            .map(|r| SeatTurns {
                handle: r.handle.clone(),
                running_turn: lock(&r.running).clone(),
                last_error: lock(&r.last_error).clone(),
            })
            .collect();
        v.sort_by(|a, b| a.handle.cmp(&b.handle));
        v
    }

    /// One changelog cycle: publish each of `held`'s rows stamped since
    /// the last flush. A seat that fails is logged and tried next cycle.
    pub async fn flush_memory(&self, held: &[String]) -> usize {
        self.flush_memory_report(held).await.rows
    }

    /// [`TurnEngine::flush_memory`], saying also how many seats' rows could
    /// not be published (tried again soon: `changelog::next_flush_in`).
    pub async fn flush_memory_report(&self, held: &[String]) -> FlushReport {
        // The node's change sequence moves on every memory write: a seat
        // flushed at the current value has nothing new, so an idle node's
        // cycle is one read.
        let now = match self.tools.memory.change_seq().await {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the memory change sequence; flushing every held seat");
                None
            }
        };
        let due: Vec<&String> = held
            .iter()
            .filter(|h| now.is_none() || lock(&self.flushed_at).get(*h) != now.as_ref())
            .collect();
        // Which of them have anything new, in one read (after the change
        // sequence was read: a row written in between is seen here, or moves
        // the sequence past `now` for the next cycle).
        let unpublished = if due.is_empty() {
            Some(Default::default())
        } else {
            match self.tools.memory.seats_with_unpublished().await {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot tell which seats have new memory; flushing every held seat");
                    None
                }
            }
        };
        let mut to_flush = Vec::new();
        for h in due {
            match (&unpublished, now) {
                (Some(unpublished), Some(v)) if !unpublished.contains(h) => {
                    lock(&self.flushed_at).insert(h.clone(), v);
                }
                _ => to_flush.push(h.clone()),
            }
        }
        // Seats side by side, a few at a time: a cycle's length (what a
        // crash can lose past one cycle) does not grow with the seats that
        // have something new, one after another.
        use futures::StreamExt;
        let flushed: Vec<_> = futures::stream::iter(to_flush)
            .map(|h: String| async move {
                let flushed = changelog::flush(&self.tools.memory, &*self.changelog, &h).await;
                (h, flushed)
            })
            .buffer_unordered(FLUSHES_AT_ONCE)
            .collect()
            .await;
        let (mut n, mut failed) = (0, 0);
        for (h, result) in flushed {
            match result {
                Ok(k) => {
                    n += k;
                    if let Some(v) = now {
                        lock(&self.flushed_at).insert(h.clone(), v);
                    }
                }
                Err(e) => {
                    failed += 1;
                    tracing::warn!(seat = %h, error = %e, "cannot publish the seat's memory; trying again soon")
                }
            }
        }
        lock(&self.flushed_at).retain(|h, _| held.contains(h));
        FlushReport { rows: n, failed }
    }

    async fn reflect(&self, handle: &str, d: Delivery) -> Disposition {
        let wake: serde_json::Value = match serde_json::from_slice(&d.payload) {
            Ok(v) => v,
            Err(e) => return Disposition::Poison(format!("not a reflection wake: {e}")),
        };
        let Some(rt) = self.runtime(handle) else {
            return Disposition::Nak;
        };
        let work_key = wake
            .get("work_key")
            .and_then(|v| v.as_str())
            .map(str::to_string);
        match rt.agent.reflect(&wake).await {
            Ok(Some(note)) => match self
                .tools
                .memory
                .diary_write(handle, &note, work_key.as_deref())
                .await
            {
                Ok(_) => Disposition::Ack,
                Err(e) => {
                    tracing::warn!(seat = handle, error = %e, "cannot write the reflection; trying again");
                    Disposition::Nak
                }
            },
            Ok(None) => Disposition::Ack,
            Err(e) => {
                tracing::warn!(seat = handle, error = %e, "reflection failed; dropped");
                Disposition::Ack
            }
        }
    }

    /// After a finished turn: the conversation ledger and counterparty
    /// profiles (both keyed so a re-run writes nothing twice), and a
    /// reflection wake on the seat's own reflect subject.
    async fn after_turn(&self, turn: &TurnInput) {
        let memory = &self.tools.memory;
        for t in &turn.triggers {
            if let Some(thread) = &t.thread {
                let text = match &t.body {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let key = super::envelope::conversation_key(t.from.as_deref(), thread);
                if let Err(e) = memory
                    .conversation_add(
                        &turn.seat,
                        &key,
                        t.message_id.as_deref(),
                        t.from.as_deref().unwrap_or("unknown"),
                        &text,
                    )
                    .await
                {
                    tracing::warn!(seat = %turn.seat, error = %e, "cannot write the conversation ledger");
                }
            }
            if let Some(from) = &t.from
                && let Err(e) = memory
                    .counterparty_seen(&turn.seat, from, turn.work_key.as_deref())
                    .await
            {
                tracing::warn!(seat = %turn.seat, error = %e, "cannot count the interaction");
            }
        }
        let wake = serde_json::json!({
            "type": "reflection_due",
            "turn_id": turn.turn_id,
            "work_key": turn.work_key,
            "trigger_ids": turn.triggers.iter().map(|t| t.id.clone()).collect::<Vec<_>>(),
        });
        if let Err(e) = self
            .queue
            .publish(
                &reflect_subject(&turn.seat),
                Some(&format!("reflect-{}", turn.turn_id)),
                bytes::Bytes::from(wake.to_string()),
            )
            .await
        {
            tracing::warn!(seat = %turn.seat, error = %e, "cannot wake the seat's reflection");
        }
    }

    /// A run's completion reached the seat's holder on its control
    /// subject: it becomes a `run_completed` trigger in the seat's inbox,
    /// so its resume is a turn like any other (one at a time, stoppable,
    /// fenced), and the control subscription is never held up by it.
    async fn forward_completion(&self, handle: &str, c: RunCompletion) -> Disposition {
        let body = serde_json::to_value(&c).unwrap_or_default();
        self.forward(
            handle,
            format!("run:{}", c.run_id),
            RUN_COMPLETED,
            body,
            "run",
        )
        .await
    }

    /// A person's answer to an approval reached the seat's holder: it
    /// becomes a `tool_approval_answered` trigger in the seat's inbox (the
    /// record, not this message, holds the answer).
    async fn forward_answer(&self, handle: &str, approval_id: String) -> Disposition {
        let body = serde_json::json!({ "approval_id": approval_id });
        let id = format!("approval:{approval_id}");
        self.forward(handle, id, APPROVAL_ANSWERED, body, "approval")
            .await
    }

    /// Hand a continuation from the control subscription to the seat's
    /// inbox as a trigger: `id`, of type `kind`, from `from`.
    async fn forward(
        &self,
        handle: &str,
        id: String,
        kind: &str,
        body: serde_json::Value,
        from: &str,
    ) -> Disposition {
        let env = Envelope {
            id,
            kind: kind.into(),
            body,
            thread: None,
            message_id: None,
            from: Some(from.into()),
            sent_at: Some(crate::clock::now_rfc3339()),
        };
        match self
            .queue
            .publish(
                &crate::queue::inbox_subject(handle),
                None,
                bytes::Bytes::from(env.encode()),
            )
            .await
        {
            Ok(_) => Disposition::Ack,
            Err(e) => {
                tracing::warn!(seat = handle, trigger_id = %env.id, error = %e, "cannot hand a continuation to the inbox; trying again");
                Disposition::Nak
            }
        }
    }

    /// Resume an answered approval (a `tool_approval_answered` trigger):
    /// the record's answer, never the trigger's body, decides
    /// ([`resume_plan`]). An approved call is claimed under this epoch and
    /// run here, its outcome recorded before the turn; a denial, a recorded
    /// outcome or a call an earlier holder began is delivered as it is.
    /// The turn that follows is recorded in the completion ledger like a
    /// run's resume.
    async fn resume_approval(
        &self,
        rt: &Arc<SeatRuntime>,
        fence: &Fence,
        env: &Envelope,
        delivered: u64,
        received: std::time::Instant,
    ) -> Disposition {
        let handle = rt.handle.as_str();
        let Some(id) = env.body.get("approval_id").and_then(|v| v.as_str()) else {
            return Disposition::Poison("not an approval's answer: no approval_id".into());
        };
        // The engine hands an answer on as `approval:{id}`: the ledger keeps
        // its continuation to one, whatever other envelope asks again.
        if env.id != format!("approval:{id}") {
            return Disposition::Poison(format!(
                "not the engine's answer to approval {id:?}: its id is {:?} (an approval's continuation runs once, from the engine's own hand-over)",
                env.id
            ));
        }
        let epoch = match fence.may_start() {
            Some(e) if e == fence.epoch() => e,
            _ => return Disposition::Defer(format!("seat {handle:?} is not owned here")),
        };
        let _turn = rt.turn_lock.lock().await;
        if self.resume_done(handle, &env.id).await {
            return self.skipped_as_done(handle, &env.id);
        }
        if let Some(waits) = self.resume_waits_for_budget(handle).await {
            return waits;
        }
        let record = match self.tools.approvals.get(handle, id).await {
            Ok(Some(r)) => r,
            Ok(None) => {
                tracing::info!(
                    seat = handle,
                    approval_id = id,
                    "no such approval; the answer is dropped"
                );
                return Disposition::Ack;
            }
            Err(e) => {
                tracing::warn!(seat = handle, approval_id = id, error = %e, "cannot read an approval; trying again");
                return Disposition::Nak;
            }
        };
        let (outcome, ran) = match self.approval_outcome(handle, &record, epoch).await {
            Ok(o) => o,
            Err(d) => return d,
        };
        self.events.emit(Event::ToolApprovalResumed {
            seat: handle.to_string(),
            approval_id: id.to_string(),
            tool: record.tool.clone(),
            epoch,
            ran,
            ok: outcome.ok,
        });
        let mut trigger = env.clone();
        trigger.body = serde_json::json!({
            "approval_id": id,
            "tool": record.tool,
            "arguments": record.arguments,
            "call_id": record.call_id,
            "decision": record.decision,
            "answered_by": record.answered_by,
            "reason": record.reason,
            "result": outcome,
        });
        let (turn, done, closed) = self
            .continue_turn(rt, fence, env, trigger, delivered, received)
            .await;
        self.announce_closing(rt, &turn, &done, &closed);
        closed.disposition
    }

    /// What an answered approval's resume tells the agent, and whether it
    /// ran the call here: `Err` is the delivery's disposition when there is
    /// nothing to resume (yet).
    async fn approval_outcome(
        &self,
        handle: &str,
        record: &ApprovalRecord,
        epoch: u64,
    ) -> Result<(CallOutcome, bool), Disposition> {
        let id = record.approval_id.as_str();
        let me = self.tools.incarnation.clone();
        let approvals = &self.tools.approvals;
        let keep = |o: CallOutcome, from: ApprovalState| {
            let me = me.clone();
            async move {
                let written = approvals
                    .update(handle, id, |r| {
                        if r.state != from {
                            return Ok::<bool, ()>(false);
                        }
                        r.state = ApprovalState::Ran;
                        r.outcome = Some(o.clone());
                        r.owner = me.clone();
                        r.owner_epoch = epoch;
                        Ok(true)
                    })
                    .await;
                if let Err(e) = written {
                    tracing::warn!(seat = handle, approval_id = id, error = ?e, "cannot record an approval's outcome; the turn is told it all the same");
                }
                o
            }
        };
        match resume_plan(record, epoch) {
            Resume::Nothing(why) => {
                tracing::info!(
                    seat = handle,
                    approval_id = id,
                    "an approval's answer with nothing to resume: {why}"
                );
                Err(Disposition::Ack)
            }
            Resume::Deliver(o) if record.state == ApprovalState::Answered => {
                Ok((keep(o, ApprovalState::Answered).await, false))
            }
            Resume::Deliver(o) => Ok((o, false)),
            Resume::Lost => Ok((keep(lost(record), ApprovalState::Running).await, false)),
            Resume::Run => {
                let claimed = approvals
                    .update(handle, id, |r| {
                        if resume_plan(r, epoch) != Resume::Run {
                            return Err(());
                        }
                        r.state = ApprovalState::Running;
                        r.owner = me.clone();
                        r.owner_epoch = epoch;
                        Ok(true)
                    })
                    .await;
                match claimed {
                    Ok(_) => {}
                    // Changed under the claim: the next delivery reads it again.
                    Err(Updated::Refused(())) => return Err(Disposition::Nak),
                    Err(Updated::NotFound) => return Err(Disposition::Ack),
                    Err(Updated::Store(e)) => {
                        tracing::warn!(seat = handle, approval_id = id, error = %e, "cannot claim an approved call; trying again");
                        return Err(Disposition::Nak);
                    }
                }
                let done = if super::tools::annotations_of(&record.tool).is_some() {
                    self.tools
                        .run_approved_built_in(record, epoch, &self.node_id)
                        .await
                } else {
                    self.revive_tool_servers(handle).await;
                    let call = super::agent::ToolCall {
                        id: record.call_id.clone(),
                        name: record.tool.clone(),
                        args: record.arguments.clone(),
                        annotations: Default::default(),
                    };
                    self.tools.call_mcp(handle, &call).await
                };
                crate::metrics::apply(&super::tools::call_update(&record.tool, true, &done));
                let r = done.result;
                let o = CallOutcome {
                    ok: r.ok,
                    output: r.output,
                    error: r.error,
                };
                Ok((keep(o, ApprovalState::Running).await, true))
            }
        }
    }

    /// Interrupted-approval recovery (the acquire hook, with the control
    /// subscription): a pending approval's timer is armed here; an answer
    /// never resumed, or a call an earlier holder began, is told to this
    /// holder again; records resumed a week ago are removed.
    async fn recover_approvals(&self, seat: &SeatContext) -> Result<(), String> {
        match self
            .tools
            .approvals
            .prune(&seat.handle, super::approvals::RAN_KEPT)
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(seat = %seat.handle, removed = n, "old approvals removed"),
            Err(e) => {
                tracing::warn!(seat = %seat.handle, error = %e, "cannot remove old approvals; kept")
            }
        }
        for r in self.tools.approvals.list(&seat.handle).await? {
            match r.state {
                ApprovalState::Pending => self.tools.approvals.arm(&r),
                ApprovalState::Answered => {
                    self.tools
                        .approvals
                        .tell_holder(&seat.handle, &r.approval_id)
                        .await
                }
                ApprovalState::Running if r.owner_epoch < seat.epoch => {
                    self.tools
                        .approvals
                        .tell_holder(&seat.handle, &r.approval_id)
                        .await
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Resume a finished run: claim its answer once (a CAS flipping the
    /// record to `resuming` under this epoch), run a turn with the result,
    /// then settle the claim. A resume that finished, broke after acting or
    /// panicked is recorded in the completion ledger (keyed on its
    /// trigger, `run:{run id}`) and keeps its claim (`finished`, resumed);
    /// any other failure un-claims and the trigger comes back. A claim made
    /// at an earlier epoch that never settled — its holder died mid-resume —
    /// is taken over and the resume run again; the ledger makes one that had
    /// finished a skip, and the resume's work key (from its trigger) keeps
    /// the effects a re-run posts again to one each.
    async fn resume_run(
        &self,
        rt: &Arc<SeatRuntime>,
        fence: &Fence,
        env: &Envelope,
        delivered: u64,
        received: std::time::Instant,
    ) -> Disposition {
        let handle = rt.handle.as_str();
        if let Some(waits) = self.resume_waits_for_budget(handle).await {
            return waits;
        }
        let (c, claimed, epoch) = match self.claim_resume(handle, fence, env).await {
            Ok(won) => won,
            Err(d) => return d,
        };
        let _turn = rt.turn_lock.lock().await;
        // The turn is given the claimed record's answer, whichever copy of
        // the completion brought it here.
        let mut trigger = env.clone();
        trigger.body = serde_json::to_value(RunCompletion {
            run_id: c.run_id.clone(),
            result: claimed.result.clone().unwrap_or(c.result.clone()),
        })
        .unwrap_or_else(|_| env.body.clone());
        let (turn, record, closed) = self
            .continue_turn(rt, fence, env, trigger, delivered, received)
            .await;
        // The claim stands unless the resume proved nothing (it did not
        // act, and did not panic): then it is given back and comes again.
        let keep = closed.keep_claim;
        let settled = self
            .runs
            .mutate(handle, &c.run_id, epoch, |r| {
                if r.state != RunState::Resuming {
                    return false;
                }
                r.state = RunState::Finished;
                r.resumed = keep;
                true
            })
            .await;
        if let Err(e) = settled {
            // A successor at a later epoch took the claim over (fenced), or
            // the store did not answer: an unsettled claim is resumed again
            // by the seat's next holder, and the ledger skips it if it was
            // recorded.
            tracing::warn!(seat = handle, run_id = %c.run_id, keep, error = %e, "cannot settle a resume's claim");
        }
        self.announce_closing(rt, &turn, &record, &closed);
        self.events.emit(Event::RunResumed {
            seat: handle.to_string(),
            run_id: c.run_id.clone(),
            epoch,
            outcome: record.ending.name().into(),
        });
        closed.disposition
    }

    /// The turn that continues a parked one (a run's resume, an
    /// approval's): `trigger` under the fence's epoch (the one the resume
    /// claimed under), its work key from the
    /// trigger id (the same on every re-run), closed as a resume — recorded
    /// in the completion ledger right behind its effects (a holder that dies
    /// before it settles the rest leaves a resume its successor skips), and
    /// the agent told when it ended early.
    async fn continue_turn(
        &self,
        rt: &Arc<SeatRuntime>,
        fence: &Fence,
        env: &Envelope,
        trigger: Envelope,
        delivered: u64,
        received: std::time::Instant,
    ) -> (TurnInput, turn::TurnRecord, Closing) {
        let handle = rt.handle.as_str();
        let turn = TurnInput {
            turn_id: uuid::Uuid::new_v4().to_string(),
            seat: handle.to_string(),
            epoch: fence.epoch(),
            node: self.node_id.clone(),
            work_key: Some(resume_work_key(&env.id)),
            delivered,
            triggers: vec![trigger],
            tools: self.tools.surface(handle),
        };
        let record = self.run_turn(rt, fence, &turn, received).await;
        let closed = closing(
            &record.ending,
            record.reached_outside,
            handle,
            &turn.turn_id,
            true,
            retry_delay(turn.delivered, self.retry),
        );
        if closed.record {
            let within = record_budget(self.ack_wait);
            self.record_resume(handle, &env.id, &turn.turn_id, within)
                .await;
        }
        if closed.abort {
            rt.agent.abort(&turn.turn_id, record.ending.name()).await;
        }
        (turn, record, closed)
    }

    /// Claim a finished run's resume for this epoch: `Err` is the
    /// delivery's disposition when there is nothing to resume here (not a
    /// completion, not owned here, already recorded, ended, fenced).
    async fn claim_resume(
        &self,
        handle: &str,
        fence: &Fence,
        env: &Envelope,
    ) -> Result<(RunCompletion, super::runs::RunRecord, u64), Disposition> {
        let c: RunCompletion = match serde_json::from_value(env.body.clone()) {
            Ok(c) => c,
            Err(e) => return Err(Disposition::Poison(format!("not a run completion: {e}"))),
        };
        // The engine hands a completion on as `run:{run id}`, once per run:
        // anything else claiming to be one is not the engine's.
        if env.id != format!("run:{}", c.run_id) {
            return Err(Disposition::Poison(format!(
                "not the engine's completion of run {:?}: its id is {:?} (a run's result comes only from its launcher's record)",
                c.run_id, env.id
            )));
        }
        let epoch = match fence.may_start() {
            Some(e) if e == fence.epoch() => e,
            _ => {
                return Err(Disposition::Defer(format!(
                    "seat {handle:?} is not owned here"
                )));
            }
        };
        let me = self.tools.incarnation.clone();
        if self.resume_done(handle, &env.id).await {
            return Err(self
                .resume_already_done(handle, &c.run_id, &env.id, epoch)
                .await);
        }
        let taken: Mutex<Option<Claim>> = Mutex::new(None);
        let unrecorded = AtomicBool::new(false);
        let claim = self
            .runs
            .mutate(handle, &c.run_id, epoch, |r| {
                // The answer the launcher recorded is the one resumed, and
                // only a recorded one: a completion of a run still running
                // writes nothing into its record.
                let recorded = matches!(r.state, RunState::Finished | RunState::Resuming)
                    && r.result.is_some();
                unrecorded.store(!recorded, Ordering::SeqCst);
                let t = resume_claim(r, epoch).filter(|_| recorded);
                *lock(&taken) = t;
                if t.is_none() {
                    return false;
                }
                r.state = RunState::Resuming;
                r.resumed = true;
                r.owner = me.clone();
                r.owner_epoch = epoch;
                true
            })
            .await;
        let taken = *lock(&taken);
        if claim.is_ok() && unrecorded.load(Ordering::SeqCst) {
            return Err(Disposition::Poison(format!(
                "a completion of run {:?}, which its launcher has not recorded as finished (a run's result comes only from its launcher's record)",
                c.run_id
            )));
        }
        let claimed = match after_resume_claim(claim, taken.is_some(), &c.run_id) {
            Ok(r) => r,
            Err(ClaimRefused::Dropped(why)) => {
                tracing::info!(seat = handle, run_id = %c.run_id, "{why}");
                return Err(Disposition::Ack);
            }
            Err(ClaimRefused::Fenced(d)) => return Err(d),
            Err(ClaimRefused::Retry(e)) => {
                tracing::warn!(seat = handle, run_id = %c.run_id, error = %e, "cannot claim a run's resume; trying again");
                return Err(Disposition::Nak);
            }
        };
        if let Some(Claim::TakenOver { from_epoch }) = taken {
            tracing::warn!(
                seat = handle,
                run_id = %c.run_id,
                from_epoch,
                epoch,
                "a resume claimed at an earlier epoch never settled; taking it over and resuming again"
            );
        }
        Ok((c, claimed, epoch))
    }

    /// Is a resume's trigger recorded in the completion ledger? Fails open
    /// (an unreadable ledger says no, and the resume runs).
    async fn resume_done(&self, handle: &str, trigger_id: &str) -> bool {
        match self
            .store
            .get(StateBucket::Ledger, &ledger::done_key(handle, trigger_id))
            .await
        {
            Ok(found) => found.is_some(),
            Err(e) => {
                tracing::warn!(seat = handle, trigger_id, error = %e, "the completion ledger cannot be read; resuming (fail open)");
                false
            }
        }
    }

    /// Record a settled resume in the completion ledger, trying again while
    /// `within` lasts (fail open: a record that never lands is logged).
    async fn record_resume(&self, handle: &str, trigger_id: &str, turn_id: &str, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        let key = ledger::done_key(handle, trigger_id);
        let body = bytes::Bytes::from(
            serde_json::json!({"turn_id": turn_id, "at": crate::clock::now_rfc3339()}).to_string(),
        );
        let mut pause = Duration::from_millis(100);
        loop {
            match self
                .store
                .create(StateBucket::Ledger, &key, body.clone())
                .await
            {
                Ok(_) | Err(KvError::AlreadyExists) => return,
                Err(e) if tokio::time::Instant::now() + pause < deadline => {
                    tracing::debug!(seat = handle, key, error = %e, "cannot record a resume yet; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(e) => {
                    tracing::warn!(seat = handle, key, error = %e, "cannot record a resume in the completion ledger (fail open)");
                    return;
                }
            }
        }
    }

    /// The ledger says this run's resume finished (a holder recorded it and
    /// died before settling its claim): settle the claim under this epoch
    /// and skip the trigger (`turn_trigger_skipped`, `already_done`).
    async fn resume_already_done(
        &self,
        handle: &str,
        run_id: &str,
        trigger_id: &str,
        epoch: u64,
    ) -> Disposition {
        let me = self.tools.incarnation.clone();
        let settled = self
            .runs
            .mutate(handle, run_id, epoch, |r| {
                let open =
                    r.state != RunState::Ended && !(r.resumed && r.state == RunState::Finished);
                if open {
                    r.state = RunState::Finished;
                    r.resumed = true;
                    r.owner = me.clone();
                    r.owner_epoch = epoch;
                }
                open
            })
            .await;
        match settled {
            Ok(_) | Err(RunError::NotFound(_)) => {}
            Err(RunError::Fenced { .. }) => {
                return Disposition::Defer(format!("run {run_id} is owned at a later epoch"));
            }
            Err(e) => {
                tracing::warn!(seat = handle, run_id, error = %e, "cannot settle a resume the ledger holds; trying again");
                return Disposition::Nak;
            }
        }
        self.skipped_as_done(handle, trigger_id)
    }

    /// A continuation the completion ledger holds: skipped
    /// (`turn_trigger_skipped`, `already_done`) and acknowledged.
    fn skipped_as_done(&self, handle: &str, trigger_id: &str) -> Disposition {
        self.events.emit(Event::TurnTriggerSkipped {
            seat: handle.to_string(),
            trigger_id: trigger_id.to_string(),
            reason: "already_done".into(),
            turn_id: None,
        });
        Disposition::Ack
    }

    /// Interrupted-run recovery (the acquire hook, with the control
    /// subscription): adopt each live run under this epoch; fail one
    /// whose launcher is gone (`sandbox_run_failed`, `launcher_lost`)
    /// unless its answer is recorded; resume an answer the last holder
    /// recorded and never resumed with (the launcher records it before it
    /// publishes the completion, so a launcher that died before the resume
    /// loses nothing), and a resume claimed at an earlier epoch that never
    /// settled (its holder died mid-resume).
    async fn recover_runs(&self, seat: &SeatContext) -> Result<(), String> {
        let me = self.tools.incarnation.clone();
        for (r, _) in self
            .runs
            .list(&seat.handle)
            .await
            .map_err(|e| e.to_string())?
        {
            let r = match r.state {
                RunState::Running | RunState::Parked => {
                    let alive = self
                        .store
                        .lease(&format!("node:{}", r.launcher_node))
                        .await
                        .map_err(|e| e.to_string())?
                        .is_some_and(|l| l.owner == r.launcher);
                    if alive {
                        let x = self
                            .runs
                            .mutate(&seat.handle, &r.run_id, seat.epoch, |x| {
                                x.owner = me.clone();
                                x.owner_epoch = seat.epoch;
                                true
                            })
                            .await
                            .map_err(|e| e.to_string())?;
                        self.events.emit(Event::RunAdopted {
                            seat: seat.handle.clone(),
                            run_id: r.run_id.clone(),
                            epoch: seat.epoch,
                        });
                        x
                    } else {
                        // Failed only while still live: an answer the
                        // launcher recorded meanwhile is resumed below.
                        let failed = AtomicBool::new(false);
                        let x = self
                            .runs
                            .mutate(&seat.handle, &r.run_id, seat.epoch, |x| {
                                let live = x.state.is_live();
                                failed.store(live, Ordering::SeqCst);
                                if live {
                                    x.state = RunState::Failed;
                                    x.owner = me.clone();
                                    x.owner_epoch = seat.epoch;
                                    x.result = Some(super::runs::RunResult {
                                        error: Some(format!("its launcher {} is gone", x.launcher)),
                                        ..Default::default()
                                    });
                                }
                                live
                            })
                            .await
                            .map_err(|e| e.to_string())?;
                        if failed.load(Ordering::SeqCst) {
                            self.events.emit(Event::SandboxRunFailed {
                                seat: seat.handle.clone(),
                                run_id: r.run_id.clone(),
                                reason: "launcher_lost".into(),
                            });
                        }
                        x
                    }
                }
                _ => r,
            };
            // An answer never resumed, or a resume claimed under an earlier
            // epoch that never settled (its holder died mid-resume): the
            // completion goes round again, and the resume takes the claim
            // over.
            let unresumed = r.state == RunState::Finished && !r.resumed;
            if unresumed || unsettled_before(&r, seat.epoch) {
                if !unresumed {
                    tracing::info!(seat = %seat.handle, run_id = %r.run_id, claimed_at = r.owner_epoch, "a resume the last holder claimed never settled; resuming it again");
                }
                let msg = ControlMessage::RunCompleted(RunCompletion {
                    run_id: r.run_id.clone(),
                    result: r.result.clone().unwrap_or_default(),
                });
                self.queue
                    .publish(
                        &crate::queue::control_subject(&seat.handle),
                        Some(&format!("run-redo-{}-{}", r.run_id, seat.epoch)),
                        bytes::Bytes::from(serde_json::to_vec(&msg).unwrap_or_default()),
                    )
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// Start the role's MCP servers for `handle` (a seat already holding
    /// them, from a release not finished yet, keeps them). A server that
    /// cannot start refuses the seat here, named in `mcp_server_failed`.
    async fn start_tool_servers(&self, handle: &str) -> Result<(), HookError> {
        if self.tools.mcp.get(handle).is_some() {
            return Ok(());
        }
        let company = self.company.borrow().clone();
        let cfgs = company
            .roles
            .iter()
            .find(|r| r.handle == handle)
            .map(|r| r.mcp.clone())
            .unwrap_or_default();
        if cfgs.is_empty() {
            return Ok(());
        }
        let events = self.events.clone();
        let started = |server: &str, tools: usize| {
            events.emit(Event::McpServerStarted {
                seat: handle.to_string(),
                server: server.to_string(),
                tools,
            })
        };
        let confinement = self.policy.confinement.clone();
        match super::mcp::SeatMcp::start(handle, &self.node_id, &cfgs, confinement, &started).await
        {
            Ok(m) => {
                self.tools.mcp.insert(handle, Arc::new(m));
                Ok(())
            }
            Err(e) => {
                self.events.emit(Event::McpServerFailed {
                    seat: handle.to_string(),
                    server: e.server.clone(),
                    error: e.error.clone(),
                });
                Err(HookError::new("tool servers", e.to_string()))
            }
        }
    }

    /// Before a turn: a stdio tool server that died since the last one is
    /// started again, with a warning and `mcp_server_exited` (reason
    /// `died: …`), then `mcp_server_started` — or `mcp_server_failed`, its
    /// calls failing this turn.
    async fn revive_tool_servers(&self, handle: &str) {
        let Some(m) = self.tools.mcp.get(handle) else {
            return;
        };
        for r in m.revive(&self.node_id).await {
            tracing::warn!(seat = handle, server = %r.server, ended = %r.ended, "a tool server died between turns; starting it again");
            self.events.emit(Event::McpServerExited {
                seat: handle.to_string(),
                server: r.server.clone(),
                reason: format!("died: {}", r.ended),
            });
            match r.error {
                None => self.events.emit(Event::McpServerStarted {
                    seat: handle.to_string(),
                    tools: m.tool_count(&r.server),
                    server: r.server,
                }),
                Some(error) => self.events.emit(Event::McpServerFailed {
                    seat: handle.to_string(),
                    server: r.server,
                    error,
                }),
            }
        }
    }

    /// Stop the seat's MCP servers. A child that will not exit keeps them
    /// registered and fails the teardown (the seat stays undead and the
    /// stop is tried again).
    async fn stop_tool_servers(&self, handle: &str) -> Result<(), HookError> {
        let Some(m) = self.tools.mcp.get(handle) else {
            return Ok(());
        };
        m.stop()
            .await
            .map_err(|e| HookError::new("tool servers", e))?;
        self.tools.mcp.remove(handle);
        for server in m.server_names() {
            self.events.emit(Event::McpServerExited {
                seat: handle.to_string(),
                server,
                reason: "stopped".into(),
            });
        }
        Ok(())
    }

    /// Whether a turn of `handle` may spend: `Err` when one of its role's
    /// token caps is reached (`Ok(Some)`) or its counters cannot be read
    /// (`Err(None)`: a turn does not spend blind; its mail waits and comes
    /// again). `Ok(())` for a seat with no budget, or with room.
    async fn budget_gate(&self, handle: &str) -> Result<(), Option<super::budget::Exhausted>> {
        match self.budget_read(handle).await {
            Ok(None) => Ok(()),
            Ok(Some(ex)) => Err(Some(ex)),
            Err(e) => {
                tracing::warn!(seat = handle, error = %e, "cannot read the seat's token counters; its turn waits rather than spend blind");
                Err(None)
            }
        }
    }

    /// The cap `handle` has reached, if any; `Err` when its counters
    /// cannot be read.
    async fn budget_read(&self, handle: &str) -> Result<Option<super::budget::Exhausted>, String> {
        let Some((caps, tz)) = self.caps_of(handle) else {
            return Ok(None);
        };
        let windows = super::budget::windows(chrono::Utc::now(), tz);
        let spent = self.budgets.spent(handle, &windows).await?;
        Ok(super::budget::over(&caps, &windows, &spent))
    }

    fn caps_of(&self, handle: &str) -> Option<(crate::config::BudgetConfig, chrono_tz::Tz)> {
        let company = self.company.borrow();
        let caps = company
            .roles
            .iter()
            .find(|r| r.handle == handle)
            .and_then(|r| r.budget.clone())?;
        Some((caps, company.timezone.parse().unwrap_or(chrono_tz::UTC)))
    }

    /// A resume is a turn like any other: it starts only while every cap
    /// has room (and the counters can be read). `Some` is the delivery's
    /// disposition when it must wait (the seat held for a reached cap).
    async fn resume_waits_for_budget(&self, handle: &str) -> Option<Disposition> {
        match self.budget_gate(handle).await {
            Ok(()) => None,
            Err(reached) => {
                if let Some(ex) = reached {
                    self.hold_for_budget(handle, &ex);
                }
                Some(Disposition::Nak)
            }
        }
    }

    /// Has `handle` reached one of its role's token caps? `None` for a
    /// seat with no budget (nothing read), with room, or whose counters
    /// cannot be read (the hold's timer and the acquire hook look again).
    async fn budget_reached(&self, handle: &str) -> Option<super::budget::Exhausted> {
        self.budget_read(handle).await.unwrap_or_else(|e| {
            tracing::warn!(seat = handle, error = %e, "cannot read the seat's token counters");
            None
        })
    }

    /// Hold `handle` for a reached cap (its mail kept, nothing consumed),
    /// say so, and arm the timer that releases it once there is room —
    /// the window rolled over, or a company revision raised the cap
    /// (looked at every [`BUDGET_RECHECK`]).
    fn hold_for_budget(&self, handle: &str, ex: &super::budget::Exhausted) {
        if let Some(fence) = self.runtime(handle).and_then(|r| lock(&r.fence).clone()) {
            fence.hold(super::budget::BUDGET_HOLD, true);
        }
        if !lock(&self.budget_held).insert(handle.to_string()) {
            return;
        }
        let window = {
            let company = self.company.borrow();
            let tz = company.timezone.parse().unwrap_or(chrono_tz::UTC);
            super::budget::windows(chrono::Utc::now(), tz)
                .into_iter()
                .find(|w| w.span == ex.span)
                .map(|w| w.id)
                .unwrap_or_default()
        };
        tracing::warn!(
            seat = handle,
            cap = ex.span.cap_key(),
            limit = ex.cap,
            spent = ex.spent,
            "the seat reached a token cap; held until its window reopens"
        );
        self.events.emit(Event::SeatBudgetExhausted {
            seat: handle.to_string(),
            cap: ex.span.cap_key().into(),
            limit: ex.cap,
            spent: ex.spent,
            window,
            reopens_at: ex
                .reopens_at
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        });
        let (me, seat) = (self.me.clone(), handle.to_string());
        let mut until = ex.reopens_at;
        self.timers.spawn("budget hold", async move {
            loop {
                let left = (until - chrono::Utc::now()).to_std().unwrap_or_default();
                tokio::time::sleep(left.min(BUDGET_RECHECK)).await;
                let Some(engine) = me.upgrade() else { return };
                let Some(fence) = engine.runtime(&seat).and_then(|r| lock(&r.fence).clone()) else {
                    // Given back meanwhile: its next holder judges it.
                    lock(&engine.budget_held).remove(&seat);
                    return;
                };
                match engine.budget_reached(&seat).await {
                    Some(ex) => until = ex.reopens_at,
                    None => {
                        lock(&engine.budget_held).remove(&seat);
                        fence.hold(super::budget::BUDGET_HOLD, false);
                        tracing::info!(seat, "the seat's token caps have room again");
                        engine
                            .events
                            .emit(Event::SeatBudgetRestored { seat: seat.clone() });
                        return;
                    }
                }
            }
        });
    }

    /// A model seat's spend in its current windows (day, week, month: id,
    /// spent, cap) and whether it is held for a cap; `None` for a seat
    /// whose agent is no model, or whose counters cannot be read.
    pub async fn spend(&self, handle: &str) -> Option<(Vec<(String, u64, Option<u64>)>, bool)> {
        let (caps, tz) = {
            let company = self.company.borrow();
            let role = company.roles.iter().find(|r| r.handle == handle)?;
            if !matches!(role.agent, AgentConfig::Model(_)) {
                return None;
            }
            (
                role.budget.clone().unwrap_or_default(),
                company.timezone.parse().unwrap_or(chrono_tz::UTC),
            )
        };
        let windows = super::budget::windows(chrono::Utc::now(), tz);
        let spent = self.budgets.spent(handle, &windows).await.ok()?;
        let held = super::budget::over(&caps, &windows, &spent).is_some();
        Some((
            windows
                .iter()
                .zip(spent)
                .map(|(w, s)| (w.id.clone(), s, w.span.cap(&caps)))
                .collect(),
            held,
        ))
    }

    /// Stop the budget holds' timers (the node is stopping).
    pub async fn stop_timers(&self) {
        self.timers.shutdown().await;
    }

    /// The tools the agent of `handle` is told with each turn: the
    /// built-ins and the seat's MCP tools while it holds them here.
    pub fn tool_surface(&self, handle: &str) -> Vec<super::agent::ToolSpec> {
        self.tools.surface(handle)
    }

    /// The seat's MCP servers here (name, up, tools listed); `None` when
    /// it holds none here.
    pub fn tool_server_states(&self, handle: &str) -> Option<Vec<(String, bool, usize)>> {
        self.tools.mcp.get(handle).map(|m| m.states())
    }

    /// The process ids of the seat's MCP children on this node.
    pub fn tool_server_pids(&self, handle: &str) -> Vec<u32> {
        self.tools
            .mcp
            .get(handle)
            .map(|m| m.child_pids())
            .unwrap_or_default()
    }

    fn runtime(&self, handle: &str) -> Option<Arc<SeatRuntime>> {
        lock(&self.seats).get(handle).cloned()
    }

    /// Judge the role of `handle` against this node's policy
    /// ([`crate::config::AgentPolicy::judge_role`]): `Err` names every
    /// refusal, and the seat is not established here.
    fn judge_here(&self, handle: &str) -> Result<(), HookError> {
        let company = self.company.borrow().clone();
        let Some(role) = company.roles.iter().find(|r| r.handle == handle) else {
            return Ok(());
        };
        let problems = self
            .policy
            .judge_role(role, &crate::config::programs::find_on_node);
        if problems.is_empty() {
            return Ok(());
        }
        Err(HookError::new(
            "children",
            format!(
                "this node does not run seat {handle:?}: {}",
                problems.join("; ")
            ),
        ))
    }

    fn agent_for(&self, handle: &str) -> Result<Arc<dyn Agent>, HookError> {
        let company = self.company.borrow().clone();
        let role = company
            .roles
            .iter()
            .find(|r| r.handle == handle)
            .ok_or_else(|| {
                HookError::new(
                    "children",
                    format!(
                        "no role {handle:?} in company revision {}",
                        company.revision
                    ),
                )
            })?;
        // The role the seat was established under: what judges its built-in
        // calls should a revision remove the role before a turn begins.
        self.tools.roles_at_start.keep(role.clone());
        Ok(match &role.agent {
            AgentConfig::Echo(c) => {
                if c.drills && !self.policy.drills {
                    tracing::warn!(
                        seat = handle,
                        "the role asks for echo drills, but this node is not a test node (node.environment); the drills in its mail are ignored"
                    );
                }
                Arc::new(EchoAgent::new(c.clone(), self.policy.drills))
            }
            AgentConfig::Command(c) => Arc::new(
                CommandAgent::new(handle, &self.node_id, c)
                    .confined(self.policy.confinement.clone()),
            ),
            AgentConfig::Model(c) => {
                let mut c = c.clone();
                if let Some(f) = &c.instructions_file {
                    let inside = self
                        .policy
                        .instructions_lexical(f)
                        .map_err(|e| HookError::new("children", e))?;
                    c.instructions_file = Some(inside);
                }
                Arc::new(
                    super::model::ModelAgent::new(
                        handle,
                        &self.node_id,
                        self.company.clone(),
                        &c,
                        self.tools.memory.clone(),
                        self.budgets.clone(),
                    )
                    .confined_to(self.policy.instructions_dir.clone()),
                )
            }
        })
    }

    /// Apply the seat's pause record to its inbox. `Err` when the record
    /// cannot be read.
    async fn apply_pause(&self, handle: &str) -> Result<bool, String> {
        let paused = pause::read(&*self.store, handle)
            .await
            .map_err(|e| e.to_string())?
            .is_some();
        if let Some(fence) = self.runtime(handle).and_then(|r| lock(&r.fence).clone()) {
            fence.hold(PAUSE_HOLD, paused);
        }
        Ok(paused)
    }

    async fn control(&self, handle: &str, d: Delivery) -> Disposition {
        let m: ControlMessage = match serde_json::from_slice(&d.payload) {
            Ok(m) => m,
            Err(e) => return Disposition::Poison(format!("not a control message: {e}")),
        };
        match m {
            ControlMessage::PauseChanged => match self.apply_pause(handle).await {
                Ok(paused) => {
                    tracing::info!(seat = handle, paused, "the seat's pause changed");
                    Disposition::Ack
                }
                Err(e) => {
                    tracing::warn!(seat = handle, error = %e, "cannot read the seat's pause; trying again");
                    Disposition::Nak
                }
            },
            ControlMessage::RunCompleted(c) => self.forward_completion(handle, c).await,
            ControlMessage::ApprovalAnswered { approval_id } => {
                self.forward_answer(handle, approval_id).await
            }
            ControlMessage::Stop { by, .. } => {
                match self.runtime(handle) {
                    Some(rt) => match lock(&rt.running).clone() {
                        Some(turn_id) => {
                            tracing::info!(seat = handle, %by, %turn_id, "stopping the running turn at its next round");
                            *lock(&rt.stop) = Some((turn_id, by));
                        }
                        None => tracing::info!(seat = handle, %by, "a stop with no turn running"),
                    },
                    None => {
                        tracing::info!(seat = handle, %by, "a stop for a seat whose agent is not running here")
                    }
                }
                Disposition::Ack
            }
        }
    }

    /// Dispatch one partition of a seat's deliveries.
    async fn dispatch(
        &self,
        rt: &Arc<SeatRuntime>,
        fence: &Fence,
        ds: Vec<Delivery>,
    ) -> Vec<Disposition> {
        // When these deliveries reached this node: their ack window runs
        // from their fetch, and a turn says how much of it went before it
        // began (the turn lock, the ledger read).
        let received = std::time::Instant::now();
        let handle = rt.handle.clone();
        let mut out: Vec<Option<Disposition>> = vec![None; ds.len()];
        // (index, envelope, delivered) of the triggers that run a turn.
        let mut partition: Vec<Entry> = Vec::new();
        let mut resumes: Vec<Entry> = Vec::new();
        let mut answers: Vec<Entry> = Vec::new();
        for (i, d) in ds.iter().enumerate() {
            match Envelope::decode(&d.payload) {
                Err(e) => out[i] = Some(Disposition::Poison(e.to_string())),
                Ok(env) if env.kind == RUN_COMPLETED => resumes.push((i, env, d.delivered)),
                Ok(env) if env.kind == APPROVAL_ANSWERED => answers.push((i, env, d.delivered)),
                Ok(env) if !env.is_ledgered() => {
                    self.events.emit(Event::TurnTriggerIgnored {
                        seat: handle.clone(),
                        trigger_id: env.id.clone(),
                        kind: env.kind.clone(),
                    });
                    out[i] = Some(Disposition::Ack);
                }
                Ok(env) => partition.push((i, env, d.delivered)),
            }
        }
        for (i, env, delivered) in resumes {
            out[i] = Some(self.resume_run(rt, fence, &env, delivered, received).await);
        }
        for (i, env, delivered) in answers {
            out[i] = Some(
                self.resume_approval(rt, fence, &env, delivered, received)
                    .await,
            );
        }
        if !partition.is_empty() {
            self.run_partition(rt, fence, partition, received, &mut out)
                .await;
        }
        out.into_iter()
            .map(|d| d.unwrap_or(Disposition::Nak))
            .collect()
    }

    async fn run_partition(
        &self,
        rt: &Arc<SeatRuntime>,
        fence: &Fence,
        partition: Vec<Entry>,
        received: std::time::Instant,
        out: &mut [Option<Disposition>],
    ) {
        let handle = rt.handle.clone();
        let _turn = rt.turn_lock.lock().await;
        match fence.may_start() {
            Some(epoch) if epoch == fence.epoch() => {}
            _ => {
                let why = format!("seat {handle:?} is not owned here");
                for (i, _, _) in &partition {
                    out[*i] = Some(Disposition::Defer(why.clone()));
                }
                return;
            }
        }
        let envelopes: Vec<Envelope> = partition.iter().map(|(_, e, _)| e.clone()).collect();
        let (done, answered, _read) = ledger::read(&*self.store, &handle, &envelopes).await;
        let screened = ledger::screen(&envelopes, &done, &answered);
        for (t, reason) in &screened.skipped {
            self.events.emit(Event::TurnTriggerSkipped {
                seat: handle.clone(),
                trigger_id: t.id.clone(),
                reason: match reason {
                    SkipReason::AlreadyDone => "already_done",
                    SkipReason::AnsweredInThread => "answered_in_thread",
                }
                .into(),
                turn_id: None,
            });
        }
        let plan = plan_partition(&partition, &screened);
        for i in &plan.acks {
            out[*i] = Some(Disposition::Ack);
        }
        if plan.triggers.is_empty() {
            return;
        }
        // A turn starts only while every cap has room: a seat over one is
        // held, and its mail goes back to wait for the hold's release; a
        // seat whose counters cannot be read waits too.
        if let Err(reached) = self.budget_gate(&handle).await {
            if let Some(ex) = reached {
                self.hold_for_budget(&handle, &ex);
            }
            for i in &plan.runs {
                out[*i] = Some(Disposition::Nak);
            }
            return;
        }
        self.revive_tool_servers(&handle).await;
        let turn = TurnInput {
            turn_id: uuid::Uuid::new_v4().to_string(),
            seat: handle.clone(),
            epoch: fence.epoch(),
            node: self.node_id.clone(),
            work_key: ledger::work_key(&plan.triggers),
            delivered: plan.delivered,
            triggers: plan.triggers,
            tools: self.tools.surface(&handle),
        };
        *lock(&rt.stop) = None;
        let record = self.run_turn(rt, fence, &turn, received).await;
        *lock(&rt.stop) = None;
        let c = closing(
            &record.ending,
            record.reached_outside,
            &handle,
            &turn.turn_id,
            false,
            retry_delay(turn.delivered, self.retry),
        );
        // The record first, right behind the effects: it is what keeps a
        // redelivery (the ack can be lost too) from running them again.
        if c.record {
            let answered_ids = match &record.ending {
                Ending::Done { answered, .. } => answered.clone(),
                _ => Vec::new(),
            };
            // While the delivery is surely still ours: past it the delivery
            // may come back to the seat's next holder whatever happens here.
            let within = record_budget(self.ack_wait);
            ledger::record_within(
                &*self.store,
                &handle,
                &turn.triggers,
                &answered_ids,
                &turn.turn_id,
                within,
            )
            .await;
        }
        if c.after_turn {
            self.after_turn(&turn).await;
        }
        if c.abort {
            // The agent is told the turn is over (`parked` included): no
            // results come for its last round.
            rt.agent.abort(&turn.turn_id, record.ending.name()).await;
        }
        self.announce_closing(rt, &turn, &record, &c);
        if c.record && self.faults.stall_before_ack.load(Ordering::SeqCst) {
            tracing::warn!(seat = %handle, turn_id = %turn.turn_id, "fault injection: the turn's effects shipped and are recorded; never acking");
            std::future::pending::<()>().await;
        }
        for i in plan.runs {
            out[i] = Some(c.disposition.clone());
        }
        // The turn's completions may have reached a cap: the next turn waits.
        if let Some(ex) = self.budget_reached(&handle).await {
            self.hold_for_budget(&handle, &ex);
        }
    }

    /// Run `turn` under `fence`: marked running before it is announced
    /// (whoever reads the seat on `turn_started` finds the turn), and not
    /// running once it has ended.
    async fn run_turn(
        &self,
        rt: &Arc<SeatRuntime>,
        fence: &Fence,
        turn: &TurnInput,
        received: std::time::Instant,
    ) -> turn::TurnRecord {
        *lock(&rt.running) = Some(turn.turn_id.clone());
        self.events.emit(Event::TurnStarted {
            seat: turn.seat.clone(),
            turn_id: turn.turn_id.clone(),
            work_key: turn.work_key.clone(),
            epoch: turn.epoch,
            trigger_ids: turn.triggers.iter().map(|t| t.id.clone()).collect(),
            delivered: turn.delivered,
            waited_ms: received.elapsed().as_millis() as u64,
        });
        let guard = Guard {
            fence: fence.clone(),
            rt: rt.clone(),
            turn_id: turn.turn_id.clone(),
        };
        let record = turn::run(&*rt.agent, &self.tools, &guard, turn).await;
        *lock(&rt.running) = None;
        record
    }

    /// Publish how a turn closed: `turn_completed`, each trigger given up
    /// and a guard breach (which also becomes the seat's last error).
    fn announce_closing(
        &self,
        rt: &SeatRuntime,
        turn: &TurnInput,
        record: &turn::TurnRecord,
        c: &Closing,
    ) {
        self.events.emit(Event::TurnCompleted {
            seat: turn.seat.clone(),
            turn_id: turn.turn_id.clone(),
            work_key: turn.work_key.clone(),
            epoch: turn.epoch,
            outcome: record.ending.name().into(),
            rounds: record.rounds,
            calls: record.calls,
            reached_outside: record.reached_outside,
            recorded: c.record,
            disposition: disposition_name(&c.disposition).into(),
            delivered: turn.delivered,
            error: record.ending.error(),
            tokens: rt.agent.tokens(&turn.turn_id),
            retry_after_ms: match c.disposition {
                Disposition::Retry(d) => Some(d.as_millis() as u64),
                _ => None,
            },
            duration_ms: record.duration.as_millis() as u64,
        });
        if let Some(reason) = c.given_up {
            for t in &turn.triggers {
                self.events.emit(Event::TurnTriggerSkipped {
                    seat: turn.seat.clone(),
                    trigger_id: t.id.clone(),
                    reason: reason.into(),
                    turn_id: Some(turn.turn_id.clone()),
                });
            }
        }
        if let Ending::Broke(e) = &record.ending {
            *lock(&rt.last_error) = Some(e.clone());
        }
        if c.guard_breach {
            let error = record.ending.error().unwrap_or_default();
            *lock(&rt.last_error) = Some(error.clone());
            self.events.emit(Event::TurnGuardBreach {
                seat: turn.seat.clone(),
                turn_id: turn.turn_id.clone(),
                kind: "unhandled_exception".into(),
                error,
            });
        }
    }
}

struct Guard {
    fence: Fence,
    rt: Arc<SeatRuntime>,
    turn_id: String,
}

impl TurnGuard for Guard {
    fn holds(&self) -> bool {
        self.fence.holds()
    }

    fn stop_requested(&self) -> Option<String> {
        lock(&self.rt.stop)
            .as_ref()
            .filter(|(t, _)| *t == self.turn_id)
            .map(|(_, by)| by.clone())
    }
}

/// A seat's inbox handler: coalesces and dispatches.
struct InboxHandler {
    engine: Weak<TurnEngine>,
    rt: Arc<SeatRuntime>,
    fence: Fence,
}

#[async_trait::async_trait]
impl Handler for InboxHandler {
    async fn handle(&self, d: Delivery) -> Disposition {
        self.handle_batch(vec![d])
            .await
            .pop()
            .unwrap_or(Disposition::Nak)
    }

    fn batch_limit(&self) -> usize {
        PARTITION_LIMIT
    }

    async fn handle_batch(&self, ds: Vec<Delivery>) -> Vec<Disposition> {
        let n = ds.len();
        match self.engine.upgrade() {
            Some(e) => e.dispatch(&self.rt, &self.fence, ds).await,
            None => vec![Disposition::Defer("the node is stopping".into()); n],
        }
    }

    /// From the completion ledger: a ledgered trigger recorded done (or
    /// its chat message answered in its thread) is answered; one recorded
    /// neither is not. Mail that is not ledgered, does not decode, or
    /// whose ledger cannot be read: cannot say.
    async fn answered(&self, d: &Delivery) -> Option<bool> {
        let env = Envelope::decode(&d.payload).ok()?;
        if !env.is_ledgered() {
            return None;
        }
        let engine = self.engine.upgrade()?;
        let one = [env];
        let (done, answered, read) = ledger::read(&*engine.store, &self.rt.handle, &one).await;
        if !read {
            return None;
        }
        let [env] = one;
        Some(
            done.contains(&env.id)
                || env
                    .message_id
                    .as_ref()
                    .is_some_and(|m| answered.contains(m)),
        )
    }
}

struct ReflectHandler {
    engine: Weak<TurnEngine>,
    handle: String,
}

#[async_trait::async_trait]
impl Handler for ReflectHandler {
    async fn handle(&self, d: Delivery) -> Disposition {
        match self.engine.upgrade() {
            Some(e) => e.reflect(&self.handle, d).await,
            None => Disposition::Nak,
        }
    }
}

struct ControlHandler {
    engine: Weak<TurnEngine>,
    handle: String,
}

#[async_trait::async_trait]
impl Handler for ControlHandler {
    async fn handle(&self, d: Delivery) -> Disposition {
        match self.engine.upgrade() {
            Some(e) => e.control(&self.handle, d).await,
            None => Disposition::Nak,
        }
    }
}

#[async_trait::async_trait]
impl SeatHooks for TurnEngine {
    async fn start_children(&self, seat: &SeatContext) -> Result<(), HookError> {
        // Nothing of the role starts here unless this node's own file
        // allows it all: its programs, the variables it is handed, its
        // instructions file (a company applied on another node was judged
        // there by that node's file, not this one's).
        self.judge_here(&seat.handle)?;
        // The tool servers first: a seat whose tools are not up runs with
        // none.
        self.start_tool_servers(&seat.handle).await?;
        let agent = match self.runtime(&seat.handle) {
            // A runtime left by a release that has not finished yet.
            Some(rt) => rt.agent.clone(),
            None => self.agent_for(&seat.handle)?,
        };
        if let Err(e) = agent.start().await {
            self.stop_tool_servers(&seat.handle).await.ok();
            return Err(HookError::new("children", e.to_string()));
        }
        lock(&self.seats)
            .entry(seat.handle.clone())
            .or_insert_with(|| {
                Arc::new(SeatRuntime {
                    handle: seat.handle.clone(),
                    agent,
                    fence: Mutex::new(None),
                    running: Mutex::new(None),
                    stop: Mutex::new(None),
                    last_error: Mutex::new(None),
                    turn_lock: tokio::sync::Mutex::new(()),
                })
            });
        Ok(())
    }

    async fn hydrate_memory(&self, seat: &SeatContext) -> Result<(), HookError> {
        let h = changelog::hydrate(&self.tools.memory, &*self.changelog, &seat.handle)
            .await
            .map_err(|e| HookError::new("memory hydration", e.to_string()))?;
        tracing::info!(
            seat = %seat.handle,
            inserted = h.inserted,
            kept_local = h.kept_local,
            vectors_taken = h.vectors_taken,
            replaced = h.replaced,
            collided = h.collided,
            unreadable = h.unreadable,
            "seat memory hydrated"
        );
        Ok(())
    }

    async fn attach_reflect(&self, seat: &SeatContext) -> Result<Option<Attachment>, HookError> {
        let handler = Arc::new(ReflectHandler {
            engine: self.me.clone(),
            handle: seat.handle.clone(),
        });
        self.queue
            .attach(&reflect_group(&seat.handle), &[], handler)
            .await
            .map(Some)
            .map_err(|e| HookError::new("reflect attach", e.to_string()))
    }

    async fn attach_control(&self, seat: &SeatContext) -> Result<Option<Attachment>, HookError> {
        self.recover_runs(seat)
            .await
            .map_err(|e| HookError::new("run recovery", e))?;
        self.recover_approvals(seat)
            .await
            .map_err(|e| HookError::new("approval recovery", e))?;
        let handler = Arc::new(ControlHandler {
            engine: self.me.clone(),
            handle: seat.handle.clone(),
        });
        self.queue
            .attach(&control_group(&seat.handle), &[], handler)
            .await
            .map(Some)
            .map_err(|e| HookError::new("control attach", e.to_string()))
    }

    async fn pause_holds(&self, seat: &SeatContext) -> Result<Vec<String>, HookError> {
        let mut holds = match pause::read(&*self.store, &seat.handle).await {
            Ok(Some(p)) => {
                tracing::info!(seat = %seat.handle, by = %p.by, "the seat is paused; its inbox attaches held");
                vec![PAUSE_HOLD.to_string()]
            }
            Ok(None) => Vec::new(),
            // Unknown is not "not paused".
            Err(e) => return Err(HookError::new("pause holds", e.to_string())),
        };
        // A seat that reached a cap on its last holder stays held here.
        if let Some(ex) = self.budget_reached(&seat.handle).await {
            holds.push(super::budget::BUDGET_HOLD.to_string());
            lock(&self.budget_held).remove(&seat.handle);
            self.hold_for_budget(&seat.handle, &ex);
        }
        Ok(holds)
    }

    fn inbox_handler(&self, seat: &SeatContext, fence: Fence) -> Arc<dyn Handler> {
        let rt = match self.runtime(&seat.handle) {
            Some(rt) => rt,
            None => {
                // start_children always runs first; this is only reached if
                // a hook order changes. Build what it would have.
                let agent: Arc<dyn Agent> = self
                    .agent_for(&seat.handle)
                    .unwrap_or_else(|_| Arc::new(EchoAgent::new(Default::default(), false)));
                let rt = Arc::new(SeatRuntime {
                    handle: seat.handle.clone(),
                    agent,
                    fence: Mutex::new(None),
                    running: Mutex::new(None),
                    stop: Mutex::new(None),
                    last_error: Mutex::new(None),
                    turn_lock: tokio::sync::Mutex::new(()),
                });
                lock(&self.seats).insert(seat.handle.clone(), rt.clone());
                rt
            }
        };
        *lock(&rt.fence) = Some(fence.clone());
        Arc::new(InboxHandler {
            engine: self.me.clone(),
            rt,
            fence,
        })
    }

    async fn established(&self, seat: &SeatContext) {
        // A pause written while the hook ran may have been read (and its
        // nudge consumed) before the inbox existed: read it once more.
        if let Err(e) = self.apply_pause(&seat.handle).await {
            tracing::warn!(seat = %seat.handle, error = %e, "cannot re-read the seat's pause after attaching");
        }
    }

    async fn quiesce(&self, seat: &SeatContext) -> Result<(), HookError> {
        // The reflect subscription is gone and no turn runs: what the
        // successor hydrates is complete after this flush.
        changelog::flush(&self.tools.memory, &*self.changelog, &seat.handle)
            .await
            .map(|_| ())
            .map_err(|e| HookError::new("memory flush", e.to_string()))
    }

    async fn unprepare(&self, seat: &SeatContext) -> Result<(), HookError> {
        // Children started for a seat this node did not take; its memory
        // stays as hydrated (the holder's flushes replace it on a later
        // hydration), nothing is published.
        let rt = lock(&self.seats).remove(&seat.handle);
        if let Some(rt) = rt {
            rt.agent
                .stop()
                .await
                .map_err(|e| HookError::new("children", e.to_string()))?;
        }
        self.stop_tool_servers(&seat.handle).await
    }

    async fn release(&self, seat: &SeatContext) -> Result<(), HookError> {
        if self.faults.teardown_held(&seat.handle) {
            return Err(HookError::new(
                "children",
                format!("the teardown of seat {:?} is held by a fault", seat.handle),
            ));
        }
        if let Some(rt) = self.runtime(&seat.handle) {
            rt.agent
                .stop()
                .await
                .map_err(|e| HookError::new("children", e.to_string()))?;
        }
        self.stop_tool_servers(&seat.handle).await?;
        // The last flush, after the reflect subscription is gone: nothing
        // writes the seat's memory here after it.
        changelog::flush(&self.tools.memory, &*self.changelog, &seat.handle)
            .await
            .map_err(|e| HookError::new("memory flush", e.to_string()))?;
        lock(&self.seats).remove(&seat.handle);
        Ok(())
    }
}
