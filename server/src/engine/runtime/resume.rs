//! A turn resumed by the engine's own mail: a detached run's completion
//! forwarded to the seat's inbox, the resume claimed once fleet-wide,
//! continued as a turn, recorded done (the runs a new holder recovers are
//! in `run_recovery.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::coord::{KvError, StateBucket};
use crate::engine::agent::TurnInput;
use crate::engine::approvals::APPROVAL_ANSWERED;
use crate::engine::envelope::Envelope;
use crate::engine::ledger::{self};
use crate::engine::partition::{ClaimRefused, Closing, after_resume_claim, closing, retry_delay};
use crate::engine::runs::{Claim, RunCompletion, RunError, RunState, resume_claim};
use crate::engine::turn::{self};
use crate::events::Event;
use crate::queue::Disposition;
use crate::seat::host::Fence;

use super::{RUN_COMPLETED, SeatRuntime, TurnEngine, lock, record_budget, resume_work_key};

impl TurnEngine {
    /// A run's completion reached the seat's holder on its control
    /// subject: it becomes a `run_completed` trigger in the seat's inbox,
    /// so its resume is a turn like any other (one at a time, stoppable,
    /// fenced), and the control subscription is never held up by it.
    pub(super) async fn forward_completion(&self, handle: &str, c: RunCompletion) -> Disposition {
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
    pub(super) async fn forward_answer(&self, handle: &str, approval_id: String) -> Disposition {
        let body = serde_json::json!({ "approval_id": approval_id });
        let id = format!("approval:{approval_id}");
        self.forward(handle, id, APPROVAL_ANSWERED, body, "approval")
            .await
    }

    /// Hand a continuation from the control subscription to the seat's
    /// inbox as a trigger: `id`, of type `kind`, from `from`.
    pub(super) async fn forward(
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
    pub(super) async fn resume_run(
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
    pub(super) async fn continue_turn(
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
    pub(super) async fn claim_resume(
        &self,
        handle: &str,
        fence: &Fence,
        env: &Envelope,
    ) -> Result<(RunCompletion, crate::engine::runs::RunRecord, u64), Disposition> {
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
    pub(super) async fn resume_done(&self, handle: &str, trigger_id: &str) -> bool {
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
    pub(super) async fn record_resume(
        &self,
        handle: &str,
        trigger_id: &str,
        turn_id: &str,
        within: Duration,
    ) {
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
    pub(super) async fn resume_already_done(
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
    pub(super) fn skipped_as_done(&self, handle: &str, trigger_id: &str) -> Disposition {
        self.events.emit(Event::TurnTriggerSkipped {
            seat: handle.to_string(),
            trigger_id: trigger_id.to_string(),
            reason: "already_done".into(),
            turn_id: None,
        });
        Disposition::Ack
    }
}
