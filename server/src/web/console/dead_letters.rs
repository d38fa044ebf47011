//! Dead letters: listed and counted for anyone signed in, re-published or
//! discarded by operators, each action audited with the seat it was for.

use app::api::{DeadLetterActionResult, DeadLetterList, Person};
use app::console::ConsoleError;

use crate::audit;
use crate::web::dead_letters::DeadLetterAction;
use crate::web::unavailable::unavailable;

use super::NodeConsole;

/// Re-publish or discard one dead letter: operators only, the seat it
/// was sent to named in the audit row, refused or not.
async fn act(
    c: &NodeConsole,
    actor: &Person,
    action: DeadLetterAction,
    id: u64,
) -> Result<DeadLetterActionResult, ConsoleError> {
    let what = format!("dead letter {id}");
    if !actor.is_operator() {
        audit::record(
            &c.pool,
            &actor.name,
            action.audit_name(),
            None,
            Some(&what),
            "refused: not an operator",
        )
        .await
        .map_err(|e| unavailable("write the audit log", e))?;
        return Err(ConsoleError::Forbidden(format!(
            "{} is a viewer: only operators may {}.",
            actor.name,
            action.verb()
        )));
    }
    let done = crate::web::dead_letters::act(c.engine.queue().as_ref(), action, id).await;
    audit::record(
        &c.pool,
        &actor.name,
        action.audit_name(),
        done.seat.as_deref(),
        Some(&what),
        &done.audit_result,
    )
    .await
    .map_err(|e| unavailable("write the audit log", e))?;
    done.answer
}
pub(super) async fn list(
    c: &NodeConsole,
    seat: Option<&str>,
    limit: usize,
) -> Result<DeadLetterList, ConsoleError> {
    crate::web::dead_letters::list(c.engine.queue().as_ref(), seat, limit).await
}

pub(super) async fn count(c: &NodeConsole) -> Result<u64, ConsoleError> {
    c.engine
        .queue()
        .dead_letter_count()
        .await
        .map_err(|e| unavailable("count the dead letters", e))
}

pub(super) async fn requeue(
    c: &NodeConsole,
    actor: &Person,
    id: u64,
) -> Result<DeadLetterActionResult, ConsoleError> {
    act(c, actor, DeadLetterAction::Requeue, id).await
}

pub(super) async fn discard(
    c: &NodeConsole,
    actor: &Person,
    id: u64,
) -> Result<DeadLetterActionResult, ConsoleError> {
    act(c, actor, DeadLetterAction::Discard, id).await
}
