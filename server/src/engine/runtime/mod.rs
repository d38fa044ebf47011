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
//!
//! The engine's parts, one file each: `dispatch` (the handlers and a
//! partition's turn), `resume` (a run's completion resumed), and
//! `approval_resume` (an approval's answer resumed), `tool_servers`,
//! `budget_hold`, and `hooks` (the [`SeatHooks`] the seat host calls).
//! This file holds what they share: the engine, its seats, its setup and
//! its memory flush.

mod approval_resume;
mod budget_hold;
mod dispatch;
mod hooks;
mod reflect;
mod resume;
mod run_recovery;
mod tool_servers;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::watch;

use super::agent::Agent;
use super::outbox::Outbox;
use super::partition::RetryPolicy;
use super::runs::{Runs, Supervisor};
use super::tools::Tools;
use crate::company::Company;
use crate::coord::Store;
use crate::events::EventBus;
use crate::memory::MemoryStore;
use crate::memory::changelog::{self, Changelog};
use crate::queue::Queue;
use crate::seat::host::Fence;

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

    /// Stop the budget holds' timers (the node is stopping).
    pub async fn stop_timers(&self) {
        self.timers.shutdown().await;
    }

    fn runtime(&self, handle: &str) -> Option<Arc<SeatRuntime>> {
        lock(&self.seats).get(handle).cloned()
    }
}
