//! What an operator does to one seat — pause, resume, stop its turn, send
//! to its inbox — each admitted (role, seat, reason) and audited, refused
//! or not.

use app::api::{Person, SeatActionResult, SeatQuery};
use app::console::ConsoleError;

use crate::audit;
use crate::engine::pause::{self, PauseError, PauseRecord};
use crate::events::Event;
use crate::web::unavailable::unavailable;

use super::{MAX_REASON_CHARS, NodeConsole};

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
pub(super) fn seat_failure(handle: &str, e: PauseError) -> ConsoleError {
    match e {
        PauseError::NoSuchSeat(_) => ConsoleError::NotFound(format!(
            "seat {handle:?} is not in the active company; check the handle (GET /query/fleet lists the seats held)."
        )),
        PauseError::Store(e) => unavailable("reach the coordination store", e),
        PauseError::Queue(e) => unavailable("reach the seat's control subject", e),
    }
}

pub(super) async fn pause(
    c: &NodeConsole,
    actor: &Person,
    handle: &str,
    reason: Option<String>,
    stop_running_turn: bool,
) -> Result<SeatActionResult, ConsoleError> {
    let action = SeatAction::Pause;
    let reason = c.admit_seat_action(actor, action, handle, reason).await?;
    let record = PauseRecord {
        by: actor.name.clone(),
        at: crate::clock::now_rfc3339(),
        reason: reason.clone(),
        stop_running_turn,
    };
    let engine = &c.engine;
    let fresh = match pause::pause(&**engine.store(), &**engine.queue(), handle, record).await {
        Ok(fresh) => fresh,
        Err(e) => {
            return Err(c
                .failed_seat_action(actor, action, handle, reason.as_deref(), e)
                .await);
        }
    };
    let mut result = if fresh {
        "paused".to_string()
    } else {
        "already paused (updated)".to_string()
    };
    if stop_running_turn {
        result.push_str("; the running turn stops at its next round");
    }
    // Audited before it is announced: a page that refetches the audit log
    // on the event finds the row.
    let audited = c
        .audited_seat(actor, action, handle, reason.as_deref(), &result)
        .await;
    engine.events().emit(Event::SeatPaused {
        seat: handle.to_string(),
        by: actor.name.clone(),
        reason: reason.clone(),
        stop_running_turn,
    });
    audited?;
    Ok(SeatActionResult {
        seat: handle.to_string(),
        result,
    })
}

pub(super) async fn resume(
    c: &NodeConsole,
    actor: &Person,
    handle: &str,
) -> Result<SeatActionResult, ConsoleError> {
    let action = SeatAction::Resume;
    c.admit_seat_action(actor, action, handle, None).await?;
    let engine = &c.engine;
    let was_paused = match pause::resume(&**engine.store(), &**engine.queue(), handle).await {
        Ok(was) => was,
        Err(e) => {
            return Err(c.failed_seat_action(actor, action, handle, None, e).await);
        }
    };
    let result = if was_paused {
        "resumed"
    } else {
        "was not paused"
    };
    // Audited before it is announced (as a pause).
    let audited = c.audited_seat(actor, action, handle, None, result).await;
    if was_paused {
        engine.events().emit(Event::SeatResumed {
            seat: handle.to_string(),
            by: actor.name.clone(),
        });
    }
    audited?;
    Ok(SeatActionResult {
        seat: handle.to_string(),
        result: result.to_string(),
    })
}

pub(super) async fn stop(
    c: &NodeConsole,
    actor: &Person,
    handle: &str,
    reason: Option<String>,
) -> Result<SeatActionResult, ConsoleError> {
    let action = SeatAction::Stop;
    let reason = c.admit_seat_action(actor, action, handle, reason).await?;
    // Nothing to stop: said so (and audited), no stop is sent.
    let running = super::seats::page(c, SeatQuery::default(), Some(handle))
        .await
        .map(|l| l.rows.iter().any(|r| r.running_turn.is_some()))
        .unwrap_or(true);
    if !running {
        let result = "no turn was running";
        c.audited_seat(actor, action, handle, reason.as_deref(), result)
            .await?;
        return Ok(SeatActionResult {
            seat: handle.to_string(),
            result: result.to_string(),
        });
    }
    let engine = &c.engine;
    if let Err(e) = pause::stop(&**engine.queue(), handle, &actor.name).await {
        return Err(c
            .failed_seat_action(actor, action, handle, reason.as_deref(), e)
            .await);
    }
    let result = "stop requested";
    // Audited before it is announced (as a pause).
    let audited = c
        .audited_seat(actor, action, handle, reason.as_deref(), result)
        .await;
    engine.events().emit(Event::TurnStopRequested {
        seat: handle.to_string(),
        by: actor.name.clone(),
    });
    audited?;
    Ok(SeatActionResult {
        seat: handle.to_string(),
        result: result.to_string(),
    })
}

pub(super) async fn send_to_inbox(
    c: &NodeConsole,
    actor: &Person,
    handle: &str,
    envelope_json: &str,
) -> Result<String, ConsoleError> {
    use crate::engine::envelope::Envelope;
    let refuse = |why: &str| format!("refused: {why}");
    if !actor.is_operator() {
        audit::record(
            &c.pool,
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
    if !c.engine.company().handles().any(|h| h == handle) {
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
        c.audited_on(
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
    let fresh = c
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
        &c.pool,
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
