//! Whole nodes (`node::start`, as `crewlet run` starts them) on one real
//! nats-server: they share the company, split its seats, show each other
//! in `/query/fleet`, and a drained node's seats move to its peer.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use crewlet::config::Config;
use crewlet::node::{self, RunningNode};
use serde_json::Value;

fn config(id: &str, url: &str, dir: &std::path::Path) -> Config {
    let text = format!(
        r#"
[node]
id = "{id}"
listen = "127.0.0.1:0"
data_dir = "{data}"

[coordination]
type = "embedded-kv"
lease_ttl_seconds = 3
heartbeat_seconds = 1
sweep_seconds = 1

[stream]
type = "nats"
urls = ["{url}"]

[company]
name = "Fleet company"

[[roles]]
handle = "s0"
[[roles]]
handle = "s1"
[[roles]]
handle = "s2"
[[roles]]
handle = "s3"

[[auth.tokens]]
name = "monitoring"
sha256 = "{sha}"
role = "viewer"
"#,
        data = dir.join(id).display(),
        sha = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8",
    );
    Config::parse("fleet.toml", &text, &BTreeMap::new()).unwrap()
}

/// sha256("password"), the token above.
const TOKEN: &str = "password";

async fn fleet_view(n: &RunningNode) -> Value {
    reqwest::Client::new()
        .get(format!("http://{}/query/fleet", n.addr))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn until(what: &str, within: Duration, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn seats_of(view: &Value, node: &str) -> Vec<String> {
    view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["node_id"] == node)
        .flat_map(|n| n["seats"].as_array().unwrap().iter())
        .map(|s| s["handle"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_one_nats_split_the_company_and_a_drain_hands_seats_over() {
    let server = support::nats::NatsServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let a = node::start(config("node-a", &server.url(), dir.path()))
        .await
        .unwrap();
    let b = node::start(config("node-b", &server.url(), dir.path()))
        .await
        .unwrap();
    until(
        "a 2/2 split seen from either node",
        Duration::from_secs(30),
        async || {
            let v = fleet_view(&a).await;
            seats_of(&v, "node-a").len() == 2 && seats_of(&v, "node-b").len() == 2
        },
    )
    .await;
    // Both serving as node B reads the fleet. A presence renewal landing
    // late on a loaded machine lets a node's presence lapse for a moment
    // (it then reads as draining: its seats without a presence), so the
    // read is waited for rather than taken at one instant.
    let mut v = fleet_view(&b).await;
    until(
        "both nodes read as serving from node B",
        Duration::from_secs(30),
        async || {
            v = fleet_view(&b).await;
            v["nodes"]
                .as_array()
                .is_some_and(|ns| ns.len() == 2 && ns.iter().all(|n| n["status"] == "serving"))
        },
    )
    .await;
    assert_eq!(v["answered_by"], "node-b");
    assert_eq!(v["coordination"], "embedded-kv");
    for n in v["nodes"].as_array().unwrap() {
        assert_eq!(n["status"], "serving");
        assert_eq!(n["protocol"], 4);
        assert!(n["presence_expires_at"].is_string());
        for s in n["seats"].as_array().unwrap() {
            assert!(s["epoch"].as_u64().unwrap() >= 1);
            assert!(
                s["since"].as_str().unwrap().contains('T'),
                "since is RFC 3339: {s}"
            );
        }
    }
    // A graceful stop is a drain: its seats are released and b takes them.
    a.shutdown().await.unwrap();
    until(
        "b to hold every seat",
        Duration::from_secs(10),
        async || seats_of(&fleet_view(&b).await, "node-b").len() == 4,
    )
    .await;
    let v = fleet_view(&b).await;
    assert_eq!(
        v["nodes"].as_array().unwrap().len(),
        1,
        "the drained node left: {v}"
    );
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_seats_new_memory_reaches_the_changelog_within_a_cycle_while_the_seat_stays_held() {
    // What a crash can lose is one `memory.flush_seconds` cycle: the cycle
    // itself, not a handoff's flush, publishes a held seat's new rows.
    let server = support::nats::NatsServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config("node-a", &server.url(), dir.path());
    cfg.memory.flush_seconds = 1;
    let a = node::start(cfg).await.unwrap();
    until(
        "node-a to hold every seat",
        Duration::from_secs(30),
        async || seats_of(&fleet_view(&a).await, "node-a").len() == 4,
    )
    .await;

    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    let trigger = serde_json::json!({
        "id": "cycle-1",
        "type": "task_assigned",
        "body": {"task": "remember this"},
        "from": "tests"
    });
    js.publish(
        "crewlet.agent.s0.inbox",
        serde_json::to_vec(&trigger).unwrap().into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();

    let memory = js.get_stream("CREWLET_MEMORY").await.unwrap();
    until(
        "s0's new rows on the changelog",
        Duration::from_secs(30),
        async || {
            memory
                .raw_message_builder()
                .sequence(1)
                .next_by_subject("crewlet.memory.s0.>")
                .send()
                .await
                .is_ok()
        },
    )
    .await;
    assert!(
        seats_of(&fleet_view(&a).await, "node-a").contains(&"s0".to_string()),
        "s0 never left node-a: no handoff flushed its rows"
    );
    a.shutdown().await.unwrap();
}
