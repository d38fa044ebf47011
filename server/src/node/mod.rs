//! A node: start-up, the process incarnation, and orderly shutdown.
//!
//! Start-up opens and migrates the database (a failure stops here and
//! changes nothing), mints the incarnation, makes sure somebody can sign
//! in, and serves the dashboard and the JSON endpoints until shutdown is
//! asked for. Shutdown stops accepting, cancels every task through one
//! owner ([`Tasks`]) and returns.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

pub use crate::company;

use std::time::Duration;

use crate::config::Config;
use crate::coord::Store;
use crate::db::DbError;
use crate::engine::runtime::TurnEngine;
use crate::events::EventBus;
use crate::memory::memread::{MemRead, MemReadError};
use crate::queue::Queue;
use crate::queue::jetstream::{JetStreamQueue, JetStreamSettings};
use crate::queue::twin::TwinQueue;
use crate::seat::engine::SeatEngine;
use crate::tasks::Tasks;
use crate::web::WebError;

pub use crate::identity::{Incarnation, NodeInfo};

mod start;
pub use start::start;

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(
        "cannot listen on {addr}: {source}. Is another node (or program) using that port? Change node.listen."
    )]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Web(#[from] WebError),
    #[error("the HTTP server stopped: {0}")]
    Serve(std::io::Error),
    #[error(
        "the coordination store: {0}. Check stream.urls and that nats-server runs with JetStream (-js)."
    )]
    Store(crate::coord::StoreError),
    #[error("the queue: {0}")]
    Queue(crate::queue::QueueError),
    #[error("the company: {0}")]
    Company(company::CompanyError),
    #[error("{0}")]
    AgentUser(String),
    #[error(transparent)]
    MemRead(MemReadError),
    #[error(transparent)]
    AuditRead(crate::audit::FleetAuditError),
    #[error(transparent)]
    Trends(crate::trends::TrendsError),
    #[error("cannot create the mailboxes of seat {seat}: {source}")]
    Mailbox {
        seat: String,
        #[source]
        source: crate::queue::QueueError,
    },
}

/// Where the dashboard's browser half (pkg/, favicon) is served from:
/// `CREWLET_SITE_ROOT`, else `site/` beside the executable, else
/// `target/site` under the current directory.
pub fn site_root() -> PathBuf {
    if let Ok(p) = std::env::var("CREWLET_SITE_ROOT") {
        return PathBuf::from(p);
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|p| p.to_path_buf()))
    {
        let beside = dir.join("site");
        if beside.join("pkg").is_dir() {
            return beside;
        }
    }
    PathBuf::from("target/site")
}

/// A node that has started: its address, and the handle that stops it.
pub struct RunningNode {
    pub addr: SocketAddr,
    pub info: NodeInfo,
    pub engine: Arc<SeatEngine>,
    pub turns: Arc<TurnEngine>,
    pub duties: crate::duty::Duties,
    /// Reads of a seat's memory answered by its holder; this node answers
    /// for its own seats on `crewlet.memread.{incarnation}`.
    pub memread: Arc<MemRead>,
    tasks: Tasks,
    server: tokio::task::JoinHandle<Result<(), std::io::Error>>,
    /// The node's database, closed last on a graceful stop.
    pool: sqlx::SqlitePool,
}

impl RunningNode {
    /// Graceful shutdown is a drain: presence given up, every seat released
    /// voluntarily, then every task stopped (the HTTP server with them).
    pub async fn shutdown(self) -> Result<(), NodeError> {
        self.engine.drain().await;
        // The children of detached runs go with the process; their runs
        // are failed (launcher lost) by the seat's next holder.
        self.turns.supervisor().shutdown().await;
        self.turns.approvals().shutdown().await;
        self.turns.stop_timers().await;
        self.tasks.shutdown().await;
        let served = served_within(self.server, SERVE_DRAIN).await;
        self.engine
            .events()
            .emit(crate::events::Event::NodeStopped {});
        close_database(&self.pool, SERVE_DRAIN).await;
        served
    }

    /// Stop without releasing anything, as a crash would (tests).
    pub async fn crash(self) {
        self.duties.abandon();
        self.turns.supervisor().shutdown().await;
        self.turns.approvals().shutdown().await;
        self.turns.stop_timers().await;
        self.engine.crash().await;
        self.tasks.shutdown().await;
        let _ = served_within(self.server, SERVE_DRAIN).await;
    }

    /// Resolves when shutdown has been asked for.
    pub async fn stopped(&self) {
        self.tasks.token().cancelled().await
    }

    /// Ask the node to stop (what SIGINT / SIGTERM do).
    pub fn stop(&self) {
        self.tasks.token().cancel();
    }
}

/// How long a stopping node waits, once it has stopped listening, for the
/// HTTP connections still open: a request in progress finishes within it;
/// a client that holds a connection past it — an idle keep-alive, a request
/// never finished — is cut off, so no client can hold a node's stop open.
pub const SERVE_DRAIN: Duration = Duration::from_secs(5);

/// Close the node's database once everything that wrote to it has
/// stopped: each connection ended, the write-ahead log folded into the file
/// and removed, so the next start, a backup or a person's `sqlite3` finds
/// the file whole and no connection of this process still holding it. A
/// connection still borrowed past `bound` is left to end with the process
/// (said in a line), so nothing can hold a stop open.
async fn close_database(pool: &sqlx::SqlitePool, bound: Duration) {
    if tokio::time::timeout(bound, pool.close()).await.is_err() {
        tracing::warn!(
            after_ms = bound.as_millis() as u64,
            "a database connection was still in use at stop; it ends with the process"
        );
    }
}

/// Wait for the HTTP server's graceful end (its stop was asked for with the
/// node's token) up to `bound`, then close what is still open.
async fn served_within(
    mut server: tokio::task::JoinHandle<Result<(), std::io::Error>>,
    bound: Duration,
) -> Result<(), NodeError> {
    match tokio::time::timeout(bound, &mut server).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(NodeError::Serve(e)),
        Ok(Err(e)) => Err(NodeError::Serve(std::io::Error::other(e))),
        Err(_) => {
            server.abort();
            tracing::info!(
                after_ms = bound.as_millis() as u64,
                "HTTP connections still open at stop: closed"
            );
            Ok(())
        }
    }
}

/// The coordination store and queue a config asks for; on a fleet they
/// share one NATS connection, which comes back for the event bus.
/// How long a node starting waits for its coordination store (NATS) to
/// answer before it gives up with the error.
pub const BOOT_WAIT: Duration = Duration::from_secs(60);

/// The coordination store, waited for at boot: a NATS not reachable yet
/// (a fleet and its server started together) is tried again every second,
/// with a line saying so, for up to [`BOOT_WAIT`]; then its error.
async fn open_coordination(
    config: &Config,
    tasks: &Tasks,
) -> Result<(Arc<dyn Store>, Option<async_nats::Client>), NodeError> {
    let started = std::time::Instant::now();
    let mut attempt = 1u32;
    loop {
        match crate::coord::open(config, tasks).await {
            Ok(opened) => {
                if attempt > 1 {
                    tracing::info!(
                        attempt,
                        waited_s = started.elapsed().as_secs(),
                        "the coordination store answers"
                    );
                }
                return Ok(opened);
            }
            Err(
                e @ (crate::coord::StoreError::Unavailable(_)
                | crate::coord::StoreError::Timeout(_)),
            ) if started.elapsed() < BOOT_WAIT => {
                tracing::warn!(
                    attempt,
                    urls = %config.stream.urls.join(", "),
                    error = %e,
                    "waiting for the coordination store ({} s of {} s); trying again in 1 s",
                    started.elapsed().as_secs(),
                    BOOT_WAIT.as_secs()
                );
                attempt += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(NodeError::Store(e)),
        }
    }
}

pub async fn backends(
    config: &Config,
    tasks: &Tasks,
    events: &EventBus,
) -> Result<(Arc<dyn Store>, Arc<dyn Queue>, Option<async_nats::Client>), NodeError> {
    let (store, client) = open_coordination(config, tasks).await?;
    let queue: Arc<dyn Queue> = match &client {
        None => Arc::new(TwinQueue::new(queue_sink(events))),
        Some(c) => Arc::new(jetstream_queue(config, tasks, events, &*store, c).await?),
    };
    Ok((store, queue, client))
}

/// The queue on the fleet's NATS, following the store connection's
/// reconnects so its pulls wait long (`queue::jetstream::wakes`).
async fn jetstream_queue(
    config: &Config,
    tasks: &Tasks,
    events: &EventBus,
    store: &dyn Store,
    c: &async_nats::Client,
) -> Result<JetStreamQueue, NodeError> {
    // The same replica count the coordination buckets use.
    let replicas = crate::coord::NatsOptions::from_config(
        &config.stream,
        &config.coordination,
        &config.node.id,
    )
    .replicas;
    let q = JetStreamQueue::new(
        c.clone(),
        JetStreamSettings {
            replicas,
            timeout: Duration::from_millis(config.coordination.store_timeout_ms),
        },
        queue_sink(events),
    )
    .await
    .map_err(NodeError::Queue)?;
    if let Err(e) = q.follow(tasks, store.connection_changes()).await {
        tracing::warn!(error = %e, "the broker's leader elections cannot be followed; pulls stay short");
    }
    tracing::info!(
        nats_server = %c.server_info().version,
        api_level = q.api_level(),
        pull_wait_s = q.wakes().pull_wait().as_secs(),
        stranded_look_every_s = q.wakes().stranded_every(q.api_level()).as_secs(),
        "JetStream: newer features are gated on the server's API level"
    );
    let version = &c.server_info().version;
    if replicas > 1 && crate::queue::jetstream::loses_track_across_leader_changes(version) {
        tracing::warn!(
            nats_server = %version,
            "this nats-server can lose mail when a mailbox consumer's leader changes with a delivery awaiting its acknowledgement (a node killed as it fetched, a server restarted): fixed in 2.10.26; run 2.10.26 or later for mail that is never lost (docs/nats.md § Client and server compatibility)"
        );
    }
    Ok(q)
}

/// Hand the shared info to whoever needs it.
pub type SharedInfo = Arc<NodeInfo>;

/// A queue event sink that reports through `bus` (the queue knows nothing
/// of events; the node joins the two).
fn queue_sink(bus: &EventBus) -> crate::queue::EventSink {
    let bus = bus.clone();
    std::sync::Arc::new(move |e| {
        use crate::queue::QueueEvent;
        bus.emit(match e {
            QueueEvent::DeadLettered {
                subscription,
                subject,
                seq,
                delivered,
                reason,
            } => crate::events::Event::MessageDeadLettered {
                subscription,
                subject,
                seq,
                delivered,
                reason: reason.to_string(),
            },
            QueueEvent::Deferred {
                subscription,
                seq,
                reason,
                ..
            } => crate::events::Event::DeliveryDeferred {
                subscription,
                seq,
                reason,
            },
            QueueEvent::Recovered {
                subscription,
                subject,
                seq,
            } => crate::events::Event::MessageRecovered {
                subscription,
                subject,
                seq,
            },
            QueueEvent::Republished {
                subject,
                seq,
                new_seq,
            } => crate::events::Event::MessageRepublished {
                subject,
                seq,
                new_seq,
            },
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{PlacementConfig, matches_placement};

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn incarnations_of_one_node_id_are_distinct_owners() {
        let a = Incarnation::mint("node-0");
        let b = Incarnation::mint("node-0");
        assert!(a.as_str().starts_with("node-0:"));
        assert_ne!(a, b);
    }

    #[test]
    fn placement_needs_a_listed_node_and_every_label() {
        let p = PlacementConfig {
            nodes: s(&["a"]),
            labels: s(&["gpu"]),
        };
        assert!(matches_placement("a", &s(&["gpu", "eu"]), &p));
        assert!(!matches_placement("b", &s(&["gpu"]), &p));
        assert!(!matches_placement("a", &s(&["eu"]), &p));
        assert!(matches_placement("z", &[], &PlacementConfig::default()));
    }
}
