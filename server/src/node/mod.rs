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

use tokio::net::TcpListener;

use std::time::Duration;

use crate::config::{Config, PROTOCOL, protocol};
use crate::coord::Store;
use crate::db::{self, DbError};
use crate::engine::outbox::{NatsOutbox, Outbox, TwinOutbox};
use crate::engine::runtime::{TurnEngine, TurnSetup};
use crate::events::EventBus;
use crate::memory::changelog::{Changelog, NatsChangelog, TwinChangelog};
use crate::memory::memread::{MemRead, MemReadError, NatsScatter, Scatter, TwinScatter};
use crate::queue::Queue;
use crate::queue::jetstream::{JetStreamQueue, JetStreamSettings};
use crate::queue::twin::TwinQueue;
use crate::seat::engine::{EngineConfig, SeatEngine};
use crate::tasks::Tasks;
use crate::web::{self, WebError};

pub use crate::identity::{Incarnation, NodeInfo};

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
        Some(c) => Arc::new(
            JetStreamQueue::new(
                c.clone(),
                JetStreamSettings {
                    // The same replica count the coordination buckets use.
                    replicas: crate::coord::NatsOptions::from_config(
                        &config.stream,
                        &config.coordination,
                        &config.node.id,
                    )
                    .replicas,
                    timeout: Duration::from_millis(config.coordination.store_timeout_ms),
                },
                queue_sink(events),
            )
            .await
            .map_err(NodeError::Queue)
            .inspect(|q| {
                tracing::info!(
                    nats_server = %c.server_info().version,
                    api_level = q.api_level(),
                    stranded_look_every_s = crate::queue::jetstream::stranded_every(q.api_level()).as_secs(),
                    "JetStream: newer features are gated on the server's API level"
                )
            })?,
        ),
    };
    Ok((store, queue, client))
}

/// What this node lets a seat's payload do, from its own file, with
/// `node.agent_user` found on the machine (the data directory then lets
/// that user reach its seats' directories, and nothing else: 0711).
fn agent_policy(config: &Config) -> Result<crate::config::AgentPolicy, NodeError> {
    let mut policy = crate::config::AgentPolicy::of(config);
    if let Some(name) = &config.node.agent_user {
        use std::os::unix::fs::PermissionsExt;
        let user = crate::engine::children::find_user(name).map_err(NodeError::AgentUser)?;
        std::fs::set_permissions(
            &config.node.data_dir,
            std::fs::Permissions::from_mode(0o711),
        )
        .map_err(|e| {
            NodeError::AgentUser(format!(
                "node.agent_user: cannot open the data directory to the agent user's seats: {e}"
            ))
        })?;
        policy.confinement.user = Some(user);
    }
    Ok(policy)
}

/// Start a node: database, incarnation, first person, coordination and
/// queue, the company, every seat's mailbox, the seat engine, HTTP.
pub async fn start(config: Config) -> Result<RunningNode, NodeError> {
    crate::web::auth::return_password_memory();
    crate::engine::children::seal_node_process();
    let pool = db::open(&config.node.data_dir, &db::MIGRATOR).await?;
    let incarnation = Incarnation::mint(&config.node.id);
    let info = NodeInfo::from_config(&config, incarnation);
    let tasks = Tasks::new();
    let addr = config.listen_addr();
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| NodeError::Bind { addr, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| NodeError::Bind { addr, source })?;

    // The process's metrics, before anything moves them (one node a process).
    if crate::metrics::install(&info.node_id).is_some() {
        tasks.spawn("metrics-upkeep", async move {
            let mut tick = tokio::time::interval(crate::metrics::UPKEEP_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                crate::metrics::upkeep();
            }
        });
    }
    let events = EventBus::new(&info.node_id, info.incarnation.as_str());
    let (store, queue, client) = backends(&config, &tasks, &events).await?;
    if store.lease_ttl() != Duration::from_secs(config.coordination.lease_ttl_seconds) {
        tracing::info!(
            configured_seconds = config.coordination.lease_ttl_seconds,
            in_force_seconds = store.lease_ttl().as_secs(),
            "the lease TTL in force is the fleet's, adopted from the bucket a peer created"
        );
    }
    let outbox = outbox_for(&config, &client).await?;
    if let Some(c) = client.clone() {
        events
            .connect_fleet(c, &tasks)
            .await
            .map_err(|e| NodeError::Store(crate::coord::StoreError::Unavailable(e.to_string())))?;
    }
    let first = company::boot(&*store, &config)
        .await
        .map_err(NodeError::Company)?;
    let company_rx = company::follow(store.clone(), first, &tasks);
    let changelog = changelog_for(&config, &client).await?;
    let memory = crate::memory::MemoryStore::new(pool.clone())
        .with_diary_days(config.memory.diary_days)
        .with_current_vector((!config.memory.vector_model.is_empty()).then(|| {
            (
                config.memory.vector_model.clone(),
                config.memory.vector_dims,
            )
        }));
    let turns = TurnEngine::new(TurnSetup {
        node_id: info.node_id.clone(),
        incarnation: info.incarnation.to_string(),
        store: store.clone(),
        queue: queue.clone(),
        outbox,
        memory,
        changelog,
        events: events.clone(),
        company: company_rx.clone(),
        ack_wait: Duration::from_secs(config.stream.ack_wait_seconds),
        retry: crate::engine::partition::RetryPolicy {
            first: Duration::from_secs(config.stream.retry_delay_seconds),
            max: Duration::from_secs(config.stream.retry_delay_max_seconds),
        },
        policy: agent_policy(&config)?,
    });
    if let Some(path) = &turns.faults.held_teardown_file {
        tracing::warn!(
            path = %path.display(),
            "fault injection: the seats named in this file cannot be released while it exists ({})",
            crate::engine::runtime::HOLD_TEARDOWN_VAR
        );
    }
    if std::env::var("CREWLET_FAULT_STALL_BEFORE_ACK").as_deref() == Ok("1") {
        tracing::warn!(
            "fault injection: turns never ack after their effects (CREWLET_FAULT_STALL_BEFORE_ACK=1)"
        );
        turns
            .faults
            .stall_before_ack
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
    let engine = SeatEngine::new(
        EngineConfig::from_config(&config, info.incarnation.as_str()),
        store.clone(),
        queue.clone(),
        turns.clone(),
        events.clone(),
        company_rx,
        tasks.clone(),
    )
    .await
    .map_err(|(seat, e)| NodeError::Mailbox { seat, source: e })?;
    // Memory reads: this node answers for the seats it holds from before
    // it claims any, whether or not it serves HTTP.
    let scatter: Arc<dyn Scatter> = match &client {
        None => Arc::new(TwinScatter::new()),
        Some(c) => Arc::new(NatsScatter::new(c.clone())),
    };
    let memread = Arc::new(MemRead::new(
        engine.clone(),
        turns.memory().clone(),
        scatter.clone(),
        Duration::from_millis(config.memory.scatter_budget_ms),
    ));
    memread.serve(&tasks).await.map_err(NodeError::MemRead)?;
    // Audit reads: this node answers with the actions taken through it.
    let scatter_for_trends = scatter.clone();
    let audit = Arc::new(crate::audit::FleetAudit::new(
        pool.clone(),
        engine.store().clone(),
        scatter,
        engine.config().node_id.clone(),
        engine.config().owner.clone(),
        Duration::from_millis(config.memory.scatter_budget_ms),
    ));
    audit.serve(&tasks).await.map_err(NodeError::AuditRead)?;
    // The node's last hour for the charts: this node answers for its own.
    let trends = Arc::new(crate::trends::Trends::new(
        engine.config().node_id.clone(),
        engine.config().owner.clone(),
        engine.store().clone(),
        scatter_for_trends,
        Duration::from_millis(config.memory.scatter_budget_ms),
    ));
    trends.serve(&tasks).await.map_err(NodeError::Trends)?;

    let site = site_root();
    warn_if_unbuilt(&site);
    let app = web::router(web::WebSetup {
        config: &config,
        info: info.clone(),
        pool: pool.clone(),
        tasks: tasks.clone(),
        site_root: site,
        addr,
        engine: engine.clone(),
        turns: turns.clone(),
        memread: memread.clone(),
        audit,
        trends: trends.clone(),
    })
    .await?;
    let token = tasks.token();
    let server = crate::tasks::spawn_held("http server", async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(token.cancelled_owned())
        .await
    });
    engine.start();
    let duties = start_duties(
        &config, &info, &tasks, &store, &queue, &events, &engine, &turns, &pool,
    );
    start_memory_flush(&config, &tasks, &engine, &turns);
    start_trends(&config, &tasks, &engine, &events, &trends);
    if let Err(e) = engine.arm_watchdog() {
        tracing::warn!(error = %e, "cannot start the watchdog thread");
    }
    if protocol() != PROTOCOL {
        tracing::warn!(
            protocol = protocol(),
            current = PROTOCOL,
            "fault injection: this node speaks an older lease protocol (CREWLET_FAULT_PROTOCOL)"
        );
    }
    events.emit(crate::events::Event::NodeStarted {
        version: crate::VERSION.to_string(),
        protocol: protocol(),
    });
    tracing::info!(
        node = %info.node_id,
        incarnation = %info.incarnation,
        version = crate::VERSION,
        protocol = protocol(),
        %addr,
        "node started; dashboard at http://{addr}/"
    );
    Ok(RunningNode {
        addr,
        info,
        engine,
        turns,
        duties,
        memread,
        tasks,
        server,
    })
}

/// A fleet stream's replicas and the store timeout, as the config says.
fn stream_settings(config: &Config) -> (usize, Duration) {
    (
        crate::coord::NatsOptions::from_config(
            &config.stream,
            &config.coordination,
            &config.node.id,
        )
        .replicas,
        Duration::from_millis(config.coordination.store_timeout_ms),
    )
}

fn stream_error(e: impl std::fmt::Display) -> NodeError {
    NodeError::Queue(crate::queue::QueueError::Backend(e.to_string()))
}

/// The outbox this node posts effects to: the in-process twin, or the
/// fleet's stream on NATS.
async fn outbox_for(
    config: &Config,
    client: &Option<async_nats::Client>,
) -> Result<Arc<dyn Outbox>, NodeError> {
    let Some(c) = client else {
        return Ok(Arc::new(TwinOutbox::new()));
    };
    let (replicas, timeout) = stream_settings(config);
    let outbox = NatsOutbox::new(c.clone(), replicas, timeout)
        .await
        .map_err(stream_error)?;
    Ok(Arc::new(outbox))
}

/// The memory changelog: the in-process twin, or the fleet's stream.
async fn changelog_for(
    config: &Config,
    client: &Option<async_nats::Client>,
) -> Result<Arc<dyn Changelog>, NodeError> {
    let Some(c) = client else {
        return Ok(Arc::new(TwinChangelog::new()));
    };
    let (replicas, timeout) = stream_settings(config);
    let changelog = NatsChangelog::new(c.clone(), replicas, timeout)
        .await
        .map_err(stream_error)?;
    Ok(Arc::new(changelog))
}

/// Say so when the dashboard's browser half is not built under `site`.
fn warn_if_unbuilt(site: &std::path::Path) {
    if !site
        .join("pkg")
        .join(format!("{}.js", web::OUTPUT_NAME))
        .is_file()
    {
        tracing::warn!(
            site_root = %site.display(),
            "the dashboard's browser half is not built there: pages render but do not hydrate (run ./dev build, or set CREWLET_SITE_ROOT)"
        );
    }
}

/// Start the node's singleton duties: maintenance (with the mailbox
/// sweep) and the scheduler, each under its own duty lease.
#[allow(clippy::too_many_arguments)]
fn start_duties(
    config: &Config,
    info: &NodeInfo,
    tasks: &Tasks,
    store: &Arc<dyn Store>,
    queue: &Arc<dyn Queue>,
    events: &EventBus,
    engine: &Arc<SeatEngine>,
    turns: &Arc<TurnEngine>,
    pool: &sqlx::SqlitePool,
) -> crate::duty::Duties {
    let duties = crate::duty::Duties::new();
    let ctx = crate::duty::DutyContext {
        store: store.clone(),
        node_id: info.node_id.clone(),
        owner: info.incarnation.to_string(),
        protocol: protocol(),
        events: events.clone(),
        watchdog: Some(engine.watchdog().clone()),
    };
    duties.start(
        tasks,
        ctx.clone(),
        Arc::new(crate::duty::maintenance::Maintenance {
            every: Duration::from_secs(config.maintenance.every_seconds),
            memory: turns.memory().clone(),
            pool: pool.clone(),
            diary_cap: config.memory.diary_cap,
            audit_days: config.maintenance.audit_days,
            marker_age: crate::duty::maintenance::MARKER_AGE,
            sweep: crate::duty::mailboxes::MailboxSweep {
                store: store.clone(),
                queue: queue.clone(),
                events: events.clone(),
                company: engine.company_watch(),
                node_id: info.node_id.clone(),
                protocol: protocol(),
                grace: Duration::from_secs(config.maintenance.retirement_grace_seconds),
                queue_settings: engine.config().queue,
            },
        }),
    );
    duties.start(
        tasks,
        ctx,
        Arc::new(crate::duty::scheduler::Scheduler::new(
            Duration::from_secs(config.scheduler.tick_seconds),
            store.clone(),
            queue.clone(),
            events.clone(),
            engine.company_watch(),
        )),
    );
    duties
}

/// The memory changelog's cycle: each held seat's new rows, every
/// `memory.flush_seconds`.
fn start_memory_flush(
    config: &Config,
    tasks: &Tasks,
    engine: &Arc<SeatEngine>,
    turns: &Arc<TurnEngine>,
) {
    // The memory changelog's cycle: each held seat's new rows.
    let (engine, turns) = (engine.clone(), turns.clone());
    let every = Duration::from_secs(config.memory.flush_seconds);
    tasks.spawn("memory-flush", async move {
        use crate::memory::changelog::next_flush_in;
        let (mut wait, mut retry) = (every, None);
        loop {
            tokio::time::sleep(wait).await;
            let held = engine.host().held();
            let r = turns.flush_memory_report(&held).await;
            if r.rows > 0 {
                tracing::debug!(rows = r.rows, seats = held.len(), "memory changelog cycle");
            }
            wait = next_flush_in(every, r.failed > 0, retry);
            retry = (r.failed > 0).then_some(wait);
        }
    });
}

/// The node's own last hour: on the sweep's cadence, the inbox depth of
/// every seat held here (the `crewlet_inbox_depth_messages` gauges, and a
/// sample for the charts with the seats held and the store calls' latency);
/// and each turn this node finishes.
fn start_trends(
    config: &Config,
    tasks: &Tasks,
    engine: &Arc<SeatEngine>,
    events: &EventBus,
    trends: &Arc<crate::trends::Trends>,
) {
    use crate::trends::{inbox_updates, seat_series};
    use futures::StreamExt;
    let (engine, sampled) = (engine.clone(), trends.clone());
    let every = Duration::from_secs(config.coordination.sweep_seconds.max(1));
    let limit = config.metrics.seat_series_limit;
    tasks.spawn("trends-sampler", async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last: Vec<String> = Vec::new();
        loop {
            tick.tick().await;
            let held = engine.host().held();
            let queue = engine.queue().clone();
            let depths: Vec<(String, u64)> = futures::stream::iter(held.clone())
                .map(|h| {
                    let queue = queue.clone();
                    async move {
                        let d = queue.pending(&crate::queue::inbox_group(&h)).await.ok();
                        d.map(|d| (h, d))
                    }
                })
                .buffer_unordered(8)
                .filter_map(std::future::ready)
                .collect()
                .await;
            let per_seat = seat_series(engine.company_watch().borrow().roles.len(), limit);
            let gone: Vec<String> = last.iter().filter(|h| !held.contains(h)).cloned().collect();
            for u in inbox_updates(&depths, per_seat, &gone) {
                crate::metrics::apply(&u);
            }
            sampled.sample(
                held.len() as u64,
                &crate::metrics::take_store_latencies(),
                &depths,
            );
            last = held;
        }
    });
    let mut rx = events.subscribe();
    let (me, counted) = (events.incarnation().to_string(), trends.clone());
    tasks.spawn("trends-turns", async move {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            match rx.recv().await {
                Ok(e) if e.incarnation == me && e.event.name() == "turn_completed" => {
                    counted.turn_finished()
                }
                Ok(_) => {}
                Err(RecvError::Lagged(n)) => {
                    tracing::debug!(
                        missed = n,
                        "the turn counter of the node's trend fell behind"
                    )
                }
                Err(RecvError::Closed) => return,
            }
        }
    });
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
