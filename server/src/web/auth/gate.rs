//! The gate every request passes through: cross-site refusal, the public
//! paths, a bearer token on JSON endpoints, and the session, whose person
//! is read again on every request.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Extension, Request};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use tower_sessions::Session;

use app::api::Person;

use super::{Auth, SESSION_PERSON, local_path, session_current, url_encode};

/// True when a state-changing request comes from another site.
pub fn cross_site(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return !matches!(site.to_str().unwrap_or(""), "same-origin" | "none");
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("null");
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        let authority = origin
            .split_once("://")
            .map(|(_, rest)| rest.trim_end_matches('/'))
            .unwrap_or("");
        return authority.is_empty() || !authority.eq_ignore_ascii_case(host);
    }
    false
}

/// The client of `req`, as [`Auth::client`] reads it (loopback when the
/// connection's address is not known).
fn client_of(auth: &Auth, req: &Request) -> IpAddr {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
        .unwrap_or(IpAddr::from([127, 0, 0, 1]));
    auth.client(peer, req.headers())
}

/// Paths anyone may reach (and `/health`, which answers liveness only
/// without a sign-in or a token).
fn public(path: &str) -> bool {
    matches!(path, "/login" | "/logout" | "/favicon.ico") || path.starts_with("/pkg/")
}

/// The page where a person changes their own password.
pub const PASSWORD_PAGE: &str = "/account/password";

/// What a person whose password must be changed may still reach.
fn open_while_password_must_change(path: &str) -> bool {
    path == PASSWORD_PAGE || path == "/api/whoami"
}

/// JSON endpoints, where a bearer token is accepted in place of a session.
fn token_path(path: &str) -> bool {
    path.starts_with("/query/")
        || path == "/metrics"
        || path == "/api/events"
        || path == "/api/events/history"
        || path == "/api/company"
        || path == "/api/dead-letters"
        || path.starts_with("/api/dead-letters/")
        || path == "/api/memory"
        || path == "/api/nodes/order"
        || path.starts_with("/api/seats/")
}

fn is_safe(m: &Method) -> bool {
    matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// A dashboard server function (`POST /api/{fn}`): its errors are the
/// dashboard's typed `AppError`, so a page can tell an ended session from
/// a node it cannot reach.
fn server_fn_path(path: &str) -> bool {
    path.starts_with("/api/") && !token_path(path) && !path.starts_with("/api/events")
}

/// 401 for `path`: the server functions' "not signed in" (which the
/// dashboard reads as "your session ended"), else `{"error": msg}`.
fn unauthorized_at(path: &str, msg: &str) -> Response {
    if !server_fn_path(path) {
        return unauthorized(msg);
    }
    let body = serde_json::to_string(&app::error::AppError::NotSignedIn).unwrap_or_default();
    (
        StatusCode::UNAUTHORIZED,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

pub(super) fn unauthorized(msg: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        axum::Json(serde_json::json!({ "error": msg })),
    )
        .into_response()
}

fn wants_page(req: &Request, path: &str) -> bool {
    req.method() == Method::GET
        && !path.starts_with("/api/")
        && !path.starts_with("/query/")
        && path != "/metrics"
}

/// Where a page request goes to sign in, coming back here afterwards.
fn to_sign_in(req: &Request) -> Response {
    let next_path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    Redirect::to(&format!(
        "/login?next={}",
        url_encode(local_path(&next_path))
    ))
    .into_response()
}

/// The gate's answer for `/health` and for a bearer token on a JSON
/// endpoint (`None`: neither; the session decides). `/health` lets anyone
/// through — its detail only for a signed-in person or a token, whose
/// [`Person`] goes into the request — and a token's person goes into the
/// request, or its refusal is the answer.
async fn by_token_or_liveness(
    auth: &Auth,
    session: &Session,
    path: &str,
    req: &mut Request,
) -> Option<Result<(), Response>> {
    let presented = req.headers().get(header::AUTHORIZATION).map(|value| {
        value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .unwrap_or("")
            .to_string()
    });
    if let Some(t) = &presented
        && (path == "/health" || token_path(path))
    {
        let person = auth.bearer(client_of(auth, req), t, path).await;
        return Some(person.map(|p| {
            req.extensions_mut().insert(p);
        }));
    }
    if path != "/health" {
        return None;
    }
    if let Ok(Some(p)) = session.get::<Person>(SESSION_PERSON).await
        && let Ok(Some(now)) = auth.standing(&p.name).await
        && session_current(session, &now).await
    {
        req.extensions_mut().insert(p);
    }
    Some(Ok(()))
}

/// The gate: cross-site refusal for every state-changing request, then a
/// session (or, on JSON endpoints, a bearer token) for everything not
/// public. A session's person is read again on every request — their role
/// as it is now, or the end of the session when they were removed — and
/// one whose password must change reaches only the page that changes it.
/// The identity goes into the request's extensions as [`Person`].
pub async fn gate(
    Extension(auth): Extension<Arc<Auth>>,
    session: Session,
    mut req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path().to_string();
    if !is_safe(req.method()) && cross_site(req.headers()) {
        tracing::warn!(path, "cross-site request refused");
        if path == "/login" {
            return Redirect::to("/login?error=origin").into_response();
        }
        return (
            StatusCode::FORBIDDEN,
            axum::Json(serde_json::json!({ "error": "cross-site requests are refused" })),
        )
            .into_response();
    }
    if public(&path) {
        return next.run(req).await;
    }
    if let Some(answer) = by_token_or_liveness(&auth, &session, &path, &mut req).await {
        return match answer {
            Ok(()) => next.run(req).await,
            Err(refused) => refused,
        };
    }
    let signed_in = match session.get::<Person>(SESSION_PERSON).await {
        Ok(Some(p)) => p,
        _ => {
            return if wants_page(&req, &path) {
                to_sign_in(&req)
            } else {
                unauthorized_at(
                    &path,
                    "sign in, or present a bearer token on JSON endpoints",
                )
            };
        }
    };
    let person = match auth.standing(&signed_in.name).await {
        Ok(Some(now)) if session_current(&session, &now).await => Person {
            role: now.role,
            must_change_password: now.must_change_password,
            ..signed_in
        },
        Ok(_) => {
            // Removed since they signed in, or their password changed
            // since (elsewhere): the session ends here.
            let _ = session.flush().await;
            return if wants_page(&req, &path) {
                to_sign_in(&req)
            } else {
                unauthorized_at(
                    &path,
                    "your session ended: you can no longer sign in to this node",
                )
            };
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot read the signed-in person");
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(serde_json::json!({ "error": "the node cannot read its people right now; try again" })),
            )
                .into_response();
        }
    };
    if person.must_change_password && !open_while_password_must_change(&path) {
        return if wants_page(&req, &path) {
            Redirect::to(&format!(
                "{PASSWORD_PAGE}?next={}",
                url_encode(local_path(
                    req.uri()
                        .path_and_query()
                        .map(|p| p.as_str())
                        .unwrap_or("/")
                ))
            ))
            .into_response()
        } else {
            (
                StatusCode::FORBIDDEN,
                axum::Json(serde_json::json!({ "error": format!("{} must choose a new password first: open {PASSWORD_PAGE}", person.name) })),
            )
                .into_response()
        };
    }
    req.extensions_mut().insert(person);
    next.run(req).await
}
