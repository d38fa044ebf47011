//! A seat's MCP tool servers as behaviour, on the twin and on a real
//! nats-server, against real servers nobody here wrote: npm's
//! `@modelcontextprotocol/server-filesystem` (run with node) and PyPI's
//! `mcp-server-time`, both installed by `./dev test` (README § Tools).
//! The spec's § Establishing a seat (the tool servers first) and § A turn
//! that broke halfway (an MCP call reached outside unless its tool is
//! read-only), as behaviour.
//!
//! `CREWLET_MCP_FILESYSTEM` names the filesystem server's entry point and
//! `CREWLET_MCP_TIME` the folder holding `mcp_server_time`; a test run
//! without them fails, naming `./dev test`, rather than passing unseen.

#[macro_use]
mod support;

use std::path::Path;
use std::time::Duration;

use crewlet::config::{McpServerConfig, RoleConfig};
use crewlet::events::Event;
use serde_json::json;
use support::process::{NodeProcess, gone};
use support::turnfleet::*;

both!(
    a_seats_tools_are_listed_before_its_first_turn_is_admitted,
    a_turn_that_wrote_through_a_tool_server_and_then_broke_is_recorded_and_not_redelivered,
    a_turn_that_only_read_and_then_broke_is_redelivered_and_runs_again,
    a_tool_server_that_cannot_start_refuses_the_seat_naming_the_server_and_the_error,
    a_seat_given_back_stops_its_tool_servers_and_the_taker_starts_its_own,
    a_tool_server_that_died_between_turns_is_started_again_at_the_next_turn,
    a_paused_seat_keeps_its_tool_servers_up,
);

const WAIT: Duration = Duration::from_secs(30);

fn filesystem_server() -> String {
    std::env::var("CREWLET_MCP_FILESYSTEM").expect(
        "CREWLET_MCP_FILESYSTEM is not set: run the tests with ./dev test, which installs the MCP servers",
    )
}

fn time_server_path() -> String {
    std::env::var("CREWLET_MCP_TIME").expect(
        "CREWLET_MCP_TIME is not set: run the tests with ./dev test, which installs the MCP servers",
    )
}

/// A seat whose tools are the filesystem server over `dir` and the time
/// server.
fn tooled(handle: &str, dir: &Path) -> RoleConfig {
    let node = which("node");
    let fs = filesystem_server();
    let mut time = McpServerConfig::stdio("time", &["python3", "-m", "mcp_server_time"]);
    time.env.insert("PYTHONPATH".into(), time_server_path());
    RoleConfig {
        mcp: vec![
            McpServerConfig::stdio("fs", &[&node, &fs, dir.to_str().unwrap()]),
            time,
        ],
        ..echo_role(handle)
    }
}

/// Node `a` holding seat `s0`, its tools those of [`tooled`] over `dir`,
/// once the seat is established.
async fn tooled_node(f: &Fleet, dir: &Path) -> Node {
    let a = f.node("a", &[tooled("s0", dir)]).await;
    f.until("a has s0 established", WAIT, || a.attached("s0"))
        .await;
    a
}

/// A scratch folder for the filesystem server, by its real path (the
/// server resolves symbolic links and refuses paths outside it).
fn workdir() -> (tempfile::TempDir, std::path::PathBuf) {
    let work = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(work.path()).unwrap();
    (work, dir)
}

fn which(program: &str) -> String {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} is not on PATH (./dev test installs it)"))
        .to_string_lossy()
        .into_owned()
}

/// The pids of `seat`'s stdio tool servers on `node`, once it runs `n`.
async fn tool_servers_up(f: &Fleet, node: &Node, seat: &str, n: usize) -> Vec<u32> {
    let turns = node.turns.clone();
    f.until(
        &format!("{} runs {n} tool servers for {seat}", node.id()),
        WAIT,
        || turns.tool_server_pids(seat).len() == n,
    )
    .await;
    node.turns.tool_server_pids(seat)
}

fn position(events: &[crewlet::events::FleetEvent], f: impl Fn(&Event) -> bool) -> Option<usize> {
    events.iter().position(|e| f(&e.event))
}

async fn a_seats_tools_are_listed_before_its_first_turn_is_admitted(f: Fleet) {
    let (_work, dir) = workdir();
    let mut a = tooled_node(&f, &dir).await;
    a.publish("s0", &trigger("T1", json!({}))).await;
    f.until("T1 ran", WAIT, || !a.turns_of("T1").is_empty())
        .await;
    let events = a.events().to_vec();
    let started = |server: &'static str| move |e: &Event| matches!(e, Event::McpServerStarted { seat, server: s, tools } if seat == "s0" && s == server && *tools > 0);
    let fs = position(&events, started("fs")).expect("mcp_server_started for fs");
    let time = position(&events, started("time")).expect("mcp_server_started for time");
    let attached = position(
        &events,
        |e| matches!(e, Event::SeatAttached { seat, .. } if seat == "s0"),
    )
    .expect("seat_attached");
    let turn = position(
        &events,
        |e| matches!(e, Event::TurnStarted { seat, .. } if seat == "s0"),
    )
    .expect("turn_started");
    assert!(
        fs < attached && time < attached,
        "the tool servers come up before the seat attaches"
    );
    assert!(attached < turn);
    let surface = a.turns.tool_surface("s0");
    let named = |n: &str| surface.iter().find(|t| t.name == n).cloned();
    let write =
        named("fs.write_file").expect("the filesystem server's write_file, named by its server");
    assert_eq!(write.annotations.read_only, Some(false));
    assert_eq!(write.annotations.destructive, Some(true));
    assert!(
        write.input_schema.get("properties").is_some(),
        "its input schema"
    );
    assert_eq!(
        named("fs.read_text_file").unwrap().annotations.read_only,
        Some(true)
    );
    assert!(named("time.get_current_time").is_some());
    assert!(
        named("diary_write").is_some(),
        "the built-ins are in the surface too"
    );
}

async fn a_turn_that_wrote_through_a_tool_server_and_then_broke_is_recorded_and_not_redelivered(
    f: Fleet,
) {
    let (_work, dir) = workdir();
    let target = dir.join("report.txt");
    let mut a = tooled_node(&f, &dir).await;
    a.publish(
        "s0",
        &trigger(
            "W",
            json!({
                "tools": [{"name": "fs.write_file", "args": {"path": target.to_str().unwrap(), "content": "written by W"}}],
                "echo": {"rounds": 2, "fail_round": 2, "fail": "before_outside"},
            }),
        ),
    )
    .await;
    f.until("W ran", WAIT, || !a.turns_of("W").is_empty()).await;
    assert_eq!(
        a.turns_of("W"),
        vec![("failed".into(), "ack".into(), true, 1, 2)],
        "the write reached outside: the broken turn is recorded and acked, never handed back"
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "written by W");
    f.until_async("W's delivery is settled", WAIT, || async {
        a.pending("s0").await == 0
    })
    .await;
    assert_eq!(a.turns_of("W").len(), 1, "and it did not run again");
}

async fn a_turn_that_only_read_and_then_broke_is_redelivered_and_runs_again(f: Fleet) {
    let (_work, dir) = workdir();
    let source = dir.join("notes.txt");
    std::fs::write(&source, "to be read").unwrap();
    let mut a = tooled_node(&f, &dir).await;
    a.publish(
        "s0",
        &trigger(
            "R",
            json!({
                "tools": [
                    {"name": "fs.read_text_file", "args": {"path": source.to_str().unwrap()}},
                    {"name": "time.get_current_time", "args": {"timezone": "UTC"}},
                ],
                "echo": {"rounds": 2, "fail_round": 2, "fail": "before_outside", "fail_deliveries": 1},
            }),
        ),
    )
    .await;
    f.until("R ran twice", WAIT, || a.turns_of("R").len() >= 2)
        .await;
    assert_eq!(
        a.turns_of("R"),
        vec![
            ("failed".into(), "nak".into(), false, 1, 2),
            ("completed".into(), "ack".into(), true, 2, 3),
        ],
        "read-only calls prove nothing: the broken turn is handed back and runs again"
    );
}

async fn a_tool_server_that_cannot_start_refuses_the_seat_naming_the_server_and_the_error(
    f: Fleet,
) {
    let mut hangs = McpServerConfig::stdio("slow", &["/bin/sleep", "60"]);
    hangs.start_timeout_seconds = 1;
    let cases = [
        (
            "gone",
            McpServerConfig::stdio("gone", &["/nonexistent/mcp-server"]),
            "cannot start",
        ),
        (
            "exits",
            McpServerConfig::stdio("exits", &["/bin/true"]),
            "did not initialise",
        ),
        (
            "garbage",
            McpServerConfig::stdio("garbage", &["/bin/sh", "-c", "echo 'not json'; sleep 60"]),
            "",
        ),
        ("slow", hangs, "within 1s"),
    ];
    let roles: Vec<RoleConfig> = cases
        .iter()
        .enumerate()
        .map(|(i, (_, cfg, _))| {
            let mut r = echo_role(&format!("s{i}"));
            let mut cfg = cfg.clone();
            cfg.start_timeout_seconds = cfg.start_timeout_seconds.min(3);
            r.mcp = vec![cfg];
            r
        })
        .collect();
    let mut a = f.node("a", &roles).await;
    for (i, (server, _, says)) in cases.iter().enumerate() {
        let seat = format!("s{i}");
        f.until(&format!("mcp_server_failed for {server}"), WAIT, || {
            !a.matching(|e| match e {
                Event::McpServerFailed {
                    seat: s,
                    server: n,
                    error,
                } if *s == seat && n == server && error.contains(says) => Some(()),
                _ => None,
            })
            .is_empty()
        })
        .await;
        assert!(
            !a.attached(&seat),
            "{seat}: a seat whose tools cannot start is not established here"
        );
    }
    assert!(a.turns.tool_server_pids("s0").is_empty());
}

async fn a_seat_given_back_stops_its_tool_servers_and_the_taker_starts_its_own(f: Fleet) {
    let (_work, dir) = workdir();
    let mut a = tooled_node(&f, &dir).await;
    let pids = tool_servers_up(&f, &a, "s0", 2).await;
    let b = f.node("b", &[]).await;
    a.engine.drain().await;
    f.until("b has s0 established", WAIT, || b.attached("s0"))
        .await;
    assert!(
        !a.matching(|e| match e {
            Event::McpServerExited { seat, server, .. } if seat == "s0" && server == "fs" =>
                Some(()),
            _ => None,
        })
        .is_empty(),
        "the giver says its servers stopped"
    );
    for pid in pids {
        assert!(gone(pid), "the giver's tool server {pid} is gone");
    }
    tool_servers_up(&f, &b, "s0", 2).await;
    assert!(
        b.turns
            .tool_surface("s0")
            .iter()
            .any(|t| t.name == "fs.write_file")
    );
}

async fn a_tool_server_that_died_between_turns_is_started_again_at_the_next_turn(f: Fleet) {
    let (_work, dir) = workdir();
    let target = dir.join("after.txt");
    let mut a = tooled_node(&f, &dir).await;
    let before = tool_servers_up(&f, &a, "s0", 2).await;
    for pid in &before {
        unsafe {
            libc::kill(*pid as libc::pid_t, libc::SIGKILL);
        }
    }
    support::wait_for(
        "the tool servers to die",
        WAIT,
        Duration::from_millis(50),
        || async { before.iter().all(|p| gone(*p)).then_some(()) },
    )
    .await;
    a.publish(
        "s0",
        &trigger(
            "A",
            json!({"tools": [{"name": "fs.write_file", "args": {"path": target.to_str().unwrap(), "content": "after a restart"}}]}),
        ),
    )
    .await;
    f.until("A ran", WAIT, || !a.turns_of("A").is_empty()).await;
    assert_eq!(
        a.turns_of("A"),
        vec![("completed".into(), "ack".into(), true, 1, 2)]
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "after a restart");
    let died: Vec<String> = a.matching(|e| match e {
        Event::McpServerExited { server, reason, .. } if reason.starts_with("died") => {
            Some(server.clone())
        }
        _ => None,
    });
    assert!(died.contains(&"fs".to_string()), "{died:?}");
    let after = a.turns.tool_server_pids("s0");
    assert_eq!(after.len(), 2);
    assert!(after.iter().all(|p| !before.contains(p)), "new children");
}

async fn a_paused_seat_keeps_its_tool_servers_up(f: Fleet) {
    let (_work, dir) = workdir();
    let a = tooled_node(&f, &dir).await;
    let pids = tool_servers_up(&f, &a, "s0", 2).await;
    let record = crewlet::engine::pause::PauseRecord {
        by: "ann".into(),
        at: "2026-12-01T08:00:00Z".into(),
        reason: Some("looking".into()),
        stop_running_turn: false,
    };
    assert!(
        crewlet::engine::pause::pause(&*a.store, &*a.queue, "s0", record)
            .await
            .unwrap()
    );
    let host = a.engine.host().clone();
    f.until("the inbox is held", WAIT, || {
        host.inbox_quiesced("s0") == Some(true)
    })
    .await;
    assert!(a.attached("s0"), "a paused seat stays held");
    assert_eq!(
        a.turns.tool_server_pids("s0"),
        pids,
        "and its tool servers stay up"
    );
    assert!(pids.iter().all(|p| !gone(*p)));
}

/// The binary as a user runs it: the seat's stdio tool server (the real
/// time server, behind a launcher that reports its pid and environment and
/// then ignores SIGTERM) sees none of the node's secrets, and dies with the
/// node on `kill -9`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_server_sees_only_its_own_environment_and_dies_with_its_node_on_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("server.json");
    let launcher = dir.path().join("launch.py");
    std::fs::write(
        &launcher,
        format!(
            "import json, os, signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\njson.dump({{'pid': os.getpid(), 'env': dict(os.environ)}}, open({r:?} + '.tmp', 'w'))\nos.rename({r:?} + '.tmp', {r:?})\nos.execvp('python3', ['python3', '-m', 'mcp_server_time'])\n",
            r = report.display().to_string(),
        ),
    )
    .unwrap();
    let config = format!(
        "[node]\nid = \"node-m\"\nlisten = \"{{listen}}\"\ndata_dir = \"{{data}}\"\n\n[[roles]]\nhandle = \"timed\"\nmcp = [{{ name = \"time\", command = [\"python3\", {:?}], env = {{ PYTHONPATH = {:?} }} }}]\n",
        launcher.display().to_string(),
        time_server_path(),
    );
    let mut node = NodeProcess::start_with_env(
        &config,
        &[
            ("CREWLET_STREAM__USER", "crewlet-node"),
            ("CREWLET_STREAM__PASSWORD", "the-fleets-nats-password"),
            ("NODE_ONLY_SECRET", "not-for-tool-servers"),
        ],
    );
    node.healthy(Duration::from_secs(60)).await;
    let server: serde_json::Value =
        support::process::report_of(&report, "the tool server to report its environment").await;
    let env = server["env"].as_object().unwrap();
    for secret in [
        "CREWLET_STREAM__USER",
        "CREWLET_STREAM__PASSWORD",
        "NODE_ONLY_SECRET",
    ] {
        assert!(!env.contains_key(secret), "the tool server saw {secret}");
    }
    assert_eq!(env["CREWLET_SEAT"], "timed");
    let pid = server["pid"].as_u64().unwrap() as u32;
    support::process::dies_with(&mut node, pid, "the tool server to die with its node").await;
}
