//! One turn: rounds between an agent and the engine's tools, the in-turn
//! fence, a person's stop, and — as a pure function — what a turn's ending
//! means for its triggers (spec § A turn that broke halfway, § Fencing).
//!
//! [`run`] drives the rounds. The fence (the epoch the turn was admitted
//! under) is checked at the top of every round and again before each tool
//! call; a person's stop is honoured at the round boundary, after the
//! ownership check (a turn on a seat that moved is the successor's to stop
//! or not). A round that started a detached run ([`parks`]) or asked a
//! person to approve a call ([`Executed::parks`]) is the turn's last: the
//! turn is parked, and its continuation is the run's (or the approval's)
//! resume turn. A panic anywhere in the turn is caught here and never unwinds
//! into the queue. [`settle`] turns the ending and the turn's own record of
//! whether it reached outside the engine into: record in the ledger or
//! not, and Ack, Nak or Defer.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::FutureExt;

use super::agent::{Agent, Step, ToolCall, ToolResult, TurnInput};

/// How a turn ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Ending {
    /// The agent said it was done.
    Done {
        result: serde_json::Value,
        answered: Vec<String>,
    },
    /// The agent (or the round limit) broke the turn.
    Broke(String),
    /// The fence tripped: this node no longer holds the seat at the
    /// turn's epoch.
    Fenced,
    /// A person stopped it (`ErrStoppedByPerson`).
    Stopped { by: String },
    /// A round started a detached run (`run_detached`) or asked for an
    /// approval: the turn ends after that round, complete for now; its
    /// continuation is the resume turn carrying the run's result (or the
    /// approved call's). `on`: the run and approval ids.
    Parked { on: Vec<String> },
    /// It panicked.
    Panicked(String),
}

impl Ending {
    /// The outcome's name in events.
    pub fn name(&self) -> &'static str {
        match self {
            Ending::Done { .. } => "completed",
            Ending::Broke(_) => "failed",
            Ending::Fenced => "fenced",
            Ending::Stopped { .. } => "stopped",
            Ending::Parked { .. } => "parked",
            Ending::Panicked(_) => "panicked",
        }
    }

    pub fn error(&self) -> Option<String> {
        match self {
            Ending::Broke(e) | Ending::Panicked(e) => Some(e.clone()),
            Ending::Stopped { by } => Some(format!("stopped by {by}")),
            Ending::Fenced => Some("the seat is no longer held here at this epoch".into()),
            Ending::Done { .. } | Ending::Parked { .. } => None,
        }
    }
}

/// What happens to a turn's triggers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Ack,
    /// Redelivered, and runs again.
    Nak,
    /// Handed back at once, the attachment quiesced: the seat's owner is
    /// entitled to it.
    Defer,
}

/// [`settle`]'s answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settlement {
    /// Record the triggers in the completion ledger.
    pub record: bool,
    pub verdict: Verdict,
    /// When the triggers will not come back although the turn did not
    /// finish: why (published as `turn_trigger_skipped`).
    pub given_up: Option<&'static str>,
    /// Publish `turn.guard_breach` and set the seat's last error.
    pub guard_breach: bool,
}

/// Pure: what a turn's ending means, from the turn's own record of whether
/// a call reached outside the engine.
pub fn settle(ending: &Ending, reached_outside: bool) -> Settlement {
    let s = |record, verdict, given_up, guard_breach| Settlement {
        record,
        verdict,
        given_up,
        guard_breach,
    };
    match ending {
        Ending::Done { .. } => s(true, Verdict::Ack, None, false),
        // It reached outside (the run started) and is complete for now:
        // the run's resume continues it, so its triggers never come back.
        Ending::Parked { .. } => s(true, Verdict::Ack, None, false),
        // A successor would reach the same defect, having repeated
        // whatever came before it.
        Ending::Panicked(_) => s(true, Verdict::Ack, Some("panicked"), true),
        // The person stopped it so that it would not go on.
        Ending::Stopped { .. } => s(true, Verdict::Ack, Some("stopped_by_person"), false),
        Ending::Broke(_) if reached_outside => {
            s(true, Verdict::Ack, Some("broke_after_outside_call"), false)
        }
        Ending::Broke(_) => s(false, Verdict::Nak, None, false),
        Ending::Fenced if reached_outside => {
            s(true, Verdict::Ack, Some("fenced_after_outside_call"), false)
        }
        Ending::Fenced => s(false, Verdict::Defer, None, false),
    }
}

/// The seat as a running turn sees it: the fence and a person's stop.
pub trait TurnGuard: Send + Sync {
    /// Does this node still hold the seat at the turn's epoch?
    fn holds(&self) -> bool;
    /// Has a person asked this turn to stop? (`Some(who)`)
    fn stop_requested(&self) -> Option<String>;
}

/// What executing one tool call came to.
#[derive(Clone, Debug, PartialEq)]
pub struct Executed {
    pub result: ToolResult,
    /// Whether the call reached outside the engine.
    pub reached: bool,
    /// The run or approval the call parked the turn on — said by the
    /// engine, never read from a tool's output.
    pub parks: Option<String>,
}

impl Executed {
    /// A call that parked nothing.
    pub fn of(result: ToolResult, reached: bool) -> Executed {
        Executed {
            result,
            reached,
            parks: None,
        }
    }
}

/// What executes one tool call.
#[async_trait::async_trait]
pub trait ToolRunner: Send + Sync {
    async fn execute(&self, turn: &TurnInput, call: &ToolCall) -> Executed;
}

/// A turn's own record.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnRecord {
    pub ending: Ending,
    pub reached_outside: bool,
    pub rounds: u32,
    pub calls: u32,
    /// How long it ran.
    pub duration: std::time::Duration,
}

/// Pure: the detached run a call started, if it did — a `run_detached`
/// call the engine executed and answered `ok` (a run started, or the one a
/// re-run of the same work started before). Such a call parks the turn.
pub fn parks(call: &ToolCall, result: &ToolResult) -> Option<String> {
    if call.name != "run_detached" || !result.ok {
        return None;
    }
    Some(
        result
            .output
            .get("run_id")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_string(),
    )
}

/// Rounds a turn may take before it is broken off.
pub const MAX_ROUNDS: u32 = 64;

/// Run one turn to its ending. Never panics: a panic in the agent or a
/// tool is caught and reported as [`Ending::Panicked`].
pub async fn run(
    agent: &dyn Agent,
    tools: &dyn ToolRunner,
    guard: &dyn TurnGuard,
    turn: &TurnInput,
) -> TurnRecord {
    let began = std::time::Instant::now();
    let outside = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let body = async {
        let mut results: Vec<ToolResult> = Vec::new();
        for round in 1..=MAX_ROUNDS {
            // Ownership first: a turn on a seat that moved is the
            // successor's to stop or not.
            if !guard.holds() {
                return Ending::Fenced;
            }
            if let Some(by) = guard.stop_requested() {
                return Ending::Stopped { by };
            }
            rounds.store(round, Ordering::SeqCst);
            let step = match agent.round(turn, round, std::mem::take(&mut results)).await {
                Ok(s) => s,
                // An agent's words, bounded: they go into the seat's last
                // error, events and logs.
                Err(e) => return Ending::Broke(bounded_error(&e.to_string())),
            };
            match step {
                Step::Done { result, answered } => return Ending::Done { result, answered },
                Step::Calls(list) => {
                    let mut parked = Vec::new();
                    for call in &list {
                        if !guard.holds() {
                            return Ending::Fenced;
                        }
                        // The last fence this call passed: an effect it
                        // posts after a newer claim is judged by it.
                        tracing::debug!(
                            target: "crewlet::delivery",
                            step = "fence_passed",
                            seat = %turn.seat,
                            turn_id = %turn.turn_id,
                            epoch = turn.epoch,
                            call = %call.name,
                        );
                        calls.fetch_add(1, Ordering::SeqCst);
                        let ex = tools.execute(turn, call).await;
                        if ex.reached {
                            outside.store(true, Ordering::SeqCst);
                        }
                        parked.extend(ex.parks);
                        results.push(ex.result);
                    }
                    // The round's other calls ran; no round comes after it.
                    if !parked.is_empty() {
                        return Ending::Parked { on: parked };
                    }
                }
            }
        }
        Ending::Broke(format!(
            "the agent did not finish within {MAX_ROUNDS} rounds"
        ))
    };
    let ending = match AssertUnwindSafe(body).catch_unwind().await {
        Ok(e) => e,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic with no message".into());
            tracing::error!(seat = %turn.seat, turn_id = %turn.turn_id, panic = %message, "turn_phase_panicked");
            Ending::Panicked(message)
        }
    };
    TurnRecord {
        ending,
        reached_outside: outside.load(Ordering::SeqCst),
        rounds: rounds.load(Ordering::SeqCst),
        calls: calls.load(Ordering::SeqCst),
        duration: began.elapsed(),
    }
}

/// The most of an agent's error kept (its seat's last error, events,
/// logs); the rest is cut, saying so.
pub const ERROR_CHARS: usize = 1000;

/// Pure: `e` cut at [`ERROR_CHARS`] characters.
pub fn bounded_error(e: &str) -> String {
    if e.chars().count() <= ERROR_CHARS {
        return e.to_string();
    }
    let kept: String = e.chars().take(ERROR_CHARS).collect();
    format!("{kept}… (cut at {ERROR_CHARS} characters)")
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_agents_error_is_kept_to_a_bound() {
        let flood = "e".repeat(1_000_000);
        let kept = super::bounded_error(&flood);
        assert!(kept.chars().count() < super::ERROR_CHARS + 40);
        assert!(kept.ends_with("(cut at 1000 characters)"));
        assert_eq!(super::bounded_error("short"), "short");
    }

    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicU32;

    /// Asks for two calls in round 1, then finishes.
    struct TwoCalls;

    #[async_trait::async_trait]
    impl Agent for TwoCalls {
        async fn round(
            &self,
            _turn: &TurnInput,
            round: u32,
            _results: Vec<ToolResult>,
        ) -> Result<Step, super::super::agent::AgentError> {
            Ok(if round == 1 {
                Step::Calls(
                    ["first", "second"]
                        .iter()
                        .map(|id| ToolCall {
                            id: id.to_string(),
                            name: "post_outbox".into(),
                            args: serde_json::Value::Null,
                            annotations: Default::default(),
                        })
                        .collect(),
                )
            } else {
                Step::Done {
                    result: serde_json::Value::Null,
                    answered: vec![],
                }
            })
        }
    }

    /// Records the calls it executes; each reaches outside.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    #[async_trait::async_trait]
    impl ToolRunner for Recorder {
        async fn execute(&self, _turn: &TurnInput, call: &ToolCall) -> Executed {
            self.0.lock().unwrap().push(call.id.clone());
            Executed::of(ToolResult::ok(&call.id, serde_json::Value::Null), true)
        }
    }

    /// Holds the seat for the first `holds_for` checks; a person's stop
    /// is requested throughout when `stopped`.
    struct Guard {
        holds_for: u32,
        checks: AtomicU32,
        stopped: bool,
    }

    impl TurnGuard for Guard {
        fn holds(&self) -> bool {
            self.checks.fetch_add(1, Ordering::SeqCst) < self.holds_for
        }
        fn stop_requested(&self) -> Option<String> {
            self.stopped.then(|| "ann".to_string())
        }
    }

    fn input() -> TurnInput {
        TurnInput {
            turn_id: "t1".into(),
            seat: "s0".into(),
            epoch: 3,
            node: "a".into(),
            work_key: None,
            triggers: vec![],
            delivered: 1,
            tools: Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_stop_aimed_at_a_turn_whose_seat_moved_is_left_to_the_successor() {
        // Ownership first: the seat moved, so the turn is fenced (deferred
        // to the owner), not stopped and recorded here.
        let guard = Guard {
            holds_for: 0,
            checks: AtomicU32::new(0),
            stopped: true,
        };
        let tools = Recorder::default();
        let r = run(&TwoCalls, &tools, &guard, &input()).await;
        assert_eq!(r.ending, Ending::Fenced);
        assert_eq!(settle(&r.ending, r.reached_outside).verdict, Verdict::Defer);
        assert!(tools.0.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn the_fence_is_checked_before_each_tool_call_and_a_call_after_it_trips_never_runs() {
        // Held at the round's top and before the first call; moved before
        // the second.
        let guard = Guard {
            holds_for: 2,
            checks: AtomicU32::new(0),
            stopped: false,
        };
        let tools = Recorder::default();
        let r = run(&TwoCalls, &tools, &guard, &input()).await;
        assert_eq!(r.ending, Ending::Fenced);
        assert_eq!(*tools.0.lock().unwrap(), ["first"]);
        assert!(r.reached_outside);
        let s = settle(&r.ending, r.reached_outside);
        assert_eq!(
            (s.record, s.verdict),
            (true, Verdict::Ack),
            "fenced after a call reached outside: recorded and acked, not repeated"
        );
    }

    #[tokio::test]
    async fn a_stop_on_a_held_seat_ends_the_turn_at_the_round_boundary() {
        let guard = Guard {
            holds_for: u32::MAX,
            checks: AtomicU32::new(0),
            stopped: true,
        };
        let tools = Recorder::default();
        let r = run(&TwoCalls, &tools, &guard, &input()).await;
        assert_eq!(r.ending, Ending::Stopped { by: "ann".into() });
        assert!(tools.0.lock().unwrap().is_empty());
    }

    /// Asks for a diary note and a detached run in round 1, and would post
    /// in round 2.
    struct RunsThenPosts;

    #[async_trait::async_trait]
    impl Agent for RunsThenPosts {
        async fn round(
            &self,
            _turn: &TurnInput,
            round: u32,
            _results: Vec<ToolResult>,
        ) -> Result<Step, super::super::agent::AgentError> {
            let call = |id: &str, name: &str| ToolCall {
                id: id.into(),
                name: name.into(),
                args: serde_json::Value::Null,
                annotations: Default::default(),
            };
            Ok(match round {
                1 => Step::Calls(vec![
                    call("run", "run_detached"),
                    call("note", "diary_write"),
                ]),
                2 => Step::Calls(vec![call("post", "post_outbox")]),
                _ => Step::Done {
                    result: serde_json::Value::Null,
                    answered: vec![],
                },
            })
        }
    }

    /// Answers a run id for `run_detached`.
    #[derive(Default)]
    struct Starter(Mutex<Vec<String>>);

    #[async_trait::async_trait]
    impl ToolRunner for Starter {
        async fn execute(&self, _turn: &TurnInput, call: &ToolCall) -> Executed {
            self.0.lock().unwrap().push(call.id.clone());
            let out = serde_json::json!({"run_id": "run-1", "parked": true, "started": true});
            let result = ToolResult::ok(&call.id, out);
            Executed {
                parks: parks(call, &result),
                result,
                reached: call.name != "diary_write",
            }
        }
    }

    #[tokio::test]
    async fn a_round_that_starts_a_detached_run_is_the_turns_last_and_the_turn_is_parked() {
        let guard = Guard {
            holds_for: u32::MAX,
            checks: AtomicU32::new(0),
            stopped: false,
        };
        let tools = Starter::default();
        let r = run(&RunsThenPosts, &tools, &guard, &input()).await;
        assert_eq!(
            r.ending,
            Ending::Parked {
                on: vec!["run-1".into()]
            }
        );
        assert_eq!(r.ending.name(), "parked");
        assert_eq!(
            *tools.0.lock().unwrap(),
            ["run", "note"],
            "the round's other calls run; the round after it never does"
        );
        assert_eq!(r.rounds, 1);
        let s = settle(&r.ending, r.reached_outside);
        assert_eq!(
            (s.record, s.verdict, s.given_up),
            (true, Verdict::Ack, None),
            "parked: recorded and acked, its continuation is the run's resume"
        );
    }

    #[test]
    fn only_a_run_detached_call_that_succeeded_parks() {
        let call = |name: &str| ToolCall {
            id: "c".into(),
            name: name.into(),
            args: serde_json::Value::Null,
            annotations: Default::default(),
        };
        let ok = ToolResult::ok("c", serde_json::json!({"run_id": "run-9"}));
        assert_eq!(parks(&call("run_detached"), &ok), Some("run-9".into()));
        assert_eq!(parks(&call("post_outbox"), &ok), None);
        assert_eq!(
            parks(&call("run_detached"), &ToolResult::err("c", "no argv")),
            None,
            "a refused or failed start parks nothing"
        );
    }

    fn done() -> Ending {
        Ending::Done {
            result: serde_json::Value::Null,
            answered: vec![],
        }
    }

    #[test]
    fn every_ending_settles_as_the_spec_says() {
        for outside in [false, true] {
            let d = settle(&done(), outside);
            assert_eq!((d.record, d.verdict), (true, Verdict::Ack));
            let p = settle(&Ending::Panicked("x".into()), outside);
            assert_eq!(
                (p.record, p.verdict, p.guard_breach),
                (true, Verdict::Ack, true),
                "a panic is recorded and acked whatever the record says"
            );
            let s = settle(&Ending::Stopped { by: "ann".into() }, outside);
            assert_eq!(
                (s.record, s.verdict),
                (true, Verdict::Ack),
                "a person's stop is not deferred"
            );
            assert_eq!(s.given_up, Some("stopped_by_person"));
        }
        let b = settle(&Ending::Broke("x".into()), false);
        assert_eq!(
            (b.record, b.verdict, b.given_up),
            (false, Verdict::Nak, None),
            "nothing reached outside: redelivered, runs again"
        );
        let b = settle(&Ending::Broke("x".into()), true);
        assert_eq!(
            (b.record, b.verdict),
            (true, Verdict::Ack),
            "a call reached outside: recorded and acked, the rest is lost"
        );
        assert_eq!(b.given_up, Some("broke_after_outside_call"));
        let f = settle(&Ending::Fenced, false);
        assert_eq!(
            (f.record, f.verdict),
            (false, Verdict::Defer),
            "fenced because the seat moved: deferred to the owner"
        );
        let f = settle(&Ending::Fenced, true);
        assert_eq!((f.record, f.verdict), (true, Verdict::Ack));
        for e in [
            done(),
            Ending::Broke("x".into()),
            Ending::Fenced,
            Ending::Stopped { by: "a".into() },
        ] {
            assert!(!settle(&e, true).guard_breach && !settle(&e, false).guard_breach);
        }
    }
}
