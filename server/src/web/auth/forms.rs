//! The sign-in, sign-out and password-change forms: each checks its form,
//! audits what it decided, and answers with a redirect or a page a person
//! can read.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Extension, Form};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use serde::Deserialize;
use tower_sessions::Session;

use app::api::Person;

use super::{
    Auth, HOME, MAX_NAME_CHARS, PASSWORD_PAGE, PasswordChange, SESSION_PERSON, SESSION_STAMP,
    SessionEnd, SignIn, audit_or_log, local_path, url_encode,
};
use crate::audit;

#[derive(Deserialize)]
pub struct LoginForm {
    name: String,
    password: String,
    #[serde(default)]
    next: String,
}

/// The name as an audit row keeps it (whatever a stranger typed).
fn audit_name(name: &str) -> String {
    let shown: String = name
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_NAME_CHARS)
        .collect();
    if shown.is_empty() {
        "(no name)".into()
    } else {
        shown
    }
}

/// `/login?error=…` keeping `next` and the name typed.
fn back_to_sign_in(error: &str, name: &str, next: &str) -> String {
    let mut to = format!("/login?error={error}");
    let next = local_path(next);
    if next != HOME {
        to.push_str(&format!("&next={}", url_encode(next)));
    }
    let name = audit_name(name);
    if !name.starts_with('(') {
        to.push_str(&format!("&name={}", url_encode(&name)));
    }
    to
}

/// A 429 a person can read: the sentence, when to try again, and the way
/// back to the sign-in form.
fn too_many(sentence: &str, retry_after: Duration, back: &str) -> Response {
    let secs = retry_after.as_secs_f64().ceil().max(1.0) as u64;
    let body = format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Try again soon · Crewlet</title><link rel=\"stylesheet\" href=\"/pkg/crewlet.css\"></head><body><main class=\"login\"><div class=\"card login-card\"><h1>Crewlet node</h1><p class=\"notice notice-error\" role=\"alert\">{sentence} Try again in {secs} second{}.</p><p><a href=\"{back}\">Back to sign-in</a></p></div></main></body></html>",
        if secs == 1 { "" } else { "s" },
        back = html_attr(back),
    );
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, secs.to_string())],
        Html(body),
    )
        .into_response()
}

fn html_attr(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

async fn audit_sign_in(auth: &Auth, name: &str, client: IpAddr, result: &str) {
    let from = format!("from {client}");
    audit_or_log(
        &auth.pool,
        &audit_name(name),
        "session.sign_in",
        &from,
        result,
    )
    .await;
}

/// `POST /login`: check the form, cycle the session id, store the person.
/// Every refusal is audited with the name and the client's address.
pub async fn login(
    Extension(auth): Extension<Arc<Auth>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    session: Session,
    Form(form): Form<LoginForm>,
) -> Response {
    let name = form.name.trim();
    let client = auth.client(peer.ip(), &headers);
    let answer = auth.sign_in(client, name, &form.password).await;
    crate::metrics::apply(&crate::metrics::Update::count(
        crate::metrics::SIGN_INS,
        "outcome",
        sign_in_outcome(&answer),
    ));
    match answer {
        Ok(SignIn::Ok(person)) => {
            if let Err(e) = session.cycle_id().await {
                tracing::error!(error = %e, "cannot cycle the session id");
                return (StatusCode::INTERNAL_SERVER_ERROR, "session store failed").into_response();
            }
            let stamp = match auth.standing(&person.name).await {
                Ok(Some(s)) => s.stamp,
                _ => String::new(),
            };
            if let Err(e) = session.insert(SESSION_PERSON, &person).await {
                tracing::error!(error = %e, "cannot store the session");
                return (StatusCode::INTERNAL_SERVER_ERROR, "session store failed").into_response();
            }
            if let Err(e) = session.insert(SESSION_STAMP, &stamp).await {
                tracing::error!(error = %e, "cannot store the session");
                return (StatusCode::INTERNAL_SERVER_ERROR, "session store failed").into_response();
            }
            audit_sign_in(&auth, &person.name, client, "ok").await;
            tracing::info!(person = %person.name, role = %person.role, "signed in");
            let next = local_path(&form.next);
            if person.must_change_password {
                return Redirect::to(&format!("{PASSWORD_PAGE}?next={}", url_encode(next)))
                    .into_response();
            }
            Redirect::to(next).into_response()
        }
        Ok(SignIn::Refused) => {
            tracing::info!(%client, "sign-in refused");
            audit_sign_in(&auth, name, client, "refused: wrong name or password").await;
            Redirect::to(&back_to_sign_in("1", name, &form.next)).into_response()
        }
        Ok(SignIn::Limited { retry_after, audit }) => {
            tracing::warn!(%client, "sign-in rate limited");
            if audit {
                audit_sign_in(
                    &auth,
                    name,
                    client,
                    &format!(
                        "refused: too many attempts, the next in {} s (later refusals in this wait are not written)",
                        retry_after.as_secs_f64().ceil() as u64
                    ),
                )
                .await;
            }
            too_many(
                "Too many sign-in attempts from here or for this name.",
                retry_after,
                &back_to_sign_in("limited", name, &form.next),
            )
        }
        Ok(SignIn::Busy) => {
            tracing::warn!(%client, "sign-in refused: every password check is busy");
            if auth.audit_busy_now() {
                audit_sign_in(
                    &auth,
                    name,
                    client,
                    "refused: the node was checking too many passwords at once (such refusals are written at most once a second)",
                )
                .await;
            }
            too_many(
                "The node is checking too many sign-ins at once.",
                Duration::from_secs(1),
                &back_to_sign_in("busy", name, &form.next),
            )
        }
        Err(e) => {
            tracing::error!(error = %e, "sign-in failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the node cannot check passwords right now",
            )
                .into_response()
        }
    }
}

/// Pure: a sign-in attempt's outcome as `crewlet_sign_ins_total` counts it.
pub(super) fn sign_in_outcome<E>(answer: &Result<SignIn, E>) -> &'static str {
    match answer {
        Ok(SignIn::Ok(_)) => "ok",
        Ok(SignIn::Refused) => "refused",
        Ok(SignIn::Limited { .. }) => "limited",
        Ok(SignIn::Busy) => "busy",
        Err(_) => "failed",
    }
}

/// `POST /logout`: end the session and every event stream opened with it.
pub async fn logout(Extension(auth): Extension<Arc<Auth>>, session: Session) -> Response {
    if let Ok(Some(p)) = session.get::<Person>(SESSION_PERSON).await
        && let Err(e) =
            audit::record(&auth.pool, &p.name, "session.sign_out", None, None, "ok").await
    {
        tracing::error!(error = %e, "cannot write the audit log");
    }
    if let Some(id) = session.id() {
        auth.end_streams(SessionEnd::Session(id.to_string()));
    }
    if let Err(e) = session.flush().await {
        tracing::error!(error = %e, "cannot end the session");
    }
    Redirect::to("/login?signed_out=1").into_response()
}

#[derive(Deserialize)]
pub struct PasswordForm {
    current: String,
    new: String,
    confirm: String,
    #[serde(default)]
    next: String,
}

/// `POST /account/password`: a signed-in person changes their own
/// password (the current one proves it is them). Audited.
pub async fn change_password(
    Extension(auth): Extension<Arc<Auth>>,
    Extension(person): Extension<Person>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    session: Session,
    Form(form): Form<PasswordForm>,
) -> Response {
    let back = |error: &str| {
        let next = local_path(&form.next);
        let mut to = format!("{PASSWORD_PAGE}?error={error}");
        if next != HOME {
            to.push_str(&format!("&next={}", url_encode(next)));
        }
        Redirect::to(&to).into_response()
    };
    if person.via_token {
        return back("token");
    }
    if form.new != form.confirm {
        return back("mismatch");
    }
    let client = auth.client(peer.ip(), &headers);
    let outcome = match auth
        .change_password(client, &person.name, &form.current, &form.new)
        .await
    {
        Ok(o) => o,
        Err(e) => {
            tracing::error!(error = %e, "cannot change a password");
            return back("unavailable");
        }
    };
    let result = match &outcome {
        PasswordChange::Changed => "ok".to_string(),
        PasswordChange::WrongPassword => "refused: the current password was wrong".into(),
        PasswordChange::Weak => "refused: the new password's length".into(),
        PasswordChange::Unchanged => "refused: the new password is the current one".into(),
        PasswordChange::InFile => "refused: defined in the company file".into(),
        PasswordChange::Limited(_) => "refused: too many attempts".into(),
    };
    if let Err(e) = audit::record(
        &auth.pool,
        &person.name,
        "person.change_own_password",
        None,
        None,
        &result,
    )
    .await
    {
        tracing::error!(error = %e, "cannot write the audit log");
    }
    match outcome {
        PasswordChange::Changed => {
            let updated = Person {
                must_change_password: false,
                ..person
            };
            if let Err(e) = session.insert(SESSION_PERSON, &updated).await {
                tracing::error!(error = %e, "cannot store the session");
            }
            // This session goes on under the new password; every other
            // session of theirs has ended, and their streams with them.
            if let Ok(Some(now)) = auth.standing(&updated.name).await
                && let Err(e) = session.insert(SESSION_STAMP, &now.stamp).await
            {
                tracing::error!(error = %e, "cannot store the session");
            }
            auth.end_streams(SessionEnd::Person(updated.name.clone()));
            let next = local_path(&form.next);
            let sep = if next.contains('?') { '&' } else { '?' };
            Redirect::to(&format!("{next}{sep}password_changed=1")).into_response()
        }
        PasswordChange::WrongPassword => back("current"),
        PasswordChange::Weak => back("length"),
        PasswordChange::Unchanged => back("same"),
        PasswordChange::InFile => back("file"),
        PasswordChange::Limited(_) => back("limited"),
    }
}
