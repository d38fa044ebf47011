//! The kill -9 scenario shared by the reliability suite and the fleet
//! bench: a node killed in the middle of turns, holding fetched mail, and
//! how long until its seats' next holder answered all of it. Nodes are the
//! binary, as a user runs it, on a real nats-server.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use serde_json::json;

use super::nats::NatsServer;
use super::process::NodeProcess;

pub const SEATS: [&str; 4] = ["r0", "r1", "r2", "r3"];

/// A test node's company file on `nats` with the shipped ack window (or
/// `ack_wait` seconds), TTL 3 s, heartbeat and sweep 1 s.
pub fn fleet_config(id: &str, nats: &NatsServer, ack_wait: Option<u64>) -> String {
    let mut roles = String::new();
    for h in SEATS {
        roles.push_str(&format!(
            "[[roles]]\nhandle = \"{h}\"\nagent = {{ kind = \"echo\", drills = true }}\n\n"
        ));
    }
    let window = ack_wait
        .map(|s| format!("ack_wait_seconds = {s}\n"))
        .unwrap_or_default();
    format!(
        "[node]\nid = \"{id}\"\nlisten = \"{{listen}}\"\ndata_dir = \"{{data}}\"\nenvironment = \"test\"\n\n\
         [coordination]\ntype = \"embedded-kv\"\nlease_ttl_seconds = 3\nheartbeat_seconds = 1\nsweep_seconds = 1\n\n\
         [stream]\ntype = \"nats\"\nurls = [\"{}\"]\n{window}\n\
         [logging]\nformat = \"json\"\n\n{roles}",
        nats.url()
    )
}

/// Every trigger id the fleet's outbox has an effect for.
pub async fn answered(js: &jetstream::Context) -> BTreeSet<String> {
    let Ok(stream) = js.get_stream("CREWLET_OUTBOX").await else {
        return BTreeSet::new();
    };
    let Ok(c) = stream
        .create_consumer(consumer::pull::Config {
            ack_policy: consumer::AckPolicy::None,
            deliver_policy: consumer::DeliverPolicy::All,
            inactive_threshold: Duration::from_secs(10),
            ..Default::default()
        })
        .await
    else {
        return BTreeSet::new();
    };
    let mut ids = BTreeSet::new();
    loop {
        let Ok(mut batch) = c
            .fetch()
            .max_messages(500)
            .expires(Duration::from_millis(300))
            .messages()
            .await
        else {
            break;
        };
        let mut got = 0;
        while let Some(Ok(m)) = batch.next().await {
            got += 1;
            let v: serde_json::Value = serde_json::from_slice(&m.payload).unwrap_or_default();
            for id in v["trigger_ids"].as_array().into_iter().flatten() {
                if let Some(id) = id.as_str() {
                    ids.insert(id.to_string());
                }
            }
        }
        if got == 0 {
            break;
        }
    }
    ids
}

/// How many turns `node` has started (its `turn_started` events).
pub fn turns_started(node: &NodeProcess) -> usize {
    node.stderr()
        .iter()
        .filter(|l| l.contains("turn_started"))
        .count()
}

pub async fn all_held_by(node: &NodeProcess) {
    let want: Vec<String> = SEATS.iter().map(|s| s.to_string()).collect();
    super::wait_for(
        "every seat held",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { (node.seats().await == want).then_some(()) },
    )
    .await;
}

/// The nats-servers a reliability promise is checked on: the default one
/// and, when `./dev test` installed it, the current release
/// (`NATS_SERVER_CURRENT`).
pub fn servers() -> Vec<(String, Option<std::path::PathBuf>)> {
    let mut out = vec![("the default nats-server".to_string(), None)];
    match std::env::var("NATS_SERVER_CURRENT") {
        Ok(p) if std::path::Path::new(&p).exists() => {
            out.push((format!("nats-server at {p}"), Some(p.into())))
        }
        _ => println!(
            "NATS_SERVER_CURRENT is not set (./dev test sets it): this run boots on the default nats-server only"
        ),
    }
    out
}

/// What one kill -9 left and how long its mail took to come back.
pub struct Stranded {
    /// From `kill -9` to the last message node A left being answered.
    pub seconds: f64,
    /// Messages node A had not answered when it died.
    pub left: usize,
    pub total: usize,
}

/// Node A holds every seat and is killed with -9 in the middle of slow
/// turns holding fetched mail; node B starts and takes the seats. Returns
/// once every message has an outbox effect (panics after 120 s, or when
/// node A left nothing in flight).
pub async fn killed_node_mail_comes_back(nats: &NatsServer) -> Stranded {
    let mut a = NodeProcess::start(&fleet_config("node-a", nats, None));
    a.healthy(Duration::from_secs(60)).await;
    all_held_by(&a).await;
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    // Slow turns (three rounds of 2 s), so node A holds fetched mail when
    // it dies: each seat's turn takes up to 16 deliveries at once.
    let mut ids = Vec::new();
    let publish = |i: usize| {
        let js = js.clone();
        async move {
            let id = format!("k9-{i}");
            let seat = SEATS[i % SEATS.len()];
            let mail = json!({"id": id, "type": "task_assigned", "body": {"echo": {"rounds": 3, "round_delay_ms": 2000}}});
            js.publish(
                format!("crewlet.agent.{seat}.inbox"),
                mail.to_string().into(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
            id
        }
    };
    // One message per seat first; the rest wait in the stream while those
    // turns run, and each seat's next turn takes them all at once.
    for i in 0..SEATS.len() {
        ids.push(publish(i).await);
    }
    super::wait_for(
        "a turn started on every seat",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async { (turns_started(&a) >= SEATS.len()).then_some(()) },
    )
    .await;
    for i in SEATS.len()..40 {
        ids.push(publish(i).await);
    }
    // Node A dies in the middle of a turn holding the second wave.
    super::wait_for(
        "a turn of the second wave started on node A",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || async { (turns_started(&a) > SEATS.len()).then_some(()) },
    )
    .await;
    a.kill9();
    let killed = Instant::now();
    let before = answered(&js).await.len();
    assert!(
        before < ids.len(),
        "node A answered everything before it died: nothing was left in flight"
    );
    let b = NodeProcess::start(&fleet_config("node-b", nats, None));
    b.healthy(Duration::from_secs(60)).await;
    // TTL 3 s + a sweep + the 30 s window, with room for a loaded machine;
    // with the old 30-minute window this waited half an hour.
    super::wait_for(
        "every message answered after node A died",
        Duration::from_secs(120),
        Duration::from_millis(250),
        || async {
            let got = answered(&js).await;
            ids.iter().all(|id| got.contains(id)).then_some(())
        },
    )
    .await;
    let seconds = killed.elapsed().as_secs_f64();
    drop(b);
    Stranded {
        seconds,
        left: ids.len() - before,
        total: ids.len(),
    }
}
