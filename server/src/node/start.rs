//! Start-up: the order a node comes up in ([`start`]) — database,
//! incarnation, coordination and queue, the company, the turn layer, the
//! seat engine, the fleet's reads, HTTP, the duties and background cycles
//! — and the pieces each step makes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use super::{Incarnation, NodeError, NodeInfo, RunningNode, backends, company, site_root};
use crate::config::{Config, PROTOCOL, protocol};
use crate::coord::Store;
use crate::db;
use crate::engine::outbox::{NatsOutbox, Outbox, TwinOutbox};
use crate::engine::runtime::{TurnEngine, TurnSetup};
use crate::events::EventBus;
use crate::memory::changelog::{Changelog, NatsChangelog, TwinChangelog};
use crate::memory::memread::{MemRead, NatsScatter, Scatter, TwinScatter};
use crate::queue::Queue;
use crate::seat::engine::{EngineConfig, SeatEngine};
use crate::tasks::Tasks;
use crate::web;

/// What this node lets a seat's payload do, from its own file, with
/// `node.agent_user` found on the machine (the data directory then lets
/// that user reach its seats' directories, and nothing else: 0711).
fn agent_policy(config: &Config) -> Result<crate::config::AgentPolicy, NodeError> {
    let mut policy = crate::config::AgentPolicy::of(config);
    if let Some(name) = &config.node.agent_user {
        use std::os::unix::fs::PermissionsExt;
        let user = crate::engine::children::find_user(name)
            .map_err(|e| NodeError::AgentUser(e.to_string()))?;
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
    prepare_process();
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
    start_metrics(&info, &tasks);
    let events = EventBus::new(&info.node_id, info.incarnation.as_str());
    let (store, queue, client) = coordination(&config, &tasks, &events).await?;
    let first = company::boot(&*store, &config)
        .await
        .map_err(NodeError::Company)?;
    let company_rx = company::follow(store.clone(), first, &tasks);
    let turns = turn_engine(
        &config,
        &info,
        &store,
        &queue,
        &client,
        &events,
        &pool,
        &company_rx,
    )
    .await?;
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
    let reads = serve_reads(&config, &engine, &turns, &client, &pool, &tasks).await?;
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
        memread: reads.memread.clone(),
        audit: reads.audit,
        trends: reads.trends.clone(),
    })
    .await?;
    let token = tasks.token();
    let server = crate::tasks::spawn_held("http server", async move {
        let app = app.into_make_service_with_connect_info::<SocketAddr>();
        axum::serve(listener, app)
            .with_graceful_shutdown(token.cancelled_owned())
            .await
    });
    engine.start();
    let duties = start_duties(
        &config, &info, &tasks, &store, &queue, &events, &engine, &turns, &pool,
    );
    start_memory_flush(&config, &tasks, &engine, &turns);
    start_trends(&config, &tasks, &engine, &events, &reads.trends);
    if let Err(e) = engine.arm_watchdog() {
        tracing::warn!(error = %e, "cannot start the watchdog thread");
    }
    announce(&info, &events, addr);
    Ok(RunningNode {
        addr,
        info,
        engine,
        turns,
        duties,
        memread: reads.memread,
        tasks,
        server,
        pool,
    })
}

/// What the node's process is made once, before anything starts: its
/// memory for passwords given back when freed, and its process sealed from
/// its children.
fn prepare_process() {
    crate::web::auth::return_password_memory();
    crate::engine::children::seal_node_process();
}

/// The coordination store, the queue and the NATS client (none on the
/// twin), with the event bus joined to the fleet's.
async fn coordination(
    config: &Config,
    tasks: &Tasks,
    events: &EventBus,
) -> Result<(Arc<dyn Store>, Arc<dyn Queue>, Option<async_nats::Client>), NodeError> {
    let (store, queue, client) = backends(config, tasks, events).await?;
    if store.lease_ttl() != Duration::from_secs(config.coordination.lease_ttl_seconds) {
        tracing::info!(
            configured_seconds = config.coordination.lease_ttl_seconds,
            in_force_seconds = store.lease_ttl().as_secs(),
            "the lease TTL in force is the fleet's, adopted from the bucket a peer created"
        );
    }
    if let Some(c) = client.clone() {
        events
            .connect_fleet(c, tasks)
            .await
            .map_err(|e| NodeError::Store(crate::coord::StoreError::Unavailable(e.to_string())))?;
    }
    Ok((store, queue, client))
}

/// The process's metrics, before anything moves them (one node a
/// process), and their upkeep.
fn start_metrics(info: &NodeInfo, tasks: &Tasks) {
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
}

/// The turn layer: the outbox, the seats' memory and its changelog, this
/// node's policy, and the fault injections a test environment asks for.
#[allow(clippy::too_many_arguments)]
async fn turn_engine(
    config: &Config,
    info: &NodeInfo,
    store: &Arc<dyn Store>,
    queue: &Arc<dyn Queue>,
    client: &Option<async_nats::Client>,
    events: &EventBus,
    pool: &sqlx::SqlitePool,
    company: &tokio::sync::watch::Receiver<company::Company>,
) -> Result<Arc<TurnEngine>, NodeError> {
    let outbox = outbox_for(config, client).await?;
    let changelog = changelog_for(config, client).await?;
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
        company: company.clone(),
        ack_wait: Duration::from_secs(config.stream.ack_wait_seconds),
        retry: crate::engine::partition::RetryPolicy {
            first: Duration::from_secs(config.stream.retry_delay_seconds),
            max: Duration::from_secs(config.stream.retry_delay_max_seconds),
        },
        policy: agent_policy(config)?,
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
    Ok(turns)
}

/// What this node answers peers with, whether or not it serves HTTP.
struct Reads {
    memread: Arc<MemRead>,
    audit: Arc<crate::audit::FleetAudit>,
    trends: Arc<crate::trends::Trends>,
}

/// Serve the fleet's reads: memory for the seats this node holds (from
/// before it claims any), the actions taken through it, its last hour for
/// the charts.
async fn serve_reads(
    config: &Config,
    engine: &Arc<SeatEngine>,
    turns: &Arc<TurnEngine>,
    client: &Option<async_nats::Client>,
    pool: &sqlx::SqlitePool,
    tasks: &Tasks,
) -> Result<Reads, NodeError> {
    let scatter: Arc<dyn Scatter> = match client {
        None => Arc::new(TwinScatter::new()),
        Some(c) => Arc::new(NatsScatter::new(c.clone())),
    };
    let budget = Duration::from_millis(config.memory.scatter_budget_ms);
    let memread = Arc::new(MemRead::new(
        engine.clone(),
        turns.memory().clone(),
        scatter.clone(),
        budget,
    ));
    memread.serve(tasks).await.map_err(NodeError::MemRead)?;
    let audit = Arc::new(crate::audit::FleetAudit::new(
        pool.clone(),
        engine.store().clone(),
        scatter.clone(),
        engine.config().node_id.clone(),
        engine.config().owner.clone(),
        budget,
    ));
    audit.serve(tasks).await.map_err(NodeError::AuditRead)?;
    let trends = Arc::new(crate::trends::Trends::new(
        engine.config().node_id.clone(),
        engine.config().owner.clone(),
        engine.store().clone(),
        scatter,
        budget,
    ));
    trends.serve(tasks).await.map_err(NodeError::Trends)?;
    Ok(Reads {
        memread,
        audit,
        trends,
    })
}

/// Say the node started: on the bus and in the log (and warn of an older
/// protocol injected for a test).
fn announce(info: &NodeInfo, events: &EventBus, addr: SocketAddr) {
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
            let began = tokio::time::Instant::now();
            let held = engine.host().held();
            let r = turns.flush_memory_report(&held).await;
            if r.rows > 0 {
                tracing::debug!(rows = r.rows, seats = held.len(), "memory changelog cycle");
            }
            wait = next_flush_in(every, r.failed > 0, retry, began.elapsed());
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
    use crate::trends::{inbox_depths, inbox_updates, seat_series};
    let (engine, sampled) = (engine.clone(), trends.clone());
    let every = Duration::from_secs(config.coordination.sweep_seconds.max(1));
    let limit = config.metrics.seat_series_limit;
    tasks.spawn("trends-sampler", async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last: Vec<String> = Vec::new();
        loop {
            tick.tick().await;
            let known = engine.host().inbox_depths();
            let held: Vec<String> = known.iter().map(|(h, _)| h.clone()).collect();
            let queue = engine.queue().clone();
            let depths = inbox_depths(known, |h| {
                let queue = queue.clone();
                async move { queue.pending(&crate::queue::inbox_group(&h)).await.ok() }
            })
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
