//! The approvals as people see and answer them: the wire view of a record
//! ([`approval_view`]), `GET /api/seats/{handle}/approvals` and
//! `POST /api/seats/{handle}/approvals/{approval_id}` (docs/http-and-cli.md § HTTP). The
//! answer itself — operators only, audited — is the console's
//! ([`app::console::Console::answer_approval`]).

use app::api::ApprovalView;
use app::console::{ConsoleError, SharedConsole};
use axum::Extension;
use axum::Json;
use axum::extract::rejection::StringRejection;
use axum::response::IntoResponse;

use crate::engine::approvals::{ApprovalRecord, ApprovalState};

/// RFC 3339 of a Unix-milliseconds instant.
fn rfc3339_ms(ms: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp((ms / 1000) as i64)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// `r` as a person reads it.
pub fn approval_view(r: &ApprovalRecord) -> ApprovalView {
    let state = match r.state {
        ApprovalState::Pending => "pending",
        ApprovalState::Answered => "answered",
        ApprovalState::Running => "running",
        ApprovalState::Ran => "ran",
    };
    ApprovalView {
        approval_id: r.approval_id.clone(),
        seat: r.seat.clone(),
        tool: r.tool.clone(),
        arguments: r.arguments.clone(),
        turn_id: r.turn_id.clone(),
        state: state.into(),
        asked_at: r.asked_at.clone(),
        deadline: rfc3339_ms(r.deadline_ms),
        decision: r.decision.map(|d| d.name().to_string()),
        answered_by: r.answered_by.clone(),
        reason: r.reason.clone(),
        answered_at: r.answered_at.clone(),
        outcome_ok: r.outcome.as_ref().map(|o| o.ok),
        outcome_error: r.outcome.as_ref().and_then(|o| o.error.clone()),
    }
}

/// `GET /api/seats/{handle}/approvals`: the seat's approvals, the newest
/// first (any signed-in person).
pub async fn list(
    Extension(console): Extension<SharedConsole>,
    axum::extract::Path(handle): axum::extract::Path<String>,
) -> axum::response::Response {
    match console.approvals(&handle).await {
        Ok(v) => Json(serde_json::json!({ "seat": handle, "approvals": v })).into_response(),
        Err(e) => super::console_error(e),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerBody {
    decision: String,
    #[serde(default)]
    reason: String,
}

/// `POST /api/seats/{handle}/approvals/{approval_id}`: body
/// `{"decision": "approve" | "deny", "reason": "…"}` (operators only; the
/// reason is required and audited). Answers the approval as it now stands.
pub async fn answer(
    Extension(console): Extension<SharedConsole>,
    Extension(person): Extension<app::api::Person>,
    axum::extract::Path((handle, approval_id)): axum::extract::Path<(String, String)>,
    body: Result<String, StringRejection>,
) -> axum::response::Response {
    let body = match super::read_body(body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let hint = "send {\"decision\": \"approve\" or \"deny\", \"reason\": \"why\"}";
    let b: AnswerBody = match serde_json::from_str(&body) {
        Ok(b) => b,
        Err(e) => {
            return super::console_error(ConsoleError::Invalid(format!(
                "the body is not an answer ({e}); {hint}."
            )));
        }
    };
    let approve = match b.decision.as_str() {
        "approve" => true,
        "deny" => false,
        other => {
            return super::console_error(ConsoleError::Invalid(format!(
                "decision: {other:?} is neither \"approve\" nor \"deny\"; {hint}."
            )));
        }
    };
    match console
        .answer_approval(&person, &handle, &approval_id, approve, &b.reason)
        .await
    {
        Ok(v) => Json(v).into_response(),
        Err(e) => super::console_error(e),
    }
}

/// The approvals of the listed seats still waiting, read all at once; a
/// seat whose approvals cannot be read shows none.
pub async fn pending_of(
    approvals: &crate::engine::approvals::Approvals,
    handles: &[String],
) -> Vec<Vec<ApprovalView>> {
    futures::future::join_all(handles.iter().map(|h| async move {
        approvals
            .list(h)
            .await
            .unwrap_or_default()
            .iter()
            .filter(|r| r.state == ApprovalState::Pending)
            .map(approval_view)
            .collect()
    }))
    .await
}
