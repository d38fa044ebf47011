//! The `[[roles]]` section's types: a role's seat, its agent (echo,
//! command or model), tool servers, budget and placement, and the
//! environment a child program the node starts for it gets.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::*;

/// A role of the company: one seat, addressed by its handle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleConfig {
    pub handle: String,
    #[serde(default)]
    pub agent: AgentConfig,
    #[serde(default)]
    pub placement: PlacementConfig,
    /// The seat's MCP tool servers (docs/agents.md § Tools), started first when
    /// the seat is established and stopped when it is given back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp: Vec<McpServerConfig>,
    /// Tool calls a person approves before they run (docs/agents.md § Tools,
    /// Approvals): a tool's full name (`fs.write_file`), a server's every
    /// tool (`git.*`), or `*`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approve: Vec<String>,
    /// Also every MCP tool that may be destructive (annotated
    /// `destructiveHint: true`, or saying nothing of it and not read-only,
    /// as the MCP defaults have it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub approve_destructive: bool,
    /// Tools (full names, `server.*`, `*`) the company vouches are
    /// read-only: with `approve_destructive`, these alone run unasked — a
    /// tool server's own annotations never lower protection (docs/agents.md
    /// § Tools, Approvals).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only: Vec<String>,
    /// The seats this seat's agent may mail with `a2a_message` (handles,
    /// or `*` for every other seat). Empty: none (docs/security.md § Security model).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub a2a_to: Vec<String>,
    /// How long an approval waits for a person before it is denied as
    /// timed out.
    #[serde(default = "default_approval_timeout_seconds")]
    pub approval_timeout_seconds: u64,
    /// What a model seat may spend per day, ISO week and month on the
    /// company's clock (docs/agents.md § The model agent, Budgets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetConfig>,
}

/// A model seat's token caps, each per window; a cap left out is none.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_week: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_month: Option<u64>,
}

/// An hour: long enough for a person to look, short enough that a turn's
/// continuation is not forgotten.
pub const DEFAULT_APPROVAL_TIMEOUT_SECONDS: u64 = 3600;

fn default_approval_timeout_seconds() -> u64 {
    DEFAULT_APPROVAL_TIMEOUT_SECONDS
}

impl Default for RoleConfig {
    /// A role with no handle yet: the default agent and placement, no
    /// tool servers, nothing to approve.
    fn default() -> Self {
        RoleConfig {
            handle: String::new(),
            agent: AgentConfig::default(),
            placement: PlacementConfig::default(),
            mcp: Vec::new(),
            approve: Vec::new(),
            approve_destructive: false,
            read_only: Vec::new(),
            a2a_to: Vec::new(),
            approval_timeout_seconds: DEFAULT_APPROVAL_TIMEOUT_SECONDS,
            budget: None,
        }
    }
}

/// One MCP tool server of a role: a stdio child of the seat (`command`)
/// or a shared server over streamable HTTP (`url`), never both.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// Unique within the role; its tools are named `{name}.{tool}`.
    pub name: String,
    /// The program and its arguments (stdio transport).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// The server's streamable-HTTP endpoint (`http://…` or `https://…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Variables a stdio child gets, as written (it starts from a clean
    /// environment: `PATH`, `HOME`, `LANG`, `CREWLET_SEAT`, `CREWLET_NODE`,
    /// these and `env_from`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names of the node's environment variables passed to a stdio child.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_from: Vec<String>,
    /// HTTP headers for a `url` server, each read from the node's
    /// environment variable named here (`Authorization = "SEARCH_TOKEN"`).
    #[serde(default)]
    pub headers_from: BTreeMap<String, String>,
    /// How long one tool call may take before it fails (`ok: false`).
    #[serde(default = "default_call_timeout_seconds")]
    pub call_timeout_seconds: u64,
    /// How long starting, initialising and listing the tools may take
    /// before the seat is refused here.
    #[serde(default = "default_start_timeout_seconds")]
    pub start_timeout_seconds: u64,
    /// How long the release hook waits for a stdio child to exit after
    /// SIGTERM before the teardown fails (the seat goes undead).
    #[serde(default = "default_stop_wait_ms")]
    pub stop_wait_ms: u64,
}

fn default_call_timeout_seconds() -> u64 {
    60
}

fn default_start_timeout_seconds() -> u64 {
    20
}

impl McpServerConfig {
    /// A stdio server running `command`.
    pub fn stdio(name: &str, command: &[&str]) -> McpServerConfig {
        McpServerConfig {
            name: name.into(),
            command: command.iter().map(|s| s.to_string()).collect(),
            url: None,
            env: BTreeMap::new(),
            env_from: Vec::new(),
            headers_from: BTreeMap::new(),
            call_timeout_seconds: default_call_timeout_seconds(),
            start_timeout_seconds: default_start_timeout_seconds(),
            stop_wait_ms: default_stop_wait_ms(),
        }
    }

    /// Pure: a stdio child's environment (as a command agent's is built).
    pub fn child_env(
        &self,
        seat: &str,
        node: &str,
        node_env: &dyn Fn(&str) -> Option<String>,
    ) -> BTreeMap<String, String> {
        child_env_of(seat, node, node_env, &self.env, &self.env_from)
    }
}

/// What runs the seat's turns.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum AgentConfig {
    /// The built-in agent: a diary note and an episode per trigger, its
    /// outbound effect on `crewlet.outbox.{handle}`.
    Echo(EchoConfig),
    /// The seat's own child process, speaking JSON lines (docs/agents.md § The
    /// command agent).
    Command(CommandConfig),
    /// A model behind an OpenAI-compatible chat-completions endpoint
    /// (docs/agents.md § The model agent).
    Model(ModelConfig),
}

/// The model agent's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The endpoint's base, up to and including `/v1`
    /// (`https://api.openai.com/v1`, `http://127.0.0.1:11434/v1`).
    pub base_url: String,
    pub model: String,
    /// The name of the node's variable holding the key (never the key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// What the seat is for, as the model's system message.
    #[serde(default)]
    pub instructions: String,
    /// The same, read from a file when the seat is taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions_file: Option<PathBuf>,
    /// Completions per turn before it is broken off.
    #[serde(default = "default_max_rounds")]
    pub max_rounds: u32,
    #[serde(default = "default_max_output_tokens")]
    pub max_output_tokens: u32,
    #[serde(default)]
    pub temperature: f32,
    /// How long one completion may take.
    #[serde(default = "default_request_timeout_seconds")]
    pub request_timeout_seconds: u64,
}

fn default_max_rounds() -> u32 {
    8
}

fn default_max_output_tokens() -> u32 {
    1024
}

fn default_request_timeout_seconds() -> u64 {
    120
}

impl ModelConfig {
    /// `model` at `base_url`, every other setting its default.
    pub fn new(base_url: &str, model: &str) -> ModelConfig {
        ModelConfig {
            base_url: base_url.into(),
            model: model.into(),
            api_key_env: None,
            instructions: String::new(),
            instructions_file: None,
            max_rounds: default_max_rounds(),
            max_output_tokens: default_max_output_tokens(),
            temperature: 0.0,
            request_timeout_seconds: default_request_timeout_seconds(),
        }
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig::Echo(EchoConfig::default())
    }
}

/// How a turn of the echo agent breaks on purpose (tests and drills).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EchoFailure {
    /// `fail_round` fails before its outbound effect is posted.
    BeforeOutside,
    /// `fail_round` posts its outbound effect, then the next round fails.
    AfterOutside,
    /// `fail_round` panics.
    Panic,
}

/// The echo agent's settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EchoConfig {
    /// Rounds per turn (at least 1); the outbound effect is posted in the
    /// last one.
    pub rounds: u32,
    /// How long each round thinks, in milliseconds.
    pub round_delay_ms: u64,
    /// Break the turn in this round (0: never).
    pub fail_round: u32,
    /// How `fail_round` breaks.
    pub fail: EchoFailure,
    /// Honour the drill directives a trigger's body may carry (`echo`
    /// failure overrides, `run`, `forward_to`, `answered`). Off by default:
    /// mail is data. Only a node with `node.environment = "test"` honours
    /// it, and `crewlet check` refuses it anywhere else.
    pub drills: bool,
}

impl Default for EchoConfig {
    fn default() -> Self {
        EchoConfig {
            rounds: 1,
            round_delay_ms: 0,
            fail_round: 0,
            fail: EchoFailure::BeforeOutside,
            drills: false,
        }
    }
}

/// The command agent's settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandConfig {
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// How long the release hook waits for the child to exit after
    /// SIGTERM before it calls the teardown failed (the seat goes undead).
    #[serde(default = "default_stop_wait_ms")]
    pub stop_wait_ms: u64,
    /// How long the engine waits for the child's answer to one round.
    #[serde(default = "default_round_timeout_seconds")]
    pub round_timeout_seconds: u64,
    /// Variables the child gets, as written. The child starts from a clean
    /// environment: `PATH`, `HOME`, `LANG`, `CREWLET_SEAT`, `CREWLET_NODE`,
    /// these, and `env_from` — never the node's own.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names of the node's environment variables passed through to the
    /// child (a variable the node does not have is left out).
    #[serde(default)]
    pub env_from: Vec<String>,
}

fn default_stop_wait_ms() -> u64 {
    2000
}

fn default_round_timeout_seconds() -> u64 {
    600
}

impl CommandConfig {
    pub fn new(argv: Vec<String>) -> CommandConfig {
        CommandConfig {
            argv,
            stop_wait_ms: default_stop_wait_ms(),
            round_timeout_seconds: default_round_timeout_seconds(),
            env: BTreeMap::new(),
            env_from: Vec::new(),
        }
    }

    /// The child's whole environment, from the node's `node_env`: the
    /// basics, the seat and node, the role's `env`, and `env_from` passed
    /// through. Pure.
    pub fn child_env(
        &self,
        seat: &str,
        node: &str,
        node_env: &dyn Fn(&str) -> Option<String>,
    ) -> BTreeMap<String, String> {
        child_env_of(seat, node, node_env, &self.env, &self.env_from)
    }
}

/// Pure: a child's environment — [`base_child_env`], then the names
/// `env_from` passes through from the node (a name it lacks is left out),
/// then `env` as written.
pub fn child_env_of(
    seat: &str,
    node: &str,
    node_env: &dyn Fn(&str) -> Option<String>,
    env: &BTreeMap<String, String>,
    env_from: &[String],
) -> BTreeMap<String, String> {
    let mut out = base_child_env(seat, node, node_env);
    for name in env_from {
        if let Some(v) = node_env(name) {
            out.insert(name.clone(), v);
        }
    }
    for (k, v) in env {
        out.insert(k.clone(), v.clone());
    }
    out
}

/// Variables every child the node starts (a command agent, a detached
/// run) gets from the node's environment, whatever else it is given.
pub const CHILD_BASICS: [&str; 3] = ["PATH", "HOME", "LANG"];

/// Pure: a child's environment before its role adds anything: `PATH`,
/// `HOME` and `LANG` from the node, `CREWLET_SEAT` and `CREWLET_NODE`.
pub fn base_child_env(
    seat: &str,
    node: &str,
    node_env: &dyn Fn(&str) -> Option<String>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for k in CHILD_BASICS {
        if let Some(v) = node_env(k) {
            out.insert(k.to_string(), v);
        }
    }
    out.insert("CREWLET_SEAT".into(), seat.to_string());
    out.insert("CREWLET_NODE".into(), node.to_string());
    out
}

/// Where a seat may run: node ids and/or labels it needs. Empty = anywhere.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlacementConfig {
    pub nodes: Vec<String>,
    pub labels: Vec<String>,
}

/// Whether a node with `node_id` and `labels` may run a seat placed by `p`:
/// every listed node id names it (when any are listed) and it carries every
/// listed label.
pub fn matches_placement(node_id: &str, labels: &[String], p: &PlacementConfig) -> bool {
    (p.nodes.is_empty() || p.nodes.iter().any(|n| n == node_id))
        && p.labels.iter().all(|l| labels.contains(l))
}
