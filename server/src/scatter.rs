//! Requests to one process incarnation and their answers — the fleet's
//! request/reply transport that memory reads and audit reads share: NATS
//! core request/reply on a fleet ([`NatsScatter`]), an in-process registry
//! on the twin ([`TwinScatter`]).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, Stream, StreamExt};
use tokio::sync::{mpsc, oneshot};

/// What asking a holder, or answering one, can run into.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScatterError {
    #[error("nothing answers on {0}")]
    NoResponders(String),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    #[error("{0}")]
    Failed(String),
}

/// Requests to one process incarnation and their answers, on a subject
/// that names it (memory reads on `crewlet.memread.{incarnation}`, audit
/// reads on `crewlet.auditread.{incarnation}`): NATS core request/reply on
/// a fleet ([`NatsScatter`]), an in-process registry on the twin
/// ([`TwinScatter`]). The same logic runs over both.
#[async_trait]
pub trait Scatter: Send + Sync {
    /// Ask whoever listens on `subject`, waiting at most `budget` for its
    /// answer.
    async fn ask(
        &self,
        subject: &str,
        request: Bytes,
        budget: Duration,
    ) -> Result<Bytes, ScatterError>;

    /// Take the requests addressed to `subject` until the returned stream
    /// is dropped. Requests asked after this returns reach it.
    async fn listen(&self, subject: &str) -> Result<Inbound, ScatterError>;
}

/// Every live peer of the fleet but `me` (an incarnation), as `(node id,
/// incarnation)`, from the presence leases.
pub async fn peers(
    store: &dyn crate::coord::Store,
    me: &str,
) -> Result<Vec<(String, String)>, crate::coord::StoreError> {
    Ok(store
        .list("node:")
        .await?
        .into_iter()
        .filter(|p| p.owner != me)
        .filter_map(|p| {
            let id = p.resource.strip_prefix("node:")?.to_string();
            Some((id, p.owner))
        })
        .collect())
}

/// Ask each of `peers` (`(node id, incarnation)`) the same `request` on
/// `subject_of(incarnation)`, all at once, each within `budget`; their
/// answers by node id, in `peers`' order.
pub async fn ask_each(
    scatter: &dyn Scatter,
    peers: Vec<(String, String)>,
    subject_of: impl Fn(&str) -> String,
    request: Bytes,
    budget: Duration,
) -> Vec<(String, Result<Bytes, ScatterError>)> {
    futures::future::join_all(peers.into_iter().map(|(node_id, owner)| {
        let subject = subject_of(&owner);
        let request = request.clone();
        async move { (node_id, scatter.ask(&subject, request, budget).await) }
    }))
    .await
}

/// Answer the requests on `subject` until `tasks` stops, at most
/// `concurrent` at once: each payload is handed to `answer` and what it
/// returns is sent back as JSON (an answer that cannot be sent is logged).
/// `task` names the responder's task. Returns once listening.
pub async fn respond<T, F, Fut>(
    scatter: &dyn Scatter,
    subject: &str,
    tasks: &crate::tasks::Tasks,
    task: &'static str,
    concurrent: usize,
    answer: F,
) -> Result<(), ScatterError>
where
    T: serde::Serialize,
    F: Fn(Bytes) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = T> + Send,
{
    let inbound = scatter.listen(subject).await?;
    tasks.spawn(task, async move {
        inbound
            .for_each_concurrent(concurrent, |mut req| {
                let reply = answer(req.payload.clone());
                async move {
                    let body = serde_json::to_vec(&reply.await).unwrap_or_default();
                    if let Err(e) = req.answer(Bytes::from(body)).await {
                        tracing::warn!(error = %e, task, "cannot send an answer");
                    }
                }
            })
            .await;
    });
    Ok(())
}

/// Pure: why a peer gave no answer, in words.
pub fn silence(e: &ScatterError) -> String {
    match e {
        ScatterError::TimedOut(b) => format!("it did not answer within {b:?}"),
        ScatterError::NoResponders(_) => "nothing answers for it (it may be stopping)".to_string(),
        e => e.to_string(),
    }
}

/// One request taken by a listener.
pub struct Incoming {
    pub payload: Bytes,
    reply: ReplyTo,
}

enum ReplyTo {
    Nats {
        client: async_nats::Client,
        subject: async_nats::Subject,
    },
    Local(Option<oneshot::Sender<Bytes>>),
}

impl Incoming {
    /// Answer the request (once; a second answer goes nowhere).
    pub async fn answer(&mut self, body: Bytes) -> Result<(), ScatterError> {
        match &mut self.reply {
            ReplyTo::Nats { client, subject } => client
                .publish(subject.clone(), body)
                .await
                .map_err(|e| ScatterError::Failed(e.to_string())),
            ReplyTo::Local(tx) => match tx.take() {
                Some(tx) => tx
                    .send(body)
                    .map_err(|_| ScatterError::Failed("the asker stopped waiting".into())),
                None => Err(ScatterError::Failed("already answered".into())),
            },
        }
    }
}

/// The requests addressed to one incarnation; dropping it stops listening.
pub struct Inbound {
    stream: BoxStream<'static, Incoming>,
    _registered: Option<Registration>,
}

impl Stream for Inbound {
    type Item = Incoming;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Incoming>> {
        self.stream.poll_next_unpin(cx)
    }
}

/// Memory reads over NATS core request/reply on
/// `crewlet.memread.{incarnation}`.
pub struct NatsScatter {
    client: async_nats::Client,
}

impl NatsScatter {
    pub fn new(client: async_nats::Client) -> NatsScatter {
        NatsScatter { client }
    }
}

#[async_trait]
impl Scatter for NatsScatter {
    async fn ask(
        &self,
        subject: &str,
        request: Bytes,
        budget: Duration,
    ) -> Result<Bytes, ScatterError> {
        use async_nats::client::RequestErrorKind;
        let subject = subject.to_string();
        let asked = self.client.send_request(
            subject.clone(),
            async_nats::Request::new()
                .payload(request)
                .timeout(Some(budget)),
        );
        // The budget bounds the whole request, sending included (a client
        // whose connection is down buffers the request).
        match tokio::time::timeout(budget, asked).await {
            Err(_) => Err(ScatterError::TimedOut(budget)),
            Ok(Ok(m)) => Ok(m.payload),
            Ok(Err(e)) => Err(match e.kind() {
                RequestErrorKind::TimedOut => ScatterError::TimedOut(budget),
                RequestErrorKind::NoResponders => ScatterError::NoResponders(subject),
                _ => ScatterError::Failed(e.to_string()),
            }),
        }
    }

    async fn listen(&self, subject: &str) -> Result<Inbound, ScatterError> {
        let sub = self
            .client
            .subscribe(subject.to_string())
            .await
            .map_err(|e| ScatterError::Failed(e.to_string()))?;
        // The server has the subscription once a flush has come back: a
        // request asked from here on reaches it.
        self.client
            .flush()
            .await
            .map_err(|e| ScatterError::Failed(e.to_string()))?;
        let client = self.client.clone();
        let stream = sub
            .filter_map(move |m| {
                let client = client.clone();
                async move {
                    m.reply.map(|subject| Incoming {
                        payload: m.payload,
                        reply: ReplyTo::Nats { client, subject },
                    })
                }
            })
            .boxed();
        Ok(Inbound {
            stream,
            _registered: None,
        })
    }
}

/// Memory reads between the turn engines of one process (the twin): a
/// registry of incarnation → listener. Build one per process and share it,
/// like the twin store and queue. It keeps every incarnation it was asked,
/// in order, for tests to count requests by.
#[derive(Clone, Default)]
pub struct TwinScatter {
    inner: Arc<Mutex<LocalInner>>,
}

#[derive(Default)]
struct LocalInner {
    next: u64,
    listeners: HashMap<String, (u64, mpsc::Sender<Incoming>)>,
    asked: Vec<String>,
}

/// A listener's place in the registry, given up when it is dropped.
struct Registration {
    registry: Arc<Mutex<LocalInner>>,
    subject: String,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut g = lock(&self.registry);
        if g.listeners
            .get(&self.subject)
            .is_some_and(|(id, _)| *id == self.id)
        {
            g.listeners.remove(&self.subject);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl TwinScatter {
    pub fn new() -> TwinScatter {
        TwinScatter::default()
    }

    /// Every subject asked so far, in order (one entry per request).
    pub fn asked(&self) -> Vec<String> {
        lock(&self.inner).asked.clone()
    }
}

#[async_trait]
impl Scatter for TwinScatter {
    async fn ask(
        &self,
        subject: &str,
        request: Bytes,
        budget: Duration,
    ) -> Result<Bytes, ScatterError> {
        let listener = {
            let mut g = lock(&self.inner);
            g.asked.push(subject.to_string());
            g.listeners.get(subject).map(|(_, tx)| tx.clone())
        };
        let Some(tx) = listener.filter(|tx| !tx.is_closed()) else {
            return Err(ScatterError::NoResponders(subject.to_string()));
        };
        let (answer_tx, answer_rx) = oneshot::channel();
        let asked = async {
            tx.send(Incoming {
                payload: request,
                reply: ReplyTo::Local(Some(answer_tx)),
            })
            .await
            .map_err(|_| ScatterError::NoResponders(subject.to_string()))?;
            // A request its listener dropped unanswered is the same silence
            // as one never answered.
            answer_rx.await.map_err(|_| ScatterError::TimedOut(budget))
        };
        match tokio::time::timeout(budget, asked).await {
            Ok(r) => r,
            Err(_) => Err(ScatterError::TimedOut(budget)),
        }
    }

    async fn listen(&self, subject: &str) -> Result<Inbound, ScatterError> {
        let (tx, rx) = mpsc::channel(64);
        let id = {
            let mut g = lock(&self.inner);
            g.next += 1;
            let id = g.next;
            g.listeners.insert(subject.to_string(), (id, tx));
            id
        };
        let stream =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) })
                .boxed();
        Ok(Inbound {
            stream,
            _registered: Some(Registration {
                registry: self.inner.clone(),
                subject: subject.to_string(),
                id,
            }),
        })
    }
}
