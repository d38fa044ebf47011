//! The model agent against a real language model: SmolLM2-135M-Instruct
//! served by llama.cpp (PyPI's `xllamacpp`, `scripts/model-server.py`),
//! both installed by `./dev test` (`CREWLET_MODEL_PYTHONPATH`,
//! `CREWLET_MODEL_GGUF`). At temperature 0 with a pinned prompt it asserts
//! the protocol — a tool call decoded and executed by the engine, its result
//! sent back, the loop ending with the reply posted — never the model's
//! wisdom. A run without the model fails, naming `./dev test`.

use crate::support;

use std::path::Path;
use std::time::Duration;

use crewlet::config::{AgentConfig, ModelConfig, RoleConfig};
use crewlet::events::Event;
use serde_json::json;
use support::turnfleet::*;

both!(a_real_model_calls_a_tool_the_engine_executes_and_its_loop_ends_with_a_reply,);

const WAIT: Duration = Duration::from_secs(90);

/// The model served on a free port, a child of the test (killed when
/// dropped), once it answers.
async fn model_server() -> (tokio::process::Child, String) {
    let path = std::env::var("CREWLET_MODEL_PYTHONPATH").expect(
        "CREWLET_MODEL_PYTHONPATH is not set: run the tests with ./dev test, which installs the model",
    );
    let gguf = std::env::var("CREWLET_MODEL_GGUF")
        .expect("CREWLET_MODEL_GGUF is not set: run the tests with ./dev test");
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts");
    let port = support::free_port();
    let child = tokio::process::Command::new("python3")
        .arg(scripts.join("model-server.py"))
        .arg(&gguf)
        .arg(port.to_string())
        .arg(scripts.join("tool-calls.jinja"))
        .env("PYTHONPATH", path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    support::wait_for(
        "the model server to answer",
        WAIT,
        Duration::from_millis(200),
        || async {
            let r = reqwest::get(format!("{url}/health")).await.ok()?;
            r.status().is_success().then_some(())
        },
    )
    .await;
    (child, format!("{url}/v1"))
}

async fn a_real_model_calls_a_tool_the_engine_executes_and_its_loop_ends_with_a_reply(f: Fleet) {
    let (_server, base) = model_server().await;
    let role = RoleConfig {
        agent: AgentConfig::Model(ModelConfig {
            instructions:
                "You keep a diary. When asked to note something, call diary_write with the text."
                    .into(),
            max_output_tokens: 128,
            max_rounds: 4,
            ..ModelConfig::new(&base, "smollm2")
        }),
        ..echo_role("s0")
    };
    let mut a = f.node("a", &[role]).await;
    f.until("a has s0 established", WAIT, || a.attached("s0"))
        .await;
    a.publish(
        "s0",
        &trigger(
            "D1",
            json!({"text": "Note in your diary: the printer is fixed."}),
        ),
    )
    .await;
    f.until("D1's turn ended", WAIT, || !a.turns_of("D1").is_empty())
        .await;
    let (outcome, _, _, _, rounds) = a.turns_of("D1")[0].clone();
    let done: Vec<(Option<String>, u32, Option<u64>)> = a.matching(|e| match e {
        Event::TurnCompleted {
            error,
            calls,
            tokens,
            ..
        } => Some((error.clone(), *calls, *tokens)),
        _ => None,
    });
    assert_eq!(
        outcome, "completed",
        "the loop ended with a reply: {done:?}"
    );
    let (_, calls, tokens) = done[0].clone();
    assert!(
        rounds >= 3 && calls >= 3,
        "the model's call executed, then the reply and its episode: {rounds} rounds, {calls} calls"
    );
    assert_eq!(a.effects_of("D1").await.len(), 1, "the reply was posted");
    assert!(tokens.unwrap_or(0) > 0, "what the model spent: {tokens:?}");
}
