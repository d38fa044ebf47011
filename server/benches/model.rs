//! Model-agent benchmarks: prints a table, asserts nothing.
//! `cargo bench -p server --bench model` (docs/testing.md § Benchmarks).
//!
//! Row: the engine's overhead per round of a model seat — a turn's wall
//! time (`turn_started` to `turn_completed`, as the node's event bus
//! delivers them) minus the time the endpoint took to answer its
//! completions, divided by the turn's rounds; p50 / p99 over
//! `CREWLET_BENCH_MODEL_TURNS` turns (default 200), each two completions
//! (a `read_memory` call, then the reply) and three rounds. The endpoint is
//! the model provider's stand-in the tests use (`tests/it/support/provider.rs`,
//! answering at once), so what is left is the engine: the prompt built
//! from the seat's memory, the HTTP round trips on loopback, the tool
//! executed, the outbound effect posted, the ledger written. On one node,
//! once with the in-process twins and once on a real nats-server (the
//! coordination store, mailboxes and outbox on JetStream).

#[path = "../tests/it/support/mod.rs"]
mod support;

use support::provider;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crewlet::config::{AgentConfig, Config, ModelConfig, RoleConfig};
use crewlet::engine::envelope::Envelope;
use crewlet::events::Event;
use crewlet::node;
use serde_json::json;

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let turns: usize = std::env::var("CREWLET_BENCH_MODEL_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut twin = per_round(turns, "").await;
    let server = support::nats::NatsServer::start().await;
    let on_nats = format!(
        "[coordination]\ntype = \"embedded-kv\"\n\n[stream]\ntype = \"nats\"\nurls = [\"{}\"]\n",
        server.url()
    );
    let mut nats = per_round(turns, &on_nats).await;
    println!("| figure | measured | baseline | goal |");
    println!("|---|---|---|---|");
    for (place, v) in [("twin", &mut twin), ("one nats-server", &mut nats)] {
        let n = v.len();
        println!(
            "| model seat: the engine's time per round (turn wall time minus the endpoint's, {place}) | p50 {:.2} ms / p99 {:.2} ms ({n} turns, 3 rounds each) | — | — |",
            pct(&mut v.clone(), 0.5),
            pct(v, 0.99),
        );
    }
}

/// The engine's milliseconds per round over `turns` turns of one model
/// seat on a node whose backends `backends` (TOML) names (empty: twins).
async fn per_round(turns: usize, backends: &str) -> Vec<f64> {
    let stand_in = provider::Provider::start().await;
    let dir = tempfile::tempdir().expect("a scratch folder");
    let text = format!(
        "[node]\nid = \"bench-model\"\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n{backends}\n[company]\nname = \"Bench company\"\n",
        dir.path().join("data").display()
    );
    let config = Config::parse("bench.toml", &text, &BTreeMap::new()).expect("config");
    let running = node::start(config).await.expect("the node starts");
    let mut events = running.engine.events().subscribe();
    let role = RoleConfig {
        handle: "m0".into(),
        agent: AgentConfig::Model(ModelConfig::new(&stand_in.url, "stand-in")),
        ..Default::default()
    };
    crewlet::company::apply(&**running.engine.store(), "Bench company", &[role])
        .await
        .expect("the company applies");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !running.engine.host().held().contains(&"m0".to_string()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let queue = running.engine.queue().clone();
    let mut per_round = Vec::with_capacity(turns);
    for i in 0..turns {
        stand_in.script(vec![
            provider::calls(&[("c1", "read_memory", json!({}))], (10, 2)),
            provider::text("done", (12, 1)),
        ]);
        let env = Envelope {
            id: format!("bench-{i}"),
            kind: "task_assigned".into(),
            body: json!({"text": "what do you remember?"}),
            thread: None,
            message_id: None,
            from: Some("bench".into()),
            sent_at: None,
        };
        queue
            .publish(
                &crewlet::queue::inbox_subject("m0"),
                None,
                bytes::Bytes::from(env.encode()),
            )
            .await
            .expect("publish");
        let mut started = None;
        loop {
            let Ok(Ok(e)) = tokio::time::timeout(Duration::from_secs(30), events.recv()).await
            else {
                eprintln!("turn {i}: no turn_completed within 30 s");
                break;
            };
            match e.event {
                Event::TurnStarted { trigger_ids, .. } if trigger_ids == [env.id.clone()] => {
                    started = Some(Instant::now());
                }
                Event::TurnCompleted { rounds, .. } if started.is_some() => {
                    let wall = started.unwrap().elapsed();
                    let model = stand_in.answer_time();
                    let engine = wall.saturating_sub(model);
                    per_round.push(engine.as_secs_f64() * 1000.0 / f64::from(rounds.max(1)));
                    break;
                }
                _ => {}
            }
        }
    }
    running.shutdown().await.expect("the node stops");
    per_round
}
