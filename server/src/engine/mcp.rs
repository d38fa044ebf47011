//! A seat's MCP tool servers (docs/agents.md § Tools): the role's `mcp` servers,
//! started first in the acquire hook — stdio children of the seat, or
//! sessions with shared streamable-HTTP servers — initialised and their
//! tools listed within each server's `start_timeout_seconds`, and stopped
//! in the release hook (sessions closed, children sent SIGTERM and waited
//! for; one that will not exit fails the teardown, and the seat goes
//! undead as it does for a command agent).
//!
//! It owns the sessions and the children. It decides nothing about a turn:
//! the engine (`engine::tools`) executes each call after the fence check,
//! through [`SeatMcp::call`], bounded by the server's call timeout and the
//! result size, and classifies it by the tool's own annotations
//! ([`super::agent::reached_outside`]). The protocol is the official SDK's
//! (`rmcp`); nothing here speaks JSON-RPC itself.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, Tool};
use rmcp::service::{RoleClient, RunningService, ServiceExt};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use tokio::process::Child;
use tokio::sync::Mutex;

use super::agent::{Annotations, ToolSpec};
use crate::config::McpServerConfig;

/// The most of one call's result handed to the agent; past it the result is
/// cut, saying so.
pub const RESULT_LIMIT: usize = 64 * 1024;

/// The most tools one server may list; a server listing more is refused
/// (its tools go into every prompt and every turn's surface).
pub const MAX_TOOLS: usize = 128;

/// The largest one tool's listing may be (name, description and schema as
/// JSON); a server listing a larger one is refused.
pub const TOOL_LISTING_LIMIT: usize = 16 * 1024;

/// Pure: is a server's listing within bounds? `Err` names the tool or the
/// count past the bound.
pub fn listing_bounded(tools: &[Tool]) -> Result<(), ServerError> {
    if tools.len() > MAX_TOOLS {
        return Err(ServerError::TooManyTools(tools.len()));
    }
    for t in tools {
        let size = serde_json::to_string(t)
            .map(|s| s.len())
            .unwrap_or(usize::MAX);
        if size > TOOL_LISTING_LIMIT {
            let name: String = t.name.chars().take(64).collect();
            return Err(ServerError::ToolTooLarge { name, size });
        }
    }
    Ok(())
}

/// Why a seat's servers could not be started.
#[derive(Debug, thiserror::Error)]
#[error("tool server {server:?}: {error}")]
pub struct StartError {
    pub server: String,
    pub error: ServerError,
}

/// What went wrong with one tool server: starting it, listing its tools,
/// or stopping its child. Each says what the node saw, in a sentence about
/// the server ("it …").
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("it lists {0} tools, more than the {MAX_TOOLS} a server may")]
    TooManyTools(usize),
    #[error(
        "its tool {name:?} is {size} bytes as listed, more than the {TOOL_LISTING_LIMIT} a tool may be"
    )]
    ToolTooLarge { name: String, size: usize },
    #[error("cannot list its tools: {0}")]
    Listing(String),
    #[error("did not start, initialise and list its tools within {0}s")]
    StartTimedOut(u64),
    #[error("did not start again within {0}s")]
    RestartTimedOut(u64),
    #[error("it has no program to run (command is empty)")]
    NoProgram,
    #[error("cannot make the seat's working directory: {0}")]
    WorkDir(std::io::Error),
    #[error("cannot start `{program}`: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("cannot start `{0}`: its stdio was not piped")]
    NotPiped(String),
    #[error("`{program}` did not initialise: {error}{status}")]
    ChildNotInitialised {
        program: String,
        error: String,
        /// ` (it exited: …)` when it had, else empty.
        status: String,
    },
    #[error("{url} did not initialise: {error}")]
    UrlNotInitialised { url: String, error: String },
    #[error("header {name}: the node has no variable {var}")]
    HeaderVariable { name: String, var: String },
    #[error("header {name}: {error}")]
    Header { name: String, error: String },
    #[error("cannot wait for it: {0}")]
    Wait(std::io::Error),
    #[error("it did not exit within {wait_ms}ms of SIGTERM nor {kill_ms}ms of SIGKILL")]
    StillRunning { wait_ms: u128, kill_ms: u128 },
}

/// The servers of a seat whose children did not exit when stopped (each
/// is kept, and the next stop tries again).
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.iter().map(|(name, e)| format!("tool server {name:?}: {e}")).collect::<Vec<_>>().join("; "))]
pub struct StopError(pub Vec<(String, ServerError)>);

/// Why a call did not return a result.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No such tool: nothing was sent.
    #[error("{0}")]
    Unknown(String),
    /// Sent, and it failed, timed out or its server is gone: whether it
    /// landed is unknown.
    #[error("{0}")]
    Failed(String),
}

type Session = RunningService<RoleClient, ()>;

/// One running server of a seat.
struct Server {
    name: String,
    cfg: McpServerConfig,
    session: Mutex<Option<Session>>,
    child: Mutex<Option<Child>>,
    tools: Vec<Tool>,
}

/// A stdio server found dead between turns, and whether it was started
/// again (`error` says why not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revival {
    pub server: String,
    pub ended: String,
    pub error: Option<String>,
}

/// The MCP servers of one seat on this node.
pub struct SeatMcp {
    seat: String,
    servers: Vec<Server>,
    /// Where and as whom its stdio children run.
    confinement: crate::config::Confinement,
}

/// Pure: the engine's annotations of an MCP tool, from the server's own.
pub fn annotations_of(tool: &Tool) -> Annotations {
    let a = tool.annotations.as_ref();
    Annotations {
        read_only: a.and_then(|a| a.read_only_hint),
        open_world: a.and_then(|a| a.open_world_hint),
        destructive: a.and_then(|a| a.destructive_hint),
        idempotent: a.and_then(|a| a.idempotent_hint),
    }
}

/// Pure: a call's result as the agent sees it, cut at `limit` bytes of
/// JSON (`truncated: true`, and the first part of its text kept).
pub fn bounded_output(result: &CallToolResult, limit: usize) -> Value {
    let full = json!({
        "content": result.content,
        "structured": result.structured_content,
    });
    let text = full.to_string();
    if text.len() <= limit {
        return full;
    }
    let mut cut = limit.saturating_sub(256).min(text.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    json!({
        "truncated": true,
        "bytes": text.len(),
        "kept": &text[..cut],
        "note": format!("the result was {} bytes; only the first {cut} are kept", text.len()),
    })
}

/// Pure: split `{server}.{tool}` into its parts.
pub fn split_name(name: &str) -> Option<(&str, &str)> {
    name.split_once('.')
        .filter(|(s, t)| !s.is_empty() && !t.is_empty())
}

impl SeatMcp {
    /// A seat with no servers.
    pub fn none(seat: &str) -> SeatMcp {
        SeatMcp {
            seat: seat.to_string(),
            servers: Vec::new(),
            confinement: Default::default(),
        }
    }

    /// Start every server of the seat, in order, each within its start
    /// bound. On the first that fails, the ones already started are
    /// stopped and that failure is returned. `started` is told of each
    /// server that came up, with its tool count.
    pub async fn start(
        seat: &str,
        node: &str,
        cfgs: &[McpServerConfig],
        confinement: crate::config::Confinement,
        started: &(dyn Fn(&str, usize) + Sync),
    ) -> Result<SeatMcp, StartError> {
        let mut me = SeatMcp::none(seat);
        me.confinement = confinement;
        for cfg in cfgs {
            let bound = Duration::from_secs(cfg.start_timeout_seconds);
            let starting = start_one(seat, node, cfg, &me.confinement);
            let up = match tokio::time::timeout(bound, starting).await {
                Ok(r) => r,
                Err(_) => Err(ServerError::StartTimedOut(cfg.start_timeout_seconds)),
            };
            match up {
                Ok(server) => {
                    started(&server.name, server.tools.len());
                    me.servers.push(server);
                }
                Err(error) => {
                    if let Err(e) = me.stop().await {
                        tracing::warn!(seat, error = %e, "a tool server started before the failure did not stop");
                    }
                    return Err(StartError {
                        server: cfg.name.clone(),
                        error,
                    });
                }
            }
        }
        Ok(me)
    }

    /// The seat's MCP tools, named `{server}.{tool}`.
    pub fn tools(&self) -> Vec<ToolSpec> {
        self.servers
            .iter()
            .flat_map(|s| {
                s.tools.iter().map(|t| ToolSpec {
                    name: format!("{}.{}", s.name, t.name),
                    description: t.description.as_deref().unwrap_or_default().to_string(),
                    input_schema: Value::Object((*t.input_schema).clone()),
                    annotations: annotations_of(t),
                })
            })
            .collect()
    }

    /// The annotations of the tool `name` (`{server}.{tool}`), if the
    /// seat has it.
    pub fn annotations(&self, name: &str) -> Option<Annotations> {
        let (server, tool) = split_name(name)?;
        let s = self.servers.iter().find(|s| s.name == server)?;
        s.tools.iter().find(|t| t.name == tool).map(annotations_of)
    }

    /// The process ids of the seat's stdio children still held.
    pub fn child_pids(&self) -> Vec<u32> {
        self.servers
            .iter()
            .filter_map(|s| s.child.try_lock().ok()?.as_ref()?.id())
            .collect()
    }

    /// How many tools `server` listed.
    pub fn tool_count(&self, server: &str) -> usize {
        self.servers
            .iter()
            .find(|s| s.name == server)
            .map_or(0, |s| s.tools.len())
    }

    /// The names of the seat's servers.
    pub fn server_names(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.name.clone()).collect()
    }

    /// Each server: its name, whether it is up (a session, and for a
    /// stdio server a child that has not exited), and how many tools it
    /// listed. A server busy being started or stopped reads as down.
    pub fn states(&self) -> Vec<(String, bool, usize)> {
        self.servers
            .iter()
            .map(|s| {
                let session = s.session.try_lock().is_ok_and(|g| g.is_some());
                let child = s.cfg.url.is_some()
                    || s.child.try_lock().is_ok_and(|mut g| {
                        g.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
                    });
                (s.name.clone(), session && child, s.tools.len())
            })
            .collect()
    }

    /// Call `name` (`{server}.{tool}`) with `args`, within the server's
    /// call timeout. A result the server marks as an error is `Failed`,
    /// carrying its output.
    pub async fn call(&self, name: &str, args: &Value) -> Result<Value, (CallError, Value)> {
        let unknown = |why: String| (CallError::Unknown(why), Value::Null);
        let (server, tool) =
            split_name(name).ok_or_else(|| unknown(format!("no tool named {name:?}")))?;
        let s = self
            .servers
            .iter()
            .find(|s| s.name == server)
            .ok_or_else(|| unknown(format!("no tool server {server:?} on seat {:?}", self.seat)))?;
        if !s.tools.iter().any(|t| t.name == tool) {
            return Err(unknown(format!(
                "tool server {server:?} has no tool {tool:?}"
            )));
        }
        let arguments = match args {
            Value::Object(m) => Some(m.clone()),
            Value::Null => None,
            other => {
                return Err(unknown(format!(
                    "{name}: the arguments must be an object, not {other}"
                )));
            }
        };
        let peer = {
            let session = s.session.lock().await;
            match session.as_ref() {
                Some(sess) => sess.peer().clone(),
                None => {
                    return Err((
                        CallError::Failed(format!("tool server {server:?} is stopped")),
                        Value::Null,
                    ));
                }
            }
        };
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = arguments;
        let timeout = Duration::from_secs(s.cfg.call_timeout_seconds);
        match tokio::time::timeout(timeout, peer.call_tool(params)).await {
            Err(_) => Err((
                CallError::Failed(format!(
                    "{name}: no answer within {}s (call_timeout_seconds)",
                    s.cfg.call_timeout_seconds
                )),
                Value::Null,
            )),
            Ok(Err(e)) => Err((CallError::Failed(format!("{name}: {e}")), Value::Null)),
            Ok(Ok(r)) => {
                let out = bounded_output(&r, RESULT_LIMIT);
                if r.is_error == Some(true) {
                    Err((
                        CallError::Failed(format!("{name}: the tool reported an error")),
                        out,
                    ))
                } else {
                    Ok(out)
                }
            }
        }
    }

    /// Stop every server: sessions closed, children sent SIGTERM and
    /// waited for `stop_wait_ms`. `Err` names a child that did not exit
    /// (it is kept, and the next stop tries again).
    pub async fn stop(&self) -> Result<(), StopError> {
        let mut stuck = Vec::new();
        for s in &self.servers {
            if let Some(session) = s.session.lock().await.take() {
                let _ = tokio::time::timeout(Duration::from_secs(2), session.cancel()).await;
            }
            let mut child = s.child.lock().await;
            if let Some(c) = child.as_mut() {
                match stop_child(c, Duration::from_millis(s.cfg.stop_wait_ms)).await {
                    Ok(()) => *child = None,
                    Err(e) => stuck.push((s.name.clone(), e)),
                }
            }
        }
        if stuck.is_empty() {
            Ok(())
        } else {
            Err(StopError(stuck))
        }
    }

    /// Start again every stdio server whose child died since it was
    /// started (between turns), within its start bound. Answers, per
    /// server found dead, its name, how it ended, and whether it is up
    /// again; one that cannot be started again leaves its calls failing.
    pub async fn revive(&self, node: &str) -> Vec<Revival> {
        let mut out = Vec::new();
        for s in &self.servers {
            if s.cfg.url.is_some() {
                continue;
            }
            let mut child = s.child.lock().await;
            let ended = match child.as_mut().map(|c| c.try_wait()) {
                Some(Ok(Some(status))) => status.to_string(),
                None => "it was not running".to_string(),
                _ => continue,
            };
            let bound = Duration::from_secs(s.cfg.start_timeout_seconds);
            let starting = spawn_stdio(&self.seat, node, &s.cfg, &self.confinement);
            let again = tokio::time::timeout(bound, starting).await;
            let mut session = s.session.lock().await;
            let error = match again {
                Ok(Ok((new_session, new_child))) => {
                    *session = Some(new_session);
                    *child = Some(new_child);
                    None
                }
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => {
                    Some(ServerError::RestartTimedOut(s.cfg.start_timeout_seconds).to_string())
                }
            };
            if error.is_some() {
                *session = None;
                *child = None;
            }
            out.push(Revival {
                server: s.name.clone(),
                ended,
                error,
            });
        }
        out
    }
}

/// Start, initialise and list one server.
async fn start_one(
    seat: &str,
    node: &str,
    cfg: &McpServerConfig,
    confinement: &crate::config::Confinement,
) -> Result<Server, ServerError> {
    let (session, child) = match &cfg.url {
        Some(url) => (connect_http(url, cfg).await?, None),
        None => {
            let (session, child) = spawn_stdio(seat, node, cfg, confinement).await?;
            (session, Some(child))
        }
    };
    let tools = match session.peer().list_all_tools().await {
        Ok(t) => t,
        Err(e) => {
            let _ = session.cancel().await;
            return Err(ServerError::Listing(e.to_string()));
        }
    };
    if let Err(e) = listing_bounded(&tools) {
        let _ = session.cancel().await;
        return Err(e);
    }
    Ok(Server {
        name: cfg.name.clone(),
        cfg: cfg.clone(),
        session: Mutex::new(Some(session)),
        child: Mutex::new(child),
        tools,
    })
}

/// The seat's own child, speaking MCP on its stdin and stdout, started
/// from a clean environment and dying with the node.
async fn spawn_stdio(
    seat: &str,
    node: &str,
    cfg: &McpServerConfig,
    confinement: &crate::config::Confinement,
) -> Result<(Session, Child), ServerError> {
    let Some((program, args)) = cfg.command.split_first() else {
        return Err(ServerError::NoProgram);
    };
    let env = cfg.child_env(seat, node, &|k| std::env::var(k).ok());
    let mut command = super::children::clean_command(program, args, env);
    super::children::confine(&mut command, confinement, seat).map_err(ServerError::WorkDir)?;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|source| ServerError::Spawn {
            program: program.clone(),
            source,
        })?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(ServerError::NotPiped(program.clone()));
    };
    match ().serve((stdout, stdin)).await {
        Ok(session) => Ok((session, child)),
        Err(e) => {
            let status = match child.try_wait() {
                Ok(Some(s)) => format!(" (it exited: {s})"),
                _ => String::new(),
            };
            let _ = child.start_kill();
            Err(ServerError::ChildNotInitialised {
                program: program.clone(),
                error: e.to_string(),
                status,
            })
        }
    }
}

/// A session with a shared server over streamable HTTP, its headers read
/// from the node's environment.
async fn connect_http(url: &str, cfg: &McpServerConfig) -> Result<Session, ServerError> {
    super::ensure_tls_provider();
    let mut headers = std::collections::HashMap::new();
    for (name, var) in &cfg.headers_from {
        let value = std::env::var(var).map_err(|_| ServerError::HeaderVariable {
            name: name.clone(),
            var: var.clone(),
        })?;
        let name = http::HeaderName::try_from(name.as_str()).map_err(|e| ServerError::Header {
            name: format!("{name:?}"),
            error: e.to_string(),
        })?;
        let value =
            http::HeaderValue::try_from(value.as_str()).map_err(|e| ServerError::Header {
                name: name.to_string(),
                error: e.to_string(),
            })?;
        headers.insert(name, value);
    }
    let config =
        StreamableHttpClientTransportConfig::with_uri(url.to_string()).custom_headers(headers);
    let transport = StreamableHttpClientTransport::from_config(config);
    ().serve(transport)
        .await
        .map_err(|e| ServerError::UrlNotInitialised {
            url: url.to_string(),
            error: e.to_string(),
        })
}

/// SIGTERM to the child's group, up to `wait` to exit, then SIGKILL.
async fn stop_child(c: &mut Child, wait: Duration) -> Result<(), ServerError> {
    use super::children::{KILL_WAIT, NotStopped, terminate};
    match terminate(c, wait).await {
        Ok(_) => Ok(()),
        Err(NotStopped::Wait(e)) => Err(ServerError::Wait(e)),
        Err(NotStopped::StillRunning) => Err(ServerError::StillRunning {
            wait_ms: wait.as_millis(),
            kill_ms: KILL_WAIT.as_millis(),
        }),
    }
}

/// The seats' MCP servers on this node, by handle: the engine's tools read
/// it to execute a call; the acquire and release hooks fill and empty it.
#[derive(Clone, Default)]
pub struct McpSeats {
    seats: Arc<std::sync::Mutex<BTreeMap<String, Arc<SeatMcp>>>>,
}

impl McpSeats {
    pub fn get(&self, seat: &str) -> Option<Arc<SeatMcp>> {
        self.seats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(seat)
            .cloned()
    }

    pub fn insert(&self, seat: &str, mcp: Arc<SeatMcp>) {
        self.seats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(seat.to_string(), mcp);
    }

    pub fn remove(&self, seat: &str) -> Option<Arc<SeatMcp>> {
        self.seats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(seat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_name_is_its_server_and_its_tool() {
        assert_eq!(split_name("fs.read_file"), Some(("fs", "read_file")));
        assert_eq!(split_name("fs.a.b"), Some(("fs", "a.b")));
        assert_eq!(split_name("diary_write"), None);
        assert_eq!(split_name(".x"), None);
    }

    #[test]
    fn a_huge_result_is_cut_saying_so() {
        let big =
            CallToolResult::success(vec![rmcp::model::ContentBlock::text("x".repeat(100_000))]);
        let out = bounded_output(&big, RESULT_LIMIT);
        assert_eq!(out["truncated"], true);
        assert!(out["kept"].as_str().unwrap().len() <= RESULT_LIMIT);
        let small = CallToolResult::success(vec![rmcp::model::ContentBlock::text("ok")]);
        let out = bounded_output(&small, RESULT_LIMIT);
        assert!(out.get("truncated").is_none());
        assert_eq!(out["content"][0]["text"], "ok");
    }
}
