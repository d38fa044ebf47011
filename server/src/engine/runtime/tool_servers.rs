//! A seat's MCP tool servers as the turn engine runs them: started with
//! the seat, revived when one exits, stopped at release; their tools and
//! states as pages show them.

use std::sync::Arc;

use crate::events::Event;
use crate::seat::host::HookError;

use super::TurnEngine;

impl TurnEngine {
    /// Start the role's MCP servers for `handle` (a seat already holding
    /// them, from a release not finished yet, keeps them). A server that
    /// cannot start refuses the seat here, named in `mcp_server_failed`.
    pub(super) async fn start_tool_servers(&self, handle: &str) -> Result<(), HookError> {
        if self.tools.mcp.get(handle).is_some() {
            return Ok(());
        }
        let company = self.company.borrow().clone();
        let cfgs = company
            .roles
            .iter()
            .find(|r| r.handle == handle)
            .map(|r| r.mcp.clone())
            .unwrap_or_default();
        if cfgs.is_empty() {
            return Ok(());
        }
        let events = self.events.clone();
        let started = |server: &str, tools: usize| {
            events.emit(Event::McpServerStarted {
                seat: handle.to_string(),
                server: server.to_string(),
                tools,
            })
        };
        let confinement = self.policy.confinement.clone();
        match crate::engine::mcp::SeatMcp::start(
            handle,
            &self.node_id,
            &cfgs,
            confinement,
            &started,
        )
        .await
        {
            Ok(m) => {
                self.tools.mcp.insert(handle, Arc::new(m));
                Ok(())
            }
            Err(e) => {
                self.events.emit(Event::McpServerFailed {
                    seat: handle.to_string(),
                    server: e.server.clone(),
                    error: e.error.to_string(),
                });
                Err(HookError::new("tool servers", e.to_string()))
            }
        }
    }

    /// Before a turn: a stdio tool server that died since the last one is
    /// started again, with a warning and `mcp_server_exited` (reason
    /// `died: …`), then `mcp_server_started` — or `mcp_server_failed`, its
    /// calls failing this turn.
    pub(super) async fn revive_tool_servers(&self, handle: &str) {
        let Some(m) = self.tools.mcp.get(handle) else {
            return;
        };
        for r in m.revive(&self.node_id).await {
            tracing::warn!(seat = handle, server = %r.server, ended = %r.ended, "a tool server died between turns; starting it again");
            self.events.emit(Event::McpServerExited {
                seat: handle.to_string(),
                server: r.server.clone(),
                reason: format!("died: {}", r.ended),
            });
            match r.error {
                None => self.events.emit(Event::McpServerStarted {
                    seat: handle.to_string(),
                    tools: m.tool_count(&r.server),
                    server: r.server,
                }),
                Some(error) => self.events.emit(Event::McpServerFailed {
                    seat: handle.to_string(),
                    server: r.server,
                    error,
                }),
            }
        }
    }

    /// Stop the seat's MCP servers. A child that will not exit keeps them
    /// registered and fails the teardown (the seat stays undead and the
    /// stop is tried again).
    pub(super) async fn stop_tool_servers(&self, handle: &str) -> Result<(), HookError> {
        let Some(m) = self.tools.mcp.get(handle) else {
            return Ok(());
        };
        m.stop()
            .await
            .map_err(|e| HookError::new("tool servers", e.to_string()))?;
        self.tools.mcp.remove(handle);
        for server in m.server_names() {
            self.events.emit(Event::McpServerExited {
                seat: handle.to_string(),
                server,
                reason: "stopped".into(),
            });
        }
        Ok(())
    }

    /// The tools the agent of `handle` is told with each turn: the
    /// built-ins and the seat's MCP tools while it holds them here.
    pub fn tool_surface(&self, handle: &str) -> Vec<crate::engine::agent::ToolSpec> {
        self.tools.surface(handle)
    }

    /// The seat's MCP servers here (name, up, tools listed); `None` when
    /// it holds none here.
    pub fn tool_server_states(&self, handle: &str) -> Option<Vec<(String, bool, usize)>> {
        self.tools.mcp.get(handle).map(|m| m.states())
    }

    /// The process ids of the seat's MCP children on this node.
    pub fn tool_server_pids(&self, handle: &str) -> Vec<u32> {
        self.tools
            .mcp
            .get(handle)
            .map(|m| m.child_pids())
            .unwrap_or_default()
    }
}
