//! Who may use the dashboard and the JSON endpoints, and how they prove it.
//!
//! People come from the company file (`[[auth.users]]`) and from the node's
//! database (`people`); API tokens from `[[auth.tokens]]`. Passwords are
//! argon2 PHC strings and tokens are stored as SHA-256 digests: no secret
//! is kept or logged in the clear. Sign-in failures are generic (they never
//! say whether the name exists); an attempt is counted by the [`limiter`]
//! before its password is checked, at most [`MAX_CONCURRENT_CHECKS`]
//! checks run at once, and every refusal is audited with the name and the
//! client's address. This module owns the sign-in gate every request passes
//! through: it reads the person's role again on every request, and ends
//! every event stream of a session that signed out or a person removed.

pub mod limiter;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use axum::extract::{ConnectInfo, Extension, Form, Request};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use rand::Rng;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use sqlx::SqlitePool;
use tokio::sync::{Semaphore, broadcast};
use tower_sessions::Session;

use app::api::{Person, PersonRole, PersonView};

use crate::audit;
use crate::config::{AuthRole, AuthSection, Network};
use limiter::{Admission, Limiter, Rule};

/// The session key the signed-in person is stored under.
const SESSION_PERSON: &str = "person";
/// The session key of the password stamp it was signed in under.
const SESSION_STAMP: &str = "stamp";

/// Is `session` signed in under the password `now` has?
async fn session_current(session: &Session, now: &Standing) -> bool {
    matches!(session.get::<String>(SESSION_STAMP).await, Ok(Some(s)) if s == now.stamp)
}

/// Password checks (argon2, about 19 MiB and tens of milliseconds each)
/// that run at once; an attempt that finds them all busy is answered 429
/// at once.
pub const MAX_CONCURRENT_CHECKS: usize = 4;

/// The shortest password a person may choose.
pub const MIN_PASSWORD_CHARS: usize = 12;
/// The longest password the node checks.
pub const MAX_PASSWORD_CHARS: usize = 256;
/// The longest sign-in name.
pub const MAX_NAME_CHARS: usize = 64;

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
        AuthRole::Admin => PersonRole::Admin,
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

/// Whose event streams must end now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionEnd {
    /// This session signed out.
    Session(String),
    /// This person was removed: every session of theirs.
    Person(String),
}

impl SessionEnd {
    /// Does this end the stream opened by `person` under `session`?
    pub fn ends(&self, session: Option<&str>, person: &str) -> bool {
        match self {
            SessionEnd::Session(id) => session == Some(id.as_str()),
            SessionEnd::Person(name) => name == person,
        }
    }
}

/// A person as the node knows them now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Standing {
    pub role: PersonRole,
    pub must_change_password: bool,
    /// `file` or `database`.
    pub from_file: bool,
    /// A digest of the person's password hash as it is now: a session
    /// signed in under another (the password changed or was reset since)
    /// has ended.
    pub stamp: String,
}

/// Pure: the stamp of a password hash ([`Standing::stamp`]).
pub fn stamp_of(hash: &str) -> String {
    hex::encode(&Sha256::digest(hash.as_bytes())[..8])
}

/// The authority every request is checked against.
pub struct Auth {
    pool: SqlitePool,
    users: Vec<FileUser>,
    tokens: Vec<Token>,
    limiter: Mutex<Limiter>,
    checks: Semaphore,
    /// Password checks run since start (every argon2 verification).
    checked: AtomicU64,
    /// Verified against when a name is unknown, so the answer takes as long
    /// as for a known name.
    decoy: String,
    trusted: Vec<Network>,
    ends: broadcast::Sender<SessionEnd>,
    /// When a refusal for a full set of checks was last audited (they are
    /// audited at most once a second: a flood must not fill the log).
    busy_audited: Mutex<Option<Instant>>,
}

/// The outcome of a sign-in attempt.
#[derive(Debug, PartialEq, Eq)]
pub enum SignIn {
    Ok(Person),
    /// Wrong name or password: the same answer for both.
    Refused,
    /// Too many recent attempts from this address or for this name: try
    /// again after this long. `audit` is false for the refusals after the
    /// first in one wait (they are not written, so a flood cannot fill the
    /// audit log).
    Limited {
        retry_after: Duration,
        audit: bool,
    },
    /// Every password check is busy: try again in a moment.
    Busy,
}

/// The limiter's keys for an attempt on `name` from `client`.
fn attempt_keys(client: IpAddr, name: &str) -> [(String, Rule); 3] {
    [
        (format!("ip:{client}"), limiter::BY_ADDRESS),
        (
            format!("name:{name}@{client}"),
            limiter::BY_NAME_FROM_ADDRESS,
        ),
        (format!("name:{name}"), limiter::BY_NAME),
    ]
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
            limiter: Mutex::new(Limiter::default()),
            checks: Semaphore::new(MAX_CONCURRENT_CHECKS),
            checked: AtomicU64::new(0),
            decoy,
            trusted: section
                .trusted_proxies
                .iter()
                .filter_map(|t| Network::parse(t))
                .collect(),
            ends: broadcast::channel(256).0,
            busy_audited: Mutex::new(None),
        }
    }

    /// Whether a refusal for busy checks should be audited now (at most
    /// once a second).
    fn audit_busy_now(&self) -> bool {
        let mut last = self.busy_audited.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            return false;
        }
        *last = Some(now);
        true
    }

    /// On a node with nobody who could sign in, create `admin` as an admin
    /// with a random password that must be changed at the first sign-in.
    /// Returns the password (to be shown once); only its hash is kept.
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
            "INSERT INTO people (name, password_hash, role, created_at, created_by, must_change_password) VALUES ('admin', ?, 'admin', ?, 'first start', 1)",
        )
        .bind(hash)
        .bind(crate::clock::now_rfc3339())
        .execute(&self.pool)
        .await?;
        Ok(Some(password))
    }

    async fn lookup(&self, name: &str) -> Result<Option<(String, Standing)>, AuthError> {
        if let Some(u) = self.users.iter().find(|u| u.name == name) {
            return Ok(Some((
                u.hash.clone(),
                Standing {
                    role: u.role,
                    must_change_password: false,
                    from_file: true,
                    stamp: stamp_of(&u.hash),
                },
            )));
        }
        let row: Option<(String, String, i64)> = sqlx::query_as(
            "SELECT password_hash, role, must_change_password FROM people WHERE name = ?",
        )
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.and_then(|(h, r, must)| {
            PersonRole::parse(&r).map(|role| {
                (
                    h.clone(),
                    Standing {
                        role,
                        must_change_password: must != 0,
                        from_file: false,
                        stamp: stamp_of(&h),
                    },
                )
            })
        }))
    }

    /// How `name` stands now (`None`: they can no longer sign in).
    pub async fn standing(&self, name: &str) -> Result<Option<Standing>, AuthError> {
        Ok(self.lookup(name).await?.map(|(_, s)| s))
    }

    /// The client a request came from: the TCP peer, or — when the peer is
    /// one of `auth.trusted_proxies` — the address its `X-Forwarded-For`
    /// names.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let forwarded = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>()
            .join(",");
        client_address(
            peer,
            Some(&forwarded)
                .filter(|f| !f.is_empty())
                .map(|f| f.as_str()),
            &self.trusted,
        )
    }

    /// Password checks run since the node started.
    pub fn password_checks(&self) -> u64 {
        self.checked.load(Ordering::Relaxed)
    }

    /// Verify `password` against `hash` on a blocking thread, counted.
    async fn verify(&self, hash: String, password: String) -> bool {
        self.checked.fetch_add(1, Ordering::Relaxed);
        verify_blocking(hash, password).await
    }

    /// Check a name and password from `client`. The attempt is counted
    /// before the password is checked.
    pub async fn sign_in(
        &self,
        client: IpAddr,
        name: &str,
        password: &str,
    ) -> Result<SignIn, AuthError> {
        let Ok(_permit) = self.checks.try_acquire() else {
            return Ok(SignIn::Busy);
        };
        let keys = attempt_keys(client, name);
        let admitted = self.admit(&keys);
        if let Admission::Wait { retry_after, first } = admitted {
            return Ok(SignIn::Limited {
                retry_after,
                audit: first,
            });
        }
        if name.chars().count() > MAX_NAME_CHARS || password.chars().count() > MAX_PASSWORD_CHARS {
            return Ok(SignIn::Refused);
        }
        let found = self.lookup(name).await?;
        let (hash, standing) = match &found {
            Some((h, s)) => (h.clone(), Some(s.clone())),
            None => (self.decoy.clone(), None),
        };
        let ok = self.verify(hash, password.to_string()).await;
        match (ok, standing) {
            (true, Some(s)) => {
                self.forget(&keys);
                Ok(SignIn::Ok(Person {
                    name: name.to_string(),
                    role: s.role,
                    via_token: false,
                    must_change_password: s.must_change_password,
                }))
            }
            _ => Ok(SignIn::Refused),
        }
    }

    /// Count an attempt under `keys` (the limiter's lock held only for it).
    fn admit(&self, keys: &[(String, Rule)]) -> Admission {
        self.limiter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .admit(keys, Instant::now())
    }

    /// A success forgets the attempts under `keys`.
    fn forget(&self, keys: &[(String, Rule)]) {
        self.limiter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .succeeded(keys);
    }

    /// A bearer token presented from `client` on `path`: its person, or the
    /// answer that refuses it. Failed tokens are counted per address (the
    /// sign-in limiter's address rule): past a few, a token from that
    /// address is not even checked until its delay passes (429). Each
    /// refusal is audited (of a limited run, the first).
    pub async fn bearer(
        &self,
        client: IpAddr,
        presented: &str,
        path: &str,
    ) -> Result<Person, Response> {
        let keys = [(format!("token-ip:{client}"), limiter::BY_ADDRESS)];
        let admitted = self.admit(&keys);
        if let Admission::Wait { retry_after, first } = admitted {
            if first {
                self.audit_token(
                    client,
                    path,
                    "refused: too many unknown tokens from this address",
                )
                .await;
            }
            let secs = retry_after.as_secs().max(1);
            return Err((
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, secs.to_string())],
                axum::Json(serde_json::json!({
                    "error": format!("too many unknown bearer tokens from this address; try again in {secs}s")
                })),
            )
                .into_response());
        }
        match self.token(presented) {
            Some(p) => {
                self.forget(&keys);
                Ok(p)
            }
            None => {
                self.audit_token(client, path, "refused: unknown bearer token")
                    .await;
                Err(unauthorized("the bearer token is not one this node knows"))
            }
        }
    }

    async fn audit_token(&self, client: IpAddr, path: &str, result: &str) {
        let reason = format!("{path} from {client}");
        audit_or_log(&self.pool, "-", "token.refused", &reason, result).await;
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
                must_change_password: false,
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
                must_change_password: false,
            })
            .collect();
        let rows: Vec<(String, String, i64)> =
            sqlx::query_as("SELECT name, role, must_change_password FROM people ORDER BY name")
                .fetch_all(&self.pool)
                .await?;
        for (name, role, must) in rows {
            if let Some(role) = PersonRole::parse(&role)
                && !out.iter().any(|p| p.name == name)
            {
                out.push(PersonView {
                    name,
                    role,
                    source: "database".into(),
                    must_change_password: must != 0,
                });
            }
        }
        Ok(out)
    }

    /// Whether `name` is taken (file or database).
    pub async fn exists(&self, name: &str) -> Result<bool, AuthError> {
        Ok(self.lookup(name).await?.is_some())
    }

    /// Whether `name` is defined in the company file (and so cannot be
    /// changed on the dashboard).
    pub fn in_file(&self, name: &str) -> bool {
        self.users.iter().any(|u| u.name == name)
    }

    /// Add a person to the database with a fresh random password, to be
    /// changed at their first sign-in.
    pub async fn add(&self, name: &str, role: PersonRole, by: &str) -> Result<String, AuthError> {
        let password = random_password();
        let hash = hash_blocking(password.clone()).await?;
        sqlx::query(
            "INSERT INTO people (name, password_hash, role, created_at, created_by, must_change_password) VALUES (?, ?, ?, ?, ?, 1)",
        )
        .bind(name)
        .bind(hash)
        .bind(role.as_str())
        .bind(crate::clock::now_rfc3339())
        .bind(by)
        .execute(&self.pool)
        .await?;
        Ok(password)
    }

    /// Remove a database person; every stream of theirs ends. `false` when
    /// there was nobody of that name in the database.
    pub async fn remove(&self, name: &str) -> Result<bool, AuthError> {
        let done = sqlx::query("DELETE FROM people WHERE name = ?")
            .bind(name)
            .execute(&self.pool)
            .await?
            .rows_affected()
            > 0;
        if done {
            let _ = self.ends.send(SessionEnd::Person(name.to_string()));
        }
        Ok(done)
    }

    /// Change a database person's role (read again on their next request).
    pub async fn set_role(&self, name: &str, role: PersonRole) -> Result<bool, AuthError> {
        Ok(sqlx::query("UPDATE people SET role = ? WHERE name = ?")
            .bind(role.as_str())
            .bind(name)
            .execute(&self.pool)
            .await?
            .rows_affected()
            > 0)
    }

    /// Give a database person a fresh random password, to be changed at
    /// their next sign-in; every stream of theirs ends. `None` when there
    /// is nobody of that name in the database.
    pub async fn reset_password(&self, name: &str) -> Result<Option<String>, AuthError> {
        let password = random_password();
        let hash = hash_blocking(password.clone()).await?;
        let done = sqlx::query(
            "UPDATE people SET password_hash = ?, must_change_password = 1 WHERE name = ?",
        )
        .bind(hash)
        .bind(name)
        .execute(&self.pool)
        .await?
        .rows_affected()
            > 0;
        if !done {
            return Ok(None);
        }
        let _ = self.ends.send(SessionEnd::Person(name.to_string()));
        Ok(Some(password))
    }

    /// A database person changes their own password, proving the current
    /// one (through the same limiter and check bound as a sign-in).
    pub async fn change_password(
        &self,
        client: IpAddr,
        name: &str,
        current: &str,
        new: &str,
    ) -> Result<PasswordChange, AuthError> {
        if self.in_file(name) {
            return Ok(PasswordChange::InFile);
        }
        let n = new.chars().count();
        if !(MIN_PASSWORD_CHARS..=MAX_PASSWORD_CHARS).contains(&n) {
            return Ok(PasswordChange::Weak);
        }
        if new == current {
            return Ok(PasswordChange::Unchanged);
        }
        match self.sign_in(client, name, current).await? {
            SignIn::Ok(_) => {}
            SignIn::Refused => return Ok(PasswordChange::WrongPassword),
            SignIn::Limited { retry_after, .. } => {
                return Ok(PasswordChange::Limited(retry_after));
            }
            SignIn::Busy => return Ok(PasswordChange::Limited(Duration::from_secs(1))),
        }
        let hash = hash_blocking(new.to_string()).await?;
        sqlx::query("UPDATE people SET password_hash = ?, must_change_password = 0 WHERE name = ?")
            .bind(hash)
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(PasswordChange::Changed)
    }

    /// End every event stream of `end`.
    pub fn end_streams(&self, end: SessionEnd) {
        let _ = self.ends.send(end);
    }

    /// Where ends of sessions and people are announced, for a stream to
    /// stop on.
    pub fn session_end_sender(&self) -> broadcast::Sender<SessionEnd> {
        self.ends.clone()
    }
}

/// What a password change came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PasswordChange {
    Changed,
    /// The current password given was wrong.
    WrongPassword,
    /// Too short or too long.
    Weak,
    /// The new password is the current one.
    Unchanged,
    /// The person is defined in the company file.
    InFile,
    /// Too many attempts: try again after this long.
    Limited(Duration),
}

/// Pure: the client address of a request from `peer` carrying
/// `forwarded` (`X-Forwarded-For`, comma-separated, the nearest proxy
/// last). Only a trusted peer's header is believed; the client is the
/// nearest address in it that is not itself a trusted proxy. A header that
/// does not parse leaves the peer as the client.
pub fn client_address(peer: IpAddr, forwarded: Option<&str>, trusted: &[Network]) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let Some(forwarded) = forwarded else {
        return peer;
    };
    let mut last = peer;
    for part in forwarded.rsplit(',') {
        let Ok(ip) = part.trim().parse::<IpAddr>() else {
            return last;
        };
        if !is_trusted(ip) {
            return ip;
        }
        last = ip;
    }
    last
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

/// Make the memory of a password check go back to the system when the
/// check ends. Each argon2 check allocates one 19 MiB block; glibc's
/// allocator raises its mmap threshold after the first such block is
/// freed, and from then on serves them from arenas it keeps: a burst of
/// sign-ins left the node hundreds of megabytes larger for good. A fixed
/// threshold (1 MiB) keeps every such block mapped on its own and unmapped
/// when freed. Once per process; nothing on other platforms.
pub fn return_password_memory() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only changes the allocator's tuning; it is safe
        // to call at any time, from any thread.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        }
    });
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

fn unauthorized(msg: &str) -> Response {
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

/// The page a sign-in lands on when `next` names none.
pub const HOME: &str = "/settings/nodes";

/// Pure: a redirect target is only ever a path on this site — it starts
/// with exactly one `/` (no authority, so no other origin), holds no byte
/// at or below a space, no DEL and no backslash (which browsers strip or
/// read as `/`), and is not the sign-in page itself. Anything else goes
/// home.
pub fn local_path(next: &str) -> &str {
    let ok = next.starts_with('/')
        && !next.starts_with("//")
        && next.bytes().all(|b| b > 0x20 && b != 0x7f && b != b'\\')
        && next != "/login"
        && !next.starts_with("/login?");
    if ok { next } else { HOME }
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

/// Write one audit row about no seat; a row that cannot be written is
/// logged (the refusal it records stands).
async fn audit_or_log(pool: &SqlitePool, actor: &str, action: &str, reason: &str, result: &str) {
    if let Err(e) = audit::record(pool, actor, action, None, Some(reason), result).await {
        tracing::error!(error = %e, "cannot write the audit log");
    }
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
fn sign_in_outcome<E>(answer: &Result<SignIn, E>) -> &'static str {
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

#[cfg(test)]
mod tests {
    use super::{SignIn, sign_in_outcome};

    #[test]
    fn sign_in_attempts_are_counted_by_outcome() {
        let limited: Result<SignIn, ()> = Ok(SignIn::Limited {
            retry_after: std::time::Duration::from_secs(1),
            audit: false,
        });
        assert_eq!(sign_in_outcome(&limited), "limited");
        assert_eq!(sign_in_outcome::<()>(&Ok(SignIn::Refused)), "refused");
        assert_eq!(sign_in_outcome::<()>(&Ok(SignIn::Busy)), "busy");
        assert_eq!(sign_in_outcome::<()>(&Err(())), "failed");
    }

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
        assert_eq!(local_path("/seats?q=a%20b&page=2"), "/seats?q=a%20b&page=2");
        for bad in [
            "//evil.example/x",
            "https://evil.example",
            "",
            "seats",
            // A tab, a newline or a space lets a browser read `//` (the
            // tab is what `next=/%09/host` decodes to).
            "/\t/127.0.0.1:3999/phish",
            "/\n/evil.example",
            "/\r\nSet-Cookie: x=1",
            "/ /evil.example",
            "/\u{7f}/evil.example",
            "/\\evil.example",
            "/\\/evil.example",
            "/\0",
            "/login",
            "/login?next=/x",
        ] {
            assert_eq!(local_path(bad), HOME, "{bad:?}");
        }
    }

    #[test]
    fn the_client_is_the_peer_unless_a_trusted_proxy_names_it() {
        let trusted = [Network::parse("10.0.0.0/8").unwrap()];
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // An untrusted peer's header is ignored: anyone can write one.
        assert_eq!(
            client_address(ip("203.0.113.9"), Some("1.2.3.4"), &trusted),
            ip("203.0.113.9")
        );
        assert_eq!(
            client_address(ip("10.0.0.2"), Some("198.51.100.7"), &trusted),
            ip("198.51.100.7")
        );
        // The nearest untrusted hop wins over what the client claimed.
        assert_eq!(
            client_address(
                ip("10.0.0.2"),
                Some("1.2.3.4, 198.51.100.7, 10.0.0.3"),
                &trusted
            ),
            ip("198.51.100.7")
        );
        assert_eq!(
            client_address(ip("10.0.0.2"), None, &trusted),
            ip("10.0.0.2")
        );
        assert_eq!(
            client_address(ip("10.0.0.2"), Some("garbage"), &trusted),
            ip("10.0.0.2")
        );
    }

    #[test]
    fn generated_passwords_are_long_and_distinct() {
        let a = random_password();
        assert_eq!(a.len(), 20);
        assert_ne!(a, random_password());
    }
}
