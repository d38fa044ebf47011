//! The command agent against real child processes: the Python example, and
//! small inline Python scripts that misbehave on purpose (docs/agents.md § The
//! command agent).

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crewlet::config::CommandConfig;
use crewlet::engine::agent::{Agent, Step, ToolResult, TurnInput};
use crewlet::engine::command::CommandAgent;
use crewlet::engine::envelope::Envelope;
use serde_json::json;

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/command_agent.py")
}

fn python(script: &Path) -> CommandConfig {
    CommandConfig::new(vec!["python3".into(), script.display().to_string()])
}

/// Write `source` to a script in `dir` and return the agent settings that run it.
fn script(dir: &tempfile::TempDir, source: &str) -> CommandConfig {
    let path = dir.path().join("agent.py");
    std::fs::write(&path, source).unwrap();
    python(&path)
}

fn turn(turn_id: &str, triggers: &[&str]) -> TurnInput {
    TurnInput {
        turn_id: turn_id.into(),
        seat: "s1".into(),
        epoch: 7,
        node: "n1".into(),
        work_key: Some(format!("work-{turn_id}")),
        triggers: triggers
            .iter()
            .map(|id| Envelope {
                id: (*id).into(),
                kind: "task_assigned".into(),
                body: json!({"title": "x"}),
                thread: None,
                message_id: None,
                from: None,
                sent_at: None,
            })
            .collect(),
        delivered: 1,
        tools: Vec::new(),
    }
}

fn alive(pid: u32) -> bool {
    !support::process::gone(pid)
}

/// Wait, within a deadline, until process `pid` is gone.
async fn gone_within(pid: u32, what: &str) {
    support::wait_for(
        what,
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async { support::process::gone(pid).then_some(()) },
    )
    .await
}

#[tokio::test]
async fn the_python_example_asks_for_a_diary_note_and_a_post_then_finishes_with_the_results() {
    let agent = CommandAgent::new("s1", "n1", &python(&example()));
    agent.start().await.unwrap();
    let t = turn("t-1", &["evt-1", "evt-2"]);

    let Step::Calls(calls) = agent.round(&t, 1, vec![]).await.unwrap() else {
        panic!("round 1 should ask for tool calls");
    };
    let names: Vec<&str> = calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["diary_write", "post_outbox"]);
    let diary = calls[0].args["text"].as_str().unwrap();
    assert!(
        diary.contains("s1") && diary.contains("t-1"),
        "the diary note names the seat (from CREWLET_SEAT) and the turn: {diary}"
    );
    assert_eq!(calls[1].args, json!({"text": "echo of evt-1, evt-2"}));

    let results = calls
        .iter()
        .map(|c| ToolResult::ok(&c.id, json!({})))
        .collect();
    let done = agent.round(&t, 2, results).await.unwrap();
    assert_eq!(
        done,
        Step::Done {
            result: json!({"echoed": true, "failed": []}),
            answered: vec![],
        }
    );
    agent.stop().await.unwrap();
    assert_eq!(agent.pid(), None);
}

#[tokio::test]
async fn answers_for_another_turn_and_lines_that_are_not_json_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = script(
        &dir,
        r#"
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m["type"] != "turn":
        continue
    tid = m["turn"]["turn_id"]
    print(json.dumps({"type": "done", "turn_id": "t-old", "result": "stale"}))
    print("this is not json")
    print(json.dumps({"type": "calls", "calls": []}))
    print(json.dumps({"type": "shrug", "turn_id": tid}))
    print(json.dumps({"type": "done", "turn_id": tid, "answered": ["m-1"],
                      "result": {"seat": os.environ["CREWLET_SEAT"],
                                 "node": os.environ["CREWLET_NODE"]}}), flush=True)
"#,
    );
    let agent = CommandAgent::new("s1", "n1", &cfg);
    agent.start().await.unwrap();
    let step = agent
        .round(&turn("t-2", &["evt-1"]), 1, vec![])
        .await
        .unwrap();
    assert_eq!(
        step,
        Step::Done {
            result: json!({"seat": "s1", "node": "n1"}),
            answered: vec!["m-1".into()],
        }
    );
    agent.stop().await.unwrap();
}

#[tokio::test]
async fn an_error_answer_fails_the_round_with_the_agents_message() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = script(
        &dir,
        r#"
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m["type"] == "turn":
        print(json.dumps({"type": "error", "turn_id": m["turn"]["turn_id"],
                          "message": "out of ideas"}), flush=True)
"#,
    );
    let agent = CommandAgent::new("s1", "n1", &cfg);
    agent.start().await.unwrap();
    let err = agent
        .round(&turn("t-3", &["evt-1"]), 1, vec![])
        .await
        .unwrap_err();
    assert!(err.0.contains("out of ideas"), "{err}");
    agent.stop().await.unwrap();
}

#[tokio::test]
async fn a_child_that_exits_mid_round_fails_the_round_and_the_next_turn_restarts_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = script(
        &dir,
        r#"
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m["type"] != "turn":
        continue
    tid = m["turn"]["turn_id"]
    if tid == "t-die":
        sys.exit(3)
    print(json.dumps({"type": "done", "turn_id": tid, "result": "ok"}), flush=True)
"#,
    );
    let agent = CommandAgent::new("s1", "n1", &cfg);
    agent.start().await.unwrap();
    let first = agent.pid().expect("a started agent has a pid");

    let err = agent
        .round(&turn("t-die", &["evt-1"]), 1, vec![])
        .await
        .unwrap_err();
    assert!(
        err.0.contains("the agent process exited") && err.0.contains('3'),
        "the error says the child exited, with its status: {err}"
    );
    assert_eq!(agent.pid(), None, "the dead child was reaped");

    let step = agent
        .round(&turn("t-next", &["evt-2"]), 1, vec![])
        .await
        .unwrap();
    assert_eq!(
        step,
        Step::Done {
            result: json!("ok"),
            answered: vec![]
        }
    );
    let second = agent.pid().expect("the restarted child has a pid");
    assert_ne!(first, second, "a new child runs the next turn");
    agent.stop().await.unwrap();
}

#[tokio::test]
async fn a_round_abandoned_mid_way_leaves_the_agent_usable_and_its_late_answer_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    // Never answers `t-slow` until it is aborted, and then answers it late.
    let cfg = script(
        &dir,
        r#"
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m["type"] == "turn" and m["turn"]["turn_id"] != "t-slow":
        tid = m["turn"]["turn_id"]
        print(json.dumps({"type": "done", "turn_id": tid, "result": tid}), flush=True)
    elif m["type"] == "abort":
        print(json.dumps({"type": "done", "turn_id": m["turn_id"], "result": "late"}), flush=True)
"#,
    );
    let agent = CommandAgent::new("s1", "n1", &cfg);
    agent.start().await.unwrap();
    let slow = turn("t-slow", &["evt-1"]);
    let abandoned =
        tokio::time::timeout(Duration::from_millis(300), agent.round(&slow, 1, vec![])).await;
    assert!(abandoned.is_err(), "the child does not answer t-slow");
    agent.abort("t-slow", "seat lost").await;

    let step = agent
        .round(&turn("t-next", &["evt-2"]), 1, vec![])
        .await
        .unwrap();
    assert_eq!(
        step,
        Step::Done {
            result: json!("t-next"),
            answered: vec![]
        }
    );
    agent.stop().await.unwrap();
}

#[tokio::test]
async fn a_child_that_does_not_answer_in_time_fails_the_round_naming_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = script(&dir, "import sys\nfor line in sys.stdin:\n    pass\n");
    cfg.round_timeout_seconds = 1;
    let agent = CommandAgent::new("s1", "n1", &cfg);
    agent.start().await.unwrap();
    let err = agent
        .round(&turn("t-quiet", &["evt-1"]), 1, vec![])
        .await
        .unwrap_err();
    assert!(
        err.0.contains("within 1s") && err.0.contains("round_timeout_seconds"),
        "{err}"
    );
    agent.stop().await.unwrap();
}

#[tokio::test]
async fn a_child_that_ignores_sigterm_is_killed_with_its_whole_group_after_its_grace() {
    let dir = tempfile::tempdir().unwrap();
    let grandchild = dir.path().join("grandchild");
    let mut cfg = script(
        &dir,
        &format!(
            r#"
import json, signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
# A grandchild that ignores SIGTERM too, as `npx` or `sh -c` leave behind.
g = subprocess.Popen(["python3", "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
open({path:?}, "w").write(str(g.pid))
for line in sys.stdin:
    m = json.loads(line)
    if m["type"] == "turn":
        print(json.dumps({{"type": "done", "turn_id": m["turn"]["turn_id"]}}), flush=True)
"#,
            path = grandchild.display().to_string()
        ),
    );
    cfg.stop_wait_ms = 300;
    let agent = CommandAgent::new("s1", "n1", &cfg);
    agent.start().await.unwrap();
    // An answered turn proves SIGTERM is ignored by now.
    agent
        .round(&turn("t-ready", &["evt-1"]), 1, vec![])
        .await
        .unwrap();
    let pid = agent.pid().unwrap();
    let grandchild: u32 = std::fs::read_to_string(&grandchild)
        .unwrap()
        .parse()
        .unwrap();
    assert!(alive(grandchild));

    agent
        .stop()
        .await
        .expect("stopped: SIGKILL after the grace");
    assert_eq!(agent.pid(), None);
    assert!(!alive(pid), "the child is gone");
    gone_within(grandchild, "the grandchild to go with its seat's child").await;
}

#[tokio::test]
async fn a_program_that_does_not_exist_is_a_start_error_naming_it() {
    let cfg = CommandConfig::new(vec!["crewlet-no-such-agent".into(), "--flag".into()]);
    let agent = CommandAgent::new("s1", "n1", &cfg);
    let err = agent.start().await.unwrap_err();
    assert!(
        err.0
            .starts_with("cannot start `crewlet-no-such-agent --flag`: No such file or directory"),
        "{err}"
    );
    assert_eq!(agent.pid(), None);
    agent.stop().await.unwrap();
}

#[tokio::test]
async fn a_child_that_writes_a_line_without_end_is_killed_and_the_round_fails_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = script(
        &dir,
        r#"
import sys
for line in sys.stdin:
    # 8 MiB and counting, never a newline: what `head -c 8G /dev/zero` does.
    chunk = "x" * (1 << 20)
    while True:
        sys.stdout.write(chunk)
        sys.stdout.flush()
"#,
    );
    let agent = CommandAgent::new("s1", "n1", &cfg);
    agent.start().await.unwrap();
    let pid = agent.pid().unwrap();
    let err = agent
        .round(&turn("t-flood", &["evt-1"]), 1, vec![])
        .await
        .unwrap_err();
    assert!(
        err.0.contains(&format!(
            "more than {} bytes",
            crewlet::engine::command::LINE_LIMIT
        )) && err.0.contains("killed"),
        "{err}"
    );
    gone_within(pid, "the flooding child to be killed").await;
    assert_eq!(agent.pid(), None);
}
