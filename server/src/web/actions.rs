//! The JSON routes by which an operator acts (docs/http-and-cli.md § HTTP):
//! apply a company file, send an envelope to a seat's inbox, and pause,
//! resume or stop a seat. Each reads its body within the route's limit,
//! checks the body's fields by name, and hands the action to the
//! [`Console`](app::console::Console), which checks the person's role and
//! audits it.

use axum::Json;
use axum::extract::Extension;
use axum::extract::rejection::StringRejection;
use axum::response::IntoResponse;

use app::console::SharedConsole;

use super::{console_error, read_body};

/// `POST /api/company`: the body is a company file (TOML); its company
/// and roles become the next active revision. Admins only: anyone else is
/// refused (and audited) before a byte of the body is read, and an
/// admin's file may be up to [`COMPANY_BODY`](super::COMPANY_BODY).
pub(super) async fn apply_company(
    Extension(console): Extension<SharedConsole>,
    Extension(person): Extension<app::api::Person>,
    body: axum::body::Body,
) -> axum::response::Response {
    let body = if person.is_admin() {
        match read_company_file(body).await {
            Ok(b) => b,
            Err(r) => return *r,
        }
    } else {
        // The console refuses a person who is not an admin before it looks
        // at the file.
        String::new()
    };
    match console.apply_company(&person, &body).await {
        Ok(revision) => Json(serde_json::json!({ "revision": revision })).into_response(),
        Err(e) => console_error(e),
    }
}

/// An admin's company file, read within [`COMPANY_BODY`](super::COMPANY_BODY).
async fn read_company_file(
    body: axum::body::Body,
) -> Result<String, Box<axum::response::Response>> {
    use axum::http::StatusCode;
    use http_body_util::BodyExt;
    let refuse = |status: StatusCode, why: String| {
        Box::new((status, Json(serde_json::json!({ "error": why }))).into_response())
    };
    let limited = http_body_util::Limited::new(body, super::COMPANY_BODY);
    let bytes = match limited.collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the company file is too large: at most {} MiB; split the company or shorten its roles",
                    super::COMPANY_BODY / (1024 * 1024)
                ),
            ));
        }
        Err(e) => {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                format!("the body cannot be read: {e}"),
            ));
        }
    };
    String::from_utf8(bytes.to_vec()).map_err(|_| {
        refuse(
            StatusCode::BAD_REQUEST,
            "the company file is not UTF-8 text".into(),
        )
    })
}

/// `POST /api/seats/{handle}/inbox`: publish one envelope to the seat's
/// inbox (operators only). Answers `{"id": …}`.
pub(super) async fn send_to_inbox(
    Extension(console): Extension<SharedConsole>,
    Extension(person): Extension<app::api::Person>,
    axum::extract::Path(handle): axum::extract::Path<String>,
    body: Result<String, StringRejection>,
) -> axum::response::Response {
    let body = match read_body(body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    match console.send_to_inbox(&person, &handle, &body).await {
        Ok(id) => Json(serde_json::json!({ "id": id })).into_response(),
        Err(e) => console_error(e),
    }
}

/// The body of a seat action: a JSON object whose fields are all optional
/// (an empty body is `{}`). Each field's type is checked here so that a
/// malformed body is refused with the field's name.
struct SeatActionBody {
    reason: Option<String>,
    stop_running_turn: bool,
}

impl SeatActionBody {
    /// Read `body`, which may carry only the fields in `allowed`.
    fn parse(body: &str, allowed: &[&str]) -> Result<SeatActionBody, app::console::ConsoleError> {
        use app::console::ConsoleError;
        let mut out = SeatActionBody {
            reason: None,
            stop_running_turn: false,
        };
        if body.trim().is_empty() {
            return Ok(out);
        }
        let hint = if allowed.is_empty() {
            "send no body (or {})".to_string()
        } else {
            let fields = allowed
                .iter()
                .map(|f| format!("\"{f}\""))
                .collect::<Vec<_>>()
                .join(" and ");
            format!("send a JSON object with {fields}, each optional")
        };
        let value: serde_json::Value = serde_json::from_str(body)
            .map_err(|e| ConsoleError::Invalid(format!("the body is not JSON ({e}); {hint}.")))?;
        let serde_json::Value::Object(map) = value else {
            return Err(ConsoleError::Invalid(format!(
                "the body is not a JSON object; {hint}."
            )));
        };
        for (key, v) in map {
            if !allowed.contains(&key.as_str()) {
                return Err(ConsoleError::Invalid(format!(
                    "{key}: not a field of this request; {hint}."
                )));
            }
            match (key.as_str(), v) {
                (_, serde_json::Value::Null) => {}
                ("reason", serde_json::Value::String(r)) => out.reason = Some(r),
                ("reason", _) => {
                    return Err(ConsoleError::Invalid(
                        "reason: must be a string (or absent).".into(),
                    ));
                }
                ("stop_running_turn", serde_json::Value::Bool(b)) => out.stop_running_turn = b,
                ("stop_running_turn", _) => {
                    return Err(ConsoleError::Invalid(
                        "stop_running_turn: must be true or false (or absent).".into(),
                    ));
                }
                _ => {}
            }
        }
        Ok(out)
    }
}

fn seat_action_answer(
    r: Result<app::api::SeatActionResult, app::console::ConsoleError>,
) -> axum::response::Response {
    match r {
        Ok(done) => Json(done).into_response(),
        Err(e) => console_error(e),
    }
}

/// `POST /api/seats/{handle}/pause`: body `{"reason", "stop_running_turn"}`
/// (both optional). Pauses the seat fleet-wide (operators only). Answers
/// `{"seat", "result"}`.
pub(super) async fn pause_seat(
    Extension(console): Extension<SharedConsole>,
    Extension(person): Extension<app::api::Person>,
    axum::extract::Path(handle): axum::extract::Path<String>,
    body: Result<String, StringRejection>,
) -> axum::response::Response {
    let body = match read_body(body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let body = match SeatActionBody::parse(&body, &["reason", "stop_running_turn"]) {
        Ok(b) => b,
        Err(e) => return console_error(e),
    };
    seat_action_answer(
        console
            .pause(&person, &handle, body.reason, body.stop_running_turn)
            .await,
    )
}

/// `POST /api/seats/{handle}/resume`: no body. Resumes the seat (operators
/// only). Answers `{"seat", "result"}`.
pub(super) async fn resume_seat(
    Extension(console): Extension<SharedConsole>,
    Extension(person): Extension<app::api::Person>,
    axum::extract::Path(handle): axum::extract::Path<String>,
    body: Result<String, StringRejection>,
) -> axum::response::Response {
    let body = match read_body(body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    if let Err(e) = SeatActionBody::parse(&body, &[]) {
        return console_error(e);
    }
    seat_action_answer(console.resume(&person, &handle).await)
}

/// `POST /api/seats/{handle}/stop`: body `{"reason"}` (optional). Asks the
/// seat's running turn to stop at its next round (operators only). Answers
/// `{"seat", "result"}`.
pub(super) async fn stop_seat_turn(
    Extension(console): Extension<SharedConsole>,
    Extension(person): Extension<app::api::Person>,
    axum::extract::Path(handle): axum::extract::Path<String>,
    body: Result<String, StringRejection>,
) -> axum::response::Response {
    let body = match read_body(body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let body = match SeatActionBody::parse(&body, &["reason"]) {
        Ok(b) => b,
        Err(e) => return console_error(e),
    };
    seat_action_answer(console.stop(&person, &handle, body.reason).await)
}
