//! A turn resumed by a person's answer to an approval: the answer
//! forwarded, the call it approved run (or denied) and the turn continued;
//! and the approvals a new holder recovers.

use std::sync::Arc;

use crate::engine::approvals::{
    ApprovalRecord, ApprovalState, CallOutcome, Resume, Updated, lost, resume_plan,
};
use crate::engine::envelope::Envelope;
use crate::events::Event;
use crate::queue::Disposition;
use crate::seat::host::{Fence, SeatContext};

use super::{SeatRuntime, TurnEngine};

impl TurnEngine {
    /// Resume an answered approval (a `tool_approval_answered` trigger):
    /// the record's answer, never the trigger's body, decides
    /// ([`resume_plan`]). An approved call is claimed under this epoch and
    /// run here, its outcome recorded before the turn; a denial, a recorded
    /// outcome or a call an earlier holder began is delivered as it is.
    /// The turn that follows is recorded in the completion ledger like a
    /// run's resume.
    pub(super) async fn resume_approval(
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
    pub(super) async fn approval_outcome(
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
                let done = if crate::engine::tools::annotations_of(&record.tool).is_some() {
                    self.tools
                        .run_approved_built_in(record, epoch, &self.node_id)
                        .await
                } else {
                    self.revive_tool_servers(handle).await;
                    let call = crate::engine::agent::ToolCall {
                        id: record.call_id.clone(),
                        name: record.tool.clone(),
                        args: record.arguments.clone(),
                        annotations: Default::default(),
                    };
                    self.tools.call_mcp(handle, &call).await
                };
                crate::metrics::apply(&crate::engine::tools::call_update(
                    &record.tool,
                    true,
                    &done,
                ));
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
    pub(super) async fn recover_approvals(
        &self,
        seat: &SeatContext,
    ) -> Result<(), crate::engine::approvals::ApprovalsError> {
        match self
            .tools
            .approvals
            .prune(&seat.handle, crate::engine::approvals::RAN_KEPT)
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
}
