//! The built-in `echo` agent: for each trigger a diary note, one
//! work-keyed episode per turn, and its outbound effect posted on
//! `crewlet.outbox.{handle}` in the turn's last round.
//!
//! It breaks on purpose when its role says so (`fail_round`, `fail`): fail
//! a round before or after its outbound effect, or panic — so every path
//! of the broken-turn policy can be driven.
//!
//! Mail is data. Only with drills on — the role's `drills = true` on a
//! node whose `node.environment` is `test` — does a trigger's body steer
//! the agent: an `echo` object overriding the role's settings,
//! `forward_to` (a seat handle: an `a2a_message` to it), `answered` (chat
//! message ids the turn reports it answered in its thread) and `run` (the
//! arguments of a `run_detached` call, asked for in the round `run.round`
//! names — the last one, beside the outbound effect, by default; the turn
//! is parked after that round, so the rounds after it never run) and
//! `tools` (calls of the seat's tools, each `{name, args, round}`). Without
//! drills every body is only echoed back.

use std::time::Duration;

use serde_json::{Value, json};

use super::agent::{Agent, AgentError, Annotations, Step, ToolCall, ToolResult, TurnInput};
use crate::config::{EchoConfig, EchoFailure};

/// A trigger's `echo` override: any of the role's settings, plus
/// `fail_deliveries` (break only while the delivery count is at most this;
/// 0: on every delivery).
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default)]
struct Override {
    rounds: Option<u32>,
    round_delay_ms: Option<u64>,
    fail_round: Option<u32>,
    fail: Option<EchoFailure>,
    fail_deliveries: Option<u64>,
}

/// The echo agent of one seat.
pub struct EchoAgent {
    cfg: EchoConfig,
    /// The role asked for drills and the node allows them.
    drills: bool,
}

struct Plan {
    rounds: u32,
    delay: Duration,
    fail_round: u32,
    fail: EchoFailure,
}

impl EchoAgent {
    /// The agent for a role's settings; `node_allows_drills` is the node's
    /// own word (its `node.environment` is `test`).
    pub fn new(cfg: EchoConfig, node_allows_drills: bool) -> EchoAgent {
        let drills = cfg.drills && node_allows_drills;
        EchoAgent { cfg, drills }
    }

    /// The drill directive `key` of a trigger's body, when drills are on.
    fn drill<'a>(&self, body: &'a Value, key: &str) -> Option<&'a Value> {
        if self.drills { body.get(key) } else { None }
    }

    fn plan(&self, turn: &TurnInput) -> Plan {
        let o: Override = turn
            .triggers
            .iter()
            .find_map(|t| self.drill(&t.body, "echo"))
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default();
        let mut fail_round = o.fail_round.unwrap_or(self.cfg.fail_round);
        if let Some(n) = o.fail_deliveries
            && n > 0
            && turn.delivered > n
        {
            fail_round = 0;
        }
        Plan {
            rounds: o.rounds.unwrap_or(self.cfg.rounds).max(1),
            delay: Duration::from_millis(o.round_delay_ms.unwrap_or(self.cfg.round_delay_ms)),
            fail_round,
            fail: o.fail.unwrap_or(self.cfg.fail),
        }
    }
}

fn call(id: String, name: &str, args: Value) -> ToolCall {
    ToolCall {
        id,
        name: name.into(),
        args,
        annotations: Annotations::default(),
    }
}

/// The `run_detached` calls a trigger's `run` asks for in `round` (its
/// `round`, clamped to the turn's rounds; the last by default) — none
/// without drills.
fn runs_in(agent: &EchoAgent, turn: &TurnInput, round: u32, rounds: u32) -> Vec<ToolCall> {
    turn.triggers
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let run = agent.drill(&t.body, "run")?;
            let at = run
                .get("round")
                .and_then(Value::as_u64)
                .map_or(rounds, |r| r.clamp(1, u64::from(rounds)) as u32);
            if at != round {
                return None;
            }
            let mut args = run.clone();
            if let Some(o) = args.as_object_mut() {
                o.remove("round");
            }
            Some(call(format!("r{round}-run-{i}"), "run_detached", args))
        })
        .collect()
}

/// The calls a trigger's `tools` asks for in `round` — each `{name, args,
/// round}` (round 1 by default, clamped to the turn's rounds) — none
/// without drills. How the tests drive a seat's MCP tools.
fn tools_in(agent: &EchoAgent, turn: &TurnInput, round: u32, rounds: u32) -> Vec<ToolCall> {
    turn.triggers
        .iter()
        .enumerate()
        .flat_map(|(i, t)| {
            let asked = agent
                .drill(&t.body, "tools")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            asked.into_iter().enumerate().filter_map(move |(j, c)| {
                let at = c
                    .get("round")
                    .and_then(Value::as_u64)
                    .map_or(1, |r| r.clamp(1, u64::from(rounds)) as u32);
                let name = c.get("name").and_then(Value::as_str)?;
                (at == round).then(|| {
                    call(
                        format!("r{round}-tool-{i}-{j}"),
                        name,
                        c.get("args").cloned().unwrap_or(Value::Null),
                    )
                })
            })
        })
        .collect()
}

/// The outbound effect: the turn's triggers echoed, and what the round
/// before told it of its calls (each call's id, whether it succeeded, its
/// output and its error).
fn outbound(turn: &TurnInput, round: u32, results: &[ToolResult]) -> ToolCall {
    let ids: Vec<&str> = turn.triggers.iter().map(|t| t.id.as_str()).collect();
    call(
        format!("r{round}-post"),
        "post_outbox",
        json!({
            "text": format!("echo of {}", ids.join(", ")),
            "triggers": turn.triggers.iter().map(|t| json!({"id": t.id, "type": t.kind, "body": t.body, "from": t.from, "sent_at": t.sent_at})).collect::<Vec<_>>(),
            "results": results.iter().map(|r| json!({"id": r.id, "ok": r.ok, "output": r.output, "error": r.error})).collect::<Vec<_>>(),
        }),
    )
}

#[async_trait::async_trait]
impl Agent for EchoAgent {
    async fn reflect(&self, wake: &Value) -> Result<Option<String>, AgentError> {
        let turn = wake.get("turn_id").and_then(Value::as_str).unwrap_or("?");
        let ids: Vec<&str> = wake
            .get("trigger_ids")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        Ok(Some(format!(
            "reflection on turn {turn}: answered {}",
            ids.join(", ")
        )))
    }

    async fn round(
        &self,
        turn: &TurnInput,
        round: u32,
        results: Vec<ToolResult>,
    ) -> Result<Step, AgentError> {
        let plan = self.plan(turn);
        if !plan.delay.is_zero() {
            tokio::time::sleep(plan.delay).await;
        }
        if plan.fail_round > 0 {
            if round == plan.fail_round {
                match plan.fail {
                    EchoFailure::BeforeOutside => {
                        return Err(AgentError::new(format!(
                            "echo: round {round} fails before its outbound effect, as configured"
                        )));
                    }
                    EchoFailure::Panic => {
                        panic!("echo: round {round} panics, as configured");
                    }
                    EchoFailure::AfterOutside => {
                        return Ok(Step::Calls(vec![outbound(turn, round, &results)]));
                    }
                }
            }
            if round == plan.fail_round + 1 && plan.fail == EchoFailure::AfterOutside {
                return Err(AgentError::new(format!(
                    "echo: round {round} fails after the outbound effect of round {}, as configured",
                    plan.fail_round
                )));
            }
        }
        if round < plan.rounds {
            let mut calls = vec![call(
                format!("r{round}-diary"),
                "diary_write",
                json!({"text": format!("turn {} round {round}: thinking", turn.turn_id)}),
            )];
            calls.extend(runs_in(self, turn, round, plan.rounds));
            calls.extend(tools_in(self, turn, round, plan.rounds));
            return Ok(Step::Calls(calls));
        }
        if round == plan.rounds {
            let mut calls: Vec<ToolCall> = turn
                .triggers
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    call(
                        format!("r{round}-diary-{i}"),
                        "diary_write",
                        json!({"text": format!("saw {} {} in turn {}", t.kind, t.id, turn.turn_id)}),
                    )
                })
                .collect();
            calls.push(call(
                format!("r{round}-episode"),
                "episode_write",
                json!({"summary": format!("echoed {} trigger(s)", turn.triggers.len())}),
            ));
            for (i, t) in turn.triggers.iter().enumerate() {
                if let Some(to) = self.drill(&t.body, "forward_to").and_then(Value::as_str) {
                    calls.push(call(
                        format!("r{round}-a2a-{i}"),
                        "a2a_message",
                        json!({"to": to, "text": format!("forwarded from {}: {}", turn.seat, t.id)}),
                    ));
                }
            }
            calls.extend(runs_in(self, turn, round, plan.rounds));
            calls.extend(tools_in(self, turn, round, plan.rounds));
            calls.push(outbound(turn, round, &results));
            return Ok(Step::Calls(calls));
        }
        let failed: Vec<&str> = results
            .iter()
            .filter(|r| !r.ok)
            .filter_map(|r| r.error.as_deref())
            .collect();
        let answered: Vec<String> = turn
            .triggers
            .iter()
            .filter_map(|t| self.drill(&t.body, "answered").and_then(Value::as_array))
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        Ok(Step::Done {
            result: json!({"echoed": turn.triggers.len(), "tool_errors": failed}),
            answered,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::envelope::Envelope;

    fn turn_with(body: Value) -> TurnInput {
        TurnInput {
            turn_id: "t-1".into(),
            seat: "s0".into(),
            epoch: 1,
            node: "n1".into(),
            work_key: Some("w".into()),
            triggers: vec![Envelope {
                id: "evt-1".into(),
                kind: "task_assigned".into(),
                body,
                thread: None,
                message_id: None,
                from: None,
                sent_at: None,
            }],
            delivered: 1,
            tools: Vec::new(),
        }
    }

    fn drill_mail() -> Value {
        json!({
            "run": {"argv": ["/bin/touch", "/tmp/pwned"]},
            "echo": {"fail_round": 1, "fail": "panic"},
            "forward_to": "s1",
            "answered": ["m-1"],
        })
    }

    async fn names_of(agent: &EchoAgent, turn: &TurnInput) -> (Vec<String>, Vec<String>) {
        let Step::Calls(calls) = agent.round(turn, 1, vec![]).await.unwrap() else {
            panic!("the first round calls tools");
        };
        let Step::Done { answered, .. } = agent.round(turn, 2, vec![]).await.unwrap() else {
            panic!("the round after the last is done");
        };
        (calls.into_iter().map(|c| c.name).collect(), answered)
    }

    #[tokio::test]
    async fn without_drills_mail_is_only_data_and_never_steers_the_agent() {
        let turn = turn_with(drill_mail());
        for (role_drills, node_drills) in [(false, false), (true, false), (false, true)] {
            let agent = EchoAgent::new(
                EchoConfig {
                    drills: role_drills,
                    ..EchoConfig::default()
                },
                node_drills,
            );
            // No panic, no run, no forward, no answered ids: the body is
            // echoed back and nothing else.
            let (names, answered) = names_of(&agent, &turn).await;
            assert_eq!(
                names,
                ["diary_write", "episode_write", "post_outbox"],
                "role drills {role_drills}, node drills {node_drills}"
            );
            assert!(answered.is_empty());
        }
    }

    #[tokio::test]
    async fn with_drills_on_a_test_node_the_directives_steer_the_turn() {
        let agent = EchoAgent::new(
            EchoConfig {
                drills: true,
                ..EchoConfig::default()
            },
            true,
        );
        let mut mail = drill_mail();
        mail.as_object_mut().unwrap().remove("echo");
        let (names, answered) = names_of(&agent, &turn_with(mail)).await;
        assert!(names.contains(&"run_detached".to_string()), "{names:?}");
        assert!(names.contains(&"a2a_message".to_string()), "{names:?}");
        assert_eq!(answered, ["m-1"]);
    }
}
