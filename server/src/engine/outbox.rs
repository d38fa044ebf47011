//! The outbox: where an agent's outbound effects go, one JSON [`Effect`]
//! per effect on `crewlet.outbox.{handle}`.
//!
//! On a fleet it is the JetStream stream `CREWLET_OUTBOX` (limits
//! retention, seven days), which users' systems subscribe to and the chaos
//! checker reads; on a single node with no stream it is kept in process
//! (the newest 10,000). Either way [`Outbox::read`] lists what was posted,
//! oldest first.
//!
//! Every post carries the effect's identity (a digest of the work, the seat
//! and the agent's call): both outboxes keep one effect per identity within
//! [`DEDUPE_WINDOW`], so a post tried again after its answer was lost — or
//! the same work's effect posted again by a re-run — lands once. On NATS a
//! failed post is tried again, under the same identity, for a while: a
//! stream between leaders is not an effect that failed.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::{self as js, consumer, stream};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

/// The stream outbound effects are kept on.
pub const OUTBOX_STREAM: &str = "CREWLET_OUTBOX";
/// How long an effect is kept on the stream.
pub const OUTBOX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// Effects the in-process outbox keeps.
const KEPT: usize = 10_000;
/// How long an effect's identity is remembered: a second post of it within
/// this window is dropped (the stream's duplicate window).
pub const DEDUPE_WINDOW: Duration = Duration::from_secs(120);

/// `crewlet.outbox.{handle}`
pub fn outbox_subject(handle: &str) -> String {
    format!("crewlet.outbox.{handle}")
}

/// One outbound effect, as an agent's turn reported it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Effect {
    /// The work's identity (stable across re-runs); `None` when unkeyed.
    pub work_key: Option<String>,
    /// The event ids of the triggers the turn ran.
    pub trigger_ids: Vec<String>,
    pub seat: String,
    pub node: String,
    pub incarnation: String,
    pub epoch: u64,
    pub turn_id: String,
    /// What kind of effect (`post_outbox`, `a2a_message`).
    pub kind: String,
    #[serde(default)]
    pub body: serde_json::Value,
    /// When the turn posted it (RFC 3339; absent on effects posted before
    /// it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("cannot create the outbox stream {OUTBOX_STREAM}: {0}")]
    Stream(String),
    #[error("cannot post to the outbox: {0}")]
    Post(String),
    #[error("cannot read the outbox: {0}")]
    Read(String),
}

/// Where effects are posted.
#[async_trait::async_trait]
pub trait Outbox: Send + Sync + 'static {
    /// Post `effect` under its identity `id`: a second post of the same id
    /// within [`DEDUPE_WINDOW`] is accepted and dropped.
    async fn post(&self, effect: &Effect, id: &str) -> Result<(), OutboxError>;
    /// Every effect kept (of `seat`, when given), oldest first.
    async fn read(&self, seat: Option<&str>) -> Result<Vec<Effect>, OutboxError>;
    /// The newest `limit` effects of `seat`, newest first.
    async fn recent(&self, seat: &str, limit: usize) -> Result<Vec<Effect>, OutboxError> {
        let mut all = self.read(Some(seat)).await?;
        let keep = all.len().saturating_sub(limit);
        all.drain(..keep);
        all.reverse();
        Ok(all)
    }
}

/// The in-process outbox of a single node.
#[derive(Default)]
pub struct TwinOutbox {
    kept: Mutex<VecDeque<Effect>>,
    seen: Mutex<HashMap<String, tokio::time::Instant>>,
}

impl TwinOutbox {
    pub fn new() -> TwinOutbox {
        TwinOutbox::default()
    }
}

#[async_trait::async_trait]
impl Outbox for TwinOutbox {
    async fn post(&self, effect: &Effect, id: &str) -> Result<(), OutboxError> {
        {
            let now = tokio::time::Instant::now();
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            seen.retain(|_, at| now.duration_since(*at) < DEDUPE_WINDOW);
            if seen.contains_key(id) {
                return Ok(());
            }
            seen.insert(id.to_string(), now);
        }
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() >= KEPT {
            kept.pop_front();
        }
        kept.push_back(effect.clone());
        Ok(())
    }

    async fn read(&self, seat: Option<&str>) -> Result<Vec<Effect>, OutboxError> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        Ok(kept
            .iter()
            .filter(|e| seat.is_none_or(|s| e.seat == s))
            .cloned()
            .collect())
    }
}

/// How long a failed post is tried again on NATS (a leader election takes
/// a few seconds), as a multiple of the store timeout.
const RETRY_TIMEOUTS: u32 = 10;

/// The outbox on JetStream.
pub struct NatsOutbox {
    js: js::Context,
    stream: stream::Stream,
    timeout: Duration,
}

impl NatsOutbox {
    /// Create (or find) `CREWLET_OUTBOX`.
    pub async fn new(
        client: async_nats::Client,
        replicas: usize,
        timeout: Duration,
    ) -> Result<NatsOutbox, OutboxError> {
        let mut js = js::new(client);
        js.set_timeout(timeout);
        let stream = tokio::time::timeout(
            timeout,
            crate::coord::nats::get_or_create_stream(
                &js,
                stream::Config {
                    name: OUTBOX_STREAM.into(),
                    subjects: vec!["crewlet.outbox.>".into()],
                    retention: stream::RetentionPolicy::Limits,
                    storage: stream::StorageType::File,
                    max_age: OUTBOX_AGE,
                    duplicate_window: DEDUPE_WINDOW,
                    num_replicas: replicas,
                    ..Default::default()
                },
            ),
        )
        .await
        .map_err(|_| OutboxError::Stream(format!("no answer within {timeout:?}")))?
        .map_err(|e| OutboxError::Stream(e.to_string()))?;
        Ok(NatsOutbox {
            js,
            stream,
            timeout,
        })
    }
}

#[async_trait::async_trait]
impl Outbox for NatsOutbox {
    async fn post(&self, effect: &Effect, id: &str) -> Result<(), OutboxError> {
        let body: bytes::Bytes = serde_json::to_vec(effect)
            .map_err(|e| OutboxError::Post(e.to_string()))?
            .into();
        let give_up = tokio::time::Instant::now() + self.timeout * RETRY_TIMEOUTS;
        let mut pause = Duration::from_millis(100);
        loop {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
            let posted = tokio::time::timeout(self.timeout, async {
                self.js
                    .publish_with_headers(outbox_subject(&effect.seat), headers, body.clone())
                    .await
                    .map_err(|e| e.to_string())?
                    .await
                    .map_err(|e| e.to_string())
            })
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {:?}", self.timeout)));
            match posted {
                Ok(_) => return Ok(()),
                Err(e) if tokio::time::Instant::now() + pause < give_up => {
                    tracing::debug!(seat = %effect.seat, id, error = %e, "cannot post an effect yet; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(e) => return Err(OutboxError::Post(e)),
            }
        }
    }

    async fn read(&self, seat: Option<&str>) -> Result<Vec<Effect>, OutboxError> {
        let read = |e: &dyn std::fmt::Display| OutboxError::Read(e.to_string());
        let mut info = self.stream.clone();
        let total = info.info().await.map_err(|e| read(&e))?.state.messages;
        if total == 0 {
            return Ok(Vec::new());
        }
        let filter = seat.map(outbox_subject).unwrap_or_default();
        let c = self
            .stream
            .create_consumer(consumer::pull::Config {
                filter_subject: filter,
                ack_policy: consumer::AckPolicy::None,
                deliver_policy: consumer::DeliverPolicy::All,
                inactive_threshold: Duration::from_secs(30),
                ..Default::default()
            })
            .await
            .map_err(|e| read(&e))?;
        let mut out = Vec::new();
        loop {
            let mut batch = c
                .fetch()
                .max_messages(500)
                .expires(Duration::from_millis(200))
                .messages()
                .await
                .map_err(|e| read(&e))?;
            let mut got = 0;
            while let Some(m) = batch.next().await {
                let m = m.map_err(|e| read(&e))?;
                got += 1;
                match serde_json::from_slice::<Effect>(&m.payload) {
                    Ok(e) => out.push(e),
                    Err(err) => {
                        tracing::debug!(subject = %m.subject, error = %err, "an outbox message that is not an effect")
                    }
                }
            }
            if got == 0 {
                break;
            }
        }
        Ok(out)
    }
}
