//! The HTTP face of the node priority order and of "move this seat now"
//! (docs/http-and-cli.md § HTTP):
//!
//! - `GET /api/nodes/order` (anybody signed in): the saved order and the
//!   order every node ranks the live fleet by now, with who saved it, when,
//!   and the revision to save against;
//! - `PUT /api/nodes/order` (operators): `{"nodes": [...], "revision": n|null}`;
//!   409 when somebody saved since, 400 naming a repeated or empty node id;
//! - `POST /api/seats/{handle}/move` (operators): `{"node", "reason"}`;
//!   202 with the recorded request, 400 with the refusal (outside the
//!   seat's placement, not serving, unknown node, already there, no
//!   reason), 404 for an unknown seat.
//!
//! It parses bodies, and maps the ranking's and the move's errors to what a
//! person reads; the acting, auditing and emitting is the console's
//! ([`crate::web::console`]), shared with the dashboard's server functions.
//! It never writes to the store itself.

use axum::Json;
use axum::extract::{Extension, Path};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use app::api::{MoveRequestView, NodeOrderView, Person};
use app::console::{ConsoleError, SharedConsole};

use crate::coord::Store;
use crate::seat::moves::{MoveError, MoveRequest};
use crate::seat::ranking::{self, RankingError};
use crate::web::console_error;

/// The body of `PUT /api/nodes/order`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OrderBody {
    nodes: Vec<String>,
    #[serde(default)]
    revision: Option<u64>,
}

/// The body of `POST /api/seats/{handle}/move`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MoveBody {
    node: String,
    #[serde(default)]
    reason: String,
}

/// Read a JSON body as `T`, or say what is wrong with it and what to send.
fn parse<T: for<'de> Deserialize<'de>>(body: &str, hint: &str) -> Result<T, ConsoleError> {
    serde_json::from_str(body)
        .map_err(|e| ConsoleError::Invalid(format!("the body is not valid ({e}); {hint}.")))
}

/// `GET /api/nodes/order`.
pub async fn get_order(Extension(console): Extension<SharedConsole>) -> Response {
    match console.node_order().await {
        Ok(v) => Json(v).into_response(),
        Err(e) => console_error(e),
    }
}

/// `PUT /api/nodes/order`.
pub async fn put_order(
    Extension(console): Extension<SharedConsole>,
    Extension(person): Extension<Person>,
    body: Result<String, axum::extract::rejection::StringRejection>,
) -> Response {
    let body = match crate::web::read_body(body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let body: OrderBody = match parse(
        &body,
        r#"send {"nodes": ["node-a", "node-b"], "revision": N} with the revision you read (null when no order was saved)"#,
    ) {
        Ok(b) => b,
        Err(e) => return console_error(e),
    };
    match console
        .save_node_order(&person, body.nodes, body.revision)
        .await
    {
        Ok(v) => Json(v).into_response(),
        Err(e) => console_error(e),
    }
}

/// `POST /api/seats/{handle}/move`.
pub async fn move_seat(
    Extension(console): Extension<SharedConsole>,
    Extension(person): Extension<Person>,
    Path(handle): Path<String>,
    body: Result<String, axum::extract::rejection::StringRejection>,
) -> Response {
    let body = match crate::web::read_body(body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let body: MoveBody = match parse(
        &body,
        r#"send {"node": "node-b", "reason": "why the seat moves"}"#,
    ) {
        Ok(b) => b,
        Err(e) => return console_error(e),
    };
    match console
        .move_seat(&person, &handle, &body.node, &body.reason)
        .await
    {
        Ok(v) => (StatusCode::ACCEPTED, Json(v)).into_response(),
        Err(e) => console_error(e),
    }
}

/// The order as saved and as every node ranks the live fleet now, from one
/// read of the record and one of the presence leases.
pub async fn order_view(store: &dyn Store) -> Result<NodeOrderView, RankingError> {
    let saved = ranking::read(store).await?;
    let present = ranking::present(store).await?;
    let (order, revision) = match saved {
        Some((o, r)) => (Some(o), Some(r)),
        None => (None, None),
    };
    let nodes = order.as_ref().map(|o| o.nodes.clone()).unwrap_or_default();
    Ok(NodeOrderView {
        effective: ranking::effective_order(&nodes, &present),
        saved: nodes,
        set_by: order.as_ref().map(|o| o.set_by.clone()),
        set_at: order.map(|o| o.set_at),
        revision,
    })
}

/// What a person reads for an order that was not saved, and the audit
/// row's result.
pub fn ranking_failure(e: RankingError) -> (ConsoleError, String) {
    let sentence = e.to_string();
    match e {
        RankingError::Conflict { .. } => (
            ConsoleError::Conflict(capitalised(&sentence)),
            "refused: saved by somebody else since it was read".into(),
        ),
        RankingError::Duplicate(_) | RankingError::EmptyNode(_) => (
            ConsoleError::Invalid(format!("nodes: {sentence}.")),
            format!("refused: {sentence}"),
        ),
        RankingError::Corrupt(_) | RankingError::Store(_) => {
            tracing::error!(error = %sentence, "the node order cannot be read or saved");
            (
                ConsoleError::Unavailable(format!(
                    "The node order cannot be read or saved right now ({sentence}). Try again."
                )),
                "failed: the coordination store is unavailable".into(),
            )
        }
    }
}

/// What a person reads for a move that was refused or failed, and the
/// audit row's result.
pub fn move_failure(e: MoveError) -> (ConsoleError, String) {
    let sentence = e.to_string();
    let refused = format!("refused: {sentence}");
    match e {
        MoveError::OutsidePlacement { .. }
        | MoveError::NotServing(_)
        | MoveError::AlreadyThere { .. }
        | MoveError::NoReason
        | MoveError::UnknownNode(_) => (ConsoleError::Invalid(capitalised(&sentence)), refused),
        MoveError::UnknownSeat(_) | MoveError::NoCompany => {
            (ConsoleError::NotFound(capitalised(&sentence)), refused)
        }
        MoveError::Store(_) | MoveError::Company(_) => {
            tracing::error!(error = %sentence, "a move could not be recorded");
            (
                ConsoleError::Unavailable(format!(
                    "The move could not be recorded ({sentence}). Try again."
                )),
                "failed: the coordination store is unavailable".into(),
            )
        }
    }
}

/// The recorded request as the API answers it.
pub fn move_view(r: &MoveRequest) -> MoveRequestView {
    MoveRequestView {
        seat: r.seat.clone(),
        to: r.to.clone(),
        by: r.by.clone(),
        reason: r.reason.clone(),
        requested_at: r.requested_at.to_string(),
        until: r.until.to_string(),
    }
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_save_is_a_conflict_saying_to_reload() {
        let (e, audit) = ranking_failure(RankingError::Conflict {
            expected: Some(1),
            current: Some(2),
        });
        assert!(
            matches!(e, ConsoleError::Conflict(ref m) if m.contains("reload")),
            "{e}"
        );
        assert!(audit.starts_with("refused"), "{audit}");
    }

    #[test]
    fn a_repeated_node_is_invalid_naming_it() {
        let (e, _) = ranking_failure(RankingError::Duplicate("node-b".into()));
        assert!(
            matches!(e, ConsoleError::Invalid(ref m) if m.contains("\"node-b\"")),
            "{e}"
        );
    }

    #[test]
    fn move_refusals_are_invalid_an_unknown_seat_not_found_and_the_store_unavailable() {
        let outside = MoveError::OutsidePlacement {
            seat: "s".into(),
            node: "n".into(),
            placement: "labels gpu".into(),
        };
        let (e, audit) = move_failure(outside);
        assert!(
            matches!(e, ConsoleError::Invalid(ref m) if m.contains("labels gpu")),
            "{e}"
        );
        assert!(audit.contains("outside seat"), "{audit}");
        for e in [
            MoveError::NotServing("n".into()),
            MoveError::NoReason,
            MoveError::UnknownNode("n".into()),
            MoveError::AlreadyThere {
                seat: "s".into(),
                node: "n".into(),
            },
        ] {
            assert!(matches!(move_failure(e).0, ConsoleError::Invalid(_)));
        }
        assert!(matches!(
            move_failure(MoveError::UnknownSeat("s".into())).0,
            ConsoleError::NotFound(_)
        ));
        assert!(matches!(
            move_failure(MoveError::Store(crate::coord::StoreError::Unavailable(
                "x".into()
            )))
            .0,
            ConsoleError::Unavailable(_)
        ));
    }
}
