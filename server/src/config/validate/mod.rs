//! The rules a loaded company file must satisfy, each reported as a
//! [`Problem`] naming the key path, the bad value and what to do.
//!
//! Pure functions over a parsed [`Config`]; no I/O.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::SocketAddr;

use super::is_secret;
use super::*;

mod roles;
mod trust;

use roles::check_roles;
use trust::check_trust;
use trust::loopback_url;

/// One thing wrong with the company file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The key path (`coordination.heartbeat_seconds`, `roles[2].handle`) or
    /// the environment variable that carried the value.
    pub key: String,
    /// The offending value as written (secrets redacted), when there is one.
    pub value: Option<String>,
    pub problem: String,
    /// What to do about it.
    pub fix: String,
}

impl Problem {
    pub fn new(
        key: &str,
        value: Option<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Problem {
        Problem {
            key: key.to_string(),
            value,
            problem: problem.into(),
            fix: fix.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(f, "`{}` = {}: {}; {}", self.key, v, self.problem, self.fix),
            None => write!(f, "`{}`: {}; {}", self.key, self.problem, self.fix),
        }
    }
}

/// A deserialization failure (wrong type, unknown variant) as a problem.
pub(super) fn from_serde(e: &serde_path_to_error::Error<toml::de::Error>) -> Problem {
    let path = e.path().to_string();
    let last = path.rsplit('.').next().unwrap_or("");
    let mut message = e.inner().message().trim().to_string();
    if is_secret(last) {
        message = "has the wrong type".into();
    }
    Problem::new(
        if path == "." { "(file)" } else { &path },
        None,
        message,
        "see docs/config.md for this key's type and values",
    )
}

fn q(s: &str) -> Option<String> {
    Some(format!("{s:?}"))
}

/// NATS-subject and consumer-name safe: letters, digits, `-` and `_`.
pub fn is_subject_safe(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Reports one problem: the key, the value found, what is wrong, the fix.
type Report<'a> = dyn FnMut(&str, Option<String>, &str, String) + 'a;

/// Every rule, every problem (not just the first), section by section.
pub(super) fn check(c: &Config) -> Vec<Problem> {
    let mut out = Vec::new();
    {
        let mut p = |key: &str, value: Option<String>, problem: &str, fix: String| {
            out.push(Problem::new(key, value, problem, fix));
        };

        check_node(c, &mut p);
        check_coordination(c, &mut p);
        check_pairing(c, &mut p);
        check_stream(c, &mut p);
        check_company(c, &mut p);
        check_roles(c, &mut p);
        check_a2a(c, &mut p);
        check_auth(c, &mut p);
        check_memory(c, &mut p);
        check_schedules(c, &mut p);
        check_logging(c, &mut p);
    }
    out.extend(check_limits(c));
    out.extend(check_trust(c));
    out.extend(check_ack_window(c));
    out
}

/// `[node]`: the id, the listen address, labels, the data directory.
fn check_node(c: &Config, p: &mut Report<'_>) {
    if !is_subject_safe(&c.node.id) {
        p(
            "node.id",
            q(&c.node.id),
            "must be 1–64 letters, digits, `-` or `_`",
            "pick an id like \"node-a\"".into(),
        );
    }
    if c.node.listen.parse::<SocketAddr>().is_err() {
        p(
            "node.listen",
            q(&c.node.listen),
            "is not an address:port",
            "write it as \"127.0.0.1:3000\" (or \"0.0.0.0:3000\" to listen on every interface)"
                .into(),
        );
    }
    for (i, l) in c.node.labels.iter().enumerate() {
        if l.trim().is_empty() || l.chars().any(char::is_whitespace) {
            p(
                &format!("node.labels[{i}]"),
                q(l),
                "a label must be non-empty and contain no spaces",
                "write labels like \"gpu\" or \"region=eu\"".into(),
            );
        }
    }
    if c.node.data_dir.as_os_str().is_empty() {
        p(
            "node.data_dir",
            q(""),
            "must name a directory",
            "set it to where this node keeps its database, e.g. \"./data\"".into(),
        );
    }
}

/// `[coordination]`: the lease TTL, the heartbeat, the sweep and handoff bounds.
fn check_coordination(c: &Config, p: &mut Report<'_>) {
    let co = &c.coordination;
    if !(3..=3600).contains(&co.lease_ttl_seconds) {
        p(
            "coordination.lease_ttl_seconds",
            Some(co.lease_ttl_seconds.to_string()),
            "must be between 3 and 3600",
            "the default is 45".into(),
        );
    }
    if co.heartbeat_seconds == 0 || co.heartbeat_seconds * 3 > co.lease_ttl_seconds {
        p(
            "coordination.heartbeat_seconds",
            Some(co.heartbeat_seconds.to_string()),
            "must be at least 1 and at most lease_ttl_seconds / 3",
            format!(
                "with lease_ttl_seconds = {} use at most {} (a seat must survive two missed heartbeats)",
                co.lease_ttl_seconds,
                (co.lease_ttl_seconds / 3).max(1)
            ),
        );
    }
    if co.sweep_seconds == 0 || co.sweep_seconds >= co.lease_ttl_seconds {
        p(
            "coordination.sweep_seconds",
            Some(co.sweep_seconds.to_string()),
            "must be at least 1 and less than lease_ttl_seconds",
            format!(
                "with lease_ttl_seconds = {} use less than {}; the default is 5",
                co.lease_ttl_seconds, co.lease_ttl_seconds
            ),
        );
    }
    if !(1..=1000).contains(&co.claim_limit) {
        p(
            "coordination.claim_limit",
            Some(co.claim_limit.to_string()),
            "must be between 1 and 1000",
            "the default is 4".into(),
        );
    }
    if !(1..=1000).contains(&co.release_limit) {
        p(
            "coordination.release_limit",
            Some(co.release_limit.to_string()),
            "must be between 1 and 1000",
            "the default is 2".into(),
        );
    }
    if !(50..=60_000).contains(&co.store_timeout_ms) {
        p(
            "coordination.store_timeout_ms",
            Some(co.store_timeout_ms.to_string()),
            "must be between 50 and 60000",
            "the default is 2000".into(),
        );
    }
    if !(100..=600_000).contains(&co.handoff_timeout_ms) {
        p(
            "coordination.handoff_timeout_ms",
            Some(co.handoff_timeout_ms.to_string()),
            "must be between 100 and 600000",
            "the default is 5000 (an offer stands five seconds)".into(),
        );
    }
    if co.atomic_claim && co.kind == CoordinationType::EmbeddedKv {
        p(
            "coordination.atomic_claim",
            Some("true".into()),
            "one-write claims keep the epoch counter in the leases bucket as a key that never \
             expires, and nats-server (2.15.1 measured) loses such a key when a server restarts \
             after a crash: an epoch would be minted twice",
            "remove it (claims take three writes, with the counter in a bucket of its own); \
             docs/config.md § The company file, One-write claims"
                .into(),
        );
    }
}

/// The pairing of `coordination.type` with `stream.type` (spec § Single node).
fn check_pairing(c: &Config, p: &mut Report<'_>) {
    let co = &c.coordination;
    match (co.kind, c.stream.kind) {
        (CoordinationType::Local, StreamType::Nats) => p(
            "coordination.type",
            q("local"),
            "local coordination beside a NATS stream would let every node believe it owns the whole company",
            "set coordination.type = \"embedded-kv\" so the fleet shares its leases on the stream".into(),
        ),
        (CoordinationType::EmbeddedKv, StreamType::Local) => p(
            "coordination.type",
            q("embedded-kv"),
            "embedded-kv coordination rides the stream's connection, and stream.type is \"local\"",
            "set stream.type = \"nats\" with stream.urls, or use coordination.type = \"local\" for a single node".into(),
        ),
        _ => {}
    }
}

/// `[stream]`: the NATS URLs and the stream's limits.
fn check_stream(c: &Config, p: &mut Report<'_>) {
    let st = &c.stream;
    if st.kind == StreamType::Nats && st.urls.is_empty() {
        p(
            "stream.urls",
            Some("[]".into()),
            "a NATS stream needs at least one server URL",
            "set stream.urls = [\"nats://127.0.0.1:4222\"] or CREWLET_STREAM__URLS".into(),
        );
    }
    for (i, u) in st.urls.iter().enumerate() {
        let ok = ["nats://", "tls://", "ws://", "wss://"]
            .iter()
            .any(|s| u.starts_with(s) && u.len() > s.len());
        if !ok {
            p(
                &format!("stream.urls[{i}]"),
                q(u),
                "is not a NATS URL",
                "write it as \"nats://host:4222\" (or tls:// for TLS)".into(),
            );
        }
    }
    if st.user.is_some() != st.password.is_some() {
        p(
            if st.user.is_some() {
                "stream.password"
            } else {
                "stream.user"
            },
            None,
            "user and password go together",
            "set both (the password preferably through CREWLET_STREAM__PASSWORD), or neither"
                .into(),
        );
    }
    if st.creds_file.is_some() && st.user.is_some() {
        p(
            "stream.creds_file",
            st.creds_file
                .as_ref()
                .map(|f| format!("{:?}", f.display().to_string())),
            "a creds file and a user/password are two ways to sign in",
            "keep one of them".into(),
        );
    }

    if let Some(ca) = &st.tls_ca_file
        && !ca.is_file()
    {
        p(
            "stream.tls_ca_file",
            Some(format!("{:?}", ca.display().to_string())),
            "is not a readable file",
            "point it at the PEM file of the authority that signed the NATS servers' certificates"
                .into(),
        );
    }

    if !(1..=1000).contains(&st.max_deliveries) {
        p(
            "stream.max_deliveries",
            Some(st.max_deliveries.to_string()),
            "must be between 1 and 1000",
            "the default is 25 (sized for handoffs as well as failures)".into(),
        );
    }
    if !(1..=86_400).contains(&st.ack_wait_seconds) {
        p(
            "stream.ack_wait_seconds",
            Some(st.ack_wait_seconds.to_string()),
            "must be between 1 and 86400",
            "the default is 30 (the holder extends a delivery while it works on it; this is how soon a dead node's mail comes back)".into(),
        );
    }
    if st.retry_delay_seconds > 3_600 {
        p(
            "stream.retry_delay_seconds",
            Some(st.retry_delay_seconds.to_string()),
            "must be between 0 and 3600",
            "the default is 1 (a failed turn's mail comes back after 1 s, then 2, 4, … up to stream.retry_delay_max_seconds)".into(),
        );
    }
    if !(st.retry_delay_seconds..=86_400).contains(&st.retry_delay_max_seconds) {
        p(
            "stream.retry_delay_max_seconds",
            Some(st.retry_delay_max_seconds.to_string()),
            "must be at least stream.retry_delay_seconds and at most 86400",
            format!(
                "the default is 60; with retry_delay_seconds = {} use {} or more",
                st.retry_delay_seconds, st.retry_delay_seconds
            ),
        );
    }
}

/// `[company]`.
fn check_company(c: &Config, p: &mut Report<'_>) {
    if c.company.name.trim().is_empty() {
        p(
            "company.name",
            q(&c.company.name),
            "must not be empty",
            "name the company, e.g. \"Acme\"".into(),
        );
    }
    if c.company.timezone.parse::<chrono_tz::Tz>().is_err() {
        p(
            "company.timezone",
            q(&c.company.timezone),
            "is not a time zone name",
            "write an IANA name, e.g. \"UTC\" or \"Europe/Berlin\"".into(),
        );
    }
}

/// `[[auth.users]]` and `[[auth.tokens]]`.
fn check_auth(c: &Config, p: &mut Report<'_>) {
    let mut names = HashSet::new();
    for (i, u) in c.auth.users.iter().enumerate() {
        if u.name.trim().is_empty() || u.name.len() > 64 || u.name.chars().any(char::is_control) {
            p(
                &format!("auth.users[{i}].name"),
                q(&u.name),
                "must be 1–64 printable characters",
                "use the person's sign-in name".into(),
            );
        } else if !names.insert(u.name.as_str()) {
            p(
                &format!("auth.users[{i}].name"),
                q(&u.name),
                "is used by an earlier user",
                "give every person one entry".into(),
            );
        }
        let ok = argon2::PasswordHash::new(&u.password_hash)
            .map(|h| h.algorithm.as_str().starts_with("argon2"))
            .unwrap_or(false);
        if !ok {
            p(
                &format!("auth.users[{i}].password_hash"),
                Some(REDACTED.into()),
                "is not an argon2 PHC string ($argon2id$…)",
                "make one with `crewlet hash-password` and paste its output".into(),
            );
        }
    }
    let mut tnames = HashSet::new();
    for (i, t) in c.auth.tokens.iter().enumerate() {
        if t.name.trim().is_empty() {
            p(
                &format!("auth.tokens[{i}].name"),
                q(&t.name),
                "must not be empty",
                "name the token after what uses it, e.g. \"monitoring\"".into(),
            );
        } else if !tnames.insert(t.name.as_str()) {
            p(
                &format!("auth.tokens[{i}].name"),
                q(&t.name),
                "is used by an earlier token",
                "give every token its own name".into(),
            );
        }
        if t.sha256.len() != 64 || !t.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            p(
                &format!("auth.tokens[{i}].sha256"),
                Some(REDACTED.into()),
                "is not 64 hex digits",
                "store the hex SHA-256 of the token: `printf %s \"$TOKEN\" | sha256sum`".into(),
            );
        }
    }
}

/// `[memory]`.
fn check_memory(c: &Config, p: &mut Report<'_>) {
    if c.memory.flush_seconds == 0 {
        p(
            "memory.flush_seconds",
            Some("0".into()),
            "memory would never be carried to the seat's next holder",
            "use a positive number of seconds (default 30)".into(),
        );
    }
    if c.memory.scatter_budget_ms == 0 {
        p(
            "memory.scatter_budget_ms",
            Some("0".into()),
            "a memory read could never wait for the seat's holder",
            "use a positive number of milliseconds (default 2000)".into(),
        );
    }
    if c.memory.vector_model.is_empty() != (c.memory.vector_dims == 0) {
        p(
            "memory.vector_dims",
            Some(c.memory.vector_dims.to_string()),
            "an embedding model needs its width, and a width needs its model",
            "set both memory.vector_model and memory.vector_dims, or neither".into(),
        );
    }
}

/// `[maintenance]`, `[scheduler]` and `[[schedules]]`.
fn check_schedules(c: &Config, p: &mut Report<'_>) {
    for (key, v) in [
        ("maintenance.every_seconds", c.maintenance.every_seconds),
        (
            "maintenance.retirement_grace_seconds",
            c.maintenance.retirement_grace_seconds,
        ),
        ("scheduler.tick_seconds", c.scheduler.tick_seconds),
    ] {
        if v == 0 {
            p(
                key,
                Some("0".into()),
                "must be a positive number of seconds",
                "leave it out for the default".into(),
            );
        }
    }
    let mut names = std::collections::BTreeSet::new();
    let handles: std::collections::BTreeSet<&str> =
        c.roles.iter().map(|r| r.handle.as_str()).collect();
    for (i, s) in c.schedules.iter().enumerate() {
        if !is_subject_safe(&s.name) {
            p(
                &format!("schedules[{i}].name"),
                q(&s.name),
                "a schedule name must be 1–64 letters, digits, `-` or `_`",
                "use a name like \"daily-report\"".into(),
            );
        } else if !names.insert(s.name.as_str()) {
            p(
                &format!("schedules[{i}].name"),
                q(&s.name),
                "is used by an earlier schedule",
                "give every schedule its own name".into(),
            );
        }
        if !handles.contains(s.seat.as_str()) {
            p(
                &format!("schedules[{i}].seat"),
                q(&s.seat),
                "names no role of the company",
                "use the handle of one of the [[roles]]".into(),
            );
        }
        if let Err(e) = croner::Cron::new(&s.cron).with_seconds_optional().parse() {
            p(
                &format!("schedules[{i}].cron"),
                q(&s.cron),
                &format!("is not a cron expression: {e}"),
                "five fields (minute hour day month weekday), or six with seconds first: \"0 9 * * 1-5\"".into(),
            );
        }
        if s.kind.trim().is_empty() {
            p(
                &format!("schedules[{i}].type"),
                q(&s.kind),
                "an envelope needs a type",
                "use task_assigned (the default)".into(),
            );
        } else if ENGINE_MAIL_TYPES.contains(&s.kind.as_str()) {
            p(
                &format!("schedules[{i}].type"),
                q(&s.kind),
                "is the engine's own type (a run's completion, an approval's answer): nobody else sends it",
                "use task_assigned (the default)".into(),
            );
        }
    }
}

/// `roles[].a2a_to`: other seats of the company, or `*`.
fn check_a2a(c: &Config, p: &mut Report<'_>) {
    let handles: HashSet<&str> = c.roles.iter().map(|r| r.handle.as_str()).collect();
    for (i, r) in c.roles.iter().enumerate() {
        for (j, to) in r.a2a_to.iter().enumerate() {
            let why = if to == &r.handle {
                "is the role itself: a seat never mails itself"
            } else if to != "*" && !handles.contains(to.as_str()) {
                "names no role of the company"
            } else {
                continue;
            };
            p(
                &format!("roles[{i}].a2a_to[{j}]"),
                q(to),
                why,
                "list the handles of the seats it may mail, or \"*\" for every other seat".into(),
            );
        }
    }
}

/// `[logging]`.
fn check_logging(c: &Config, p: &mut Report<'_>) {
    if let Some(f) = &c.logging.file
        && f.as_os_str().is_empty()
    {
        p(
            "logging.file",
            q(""),
            "must name a file",
            "remove the key to log to stderr only".into(),
        );
    }
    if !c.logging.stderr && c.logging.file.is_none() {
        p(
            "logging.stderr",
            Some("false".into()),
            "with no logging.file the node would log nowhere",
            "set logging.file, or keep logging.stderr = true".into(),
        );
    }
}

/// The ack window must hold two renewals: each renewal of a seat's lease
/// extends the deliveries its turns hold.
fn check_ack_window(c: &Config) -> Vec<Problem> {
    let (window, beat) = (c.stream.ack_wait_seconds, c.coordination.heartbeat_seconds);
    if window >= 1 && beat >= 1 && window < 2 * beat {
        return vec![Problem::new(
            "stream.ack_wait_seconds",
            Some(window.to_string()),
            "must be at least twice coordination.heartbeat_seconds: each renewal extends the deliveries a turn holds, and two must fit in a window",
            format!("with heartbeat_seconds = {beat} use at least {}", 2 * beat),
        )];
    }
    Vec::new()
}

/// The most roles a company may have (the engine is measured at 10,000
/// seats).
pub const MAX_ROLES: usize = 10_000;
/// The most schedules a company may have.
pub const MAX_SCHEDULES: usize = 1_000;

/// How big a company may be.
fn check_limits(c: &Config) -> Vec<Problem> {
    let mut out = Vec::new();
    if c.roles.len() > MAX_ROLES {
        out.push(Problem::new(
            "roles",
            Some(format!("{} roles", c.roles.len())),
            format!("a company has at most {MAX_ROLES} roles"),
            "split the company, or remove roles nobody runs",
        ));
    }
    if c.schedules.len() > MAX_SCHEDULES {
        out.push(Problem::new(
            "schedules",
            Some(format!("{} schedules", c.schedules.len())),
            format!("a company has at most {MAX_SCHEDULES} schedules"),
            "merge schedules that wake the same seat",
        ));
    }
    out
}
