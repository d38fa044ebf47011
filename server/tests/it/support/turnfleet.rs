//! A fleet of whole turn engines in one process — each node its own
//! seat engine, turn engine and SQLite store — over the in-process twins
//! or a real nats-server. Shared by the turn and memory suites.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use crewlet::config::{AgentConfig, AgentPolicy, EchoConfig, PlacementConfig, RoleConfig};
use crewlet::coord::{
    Coordinator, CoordinatorOptions, NatsBackend, NatsOptions, Store, TwinBackend,
};
use crewlet::engine::envelope::Envelope;
use crewlet::engine::outbox::{Effect, NatsOutbox, Outbox, TwinOutbox};
use crewlet::engine::partition::RetryPolicy;
use crewlet::engine::runtime::{TurnEngine, TurnSetup};
use crewlet::events::{Event, EventBus, FleetEvent};
use crewlet::memory::MemoryStore;
use crewlet::memory::changelog::{Changelog, NatsChangelog, TwinChangelog};
use crewlet::memory::memread::{MemRead, NatsScatter, Scatter, TwinScatter};
use crewlet::node::company;
use crewlet::queue::jetstream::{JetStreamQueue, JetStreamSettings};
use crewlet::queue::twin::TwinQueue;
use crewlet::queue::{Queue, QueueSettings, inbox_group, inbox_subject, log_events};
use crewlet::seat::engine::{EngineConfig, SeatEngine};
use crewlet::seat::host::SeatHooks;
use crewlet::tasks::Tasks;
use tokio::sync::broadcast;

pub const TTL: Duration = Duration::from_secs(3);
pub const BEAT: Duration = Duration::from_secs(1);
pub const SWEEP: Duration = Duration::from_secs(1);
pub const COMPANY: &str = "Turn company";
/// How long a node's memory read waits for a seat's holder.
pub const SCATTER_BUDGET: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Twin,
    Nats,
}

/// The store, queue and outbox one fleet shares.
pub type Backends = (
    Arc<dyn Store>,
    Arc<dyn Queue>,
    Arc<dyn Outbox>,
    Arc<dyn Changelog>,
);

pub struct Fleet {
    pub kind: Kind,
    pub twin: Option<Backends>,
    /// The twin's memory-read registry, shared by the fleet's nodes.
    pub scatter: Option<TwinScatter>,
    pub server: Option<super::nats::NatsServer>,
    /// How long a failed turn's mail waits (the product's default unless
    /// a test sets its own before starting nodes).
    pub retry: RetryPolicy,
}

/// The node's default `stream.retry_delay_seconds` / `_max_seconds`.
pub fn default_retry() -> RetryPolicy {
    let s = crewlet::config::StreamSection::default();
    RetryPolicy {
        first: Duration::from_secs(s.retry_delay_seconds),
        max: Duration::from_secs(s.retry_delay_max_seconds),
    }
}

pub struct Node {
    pub engine: Arc<SeatEngine>,
    pub turns: Arc<TurnEngine>,
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn Queue>,
    pub outbox: Arc<dyn Outbox>,
    pub changelog: Arc<dyn Changelog>,
    /// Memory reads from this node; it answers for its seats on its own
    /// subject until its tasks stop (a crash included).
    pub memread: Arc<MemRead>,
    pub scatter: Arc<dyn Scatter>,
    /// The node's NATS connection (none on the twin).
    pub client: Option<async_nats::Client>,
    pub events: broadcast::Receiver<FleetEvent>,
    pub seen: Vec<FleetEvent>,
    pub dir: tempfile::TempDir,
}

/// The programs a test rig's detached runs may start (`[runs] allow`).
pub const RUNS_ALLOWED: &[&str] = &["/bin/sh", "/bin/sleep", "/bin/true", "/bin/echo"];

pub fn echo_role(handle: &str) -> RoleConfig {
    RoleConfig {
        handle: handle.into(),
        agent: AgentConfig::Echo(EchoConfig {
            drills: true,
            ..EchoConfig::default()
        }),
        placement: PlacementConfig::default(),
        mcp: Vec::new(),
        ..Default::default()
    }
}

pub fn pinned(handle: &str, node: &str) -> RoleConfig {
    RoleConfig {
        placement: PlacementConfig {
            nodes: vec![node.into()],
            labels: vec![],
        },
        ..echo_role(handle)
    }
}

pub fn trigger(id: &str, body: serde_json::Value) -> Envelope {
    Envelope {
        id: id.into(),
        kind: "task_assigned".into(),
        body,
        thread: None,
        message_id: None,
        from: Some("tests".into()),
        sent_at: None,
    }
}

impl Fleet {
    pub async fn new(kind: Kind) -> Fleet {
        match kind {
            Kind::Twin => Fleet {
                kind,
                twin: Some((
                    Arc::new(Coordinator::new(
                        TwinBackend::new(TTL),
                        CoordinatorOptions::default(),
                    )),
                    Arc::new(TwinQueue::new(log_events())),
                    Arc::new(TwinOutbox::new()),
                    Arc::new(TwinChangelog::new()),
                )),
                scatter: Some(TwinScatter::new()),
                server: None,
                retry: default_retry(),
            },
            Kind::Nats => Fleet {
                kind,
                twin: None,
                scatter: None,
                server: Some(super::nats::NatsServer::start().await),
                retry: default_retry(),
            },
        }
    }

    pub async fn backends(&self, id: &str) -> Backends {
        self.connect(id).await.0
    }

    /// The fleet's backends for node `id`, and its NATS connection.
    pub async fn connect(&self, id: &str) -> (Backends, Option<async_nats::Client>) {
        if let Some((s, q, o, c)) = &self.twin {
            return ((s.clone(), q.clone(), o.clone(), c.clone()), None);
        }
        let server = self.server.as_ref().unwrap();
        let mut opts = NatsOptions::new(vec![server.url()]);
        opts.lease_ttl = TTL;
        opts.name = format!("crewlet-{id}");
        let backend = NatsBackend::connect(&opts).await.unwrap();
        let client = backend.client().clone();
        let store: Arc<dyn Store> =
            Arc::new(Coordinator::new(backend, CoordinatorOptions::default()));
        let queue: Arc<dyn Queue> = Arc::new(
            JetStreamQueue::new(client.clone(), JetStreamSettings::default(), log_events())
                .await
                .unwrap(),
        );
        let outbox: Arc<dyn Outbox> = Arc::new(
            NatsOutbox::new(client.clone(), 1, Duration::from_secs(2))
                .await
                .unwrap(),
        );
        let changelog: Arc<dyn Changelog> = Arc::new(
            NatsChangelog::new(client.clone(), 1, Duration::from_secs(2))
                .await
                .unwrap(),
        );
        ((store, queue, outbox, changelog), Some(client))
    }

    /// Start node `id`; the first node writes `roles` as the company.
    pub async fn node(&self, id: &str, roles: &[RoleConfig]) -> Node {
        self.node_with_hooks(id, roles, |turns| turns).await
    }

    /// Start node `id` with its seat hooks wrapped by `hooks` (a test
    /// holding a step of the acquire hook).
    pub async fn node_with_hooks(
        &self,
        id: &str,
        roles: &[RoleConfig],
        hooks: impl FnOnce(Arc<TurnEngine>) -> Arc<dyn SeatHooks>,
    ) -> Node {
        self.node_over_store(id, roles, |store| store, hooks).await
    }

    /// Start node `id` over the fleet's store as `wrap` returns it (a test
    /// store that fails or records chosen calls), its seat hooks wrapped
    /// by `hooks`.
    pub async fn node_over_store(
        &self,
        id: &str,
        roles: &[RoleConfig],
        wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
        hooks: impl FnOnce(Arc<TurnEngine>) -> Arc<dyn SeatHooks>,
    ) -> Node {
        // A test rig: drills on, and the programs the run tests start.
        let policy = AgentPolicy::test_rig(RUNS_ALLOWED);
        self.node_full(id, roles, wrap, hooks, policy).await
    }

    /// Start node `id` whose own file sets `policy` (what it lets a seat's
    /// payload do).
    pub async fn node_with_policy(
        &self,
        id: &str,
        roles: &[RoleConfig],
        policy: AgentPolicy,
    ) -> Node {
        self.node_full(id, roles, |s| s, |t| t, policy).await
    }

    async fn node_full(
        &self,
        id: &str,
        roles: &[RoleConfig],
        wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
        hooks: impl FnOnce(Arc<TurnEngine>) -> Arc<dyn SeatHooks>,
        policy: AgentPolicy,
    ) -> Node {
        let ((real, queue, outbox, changelog), client) = self.connect(id).await;
        let store = wrap(real);
        let owner = crewlet::node::Incarnation::mint(id).to_string();
        let events = EventBus::new(id, &owner);
        let rx = events.subscribe();
        let tasks = Tasks::new();
        let first = match company::active(&*store).await.unwrap() {
            Some(c) => c,
            None => {
                company::apply(&*store, COMPANY, roles).await.unwrap();
                company::active(&*store).await.unwrap().unwrap()
            }
        };
        let company_rx = company::follow(store.clone(), first, &tasks);
        let dir = tempfile::tempdir().unwrap();
        let pool = crewlet::db::open(dir.path(), &crewlet::db::MIGRATOR)
            .await
            .unwrap();
        let turns = TurnEngine::new(TurnSetup {
            node_id: id.into(),
            incarnation: owner.clone(),
            store: store.clone(),
            queue: queue.clone(),
            outbox: outbox.clone(),
            memory: MemoryStore::new(pool),
            changelog: changelog.clone(),
            events: events.clone(),
            company: company_rx.clone(),
            ack_wait: QueueSettings::default().ack_wait,
            retry: self.retry,
            policy,
        });
        let cfg = EngineConfig {
            node_id: id.into(),
            owner,
            labels: vec![],
            protocol: 4,
            heartbeat: BEAT,
            sweep: SWEEP,
            claim_limit: 4,
            release_limit: 2,
            release_wait: BEAT,
            queue: QueueSettings::default(),
            handoff: Default::default(),
        };
        let engine = SeatEngine::new(
            cfg,
            store.clone(),
            queue.clone(),
            hooks(turns.clone()),
            events,
            company_rx,
            tasks.clone(),
        )
        .await
        .unwrap();
        let scatter: Arc<dyn Scatter> = match (&self.scatter, &client) {
            (Some(local), _) => Arc::new(local.clone()),
            (None, Some(c)) => Arc::new(NatsScatter::new(c.clone())),
            (None, None) => unreachable!("a fleet is on the twin or on NATS"),
        };
        let memread = Arc::new(MemRead::new(
            engine.clone(),
            turns.memory().clone(),
            scatter.clone(),
            SCATTER_BUDGET,
        ));
        memread.serve(&tasks).await.unwrap();
        engine.start();
        Node {
            engine,
            turns,
            store,
            queue,
            outbox,
            changelog,
            memread,
            scatter,
            client,
            events: rx,
            seen: Vec::new(),
            dir,
        }
    }

    /// Wait (on the fleet's clock) until `cond` holds, for at most `within`.
    pub async fn until(&self, what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + within;
        while !cond() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out after {within:?} waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(if self.kind == Kind::Twin {
                100
            } else {
                20
            }))
            .await;
        }
    }

    /// The same, for a condition that needs I/O.
    pub async fn until_async<F, Fut>(&self, what: &str, within: Duration, mut cond: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + within;
        while !cond().await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out after {within:?} waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(if self.kind == Kind::Twin {
                100
            } else {
                20
            }))
            .await;
        }
    }
}

impl Node {
    pub fn id(&self) -> &str {
        &self.engine.config().node_id
    }

    /// The process incarnation: the owner of its leases.
    pub fn incarnation(&self) -> &str {
        &self.engine.config().owner
    }

    /// The seat is established here: its acquire hook (memory hydration
    /// included) has returned.
    pub fn attached(&self, handle: &str) -> bool {
        self.engine
            .host()
            .status()
            .iter()
            .any(|s| s.handle == handle && s.phase == crewlet::seat::host::Phase::Attached)
    }

    pub fn holds(&self, handle: &str) -> bool {
        self.engine.host().held().iter().any(|h| h == handle)
    }

    pub fn events(&mut self) -> &[FleetEvent] {
        while let Ok(e) = self.events.try_recv() {
            self.seen.push(e);
        }
        &self.seen
    }

    /// Every event of this node matching `f`.
    pub fn matching<T>(&mut self, f: impl Fn(&Event) -> Option<T>) -> Vec<T> {
        self.events().iter().filter_map(|e| f(&e.event)).collect()
    }

    /// (outcome, disposition, recorded, delivered, rounds) of every turn
    /// that ran trigger `id`.
    pub fn turns_of(&mut self, id: &str) -> Vec<(String, String, bool, u64, u32)> {
        let started: Vec<String> = self.matching(|e| match e {
            Event::TurnStarted {
                turn_id,
                trigger_ids,
                ..
            } if trigger_ids.iter().any(|t| t == id) => Some(turn_id.clone()),
            _ => None,
        });
        self.matching(|e| match e {
            Event::TurnCompleted {
                turn_id,
                outcome,
                disposition,
                recorded,
                delivered,
                rounds,
                ..
            } if started.contains(turn_id) => Some((
                outcome.clone(),
                disposition.clone(),
                *recorded,
                *delivered,
                *rounds,
            )),
            _ => None,
        })
    }

    pub fn started_with(&mut self, id: &str) -> Vec<(Vec<String>, u64)> {
        self.matching(|e| match e {
            Event::TurnStarted {
                trigger_ids,
                delivered,
                ..
            } if trigger_ids.iter().any(|t| t == id) => Some((trigger_ids.clone(), *delivered)),
            _ => None,
        })
    }

    pub fn skipped(&mut self, id: &str) -> Vec<String> {
        self.matching(|e| match e {
            Event::TurnTriggerSkipped {
                trigger_id, reason, ..
            } if trigger_id == id => Some(reason.clone()),
            _ => None,
        })
    }

    pub async fn publish(&self, handle: &str, e: &Envelope) {
        self.queue
            .publish(&inbox_subject(handle), None, Bytes::from(e.encode()))
            .await
            .unwrap();
    }

    pub async fn effects_of(&self, id: &str) -> Vec<Effect> {
        self.outbox
            .read(None)
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == "post_outbox" && e.trigger_ids.iter().any(|t| t == id))
            .collect()
    }

    pub async fn pending(&self, handle: &str) -> u64 {
        self.queue.pending(&inbox_group(handle)).await.unwrap()
    }
}
