//! The company file: what a node is, how it coordinates, which seats the
//! company has and who may sign in.
//!
//! This module owns parsing (TOML), environment overrides, validation with
//! errors that name the file, the key path, the bad value and the fix, and
//! the redacted rendering `crewlet check` prints. It never touches the
//! network or the database.

mod network;
mod policy;
pub mod programs;
mod role;
pub mod schema;
mod validate;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use network::Network;
pub use policy::{
    AgentPolicy, AgentUser, Confinement, INSTRUCTIONS_SUBDIR, InstructionsError, SEATS_SUBDIR,
    confined,
};
pub use programs::{ProgramRefused, ProgramRule, ProgramUse, Programs};
pub use role::{
    AgentConfig, BudgetConfig, CHILD_BASICS, CommandConfig, DEFAULT_APPROVAL_TIMEOUT_SECONDS,
    EchoConfig, EchoFailure, McpServerConfig, ModelConfig, PlacementConfig, RoleConfig,
    base_child_env, child_env_of, matches_placement,
};
pub use validate::{MAX_ROLES, MAX_SCHEDULES, Problem};

/// The current lease protocol (spec: "The current protocol is 4").
pub const PROTOCOL: u32 = 4;

/// The built-in tools a role's `approve` may name, each by its own name
/// alone (`*` and `server.*` are MCP tools'): the ones whose call reaches
/// outside the seat.
pub const APPROVABLE_BUILT_INS: [&str; 3] = ["post_outbox", "a2a_message", "run_detached"];

/// The environment variable that makes this process speak an older lease
/// protocol: fault injection for mixed-version drills and the chaos
/// harness (spec § Mixed-version fleets).
pub const FAULT_PROTOCOL_VAR: &str = "CREWLET_FAULT_PROTOCOL";

/// The lease protocol this process speaks: [`PROTOCOL`], unless
/// `CREWLET_FAULT_PROTOCOL` names a lower one (1 to 3), as a node of an
/// older build would. Its presence, seat and duty leases then carry that
/// protocol, and it judges the protocol gate from it. Read once.
pub fn protocol() -> u32 {
    static P: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *P.get_or_init(|| fault_protocol(std::env::var(FAULT_PROTOCOL_VAR).ok().as_deref()))
}

/// Pure: the protocol `CREWLET_FAULT_PROTOCOL`'s value asks for (anything
/// but a number below [`PROTOCOL`] is ignored).
pub fn fault_protocol(value: Option<&str>) -> u32 {
    match value.and_then(|v| v.trim().parse::<u32>().ok()) {
        Some(p) if (1..PROTOCOL).contains(&p) => p,
        _ => PROTOCOL,
    }
}

/// A config that could not be loaded. Its `Display` is what a person reads.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read the company file: {source}. Check the path given with --config.")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: not valid TOML: {message}")]
    Syntax { file: String, message: String },
    #[error("{file}: {} problem{}:\n{}", .problems.len(), if .problems.len() == 1 { "" } else { "s" }, render(.problems))]
    Invalid {
        file: String,
        problems: Vec<Problem>,
    },
}

/// The inbox types only the engine sends (`engine::envelope::ENGINE_TYPES`,
/// kept here so the company file's schedules are judged by them too).
pub const ENGINE_MAIL_TYPES: [&str; 2] = ["run_completed", "tool_approval_answered"];

/// The most problems a message lists (the rest are counted).
pub const PROBLEMS_SHOWN: usize = 50;

fn render(problems: &[Problem]) -> String {
    let mut lines: Vec<String> = problems
        .iter()
        .take(PROBLEMS_SHOWN)
        .map(|p| format!("  - {p}"))
        .collect();
    if problems.len() > PROBLEMS_SHOWN {
        lines.push(format!(
            "  - … and {} more (fix these first)",
            problems.len() - PROBLEMS_SHOWN
        ));
    }
    lines.join("\n")
}

impl ConfigError {
    /// The problems found, for tests and tools (empty for read/syntax errors).
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Invalid { problems, .. } => problems,
            _ => &[],
        }
    }
}

/// The whole company file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub node: NodeSection,
    pub coordination: CoordinationSection,
    pub stream: StreamSection,
    pub company: CompanySection,
    pub roles: Vec<RoleConfig>,
    pub auth: AuthSection,
    pub logging: LoggingSection,
    pub memory: MemorySection,
    pub maintenance: MaintenanceSection,
    pub scheduler: SchedulerSection,
    pub schedules: Vec<ScheduleConfig>,
    /// What a turn's `run_detached` may start on this node (node-local:
    /// never taken from an applied company).
    pub runs: RunsSection,
    /// What `GET /metrics` exports (node-local).
    pub metrics: MetricsSection,
}

/// `[metrics]`: what `GET /metrics` exports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSection {
    /// Series labelled by seat (`crewlet_seat_inbox_depth_messages`) are
    /// exported while the company has at most this many seats; 0: never.
    pub seat_series_limit: u64,
}

impl Default for MetricsSection {
    fn default() -> Self {
        MetricsSection {
            seat_series_limit: 200,
        }
    }
}

/// `[runs]`: the programs `run_detached` may start on this node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunsSection {
    /// Absolute paths of the programs a detached run may start (its
    /// `argv[0]` must be one of them, exactly). Empty: none may run.
    pub allow: Vec<String>,
}

/// `node.environment`: a production node, or a test rig where the echo
/// agent's drills may be switched on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Environment {
    #[default]
    Production,
    Test,
}

/// The maintenance duty (one node of the fleet at a time).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MaintenanceSection {
    /// How often the duty runs.
    pub every_seconds: u64,
    /// How long a removed seat's mailbox (and the mail in it) is kept
    /// after a sweep first sees the seat missing.
    pub retirement_grace_seconds: u64,
    /// Audit rows older than this many days are deleted (0: kept for ever).
    pub audit_days: u64,
}

impl Default for MaintenanceSection {
    fn default() -> Self {
        MaintenanceSection {
            every_seconds: 900,
            retirement_grace_seconds: 86_400,
            audit_days: 365,
        }
    }
}

/// The scheduler duty.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerSection {
    /// How often the duty's holder evaluates every schedule.
    pub tick_seconds: u64,
}

impl Default for SchedulerSection {
    fn default() -> Self {
        SchedulerSection { tick_seconds: 10 }
    }
}

/// A schedule: a trigger published to a seat's inbox at each due time of a
/// cron expression (UTC), at most once fleet-wide per due time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// Names the schedule (unique; part of each fire's event id).
    pub name: String,
    /// The seat whose inbox it is published to.
    pub seat: String,
    /// Five fields (minute hour day month weekday) or six (seconds first).
    pub cron: String,
    /// The envelope's type.
    #[serde(default = "default_schedule_type", rename = "type")]
    pub kind: String,
    /// The envelope's body.
    #[serde(default)]
    pub body: serde_json::Value,
}

fn default_schedule_type() -> String {
    "task_assigned".into()
}

/// A seat's memory: how it is carried between nodes and kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemorySection {
    /// How often each held seat's new memory rows are published to the
    /// changelog (a crash loses at most this much).
    pub flush_seconds: u64,
    /// How long a memory read waits for the seat's holder on another node.
    pub scatter_budget_ms: u64,
    /// Diary notes older than this many days are swept (0: never).
    pub diary_days: u64,
    /// Diary notes kept per seat, newest first (0: no cap).
    pub diary_cap: u64,
    /// The company's embedding model, if any: a carried vector of this
    /// model and width replaces a stored one of no model, another model or
    /// another width.
    pub vector_model: String,
    pub vector_dims: u32,
}

impl Default for MemorySection {
    fn default() -> Self {
        MemorySection {
            flush_seconds: 30,
            scatter_budget_ms: 2000,
            diary_days: 30,
            diary_cap: 1000,
            vector_model: String::new(),
            vector_dims: 0,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeSection {
    /// The stable node id (goes into `preferred`; the owner is the incarnation).
    pub id: String,
    pub labels: Vec<String>,
    pub listen: String,
    pub data_dir: PathBuf,
    /// `production` (the default) or `test`: only a test node honours the
    /// echo agent's drills.
    pub environment: Environment,
    /// Whether this node runs `command` agents and accepts a company
    /// revision that has them. Unset: yes with local coordination (one
    /// node), no on a fleet (`coordination.type = "embedded-kv"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_command_agents: Option<bool>,
    /// The programs a company may have started here: command agents, MCP
    /// stdio servers, detached runs (docs/security.md § Security model). Unset: any
    /// command agent or stdio server on a single node with `local`
    /// coordination, none on a fleet; a detached run only by a rule that
    /// says `run` (or `[runs] allow`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub programs: Option<Vec<ProgramRule>>,
    /// The node's environment variables an agent may be handed (a role's
    /// `api_key_env`, `env_from`, `headers_from` may name only these).
    pub agent_env: Vec<String>,
    /// Where a role's `instructions_file` is read from (unset:
    /// `{data_dir}/instructions`); nothing outside it is read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instructions_dir: Option<PathBuf>,
    /// A user of the machine the seats' children run as (docs/security.md § Security
    /// model): they then cannot read the node's data directory, its
    /// database or its environment. Unset: as the node's own user.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_user: Option<String>,
}

impl Default for NodeSection {
    fn default() -> Self {
        NodeSection {
            id: "node-0".into(),
            labels: Vec::new(),
            listen: "127.0.0.1:3000".into(),
            data_dir: PathBuf::from("./data"),
            environment: Environment::Production,
            allow_command_agents: None,
            programs: None,
            agent_env: Vec::new(),
            instructions_dir: None,
            agent_user: None,
        }
    }
}

impl NodeSection {
    /// `allow_command_agents` with its default filled in.
    pub fn command_agents_allowed(&self, coordination: CoordinationType) -> bool {
        self.allow_command_agents
            .unwrap_or(coordination == CoordinationType::Local)
    }

    /// `instructions_dir` with its default filled in.
    pub fn instructions_dir(&self) -> PathBuf {
        self.instructions_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join(INSTRUCTIONS_SUBDIR))
    }

    /// Whether `listen` is a loopback address (validated at load).
    pub fn listens_on_loopback(&self) -> bool {
        self.listen
            .parse::<SocketAddr>()
            .map(|a| a.ip().is_loopback())
            .unwrap_or(true)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CoordinationType {
    /// In-process coordination: one node, the whole company.
    Local,
    /// NATS JetStream KV, shared by a fleet.
    EmbeddedKv,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CoordinationSection {
    #[serde(rename = "type")]
    pub kind: CoordinationType,
    pub lease_ttl_seconds: u64,
    pub heartbeat_seconds: u64,
    pub sweep_seconds: u64,
    pub claim_limit: u32,
    pub release_limit: u32,
    pub store_timeout_ms: u64,
    /// How a voluntary move happens: `two-phase` (offer the seat to a
    /// successor, which takes it while it is still held) or `release`
    /// (release, then anyone claims).
    pub handoff: HandoffMode,
    /// How long an offer stands before the giver withdraws it and resumes.
    pub handoff_timeout_ms: u64,
    /// Claim a seat or presence lease in one atomic batch write (the epoch
    /// key beside the lease, both by compare-and-set): `local` only; with
    /// `embedded-kv` it is refused (docs/config.md § The company file, One-write
    /// claims). Off as shipped.
    pub atomic_claim: bool,
}

/// `coordination.handoff`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HandoffMode {
    TwoPhase,
    Release,
}

impl Default for CoordinationSection {
    fn default() -> Self {
        CoordinationSection {
            kind: CoordinationType::Local,
            lease_ttl_seconds: 45,
            heartbeat_seconds: 15,
            sweep_seconds: 5,
            claim_limit: 4,
            release_limit: 2,
            store_timeout_ms: 2000,
            handoff: HandoffMode::TwoPhase,
            handoff_timeout_ms: 5000,
            atomic_claim: false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StreamType {
    /// In-process queue: one node.
    Local,
    /// NATS JetStream.
    Nats,
}

#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StreamSection {
    #[serde(rename = "type")]
    pub kind: StreamType,
    pub urls: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub creds_file: Option<PathBuf>,
    /// A PEM file of the certificate authorities a `tls://` server's
    /// certificate is checked against (besides the system's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca_file: Option<PathBuf>,
    /// Deliveries a message may spend before it is dead-lettered.
    pub max_deliveries: u64,
    /// How long a fetched message may stay unsettled before it comes back.
    pub ack_wait_seconds: u64,
    /// How long a turn that failed before anything reached outside waits
    /// before its mail is delivered again the first time; each further
    /// failure doubles it (0: at once).
    pub retry_delay_seconds: u64,
    /// The longest such a wait grows to.
    pub retry_delay_max_seconds: u64,
}

/// Never the password, nor one in a URL.
impl std::fmt::Debug for StreamSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamSection")
            .field("kind", &self.kind)
            .field(
                "urls",
                &self
                    .urls
                    .iter()
                    .map(|u| redact_userinfo(u))
                    .collect::<Vec<_>>(),
            )
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| REDACTED))
            .field("creds_file", &self.creds_file)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("max_deliveries", &self.max_deliveries)
            .field("ack_wait_seconds", &self.ack_wait_seconds)
            .field("retry_delay_seconds", &self.retry_delay_seconds)
            .field("retry_delay_max_seconds", &self.retry_delay_max_seconds)
            .finish()
    }
}

impl Default for StreamSection {
    fn default() -> Self {
        StreamSection {
            kind: StreamType::Local,
            urls: Vec::new(),
            user: None,
            password: None,
            creds_file: None,
            tls_ca_file: None,
            max_deliveries: 25,
            ack_wait_seconds: 30,
            retry_delay_seconds: 1,
            retry_delay_max_seconds: 60,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompanySection {
    pub name: String,
    /// The company's clock (an IANA name, `Europe/Berlin`): the days,
    /// weeks and months token budgets count in.
    pub timezone: String,
}

impl Default for CompanySection {
    fn default() -> Self {
        CompanySection {
            name: "crewlet".into(),
            timezone: "UTC".into(),
        }
    }
}

/// Keys whose values never appear in output.
pub(crate) fn is_secret(key: &str) -> bool {
    matches!(key, "password" | "password_hash" | "sha256")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthRole {
    /// Reads every page.
    Viewer,
    /// Also pauses, resumes, stops, moves and sends.
    Operator,
    /// Also applies a company and manages people.
    Admin,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSection {
    pub users: Vec<UserConfig>,
    pub tokens: Vec<TokenConfig>,
    /// Addresses (`10.0.0.5`) or networks (`10.0.0.0/8`) of reverse
    /// proxies whose `X-Forwarded-For` names the client. Empty: the TCP
    /// peer is the client.
    pub trusted_proxies: Vec<String>,
    /// Mark the session cookie `Secure` (sent over HTTPS only). Unset: on
    /// when `node.listen` is not a loopback address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secure_cookies: Option<bool>,
}

impl AuthSection {
    /// `secure_cookies` with its default filled in.
    pub fn secure_cookies(&self, node: &NodeSection) -> bool {
        self.secure_cookies.unwrap_or(!node.listens_on_loopback())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    pub name: String,
    /// An argon2 PHC string (`crewlet hash-password` makes one).
    pub password_hash: String,
    pub role: AuthRole,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    pub name: String,
    /// Hex SHA-256 of the token.
    pub sha256: String,
    pub role: AuthRole,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Pretty,
    Json,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoggingSection {
    pub format: LogFormat,
    pub stderr: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
}

impl Default for LoggingSection {
    fn default() -> Self {
        LoggingSection {
            format: LogFormat::Pretty,
            stderr: true,
            file: None,
        }
    }
}

impl Config {
    /// Load, apply `CREWLET_SECTION__KEY` overrides from the process
    /// environment, and validate.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let env: BTreeMap<String, String> = std::env::vars()
            .filter(|(k, _)| k.starts_with("CREWLET_") && k.contains("__"))
            .collect();
        Config::load_with_env(path, &env)
    }

    /// [`Config::load`] with an explicit environment (tests).
    pub fn load_with_env(
        path: &Path,
        env: &BTreeMap<String, String>,
    ) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
        Config::parse(&file, &text, env)
    }

    /// Parse and validate the text of a company file named `file`.
    pub fn parse(
        file: &str,
        text: &str,
        env: &BTreeMap<String, String>,
    ) -> Result<Config, ConfigError> {
        Config::parse_with(file, text, env, |_| {})
    }

    /// Parse and validate a company applied to a running node: only its
    /// `[company]`, `[[roles]]` and `[[schedules]]` are taken, so the rules
    /// that depend on the node (drills only on a test node) are judged by
    /// `environment`, the applying node's own, not by what the file says of
    /// a node. Whether the node runs command agents is the caller's to
    /// judge (it names the roles).
    pub fn parse_applied(
        file: &str,
        text: &str,
        environment: Environment,
        policy: &AgentPolicy,
    ) -> Result<Config, ConfigError> {
        Config::parse_with(file, text, &BTreeMap::new(), |c| {
            c.node.environment = environment;
            c.node.allow_command_agents = Some(true);
            c.node.programs = None;
            c.node.agent_env = match &policy.agent_env {
                Some(a) => a.iter().cloned().collect(),
                // A test rig hands any variable: every name the file uses.
                None => c.roles.iter().flat_map(env_names).collect(),
            };
            c.node.instructions_dir = Some(policy.instructions_dir.clone());
        })
    }

    fn parse_with(
        file: &str,
        text: &str,
        env: &BTreeMap<String, String>,
        adjust: impl FnOnce(&mut Config),
    ) -> Result<Config, ConfigError> {
        let mut value: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| ConfigError::Syntax {
                    file: file.to_string(),
                    message: e.to_string().trim().replace('\n', "\n  "),
                })?;
        let invalid = |problems| ConfigError::Invalid {
            file: file.to_string(),
            problems,
        };
        let mut problems = schema::unknown_keys(&value);
        problems.extend(schema::apply_env(&mut value, env));
        if !problems.is_empty() {
            return Err(invalid(problems));
        }
        let mut config: Config = match serde_path_to_error::deserialize(toml::Value::Table(value)) {
            Ok(c) => c,
            Err(e) => return Err(invalid(vec![validate::from_serde(&e)])),
        };
        adjust(&mut config);
        let problems = validate::check(&config);
        if !problems.is_empty() {
            return Err(invalid(problems));
        }
        Ok(config)
    }

    /// The listen address (validated at load).
    pub fn listen_addr(&self) -> SocketAddr {
        self.node
            .listen
            .parse()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 3000)))
    }

    /// The effective config as TOML with every secret replaced.
    pub fn redacted_toml(&self) -> String {
        let mut c = self.clone();
        if c.stream.password.is_some() {
            c.stream.password = Some(REDACTED.into());
        }
        for u in &mut c.auth.users {
            u.password_hash = REDACTED.into();
        }
        for t in &mut c.auth.tokens {
            t.sha256 = REDACTED.into();
        }
        // A child's variables are often keys; a URL may carry a password.
        for u in &mut c.stream.urls {
            *u = redact_userinfo(u);
        }
        for r in &mut c.roles {
            match &mut r.agent {
                AgentConfig::Command(cmd) => {
                    cmd.env.values_mut().for_each(|v| *v = REDACTED.into())
                }
                AgentConfig::Model(m) => m.base_url = redact_userinfo(&m.base_url),
                AgentConfig::Echo(_) => {}
            }
            for m in &mut r.mcp {
                m.env.values_mut().for_each(|v| *v = REDACTED.into());
                if let Some(u) = &mut m.url {
                    *u = redact_userinfo(u);
                }
            }
        }
        toml::to_string_pretty(&c).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }
}

/// Every node variable `role` names for its agent or tool servers.
fn env_names(role: &RoleConfig) -> Vec<String> {
    let mut out = Vec::new();
    match &role.agent {
        AgentConfig::Model(m) => out.extend(m.api_key_env.clone()),
        AgentConfig::Command(c) => out.extend(c.env_from.iter().cloned()),
        AgentConfig::Echo(_) => {}
    }
    for m in &role.mcp {
        out.extend(m.env_from.iter().cloned());
        out.extend(m.headers_from.values().cloned());
    }
    out
}

/// What a secret reads as wherever the config is shown.
pub const REDACTED: &str = "<redacted>";

/// Pure: `url` with any `user:password@` before its host replaced.
pub fn redact_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => format!("{scheme}://{REDACTED}@{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests;
