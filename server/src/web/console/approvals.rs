//! A seat's tool-call approvals: listed for anyone signed in, answered by
//! operators with a reason, every answer audited.

use app::api::{ApprovalView, Person};
use app::console::ConsoleError;

use crate::engine::pause::PauseError;
use crate::web::unavailable::unavailable;

use super::seat_actions::seat_failure;
use super::{MAX_REASON_CHARS, NodeConsole};

pub(super) async fn list(c: &NodeConsole, handle: &str) -> Result<Vec<ApprovalView>, ConsoleError> {
    if !c.engine.company().handles().any(|h| h == handle) {
        return Err(seat_failure(
            handle,
            PauseError::NoSuchSeat(handle.to_string()),
        ));
    }
    c.turns
        .approvals()
        .list(handle)
        .await
        .map(|v| v.iter().map(crate::web::approvals::approval_view).collect())
        .map_err(|e| unavailable("read the seat's approvals", e))
}

pub(super) async fn answer(
    c: &NodeConsole,
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
    let audit_row =
        |result: String| async move { c.audited_on(actor, action, handle, why, &result).await };
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
    if !c.engine.company().handles().any(|h| h == handle) {
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
    match c
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
