//! Several nodes' seat engines in one process, on the in-process twin
//! (tokio's paused clock) and on a real nats-server: placement, handoff,
//! drain, the protocol gate, undead seats, admission and the acquire hook's
//! order — the spec's § Placement and § Establishing a seat, as behaviour.

use crate::support;
use crate::support::duty_faults;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crewlet::config::{PlacementConfig, RoleConfig};
use crewlet::coord::{
    Claim, ClaimRequest, Coordinator, CoordinatorOptions, Lease, NatsBackend, NatsOptions, Renewal,
    Store, StoreError, TwinBackend,
};
use crewlet::events::{DetachReason, Event, EventBus, FleetEvent};
use crewlet::node::company;
use crewlet::queue::jetstream::{JetStreamQueue, JetStreamSettings};
use crewlet::queue::twin::TwinQueue;
use crewlet::queue::{
    Attachment, Delivery, Disposition, Handler, Queue, QueueSettings, handler_fn, log_events,
};
use crewlet::seat::engine::{EngineConfig, SeatEngine};
use crewlet::seat::host::{Fence, HookError, SeatContext, SeatHooks};
use crewlet::tasks::Tasks;
use tokio::sync::broadcast;

const TTL: Duration = Duration::from_secs(3);
const BEAT: Duration = Duration::from_secs(1);
const SWEEP: Duration = Duration::from_secs(1);

/// What a test node's hooks do, and what they saw.
#[derive(Default)]
struct TestHooks {
    /// Memory hydration never finishes (a successor stuck mid-prepare).
    stuck_hydration: std::sync::atomic::AtomicBool,
    /// When set, each hydration waits until the gate opens (`true`).
    hydration_gate: Mutex<Option<tokio::sync::watch::Receiver<bool>>>,
    /// Hydrations running now, and the most that ever ran at once.
    hydrating: std::sync::atomic::AtomicUsize,
    most_hydrating: std::sync::atomic::AtomicUsize,
    log: Mutex<Vec<String>>,
    failing_release: Mutex<BTreeSet<String>>,
    /// Each release hook takes 1.9 s (a teardown waiting on a slow store).
    slow_release: std::sync::atomic::AtomicBool,
    holds: Mutex<Vec<String>>,
    delivered: Arc<Mutex<Vec<String>>>,
}

impl TestHooks {
    fn note(&self, s: &SeatContext, step: &str) {
        self.log
            .lock()
            .unwrap()
            .push(format!("{}:{step}", s.handle));
    }
}

#[async_trait::async_trait]
impl SeatHooks for TestHooks {
    async fn start_children(&self, s: &SeatContext) -> Result<(), HookError> {
        self.note(s, "children");
        Ok(())
    }
    async fn hydrate_memory(&self, s: &SeatContext) -> Result<(), HookError> {
        self.note(s, "hydrate");
        let gate = self.hydration_gate.lock().unwrap().clone();
        if let Some(mut gate) = gate {
            use std::sync::atomic::Ordering::SeqCst;
            let now = self.hydrating.fetch_add(1, SeqCst) + 1;
            self.most_hydrating.fetch_max(now, SeqCst);
            let _ = gate.wait_for(|open| *open).await;
            self.hydrating.fetch_sub(1, SeqCst);
        }
        while self
            .stuck_hydration
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }
    async fn attach_reflect(&self, s: &SeatContext) -> Result<Option<Attachment>, HookError> {
        self.note(s, "reflect");
        Ok(None)
    }
    async fn attach_control(&self, s: &SeatContext) -> Result<Option<Attachment>, HookError> {
        self.note(s, "control");
        Ok(None)
    }
    async fn pause_holds(&self, s: &SeatContext) -> Result<Vec<String>, HookError> {
        self.note(s, "holds");
        Ok(self.holds.lock().unwrap().clone())
    }
    fn inbox_handler(&self, s: &SeatContext, _fence: Fence) -> Arc<dyn Handler> {
        self.note(s, "inbox");
        let record = self.delivered.clone();
        let handle = s.handle.clone();
        handler_fn(move |d: Delivery| {
            let record = record.clone();
            let handle = handle.clone();
            async move {
                record
                    .lock()
                    .unwrap()
                    .push(format!("{handle}:{}", String::from_utf8_lossy(&d.payload)));
                Disposition::Ack
            }
        })
    }
    async fn established(&self, s: &SeatContext) {
        self.note(s, "established");
    }
    async fn release(&self, s: &SeatContext) -> Result<(), HookError> {
        self.note(s, "release");
        if self.slow_release.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(1900)).await;
            self.note(s, "release_done");
        }
        if self.failing_release.lock().unwrap().contains(&s.handle) {
            return Err(HookError::new("children", "the agent process will not die"));
        }
        Ok(())
    }
}

/// One backend a fleet shares.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Twin,
    Nats,
}

struct Fleet {
    kind: Kind,
    ttl: Duration,
    store_timeout: Duration,
    /// The twin's store and queue, shared by every node (one process).
    twin: Option<(Arc<dyn Store>, Arc<dyn Queue>)>,
    server: Option<support::nats::NatsServer>,
}

struct TestNode {
    engine: Arc<SeatEngine>,
    hooks: Arc<TestHooks>,
    events: broadcast::Receiver<FleetEvent>,
    seen: Vec<FleetEvent>,
    /// Events the receiver fell too far behind to see (the bus is
    /// bounded): a test counting events says so when it missed some.
    missed: u64,
    store: Arc<dyn Store>,
    queue: Arc<dyn Queue>,
}

fn role(handle: &str, placement: PlacementConfig) -> RoleConfig {
    RoleConfig {
        handle: handle.into(),
        agent: Default::default(),
        placement,
        mcp: Vec::new(),
        ..Default::default()
    }
}

fn roles(prefix: &str, n: usize) -> Vec<RoleConfig> {
    (0..n)
        .map(|i| role(&format!("{prefix}{i}"), PlacementConfig::default()))
        .collect()
}

fn labels(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

impl Fleet {
    async fn new(kind: Kind) -> Fleet {
        // The engine's own log beside a failing test's output, on request.
        if std::env::var_os("RUST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_test_writer()
                .try_init();
        }
        match kind {
            Kind::Twin => {
                let store: Arc<dyn Store> = Arc::new(Coordinator::new(
                    TwinBackend::new(TTL),
                    CoordinatorOptions::default(),
                ));
                let queue: Arc<dyn Queue> = Arc::new(TwinQueue::new(log_events()));
                Fleet {
                    kind,
                    ttl: TTL,
                    store_timeout: Duration::from_secs(2),
                    twin: Some((store, queue)),
                    server: None,
                }
            }
            Kind::Nats => Fleet {
                kind,
                ttl: TTL,
                store_timeout: Duration::from_secs(2),
                twin: None,
                server: Some(support::nats::NatsServer::start().await),
            },
        }
    }

    async fn backends(&self, node: &str) -> (Arc<dyn Store>, Arc<dyn Queue>) {
        if let Some((s, q)) = &self.twin {
            return (s.clone(), q.clone());
        }
        let server = self.server.as_ref().unwrap();
        let mut opts = NatsOptions::new(vec![server.url()]);
        opts.lease_ttl = self.ttl;
        opts.store_timeout = self.store_timeout;
        opts.name = format!("crewlet-{node}");
        let backend = NatsBackend::connect(&opts).await.unwrap();
        let client = backend.client().clone();
        let store: Arc<dyn Store> = Arc::new(Coordinator::new(
            backend,
            CoordinatorOptions {
                store_timeout: self.store_timeout,
                ..CoordinatorOptions::default()
            },
        ));
        let queue: Arc<dyn Queue> = Arc::new(
            JetStreamQueue::new(
                client,
                JetStreamSettings {
                    replicas: 1,
                    timeout: self.store_timeout,
                },
                log_events(),
            )
            .await
            .unwrap(),
        );
        (store, queue)
    }

    /// Start a node `id` with `labels`; the first node writes `company`.
    async fn node(&self, id: &str, node_labels: &[&str], company: &[RoleConfig]) -> TestNode {
        self.node_with(id, node_labels, company, Arc::new(TestHooks::default()), 4)
            .await
    }

    async fn node_with(
        &self,
        id: &str,
        node_labels: &[&str],
        company: &[RoleConfig],
        hooks: Arc<TestHooks>,
        protocol: u32,
    ) -> TestNode {
        self.node_built(id, node_labels, company, hooks, protocol, 4, |s| s)
            .await
    }

    /// A node as [`Fleet::node_with`] whose passes claim up to
    /// `claim_limit` seats and whose store is `wrap`ped (a fault-injecting
    /// store in front of the fleet's).
    #[allow(clippy::too_many_arguments)]
    async fn node_built(
        &self,
        id: &str,
        node_labels: &[&str],
        company: &[RoleConfig],
        hooks: Arc<TestHooks>,
        protocol: u32,
        claim_limit: usize,
        wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
    ) -> TestNode {
        let (store, queue) = self.backends(id).await;
        let store = wrap(store);
        let owner = crewlet::node::Incarnation::mint(id).to_string();
        let events = EventBus::new(id, &owner);
        let rx = events.subscribe();
        let tasks = Tasks::new();
        let first = match company::active(&*store).await.unwrap() {
            Some(c) => c,
            None => {
                company::apply(&*store, "Test company", company)
                    .await
                    .unwrap();
                company::active(&*store).await.unwrap().unwrap()
            }
        };
        let company_rx = company::follow(store.clone(), first, &tasks);
        let cfg = EngineConfig {
            node_id: id.into(),
            owner,
            labels: labels(node_labels),
            protocol,
            heartbeat: BEAT,
            sweep: SWEEP,
            claim_limit,
            release_limit: 2,
            release_wait: BEAT,
            queue: QueueSettings::default(),
            handoff: Default::default(),
        };
        let engine = SeatEngine::new(
            cfg,
            store.clone(),
            queue.clone(),
            hooks.clone(),
            events,
            company_rx,
            tasks,
        )
        .await
        .unwrap();
        engine.start();
        TestNode {
            engine,
            hooks,
            events: rx,
            seen: Vec::new(),
            missed: 0,
            store,
            queue,
        }
    }

    /// [`Fleet::until`] for a condition that has to ask something.
    async fn until_async<F, Fut>(&self, what: &str, within: Duration, cond: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        assert!(
            self.within_async(within, cond).await,
            "timed out after {within:?} waiting for {what}"
        );
    }

    /// Whether `cond` comes to hold (on the fleet's clock) within `within`:
    /// [`Fleet::until_async`] for a caller that says more when it does not.
    async fn within_async<F, Fut>(&self, within: Duration, mut cond: F) -> bool
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + within;
        while !cond().await {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// Wait (on the fleet's clock) until `cond` holds, for at most `within`.
    async fn until(&self, what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
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
}

impl TestNode {
    fn held(&self) -> BTreeSet<String> {
        self.engine.host().held().into_iter().collect()
    }

    fn count(&self) -> usize {
        self.engine.host().held().len()
    }

    /// Every event seen so far (drains the receiver).
    fn events(&mut self) -> &[FleetEvent] {
        loop {
            match self.events.try_recv() {
                Ok(e) => self.seen.push(e),
                Err(broadcast::error::TryRecvError::Lagged(n)) => self.missed += n,
                Err(_) => break,
            }
        }
        &self.seen
    }

    fn detached(&mut self) -> Vec<(String, DetachReason)> {
        self.events()
            .iter()
            .filter_map(|e| match &e.event {
                Event::SeatDetached { seat, reason, .. } => Some((seat.clone(), *reason)),
                _ => None,
            })
            .collect()
    }
}

both!(
    paused_twin;
        drain_hands_every_seat_to_a_successor_that_takes_it_while_it_is_held,
    a_rebalance_hands_seats_to_the_joiner_through_an_offer,
    a_successor_stuck_mid_prepare_leaves_the_giver_to_resume_with_no_gap,
    a_giver_that_dies_mid_handoff_is_replaced_after_the_ttl,
    a_person_moves_a_seat_to_a_named_node_through_an_offer,
    a_holder_whose_presence_lapsed_is_never_robbed_and_the_target_claims_once_its_lease_lapses,
    a_single_node_holds_every_seat,
    two_nodes_split_the_seats_fairly,
    a_node_that_booted_alone_gives_back_to_a_later_joiner,
    a_dead_nodes_seats_move_within_ttl_and_a_sweep,
    a_node_restarted_with_the_same_id_takes_its_own_seats_back_while_a_peer_with_room_sweeps,
    a_draining_node_that_still_holds_seats_reads_as_draining_and_its_successor_as_serving,
    pinned_seats_and_label_groups_the_satellite_example,
    drain_moves_everything_and_nothing_is_claimed_back,
    a_drain_whose_offers_go_untaken_stops_offering_at_its_bound_and_releases_the_rest,
    a_lower_protocol_peer_blocks_claims_until_its_leases_lapse_but_its_duty_leases_do_not,
    a_moved_seats_offer_is_not_taken_while_a_lower_protocol_presence_is_live,
    a_failed_teardown_keeps_the_lease_renewed_until_a_retry_succeeds,
    an_undead_seat_whose_lease_is_lost_is_announced_as_seat_undead_lost,
    a_stuck_seat_squeezes_the_unpinned_group_rather_than_the_pinned_one,
    a_paused_seat_is_attached_already_held,
    an_apply_that_adds_a_role_gets_the_seat_a_mailbox_and_a_holder,
    the_acquire_hook_runs_in_the_specs_order_before_any_turn_is_admitted,
);

async fn a_single_node_holds_every_seat(f: Fleet) {
    let a = f.node("a", &[], &roles("s", 9)).await;
    f.until("a to hold all 9", Duration::from_secs(20), || {
        a.count() == 9
    })
    .await;
    a.engine.drain().await;
}

async fn two_nodes_split_the_seats_fairly(f: Fleet) {
    let company = roles("s", 6);
    let a = f.node("a", &[], &company).await;
    let b = f.node("b", &[], &company).await;
    f.until("a 3/3 split", Duration::from_secs(30), || {
        a.count() == 3 && b.count() == 3
    })
    .await;
    assert!(
        a.held().is_disjoint(&b.held()),
        "never two holders of one seat"
    );
    a.engine.drain().await;
    b.engine.drain().await;
}

async fn a_node_that_booted_alone_gives_back_to_a_later_joiner(f: Fleet) {
    let company = roles("s", 6);
    let mut a = f.node("a", &[], &company).await;
    f.until("a to hold all 6", Duration::from_secs(20), || {
        a.count() == 6
    })
    .await;
    let b = f.node("b", &[], &company).await;
    f.until(
        "the joiner to get its share",
        Duration::from_secs(30),
        || a.count() == 3 && b.count() == 3,
    )
    .await;
    let gave: Vec<_> = a.detached();
    assert_eq!(gave.len(), 3);
    assert!(
        gave.iter().all(|(_, r)| *r == DetachReason::Rebalance),
        "{gave:?}"
    );
    a.engine.drain().await;
    b.engine.drain().await;
}

async fn a_dead_nodes_seats_move_within_ttl_and_a_sweep(f: Fleet) {
    let company = roles("s", 4);
    let a = f.node("a", &[], &company).await;
    let b = f.node("b", &[], &company).await;
    f.until("a 2/2 split", Duration::from_secs(30), || {
        a.count() == 2 && b.count() == 2
    })
    .await;
    b.engine.crash().await;
    // The spec's bound: the dead node's leases lapse at the TTL, and the
    // survivor's next sweep (plus the heartbeat that notices) takes them.
    f.until(
        "the survivor to hold every seat",
        TTL + SWEEP + BEAT + Duration::from_secs(1),
        || a.count() == 4,
    )
    .await;
    a.engine.drain().await;
}

/// Stickiness end to end: the hint outlives the crashed incarnation's
/// leases, the restarted incarnation claims its own seats first, and the
/// peer — with room for one more the whole time — leaves them to it.
async fn a_node_restarted_with_the_same_id_takes_its_own_seats_back_while_a_peer_with_room_sweeps(
    f: Fleet,
) {
    let company = roles("s", 5);
    let a = f.node("a", &[], &company).await;
    let b = f.node("b", &[], &company).await;
    f.until("a 3/2 split", Duration::from_secs(30), || {
        a.count() + b.count() == 5 && a.count().max(b.count()) == 3
    })
    .await;
    let ((id, heavy), mut peer) = if a.count() == 3 {
        (("a", a), b)
    } else {
        (("b", b), a)
    };
    let theirs = heavy.held();
    let kept = peer.held();
    let seen_before = peer.events().len();
    heavy.engine.crash().await;
    let back = f.node(id, &[], &company).await;
    f.until(
        "the restarted node to hold its own seats again",
        TTL + SWEEP * 10,
        || back.held() == theirs,
    )
    .await;
    // A few more passes: nothing the peer deferred comes back to it.
    let settle = tokio::time::Instant::now() + SWEEP * 4;
    f.until("four more passes", SWEEP * 5, || {
        tokio::time::Instant::now() >= settle
    })
    .await;
    assert_eq!(
        back.held(),
        theirs,
        "the restarted node keeps its own seats"
    );
    assert_eq!(peer.held(), kept, "the peer holds what it held");
    let after = &peer.events()[seen_before..];
    let claimed: Vec<&String> = after
        .iter()
        .filter_map(|e| match &e.event {
            Event::SeatClaimed { seat, .. } => Some(seat),
            _ => None,
        })
        .collect();
    assert!(claimed.is_empty(), "the peer claimed {claimed:?}");
    assert!(
        after.iter().any(|e| matches!(
            &e.event,
            Event::SeatSweep { held, capacity, .. } if capacity > held
        )),
        "the peer swept with room while the seats were free"
    );
    back.engine.drain().await;
    peer.engine.drain().await;
}

/// Settings › Nodes from the store: a draining node gave its presence up
/// first and still holds a seat its successor is preparing to take — it
/// reads as draining (its seats carry the mark), never as a serving node
/// whose presence is late, and the serving successor reads as serving.
async fn a_draining_node_that_still_holds_seats_reads_as_draining_and_its_successor_as_serving(
    f: Fleet,
) {
    let company = roles("s", 2);
    let mut a = f.node("a", &[], &company).await;
    let hooks_b = Arc::new(TestHooks::default());
    let b = f.node_with("b", &[], &company, hooks_b.clone(), 4).await;
    // Each seat attached (admitting), not only claimed: a hydration made
    // to stick while b still prepared its own seat would hold b's first
    // seat instead of a's handover.
    let admitting = |n: &TestNode| {
        n.count() == 1
            && n.held()
                .iter()
                .all(|s| n.engine.host().may_start(s).is_some())
    };
    f.until(
        "a 1/1 split, both attached",
        Duration::from_secs(30),
        || admitting(&a) && admitting(&b),
    )
    .await;
    // b's next prepare does not finish until released: a's drain hands
    // its seat over slowly, holding it meanwhile.
    hooks_b
        .stuck_hydration
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let draining = {
        let engine = a.engine.clone();
        tokio::spawn(async move { engine.drain().await })
    };
    // The roster each poll read, for the message if the wait times out.
    let last_read = Arc::new(std::sync::Mutex::new(None));
    let store = a.store.clone();
    let read_as_draining = f
        .within_async(Duration::from_secs(20), || {
            let (store, last_read) = (store.clone(), last_read.clone());
            async move {
                let view =
                    crewlet::web::ownership::read_fleet(&*store, "t", "c", "embedded-kv").await;
                let found = view.as_ref().is_ok_and(|view| {
                    let a_draining = view.nodes.iter().any(|n| {
                        n.node_id == "a"
                            && n.status == app::api::NodeStatus::Draining
                            && n.seats.len() == 1
                    });
                    let b_serving = view
                        .nodes
                        .iter()
                        .any(|n| n.node_id == "b" && n.status == app::api::NodeStatus::Serving);
                    a_draining && b_serving
                });
                *last_read.lock().unwrap() = Some(view.map(|v| {
                    v.nodes
                        .iter()
                        .map(|n| (n.node_id.clone(), n.status, n.seats.len()))
                        .collect::<Vec<_>>()
                }));
                found
            }
        })
        .await;
    if !read_as_draining {
        let roster = last_read.lock().unwrap().take();
        let a_reads = a.store.list("").await.map(|l| l.len());
        let b_reads = b.store.list("").await.map(|l| l.len());
        panic!(
            "timed out after 20s waiting for a to read as draining with its seat; the roster last read: {roster:?}; a's store lists {a_reads:?} leases, b's {b_reads:?}; a's seats: {:?}; a's events: {:?}",
            a.held(),
            a.events().iter().map(|e| &e.event).collect::<Vec<_>>(),
        );
    }
    hooks_b
        .stuck_hydration
        .store(false, std::sync::atomic::Ordering::SeqCst);
    draining.await.unwrap();
    f.until("b to hold both seats", Duration::from_secs(30), || {
        b.count() == 2
    })
    .await;
    b.engine.drain().await;
}

async fn pinned_seats_and_label_groups_the_satellite_example(f: Fleet) {
    let mut company = roles("u", 6);
    company.push(role(
        "pinned",
        PlacementConfig {
            nodes: vec![],
            labels: vec!["satellite".into()],
        },
    ));
    company.push(role(
        "only-b",
        PlacementConfig {
            nodes: vec!["b".into()],
            labels: vec![],
        },
    ));
    let sat = f.node("sat", &["satellite"], &company).await;
    let b = f.node("b", &[], &company).await;
    let c = f.node("c", &[], &company).await;
    // Converged: every seat placed, and the satellite holds at most its
    // share of the unpinned group — ceil(6 / 3) — on top of its pinned seat.
    let unpinned_on = |n: &TestNode| n.held().iter().filter(|h| h.starts_with('u')).count();
    f.until(
        "every seat placed within the shares",
        Duration::from_secs(40),
        || {
            sat.count() + b.count() + c.count() == 8
                && unpinned_on(&sat) <= 2
                && unpinned_on(&b) <= 2
        },
    )
    .await;
    assert!(
        sat.held().contains("pinned"),
        "the pinned seat is on the satellite: {:?}",
        sat.held()
    );
    assert!(b.held().contains("only-b"));
    for n in [&sat, &b, &c] {
        n.engine.drain().await;
    }
}

/// A drain whose offers go untaken (its successor never finishes
/// preparing) offers seats for twice the hand-off's bound only and
/// releases the rest: its length does not grow with the seats it holds
/// (chaos seed 5004 under load: a draining node of 20 seats was still
/// offering 30 s after its SIGTERM).
async fn a_drain_whose_offers_go_untaken_stops_offering_at_its_bound_and_releases_the_rest(
    f: Fleet,
) {
    let company = roles("s", 20);
    let mut a = f.node("a", &[], &company).await;
    let hooks_b = Arc::new(TestHooks::default());
    let b = f.node_with("b", &[], &company, hooks_b.clone(), 4).await;
    f.until("a 10/10 split", Duration::from_secs(30), || {
        a.count() == 10 && b.count() == 10
    })
    .await;
    // b's prepares do not finish from now on: no offer of a's is taken.
    hooks_b
        .stuck_hydration
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let before = a.detached().len();
    a.engine.drain().await;
    assert_eq!(a.count(), 0, "every seat left the draining node");
    let offered_in_drain = a
        .events()
        .iter()
        .filter(|e| {
            matches!(
                e.event,
                Event::SeatOffered {
                    reason: DetachReason::Drain,
                    ..
                }
            )
        })
        .count();
    // Four at a time, each offer standing its whole bound before it is
    // withdrawn: two rounds fit in twice the bound, the rest is released.
    assert!(
        (1..=8).contains(&offered_in_drain),
        "{offered_in_drain} of 10 seats offered in the drain: the offering should stop after two rounds"
    );
    let detached = a.detached()[before..].to_vec();
    assert!(
        detached.len() == 10 && detached.iter().all(|(_, r)| *r == DetachReason::Drain),
        "every seat detached once, as drained: {detached:?} ({} events missed)",
        a.missed
    );
    hooks_b
        .stuck_hydration
        .store(false, std::sync::atomic::Ordering::SeqCst);
    f.until("b to hold every seat", Duration::from_secs(30), || {
        b.count() == 20
    })
    .await;
    b.engine.drain().await;
}

async fn drain_moves_everything_and_nothing_is_claimed_back(f: Fleet) {
    let company = roles("s", 4);
    let mut a = f.node("a", &[], &company).await;
    let b = f.node("b", &[], &company).await;
    f.until("a 2/2 split", Duration::from_secs(30), || {
        a.count() == 2 && b.count() == 2
    })
    .await;
    a.events();
    let claimed_before = a
        .seen
        .iter()
        .filter(|e| matches!(e.event, Event::SeatClaimed { .. }))
        .count();
    a.engine.drain().await;
    assert_eq!(a.count(), 0);
    let drained = a.detached();
    assert!(
        drained
            .iter()
            .filter(|(_, r)| *r == DetachReason::Drain)
            .count()
            == 2,
        "{drained:?}"
    );
    f.until("b to take everything", Duration::from_secs(20), || {
        b.count() == 4
    })
    .await;
    let claimed_after = a
        .events()
        .iter()
        .filter(|e| matches!(e.event, Event::SeatClaimed { .. }))
        .count();
    assert_eq!(
        claimed_before, claimed_after,
        "a draining node claims nothing back"
    );
    b.engine.drain().await;
}

async fn a_lower_protocol_peer_blocks_claims_until_its_leases_lapse_but_its_duty_leases_do_not(
    f: Fleet,
) {
    let company = roles("s", 2);
    let (store, _) = f.backends("old").await;
    // An older build's duty lease, held for far longer than the TTL: never counts.
    let duty = ClaimRequest::new("worker:maintenance", "old:1", "old")
        .with_protocol(3)
        .with_ttl(Duration::from_secs(3600));
    assert!(matches!(store.claim(duty).await.unwrap(), Claim::Won(_)));
    // Its presence, not renewed: it lapses at the TTL.
    let presence = ClaimRequest::new("node:old", "old:1", "old").with_protocol(3);
    assert!(matches!(
        store.claim(presence).await.unwrap(),
        Claim::Won(_)
    ));
    let mut a = f.node("a", &[], &company).await;
    f.until(
        "a blocked by the older protocol, naming the older node",
        Duration::from_secs(10),
        || {
            a.events().iter().any(|e| {
                matches!(
                    &e.event,
                    Event::SeatClaimsBlockedByOlderProtocol {
                        floor: 3,
                        protocol: 4,
                        nodes,
                    } if nodes == &["old".to_string()]
                )
            })
        },
    )
    .await;
    assert_eq!(
        a.count(),
        0,
        "nothing claimed while a protocol-3 presence is live"
    );
    f.until(
        "claims once the old presence lapsed",
        TTL + SWEEP * 3 + Duration::from_secs(2),
        || a.count() == 2,
    )
    .await;
    a.engine.drain().await;
}

/// Wait until `store` lists node `id`'s presence (a move's target must be
/// live in the roster; a loaded machine can renew it late).
async fn presence_live(f: &Fleet, store: &Arc<dyn Store>, id: &str) {
    let key = format!("node:{id}");
    f.until_async(
        &format!("{id}'s presence to be live"),
        Duration::from_secs(10),
        || async {
            store
                .list(&key)
                .await
                .is_ok_and(|l| l.iter().any(|p| p.resource == key))
        },
    )
    .await;
}

/// Ask for s0 to move to b while an older build's presence is live for
/// the whole test: b, judging the protocol gate, never takes the offer.
async fn move_s0_to_b_behind_an_older_presence(store: &Arc<dyn Store>) {
    let old = ClaimRequest::new("node:old", "old:1", "old")
        .with_protocol(3)
        .with_ttl(Duration::from_secs(3600));
    assert!(matches!(store.claim(old).await.unwrap(), Claim::Won(_)));
    crewlet::seat::moves::request(&**store, "s0", "b", "op", "closer to its data")
        .await
        .expect("the move is accepted");
}

async fn a_moved_seats_offer_is_not_taken_while_a_lower_protocol_presence_is_live(f: Fleet) {
    let company = roles("s", 1);
    let mut a = f.node("a", &[], &company).await;
    f.until("a holds s0", Duration::from_secs(10), || a.count() == 1)
        .await;
    let mut b = f.node("b", &[], &company).await;
    presence_live(&f, &a.store, "b").await;
    move_s0_to_b_behind_an_older_presence(&a.store).await;
    // The holder offers it; the target, judging the gate, does not take it,
    // and the offer lapses back to the holder.
    f.until("the offer to b to be withdrawn", Duration::from_secs(30), || {
        a.events().iter().any(|e| {
            matches!(&e.event, Event::SeatOfferWithdrawn { seat, to, .. } if seat == "s0" && to == "b")
        })
    })
    .await;
    assert!(
        b.events().iter().any(|e| matches!(
            &e.event,
            Event::SeatClaimsBlockedByOlderProtocol { floor: 3, .. }
        )),
        "b refused the offer for the protocol gate"
    );
    assert_eq!(
        b.count(),
        0,
        "b took nothing while a protocol-3 presence is live"
    );
    assert_eq!(a.count(), 1, "a runs the seat on");
    a.engine.drain().await;
    b.engine.drain().await;
}

async fn a_failed_teardown_keeps_the_lease_renewed_until_a_retry_succeeds(f: Fleet) {
    let company = roles("s", 1);
    let hooks = Arc::new(TestHooks::default());
    hooks.failing_release.lock().unwrap().insert("s0".into());
    let mut a = f.node_with("a", &[], &company, hooks.clone(), 4).await;
    f.until("a holds s0", Duration::from_secs(10), || a.count() == 1)
        .await;
    a.engine.host().release("s0", DetachReason::Rebalance).await;
    assert_eq!(a.engine.host().undead(), vec!["s0".to_string()]);
    assert!(a.engine.host().held().is_empty(), "out of the held set");
    assert!(
        a.events()
            .iter()
            .any(|e| matches!(e.event, Event::SeatReleaseUnproven { .. }))
    );
    // Still renewed: once it has been undead for two TTLs, the lease is
    // still ours and the seat still undead (not lost, not claimed afresh).
    f.until(
        "the seat undead for two TTLs, or no longer undead",
        TTL * 2 + Duration::from_secs(10),
        || {
            let host = a.engine.host();
            host.undead().is_empty()
                || host
                    .status()
                    .iter()
                    .any(|s| s.unproven_for.is_some_and(|d| d >= TTL * 2))
        },
    )
    .await;
    assert_eq!(
        a.engine.host().undead(),
        vec!["s0".to_string()],
        "the undead seat is kept and renewed (a lapse ends it as seat_undead_lost): {:?}",
        a.events()
            .iter()
            .filter(|e| matches!(e.event, Event::SeatUndeadLost { .. }))
            .collect::<Vec<_>>()
    );
    let lease = a
        .store
        .lease("seat:s0")
        .await
        .unwrap()
        .expect("the undead seat's lease is live");
    assert_eq!(lease.owner, a.engine.config().owner);
    let status = a.engine.host().status();
    assert!(status[0].unproven_for.is_some());
    // The cause clears: the next heartbeat's retry releases the lease at once.
    hooks.failing_release.lock().unwrap().clear();
    f.until("the teardown to recover", Duration::from_secs(10), || {
        a.events()
            .iter()
            .any(|e| matches!(e.event, Event::SeatReleaseRecovered { .. }))
    })
    .await;
    assert!(a.engine.host().undead().is_empty());
    a.engine.drain().await;
}

async fn a_stuck_seat_squeezes_the_unpinned_group_rather_than_the_pinned_one(f: Fleet) {
    // The spec's example: a node holding an unpinned seat and a stuck one
    // (its role gone, its teardown failing) must not read "full" while its
    // pinned group has room. a may run the pinned seat and the open ones;
    // b only the open ones.
    let pinned = role(
        "pinned",
        PlacementConfig {
            nodes: vec!["a".into()],
            labels: vec![],
        },
    );
    let only_a = PlacementConfig {
        nodes: vec!["a".into()],
        labels: vec![],
    };
    let mut company = roles("u", 1);
    company.push(role("stuck", only_a));
    let hooks = Arc::new(TestHooks::default());
    hooks.failing_release.lock().unwrap().insert("stuck".into());
    let a = f.node_with("a", &[], &company, hooks.clone(), 4).await;
    let b = f.node("b", &[], &company).await;
    f.until("the stuck seat on a", Duration::from_secs(30), || {
        a.held().contains("stuck")
    })
    .await;
    // The stuck seat's role is removed (its teardown fails: undead, in no
    // group), and the pinned seat is added. a's capacity is 2 (pinned 1 +
    // open 1); the stuck seat is charged first, the pinned group — the most
    // constrained — gets what is left, and the open seat goes to b.
    let mut next = roles("u", 1);
    next.push(pinned);
    company::apply(&*a.store, "Test company", &next)
        .await
        .unwrap();
    f.until(
        "the pinned seat on a and the open seat on b",
        Duration::from_secs(40),
        || {
            a.held() == BTreeSet::from(["pinned".to_string()])
                && b.held() == BTreeSet::from(["u0".to_string()])
        },
    )
    .await;
    assert_eq!(a.engine.host().undead(), vec!["stuck".to_string()]);
    hooks.failing_release.lock().unwrap().clear();
    a.engine.drain().await;
    b.engine.drain().await;
}

async fn a_paused_seat_is_attached_already_held(f: Fleet) {
    let company = roles("p", 1);
    let hooks = Arc::new(TestHooks::default());
    hooks.holds.lock().unwrap().push("pause".into());
    let a = f.node_with("a", &[], &company, hooks.clone(), 4).await;
    a.queue
        .publish(
            "crewlet.agent.p0.inbox",
            None,
            bytes::Bytes::from_static(b"held mail"),
        )
        .await
        .unwrap();
    f.until("a holds p0", Duration::from_secs(10), || a.count() == 1)
        .await;
    // Absence: nothing reaches the new holder while the pause holds.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        hooks.delivered.lock().unwrap().is_empty(),
        "a paused seat's mail was delivered"
    );
    assert!(a.engine.host().hold("p0", "pause", false));
    f.until("the mail after resume", Duration::from_secs(10), || {
        hooks.delivered.lock().unwrap().as_slice() == ["p0:held mail"]
    })
    .await;
    a.engine.drain().await;
}

async fn an_apply_that_adds_a_role_gets_the_seat_a_mailbox_and_a_holder(f: Fleet) {
    let a = f.node("a", &[], &roles("s", 1)).await;
    f.until("a holds s0", Duration::from_secs(10), || a.count() == 1)
        .await;
    let mut next = roles("s", 1);
    next.push(role("added", PlacementConfig::default()));
    let rev = company::apply(&*a.store, "Test company", &next)
        .await
        .unwrap();
    assert_eq!(rev, 2);
    f.until("the added seat held", Duration::from_secs(10), || {
        a.held().contains("added")
    })
    .await;
    let subs: BTreeSet<String> = a
        .queue
        .list_subscriptions()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    for s in ["agent-added", "control-added", "reflect-added"] {
        assert!(subs.contains(s), "{s} missing from {subs:?}");
    }
    // Removing it gives the seat back as role_gone.
    company::apply(&*a.store, "Test company", &roles("s", 1))
        .await
        .unwrap();
    f.until("the removed seat released", Duration::from_secs(10), || {
        !a.held().contains("added")
    })
    .await;
    let mut a = a;
    assert!(
        a.detached()
            .contains(&("added".to_string(), DetachReason::RoleGone))
    );
    assert!(
        a.events()
            .iter()
            .any(|e| matches!(&e.event, Event::SeatReleasedRoleGone { seat } if seat == "added"))
    );
    a.engine.drain().await;
}

async fn the_acquire_hook_runs_in_the_specs_order_before_any_turn_is_admitted(f: Fleet) {
    let a = f.node("a", &[], &roles("o", 1)).await;
    // Held counts a seat still establishing: wait for the last step.
    f.until("o0 established", Duration::from_secs(10), || {
        a.hooks
            .log
            .lock()
            .unwrap()
            .iter()
            .any(|l| l == "o0:established")
    })
    .await;
    let log = a.hooks.log.lock().unwrap().clone();
    assert_eq!(
        log,
        [
            "o0:children",
            "o0:hydrate",
            "o0:reflect",
            "o0:control",
            "o0:holds",
            "o0:inbox",
            "o0:established"
        ]
    );
    assert!(
        a.engine.host().may_start("o0").is_some(),
        "admitted once established"
    );
    a.engine.drain().await;
    let log = a.hooks.log.lock().unwrap().clone();
    assert_eq!(log.last().map(String::as_str), Some("o0:release"));
}

// ---- twin only: the clock is ours ----

#[tokio::test(start_paused = true)]
async fn admission_lapses_one_heartbeat_after_the_last_successful_renew() {
    use crewlet::seat::host::{HostConfig, SeatHost};
    let f = Fleet::new(Kind::Twin).await;
    let (store, queue) = f.backends("a").await;
    crewlet::queue::ensure_seat_mailboxes(&*queue, "s0", QueueSettings::default())
        .await
        .unwrap();
    let events = EventBus::new("a", "a:1");
    let mut rx = events.subscribe();
    let host = SeatHost::new(
        HostConfig {
            node_id: "a".into(),
            owner: "a:1".into(),
            heartbeat: BEAT,
            release_wait: BEAT,
        },
        store.clone(),
        queue,
        Arc::new(TestHooks::default()),
        events,
    );
    host.claim("s0").await.unwrap();
    let epoch = host.may_start("s0").expect("fresh right after the claim");
    // No renew for longer than a heartbeat: admission refuses, and says so.
    f.until("admission to refuse", BEAT * 2, || {
        host.may_start("s0").is_none()
    })
    .await;
    let stale = std::iter::from_fn(|| rx.try_recv().ok())
        .any(|e| matches!(e.event, Event::SeatAdmissionStale { ref seat, .. } if seat == "s0"));
    assert!(stale, "seat_admission_stale was reported");
    // A successful renew makes it fresh again, at the same epoch.
    host.heartbeat(TTL).await;
    assert_eq!(host.may_start("s0"), Some(epoch));
}

/// Hooks that keep the fence each inbox attachment was given.
#[derive(Default)]
struct FenceHooks {
    fences: Mutex<Vec<Fence>>,
}

#[async_trait::async_trait]
impl SeatHooks for FenceHooks {
    fn inbox_handler(&self, _s: &SeatContext, fence: Fence) -> Arc<dyn Handler> {
        self.fences.lock().unwrap().push(fence);
        handler_fn(|_d: Delivery| async { Disposition::Ack })
    }
}

/// Found by the chaos harness: a node stopped (SIGSTOP) in the middle of a
/// turn for longer than the TTL resumed with the seat still attached — its
/// heartbeat had not run yet — so the turn's next call passed the fence and
/// posted its effect for a seat a peer had taken (and the peer ran the
/// trigger again). The fence now closes once the last successful renewal
/// is a TTL old, heartbeat or not, and a fresh renewal opens it again.
#[tokio::test(start_paused = true)]
async fn a_turn_resumed_past_the_ttl_posted_its_effect_after_the_seat_moved() {
    use crewlet::seat::host::{HostConfig, SeatHost};
    let f = Fleet::new(Kind::Twin).await;
    let (store, queue) = f.backends("a").await;
    crewlet::queue::ensure_seat_mailboxes(&*queue, "s0", QueueSettings::default())
        .await
        .unwrap();
    let hooks = Arc::new(FenceHooks::default());
    let host = SeatHost::new(
        HostConfig {
            node_id: "a".into(),
            owner: "a:1".into(),
            heartbeat: BEAT,
            release_wait: BEAT,
        },
        store,
        queue,
        hooks.clone(),
        EventBus::new("a", "a:1"),
    );
    host.claim("s0").await.unwrap();
    let fence = hooks.fences.lock().unwrap()[0].clone();
    assert!(fence.holds(), "held right after the claim");
    // Renewed within the TTL: held, with no heartbeat in between.
    tokio::time::advance(TTL / 2).await;
    host.heartbeat(TTL).await;
    tokio::time::advance(TTL - Duration::from_millis(10)).await;
    assert!(fence.holds(), "a renewal within the TTL keeps it");
    // The process sleeps past the TTL; nothing has fenced the seat yet.
    tokio::time::advance(Duration::from_millis(20)).await;
    assert_eq!(host.held(), ["s0"], "still attached: no heartbeat ran");
    assert!(!fence.holds(), "but no longer provably held");
}

/// The spec's second check: a drain that begins while the claim's store
/// call is in flight finds the claim won, and the lease goes straight back
/// before anything is attached (nothing claimed, nothing established).
#[tokio::test(start_paused = true)]
async fn a_drain_that_begins_while_a_claim_is_in_flight_hands_the_lease_straight_back() {
    use crewlet::seat::host::{Acquired, HostConfig, SeatHost};
    use duty_faults::{Fault, FaultyStore};
    let f = Fleet::new(Kind::Twin).await;
    let (store, queue) = f.backends("a").await;
    let hold = Fault::HoldClaim("seat:x".into());
    let faulty = FaultyStore::new(store.clone(), std::slice::from_ref(&hold));
    let hooks = Arc::new(TestHooks::default());
    let events = EventBus::new("a", "a:1");
    let mut seen = events.subscribe();
    let host = Arc::new(SeatHost::new(
        HostConfig {
            node_id: "a".into(),
            owner: "a:1".into(),
            heartbeat: BEAT,
            release_wait: BEAT,
        },
        faulty.clone(),
        queue,
        hooks.clone(),
        events,
    ));
    let claiming = {
        let host = host.clone();
        tokio::spawn(async move { host.claim("x").await })
    };
    f.until("the claim to be in flight", Duration::from_secs(5), || {
        faulty.hits(&hold) > 0
    })
    .await;
    host.begin_drain();
    faulty.heal();
    let got = claiming.await.unwrap().unwrap();
    assert_eq!(got, Acquired::Draining);
    assert_eq!(
        store.epoch("seat:x").await.unwrap(),
        1,
        "the claim did win at the store"
    );
    assert!(
        store.lease("seat:x").await.unwrap().is_none(),
        "and went straight back"
    );
    assert!(host.held().is_empty());
    assert!(
        hooks.log.lock().unwrap().is_empty(),
        "nothing was established: {:?}",
        hooks.log.lock().unwrap()
    );
    while let Ok(e) = seen.try_recv() {
        assert!(
            !matches!(
                e.event,
                Event::SeatClaimed { .. } | Event::SeatAttached { .. }
            ),
            "{e:?}"
        );
    }
}

/// Hooks whose inbox handler defers the first delivery (as a turn that
/// found the seat not owned here does) and takes every later one.
#[derive(Default)]
struct DeferOnceHooks {
    deferred: std::sync::atomic::AtomicBool,
    taken: Arc<Mutex<Vec<String>>>,
}

#[async_trait::async_trait]
impl SeatHooks for DeferOnceHooks {
    fn inbox_handler(&self, _s: &SeatContext, _fence: Fence) -> Arc<dyn Handler> {
        let first = !self
            .deferred
            .swap(true, std::sync::atomic::Ordering::SeqCst);
        let once = Arc::new(std::sync::atomic::AtomicBool::new(first));
        let taken = self.taken.clone();
        handler_fn(move |d: Delivery| {
            let once = once.clone();
            let taken = taken.clone();
            async move {
                if once.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    return Disposition::Defer("the seat is not owned here".into());
                }
                taken
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&d.payload).into_owned());
                Disposition::Ack
            }
        })
    }
}

/// The spec's "owned, attached and deaf" case: a deferral quiesces the
/// seat's consumer, and the next successful renew resumes it (the edge),
/// so the deferred mail is answered by the same tenure.
async fn a_deferral_quiesces_the_inbox_and_the_next_successful_renew_resumes_it(f: Fleet) {
    use crewlet::seat::host::{HostConfig, SeatHost};
    let (store, queue) = f.backends("a").await;
    crewlet::queue::ensure_seat_mailboxes(&*queue, "s0", QueueSettings::default())
        .await
        .unwrap();
    let hooks = Arc::new(DeferOnceHooks::default());
    let host = SeatHost::new(
        HostConfig {
            node_id: "a".into(),
            owner: "a:1".into(),
            heartbeat: BEAT,
            release_wait: BEAT,
        },
        store,
        queue.clone(),
        hooks.clone(),
        EventBus::new("a", "a:1"),
    );
    host.claim("s0").await.unwrap();
    let epoch = host.may_start("s0").expect("attached and admitting");
    queue
        .publish(
            "crewlet.agent.s0.inbox",
            None,
            bytes::Bytes::from_static(b"deferred mail"),
        )
        .await
        .unwrap();
    f.until(
        "the deferral to quiesce the inbox",
        Duration::from_secs(10),
        || host.inbox_quiesced("s0") == Some(true),
    )
    .await;
    assert!(
        hooks.taken.lock().unwrap().is_empty(),
        "deaf: nothing taken yet"
    );
    // Deaf stays deaf until ownership is proven again (no heartbeat runs
    // in between here, so this is the host's state, not a race).
    assert_eq!(host.inbox_quiesced("s0"), Some(true));
    host.heartbeat(f.ttl).await;
    f.until(
        "the deferred mail to be taken",
        Duration::from_secs(20),
        || hooks.taken.lock().unwrap().as_slice() == ["deferred mail"],
    )
    .await;
    assert_eq!(host.inbox_quiesced("s0"), Some(false), "consuming again");
    assert_eq!(host.may_start("s0"), Some(epoch), "the same tenure");
    host.release("s0", DetachReason::Drain).await;
}

#[tokio::test(start_paused = true)]
async fn twin_a_deferral_quiesces_the_inbox_and_the_next_successful_renew_resumes_it() {
    a_deferral_quiesces_the_inbox_and_the_next_successful_renew_resumes_it(
        Fleet::new(Kind::Twin).await,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_deferral_quiesces_the_inbox_and_the_next_successful_renew_resumes_it() {
    a_deferral_quiesces_the_inbox_and_the_next_successful_renew_resumes_it(
        Fleet::new(Kind::Nats).await,
    )
    .await;
}

/// A bare seat host of node `a` on the twin (no engine: the test drives
/// its claims, heartbeats and hand-offs), with seat s0's mailboxes made;
/// and its queue.
async fn bare_host(
    f: &Fleet,
    hooks: Arc<dyn SeatHooks>,
) -> (Arc<crewlet::seat::host::SeatHost>, Arc<dyn Queue>) {
    bare_host_with(f, hooks, |store| store).await
}

/// [`bare_host`] on the store `wrap` puts in front of the fleet's.
async fn bare_host_with(
    f: &Fleet,
    hooks: Arc<dyn SeatHooks>,
    wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
) -> (Arc<crewlet::seat::host::SeatHost>, Arc<dyn Queue>) {
    use crewlet::seat::host::{HostConfig, SeatHost};
    let (store, queue) = f.backends("a").await;
    let store = wrap(store);
    crewlet::queue::ensure_seat_mailboxes(&*queue, "s0", QueueSettings::default())
        .await
        .unwrap();
    let host = Arc::new(SeatHost::new(
        HostConfig {
            node_id: "a".into(),
            owner: "a:1".into(),
            heartbeat: BEAT,
            release_wait: BEAT,
        },
        store,
        queue.clone(),
        hooks,
        EventBus::new("a", "a:1"),
    ));
    (host, queue)
}

/// Found by the chaos soak (seed 5004): a delivery queued behind the turn
/// in flight started its own turn after the seat was quiesced and offered,
/// and wrote memory the successor had already hydrated without. While an
/// offer stands nothing new is admitted; once it is withdrawn the seat
/// admits again.
#[tokio::test(start_paused = true)]
async fn no_turn_is_admitted_while_an_offer_stands_and_admission_returns_when_it_is_withdrawn() {
    use crewlet::seat::host::HandOff;
    let f = Fleet::new(Kind::Twin).await;
    let (host, _) = bare_host(&f, Arc::new(TestHooks::default())).await;
    host.claim("s0").await.unwrap();
    let epoch = host.may_start("s0").expect("admitting once attached");
    // Offered to a node that never takes it.
    let offering = {
        let host = host.clone();
        tokio::spawn(async move {
            host.hand_off("s0", "nobody", DetachReason::Rebalance, TTL / 2, &|| {})
                .await
        })
    };
    let standing = {
        let host = host.clone();
        move || host.inbox_quiesced("s0") == Some(true)
    };
    f.until("the seat to be quiesced for the offer", TTL, standing)
        .await;
    // A fresh renewal: ownership is proven, and still nothing is admitted.
    host.heartbeat(TTL).await;
    assert_eq!(host.may_start("s0"), None, "no turn starts while offered");
    assert!(matches!(offering.await.unwrap(), HandOff::Withdrawn));
    host.heartbeat(TTL).await;
    assert_eq!(
        host.may_start("s0"),
        Some(epoch),
        "admitting again, same tenure"
    );
}

/// From the first offer of `resource` on, the store answers nothing about
/// it: renewals, lease reads and the offer's withdrawal all time out (a
/// giver cut off from the store right after offering).
struct CutOffAfterOffer {
    resource: &'static str,
    offered: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl support::faulty::Faults for CutOffAfterOffer {
    async fn before(&self, call: support::faulty::Call<'_>) -> Result<(), StoreError> {
        use support::faulty::Call;
        let cut = self.offered.load(std::sync::atomic::Ordering::SeqCst);
        match call {
            Call::Offer(r) | Call::Renew(r) | Call::Lease(r) if cut && r == self.resource => {
                Err(StoreError::Timeout(Duration::from_secs(2)))
            }
            _ => Ok(()),
        }
    }

    async fn after(&self, call: support::faulty::Call<'_>) {
        if call == support::faulty::Call::Offer(self.resource) {
            self.offered
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// An offer whose withdrawal the store does not answer is given up, and
/// its seat fenced, a TTL after the seat was last proven held — as the
/// heartbeat fences any seat, which it cannot do here since the
/// withdrawal holds the seat's lock. Given up a TTL after the withdrawal
/// began instead, a giver cut off from the store stayed attached 7.4 s
/// after its successor attached (chaos soak seed 13637, a blackhole; the
/// bound is 6 s).
#[tokio::test(start_paused = true)]
async fn an_offer_whose_withdrawal_goes_unanswered_is_fenced_a_ttl_after_the_seat_was_last_renewed()
{
    use crewlet::seat::host::HandOff;
    let f = Fleet::new(Kind::Twin).await;
    let faults = CutOffAfterOffer {
        resource: "seat:s0",
        offered: Default::default(),
    };
    let (host, _) = bare_host_with(&f, Arc::new(TestHooks::default()), |store| {
        support::faulty::Faulty::wrap(store, faults) as Arc<dyn Store>
    })
    .await;
    host.claim("s0").await.unwrap();
    let renewed = tokio::time::Instant::now();
    host.heartbeat(TTL).await;
    assert!(host.may_start("s0").is_some(), "admitting once renewed");
    // Offered to a node that never takes it, with a bound under a TTL: the
    // withdrawal begins TTL / 2 after the last renewal.
    let offer = host.hand_off("s0", "nobody", DetachReason::Rebalance, TTL / 2, &|| {});
    let ended = tokio::time::timeout_at(renewed + TTL + BEAT / 10, offer)
        .await
        .expect("the seat is fenced within a TTL of its last renewal");
    assert!(matches!(ended, HandOff::Lost), "fenced, not withdrawn");
    assert!(host.held().is_empty(), "s0 is no longer held here");
}

/// Hooks for a hand-off with a turn in flight: the turn runs for `turn`,
/// looking at its fence as it goes (as a turn does before each round and
/// call), and the quiesce hook (the memory flush for the successor) notes
/// when it runs.
struct TurnAndFlush {
    turn: Duration,
    log: Arc<Mutex<Vec<String>>>,
    /// Told when the turn first finds its fence closed.
    fenced: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl SeatHooks for TurnAndFlush {
    async fn quiesce(&self, _s: &SeatContext) -> Result<(), HookError> {
        self.log.lock().unwrap().push("flush".into());
        Ok(())
    }
    /// A release's teardown: its memory flush lasts until the turn finds
    /// its fence closed, or one second: a fence closed before the flush is
    /// seen during it, one still open is not.
    async fn release(&self, _s: &SeatContext) -> Result<(), HookError> {
        self.log.lock().unwrap().push("flush".into());
        let _ = tokio::time::timeout(Duration::from_secs(1), self.fenced.notified()).await;
        self.log.lock().unwrap().push("flushed".into());
        Ok(())
    }
    fn inbox_handler(&self, _s: &SeatContext, fence: Fence) -> Arc<dyn Handler> {
        let (turn, log, told) = (self.turn, self.log.clone(), self.fenced.clone());
        handler_fn(move |_d: Delivery| {
            let (fence, log, told) = (fence.clone(), log.clone(), told.clone());
            async move {
                log.lock().unwrap().push("turn_start".into());
                let end = tokio::time::Instant::now() + turn;
                let mut fenced = false;
                while tokio::time::Instant::now() < end {
                    if !fenced && !fence.holds() {
                        fenced = true;
                        log.lock().unwrap().push("fenced".into());
                        told.notify_one();
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                log.lock().unwrap().push("turn_end".into());
                Disposition::Ack
            }
        })
    }
}

/// A bare host holding s0 with a turn of `turn` ([`TurnAndFlush`]) in
/// flight: the host, its queue, and what the turn and the flush log.
async fn a_turn_in_flight_on_s0(
    f: &Fleet,
    turn: Duration,
) -> (
    Arc<crewlet::seat::host::SeatHost>,
    Arc<dyn Queue>,
    Arc<Mutex<Vec<String>>>,
) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let hooks = Arc::new(TurnAndFlush {
        turn,
        log: log.clone(),
        fenced: Default::default(),
    });
    let (host, queue) = bare_host(f, hooks).await;
    host.claim("s0").await.unwrap();
    queue
        .publish(
            "crewlet.agent.s0.inbox",
            None,
            bytes::Bytes::from_static(b"work"),
        )
        .await
        .unwrap();
    let started = || log.lock().unwrap().iter().any(|l| l == "turn_start");
    f.until("the turn to start", TTL, started).await;
    (host, queue, log)
}

/// How seat s0 is given up in [`give_up_with_a_turn_in_flight`].
enum GivenUp {
    /// Offered to a node that never takes it (hand-off bound 1.5 s): the
    /// offer is withdrawn.
    HandedToNobody,
    /// Released for a role gone (`release_wait` one heartbeat, 1 s).
    Released,
}

/// Give seat s0 up as `how` with a turn of `turn` in flight; what the turn
/// and the flush logged, in order, once the turn ended.
async fn give_up_with_a_turn_in_flight(turn: Duration, how: GivenUp) -> Vec<String> {
    use crewlet::seat::host::HandOff;
    let f = Fleet::new(Kind::Twin).await;
    let (host, _, log) = a_turn_in_flight_on_s0(&f, turn).await;
    match how {
        GivenUp::HandedToNobody => {
            let handed = host
                .hand_off("s0", "nobody", DetachReason::Rebalance, TTL / 2, &|| {})
                .await;
            assert!(matches!(handed, HandOff::Withdrawn), "{handed:?}");
        }
        GivenUp::Released => host.release("s0", DetachReason::RoleGone).await,
    }
    let ended = || log.lock().unwrap().iter().any(|l| l == "turn_end");
    f.until("the turn to end", turn + TTL, ended).await;
    log.lock().unwrap().clone()
}

/// Spec § A seat's memory follows it: a graceful handoff loses none. A
/// turn in flight when a hand-off begins finishes before the memory is
/// flushed for the successor — the hand-off waits for it up to its own
/// bound, without the seat's lock (it used to wait one heartbeat under the
/// lock, then flush and offer with the turn still running: what the turn
/// wrote after the flush never reached the successor).
#[tokio::test(start_paused = true)]
async fn a_turn_in_flight_when_a_handoff_begins_finishes_before_the_successors_flush() {
    let log =
        give_up_with_a_turn_in_flight(Duration::from_millis(1200), GivenUp::HandedToNobody).await;
    assert_eq!(log, ["turn_start", "turn_end", "flush"]);
}

/// A turn that outruns the hand-off's bound is fenced at the flush (it is
/// deferred to the successor, which runs it again), never left to finish
/// after the flush with the fence still open until the take.
#[tokio::test(start_paused = true)]
async fn a_turn_still_running_past_the_handoffs_bound_is_fenced_at_the_flush() {
    let log = give_up_with_a_turn_in_flight(Duration::from_secs(10), GivenUp::HandedToNobody).await;
    assert_eq!(log, ["turn_start", "flush", "fenced", "turn_end"]);
}

/// A drain that reaches its bound lets the turn in flight finish and
/// settle before it drops the seat: cut between its effect and its
/// completion record, the mail runs again at the successor (chaos ci
/// profile under load: a rolling restart's drain reached its bound 0.1 s
/// after a turn posted its effect, and the successor ran its three
/// triggers again).
#[tokio::test(start_paused = true)]
async fn a_drain_at_its_bound_lets_the_turn_in_flight_finish_before_it_drops_the_seat() {
    let f = Fleet::new(Kind::Twin).await;
    let (host, queue, log) = a_turn_in_flight_on_s0(&f, Duration::from_millis(1200)).await;
    host.let_go_at_bound(TTL).await;
    assert_eq!(
        *log.lock().unwrap(),
        ["turn_start", "turn_end"],
        "the turn ran to its end before the seat was dropped"
    );
    assert!(host.held().is_empty(), "s0 is dropped");
    // Its mail was settled by the turn's answer: nothing comes back.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let handler = crewlet::queue::handler_fn(move |d: Delivery| {
        let _ = tx.send(d.seq);
        async { Disposition::Ack }
    });
    let _again = queue.attach("agent-s0", &[], handler).await.unwrap();
    assert!(
        tokio::time::timeout(TTL * 10, rx.recv()).await.is_err(),
        "the mail the turn answered is not delivered again"
    );
}

/// The same for a voluntary release (`handoff = "release"`, a role gone):
/// a turn still running past `release_wait` is fenced before the
/// teardown's memory flush begins, so nothing it writes during or after
/// that flush is a finished turn the next holder never hydrated (the fence
/// used to stay open until the flush had ended and the seat was dropped).
#[tokio::test(start_paused = true)]
async fn a_turn_still_running_past_a_voluntary_releases_wait_is_fenced_before_its_last_flush() {
    let log = give_up_with_a_turn_in_flight(Duration::from_secs(10), GivenUp::Released).await;
    assert_eq!(
        log,
        ["turn_start", "flush", "fenced", "flushed", "turn_end"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_claim_taken_while_a_drain_began_is_handed_straight_back() {
    let f = Fleet::new(Kind::Twin).await;
    let a = f.node("a", &[], &[]).await;
    a.engine.host().begin_drain();
    let got = a.engine.host().claim("x").await.unwrap();
    assert_eq!(got, crewlet::seat::host::Acquired::Draining);
    assert!(a.store.lease("seat:x").await.unwrap().is_none());
}

#[tokio::test(start_paused = true)]
async fn fleet_full_nodes_with_room_try_no_seat() {
    let f = Fleet::new(Kind::Twin).await;
    let company = roles("s", 3);
    let mut a = f.node("a", &[], &company).await;
    f.until("a holds 3", Duration::from_secs(10), || a.count() == 3)
        .await;
    let mut b = f.node("b", &[], &company).await;
    // b's share is 2; a gives one back per rebalance, then the fleet is
    // full for whoever has room: its passes say so and try nothing.
    f.until("a full fleet", Duration::from_secs(30), || {
        b.events().iter().any(|e| {
            matches!(
                e.event,
                Event::SeatSweep {
                    fleet_full: true,
                    ..
                }
            )
        }) || a.events().iter().any(|e| {
            matches!(
                e.event,
                Event::SeatSweep {
                    fleet_full: true,
                    ..
                }
            )
        })
    })
    .await;
    a.engine.drain().await;
    b.engine.drain().await;
}

// ---- NATS only: the store itself goes away ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_blip_keeps_the_seat_holds_its_inbox_and_the_next_renew_resumes_it() {
    let mut f = Fleet::new(Kind::Nats).await;
    f.ttl = Duration::from_secs(12);
    f.store_timeout = Duration::from_millis(500);
    let mut a = f.node("a", &[], &roles("s", 1)).await;
    // Held counts a seat still establishing: wait until it admits turns.
    f.until("a holds s0, attached", Duration::from_secs(10), || {
        a.engine.host().may_start("s0").is_some()
    })
    .await;
    let epoch = a.engine.host().may_start("s0").unwrap();
    f.server.as_mut().unwrap().kill();
    f.until("an unanswered renew", Duration::from_secs(10), || {
        a.events()
            .iter()
            .any(|e| matches!(e.event, Event::SeatRenewUnknown { .. }))
    })
    .await;
    // Kept, but deaf and not admitting: the blip says nothing about ownership.
    assert!(a.held().contains("s0"), "{:#?}", a.events());
    assert_eq!(a.engine.host().inbox_quiesced("s0"), Some(true));
    f.until("admission to refuse", Duration::from_secs(5), || {
        a.engine.host().may_start("s0").is_none()
    })
    .await;
    f.server.as_mut().unwrap().restart().await;
    // Both edges: the next successful renew lifts the hold.
    f.until(
        "the inbox to consume again",
        Duration::from_secs(20),
        || a.engine.host().inbox_quiesced("s0") == Some(false),
    )
    .await;
    assert_eq!(
        a.engine.host().may_start("s0"),
        Some(epoch),
        "the same tenure"
    );
    assert!(a.detached().is_empty(), "nothing was released over a blip");
    a.engine.drain().await;
}

#[tokio::test(start_paused = true)]
async fn a_teardown_still_failing_re_raises_its_alarm_every_twenty_heartbeats() {
    let f = Fleet::new(Kind::Twin).await;
    let hooks = Arc::new(TestHooks::default());
    hooks.failing_release.lock().unwrap().insert("s0".into());
    let mut a = f
        .node_with("a", &[], &roles("s", 1), hooks.clone(), 4)
        .await;
    f.until("a holds s0", Duration::from_secs(10), || a.count() == 1)
        .await;
    a.engine.host().release("s0", DetachReason::Rebalance).await;
    let still_unproven = |a: &mut TestNode| {
        a.events()
            .iter()
            .filter(|e| matches!(e.event, Event::SeatStillUnproven { .. }))
            .count()
    };
    f.until("two re-raised alarms", BEAT * 60, || {
        still_unproven(&mut a) >= 2
    })
    .await;
    let alarms: Vec<(u32, u64)> = a
        .events()
        .iter()
        .filter_map(|e| match &e.event {
            Event::SeatStillUnproven {
                attempts,
                elapsed_seconds,
                ..
            } => Some((*attempts, *elapsed_seconds)),
            _ => None,
        })
        .collect();
    assert_eq!(alarms.len(), 2, "once per twenty heartbeats: {alarms:?}");
    assert_eq!(alarms[0].0, 21);
    assert_eq!(alarms[1].0, 41);
    // Attempt 1 was the release itself; one retry per heartbeat since.
    assert!(
        alarms[0].1 >= 19 && alarms[1].1 >= 39,
        "the alarm carries the elapsed time: {alarms:?}"
    );
    let unproven = a.engine.host().status()[0].unproven_for.unwrap();
    assert!(
        unproven >= BEAT * 39,
        "the status carries the same duration: {unproven:?}"
    );
    hooks.failing_release.lock().unwrap().clear();
    a.engine.drain().await;
}

/// An undead seat whose lease goes (here given back under it, as a peer's
/// claim after a lapse would leave it) is no longer kept, and the bus says
/// so: `seat_undead_lost`, with how long its teardown had failed.
async fn an_undead_seat_whose_lease_is_lost_is_announced_as_seat_undead_lost(f: Fleet) {
    let hooks = Arc::new(TestHooks::default());
    hooks.failing_release.lock().unwrap().insert("s0".into());
    let mut a = f
        .node_with("a", &[], &roles("s", 1), hooks.clone(), 4)
        .await;
    f.until("a holds s0", Duration::from_secs(10), || a.count() == 1)
        .await;
    a.engine.host().release("s0", DetachReason::Rebalance).await;
    assert!(
        a.events()
            .iter()
            .any(|e| matches!(&e.event, Event::SeatReleaseUnproven { seat, .. } if seat == "s0")),
        "s0 is undead"
    );
    let lease = a.store.lease("seat:s0").await.unwrap().unwrap();
    a.store.release(&lease, &lease.owner).await.unwrap();
    let lost = |a: &mut TestNode| {
        a.events()
            .iter()
            .filter_map(|e| match &e.event {
                Event::SeatUndeadLost {
                    seat,
                    epoch,
                    attempts,
                    ..
                } => Some((seat.clone(), *epoch, *attempts)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    f.until("seat_undead_lost", BEAT * 10, || !lost(&mut a).is_empty())
        .await;
    let said = lost(&mut a);
    assert_eq!((said[0].0.as_str(), said[0].1), ("s0", lease.epoch));
    assert!(said[0].2 >= 1, "{said:?}");
    assert!(
        a.engine
            .host()
            .status()
            .iter()
            .all(|s| !(s.handle == "s0" && s.epoch == lease.epoch)),
        "that tenure is no longer kept (a later claim is a new one)"
    );
    hooks.failing_release.lock().unwrap().clear();
    a.engine.drain().await;
}

/// A restarted node's claims are established side by side: a pass's
/// claims (`claim_limit` of them) do not wait for each other's acquire
/// hooks — and never more than [`CLAIMS_AT_ONCE`] run at once, however
/// many the pass claims.
#[tokio::test(start_paused = true)]
async fn a_passs_claims_are_established_side_by_side_a_bounded_number_at_once() {
    use crewlet::seat::engine::CLAIMS_AT_ONCE;
    let f = Fleet::new(Kind::Twin).await;
    let hooks = Arc::new(TestHooks::default());
    let (open, gate) = tokio::sync::watch::channel(false);
    *hooks.hydration_gate.lock().unwrap() = Some(gate);
    // One pass may claim every seat: more than may be established at once.
    let seats = CLAIMS_AT_ONCE + 4;
    let a = f
        .node_built("a", &[], &roles("s", seats), hooks.clone(), 4, seats, |s| s)
        .await;
    f.until(
        "CLAIMS_AT_ONCE hydrations at once",
        Duration::from_secs(10),
        || hooks.hydrating.load(std::sync::atomic::Ordering::SeqCst) == CLAIMS_AT_ONCE,
    )
    .await;
    open.send_replace(true);
    f.until("a holds every seat", Duration::from_secs(60), || {
        a.count() == seats
            && a.held()
                .iter()
                .all(|s| a.engine.host().may_start(s).is_some())
    })
    .await;
    let most = hooks
        .most_hydrating
        .load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        most, CLAIMS_AT_ONCE,
        "a pass of {seats} claims established them side by side, never more than {CLAIMS_AT_ONCE} at once"
    );
    a.engine.drain().await;
}

/// The passes a pace that starts at `first` and doubles each pass takes
/// to move `total` seats: `first`, twice that, … and what is left.
fn doubling(first: usize, total: usize) -> Vec<usize> {
    let mut want = Vec::new();
    let (mut limit, mut left) = (first, total);
    while left > 0 {
        want.push(limit.min(left));
        left -= limit.min(left);
        limit *= 2;
    }
    want
}

/// Of `events`, each sweep's count that `of` reads, where it is not zero.
fn per_pass(events: &[FleetEvent], of: impl Fn(&Event) -> Option<usize>) -> Vec<usize> {
    events
        .iter()
        .filter_map(|e| of(&e.event).filter(|n| *n > 0))
        .collect()
}

/// Node `a`, started alone with `seats` seats, once it holds every one —
/// its events taken in as it waits (the bus keeps only so many).
async fn alone_holding_every_seat(f: &Fleet, seats: usize) -> TestNode {
    let mut a = f.node("a", &[], &roles("s", seats)).await;
    f.until("a holds every seat", SWEEP * 60, || {
        a.events();
        a.count() == seats
    })
    .await;
    a
}

/// A cold node claims every seat its share allows within a few passes,
/// whatever the seat count: a pass that won every claim it tried with free
/// seats left is followed soon by one allowed twice as many (the claim
/// pace, `seat::pace`) — not one `claim_limit` a sweep (⌈200 ÷ 4⌉ = 50
/// sweeps before).
#[tokio::test(start_paused = true)]
async fn a_cold_node_holds_every_seat_in_passes_that_double_their_claims_not_one_limit_a_sweep() {
    let f = Fleet::new(Kind::Twin).await;
    let seats = 200;
    let mut a = alone_holding_every_seat(&f, seats).await;
    let claiming = per_pass(a.events(), |e| match e {
        Event::SeatSweep { claimed, .. } => Some(*claimed),
        _ => None,
    });
    assert_eq!(a.missed, 0, "every event was seen");
    // 4, 8, 16, 32, 64 and the 76 left: six passes.
    assert_eq!(
        claiming,
        doubling(4, seats),
        "the passes that claimed, and how many each"
    );
    a.engine.drain().await;
}

/// A node joining a fleet whose one node holds every seat reaches its
/// share in a few passes whatever the count: the holder's pass that handed
/// over every seat it gave back, with excess left, is followed soon by one
/// allowed twice as many (the give-back pace, `seat::pace::next_release`)
/// — not two a sweep (⌈100 ÷ 2⌉ = 50 sweeps before).
#[tokio::test(start_paused = true)]
async fn a_joining_node_gets_its_share_in_passes_that_double_the_give_back_not_two_a_sweep() {
    let f = Fleet::new(Kind::Twin).await;
    let seats = 200;
    let mut a = alone_holding_every_seat(&f, seats).await;
    let before = a.events().len();
    let b = f.node("b", &[], &roles("s", seats)).await;
    f.until("a and b hold half each", SWEEP * 60, || {
        a.events();
        a.count() == seats / 2 && b.count() == seats / 2
    })
    .await;
    let giving = per_pass(&a.events()[before..], |e| match e {
        Event::SeatSweep { released, .. } => Some(*released),
        _ => None,
    });
    assert_eq!(a.missed, 0, "every event was seen");
    // 2, 4, 8, 16, 32 and the 38 left: six passes.
    assert_eq!(
        giving,
        doubling(2, seats / 2),
        "the passes that gave back, and how many each"
    );
    b.engine.drain().await;
    a.engine.drain().await;
}

/// Renewals of one lease that get no answer, from a switch the test flips.
struct RenewsUnanswered {
    resource: &'static str,
    on: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait::async_trait]
impl support::faulty::Faults for RenewsUnanswered {
    async fn before(&self, call: support::faulty::Call<'_>) -> Result<(), StoreError> {
        let on = self.on.load(std::sync::atomic::Ordering::SeqCst);
        if on && call == support::faulty::Call::Renew(self.resource) {
            return Err(StoreError::Timeout(Duration::from_secs(2)));
        }
        Ok(())
    }
}

/// A seat whose lease lapses while it is established (its renewals go
/// unanswered past the TTL, a peer claims it) is never attached there:
/// two attachments to one mailbox split its mail (chaos ci profile under
/// load: node-2 attached seat-30 at epoch 3 a third of a second after
/// node-1 had claimed it at epoch 4). It is let go as `grace_expired`.
#[tokio::test(start_paused = true)]
async fn a_seat_whose_lease_lapses_while_it_is_established_is_never_attached_there() {
    let f = Fleet::new(Kind::Twin).await;
    let hooks = Arc::new(TestHooks::default());
    let (open, gate) = tokio::sync::watch::channel(false);
    *hooks.hydration_gate.lock().unwrap() = Some(gate);
    let unanswered = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let faults = RenewsUnanswered {
        resource: "seat:s0",
        on: unanswered.clone(),
    };
    let company = roles("s", 1);
    let mut a = f
        .node_built("a", &[], &company, hooks.clone(), 4, 4, |store| {
            support::faulty::Faulty::wrap(store, faults)
        })
        .await;
    f.until("a establishing s0", Duration::from_secs(10), || {
        hooks.hydrating.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    unanswered.store(true, std::sync::atomic::Ordering::SeqCst);
    // A peer claims s0 as soon as a's lease lapses.
    let taken = peer_claims_s0_once_it_lapses(&a.store).await;
    open.send_replace(true);
    f.until("a lets s0 go", Duration::from_secs(30), || {
        !a.detached().is_empty()
    })
    .await;
    assert_eq!(
        a.detached(),
        [("s0".to_string(), DetachReason::GraceExpired)]
    );
    let attached: Vec<u64> = a
        .events()
        .iter()
        .filter_map(|e| match &e.event {
            Event::SeatAttached { seat, epoch } if seat == "s0" => Some(*epoch),
            _ => None,
        })
        .collect();
    assert!(
        attached.is_empty(),
        "a attached s0 at epochs {attached:?} after the peer claimed it at {}",
        taken.epoch
    );
    let lease = a.store.lease("seat:s0").await.unwrap().unwrap();
    assert_eq!(
        (lease.owner.as_str(), lease.epoch),
        ("peer#1", taken.epoch),
        "the peer's tenure stands"
    );
    a.engine.drain().await;
}

/// A drain whose seats' teardowns are slow (each release hook — killing
/// the agent's children, flushing its memory to a store at the edge of its
/// timeout — takes 1.9 s) ends within its bound (the TTL, or the offering
/// time and one hand-off when those are longer) whatever the seats held:
/// what it could not let go by then is abandoned, and a peer holds every
/// seat once those leases lapse — nothing held twice, nothing lost (three
/// nodes of 1,000 seats stopped as their server went away: the last
/// exited after 87 s, its seats let go four at a time).
#[tokio::test(start_paused = true)]
async fn a_drain_of_slow_teardowns_ends_within_its_bound_whatever_the_seats_held() {
    let f = Fleet::new(Kind::Twin).await;
    let company = roles("s", 60);
    let hooks = Arc::new(TestHooks::default());
    let a = f
        .node_built("a", &[], &company, hooks.clone(), 4, 60, |store| store)
        .await;
    f.until("a to hold all 60", Duration::from_secs(60), || {
        a.count() == 60
    })
    .await;
    hooks
        .slow_release
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let began = tokio::time::Instant::now();
    a.engine.drain().await;
    let took = began.elapsed();
    // The offering time (twice the hand-off's bound) and one hand-off,
    // longer here than the suite's 3 s TTL.
    let handoff = crewlet::seat::engine::HandoffSettings::default().timeout;
    let bound = TTL.max(handoff * 3);
    assert_eq!(crewlet::seat::engine::drain_bound(TTL, handoff), bound);
    // Letting 60 seats go four at a time, each teardown 1.9 s: a drain
    // without its bound takes half a minute here. Past the bound the
    // teardowns under way end (one hand-off's time at most) and turns in
    // flight get one more.
    assert!(
        took <= bound + handoff * 2,
        "the drain took {took:?}, its bound is {bound:?}"
    );
    let log = hooks.log.lock().unwrap().clone();
    let begun = log.iter().filter(|l| l.ends_with(":release")).count();
    let ended = log.iter().filter(|l| l.ends_with(":release_done")).count();
    assert!(
        begun > 0 && begun < 60,
        "some seats were released before the bound: {begun}"
    );
    assert_eq!(begun, ended, "no teardown under way was cut at the bound");
    assert_eq!(a.count(), 0, "the drained node runs no seat");
    let b = f.node("b", &[], &company).await;
    f.until("b to hold every seat", Duration::from_secs(120), || {
        b.count() == 60
    })
    .await;
    b.engine.drain().await;
}

/// A peer (`peer#1`) claims `seat:s0` as soon as the store lets it: once
/// the holder's tenure lapsed.
async fn peer_claims_s0_once_it_lapses(store: &Arc<dyn Store>) -> Lease {
    let peer = ClaimRequest::new("seat:s0", "peer#1", "peer");
    support::wait_for(
        "the holder's lease to lapse and the peer's claim to win",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || async {
            match store.claim(peer.clone()).await.unwrap() {
                Claim::Won(l) => Some(l),
                _ => None,
            }
        },
    )
    .await
}

/// The giver's second `Offer` call on `resource` (the first makes the
/// offer, the second withdraws it) is answered `delay` after the store
/// applied it, and from then on every renewal of `resource` goes
/// unanswered.
struct LateWithdrawal {
    resource: &'static str,
    delay: Duration,
    offers: std::sync::atomic::AtomicUsize,
    unanswered: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl support::faulty::Faults for LateWithdrawal {
    async fn before(&self, call: support::faulty::Call<'_>) -> Result<(), StoreError> {
        let off = self.unanswered.load(std::sync::atomic::Ordering::SeqCst);
        if off && call == support::faulty::Call::Renew(self.resource) {
            return Err(StoreError::Timeout(Duration::from_secs(2)));
        }
        Ok(())
    }

    async fn after(&self, call: support::faulty::Call<'_>) {
        if call != support::faulty::Call::Offer(self.resource) {
            return;
        }
        let n = self
            .offers
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        if n == 2 {
            self.unanswered
                .store(true, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
        }
    }
}

/// A withdrawal renews the tenure from when it was sent: its write may
/// land long before its answer comes back, and the store counts the
/// tenure from the write. Counted from the answer instead, the giver went
/// on admitting turns after its lease had lapsed and a peer had claimed
/// the seat (chaos ci profile, 2.9.10: a turn started 4.9 s after a newer
/// epoch was claimed).
#[tokio::test(start_paused = true)]
async fn a_withdrawn_offer_counts_the_seat_held_from_when_the_withdrawal_was_sent() {
    let f = Fleet::new(Kind::Twin).await;
    let faults = LateWithdrawal {
        resource: "seat:s0",
        delay: TTL - BEAT / 2,
        offers: Default::default(),
        unanswered: Default::default(),
    };
    let company = roles("s", 1);
    let mut a = f
        .node_built(
            "a",
            &[],
            &company,
            Arc::new(TestHooks::default()),
            4,
            4,
            |store| support::faulty::Faulty::wrap(store, faults),
        )
        .await;
    f.until("a holds s0", Duration::from_secs(10), || a.count() == 1)
        .await;
    let b = f.node("b", &[], &company).await;
    presence_live(&f, &a.store, "b").await;
    // b does not take the offer: it is withdrawn when its bound runs out.
    move_s0_to_b_behind_an_older_presence(&a.store).await;
    f.until(
        "the offer to b to be withdrawn",
        Duration::from_secs(60),
        || {
            a.events()
                .iter()
                .any(|e| matches!(&e.event, Event::SeatOfferWithdrawn { seat, .. } if seat == "s0"))
        },
    )
    .await;
    // The withdrawal's answer came TTL − half a beat after its write, and
    // no renewal is answered since: a peer claims s0 once the store's
    // tenure lapses.
    let taken = peer_claims_s0_once_it_lapses(&a.store).await;
    assert_eq!(
        a.engine.host().may_start("s0"),
        None,
        "a admits turns on s0 after the peer claimed it at epoch {}",
        taken.epoch
    );
    a.engine.drain().await;
    drop(b);
}

/// An acquire hook slower than the lease TTL (a hydration held up, as
/// under load) loses nothing: the heartbeat renews the seat being
/// established without the lock its claim holds, and goes on renewing
/// every other seat of the node meanwhile. (A heartbeat pass that waited
/// on the establishing seat's lock once left every other seat of its node
/// unrenewed past the TTL, fenced as `grace_expired`, pass after pass.)
#[tokio::test(start_paused = true)]
async fn an_establishment_longer_than_the_ttl_loses_neither_its_seat_nor_any_other() {
    let f = Fleet::new(Kind::Twin).await;
    let hooks = Arc::new(TestHooks::default());
    let mut a = f
        .node_with("a", &[], &roles("s", 2), hooks.clone(), 4)
        .await;
    f.until(
        "a holds and admits s0 and s1",
        Duration::from_secs(10),
        || {
            a.count() == 2
                && a.held()
                    .iter()
                    .all(|s| a.engine.host().may_start(s).is_some())
        },
    )
    .await;
    let before = a.events().len();
    let (open, gate) = tokio::sync::watch::channel(false);
    *hooks.hydration_gate.lock().unwrap() = Some(gate);
    company::apply(&*a.store, "Test company", &roles("s", 3))
        .await
        .unwrap();
    f.until("s2 hydrating", Duration::from_secs(10), || {
        hooks.hydrating.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    // Three TTLs inside s2's acquire hook: the sleep proves an absence
    // (no seat fenced, s0 and s1 still admitted), not a condition.
    tokio::time::sleep(TTL * 3).await;
    for s in ["s0", "s1"] {
        assert!(
            a.engine.host().may_start(s).is_some(),
            "{s} is still admitted while s2 establishes"
        );
    }
    open.send_replace(true);
    f.until("a holds and admits s2", Duration::from_secs(10), || {
        a.count() == 3 && a.engine.host().may_start("s2").is_some()
    })
    .await;
    let detached: Vec<String> = a.events()[before..]
        .iter()
        .filter_map(|e| match &e.event {
            Event::SeatDetached { seat, reason, .. } => Some(format!("{seat} ({reason:?})")),
            _ => None,
        })
        .collect();
    assert!(detached.is_empty(), "seats lost meanwhile: {detached:?}");
    a.engine.drain().await;
}

#[tokio::test(start_paused = true)]
async fn many_revisions_in_one_interval_bring_at_most_one_pass_forward() {
    let f = Fleet::new(Kind::Twin).await;
    // A limit the early pass's claims fit in: a pass cut by its limit
    // brings its own follow-up forward (the claim pace), revisions or not.
    let hooks = Arc::new(TestHooks::default());
    let mut a = f
        .node_built("a", &[], &roles("s", 1), hooks, 4, 8, |s| s)
        .await;
    f.until("a holds s0", Duration::from_secs(10), || a.count() == 1)
        .await;
    // Mid-interval, five applies in a row, each adding a role.
    tokio::time::sleep(SWEEP * 3 + Duration::from_millis(300)).await;
    a.events();
    let before = a.seen.len();
    for n in 2..=6 {
        company::apply(&*a.store, "Test company", &roles("s", n))
            .await
            .unwrap();
    }
    // Absence over most of one interval: only one early pass ran.
    tokio::time::sleep(SWEEP - Duration::from_millis(100)).await;
    let sweeps = a.events()[before..]
        .iter()
        .filter(|e| matches!(e.event, Event::SeatSweep { .. }))
        .count();
    assert_eq!(sweeps, 1, "one early pass, however many revisions arrived");
    assert_eq!(a.count(), 6, "the early pass claimed the new seats");
    a.engine.drain().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_emitted_on_one_node_reaches_every_peers_bus_once() {
    let server = support::nats::NatsServer::start().await;
    let tasks = Tasks::new();
    let a = EventBus::new("a", "a:1");
    let b = EventBus::new("b", "b:1");
    for bus in [&a, &b] {
        let client = async_nats::connect(server.url()).await.unwrap();
        bus.connect_fleet(client, &tasks).await.unwrap();
    }
    let mut at_b = b.subscribe();
    let mut at_a = a.subscribe();
    // The subscriptions are live once a round trip has passed; retry the
    // emit until b hears it (condition with a deadline).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let got = loop {
        a.emit(Event::SeatClaimed {
            seat: "x".into(),
            epoch: 9,
            claim_ms: 0,
        });
        if let Ok(Ok(e)) = tokio::time::timeout(Duration::from_millis(200), at_b.recv()).await {
            break e;
        }
        assert!(tokio::time::Instant::now() < deadline, "b never heard a");
    };
    assert_eq!(got.node, "a");
    assert_eq!(
        got.event,
        Event::SeatClaimed {
            seat: "x".into(),
            epoch: 9,
            claim_ms: 0,
        }
    );
    // a's own subscribers hear it from a, never echoed back from the fleet.
    let mut own = 0;
    while let Ok(e) = at_a.try_recv() {
        assert_eq!(e.incarnation, "a:1");
        own += 1;
    }
    assert!(own >= 1);
    tasks.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_is_a_fenced_release_and_nothing_is_given_back_twice() {
    let f = Fleet::new(Kind::Twin).await;
    let mut a = f.node("a", &[], &roles("s", 1)).await;
    f.until("a holds s0", Duration::from_secs(10), || a.count() == 1)
        .await;
    // The tenure ends behind the host's back (as a lapse and a peer's
    // claim would end it): the next renew answers Lost.
    let lease = a.store.lease("seat:s0").await.unwrap().unwrap();
    a.store.release(&lease, &lease.owner).await.unwrap();
    f.until("the lost seat detached", Duration::from_secs(10), || {
        a.detached()
            .iter()
            .any(|(s, r)| s == "s0" && *r == DetachReason::Lost)
    })
    .await;
    // It is claimed again under a new epoch, never renewed under the old.
    f.until("s0 claimed again", Duration::from_secs(10), || {
        a.count() == 1
    })
    .await;
    let again = a.store.lease("seat:s0").await.unwrap().unwrap();
    assert!(
        again.epoch > lease.epoch,
        "{} then {}",
        lease.epoch,
        again.epoch
    );
    a.engine.drain().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_gone_for_longer_than_the_ttl_fences_the_seat_as_grace_expired() {
    let mut f = Fleet::new(Kind::Nats).await;
    f.store_timeout = Duration::from_millis(500);
    let mut a = f.node("a", &[], &roles("s", 1)).await;
    // Attached, not only claimed: a store killed while the acquire hook
    // still attaches the inbox fails the hook (`hook_failed`), which is
    // not what this test is about (seen under load).
    f.until("a admits turns on s0", Duration::from_secs(10), || {
        a.engine.host().may_start("s0").is_some()
    })
    .await;
    f.server.as_mut().unwrap().kill();
    // Past the TTL no renew has proven anything: a peer may hold the seat
    // now, so this node detaches first and abandons what is in flight.
    f.until("the seat fenced", TTL * 4, || {
        a.detached()
            .iter()
            .any(|(s, r)| s == "s0" && *r == DetachReason::GraceExpired)
    })
    .await;
    assert_eq!(a.count(), 0);
    assert_eq!(a.engine.host().may_start("s0"), None);
    f.server.as_mut().unwrap().restart().await;
    a.engine.crash().await;
}

/// Every `seat_offer_taken` a node has seen: (seat, epoch, from_epoch).
fn takes(n: &mut TestNode) -> Vec<(String, u64, u64)> {
    n.events()
        .iter()
        .filter_map(|e| match &e.event {
            Event::SeatOfferTaken {
                seat,
                epoch,
                from_epoch,
                ..
            } => Some((seat.clone(), *epoch, *from_epoch)),
            _ => None,
        })
        .collect()
}

async fn drain_hands_every_seat_to_a_successor_that_takes_it_while_it_is_held(f: Fleet) {
    let company = roles("s", 4);
    let mut a = f.node("a", &[], &company).await;
    let mut b = f.node("b", &[], &company).await;
    f.until("a 2/2 split", Duration::from_secs(30), || {
        a.count() == 2 && b.count() == 2
    })
    .await;
    let mine: BTreeMap<String, u64> = a
        .engine
        .host()
        .status()
        .into_iter()
        .map(|s| (s.handle, s.epoch))
        .collect();
    let seen_before = a.events().len();
    a.engine.drain().await;
    assert_eq!(a.count(), 0);
    f.until("b to hold everything", Duration::from_secs(20), || {
        b.count() == 4
    })
    .await;
    let offered: Vec<String> = a.events()[seen_before..]
        .iter()
        .filter_map(|e| match &e.event {
            Event::SeatOffered {
                seat, to, reason, ..
            } => {
                assert_eq!((to.as_str(), *reason), ("b", DetachReason::Drain));
                Some(seat.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        offered.iter().cloned().collect::<BTreeSet<_>>(),
        mine.keys().cloned().collect::<BTreeSet<_>>(),
        "every seat of the draining node is offered to the successor"
    );
    // Each was taken from the giver's own tenure: the next epoch, minted
    // while the giver held it — never claimed after a release or a lapse.
    let taken = takes(&mut b);
    for (seat, epoch) in &mine {
        assert!(
            taken
                .iter()
                .any(|(s, e, from)| s == seat && from == epoch && *e == epoch + 1),
            "{seat} at epoch {epoch} was not taken from its giver: {taken:?}"
        );
    }
    b.engine.drain().await;
}

async fn a_rebalance_hands_seats_to_the_joiner_through_an_offer(f: Fleet) {
    let company = roles("s", 4);
    let a = f.node("a", &[], &company).await;
    f.until("a to hold everything", Duration::from_secs(30), || {
        a.count() == 4
    })
    .await;
    let mut b = f.node("b", &[], &company).await;
    f.until("a 2/2 split", Duration::from_secs(30), || {
        a.count() == 2 && b.count() == 2
    })
    .await;
    let taken = takes(&mut b);
    assert_eq!(
        taken.len(),
        2,
        "the joiner's seats came by offers, not claims of released seats: {taken:?}"
    );
    assert!(taken.iter().all(|(_, e, from)| *e == from + 1));
    a.engine.drain().await;
    b.engine.drain().await;
}

async fn a_successor_stuck_mid_prepare_leaves_the_giver_to_resume_with_no_gap(f: Fleet) {
    let company = roles("s", 2);
    let mut a = f.node("a", &[], &company).await;
    f.until("a to hold everything", Duration::from_secs(30), || {
        a.count() == 2
    })
    .await;
    let before: BTreeMap<String, u64> = a
        .engine
        .host()
        .status()
        .into_iter()
        .map(|s| (s.handle, s.epoch))
        .collect();
    let hooks = Arc::new(TestHooks::default());
    hooks
        .stuck_hydration
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let b = f
        .node_with("b", &[], &company, hooks, crewlet::config::PROTOCOL)
        .await;
    let withdrawn = |a: &mut TestNode| -> Vec<(String, u64)> {
        a.events()
            .iter()
            .filter_map(|e| match &e.event {
                Event::SeatOfferWithdrawn { seat, epoch, .. } => Some((seat.clone(), *epoch)),
                _ => None,
            })
            .collect()
    };
    f.until(
        "the giver to withdraw its offer",
        Duration::from_secs(30),
        || !withdrawn(&mut a).is_empty(),
    )
    .await;
    b.engine.crash().await;
    let (seat, epoch) = withdrawn(&mut a)[0].clone();
    assert_eq!(
        before.get(&seat),
        Some(&epoch),
        "the same tenure throughout"
    );
    // From the offer to its withdrawal the giver held and never detached
    // the seat: quiesced, then resumed — no moment without a holder. (What
    // its next pass does with no other successor is a plain release.)
    let events = a.events().to_vec();
    let offered_at = events
        .iter()
        .position(|e| matches!(&e.event, Event::SeatOffered { seat: s, .. } if *s == seat))
        .expect("the seat was offered");
    let withdrawn_at = events
        .iter()
        .position(|e| matches!(&e.event, Event::SeatOfferWithdrawn { seat: s, .. } if *s == seat))
        .expect("the offer was withdrawn");
    assert!(offered_at < withdrawn_at);
    assert!(
        !events[..withdrawn_at]
            .iter()
            .any(|e| matches!(&e.event, Event::SeatDetached { seat: s, .. } if *s == seat)),
        "the seat never left the giver before the withdrawal"
    );
    a.engine.drain().await;
}

async fn a_giver_that_dies_mid_handoff_is_replaced_after_the_ttl(f: Fleet) {
    let company = roles("s", 2);
    let a = f.node("a", &[], &company).await;
    f.until("a to hold everything", Duration::from_secs(30), || {
        a.count() == 2
    })
    .await;
    let hooks = Arc::new(TestHooks::default());
    hooks
        .stuck_hydration
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let mut b = f
        .node_with("b", &[], &company, hooks.clone(), crewlet::config::PROTOCOL)
        .await;
    // Wait for an offer to b to stand on a lease, then the giver dies.
    let store = a.store.clone();
    let mut offered: Option<Lease> = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while offered.is_none() {
        assert!(tokio::time::Instant::now() < deadline, "no offer was made");
        for h in ["s0", "s1"] {
            if let Ok(Some(l)) = store.lease(&format!("seat:{h}")).await
                && l.offer.as_ref().is_some_and(|o| o.to == "b")
            {
                offered = Some(l);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let offered = offered.unwrap();
    a.engine.crash().await;
    // Nothing takes the seat from the dead giver until its lease lapses.
    f.until_async(
        "the dead giver's lease to lapse",
        Duration::from_secs(30),
        || {
            let store = store.clone();
            let key = offered.resource.clone();
            async move { matches!(store.lease(&key).await, Ok(None)) }
        },
    )
    .await;
    // The successor never took it; it claims the seat, at a newer epoch.
    hooks
        .stuck_hydration
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let seat = offered.resource.trim_start_matches("seat:").to_string();
    f.until("b to hold the seat", Duration::from_secs(30), || {
        b.held().contains(&seat)
    })
    .await;
    let now = b
        .store
        .lease(&offered.resource)
        .await
        .unwrap()
        .expect("held");
    assert!(now.epoch > offered.epoch);
    assert!(
        now.acquired_at >= offered.expires_at,
        "claimed only after the giver's lease lapsed"
    );
    assert!(
        !takes(&mut b).iter().any(|(s, _, _)| *s == seat),
        "a lapsed offer is never taken"
    );
    b.engine.drain().await;
}

async fn a_person_moves_a_seat_to_a_named_node_through_an_offer(f: Fleet) {
    let company = roles("s", 4);
    let mut a = f.node("a", &[], &company).await;
    let mut b = f.node("b", &[], &company).await;
    f.until("a 2/2 split", Duration::from_secs(30), || {
        a.count() == 2 && b.count() == 2
    })
    .await;
    let seat = a.held().into_iter().next().unwrap();
    // The target must be a live node in the store's roster (a loaded
    // machine can renew b's presence late).
    presence_live(&f, &a.store, "b").await;
    let req = crewlet::seat::moves::request(&*a.store, &seat, "b", "op", "closer to its data")
        .await
        .expect("the move is accepted");
    assert_eq!(req.to, "b");
    // Asking again for the node that already runs it is refused, naming it.
    // Held also counts a take still establishing: wait for the take itself.
    f.until(
        "b to take the moved seat through the live holder's offer",
        Duration::from_secs(30),
        || takes(&mut b).iter().any(|(s, _, _)| *s == seat),
    )
    .await;
    assert!(b.held().contains(&seat));
    f.until(
        "the giver to detach it as moved",
        Duration::from_secs(10),
        || a.detached().contains(&(seat.clone(), DetachReason::Moved)),
    )
    .await;
    // b's presence may lapse between the check and the request on a busy
    // machine (a renewal late): ask again while the store says it does not
    // know b, within a deadline.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let again = loop {
        presence_live(&f, &a.store, "b").await;
        let r = crewlet::seat::moves::request(&*a.store, &seat, "b", "op", "again").await;
        if !matches!(r, Err(crewlet::seat::moves::MoveError::UnknownNode(_)))
            || tokio::time::Instant::now() >= deadline
        {
            break r;
        }
    };
    assert!(
        matches!(
            again,
            Err(crewlet::seat::moves::MoveError::AlreadyThere { .. })
        ),
        "{again:?}"
    );
    a.engine.drain().await;
    b.engine.drain().await;
}

async fn a_holder_whose_presence_lapsed_is_never_robbed_and_the_target_claims_once_its_lease_lapses(
    f: Fleet,
) {
    let company = roles("s", 1);
    let (store, _) = f.backends("ghost").await;
    company::apply(&*store, "Test company", &company)
        .await
        .unwrap();
    // A holder with no presence row (its node's presence lapsed) still
    // renewing its seat lease.
    let mut held = match store
        .claim(ClaimRequest::new("seat:s0", "ghost:1", "ghost"))
        .await
        .unwrap()
    {
        Claim::Won(l) => l,
        other => panic!("the ghost should win the seat, got {other:?}"),
    };
    let b = f.node("b", &[], &company).await;
    let roster = store.clone();
    f.until_async("b's presence", Duration::from_secs(30), || {
        let roster = roster.clone();
        async move {
            roster
                .list("node:")
                .await
                .is_ok_and(|l| l.iter().any(|p| p.resource == "node:b"))
        }
    })
    .await;
    crewlet::seat::moves::request(&*store, "s0", "b", "op", "its node is gone")
        .await
        .expect("the move is accepted");
    // Proof of an absence: for three TTLs of renewals the target takes
    // nothing from the live lease.
    let until = tokio::time::Instant::now() + 3 * f.ttl;
    while tokio::time::Instant::now() < until {
        tokio::time::sleep(BEAT / 2).await;
        held = match store.renew(&held, "ghost:1", None).await {
            Renewal::Renewed(l) => l,
            other => panic!("the ghost's renewal should land, got {other:?}"),
        };
        assert!(!b.held().contains("s0"), "a live lease was robbed");
    }
    // The holder stops renewing: the target claims the seat once the lease
    // has lapsed, at a newer epoch, and the request is done.
    f.until("b to hold s0", Duration::from_secs(30), || {
        b.held().contains("s0")
    })
    .await;
    let now = store.lease("seat:s0").await.unwrap().expect("held");
    assert!(now.epoch > held.epoch);
    assert!(
        now.acquired_at >= held.expires_at,
        "claimed only after the lapse"
    );
    let s = store.clone();
    f.until_async(
        "the request to be finished",
        Duration::from_secs(30),
        || {
            let s = s.clone();
            async move {
                crewlet::seat::moves::standing(&*s)
                    .await
                    .is_ok_and(|m| m.is_empty())
            }
        },
    )
    .await;
    b.engine.drain().await;
}
