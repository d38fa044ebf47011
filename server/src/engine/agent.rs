//! What runs a turn: the [`Agent`] trait, the round protocol between an
//! agent and the engine, and the rule that says whether a tool call
//! reached outside the engine (spec § A turn that broke halfway).
//!
//! A turn is rounds. In each round the agent answers with tool calls (the
//! engine executes them, each only after the fence check, and hands the
//! results back in the next round) or with its final result. The agent
//! never executes a tool itself: the engine does, so the engine's own
//! record of what reached outside is what the broken-turn policy reads.
//! One agent instance serves one seat on one node; it is started in the
//! acquire hook and stopped in the release hook.

use serde::{Deserialize, Serialize};

use super::envelope::Envelope;

/// What an agent is told about the turn it runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurnInput {
    /// Names this one run (a re-run of the same work gets another).
    pub turn_id: String,
    pub seat: String,
    /// The epoch the turn was admitted under.
    pub epoch: u64,
    pub node: String,
    /// The identity of the work, stable across re-runs (spec § Keying a
    /// write on the work); `None` for a turn with no ledgered trigger.
    pub work_key: Option<String>,
    pub triggers: Vec<Envelope>,
    /// The highest delivery count among the triggers (1 on a first try).
    pub delivered: u64,
    /// The seat's tools this turn: the built-ins and every tool of the
    /// role's MCP servers (`{server}.{tool}`).
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
}

/// One tool an agent may call, as it is told with each turn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The JSON schema of the tool's arguments.
    #[serde(default)]
    pub input_schema: serde_json::Value,
    #[serde(default)]
    pub annotations: Annotations,
}

/// A tool's own classification. `None` is unclassified, which proves
/// nothing either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Annotations {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world: Option<bool>,
    /// It may destroy what it touches (MCP `destructiveHint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive: Option<bool>,
    /// Calling it twice with the same arguments does no more than once
    /// (MCP `idempotentHint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
}

/// Where a tool's implementation lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Implemented by the engine itself.
    FirstParty,
    /// Served by one of the role's MCP servers.
    Mcp,
}

/// The spec's narrow rule: a call counts as having reached outside the
/// engine only when it is MCP-backed and not positively annotated
/// read-only, or when its annotations say it is open-world. A tool nobody
/// classified proves nothing.
pub fn reached_outside(backing: Backing, a: Annotations) -> bool {
    (backing == Backing::Mcp && a.read_only != Some(true)) || a.open_world == Some(true)
}

/// One tool call an agent asks for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The agent's name for this call; the result carries it back.
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub args: serde_json::Value,
    #[serde(default)]
    pub annotations: Annotations,
}

/// What a tool call returned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    pub id: String,
    pub ok: bool,
    #[serde(default)]
    pub output: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ToolResult {
    pub fn ok(id: &str, output: serde_json::Value) -> ToolResult {
        ToolResult {
            id: id.to_string(),
            ok: true,
            output,
            error: None,
        }
    }

    pub fn err(id: &str, error: impl Into<String>) -> ToolResult {
        ToolResult {
            id: id.to_string(),
            ok: false,
            output: serde_json::Value::Null,
            error: Some(error.into()),
        }
    }
}

/// What an agent answers for one round.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Execute these, then ask me again with their results.
    Calls(Vec<ToolCall>),
    /// The turn is finished. `answered` names the chat messages (their
    /// `message_id`) the turn answered in its thread without being woken
    /// for them; the ledger records them beside the triggers.
    Done {
        result: serde_json::Value,
        answered: Vec<String>,
    },
}

/// An agent that could not go on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AgentError(pub String);

impl AgentError {
    pub fn new(m: impl Into<String>) -> AgentError {
        AgentError(m.into())
    }
}

/// What runs a seat's turns.
#[async_trait::async_trait]
pub trait Agent: Send + Sync + 'static {
    /// The acquire hook's first step: start what the seat needs (a
    /// command agent's child process). An error refuses the seat.
    async fn start(&self) -> Result<(), AgentError> {
        Ok(())
    }

    /// One round of `turn` (rounds count from 1). `results` are the
    /// previous round's tool results, in call order (empty in round 1).
    async fn round(
        &self,
        turn: &TurnInput,
        round: u32,
        results: Vec<ToolResult>,
    ) -> Result<Step, AgentError>;

    /// Post-turn reflection, run where the seat is held (a
    /// `reflection_due` wake on the seat's reflect subject): a diary note
    /// to keep, or `None`.
    async fn reflect(&self, _wake: &serde_json::Value) -> Result<Option<String>, AgentError> {
        Ok(None)
    }

    /// The turn ended before the agent said it was done (fenced, stopped,
    /// broken): drop whatever it keeps for it.
    async fn abort(&self, _turn_id: &str, _reason: &str) {}

    /// The tokens the turn spent (a model agent's completions, as its
    /// endpoint reported them), once it has ended; `None` for an agent
    /// that spends none.
    fn tokens(&self, _turn_id: &str) -> Option<u64> {
        None
    }

    /// The release hook: stop what `start` started. An error (a child that
    /// will not die) makes the seat undead; it is called again on every
    /// heartbeat until it succeeds.
    async fn stop(&self) -> Result<(), AgentError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_mcp_without_read_only_or_open_world_reaches_outside() {
        let opts = [None, Some(false), Some(true)];
        for backing in [Backing::FirstParty, Backing::Mcp] {
            for read_only in opts {
                for open_world in opts {
                    let a = Annotations {
                        read_only,
                        open_world,
                        ..Annotations::default()
                    };
                    let expected = open_world == Some(true)
                        || (backing == Backing::Mcp && read_only != Some(true));
                    assert_eq!(reached_outside(backing, a), expected, "{backing:?} {a:?}");
                }
            }
        }
        // The cases the spec names outright.
        assert!(
            !reached_outside(Backing::FirstParty, Annotations::default()),
            "an unclassified first-party tool proves nothing"
        );
        assert!(reached_outside(Backing::Mcp, Annotations::default()));
        assert!(!reached_outside(
            Backing::Mcp,
            Annotations {
                read_only: Some(true),
                ..Annotations::default()
            }
        ));
    }

    #[test]
    fn tool_calls_decode_with_annotations_optional() {
        let c: ToolCall =
            serde_json::from_str(r#"{"id":"c1","name":"post_outbox","args":{"text":"hi"}}"#)
                .unwrap();
        assert_eq!(c.annotations, Annotations::default());
        let c: ToolCall = serde_json::from_str(
            r#"{"id":"c2","name":"x","annotations":{"read_only":true,"open_world":false}}"#,
        )
        .unwrap();
        assert_eq!(c.annotations.read_only, Some(true));
        assert_eq!(c.args, serde_json::Value::Null);
    }
}
