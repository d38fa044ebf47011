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

mod forms;
mod gate;
pub mod limiter;
mod password;
mod people;

use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use sqlx::SqlitePool;
use tokio::sync::{Semaphore, broadcast};
use tower_sessions::Session;

use app::api::{Person, PersonRole, PersonView};

use crate::audit;
use crate::config::{AuthRole, AuthSection, Network};
use limiter::{Admission, Limiter, Rule};

pub use forms::{LoginForm, PasswordForm, change_password, login, logout};
use gate::unauthorized;
pub use gate::{PASSWORD_PAGE, cross_site, gate};
use password::{hash_blocking, verify_blocking};
pub use password::{hash_password, random_password, return_password_memory};

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

/// Write one audit row about no seat; a row that cannot be written is
/// logged (the refusal it records stands).
async fn audit_or_log(pool: &SqlitePool, actor: &str, action: &str, reason: &str, result: &str) {
    if let Err(e) = audit::record(pool, actor, action, None, Some(reason), result).await {
        tracing::error!(error = %e, "cannot write the audit log");
    }
}

#[cfg(test)]
mod tests;
