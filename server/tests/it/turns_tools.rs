//! The engine's built-in tools as an agent calls them (docs/agents.md § The command
//! agent, the tools table): `read_memory` answers the seat's own recent
//! diary notes and episodes, and reaches nothing outside the engine.

use std::sync::Arc;
use std::time::Duration;

use crewlet::coord::{Coordinator, CoordinatorOptions, Store, TwinBackend};
use crewlet::engine::agent::{Annotations, ToolCall, TurnInput};
use crewlet::engine::envelope::Envelope;
use crewlet::engine::outbox::{Outbox, TwinOutbox};
use crewlet::engine::runs::{Runs, Supervisor};
use crewlet::engine::tools::Tools;
use crewlet::engine::turn::{Executed, ToolRunner};
use crewlet::events::EventBus;
use crewlet::memory::MemoryStore;
use crewlet::node::company::Company;
use crewlet::queue::twin::TwinQueue;
use crewlet::queue::{Queue, log_events};
use serde_json::{Value, json};

async fn tools() -> (Tools, tempfile::TempDir) {
    tools_with(vec![]).await
}

/// [`tools`] for a company of `roles`.
async fn tools_with(roles: Vec<crewlet::config::RoleConfig>) -> (Tools, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let pool = crewlet::db::open(dir.path(), &crewlet::db::MIGRATOR)
        .await
        .unwrap();
    let store: Arc<dyn Store> = Arc::new(Coordinator::new(
        TwinBackend::new(Duration::from_secs(45)),
        CoordinatorOptions::default(),
    ));
    let queue: Arc<dyn Queue> = Arc::new(TwinQueue::new(log_events()));
    let outbox: Arc<dyn Outbox> = Arc::new(TwinOutbox::new());
    let runs = Runs::new(store.clone());
    let events = EventBus::new("n1", "n1-inc");
    let (_, company) = tokio::sync::watch::channel(Company {
        revision: 1,
        name: "Tool company".into(),
        timezone: "UTC".into(),
        roles,
        schedules: vec![],
    });
    let tools = Tools {
        roles_at_start: Default::default(),
        incarnation: "n1-inc".into(),
        supervisor: Arc::new(Supervisor::new(runs.clone(), queue.clone())),
        runs,
        approvals: crewlet::engine::approvals::Approvals::new(store, queue.clone(), events.clone()),
        events,
        outbox,
        queue,
        memory: MemoryStore::new(pool),
        company,
        programs: crewlet::config::AgentPolicy::test_rig(&["/bin/true"]).programs,
        mcp: Default::default(),
    };
    (tools, dir)
}

fn turn(seat: &str) -> TurnInput {
    TurnInput {
        turn_id: "t-1".into(),
        seat: seat.into(),
        epoch: 1,
        node: "n1".into(),
        work_key: Some("work-1".into()),
        triggers: vec![Envelope {
            id: "evt-1".into(),
            kind: "task_assigned".into(),
            body: json!({}),
            thread: None,
            message_id: None,
            from: None,
            sent_at: None,
        }],
        delivered: 1,
        tools: Vec::new(),
    }
}

fn read_memory(args: Value) -> ToolCall {
    ToolCall {
        id: "recall".into(),
        name: "read_memory".into(),
        args,
        annotations: Annotations::default(),
    }
}

fn contents(output: &Value, table: &str, field: &str) -> Vec<String> {
    output[table]
        .as_array()
        .unwrap_or_else(|| panic!("`{table}` is a list: {output}"))
        .iter()
        .map(|r| r[field].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_memory_returns_the_seats_own_diary_and_episodes_newest_first_and_reaches_nothing_outside()
 {
    let (tools, _dir) = tools().await;
    let m = &tools.memory;
    for note in ["first", "second", "third"] {
        assert!(m.diary_write("s0", note, None).await.unwrap());
    }
    assert!(
        m.episode_write("s0", Some("work-0"), "did the earlier work", "t-0")
            .await
            .unwrap()
    );
    // Another seat's memory in the same node's store.
    m.diary_write("s1", "not s0's", None).await.unwrap();
    m.episode_write("s1", Some("work-0"), "s1's episode", "t-9")
        .await
        .unwrap();

    let Executed {
        result, reached, ..
    } = tools.execute(&turn("s0"), &read_memory(json!({}))).await;
    assert!(result.ok, "{result:?}");
    assert_eq!(result.id, "recall");
    assert!(!reached, "read_memory is read-only: it reaches nothing");
    assert_eq!(
        contents(&result.output, "diary", "content"),
        ["third", "second", "first"]
    );
    assert_eq!(
        contents(&result.output, "episodes", "summary"),
        ["did the earlier work"]
    );

    // `limit` bounds each list.
    let Executed { result, .. } = tools
        .execute(&turn("s0"), &read_memory(json!({"limit": 2})))
        .await;
    assert!(result.ok, "{result:?}");
    assert_eq!(
        contents(&result.output, "diary", "content"),
        ["third", "second"]
    );

    // What a turn writes, the same seat reads back.
    let write = ToolCall {
        id: "note".into(),
        name: "diary_write".into(),
        args: json!({"text": "written in this turn"}),
        annotations: Annotations::default(),
    };
    let Executed {
        result: written,
        reached,
        ..
    } = tools.execute(&turn("s0"), &write).await;
    assert!(written.ok && !reached, "{written:?}");
    let Executed { result, .. } = tools.execute(&turn("s0"), &read_memory(json!({}))).await;
    assert_eq!(
        contents(&result.output, "diary", "content")[0],
        "written in this turn"
    );

    // A seat with no memory reads empty lists, not an error.
    let Executed { result, .. } = tools.execute(&turn("s2"), &read_memory(json!({}))).await;
    assert!(result.ok, "{result:?}");
    assert_eq!(result.output, json!({"diary": [], "episodes": []}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_detached_starts_only_a_program_on_the_nodes_allow_list_and_a_refusal_names_the_list() {
    let role = crewlet::config::RoleConfig {
        handle: "s0".into(),
        ..Default::default()
    };
    let (tools, _dir) = tools_with(vec![role]).await;
    let marker = _dir.path().join("ran");
    let call = ToolCall {
        id: "r".into(),
        name: "run_detached".into(),
        args: json!({"argv": ["/bin/touch", marker.display().to_string()]}),
        annotations: Annotations::default(),
    };
    let Executed {
        result, reached, ..
    } = tools.execute(&turn("s0"), &call).await;
    assert!(!result.ok, "a program off the list is refused: {result:?}");
    let why = result.error.clone().unwrap_or_default();
    assert!(
        why.contains("/bin/true") && why.contains("[runs] allow"),
        "{why}"
    );
    assert!(!reached, "a refused run reached nothing");
    assert_eq!(tools.supervisor.running(), 0);
    assert!(!marker.exists(), "nothing ran");
    assert!(
        tools.runs.list("s0").await.unwrap().is_empty(),
        "no run record was written"
    );
}

/// Fail closed: a call of a seat's MCP tool whose role has left the
/// company (a revision mid-turn) is judged by nothing — it is refused, not
/// run unapproved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_whose_role_is_gone_is_refused_not_run_unapproved() {
    let (tools, _dir) = tools().await;
    let seat = time_seat(&tools).await;
    // The company has no role `s0` (it was removed).
    let call = ToolCall {
        id: "c".into(),
        name: "time.get_current_time".into(),
        args: json!({"timezone": "UTC"}),
        annotations: Annotations::default(),
    };
    let Executed {
        result, reached, ..
    } = tools.execute(&turn("s0"), &call).await;
    assert!(!result.ok, "refused: {result:?}");
    let why = result.error.unwrap_or_default();
    assert!(why.contains("no role in the active company"), "{why}");
    assert!(!reached, "the call was never sent");
    seat.stop().await.unwrap();
}

/// The seat `s0` with PyPI's time server as its tool server `time`.
async fn time_seat(tools: &Tools) -> Arc<crewlet::engine::mcp::SeatMcp> {
    let time = std::env::var("CREWLET_MCP_TIME")
        .expect("CREWLET_MCP_TIME is not set: run the tests with ./dev test");
    let mut cfg =
        crewlet::config::McpServerConfig::stdio("time", &["python3", "-m", "mcp_server_time"]);
    cfg.env.insert("PYTHONPATH".into(), time);
    let seat =
        crewlet::engine::mcp::SeatMcp::start("s0", "n1", &[cfg], Default::default(), &|_, _| {})
            .await
            .unwrap();
    let seat = Arc::new(seat);
    tools.mcp.insert("s0", seat.clone());
    seat
}

/// A person approves what they can read whole, and a seat cannot bury
/// them: arguments past the bound are refused before asking, and past
/// the most approvals one seat may have waiting, a call fails unasked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_are_bounded_in_size_and_in_number_waiting_per_seat() {
    use crewlet::engine::approvals::{ARGUMENTS_LIMIT, PENDING_LIMIT};
    let role = crewlet::config::RoleConfig {
        handle: "s0".into(),
        approve: vec!["time.*".into()],
        ..Default::default()
    };
    let (tools, _dir) = tools_with(vec![role]).await;
    let seat = time_seat(&tools).await;
    let call = |id: &str, args: Value| ToolCall {
        id: id.into(),
        name: "time.get_current_time".into(),
        args,
        annotations: Annotations::default(),
    };
    let huge = call("big", json!({"timezone": "x".repeat(ARGUMENTS_LIMIT)}));
    let Executed { result, parks, .. } = tools.execute(&turn("s0"), &huge).await;
    assert!(!result.ok && parks.is_none(), "{result:?}");
    assert!(
        result
            .error
            .unwrap_or_default()
            .contains("a person is asked to approve"),
        "refused before asking"
    );
    for i in 0..PENDING_LIMIT {
        let Executed { parks, .. } = tools
            .execute(
                &turn("s0"),
                &call(&format!("c{i}"), json!({"timezone": "UTC"})),
            )
            .await;
        assert!(parks.is_some(), "call {i} waits for a person");
    }
    let Executed { result, parks, .. } = tools
        .execute(
            &turn("s0"),
            &call("one-too-many", json!({"timezone": "UTC"})),
        )
        .await;
    assert!(parks.is_none() && !result.ok, "{result:?}");
    assert!(
        result
            .error
            .unwrap_or_default()
            .contains("approvals waiting"),
        "names why"
    );
    let waiting = tools.approvals.list("s0").await.unwrap();
    assert_eq!(waiting.len(), PENDING_LIMIT, "nothing more was asked");
    seat.stop().await.unwrap();
}

/// Nothing lost when a revision removes a seat's role before its last
/// turns run (the chaos soak's seed 9507 lost a seat's backlog so): a
/// built-in call is judged by the role the seat was established under, so
/// the turn's effect is posted — while a seat no role is known for at all
/// is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_seats_last_turn_posts_its_effect_judged_by_the_role_it_was_established_under() {
    let (tools, _dir) = tools_with(vec![]).await;
    let post = ToolCall {
        id: "p".into(),
        name: "post_outbox".into(),
        args: json!({"text": "answered"}),
        annotations: Annotations::default(),
    };
    let unknown = tools.execute(&turn("s0"), &post).await;
    assert!(!unknown.result.ok, "no role known at all: refused");
    // What the acquire hook keeps as the seat is established here.
    tools.roles_at_start.keep(crewlet::config::RoleConfig {
        handle: "s0".into(),
        ..Default::default()
    });
    let known = tools.execute(&turn("s0"), &post).await;
    assert!(known.result.ok, "{:?}", known.result);
    let posted = tools.outbox.read(Some("s0")).await.unwrap();
    assert_eq!(posted.len(), 1, "the effect is posted: {posted:?}");
    // A role that asked for approval is still asked, as it was.
    tools.roles_at_start.keep(crewlet::config::RoleConfig {
        handle: "s1".into(),
        approve: vec!["post_outbox".into()],
        ..Default::default()
    });
    let asked = tools.execute(&turn("s1"), &post).await;
    assert!(
        asked.parks.is_some(),
        "parked for a person: {:?}",
        asked.result
    );
}
