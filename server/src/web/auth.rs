//! Who may use the dashboard and the JSON endpoints, and how they prove it.
//!
//! People come from the company file (`[[auth.users]]`) and from the node's
//! database (`people`); API tokens from `[[auth.tokens]]`. Passwords are
//! argon2 PHC strings and tokens are stored as SHA-256 digests: no secret
//! is kept or logged in the clear. Sign-in failures are generic (they never
//! say whether the name exists) and rate limited per client address and per
//! name. This module owns the sign-in gate every request passes through.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use axum::extract::{ConnectInfo, Extension, Form, Request};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use rand::Rng;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use sqlx::SqlitePool;
use tower_sessions::Session;

use app::api::{Person, PersonRole, PersonView};

use crate::audit;
use crate::config::{AuthRole, AuthSection};

/// The session key the signed-in person is stored under.
const SESSION_PERSON: &str = "person";

/// Failed sign-ins allowed per client address (and per name) in one window.
pub const MAX_FAILURES: u32 = 5;
/// The rate-limit window.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("password hashing failed: {0}")]
    Hash(String),
}

fn role_of(r: AuthRole) -> PersonRole {
    match r {
        AuthRole::Viewer => PersonRole::Viewer,
        AuthRole::Operator => PersonRole::Operator,
    }
}

struct FileUser {
    name: String,
    hash: String,
    role: PersonRole,
}

struct Token {
    name: String,
    digest: [u8; 32],
    role: PersonRole,
}

/// The authority every request is checked against.
pub struct Auth {
    pool: SqlitePool,
    users: Vec<FileUser>,
    tokens: Vec<Token>,
    failures: Mutex<HashMap<String, (u32, Instant)>>,
    /// Verified against when a name is unknown, so the answer takes as long
    /// as for a known name.
    decoy: String,
}

/// The outcome of a sign-in attempt.
#[derive(Debug, PartialEq, Eq)]
pub enum SignIn {
    Ok(Person),
    /// Wrong name or password: the same answer for both.
    Refused,
    /// Too many recent failures from this address or for this name.
    Limited,
}

impl Auth {
    pub fn new(pool: SqlitePool, section: &AuthSection) -> Auth {
        let users = section
            .users
            .iter()
            .map(|u| FileUser {
                name: u.name.clone(),
                hash: u.password_hash.clone(),
                role: role_of(u.role),
            })
            .collect();
        let tokens = section
            .tokens
            .iter()
            .filter_map(|t| {
                let bytes = hex::decode(&t.sha256).ok()?;
                let digest: [u8; 32] = bytes.try_into().ok()?;
                Some(Token {
                    name: t.name.clone(),
                    digest,
                    role: role_of(t.role),
                })
            })
            .collect();
        let decoy = hash_password("decoy password never used").unwrap_or_default();
        Auth {
            pool,
            users,
            tokens,
            failures: Mutex::new(HashMap::new()),
            decoy,
        }
    }

    /// On a node with nobody who could sign in, create `admin` as an
    /// operator with a random password. Returns the password (to be shown
    /// once); only its hash is kept.
    pub async fn bootstrap_admin(&self) -> Result<Option<String>, AuthError> {
        if !self.users.is_empty() {
            return Ok(None);
        }
        let (count,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM people")
            .fetch_one(&self.pool)
            .await?;
        if count > 0 {
            return Ok(None);
        }
        let password = random_password();
        let hash = hash_blocking(password.clone()).await?;
        sqlx::query(
            "INSERT INTO people (name, password_hash, role, created_at, created_by) VALUES ('admin', ?, 'operator', ?, 'first start')",
        )
        .bind(hash)
        .bind(audit::now_rfc3339())
        .execute(&self.pool)
        .await?;
        Ok(Some(password))
    }

    async fn lookup(&self, name: &str) -> Result<Option<(String, PersonRole)>, AuthError> {
        if let Some(u) = self.users.iter().find(|u| u.name == name) {
            return Ok(Some((u.hash.clone(), u.role)));
        }
        let row: Option<(String, String)> =
            sqlx::query_as("SELECT password_hash, role FROM people WHERE name = ?")
                .bind(name)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.and_then(|(h, r)| PersonRole::parse(&r).map(|r| (h, r))))
    }

    fn limited(&self, keys: &[String]) -> bool {
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        f.retain(|_, (_, since)| now.duration_since(*since) < FAILURE_WINDOW);
        keys.iter()
            .any(|k| f.get(k).is_some_and(|(n, _)| *n >= MAX_FAILURES))
    }

    fn note_failure(&self, keys: &[String]) {
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        for k in keys {
            let e = f.entry(k.clone()).or_insert((0, now));
            e.0 += 1;
        }
    }

    /// Check a name and password from `client`.
    pub async fn sign_in(
        &self,
        client: IpAddr,
        name: &str,
        password: &str,
    ) -> Result<SignIn, AuthError> {
        let keys = [format!("ip:{client}"), format!("name:{name}")];
        if self.limited(&keys) {
            return Ok(SignIn::Limited);
        }
        let found = self.lookup(name).await?;
        let (hash, role) = match &found {
            Some((h, r)) => (h.clone(), Some(*r)),
            None => (self.decoy.clone(), None),
        };
        let ok = verify_blocking(hash, password.to_string()).await;
        match (ok, role) {
            (true, Some(role)) => Ok(SignIn::Ok(Person {
                name: name.to_string(),
                role,
                via_token: false,
            })),
            _ => {
                self.note_failure(&keys);
                Ok(SignIn::Refused)
            }
        }
    }

    /// The identity a bearer token stands for.
    pub fn token(&self, presented: &str) -> Option<Person> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        self.tokens
            .iter()
            .find(|t| constant_time_eq(&t.digest, &digest))
            .map(|t| Person {
                name: format!("token:{}", t.name),
                role: t.role,
                via_token: true,
            })
    }

    /// Everybody who may sign in.
    pub async fn people(&self) -> Result<Vec<PersonView>, AuthError> {
        let mut out: Vec<PersonView> = self
            .users
            .iter()
            .map(|u| PersonView {
                name: u.name.clone(),
                role: u.role,
                source: "file".into(),
            })
            .collect();
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT name, role FROM people ORDER BY name")
                .fetch_all(&self.pool)
                .await?;
        for (name, role) in rows {
            if let Some(role) = PersonRole::parse(&role)
                && !out.iter().any(|p| p.name == name)
            {
                out.push(PersonView {
                    name,
                    role,
                    source: "database".into(),
                });
            }
        }
        Ok(out)
    }

    /// Whether `name` is taken (file or database).
    pub async fn exists(&self, name: &str) -> Result<bool, AuthError> {
        Ok(self.lookup(name).await?.is_some())
    }

    /// Add a person to the database with a fresh random password.
    pub async fn add(&self, name: &str, role: PersonRole, by: &str) -> Result<String, AuthError> {
        let password = random_password();
        let hash = hash_blocking(password.clone()).await?;
        sqlx::query(
            "INSERT INTO people (name, password_hash, role, created_at, created_by) VALUES (?, ?, ?, ?, ?)",
        )
        .bind(name)
        .bind(hash)
        .bind(role.as_str())
        .bind(audit::now_rfc3339())
        .bind(by)
        .execute(&self.pool)
        .await?;
        Ok(password)
    }
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// A 20-character random password from an unambiguous alphabet.
pub fn random_password() -> String {
    const ALPHABET: &[u8] = b"abcdefghjkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let mut rng = rand::thread_rng();
    (0..20)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect()
}

/// An argon2id PHC string for `password`.
pub fn hash_password(password: &str) -> Result<String, AuthError> {
    let salt = SaltString::generate(&mut argon2::password_hash::rand_core::OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| AuthError::Hash(e.to_string()))
}

async fn hash_blocking(password: String) -> Result<String, AuthError> {
    tokio::task::spawn_blocking(move || hash_password(&password))
        .await
        .map_err(|e| AuthError::Hash(e.to_string()))?
}

async fn verify_blocking(hash: String, password: String) -> bool {
    tokio::task::spawn_blocking(move || {
        PasswordHash::new(&hash)
            .map(|h| {
                Argon2::default()
                    .verify_password(password.as_bytes(), &h)
                    .is_ok()
            })
            .unwrap_or(false)
    })
    .await
    .unwrap_or(false)
}

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

/// Paths anyone may reach.
fn public(path: &str) -> bool {
    matches!(
        path,
        "/login" | "/logout" | "/health" | "/metrics" | "/favicon.ico"
    ) || path.starts_with("/pkg/")
}

/// JSON endpoints, where a bearer token is accepted in place of a session.
fn token_path(path: &str) -> bool {
    path.starts_with("/query/")
        || path == "/api/events"
        || path == "/api/company"
        || path == "/api/dead-letters"
        || path == "/api/memory"
        || path == "/api/nodes/order"
        || path.starts_with("/api/seats/")
}

fn is_safe(m: &Method) -> bool {
    matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS)
}

fn unauthorized(msg: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        axum::Json(serde_json::json!({ "error": msg })),
    )
        .into_response()
}

/// The gate: cross-site refusal for every state-changing request, then a
/// session (or, on JSON endpoints, a bearer token) for everything not
/// public. The identity goes into the request's extensions as [`Person`].
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
    if token_path(&path)
        && let Some(value) = req.headers().get(header::AUTHORIZATION)
    {
        let presented = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        return match presented.and_then(|t| auth.token(t)) {
            Some(p) => {
                req.extensions_mut().insert(p);
                next.run(req).await
            }
            None => unauthorized("the bearer token is not one this node knows"),
        };
    }
    match session.get::<Person>(SESSION_PERSON).await {
        Ok(Some(p)) => {
            req.extensions_mut().insert(p);
            next.run(req).await
        }
        _ => {
            let wants_page = req.method() == Method::GET
                && !path.starts_with("/api/")
                && !path.starts_with("/query/");
            if wants_page {
                let next_path = req
                    .uri()
                    .path_and_query()
                    .map(|p| p.as_str().to_string())
                    .unwrap_or_else(|| "/".into());
                let q = url_encode(&next_path);
                Redirect::to(&format!("/login?next={q}")).into_response()
            } else {
                unauthorized("sign in, or present a bearer token on JSON endpoints")
            }
        }
    }
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[derive(Deserialize)]
pub struct LoginForm {
    name: String,
    password: String,
    #[serde(default)]
    next: String,
}

/// A redirect target is only ever a path on this site.
fn local_path(next: &str) -> &str {
    if next.starts_with('/') && !next.starts_with("//") && !next.contains('\\') && next != "/login"
    {
        next
    } else {
        "/settings/nodes"
    }
}

/// `POST /login`: check the form, cycle the session id, store the person.
pub async fn login(
    Extension(auth): Extension<Arc<Auth>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    session: Session,
    Form(form): Form<LoginForm>,
) -> Response {
    let name = form.name.trim();
    match auth.sign_in(peer.ip(), name, &form.password).await {
        Ok(SignIn::Ok(person)) => {
            if let Err(e) = session.cycle_id().await {
                tracing::error!(error = %e, "cannot cycle the session id");
                return (StatusCode::INTERNAL_SERVER_ERROR, "session store failed").into_response();
            }
            if let Err(e) = session.insert(SESSION_PERSON, &person).await {
                tracing::error!(error = %e, "cannot store the session");
                return (StatusCode::INTERNAL_SERVER_ERROR, "session store failed").into_response();
            }
            if let Err(e) =
                audit::record(&auth.pool, &person.name, "sign_in", None, None, "ok").await
            {
                tracing::error!(error = %e, "cannot write the audit log");
            }
            tracing::info!(person = %person.name, role = %person.role, "signed in");
            Redirect::to(local_path(&form.next)).into_response()
        }
        Ok(SignIn::Refused) => {
            tracing::info!(client = %peer.ip(), "sign-in refused");
            Redirect::to("/login?error=1").into_response()
        }
        Ok(SignIn::Limited) => {
            tracing::warn!(client = %peer.ip(), "sign-in rate limited");
            (
                StatusCode::TOO_MANY_REQUESTS,
                Redirect::to("/login?error=limited"),
            )
                .into_response()
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

/// `POST /logout`: end the session.
pub async fn logout(Extension(auth): Extension<Arc<Auth>>, session: Session) -> Response {
    if let Ok(Some(p)) = session.get::<Person>(SESSION_PERSON).await
        && let Err(e) = audit::record(&auth.pool, &p.name, "sign_out", None, None, "ok").await
    {
        tracing::error!(error = %e, "cannot write the audit log");
    }
    if let Err(e) = session.flush().await {
        tracing::error!(error = %e, "cannot end the session");
    }
    Redirect::to("/login").into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.insert(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        m
    }

    #[test]
    fn same_origin_requests_pass_the_cross_site_check() {
        assert!(!cross_site(&h(&[("sec-fetch-site", "same-origin")])));
        assert!(!cross_site(&h(&[
            ("origin", "http://127.0.0.1:3000"),
            ("host", "127.0.0.1:3000")
        ])));
        assert!(
            !cross_site(&h(&[])),
            "a script without Origin is not a browser"
        );
    }

    #[test]
    fn other_sites_fail_the_cross_site_check() {
        assert!(cross_site(&h(&[("sec-fetch-site", "cross-site")])));
        assert!(cross_site(&h(&[("sec-fetch-site", "same-site")])));
        assert!(cross_site(&h(&[
            ("origin", "http://evil.example"),
            ("host", "127.0.0.1:3000")
        ])));
        assert!(cross_site(&h(&[
            ("origin", "null"),
            ("host", "127.0.0.1:3000")
        ])));
    }

    #[test]
    fn redirect_after_sign_in_stays_on_this_site() {
        assert_eq!(local_path("/seats"), "/seats");
        assert_eq!(local_path("//evil.example/x"), "/settings/nodes");
        assert_eq!(local_path("https://evil.example"), "/settings/nodes");
        assert_eq!(local_path(""), "/settings/nodes");
    }

    #[test]
    fn generated_passwords_are_long_and_distinct() {
        let a = random_password();
        assert_eq!(a.len(), 20);
        assert_ne!(a, random_password());
    }
}
