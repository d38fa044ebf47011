//! The node's events: one typed [`Event`] enum whose serde tag is the
//! spec's log name (`seat_claimed`, `seat_detached`, …), emitted once and
//! fanned out to tracing, the in-process bus every SSE client of this node
//! reads, and — on a fleet — `crewlet.events.{node}` on NATS, from which
//! every node re-broadcasts its peers' events.
//!
//! The names and fields here are a public contract (docs/mail-and-turns.md § Events).
//! Emitting never blocks and never fails the caller: a slow subscriber
//! misses events (and is told so by the bus), the emitter never waits.

use serde::{Deserialize, Serialize};

use crate::metrics::Update;
use tokio::sync::{broadcast, mpsc};

use crate::tasks::Tasks;

/// Why a seat was detached (spec § Establishing a seat, and giving it back).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DetachReason {
    Drain,
    Rebalance,
    RoleGone,
    PlacementMoved,
    Unserviceable,
    Unprepared,
    Lost,
    GraceExpired,
    HookFailed,
    Shed,
    /// An operator moved the seat to another node.
    Moved,
}

impl DetachReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DetachReason::Drain => "drain",
            DetachReason::Rebalance => "rebalance",
            DetachReason::RoleGone => "role_gone",
            DetachReason::PlacementMoved => "placement_moved",
            DetachReason::Unserviceable => "unserviceable",
            DetachReason::Unprepared => "unprepared",
            DetachReason::Lost => "lost",
            DetachReason::GraceExpired => "grace_expired",
            DetachReason::HookFailed => "hook_failed",
            DetachReason::Shed => "shed",
            DetachReason::Moved => "moved",
        }
    }

    /// Fenced releases detach first and abandon in-flight work; voluntary
    /// ones let the in-flight handler finish.
    pub fn is_fenced(self) -> bool {
        matches!(
            self,
            DetachReason::Lost
                | DetachReason::GraceExpired
                | DetachReason::HookFailed
                | DetachReason::Shed
        )
    }
}

/// Everything a node reports. The tag is the event's name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    NodeStarted {
        version: String,
        protocol: u32,
    },
    NodeDraining {},
    NodeStopped {},
    /// One placement pass: what it holds against what it may hold.
    SeatSweep {
        held: usize,
        undead: usize,
        capacity: usize,
        claimed: usize,
        released: usize,
        fleet_full: bool,
        /// How long the pass took.
        #[serde(default)]
        duration_ms: u64,
    },
    SeatClaimed {
        seat: String,
        epoch: u64,
        /// How long the claim's store calls took (a take's, for a seat
        /// taken through a handoff).
        #[serde(default)]
        claim_ms: u64,
    },
    SeatAttached {
        seat: String,
        epoch: u64,
    },
    SeatDetached {
        seat: String,
        epoch: u64,
        reason: DetachReason,
    },
    SeatsUnplaceable {
        seats: Vec<String>,
    },
    SeatClaimsWithheld {
        reason: String,
    },
    /// The protocol gate refused this pass's claims: `nodes` are the nodes
    /// holding a live presence or seat lease below `protocol` (the ones to
    /// upgrade or stop), `floor` the lowest protocol among them.
    SeatClaimsBlockedByOlderProtocol {
        floor: u32,
        protocol: u32,
        nodes: Vec<String>,
    },
    SeatAdmissionStale {
        seat: String,
        since_renew_ms: u64,
    },
    /// A renew the store could not answer: the seat is kept, its inbox
    /// quiesced until a renew succeeds again.
    SeatRenewUnknown {
        seat: String,
        error: String,
    },
    SeatReleaseUnproven {
        seat: String,
        epoch: u64,
        error: String,
    },
    SeatStillUnproven {
        seat: String,
        epoch: u64,
        elapsed_seconds: u64,
        attempts: u32,
        error: String,
    },
    SeatReleaseRecovered {
        seat: String,
        epoch: u64,
        attempts: u32,
    },
    /// An undead seat's lease was lost (a renewal answered that another
    /// tenure holds it, or it lapsed): this node no longer keeps it, with
    /// its teardown still unproven — what it left running may act beside
    /// the seat's next holder.
    SeatUndeadLost {
        seat: String,
        epoch: u64,
        /// How long its teardown had been failing.
        elapsed_seconds: u64,
        attempts: u32,
        error: String,
    },
    SeatReleasedRoleGone {
        seat: String,
    },
    CompanyApplied {
        revision: u64,
        seats: usize,
    },
    MessageDeadLettered {
        subscription: String,
        subject: String,
        seq: u64,
        delivered: u64,
        reason: String,
    },
    DeliveryDeferred {
        subscription: String,
        seq: u64,
        reason: String,
    },
    /// The broker had stranded a message (stored at `seq`, but behind the
    /// point its consumer says it delivered, awaiting no acknowledgement):
    /// its holder took it from the stream to handle it.
    MessageRecovered {
        subscription: String,
        subject: String,
        seq: u64,
    },
    /// A publish the broker acknowledged at `seq` but did not keep, while a
    /// subscription covers its subject, was published again at `new_seq`
    /// (NATS 2.9 after a stream-leader election).
    MessageRepublished {
        subject: String,
        seq: u64,
        new_seq: u64,
    },
    /// A turn began: the ledgered triggers it runs, under which epoch.
    /// A turn began. `waited_ms`: how long its deliveries had been in this
    /// node before it (the seat's turn lock, the ledger read) — part of
    /// their ack window, which runs from their fetch.
    TurnStarted {
        seat: String,
        turn_id: String,
        work_key: Option<String>,
        epoch: u64,
        trigger_ids: Vec<String>,
        delivered: u64,
        #[serde(default)]
        waited_ms: u64,
    },
    /// A turn ended: `outcome` is completed, failed, fenced, stopped,
    /// parked (a round started a detached run: the turn ends after it, and
    /// the run's resume continues it) or panicked; `recorded` says whether its triggers went into the
    /// completion ledger, `disposition` what the queue was told.
    TurnCompleted {
        seat: String,
        turn_id: String,
        work_key: Option<String>,
        epoch: u64,
        outcome: String,
        rounds: u32,
        calls: u32,
        reached_outside: bool,
        recorded: bool,
        disposition: String,
        delivered: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// What the turn's completions spent (a model agent's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tokens: Option<u64>,
        /// A turn handed back (`nak`) with a wait: how long its mail waits
        /// before it is delivered again (`stream.retry_delay_seconds`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_ms: Option<u64>,
        /// How long the turn ran, from its start to its closing.
        #[serde(default)]
        duration_ms: u64,
    },
    /// A trigger that will not run (again), and why: `already_done`,
    /// `answered_in_thread`, `broke_after_outside_call`,
    /// `fenced_after_outside_call`, `panicked`, `stopped_by_person`.
    TurnTriggerSkipped {
        seat: String,
        trigger_id: String,
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        turn_id: Option<String>,
    },
    /// A turn panicked; the seat's last error is set.
    #[serde(rename = "turn.guard_breach")]
    TurnGuardBreach {
        seat: String,
        turn_id: String,
        kind: String,
        error: String,
    },
    /// A delivery of a type that runs no turn was logged and dropped.
    TurnTriggerIgnored {
        seat: String,
        trigger_id: String,
        #[serde(rename = "type")]
        kind: String,
    },
    SeatPaused {
        seat: String,
        by: String,
        reason: Option<String>,
        stop_running_turn: bool,
    },
    SeatResumed {
        seat: String,
        by: String,
    },
    /// A person asked the seat's running turn to stop.
    TurnStopRequested {
        seat: String,
        by: String,
    },
    /// A graceful stop gave a duty back after its last tick.
    DutyReleased {
        duty: String,
    },
    /// A seat's registration failed; its mailbox was created anyway.
    SeatMailboxUnregistered {
        seat: String,
        error: String,
    },
    /// The broker holds a mailbox of a seat neither in the company nor in
    /// the registry: registered and stamped absent.
    SeatMailboxDiscovered {
        seat: String,
    },
    /// A seat recorded absent is in the company again.
    SeatMailboxReturned {
        seat: String,
    },
    /// A seat is missing from the active revision: its mailbox is retired
    /// at `retire_at` (RFC 3339) unless it returns.
    SeatMailboxAbsent {
        seat: String,
        retire_at: String,
    },
    /// A removed seat's mailbox and its mail were deleted (its memory is
    /// kept).
    SeatMailboxRetired {
        seat: String,
    },
    /// A retirement waits: `refused` is `held` (a node still holds the
    /// seat) or `protocol` (a lower-protocol node is still in the fleet).
    SeatMailboxRetirementHeld {
        seat: String,
        refused: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        holder: Option<String>,
    },
    /// A node adding the seat back took over a retirement that did not
    /// finish within its budget.
    SeatMailboxRetirementTakenOver {
        seat: String,
    },
    /// A retirement a dead sweep left marked is resumed.
    SeatMailboxRetirementResumed {
        seat: String,
    },
    /// A seat's MCP tool server started, initialised and listed its tools.
    McpServerStarted {
        seat: String,
        server: String,
        tools: usize,
    },
    /// A seat's MCP tool server could not start, initialise or list its
    /// tools within its bound: the seat is refused here.
    McpServerFailed {
        seat: String,
        server: String,
        error: String,
    },
    /// A seat's MCP tool server stopped (given back) or was found gone.
    McpServerExited {
        seat: String,
        server: String,
        reason: String,
    },
    /// A tool call waits for a person's approval (its turn parked).
    ToolApprovalRequested {
        seat: String,
        approval_id: String,
        tool: String,
        /// The call's arguments (cut at 4 KiB, saying so).
        arguments: serde_json::Value,
        turn_id: String,
    },
    /// A person (or the timeout, `by: "timeout"`) answered an approval:
    /// `decision` is `approved`, `denied` or `timed_out`.
    ToolApprovalAnswered {
        seat: String,
        approval_id: String,
        tool: String,
        decision: String,
        by: String,
    },
    /// The seat's holder resumed an answered approval: `ran` when it ran
    /// the approved call (here, once), `ok` what the agent is told.
    ToolApprovalResumed {
        seat: String,
        approval_id: String,
        tool: String,
        epoch: u64,
        ran: bool,
        ok: bool,
    },
    /// A model seat reached one of its token caps: it is held (its mail
    /// kept) until `reopens_at` (RFC 3339), when that window rolls over,
    /// or until a company revision raises the cap.
    SeatBudgetExhausted {
        seat: String,
        /// `tokens_per_day`, `tokens_per_week` or `tokens_per_month`.
        cap: String,
        limit: u64,
        spent: u64,
        /// The window on the company's clock (`2026-12-01`, `2026-W49`,
        /// `2026-12`).
        window: String,
        reopens_at: String,
    },
    /// The seat's caps have room again: its hold is released.
    SeatBudgetRestored {
        seat: String,
    },
    /// A turn started a detached run.
    RunStarted {
        seat: String,
        run_id: String,
        argv: Vec<String>,
    },
    /// The seat's new holder took over a live run under its epoch.
    RunAdopted {
        seat: String,
        run_id: String,
        epoch: u64,
    },
    /// A finished run was resumed with a new turn (once).
    RunResumed {
        seat: String,
        run_id: String,
        epoch: u64,
        outcome: String,
    },
    /// A run that will not finish: `reason` is `launcher_lost` or
    /// `seat_removed`.
    SandboxRunFailed {
        seat: String,
        run_id: String,
        reason: String,
    },
    /// Phase 1 of a handoff: the holder quiesced the seat (no new turn) and
    /// offered its lease to `to` (a node id). `reason` is the detach reason
    /// the move stands for (`rebalance`, `drain`, `placement_moved`,
    /// `moved`).
    SeatOffered {
        seat: String,
        epoch: u64,
        to: String,
        reason: DetachReason,
    },
    /// The successor took the offered lease (a new epoch) and attached the
    /// seat's inbox; `dark_ms` is how long no turn could be admitted, from
    /// the giver's quiesce to this attach, on the store's clock.
    SeatOfferTaken {
        seat: String,
        epoch: u64,
        from_epoch: u64,
        from: String,
        dark_ms: u64,
    },
    /// The giver took its offer back and resumed the seat; `why` says
    /// what happened (`timeout`: the successor did not take it in time).
    SeatOfferWithdrawn {
        seat: String,
        epoch: u64,
        to: String,
        why: String,
    },
    /// An operator asked for the seat to run on node `to`.
    SeatMoveRequested {
        seat: String,
        to: String,
        by: String,
        reason: String,
    },
    /// An operator saved the fleet's node priority order.
    NodeOrderChanged {
        nodes: Vec<String>,
        by: String,
    },
    /// A schedule fired (once fleet-wide for this due time).
    ScheduleFired {
        schedule: String,
        seat: String,
        due: String,
        trigger_id: String,
    },
}

impl Event {
    /// The event's name (its serde tag).
    pub fn name(&self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.get("event").and_then(|n| n.as_str()).map(str::to_string))
            .unwrap_or_default()
    }

    fn is_alarm(&self) -> bool {
        matches!(
            self,
            Event::SeatReleaseUnproven { .. }
                | Event::SeatStillUnproven { .. }
                | Event::SeatUndeadLost { .. }
                | Event::SeatsUnplaceable { .. }
                | Event::SeatClaimsBlockedByOlderProtocol { .. }
                | Event::MessageDeadLettered { .. }
                | Event::MessageRecovered { .. }
                | Event::MessageRepublished { .. }
                | Event::TurnGuardBreach { .. }
                | Event::SeatMailboxUnregistered { .. }
                | Event::SeatMailboxRetirementHeld { .. }
                | Event::SandboxRunFailed { .. }
        )
    }

    fn is_debug(&self) -> bool {
        // A turn that finished is routine (its JSON at DEBUG); one that
        // did not is worth a line.
        match self {
            Event::SeatSweep { .. } | Event::SeatClaimsWithheld { .. } => true,
            Event::TurnStarted { .. } => true,
            Event::TurnCompleted { outcome, .. } => outcome == "completed",
            _ => false,
        }
    }
}

/// An event as the fleet sees it: who said it, when, and what.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FleetEvent {
    pub node: String,
    pub incarnation: String,
    /// RFC 3339, the emitting node's wall clock.
    pub at: String,
    #[serde(flatten)]
    pub event: Event,
}

/// The bus: emit once, fan out everywhere.
#[derive(Clone)]
pub struct EventBus {
    node: String,
    incarnation: String,
    tx: broadcast::Sender<FleetEvent>,
    /// Set once the bus is connected to the fleet; shared by every clone.
    /// Bounded ([`BUS_CAPACITY`]): while the fleet link is that far behind,
    /// an event is kept here (logged, on this node's bus) but not sent on.
    outbound: std::sync::Arc<std::sync::OnceLock<mpsc::Sender<FleetEvent>>>,
}

/// Events kept for subscribers that fall behind.
pub const BUS_CAPACITY: usize = 4096;

impl EventBus {
    /// A bus for one node, in process only.
    pub fn new(node: &str, incarnation: &str) -> EventBus {
        let (tx, _) = broadcast::channel(BUS_CAPACITY);
        EventBus {
            node: node.to_string(),
            incarnation: incarnation.to_string(),
            tx,
            outbound: Default::default(),
        }
    }

    /// Also publish every event on `crewlet.events.{node}` and re-broadcast
    /// every peer's events from `crewlet.events.>`. The two tasks are owned
    /// by `tasks`.
    pub async fn connect_fleet(
        &self,
        client: async_nats::Client,
        tasks: &Tasks,
    ) -> Result<(), async_nats::SubscribeError> {
        let (out_tx, mut out_rx) = mpsc::channel::<FleetEvent>(BUS_CAPACITY);
        let subject = format!("crewlet.events.{}", self.node);
        let publisher = client.clone();
        tasks.spawn("events-publish", async move {
            while let Some(e) = out_rx.recv().await {
                match serde_json::to_vec(&e) {
                    Ok(body) => {
                        if let Err(err) = publisher.publish(subject.clone(), body.into()).await {
                            tracing::debug!(error = %err, "cannot publish an event to the fleet bus");
                        }
                    }
                    Err(err) => tracing::debug!(error = %err, "cannot encode an event"),
                }
            }
        });
        let mut sub = client.subscribe("crewlet.events.>").await?;
        let tx = self.tx.clone();
        let me = self.incarnation.clone();
        tasks.spawn("events-receive", async move {
            use futures::StreamExt;
            while let Some(msg) = sub.next().await {
                match serde_json::from_slice::<FleetEvent>(&msg.payload) {
                    Ok(e) if e.incarnation != me => {
                        let _ = tx.send(e);
                    }
                    Ok(_) => {}
                    Err(err) => tracing::debug!(subject = %msg.subject, error = %err, "unreadable fleet event"),
                }
            }
        });
        let _ = self.outbound.set(out_tx);
        Ok(())
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// The incarnation whose events this bus emits.
    pub fn incarnation(&self) -> &str {
        &self.incarnation
    }

    /// Emit `event`: to the log, to this node's subscribers and, on a
    /// fleet, to every peer.
    pub fn emit(&self, event: Event) {
        let fleet = FleetEvent {
            node: self.node.clone(),
            incarnation: self.incarnation.clone(),
            at: crate::clock::now_rfc3339(),
            event,
        };
        let json = serde_json::to_string(&fleet.event).unwrap_or_default();
        let name = fleet.event.name();
        if fleet.event.is_alarm() {
            tracing::warn!(target: "crewlet::event", event = %name, detail = %json, "{name}");
        } else if fleet.event.is_debug() {
            tracing::debug!(target: "crewlet::event", event = %name, detail = %json, "{name}");
        } else {
            tracing::info!(target: "crewlet::event", event = %name, detail = %json, "{name}");
        }
        // This node's own events move its metrics (a peer's are its own).
        for u in metric_updates(&fleet.event) {
            crate::metrics::apply(&u);
        }
        if let Some(out) = self.outbound.get()
            && let Err(mpsc::error::TrySendError::Full(e)) = out.try_send(fleet.clone())
        {
            tracing::debug!(event = %e.event.name(), "the fleet bus is behind; this event is not sent to peers");
        }
        let _ = self.tx.send(fleet);
    }

    /// Every event from now on (this node's and, on a fleet, its peers').
    pub fn subscribe(&self) -> broadcast::Receiver<FleetEvent> {
        self.tx.subscribe()
    }
}

/// Pure: what one of this node's events does to its metrics
/// (`crate::metrics`, docs/operations.md § Monitoring).
pub fn metric_updates(e: &Event) -> Vec<Update> {
    use crate::metrics as m;
    match e {
        // Seats held and unproven are read at each scrape.
        // Claims and renewals are counted where the store answers them
        // (`coord::claim_outcome`, `Renewal::outcome`).
        Event::SeatSweep {
            claimed,
            released,
            duration_ms,
            ..
        } => vec![
            Update::Count {
                name: m::SWEEPS,
                labels: Vec::new(),
                by: 1,
            },
            Update::seconds_from_ms(m::SWEEP_DURATION, *duration_ms),
            Update::observe(m::SWEEP_CLAIMS, *claimed as f64),
            Update::observe(m::SWEEP_RELEASES, *released as f64),
        ],
        Event::SeatClaimsBlockedByOlderProtocol { .. } => {
            vec![Update::count(m::CLAIMS, "outcome", "protocol_gate")]
        }
        Event::SeatClaimsWithheld { .. } => vec![Update::count(m::CLAIMS, "outcome", "withheld")],
        Event::SeatDetached { reason, .. } => {
            vec![Update::count(m::RELEASES, "reason", reason.as_str())]
        }
        Event::SeatClaimed { claim_ms, .. } => {
            vec![Update::seconds_from_ms(m::CLAIM_DURATION, *claim_ms)]
        }
        Event::SeatsUnplaceable { seats } => vec![Update::Set {
            name: m::SEATS_UNPLACEABLE,
            value: seats.len() as f64,
        }],
        Event::SeatOfferTaken { dark_ms, .. } => vec![
            Update::count(m::HANDOFFS, "outcome", "taken"),
            Update::seconds_from_ms(m::HANDOFF_DARK, *dark_ms),
        ],
        Event::SeatOfferWithdrawn { .. } => {
            vec![Update::count(m::HANDOFFS, "outcome", "withdrawn")]
        }
        Event::TurnCompleted {
            outcome,
            rounds,
            disposition,
            tokens,
            duration_ms,
            ..
        } => {
            let mut out = vec![
                Update::count(m::TURNS, "outcome", turn_outcome(outcome, disposition)),
                Update::count(
                    m::DELIVERIES,
                    "disposition",
                    closed(disposition, DISPOSITIONS),
                ),
                Update::seconds_from_ms(m::TURN_DURATION, *duration_ms),
                Update::Observe {
                    name: m::TURN_ROUNDS,
                    labels: Vec::new(),
                    value: f64::from(*rounds),
                },
            ];
            // Tool calls are counted by tool as the engine executes them.
            if let Some(t) = tokens.filter(|t| *t > 0) {
                out.push(Update::Count {
                    name: m::TOKENS,
                    labels: Vec::new(),
                    by: t,
                });
            }
            out
        }
        Event::TurnTriggerSkipped { reason, .. } => vec![Update::count(
            m::TRIGGERS_SKIPPED,
            "reason",
            closed(reason, SKIP_REASONS),
        )],
        Event::MessageDeadLettered { .. } => {
            vec![Update::count(m::DELIVERIES, "disposition", "dead_letter")]
        }
        Event::DeliveryDeferred { .. } => {
            vec![Update::count(m::DELIVERIES, "disposition", "defer")]
        }
        Event::MessageRecovered { .. } => {
            vec![Update::count(m::DELIVERIES, "disposition", "recovered")]
        }
        Event::MessageRepublished { .. } => {
            vec![Update::count(m::DELIVERIES, "disposition", "republished")]
        }
        Event::McpServerFailed { .. } => vec![Update::Count {
            name: m::TOOL_SERVER_FAILURES,
            labels: Vec::new(),
            by: 1,
        }],
        _ => Vec::new(),
    }
}

/// The turn outcomes a label may carry (anything else is `other`); a
/// turn that `failed` is counted by what became of its mail.
const TURN_OUTCOMES: &[&str] = &["completed", "fenced", "stopped", "parked", "panicked"];

/// Pure: a turn's `crewlet_turns_total{outcome}`: a broken turn whose mail
/// was handed back (`nak`) is `broken_redelivered`, one that was recorded
/// and acknowledged `broken_recorded`, one whose mail was dead-lettered
/// `broken_dead_lettered`; the others as they are named.
fn turn_outcome(outcome: &str, disposition: &str) -> String {
    match (outcome, disposition) {
        ("failed", "nak" | "defer") => "broken_redelivered".into(),
        ("failed", "poison") => "broken_dead_lettered".into(),
        ("failed", _) => "broken_recorded".into(),
        _ => closed(outcome, TURN_OUTCOMES),
    }
}
/// The dispositions a label may carry.
const DISPOSITIONS: &[&str] = &["ack", "nak", "defer", "poison"];
/// The skip reasons a label may carry.
const SKIP_REASONS: &[&str] = &[
    "already_done",
    "answered_in_thread",
    "broke_after_outside_call",
    "fenced_after_outside_call",
    "panicked",
    "stopped_by_person",
];

/// Pure: `v` when it is one of `known`, else `other` — a label's values
/// stay a closed list whatever a peer or a newer node sends.
fn closed(v: &str, known: &[&str]) -> String {
    if known.contains(&v) {
        v.to_string()
    } else {
        "other".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics as m;

    #[tokio::test]
    async fn a_fleet_link_that_is_behind_holds_at_most_its_capacity_and_local_emits_go_on() {
        let bus = EventBus::new("n", "n:1");
        let (tx, mut rx) = mpsc::channel(2);
        bus.outbound.set(tx).expect("set once");
        let mut local = bus.subscribe();
        for _ in 0..5 {
            bus.emit(Event::SeatBudgetRestored { seat: "s".into() });
        }
        // Every event reached this node's own subscribers …
        for _ in 0..5 {
            assert!(local.try_recv().is_ok());
        }
        // … and the link to peers kept only what it has room for.
        assert!(rx.try_recv().is_ok() && rx.try_recv().is_ok());
        assert!(
            rx.try_recv().is_err(),
            "the link held more than its capacity"
        );
    }

    /// A counter's name, labels and increment.
    type Counted = (&'static str, Vec<(&'static str, String)>, u64);

    fn counted(e: &Event) -> Vec<Counted> {
        metric_updates(e)
            .into_iter()
            .filter_map(|u| match u {
                Update::Count { name, labels, by } => Some((name, labels, by)),
                _ => None,
            })
            .collect()
    }

    fn one(
        name: &'static str,
        k: &'static str,
        v: &str,
    ) -> (&'static str, Vec<(&'static str, String)>, u64) {
        (name, vec![(k, v.to_string())], 1)
    }

    #[test]
    fn claims_renewals_and_releases_count_by_outcome_and_reason() {
        use crate::coord::lease::{LeaseState, StoreTime};
        use crate::coord::{Claim, Lease, Renewal, StoreError, claim_outcome};
        let lease = Lease {
            resource: "seat:a".into(),
            owner: "n1:x".into(),
            epoch: 1,
            acquired_at: StoreTime::from_unix_nanos(0),
            expires_at: StoreTime::from_unix_nanos(1),
            preferred: "n1".into(),
            protocol: 4,
            state: LeaseState::Held,
            metadata: Default::default(),
            revision: 1,
            ttl: std::time::Duration::from_secs(1),
            claim: String::new(),
            offer: None,
        };
        // A seat claim counts what the store answered.
        assert_eq!(claim_outcome(&Ok(Claim::Won(lease.clone()))), Some("won"));
        assert_eq!(
            claim_outcome(&Ok(Claim::HeldBy(lease.clone()))),
            Some("held_by_peer")
        );
        assert_eq!(
            claim_outcome(&Err(StoreError::Unavailable("down".into()))),
            Some("store_error")
        );
        // A gate refusal is counted once by the pass it ends
        // (`protocol_gate`), never per claim.
        assert_eq!(claim_outcome(&Ok(Claim::Gated { floor: 3 })), None);
        // And a renewal too, three-valued.
        assert_eq!(Renewal::Renewed(lease).outcome(), "renewed");
        assert_eq!(Renewal::Lost.outcome(), "lost");
        assert_eq!(
            Renewal::Unknown(StoreError::Unavailable("down".into())).outcome(),
            "store_unreachable"
        );
        // A renewal the store could not answer counts nothing again.
        // A won claim's event observes how long it took; it counts
        // nothing again.
        let claimed = Event::SeatClaimed {
            seat: "a".into(),
            epoch: 1,
            claim_ms: 2,
        };
        assert_eq!(
            metric_updates(&claimed),
            vec![Update::observe(m::CLAIM_DURATION, 0.002)]
        );
        let renew = Event::SeatRenewUnknown {
            seat: "a".into(),
            error: "timed out".into(),
        };
        assert!(metric_updates(&renew).is_empty());
        let gate = Event::SeatClaimsBlockedByOlderProtocol {
            floor: 3,
            protocol: 4,
            nodes: vec!["old".into()],
        };
        assert_eq!(
            counted(&gate),
            vec![one(m::CLAIMS, "outcome", "protocol_gate")]
        );
        let gone = Event::SeatDetached {
            seat: "a".into(),
            epoch: 1,
            reason: DetachReason::Drain,
        };
        assert_eq!(counted(&gone), vec![one(m::RELEASES, "reason", "drain")]);
        let unplaceable = Event::SeatsUnplaceable {
            seats: vec!["x".into(), "y".into()],
        };
        assert_eq!(
            metric_updates(&unplaceable),
            vec![Update::Set {
                name: m::SEATS_UNPLACEABLE,
                value: 2.0
            }]
        );
    }

    #[test]
    fn a_handoff_counts_by_outcome_and_its_dark_time_is_observed_in_seconds() {
        let taken = Event::SeatOfferTaken {
            seat: "a".into(),
            epoch: 2,
            from_epoch: 1,
            from: "n1".into(),
            dark_ms: 42,
        };
        assert_eq!(
            metric_updates(&taken),
            vec![
                Update::count(m::HANDOFFS, "outcome", "taken"),
                Update::Observe {
                    name: m::HANDOFF_DARK,
                    labels: vec![],
                    value: 0.042
                },
            ]
        );
        let withdrawn = Event::SeatOfferWithdrawn {
            seat: "a".into(),
            epoch: 1,
            to: "n2".into(),
            why: "timeout".into(),
        };
        assert_eq!(
            counted(&withdrawn),
            vec![one(m::HANDOFFS, "outcome", "withdrawn")]
        );
    }

    #[test]
    fn a_turn_counts_its_outcome_disposition_calls_and_tokens_and_observes_its_duration_and_rounds()
    {
        let turn = |outcome: &str, disposition: &str, calls: u32, tokens: Option<u64>| {
            Event::TurnCompleted {
                seat: "a".into(),
                turn_id: "t".into(),
                work_key: None,
                epoch: 1,
                outcome: outcome.into(),
                rounds: 3,
                calls,
                reached_outside: false,
                recorded: true,
                disposition: disposition.into(),
                delivered: 1,
                error: None,
                tokens,
                retry_after_ms: None,
                duration_ms: 1500,
            }
        };
        assert_eq!(
            metric_updates(&turn("completed", "ack", 2, Some(120))),
            vec![
                Update::count(m::TURNS, "outcome", "completed"),
                Update::count(m::DELIVERIES, "disposition", "ack"),
                Update::Observe {
                    name: m::TURN_DURATION,
                    labels: vec![],
                    value: 1.5
                },
                Update::Observe {
                    name: m::TURN_ROUNDS,
                    labels: vec![],
                    value: 3.0
                },
                Update::Count {
                    name: m::TOKENS,
                    labels: vec![],
                    by: 120
                },
            ]
        );
        // No tokens: nothing counted for them (tool calls are counted as
        // the engine executes them); an unknown outcome is `other` (the
        // label's values stay a closed list).
        let c = counted(&turn("exploded", "nak", 0, None));
        assert_eq!(
            c,
            vec![
                one(m::TURNS, "outcome", "other"),
                one(m::DELIVERIES, "disposition", "nak")
            ]
        );
        // A broken turn counts by what became of its mail.
        let outcome = |o: &str, d: &str| counted(&turn(o, d, 0, None))[0].1[0].1.clone();
        assert_eq!(outcome("failed", "nak"), "broken_redelivered");
        assert_eq!(outcome("failed", "defer"), "broken_redelivered");
        assert_eq!(outcome("failed", "ack"), "broken_recorded");
        assert_eq!(outcome("failed", "poison"), "broken_dead_lettered");
        assert_eq!(outcome("fenced", "nak"), "fenced");
    }

    #[test]
    fn deliveries_count_by_disposition_and_skipped_triggers_by_reason() {
        let dead = Event::MessageDeadLettered {
            subscription: "agent-a".into(),
            subject: "crewlet.agent.a.inbox".into(),
            seq: 1,
            delivered: 26,
            reason: "delivered 25 times".into(),
        };
        assert_eq!(
            counted(&dead),
            vec![one(m::DELIVERIES, "disposition", "dead_letter")]
        );
        let deferred = Event::DeliveryDeferred {
            subscription: "agent-a".into(),
            seq: 1,
            reason: "paused".into(),
        };
        assert_eq!(
            counted(&deferred),
            vec![one(m::DELIVERIES, "disposition", "defer")]
        );
        let recovered = Event::MessageRecovered {
            subscription: "agent-a".into(),
            subject: "s".into(),
            seq: 1,
        };
        assert_eq!(
            counted(&recovered),
            vec![one(m::DELIVERIES, "disposition", "recovered")]
        );
        let again = Event::MessageRepublished {
            subject: "s".into(),
            seq: 1,
            new_seq: 2,
        };
        assert_eq!(
            counted(&again),
            vec![one(m::DELIVERIES, "disposition", "republished")]
        );
        let skipped = Event::TurnTriggerSkipped {
            seat: "a".into(),
            trigger_id: "e".into(),
            reason: "already_done".into(),
            turn_id: None,
        };
        assert_eq!(
            counted(&skipped),
            vec![one(m::TRIGGERS_SKIPPED, "reason", "already_done")]
        );
        let sweep = Event::SeatSweep {
            held: 1,
            undead: 0,
            capacity: 2,
            claimed: 0,
            released: 0,
            fleet_full: false,
            duration_ms: 250,
        };
        assert_eq!(counted(&sweep), vec![(m::SWEEPS, vec![], 1)]);
        // A pass observes how long it took and what it claimed and gave back.
        assert_eq!(
            metric_updates(&sweep)[1..],
            [
                Update::observe(m::SWEEP_DURATION, 0.25),
                Update::observe(m::SWEEP_CLAIMS, 0.0),
                Update::observe(m::SWEEP_RELEASES, 0.0),
            ]
        );
        // Events that are not counted move nothing.
        assert!(metric_updates(&Event::NodeDraining {}).is_empty());
    }

    #[test]
    fn event_names_are_the_specs_log_names() {
        let e = Event::SeatDetached {
            seat: "a".into(),
            epoch: 7,
            reason: DetachReason::PlacementMoved,
        };
        assert_eq!(e.name(), "seat_detached");
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["reason"], "placement_moved");
        assert_eq!(
            Event::SeatClaimsBlockedByOlderProtocol {
                floor: 3,
                protocol: 4,
                nodes: vec!["old-1".into()],
            }
            .name(),
            "seat_claims_blocked_by_older_protocol"
        );
        assert_eq!(
            Event::SeatStillUnproven {
                seat: "a".into(),
                epoch: 1,
                elapsed_seconds: 1,
                attempts: 1,
                error: String::new()
            }
            .name(),
            "seat_still_unproven"
        );
    }

    #[tokio::test]
    async fn an_emitted_event_reaches_every_subscriber_once_with_its_node() {
        let bus = EventBus::new("node-a", "node-a:1");
        let mut a = bus.subscribe();
        let mut b = bus.subscribe();
        bus.emit(Event::SeatClaimed {
            seat: "s".into(),
            epoch: 3,
            claim_ms: 0,
        });
        for rx in [&mut a, &mut b] {
            let e = rx.recv().await.unwrap();
            assert_eq!(e.node, "node-a");
            assert_eq!(
                e.event,
                Event::SeatClaimed {
                    seat: "s".into(),
                    epoch: 3,
                    claim_ms: 0,
                }
            );
            assert!(rx.try_recv().is_err());
        }
        let wire = serde_json::to_value(&FleetEvent {
            node: "n".into(),
            incarnation: "n:1".into(),
            at: "t".into(),
            event: Event::SeatClaimed {
                seat: "s".into(),
                epoch: 3,
                claim_ms: 0,
            },
        })
        .unwrap();
        assert_eq!(wire["event"], "seat_claimed");
        assert_eq!(wire["seat"], "s");
        assert_eq!(wire["node"], "n");
    }
}
