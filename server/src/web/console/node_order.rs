//! The person-ordered node ranking and "move this seat now": operators
//! change them, every change audited before it is announced.

use app::api::{MoveRequestView, NodeOrderView, Person};
use app::console::{Console, ConsoleError};

use crate::audit;
use crate::events::Event;
use crate::web::unavailable::unavailable;

use super::{MAX_REASON_CHARS, NodeConsole};

pub(super) async fn view(c: &NodeConsole) -> Result<NodeOrderView, ConsoleError> {
    crate::web::ranking::order_view(&**c.engine.store())
        .await
        .map_err(|e| crate::web::ranking::ranking_failure(e).0)
}

pub(super) async fn save(
    c: &NodeConsole,
    actor: &Person,
    nodes: Vec<String>,
    revision: Option<u64>,
) -> Result<NodeOrderView, ConsoleError> {
    use crate::seat::ranking;
    const ACTION: &str = "node_order.save";
    let asked = format!("order: {}", nodes.join(", "));
    if !actor.is_operator() {
        c.audited(actor, ACTION, Some(&asked), "refused: not an operator")
            .await?;
        return Err(ConsoleError::Forbidden(format!(
            "{} is a viewer: only operators may change the node order.",
            actor.name
        )));
    }
    let store = c.engine.store();
    match ranking::save(&**store, nodes.clone(), &actor.name, revision).await {
        Ok(saved) => {
            // Audited before it is announced: a page that refetches the
            // audit log on the event finds the row.
            let audited = c
                .audited(
                    actor,
                    ACTION,
                    Some(&asked),
                    &format!("saved (revision {saved})"),
                )
                .await;
            c.engine.events().emit(Event::NodeOrderChanged {
                nodes,
                by: actor.name.clone(),
            });
            audited?;
            c.node_order().await
        }
        Err(e) => {
            let (e, result) = crate::web::ranking::ranking_failure(e);
            c.audited(actor, ACTION, Some(&asked), &result).await?;
            Err(e)
        }
    }
}

pub(super) async fn move_seat(
    c: &NodeConsole,
    actor: &Person,
    handle: &str,
    node: &str,
    reason: &str,
) -> Result<MoveRequestView, ConsoleError> {
    const ACTION: &str = "seat.move";
    let reason = reason.trim();
    let why = Some(reason).filter(|r| !r.is_empty());
    let audit_row =
        |result: String| async move { c.audited_on(actor, ACTION, handle, why, &result).await };
    if !actor.is_operator() {
        audit_row(format!("refused: not an operator (to {node})")).await?;
        return Err(ConsoleError::Forbidden(format!(
            "{} is a viewer: only operators may move a seat.",
            actor.name
        )));
    }
    let n = reason.chars().count();
    if n > MAX_REASON_CHARS {
        audit::record(
            &c.pool,
            &actor.name,
            ACTION,
            Some(handle),
            None,
            "refused: reason too long",
        )
        .await
        .map_err(|e| unavailable("write the audit log", e))?;
        return Err(ConsoleError::Invalid(format!(
            "reason: at most {MAX_REASON_CHARS} characters (this one has {n})."
        )));
    }
    let store = c.engine.store();
    match crate::seat::moves::request(&**store, handle, node, &actor.name, reason).await {
        Ok(req) => {
            let audited = audit_row(format!("requested: to {}", req.to)).await;
            c.engine.events().emit(Event::SeatMoveRequested {
                seat: req.seat.clone(),
                to: req.to.clone(),
                by: req.by.clone(),
                reason: req.reason.clone(),
            });
            audited?;
            Ok(crate::web::ranking::move_view(&req))
        }
        Err(e) => {
            let (e, result) = crate::web::ranking::move_failure(e);
            audit_row(result).await?;
            Err(e)
        }
    }
}
