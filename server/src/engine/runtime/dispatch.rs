//! From the queue to a turn: the inbox, reflect and control handlers a seat's
//! attachments call, and dispatch — per coalesced partition: decode, the
//! types that run no turn, `may_start`, the ledger, the turn under its
//! fence, [`closing`](crate::engine::partition::closing), the settle.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use crate::engine::agent::TurnInput;
use crate::engine::envelope::Envelope;
use crate::engine::ledger::{self, SkipReason};
use crate::engine::partition::{
    Closing, Entry, PartitionPlan, closing, disposition_name, plan_partition, retry_delay,
    sort_batch,
};
use crate::engine::pause::{self, ControlMessage, PAUSE_HOLD};
use crate::engine::turn::{self, Ending, TurnGuard};
use crate::events::Event;
use crate::queue::{Delivery, Disposition, Handler};
use crate::seat::host::Fence;

use super::{PARTITION_LIMIT, SeatRuntime, TurnEngine, lock, record_budget};

impl TurnEngine {
    /// Apply the seat's pause record to its inbox. `Err` when the record
    /// cannot be read.
    pub(super) async fn apply_pause(&self, handle: &str) -> Result<bool, crate::coord::StoreError> {
        let paused = pause::read(&*self.store, handle).await?.is_some();
        if let Some(fence) = self.runtime(handle).and_then(|r| lock(&r.fence).clone()) {
            fence.hold(PAUSE_HOLD, paused);
        }
        Ok(paused)
    }

    pub(super) async fn control(&self, handle: &str, d: Delivery) -> Disposition {
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
    pub(super) async fn dispatch(
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
        let batch = sort_batch(&ds);
        for (i, why) in batch.poison {
            out[i] = Some(Disposition::Poison(why));
        }
        for (i, env) in batch.ignored {
            self.events.emit(Event::TurnTriggerIgnored {
                seat: handle.clone(),
                trigger_id: env.id,
                kind: env.kind,
            });
            out[i] = Some(Disposition::Ack);
        }
        for (i, env, delivered) in batch.resumes {
            out[i] = Some(self.resume_run(rt, fence, &env, delivered, received).await);
        }
        for (i, env, delivered) in batch.answers {
            out[i] = Some(
                self.resume_approval(rt, fence, &env, delivered, received)
                    .await,
            );
        }
        if !batch.triggers.is_empty() {
            self.run_partition(rt, fence, batch.triggers, received, &mut out)
                .await;
        }
        out.into_iter()
            .map(|d| d.unwrap_or(Disposition::Nak))
            .collect()
    }

    pub(super) async fn run_partition(
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
        let plan = self.screen(&handle, &partition).await;
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
        self.close_turn(rt, &turn, &record, &c).await;
        for i in plan.runs {
            out[i] = Some(c.disposition.clone());
        }
        // The turn's completions may have reached a cap: the next turn waits.
        if let Some(ex) = self.budget_reached(&handle).await {
            self.hold_for_budget(&handle, &ex);
        }
    }

    /// The partition screened against the completion ledger (mail already
    /// finished or answered in its thread is skipped, and said so): what to
    /// ack and what to run.
    async fn screen(&self, handle: &str, partition: &[Entry]) -> PartitionPlan {
        let envelopes: Vec<Envelope> = partition.iter().map(|(_, e, _)| e.clone()).collect();
        let (done, answered, _read) = ledger::read(&*self.store, handle, &envelopes).await;
        let screened = ledger::screen(&envelopes, &done, &answered);
        for (t, reason) in &screened.skipped {
            self.events.emit(Event::TurnTriggerSkipped {
                seat: handle.to_string(),
                trigger_id: t.id.clone(),
                reason: match reason {
                    SkipReason::AlreadyDone => "already_done",
                    SkipReason::AnsweredInThread => "answered_in_thread",
                }
                .into(),
                turn_id: None,
            });
        }
        plan_partition(partition, &screened)
    }

    /// A turn's close, as `c` says: the completion record right behind the
    /// effects, the work after the turn, the agent told of the end, the
    /// closing announced (and, injected for a test, a turn that never acks).
    async fn close_turn(
        &self,
        rt: &Arc<SeatRuntime>,
        turn: &TurnInput,
        record: &turn::TurnRecord,
        c: &Closing,
    ) {
        let handle = &turn.seat;
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
                handle,
                &turn.triggers,
                &answered_ids,
                &turn.turn_id,
                within,
            )
            .await;
        }
        if c.after_turn {
            self.after_turn(turn).await;
        }
        if c.abort {
            // The agent is told the turn is over (`parked` included): no
            // results come for its last round.
            rt.agent.abort(&turn.turn_id, record.ending.name()).await;
        }
        self.announce_closing(rt, turn, record, c);
        if c.record && self.faults.stall_before_ack.load(Ordering::SeqCst) {
            tracing::warn!(seat = %handle, turn_id = %turn.turn_id, "fault injection: the turn's effects shipped and are recorded; never acking");
            std::future::pending::<()>().await;
        }
    }

    /// Run `turn` under `fence`: marked running before it is announced
    /// (whoever reads the seat on `turn_started` finds the turn), and not
    /// running once it has ended.
    pub(super) async fn run_turn(
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
    pub(super) fn announce_closing(
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

pub(super) struct Guard {
    pub(super) fence: Fence,
    pub(super) rt: Arc<SeatRuntime>,
    pub(super) turn_id: String,
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
pub(super) struct InboxHandler {
    pub(super) engine: Weak<TurnEngine>,
    pub(super) rt: Arc<SeatRuntime>,
    pub(super) fence: Fence,
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

pub(super) struct ReflectHandler {
    pub(super) engine: Weak<TurnEngine>,
    pub(super) handle: String,
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

pub(super) struct ControlHandler {
    pub(super) engine: Weak<TurnEngine>,
    pub(super) handle: String,
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
