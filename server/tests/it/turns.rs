//! Turns as behaviour, on the in-process twin (tokio's paused clock) and on
//! a real nats-server: the completion ledger across a crash, partial
//! overlap, the in-turn fence, the broken-turn policy, a person's pause and
//! stop, a command agent's tool calls run by the engine, a command agent
//! that will not die, and org-derived routing — the spec's § Fencing,
//! § The completion ledger, § A turn that broke halfway and § Routing, as
//! behaviour.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use crewlet::config::{AgentConfig, CommandConfig, PlacementConfig, RoleConfig};
use crewlet::engine::outbox::Effect;
use crewlet::engine::pause::{self, PauseRecord};
use crewlet::engine::routing;
use crewlet::events::{DetachReason, Event};
use crewlet::node::company;
use crewlet::queue::inbox_subject;
use serde_json::json;
use support::turnfleet::*;

both!(
    a_seat_whose_program_a_node_does_not_allow_is_never_started_there_and_a_node_that_allows_it_takes_it,
    an_undead_seats_in_flight_turn_finishes_and_nothing_new_starts_there,
    every_loop_that_can_hold_a_seats_mail_is_watched_and_a_released_seat_stands_down,
    a_turn_runs_once_and_its_effect_names_the_work_and_the_epoch,
    a_crash_after_the_effects_and_before_the_ack_is_skipped_on_the_new_holder,
    a_partial_overlap_runs_only_the_new_trigger,
    a_turn_fenced_mid_round_costs_one_delivery_and_the_new_owner_runs_it,
    a_panic_is_acked_once_not_twenty_five_times,
    a_failure_after_an_outside_call_does_not_repeat_that_call,
    a_failure_before_any_outside_call_is_redelivered_and_runs_again,
    a_pause_holds_mail_across_a_seat_move_until_resume,
    stop_ends_the_running_turn_at_the_next_round_and_the_trigger_does_not_come_back,
    an_a2a_message_is_routed_by_the_company_to_the_seat_on_another_node,
    a_message_answered_in_its_thread_is_skipped_on_redelivery,
    a_type_that_runs_no_turn_is_acked_and_what_does_not_decode_is_dead_lettered,
    a_command_agents_tool_calls_run_in_the_engine_and_only_an_open_world_call_reaches_outside,
    a_pause_that_stops_the_running_turn_ends_it_and_the_trigger_does_not_come_back,
);

const WAIT: Duration = Duration::from_secs(20);

async fn a_turn_runs_once_and_its_effect_names_the_work_and_the_epoch(f: Fleet) {
    let mut a = f.node("a", &[echo_role("s0")]).await;
    f.until("a holds s0", WAIT, || a.holds("s0")).await;
    a.publish("s0", &trigger("E1", json!({"title": "hello"})))
        .await;
    f.until("the turn completes", WAIT, || !a.turns_of("E1").is_empty())
        .await;
    assert_eq!(
        a.turns_of("E1"),
        vec![("completed".into(), "ack".into(), true, 1, 2)]
    );
    let effects = a.effects_of("E1").await;
    assert_eq!(effects.len(), 1, "{effects:?}");
    let e = &effects[0];
    assert_eq!(e.seat, "s0");
    assert_eq!(e.node, "a");
    assert_eq!(e.epoch, 1);
    assert_eq!(
        e.work_key,
        crewlet::engine::ledger::work_key(&[trigger("E1", json!({}))])
    );
    let memory = a.turns.memory();
    assert_eq!(memory.episodes("s0", 10).await.unwrap().len(), 1);
    assert!(!memory.diary("s0", 10).await.unwrap().is_empty());
    f.until_async("the inbox is empty", WAIT, || async {
        a.pending("s0").await == 0
    })
    .await;
}

async fn a_crash_after_the_effects_and_before_the_ack_is_skipped_on_the_new_holder(f: Fleet) {
    let mut a = f.node("a", &[echo_role("s0")]).await;
    f.until("a holds s0", WAIT, || a.holds("s0")).await;
    a.turns
        .faults
        .stall_before_ack
        .store(true, std::sync::atomic::Ordering::SeqCst);
    a.publish("s0", &trigger("E1", json!({}))).await;
    f.until("a's turn is recorded", WAIT, || {
        a.turns_of("E1").iter().any(|t| t.2)
    })
    .await;
    assert_eq!(a.effects_of("E1").await.len(), 1);
    // The node dies between the effects and the ack.
    a.engine.crash().await;
    let mut b = f.node("b", &[]).await;
    f.until("b holds s0", WAIT, || b.holds("s0")).await;
    f.until("b skips the redelivery", WAIT, || {
        b.skipped("E1").contains(&"already_done".to_string())
    })
    .await;
    assert!(b.turns_of("E1").is_empty(), "b ran no turn for E1");
    assert_eq!(
        b.effects_of("E1").await.len(),
        1,
        "the effect shipped once, by a"
    );
    f.until_async("the inbox is empty", WAIT, || async {
        b.pending("s0").await == 0
    })
    .await;
}

async fn a_partial_overlap_runs_only_the_new_trigger(f: Fleet) {
    let mut a = f.node("a", &[echo_role("s0")]).await;
    f.until("a holds s0", WAIT, || a.holds("s0")).await;
    let host = a.engine.host().clone();
    let hold = |on: bool| host.hold("s0", "test", on);
    // A and B arrive together and run as one turn. (Held can mean still
    // establishing: the hold is taken once the inbox is attached.)
    f.until("s0's inbox attached and held", WAIT, || hold(true))
        .await;
    a.publish("s0", &trigger("A", json!({}))).await;
    a.publish("s0", &trigger("B", json!({}))).await;
    assert!(hold(false));
    f.until("A and B ran", WAIT, || {
        !a.turns_of("A").is_empty() && !a.turns_of("B").is_empty()
    })
    .await;
    // Each ran once: usually in one turn, but not always — a fetch already
    // waiting when the hold was taken returns A, and when the hold goes
    // between the loop's look at the gate as it coalesces (closed: nothing
    // more is fetched) and its look before the turn (open), A runs alone
    // and B next (a loaded `./dev test` saw that order).
    assert_eq!(a.started_with("A").len(), 1, "A ran once");
    assert_eq!(a.started_with("B").len(), 1, "B ran once");
    // A+B+C arrives (A and B again, say a producer's retry).
    assert!(hold(true));
    for id in ["A", "B", "C"] {
        a.publish("s0", &trigger(id, json!({}))).await;
    }
    assert!(hold(false));
    f.until("C ran", WAIT, || !a.turns_of("C").is_empty()).await;
    assert_eq!(
        a.started_with("C"),
        vec![(vec!["C".to_string()], 1)],
        "only C runs"
    );
    assert_eq!(a.skipped("A"), vec!["already_done"]);
    assert_eq!(a.skipped("B"), vec!["already_done"]);
    assert_eq!(a.effects_of("A").await.len(), 1);
    assert_eq!(a.effects_of("C").await.len(), 1);
    f.until_async("the inbox is empty", WAIT, || async {
        a.pending("s0").await == 0
    })
    .await;
}

async fn a_turn_fenced_mid_round_costs_one_delivery_and_the_new_owner_runs_it(f: Fleet) {
    let mut a = f.node("a", &[echo_role("s0")]).await;
    f.until("a holds s0", WAIT, || a.holds("s0")).await;
    let mut b = f.node("b", &[]).await;
    a.publish(
        "s0",
        &trigger("E1", json!({"echo": {"rounds": 4, "round_delay_ms": 700}})),
    )
    .await;
    f.until("a's turn started", WAIT, || {
        !a.started_with("E1").is_empty()
    })
    .await;
    // The lease is lost under the running turn (the heartbeat's verdict),
    // and a stops claiming so that b takes the seat.
    a.engine.host().release("s0", DetachReason::Lost).await;
    a.engine.drain().await;
    f.until("b holds s0", WAIT, || b.holds("s0")).await;
    f.until("b ran E1", WAIT, || !b.turns_of("E1").is_empty())
        .await;
    let b_turns = b.turns_of("E1");
    assert_eq!(b_turns[0].0, "completed");
    assert_eq!(b_turns[0].3, 2, "one handoff cost one delivery");
    assert!(a.turns_of("E1").iter().all(|t| t.0 != "completed"));
    // The old holder's turn ended fenced, before any outside call: not
    // recorded, deferred to the seat's owner.
    f.until("a's turn ends", WAIT, || !a.turns_of("E1").is_empty())
        .await;
    let a_turns = a.turns_of("E1");
    assert_eq!(a_turns.len(), 1, "{a_turns:?}");
    let (outcome, disposition, recorded, delivered, _) = &a_turns[0];
    assert_eq!(
        (
            outcome.as_str(),
            disposition.as_str(),
            *recorded,
            *delivered
        ),
        ("fenced", "defer", false, 1)
    );
    assert!(
        a.skipped("E1").is_empty(),
        "a deferred trigger is not given up"
    );
    let effects = a.effects_of("E1").await;
    assert_eq!(effects.len(), 1, "{effects:?}");
    assert_eq!(effects[0].node, "b");
    assert_eq!(effects[0].epoch, 2);
}

async fn a_panic_is_acked_once_not_twenty_five_times(f: Fleet) {
    let mut a = f.node("a", &[echo_role("s0")]).await;
    f.until("a holds s0", WAIT, || a.holds("s0")).await;
    a.publish(
        "s0",
        &trigger("P", json!({"echo": {"fail_round": 1, "fail": "panic"}})),
    )
    .await;
    f.until("the panicked turn ends", WAIT, || {
        !a.turns_of("P").is_empty()
    })
    .await;
    // A later trigger runs: the seat kept consuming, and P did not come back.
    a.publish("s0", &trigger("after", json!({}))).await;
    f.until("the next trigger ran", WAIT, || {
        !a.turns_of("after").is_empty()
    })
    .await;
    f.until_async("the inbox is empty", WAIT, || async {
        a.pending("s0").await == 0
    })
    .await;
    assert_eq!(
        a.turns_of("P"),
        vec![("panicked".into(), "ack".into(), true, 1, 1)]
    );
    assert_eq!(a.skipped("P"), vec!["panicked"]);
    let breaches = a.matching(|e| match e {
        Event::TurnGuardBreach { seat, kind, .. } => Some((seat.clone(), kind.clone())),
        _ => None,
    });
    assert_eq!(
        breaches,
        vec![("s0".to_string(), "unhandled_exception".to_string())]
    );
    let seat = a.turns.seats().into_iter().find(|s| s.handle == "s0");
    assert!(
        seat.and_then(|s| s.last_error)
            .is_some_and(|e| e.contains("panics")),
        "the seat's last error is set"
    );
    assert!(a.queue.dead_letters(10).await.unwrap().is_empty());
}

async fn a_failure_after_an_outside_call_does_not_repeat_that_call(f: Fleet) {
    let mut a = f.node("a", &[echo_role("s0")]).await;
    f.until("a holds s0", WAIT, || a.holds("s0")).await;
    a.publish(
        "s0",
        &trigger(
            "X",
            json!({"echo": {"fail_round": 1, "fail": "after_outside"}}),
        ),
    )
    .await;
    f.until("the broken turn ends", WAIT, || !a.turns_of("X").is_empty())
        .await;
    a.publish("s0", &trigger("after", json!({}))).await;
    f.until("the next trigger ran", WAIT, || {
        !a.turns_of("after").is_empty()
    })
    .await;
    f.until_async("the inbox is empty", WAIT, || async {
        a.pending("s0").await == 0
    })
    .await;
    assert_eq!(
        a.turns_of("X"),
        vec![("failed".into(), "ack".into(), true, 1, 2)]
    );
    assert_eq!(a.skipped("X"), vec!["broke_after_outside_call"]);
    assert_eq!(
        a.effects_of("X").await.len(),
        1,
        "the outside call was made once"
    );
}

async fn a_failure_before_any_outside_call_is_redelivered_and_runs_again(f: Fleet) {
    let mut a = f.node("a", &[echo_role("s0")]).await;
    f.until("a holds s0", WAIT, || a.holds("s0")).await;
    a.publish(
        "s0",
        &trigger(
            "Y",
            json!({"echo": {"fail_round": 1, "fail": "before_outside", "fail_deliveries": 1}}),
        ),
    )
    .await;
    f.until("Y ran twice", WAIT, || a.turns_of("Y").len() >= 2)
        .await;
    assert_eq!(
        a.turns_of("Y"),
        vec![
            ("failed".into(), "nak".into(), false, 1, 1),
            ("completed".into(), "ack".into(), true, 2, 2)
        ]
    );
    assert!(a.skipped("Y").is_empty());
    assert_eq!(a.effects_of("Y").await.len(), 1);
}

async fn a_pause_holds_mail_across_a_seat_move_until_resume(f: Fleet) {
    let mut a = f.node("a", &[echo_role("s0")]).await;
    f.until("a holds s0", WAIT, || a.holds("s0")).await;
    let record = PauseRecord {
        by: "ann".into(),
        at: "2026-11-30T08:00:00Z".into(),
        reason: Some("checking its mail".into()),
        stop_running_turn: false,
    };
    assert!(
        pause::pause(&*a.store, &*a.queue, "s0", record)
            .await
            .unwrap()
    );
    let host = a.engine.host().clone();
    f.until("a holds the inbox", WAIT, || {
        host.inbox_quiesced("s0") == Some(true)
    })
    .await;
    a.publish("s0", &trigger("M", json!({}))).await;
    let mut b = f.node("b", &[]).await;
    a.engine.drain().await;
    f.until("b has s0 established", WAIT, || b.attached("s0"))
        .await;
    let bhost = b.engine.host().clone();
    assert_eq!(
        bhost.inbox_quiesced("s0"),
        Some(true),
        "b attached the paused seat already held"
    );
    // Two sweeps and heartbeats later the mail is still waiting.
    let until = tokio::time::Instant::now() + SWEEP * 2;
    while tokio::time::Instant::now() < until {
        assert!(b.started_with("M").is_empty(), "no turn while paused");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(b.pending("s0").await, 1);
    assert!(a.started_with("M").is_empty());
    assert!(
        pause::resume(&*b.store, &*b.queue, "s0").await.unwrap(),
        "it was paused"
    );
    f.until("b runs M after the resume", WAIT, || {
        !b.turns_of("M").is_empty()
    })
    .await;
    assert_eq!(b.turns_of("M")[0].0, "completed");
}

async fn stop_ends_the_running_turn_at_the_next_round_and_the_trigger_does_not_come_back(f: Fleet) {
    let mut a = f.node("a", &[echo_role("s0")]).await;
    f.until("a holds s0", WAIT, || a.holds("s0")).await;
    a.publish(
        "s0",
        &trigger("L", json!({"echo": {"rounds": 6, "round_delay_ms": 500}})),
    )
    .await;
    f.until("the long turn started", WAIT, || {
        !a.started_with("L").is_empty()
    })
    .await;
    pause::stop(&*a.queue, "s0", "ann").await.unwrap();
    f.until("the turn ends", WAIT, || !a.turns_of("L").is_empty())
        .await;
    let t = &a.turns_of("L")[0];
    assert_eq!((t.0.as_str(), t.1.as_str(), t.2), ("stopped", "ack", true));
    assert!(t.4 < 6, "it stopped before its last round (ran {})", t.4);
    // Announced right after `turn_completed`: read once it is there.
    f.until("the trigger is given up as stopped", WAIT, || {
        a.skipped("L") == ["stopped_by_person"]
    })
    .await;
    assert!(
        a.effects_of("L").await.is_empty(),
        "its outbound effect never went"
    );
    f.until_async("the inbox is empty", WAIT, || async {
        a.pending("s0").await == 0
    })
    .await;
    // Recorded: a redelivery of the same trigger is a skip.
    a.publish("s0", &trigger("L", json!({}))).await;
    f.until("the copy is skipped", WAIT, || {
        a.skipped("L").contains(&"already_done".to_string())
    })
    .await;
    assert_eq!(a.turns_of("L").len(), 1);
}

/// A pause that asks for the running turn to stop closes it at the next
/// round boundary (spec § Fencing: `ErrStoppedByPerson`, recorded and
/// acked, not deferred); the trigger does not come back, neither while the
/// seat is paused nor after the resume.
async fn a_pause_that_stops_the_running_turn_ends_it_and_the_trigger_does_not_come_back(f: Fleet) {
    let mut a = f.node("a", &[echo_role("s0")]).await;
    f.until("a holds s0", WAIT, || a.holds("s0")).await;
    a.publish(
        "s0",
        &trigger("L", json!({"echo": {"rounds": 6, "round_delay_ms": 500}})),
    )
    .await;
    f.until("the long turn started", WAIT, || {
        !a.started_with("L").is_empty()
    })
    .await;
    let record = PauseRecord {
        by: "ann".into(),
        at: "2026-11-30T08:00:00Z".into(),
        reason: Some("it is doing the wrong thing".into()),
        stop_running_turn: true,
    };
    assert!(
        pause::pause(&*a.store, &*a.queue, "s0", record)
            .await
            .unwrap()
    );
    f.until("the turn ends", WAIT, || !a.turns_of("L").is_empty())
        .await;
    let t = &a.turns_of("L")[0];
    assert_eq!((t.0.as_str(), t.1.as_str(), t.2), ("stopped", "ack", true));
    assert!(t.4 < 6, "it stopped before its last round (ran {})", t.4);
    let errors = a.matching(|e| match e {
        Event::TurnCompleted { seat, error, .. } if seat == "s0" => error.clone(),
        _ => None,
    });
    assert_eq!(errors, vec!["stopped by ann".to_string()]);
    // Announced right after `turn_completed`: read once it is there.
    f.until("the trigger is given up as stopped", WAIT, || {
        a.skipped("L") == ["stopped_by_person"]
    })
    .await;
    assert!(
        a.effects_of("L").await.is_empty(),
        "its outbound effect never went"
    );
    let host = a.engine.host().clone();
    f.until("a holds the inbox", WAIT, || {
        host.inbox_quiesced("s0") == Some(true)
    })
    .await;
    // Acked: nothing waits in the paused inbox.
    f.until_async("the inbox is empty", WAIT, || async {
        a.pending("s0").await == 0
    })
    .await;
    assert!(
        pause::resume(&*a.store, &*a.queue, "s0").await.unwrap(),
        "it was paused"
    );
    f.until("the hold is dropped", WAIT, || {
        host.inbox_quiesced("s0") == Some(false)
    })
    .await;
    // The seat takes work again, and L is not among it.
    a.publish("s0", &trigger("after", json!({}))).await;
    f.until("the next trigger ran", WAIT, || {
        !a.turns_of("after").is_empty()
    })
    .await;
    assert_eq!(a.started_with("L").len(), 1, "L ran once");
    assert_eq!(a.turns_of("L").len(), 1);
    f.until_async("the inbox is empty", WAIT, || async {
        a.pending("s0").await == 0
    })
    .await;
}

/// A child that asks for two rounds of tool calls, then finishes. Round 1:
/// a diary note and `read_memory`; round 2 (unless a trigger says `quiet`):
/// `post_outbox` carrying what round 1's results said — the ids and `ok`
/// of each, and the diary notes `read_memory` returned. Its annotations
/// claim the opposite of each tool's own.
const TWO_ROUND_AGENT: &str = r#"
import json, sys

def send(m):
    sys.stdout.write(json.dumps(m) + "\n")
    sys.stdout.flush()

quiet = {}
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("type") == "turn":
        t = m["turn"]
        tid = t["turn_id"]
        ids = [x["id"] for x in t["triggers"]]
        quiet[tid] = any(x["body"].get("quiet") for x in t["triggers"])
        send({"type": "calls", "turn_id": tid, "calls": [
            {"id": "note", "name": "diary_write",
             "args": {"text": "noted " + ",".join(ids) + " in " + tid},
             "annotations": {"open_world": True}},
            {"id": "recall", "name": "read_memory", "args": {"limit": 50}},
        ]})
    elif m.get("type") == "results":
        tid = m["turn_id"]
        rs = m["results"]
        if m["round"] == 2 and not quiet.get(tid):
            recalled = [d["content"] for r in rs if r["id"] == "recall" and r["ok"]
                        for d in r["output"]["diary"]]
            send({"type": "calls", "turn_id": tid, "calls": [
                {"id": "post", "name": "post_outbox",
                 "args": {"text": "done", "saw": [[r["id"], r["ok"]] for r in rs],
                          "recalled": recalled},
                 "annotations": {"read_only": True, "open_world": False}},
            ]})
        else:
            send({"type": "done", "turn_id": tid,
                  "result": {"saw": [[r["id"], r["ok"]] for r in rs]}})
"#;

/// (turn id, outcome, rounds, calls, reached_outside, disposition) of
/// every turn that ran trigger `id`.
fn completed_turns(n: &mut Node, id: &str) -> Vec<(String, String, u32, u32, bool, String)> {
    let started: Vec<String> = n.matching(|e| match e {
        Event::TurnStarted {
            turn_id,
            trigger_ids,
            ..
        } if trigger_ids.iter().any(|t| t == id) => Some(turn_id.clone()),
        _ => None,
    });
    n.matching(|e| match e {
        Event::TurnCompleted {
            turn_id,
            outcome,
            rounds,
            calls,
            reached_outside,
            disposition,
            ..
        } if started.contains(turn_id) => Some((
            turn_id.clone(),
            outcome.clone(),
            *rounds,
            *calls,
            *reached_outside,
            disposition.clone(),
        )),
        _ => None,
    })
}

/// A `command` agent's turn through the engine: the child asks for tool
/// calls, the engine executes them and sends their results in the next
/// round, `post_outbox` lands on the outbox, and `turn_completed` records
/// `reached_outside` by the spec's narrow rule — the built-in tools' own
/// annotations, whatever the child claims (spec § A turn that broke
/// halfway).
async fn a_command_agents_tool_calls_run_in_the_engine_and_only_an_open_world_call_reaches_outside(
    f: Fleet,
) {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("two_rounds.py");
    std::fs::write(&script, TWO_ROUND_AGENT).unwrap();
    let role = RoleConfig {
        handle: "cmd".into(),
        agent: AgentConfig::Command(CommandConfig::new(vec![
            "python3".into(),
            script.display().to_string(),
        ])),
        placement: PlacementConfig::default(),
        mcp: Vec::new(),
        ..Default::default()
    };
    let mut a = f.node("a", &[role]).await;
    f.until("a holds cmd", WAIT, || a.holds("cmd")).await;

    a.publish("cmd", &trigger("C1", json!({}))).await;
    f.until("C1's turn completes", WAIT, || {
        !completed_turns(&mut a, "C1").is_empty()
    })
    .await;
    let turns = completed_turns(&mut a, "C1");
    assert_eq!(turns.len(), 1, "{turns:?}");
    let (turn_id, outcome, rounds, calls, outside, disposition) = turns[0].clone();
    assert_eq!(
        (
            outcome.as_str(),
            rounds,
            calls,
            outside,
            disposition.as_str()
        ),
        ("completed", 3, 3, true, "ack"),
        "post_outbox is open-world: the turn reached outside"
    );
    let effects = a.effects_of("C1").await;
    assert_eq!(effects.len(), 1, "{effects:?}");
    let e = &effects[0];
    assert_eq!((e.seat.as_str(), e.node.as_str()), ("cmd", "a"));
    assert_eq!(e.turn_id, turn_id);
    assert_eq!(e.trigger_ids, vec!["C1".to_string()]);
    assert_eq!(e.body["text"], json!("done"));
    // Round 1's results reached the child in round 2: both calls ran, and
    // read_memory saw the note diary_write had just written.
    assert_eq!(e.body["saw"], json!([["note", true], ["recall", true]]));
    let note = format!("noted C1 in {turn_id}");
    assert!(
        e.body["recalled"]
            .as_array()
            .unwrap()
            .contains(&json!(note)),
        "{}",
        e.body
    );
    let diary = a.turns.memory().diary("cmd", 50).await.unwrap();
    assert!(diary.iter().any(|d| d.content == note), "{diary:?}");

    // A turn of memory calls only: nothing reached outside, whatever the
    // child claimed about diary_write.
    a.publish("cmd", &trigger("Q1", json!({"quiet": true})))
        .await;
    f.until("Q1's turn completes", WAIT, || {
        !completed_turns(&mut a, "Q1").is_empty()
    })
    .await;
    let (_, outcome, rounds, calls, outside, disposition) =
        completed_turns(&mut a, "Q1")[0].clone();
    assert_eq!(
        (
            outcome.as_str(),
            rounds,
            calls,
            outside,
            disposition.as_str()
        ),
        ("completed", 2, 2, false, "ack")
    );
    assert!(a.effects_of("Q1").await.is_empty());
    f.until_async("the inbox is empty", WAIT, || async {
        a.pending("cmd").await == 0
    })
    .await;
}

async fn an_a2a_message_is_routed_by_the_company_to_the_seat_on_another_node(f: Fleet) {
    let roles = [
        RoleConfig {
            a2a_to: vec!["s1".into()],
            ..pinned("s0", "a")
        },
        pinned("s1", "b"),
    ];
    let mut a = f.node("a", &roles).await;
    let mut b = f.node("b", &roles).await;
    f.until("a holds s0", WAIT, || a.holds("s0")).await;
    f.until("b holds s1", WAIT, || b.holds("s1")).await;
    a.publish("s0", &trigger("F", json!({"forward_to": "s1"})))
        .await;
    f.until("a ran F", WAIT, || !a.turns_of("F").is_empty())
        .await;
    let a2a = |b: &mut Node| {
        b.matching(|e| match e {
            Event::TurnStarted {
                seat, trigger_ids, ..
            } if seat == "s1" => Some(trigger_ids.clone()),
            _ => None,
        })
    };
    f.until("b runs the a2a message on s1", WAIT, || {
        !a2a(&mut b).is_empty()
    })
    .await;
    // The envelope names both agents by their org-derived ids.
    let ids = a2a(&mut b)[0].clone();
    assert!(ids[0].starts_with("a2a-"), "{ids:?}");
    let sent: Vec<Effect> = a
        .outbox
        .read(Some("s0"))
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "a2a_message")
        .collect();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].body["agent_id"],
        json!(routing::agent_id(COMPANY, "s1").to_string())
    );
    assert_eq!(sent[0].body["envelope_id"], json!(ids[0]));
}

async fn a_message_answered_in_its_thread_is_skipped_on_redelivery(f: Fleet) {
    let mut a = f.node("a", &[echo_role("s0")]).await;
    f.until("a holds s0", WAIT, || a.holds("s0")).await;
    // A later turn reports it answered chat message m-1 in its thread.
    a.publish("s0", &trigger("T2", json!({"answered": ["m-1"]})))
        .await;
    f.until("T2 ran", WAIT, || !a.turns_of("T2").is_empty())
        .await;
    // The earlier message's redelivery arrives afterwards.
    let mut waiting = trigger("T1", json!({}));
    waiting.kind = "external_notification".into();
    waiting.message_id = Some("m-1".into());
    a.publish("s0", &waiting).await;
    f.until("T1 is skipped", WAIT, || {
        a.skipped("T1").contains(&"answered_in_thread".to_string())
    })
    .await;
    assert!(a.turns_of("T1").is_empty());
}

async fn a_type_that_runs_no_turn_is_acked_and_what_does_not_decode_is_dead_lettered(f: Fleet) {
    let mut a = f.node("a", &[echo_role("s0")]).await;
    f.until("a holds s0", WAIT, || a.holds("s0")).await;
    let mut obs = trigger("O", json!({}));
    obs.kind = "observability".into();
    a.publish("s0", &obs).await;
    a.queue
        .publish(&inbox_subject("s0"), None, Bytes::from_static(b"{not json"))
        .await
        .unwrap();
    f.until_async("one dead letter", WAIT, || async {
        a.queue.dead_letters(10).await.unwrap().len() == 1
    })
    .await;
    f.until_async("the inbox is empty", WAIT, || async {
        a.pending("s0").await == 0
    })
    .await;
    let ignored = a.matching(|e| match e {
        Event::TurnTriggerIgnored { trigger_id, .. } => Some(trigger_id.clone()),
        _ => None,
    });
    assert_eq!(ignored, vec!["O"]);
    assert!(a.turns_of("O").is_empty());
}

/// A child that ignores SIGTERM, and a grandchild it started: the release
/// hook sends SIGTERM to the child's group, waits out `stop_wait_ms`, then
/// kills the group — the seat is released (never undead for a stubborn
/// child), its lease given back, and nothing it started outlives it.
async fn a_command_agent_that_ignores_sigterm_is_killed_with_its_group_and_its_seat_released(
    f: Fleet,
) {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let script = dir.path().join("stubborn.py");
    std::fs::write(
        &script,
        "import os, signal, subprocess, sys\n\
         signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
         g = subprocess.Popen(['sleep', '600'])\n\
         open(sys.argv[1] + '.tmp', 'w').write('%d %d' % (os.getpid(), g.pid))\n\
         os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n\
         for line in sys.stdin:\n    pass\n\
         signal.pause()\n",
    )
    .unwrap();
    let mut cfg = CommandConfig::new(vec![
        "python3".into(),
        script.display().to_string(),
        pidfile.display().to_string(),
    ]);
    cfg.stop_wait_ms = 300;
    let role = RoleConfig {
        handle: "cmd".into(),
        agent: AgentConfig::Command(cfg),
        placement: PlacementConfig::default(),
        mcp: Vec::new(),
        ..Default::default()
    };
    let mut a = f.node("a", &[role, echo_role("other")]).await;
    f.until("a holds cmd", WAIT, || a.holds("cmd")).await;
    f.until("the child wrote its pids", WAIT, || pidfile.exists())
        .await;
    let pids: Vec<u32> = std::fs::read_to_string(&pidfile)
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    // The role leaves the company: the seat is released.
    company::apply(&*a.store, COMPANY, &[echo_role("other")])
        .await
        .unwrap();
    f.until_async("the lease is given back", WAIT, || async {
        a.store.lease("seat:cmd").await.unwrap().is_none()
    })
    .await;
    assert!(a.engine.host().undead().is_empty(), "never undead");
    assert!(
        a.matching(|e| match e {
            Event::SeatReleaseUnproven { seat, .. } if seat == "cmd" => Some(()),
            _ => None,
        })
        .is_empty(),
        "the teardown was proven"
    );
    f.until("the child and its grandchild are gone", WAIT, || {
        pids.iter().all(|p| support::process::gone(*p))
    })
    .await;
}

// A child process and tokio's paused clock do not mix (the clock jumps
// while the runtime waits on the child), so both backends run in real time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twin_a_command_agent_that_ignores_sigterm_is_killed_with_its_group_and_its_seat_released()
{
    a_command_agent_that_ignores_sigterm_is_killed_with_its_group_and_its_seat_released(
        Fleet::new(Kind::Twin).await,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_command_agent_that_ignores_sigterm_is_killed_with_its_group_and_its_seat_released()
{
    a_command_agent_that_ignores_sigterm_is_killed_with_its_group_and_its_seat_released(
        Fleet::new(Kind::Nats).await,
    )
    .await;
}

/// A node decides what runs on it, at establish time too: a company
/// applied elsewhere names a command agent and a stdio tool server this
/// node's own file does not allow — the seat is handed back before any
/// child starts here, and a node that allows them takes it and runs it.
async fn a_seat_whose_program_a_node_does_not_allow_is_never_started_there_and_a_node_that_allows_it_takes_it(
    f: Fleet,
) {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started-on");
    let script = dir.path().join("agent.py");
    std::fs::write(
        &script,
        "import json, os, sys\n\
         open(sys.argv[1], 'a').write(os.environ['CREWLET_NODE'] + '\\n')\n\
         for line in sys.stdin:\n\
         \x20   m = json.loads(line)\n\
         \x20   if m.get('type') == 'turn':\n\
         \x20       print(json.dumps({'type': 'done', 'turn_id': m['turn']['turn_id']}), flush=True)\n",
    )
    .unwrap();
    let role = RoleConfig {
        handle: "cmd".into(),
        agent: AgentConfig::Command(CommandConfig::new(vec![
            "python3".into(),
            script.display().to_string(),
            started.display().to_string(),
        ])),
        ..Default::default()
    };
    // A fleet node's own file with no [[node.programs]]: it starts no
    // program a company names.
    let strict = crewlet::config::AgentPolicy {
        command_agents: true,
        agent_env: Some(Default::default()),
        ..Default::default()
    };
    let mut a = f.node_with_policy("a", &[role], strict).await;
    f.until("a hands cmd back", WAIT, || {
        a.events()
            .iter()
            .any(|e| matches!(&e.event, Event::SeatDetached { seat, .. } if seat == "cmd"))
    })
    .await;
    assert!(
        !started.exists(),
        "no child started on a: {:?}",
        std::fs::read_to_string(&started)
    );
    let b = f.node("b", &[]).await;
    f.until("b holds cmd", WAIT, || b.attached("cmd")).await;
    b.publish("cmd", &trigger("P1", json!({}))).await;
    f.until_async("the turn ran on b", WAIT, || async {
        b.pending("cmd").await == 0
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(&started)
            .unwrap()
            .lines()
            .collect::<Vec<_>>(),
        vec!["b"],
        "the child ran on b alone"
    );
    drop(a);
}

/// Spec § Fencing: a seat whose teardown could not be proven keeps its
/// lease, renewed, so no peer can take it — its in-flight turn races nobody
/// and is not fenced: it runs its remaining rounds and completes. Admission
/// starts nothing new there.
async fn an_undead_seats_in_flight_turn_finishes_and_nothing_new_starts_there(f: Fleet) {
    let mut a = f.node("a", &[echo_role("s0"), echo_role("s1")]).await;
    f.until("a holds s0", WAIT, || a.attached("s0")).await;
    a.turns
        .faults
        .held_teardown
        .lock()
        .unwrap()
        .insert("s0".into());
    // Four rounds a second apart: the release's wait for it (one heartbeat)
    // ends while it still runs.
    a.publish(
        "s0",
        &trigger("U1", json!({"echo": {"rounds": 4, "round_delay_ms": 1000}})),
    )
    .await;
    f.until("U1's turn started", WAIT, || {
        !a.started_with("U1").is_empty()
    })
    .await;
    // The role leaves the company: the seat is released, its teardown fails.
    company::apply(&*a.store, COMPANY, &[echo_role("s1")])
        .await
        .unwrap();
    f.until("s0 is undead", WAIT, || {
        !a.matching(|e| match e {
            Event::SeatReleaseUnproven { seat, .. } if seat == "s0" => Some(()),
            _ => None,
        })
        .is_empty()
    })
    .await;
    assert_eq!(a.engine.host().may_start("s0"), None, "nothing new starts");
    f.until("U1's turn ended", WAIT, || !a.turns_of("U1").is_empty())
        .await;
    let (outcome, _, recorded, _, _) = a.turns_of("U1")[0].clone();
    assert_eq!(
        (outcome.as_str(), recorded),
        ("completed", true),
        "the in-flight turn ran to its end: the undead seat's fence stayed open"
    );
    assert_eq!(a.effects_of("U1").await.len(), 1, "its effect posted once");
    a.turns.faults.held_teardown.lock().unwrap().clear();
    f.until("the teardown proven, the seat goes", WAIT, || {
        !a.holds("s0")
    })
    .await;
}

/// ARCHITECTURE.md: every loop that can hold mail or a lease is watched.
/// A seat's three dispatch loops — its inbox (`dispatch`), its control
/// subject (`control`: run completions, approval answers, stops) and its
/// reflection subject (`reflect`) — are followed by the watchdog while it
/// is held, and no longer once it is let go.
async fn every_loop_that_can_hold_a_seats_mail_is_watched_and_a_released_seat_stands_down(
    f: Fleet,
) {
    let a = f.node("a", &[echo_role("s0")]).await;
    let loops = ["dispatch:s0", "control:s0", "reflect:s0"];
    f.until("s0's three loops watched", WAIT, || {
        let beats = a.engine.watchdog().beats();
        loops.iter().all(|k| beats.get(*k).is_some_and(|b| b.live))
    })
    .await;
    a.engine.drain().await;
    let beats = a.engine.watchdog().beats();
    assert!(
        loops.iter().all(|k| !beats.contains_key(*k)),
        "a released seat's loops are no longer watched: {:?}",
        beats.keys().collect::<Vec<_>>()
    );
}
