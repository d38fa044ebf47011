//! The model provider's stand-in: a small OpenAI-compatible
//! chat-completions endpoint (`POST {url}/chat/completions`) on a free
//! loopback port, scripted per test — the one stand-in the suites use, for
//! a paid external service (docs/agents.md § The model agent). Each test scripts
//! the replies, in order, and reads back every request as it arrived (its
//! body and its `Authorization` header). The node's real HTTP client talks
//! to it end to end. A request with nothing scripted is answered 500.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde_json::{Value, json};

#[derive(Default)]
struct Script {
    replies: VecDeque<(u16, Value)>,
    /// Each request: its `Authorization`, its body, when it arrived.
    asked: Vec<(String, Value, std::time::Instant)>,
    /// How long answering took, since it was last read.
    answering: std::time::Duration,
}

pub struct Provider {
    /// The base a role's `base_url` names (`http://127.0.0.1:{port}/v1`).
    pub url: String,
    script: Arc<Mutex<Script>>,
    /// While `false`, every answer waits (a model still thinking) until
    /// the test opens the gate.
    gate: tokio::sync::watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.server.abort();
    }
}

type Shared = (Arc<Mutex<Script>>, tokio::sync::watch::Receiver<bool>);

async fn completions(
    State((script, mut gate)): State<Shared>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    // The request is seen as it arrives; its answer waits for the gate.
    script
        .lock()
        .unwrap()
        .asked
        .push((auth, body, std::time::Instant::now()));
    let _ = gate.wait_for(|open| *open).await;
    let began = std::time::Instant::now();
    let mut s = script.lock().unwrap();
    let (status, reply) = s.replies.pop_front().unwrap_or_else(|| {
        (
            500,
            json!({"error": {"message": "no reply scripted", "type": "server_error"}}),
        )
    });
    s.answering += began.elapsed();
    (StatusCode::from_u16(status).unwrap(), Json(reply))
}

impl Provider {
    pub async fn start() -> Provider {
        let script: Arc<Mutex<Script>> = Default::default();
        let (gate, open) = tokio::sync::watch::channel(true);
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(completions))
            .with_state((script.clone(), open));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Provider {
            url: format!("http://127.0.0.1:{port}/v1"),
            script,
            gate,
            server,
        }
    }

    /// Hold every answer back until [`Provider::answer`] (the model is
    /// still thinking; the request is already seen).
    pub fn hold(&self) {
        self.gate.send_replace(false);
    }

    /// Let the answers held back go, and every later one at once.
    pub fn answer(&self) {
        self.gate.send_replace(true);
    }

    /// Answer the next requests with these, in order.
    pub fn script(&self, replies: Vec<(u16, Value)>) {
        self.script.lock().unwrap().replies.extend(replies);
    }

    /// Every request's body, in arrival order.
    pub fn requests(&self) -> Vec<Value> {
        self.script
            .lock()
            .unwrap()
            .asked
            .iter()
            .map(|(_, b, _)| b.clone())
            .collect()
    }

    /// When each request arrived, in arrival order.
    pub fn arrivals(&self) -> Vec<std::time::Instant> {
        self.script
            .lock()
            .unwrap()
            .asked
            .iter()
            .map(|(_, _, at)| *at)
            .collect()
    }

    /// How long the endpoint took to answer once let through, since this
    /// was last asked (the model's time, for a bench to subtract).
    pub fn answer_time(&self) -> std::time::Duration {
        std::mem::take(&mut self.script.lock().unwrap().answering)
    }

    /// Every request's `Authorization` header, in arrival order.
    pub fn authorizations(&self) -> Vec<String> {
        self.script
            .lock()
            .unwrap()
            .asked
            .iter()
            .map(|(a, _, _)| a.clone())
            .collect()
    }
}

/// A completion answering `text`, having spent `tokens` (prompt, completion).
pub fn text(content: &str, tokens: (u64, u64)) -> (u16, Value) {
    (
        200,
        json!({
            "id": "chatcmpl-standin",
            "object": "chat.completion",
            "created": 0,
            "model": "stand-in",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": tokens.0, "completion_tokens": tokens.1, "total_tokens": tokens.0 + tokens.1},
        }),
    )
}

/// A completion asking for these calls: (id, function name, arguments).
pub fn calls(calls: &[(&str, &str, Value)], tokens: (u64, u64)) -> (u16, Value) {
    let tool_calls: Vec<Value> = calls
        .iter()
        .map(|(id, name, args)| {
            json!({"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}})
        })
        .collect();
    (
        200,
        json!({
            "id": "chatcmpl-standin",
            "object": "chat.completion",
            "created": 0,
            "model": "stand-in",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null, "tool_calls": tool_calls}}],
            "usage": {"prompt_tokens": tokens.0, "completion_tokens": tokens.1, "total_tokens": tokens.0 + tokens.1},
        }),
    )
}

/// An error answer, as OpenAI words one.
pub fn error(status: u16, message: &str) -> (u16, Value) {
    (
        status,
        json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": null}}),
    )
}
