//! Server functions: the only way the pages reach the node.
//!
//! Each one resolves the acting [`Person`] (put on the request by the node's
//! sign-in middleware) and the [`Console`](crate::console::Console) from
//! context. Anything that changes state requires `operator`: the console
//! checks the role (so a refusal is audited too) and a viewer gets 403
//! with a sentence saying so.

use leptos::prelude::*;

use crate::api::{
    ApprovalView, AuditView, DeadLetterActionResult, DeadLetterList, EventPage, FleetView,
    MemoryOverviewPage, MoveRequestView, NewPerson, NodeOrderView, Person, PersonView,
    SeatActionResult, SeatDetail, SeatList, SeatMemoryRead,
};
use crate::error::AppError;

#[cfg(feature = "ssr")]
pub mod ssr {
    //! Server-side helpers shared by the server functions.
    use axum::http::StatusCode;
    use leptos::prelude::*;
    use leptos_axum::ResponseOptions;

    use crate::api::Person;
    use crate::console::SharedConsole;
    use crate::error::AppError;

    fn status(code: StatusCode) {
        if let Some(opts) = use_context::<ResponseOptions>() {
            opts.set_status(code);
        }
    }

    /// The person the request acts for.
    pub async fn person() -> Result<Person, AppError> {
        match leptos_axum::extract::<axum::Extension<Person>>().await {
            Ok(axum::Extension(p)) => Ok(p),
            Err(_) => {
                status(StatusCode::UNAUTHORIZED);
                Err(AppError::NotSignedIn)
            }
        }
    }

    pub fn console() -> Result<SharedConsole, AppError> {
        use_context::<SharedConsole>().ok_or_else(|| {
            status(StatusCode::SERVICE_UNAVAILABLE);
            AppError::Unavailable("The node's console is not available.".into())
        })
    }

    /// The role a form names, or a sentence saying which roles there are.
    pub fn role_named(role: &str) -> Result<crate::api::PersonRole, crate::console::ConsoleError> {
        crate::api::PersonRole::parse(role.trim()).ok_or_else(|| {
            crate::console::ConsoleError::Invalid(format!(
                "role {:?} is not a role: use \"viewer\", \"operator\" or \"admin\".",
                role.chars().take(40).collect::<String>()
            ))
        })
    }

    /// Map a console error to an HTTP status and the typed error.
    pub fn fail(e: crate::console::ConsoleError) -> AppError {
        use crate::console::ConsoleError;
        status(match e {
            ConsoleError::Invalid(_) => StatusCode::BAD_REQUEST,
            ConsoleError::Forbidden(_) => StatusCode::FORBIDDEN,
            ConsoleError::NotFound(_) => StatusCode::NOT_FOUND,
            ConsoleError::Conflict(_) => StatusCode::CONFLICT,
            ConsoleError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        });
        e.into()
    }
}

/// Who is signed in.
#[server(endpoint = "whoami")]
pub async fn whoami() -> Result<Person, AppError> {
    ssr::person().await
}

/// The fleet: every live node and its seats.
#[server(endpoint = "fleet")]
pub async fn fleet() -> Result<FleetView, AppError> {
    ssr::person().await?;
    ssr::console()?.fleet().await.map_err(ssr::fail)
}

/// Every live node's last hour, each answering for its own.
#[server(endpoint = "node_trends")]
pub async fn node_trends() -> Result<crate::api::FleetTrends, AppError> {
    ssr::person().await?;
    ssr::console()?.node_trends().await.map_err(ssr::fail)
}

/// One seat's memory, answered by the node that holds it.
#[server(endpoint = "seat_memory")]
pub async fn seat_memory(handle: String) -> Result<SeatMemoryRead, AppError> {
    ssr::person().await?;
    ssr::console()?.memory(&handle).await.map_err(ssr::fail)
}

/// One page (50 seats) of the memory overview: the seats whose handle
/// contains `query`, page 1 first, with the coverage and the totals of
/// every seat.
#[server(endpoint = "memory_overview")]
pub async fn memory_overview(
    #[server(default)] query: String,
    #[server(default)] page: u32,
) -> Result<MemoryOverviewPage, AppError> {
    ssr::person().await?;
    if query.chars().count() > 200 {
        return Err(ssr::fail(crate::console::ConsoleError::Invalid(
            "query: at most 200 characters.".into(),
        )));
    }
    let overview = ssr::console()?.memory_overview().await.map_err(ssr::fail)?;
    Ok(MemoryOverviewPage::of(overview, &query, page))
}

/// One page (50 seats) of the active company's seats whose handle or
/// holder node contains `query`, in `state` (empty: any), page 1 first.
#[server(endpoint = "list_seats")]
pub async fn list_seats(
    #[server(default)] query: String,
    #[server(default)] state: String,
    #[server(default)] page: u32,
) -> Result<SeatList, AppError> {
    ssr::person().await?;
    let state = match state.trim() {
        "" | "all" => None,
        s => match crate::api::SeatState::parse(s) {
            Some(st) => Some(st),
            None => {
                return Err(ssr::fail(crate::console::ConsoleError::Invalid(format!(
                    "state: {s:?} is not a seat state; use attached, establishing, paused, undead or unowned (or leave it empty)."
                ))));
            }
        },
    };
    if query.chars().count() > 200 {
        return Err(ssr::fail(crate::console::ConsoleError::Invalid(
            "query: at most 200 characters.".into(),
        )));
    }
    ssr::console()?
        .seats(crate::api::SeatQuery { query, state, page })
        .await
        .map_err(ssr::fail)
}

/// One seat's page: its row, a page of its timeline (older than `before`
/// when given), people's actions on it and what it posted.
#[server(endpoint = "seat_page")]
pub async fn seat_page(
    handle: String,
    #[server(default)] before: Option<u64>,
) -> Result<SeatDetail, AppError> {
    ssr::person().await?;
    ssr::console()?
        .seat(&handle, before)
        .await
        .map_err(ssr::fail)
}

/// One page of the fleet's events the node kept, newest first.
#[server(endpoint = "event_history")]
pub async fn event_history(
    #[server(default)] before: Option<u64>,
    #[server(default)] seat: String,
    #[server(default)] node: String,
    #[server(default)] turn: String,
    #[server(default)] kind: String,
    #[server(default)] noise: bool,
) -> Result<EventPage, AppError> {
    ssr::person().await?;
    for (name, v) in [
        ("seat", &seat),
        ("node", &node),
        ("turn", &turn),
        ("kind", &kind),
    ] {
        if v.chars().count() > 200 {
            return Err(ssr::fail(crate::console::ConsoleError::Invalid(format!(
                "{name}: at most 200 characters."
            ))));
        }
    }
    ssr::console()?
        .events(crate::api::EventQuery {
            before,
            seat,
            node,
            turn,
            kind,
            noise,
            limit: 0,
        })
        .await
        .map_err(ssr::fail)
}

/// Send a seat a message from a person (operators only; audited): a
/// `task_assigned` envelope whose body is `{"text": text}`, from the
/// person. Returns the envelope's id.
#[server(endpoint = "send_message")]
pub async fn send_message(handle: String, text: String) -> Result<String, AppError> {
    let actor = ssr::person().await?;
    let text = text.trim().to_string();
    if text.is_empty() {
        return Err(ssr::fail(crate::console::ConsoleError::Invalid(
            "text: write the message first.".into(),
        )));
    }
    let envelope = serde_json::json!({
        "type": "task_assigned",
        "from": actor.name,
        "body": {"text": text},
    });
    ssr::console()?
        .send_to_inbox(&actor, &handle, &envelope.to_string())
        .await
        .map_err(ssr::fail)
}

/// Everybody who may sign in.
#[server(endpoint = "people")]
pub async fn people() -> Result<Vec<PersonView>, AppError> {
    ssr::person().await?;
    ssr::console()?.people().await.map_err(ssr::fail)
}

/// Add a person with a generated password, to be changed at their first
/// sign-in (admins only; audited).
#[server(endpoint = "add_person")]
pub async fn add_person(name: String, role: String) -> Result<NewPerson, AppError> {
    // The console checks the role itself, so a refusal is audited too.
    let actor = ssr::person().await?;
    let role = ssr::role_named(&role).map_err(ssr::fail)?;
    ssr::console()?
        .add_person(&actor, &name, role)
        .await
        .map_err(ssr::fail)
}

/// Remove a person of the node's database (admins only; audited).
#[server(endpoint = "remove_person")]
pub async fn remove_person(name: String) -> Result<(), AppError> {
    let actor = ssr::person().await?;
    ssr::console()?
        .remove_person(&actor, &name)
        .await
        .map_err(ssr::fail)
}

/// Change a person's role (admins only; audited).
#[server(endpoint = "set_person_role")]
pub async fn set_person_role(name: String, role: String) -> Result<(), AppError> {
    let actor = ssr::person().await?;
    let role = ssr::role_named(&role).map_err(ssr::fail)?;
    ssr::console()?
        .set_person_role(&actor, &name, role)
        .await
        .map_err(ssr::fail)
}

/// Give a person a new generated password, to be changed at their next
/// sign-in (admins only; audited).
#[server(endpoint = "reset_password")]
pub async fn reset_password(name: String) -> Result<NewPerson, AppError> {
    let actor = ssr::person().await?;
    ssr::console()?
        .reset_password(&actor, &name)
        .await
        .map_err(ssr::fail)
}

/// One page (page 1: the newest 200) of the fleet's audited actions,
/// only those of `seat`, `person` and `action` when not empty, and only
/// refusals with `refused`.
#[server(endpoint = "audit_log")]
pub async fn audit_log(
    #[server(default)] seat: String,
    #[server(default)] person: String,
    #[server(default)] action: String,
    #[server(default)] refused: bool,
    #[server(default)] page: u32,
) -> Result<AuditView, AppError> {
    ssr::person().await?;
    let given = |name: &str, v: String| -> Result<Option<String>, AppError> {
        let v = v.trim().to_string();
        if v.chars().count() > 200 {
            return Err(ssr::fail(crate::console::ConsoleError::Invalid(format!(
                "{name}: at most 200 characters."
            ))));
        }
        Ok(Some(v).filter(|v| !v.is_empty()))
    };
    let filter = crate::api::AuditFilter {
        seat: given("seat", seat)?,
        person: given("person", person)?,
        action: given("action", action)?,
        refused,
    };
    ssr::console()?
        .audit(filter, page.max(1))
        .await
        .map_err(ssr::fail)
}

/// Pause a seat fleet-wide; with `stop_running_turn` its running turn also
/// stops at its next round (operators only; audited).
#[server(endpoint = "pause_seat")]
pub async fn pause_seat(
    handle: String,
    #[server(default)] reason: Option<String>,
    #[server(default)] stop_running_turn: bool,
) -> Result<SeatActionResult, AppError> {
    let actor = ssr::person().await?;
    ssr::console()?
        .pause(&actor, &handle, reason, stop_running_turn)
        .await
        .map_err(ssr::fail)
}

/// Resume a paused seat (operators only; audited).
#[server(endpoint = "resume_seat")]
pub async fn resume_seat(handle: String) -> Result<SeatActionResult, AppError> {
    let actor = ssr::person().await?;
    ssr::console()?
        .resume(&actor, &handle)
        .await
        .map_err(ssr::fail)
}

/// Ask a seat's running turn to stop at its next round (operators only;
/// audited).
#[server(endpoint = "stop_seat_turn")]
pub async fn stop_seat_turn(
    handle: String,
    #[server(default)] reason: Option<String>,
) -> Result<SeatActionResult, AppError> {
    let actor = ssr::person().await?;
    ssr::console()?
        .stop(&actor, &handle, reason)
        .await
        .map_err(ssr::fail)
}

/// The fleet's node priority order: as saved, and as every node ranks the
/// live fleet now.
#[server(endpoint = "node_order")]
pub async fn node_order() -> Result<NodeOrderView, AppError> {
    ssr::person().await?;
    ssr::console()?.node_order().await.map_err(ssr::fail)
}

/// Save the fleet's node priority order (top first) against the revision
/// read (operators only; audited). A JSON body: the list does not fit a
/// form well.
#[server(endpoint = "save_node_order", input = server_fn::codec::Json)]
pub async fn save_node_order(
    nodes: Vec<String>,
    #[server(default)] revision: Option<u64>,
) -> Result<NodeOrderView, AppError> {
    let actor = ssr::person().await?;
    ssr::console()?
        .save_node_order(&actor, nodes, revision)
        .await
        .map_err(ssr::fail)
}

/// Ask that a seat run on a named node, with a reason (operators only;
/// audited).
#[server(endpoint = "move_seat")]
pub async fn move_seat(
    handle: String,
    node: String,
    #[server(default)] reason: String,
) -> Result<MoveRequestView, AppError> {
    let actor = ssr::person().await?;
    ssr::console()?
        .move_seat(&actor, &handle, &node, &reason)
        .await
        .map_err(ssr::fail)
}

/// Approve or deny one of a seat's tool calls, with a reason (operators
/// only; audited).
#[server(endpoint = "answer_approval")]
pub async fn answer_approval(
    handle: String,
    approval_id: String,
    approve: bool,
    #[server(default)] reason: String,
) -> Result<ApprovalView, AppError> {
    let actor = ssr::person().await?;
    ssr::console()?
        .answer_approval(&actor, &handle, &approval_id, approve, &reason)
        .await
        .map_err(ssr::fail)
}

/// The newest dead letters (only seat `seat`'s, when not empty), with how
/// many are kept.
#[server(endpoint = "dead_letters")]
pub async fn list_dead_letters(
    #[server(default)] seat: String,
) -> Result<DeadLetterList, AppError> {
    ssr::person().await?;
    let seat = Some(seat.trim()).filter(|s| !s.is_empty());
    ssr::console()?
        .dead_letters(seat, 200)
        .await
        .map_err(ssr::fail)
}

/// How many dead letters are kept (the menu's count).
#[server(endpoint = "dead_letter_count")]
pub async fn dead_letter_count() -> Result<u64, AppError> {
    ssr::person().await?;
    ssr::console()?.dead_letter_count().await.map_err(ssr::fail)
}

/// Publish dead letter `id` again to its seat's inbox, or (`discard`)
/// remove it for good — operators only, audited.
#[server(endpoint = "dead_letter_action")]
pub async fn dead_letter_action(
    id: u64,
    #[server(default)] discard: bool,
) -> Result<DeadLetterActionResult, AppError> {
    let actor = ssr::person().await?;
    let console = ssr::console()?;
    if discard {
        console.discard_dead_letter(&actor, id).await
    } else {
        console.requeue_dead_letter(&actor, id).await
    }
    .map_err(ssr::fail)
}
