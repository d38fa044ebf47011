//! The seat engine's loops: presence, the heartbeat, and the sweep that
//! turns the placement plan into claims and releases.
//!
//! Every `heartbeat` the node renews its presence (`node:{id}`, carrying
//! labels, roles, protocol, `seats_held`, `seats_withdrawn`, draining,
//! behind) and every seat lease it holds. Every `sweep` it reads the live
//! presence rows and seat leases, asks [`placement::plan`] what to do, gives
//! back what the plan says, and claims — judging the protocol gate (no
//! claims while a live presence or seat lease is held at a lower protocol)
//! before each claim of a seat it believes free. A config apply that
//! changes the seats brings one pass forward, at most once per interval.
//! Every loop beats the watchdog; all of them are owned by one [`Tasks`].
//!
//! One file a loop: `presence` (the heartbeat), `sweep` (the pass),
//! `offers` (hand-overs, moves, give-backs), `drain`. This file holds the
//! engine, its settings and what the loops share.

mod drain;
pub use drain::drain_bound;
mod loops;
mod offers;
mod presence;
mod snapshot;
mod sweep;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::host::{SeatHooks, SeatHost};
use super::placement::{Presence, SeatSpec};
use crate::company::Company;
use crate::coord::{Lease, Store};
use crate::events::EventBus;
use crate::queue::{Queue, QueueSettings, boot_walk};
use crate::tasks::Tasks;
use crate::watchdog::Watchdog;

/// How the engine runs.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub node_id: String,
    pub owner: String,
    pub labels: Vec<String>,
    pub protocol: u32,
    pub heartbeat: Duration,
    pub sweep: Duration,
    pub claim_limit: usize,
    pub release_limit: usize,
    pub release_wait: Duration,
    pub queue: QueueSettings,
    pub handoff: HandoffSettings,
}

/// How a voluntary move happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandoffSettings {
    /// Offer the seat to a successor first (the two-phase handoff); when
    /// false, every move is a release and a claim.
    pub two_phase: bool,
    /// How long an offer stands before the giver withdraws it and resumes.
    pub timeout: Duration,
}

impl Default for HandoffSettings {
    fn default() -> Self {
        HandoffSettings {
            two_phase: true,
            timeout: Duration::from_secs(5),
        }
    }
}

/// A successor that let an offer lapse is not offered that seat again for
/// this long.
const REFUSED_FOR: Duration = Duration::from_secs(30);
/// Offers a draining node makes at once.
const DRAIN_HANDOFFS: usize = 4;

/// How many of one pass's claims are made and established side by side
/// (each seat's acquire hook is its own: hydration, attachments).
pub const CLAIMS_AT_ONCE: usize = 8;

impl EngineConfig {
    pub fn from_config(c: &crate::config::Config, owner: &str) -> EngineConfig {
        EngineConfig {
            node_id: c.node.id.clone(),
            owner: owner.to_string(),
            labels: c.node.labels.clone(),
            protocol: crate::config::protocol(),
            heartbeat: Duration::from_secs(c.coordination.heartbeat_seconds),
            sweep: Duration::from_secs(c.coordination.sweep_seconds),
            claim_limit: c.coordination.claim_limit as usize,
            release_limit: c.coordination.release_limit as usize,
            release_wait: Duration::from_secs(c.coordination.heartbeat_seconds),
            queue: QueueSettings {
                max_deliveries: c.stream.max_deliveries,
                ack_wait: Duration::from_secs(c.stream.ack_wait_seconds),
            },
            handoff: HandoffSettings {
                two_phase: c.coordination.handoff == crate::config::HandoffMode::TwoPhase,
                timeout: Duration::from_millis(c.coordination.handoff_timeout_ms),
            },
        }
    }
}

/// What one executed step of a pass came to.
enum Done {
    Released,
    Claimed,
    Nothing,
    /// A drain began: no more claims.
    StopClaims,
    /// A claim found its seat free and the protocol gate shut at this
    /// floor: no more claims this pass (every other would be refused the
    /// same way).
    Gated(u32),
}

/// The seat engine of one node.
pub struct SeatEngine {
    cfg: EngineConfig,
    store: Arc<dyn Store>,
    queue: Arc<dyn Queue>,
    host: SeatHost,
    events: EventBus,
    company: watch::Receiver<Company>,
    presence: tokio::sync::Mutex<Option<Lease>>,
    /// True once this incarnation's presence has been recorded.
    presence_recorded: watch::Sender<bool>,
    early: Notify,
    tasks: Tasks,
    watchdog: Watchdog,
    last_unplaceable: Mutex<Vec<String>>,
    /// The protocol floor that refused this node's last claim, while it
    /// still wants to claim.
    claims_blocked_by: Mutex<Option<u32>>,
    behind: std::sync::atomic::AtomicBool,
    withdrawn: std::sync::atomic::AtomicBool,
    /// Free seats left to a better-ranked node, passes in a row.
    deferred: Mutex<BTreeMap<String, u32>>,
    /// Seats this node claimed and could not establish: passes left for
    /// which it leaves them to a peer.
    handed_back: Mutex<BTreeMap<String, u32>>,
    /// seat → (node that let an offer of it lapse, until when it is not
    /// offered that seat again).
    refused: Mutex<BTreeMap<String, (String, Instant)>>,
    /// The node ids on the roster the last pass read (how a presence that
    /// lapsed since is told from one never seen).
    roster_seen: Mutex<BTreeSet<String>>,
    /// Free seats the last pass left for a recheck (each gets one).
    rechecked: Mutex<BTreeSet<String>>,
    /// How many seats the next pass may claim ([`crate::seat::pace`]).
    claim_pace: std::sync::atomic::AtomicUsize,
    /// The next pass's release limit (`seat::pace::next_release`).
    release_pace: std::sync::atomic::AtomicUsize,
    /// When an earlier incarnation's presence under this node id lapses:
    /// the heartbeat claims the row then rather than a beat later.
    presence_free_at: Mutex<Option<Instant>>,
    /// The kept first-seen times of the node ids ([`ranking::seen`]),
    /// read again when a live node appears that it does not name.
    seen: Mutex<BTreeMap<String, crate::coord::StoreTime>>,
    /// This node's own first-seen time is kept in the store.
    seen_kept: std::sync::atomic::AtomicBool,
}

/// How long after an earlier incarnation's presence lapses this node
/// claims the row (the store's clock and this node's differ a little).
const PRESENCE_LAPSE_MARGIN: Duration = Duration::from_millis(50);

/// The company's seats as placement sees them (no preference read yet).
fn seat_specs(company: &Company) -> Vec<SeatSpec> {
    company
        .roles
        .iter()
        .map(|r| SeatSpec {
            handle: r.handle.clone(),
            placement: r.placement.clone(),
            preferred: None,
        })
        .collect()
}

/// Each presence lease's node id with when its presence began (what the
/// node order ranks newcomers by).
fn first_seen(presence: &[Lease]) -> Vec<(String, crate::coord::StoreTime)> {
    presence
        .iter()
        .filter_map(|l| {
            l.resource
                .strip_prefix("node:")
                .map(|id| (id.to_string(), l.acquired_at))
        })
        .collect()
}

fn presence_of(lease: &Lease) -> Option<Presence> {
    let node_id = lease.resource.strip_prefix("node:")?.to_string();
    let m = &lease.metadata;
    let labels = m
        .get("labels")
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    Some(Presence {
        node_id,
        labels,
        withdrawn: m
            .get("seats_withdrawn")
            .and_then(|v| v.as_bool())
            .unwrap_or(false),
        seats_held: m
            .get("seats_held")
            .and_then(|v| v.as_u64())
            .map(|n| n as u32),
    })
}

/// Memory reads ask the seat engine where a seat stands here.
impl crate::memory::memread::Holdings for SeatEngine {
    fn node_id(&self) -> &str {
        &self.config().node_id
    }

    fn incarnation(&self) -> &str {
        &self.config().owner
    }

    fn held_here(&self, handle: &str) -> Option<crate::memory::memread::HeldHere> {
        use crate::memory::memread::HeldHere;
        let s = self
            .host()
            .status()
            .into_iter()
            .find(|s| s.handle == handle)?;
        Some(match s.phase {
            super::host::Phase::Attached => HeldHere::Attached(s.epoch),
            super::host::Phase::Establishing => HeldHere::Establishing(s.epoch),
            super::host::Phase::Undead => HeldHere::Releasing(s.epoch),
        })
    }

    fn store(&self) -> &Arc<dyn Store> {
        SeatEngine::store(self)
    }

    fn company_handles(&self) -> Vec<String> {
        self.company().handles().map(str::to_string).collect()
    }
}

impl SeatEngine {
    /// Build the engine and run the boot walk (every seat's mailboxes,
    /// before anything is claimed). Nothing runs until [`SeatEngine::start`].
    pub async fn new(
        cfg: EngineConfig,
        store: Arc<dyn Store>,
        queue: Arc<dyn Queue>,
        hooks: Arc<dyn SeatHooks>,
        events: EventBus,
        company: watch::Receiver<Company>,
        tasks: Tasks,
    ) -> Result<Arc<SeatEngine>, (String, crate::queue::QueueError)> {
        let handles: Vec<String> = company.borrow().handles().map(str::to_string).collect();
        // Every seat is recorded before its mailbox is created, so a seat
        // later removed can be retired.
        crate::queue::registry::register(
            &*store,
            &handles,
            &events,
            crate::queue::registry::RETIREMENT_BUDGET,
        )
        .await;
        boot_walk(&*queue, handles.iter().map(String::as_str), cfg.queue).await?;
        let host = SeatHost::new(
            super::host::HostConfig {
                node_id: cfg.node_id.clone(),
                owner: cfg.owner.clone(),
                heartbeat: cfg.heartbeat,
                release_wait: cfg.release_wait,
            },
            store.clone(),
            queue.clone(),
            hooks,
            events.clone(),
        );
        let watchdog = Watchdog::new(store.lease_ttl());
        host.watch_dispatch(watchdog.clone());
        let cfg_claim_limit = cfg.claim_limit;
        let cfg_release_limit = cfg.release_limit;
        Ok(Arc::new(SeatEngine {
            cfg,
            store,
            queue,
            host,
            events,
            company,
            presence: tokio::sync::Mutex::new(None),
            presence_recorded: watch::Sender::new(false),
            early: Notify::new(),
            tasks,
            watchdog,
            last_unplaceable: Mutex::new(Vec::new()),
            claims_blocked_by: Mutex::new(None),
            behind: false.into(),
            withdrawn: false.into(),
            deferred: Mutex::new(BTreeMap::new()),
            handed_back: Mutex::new(BTreeMap::new()),
            refused: Mutex::new(BTreeMap::new()),
            roster_seen: Mutex::new(BTreeSet::new()),
            rechecked: Mutex::new(BTreeSet::new()),
            claim_pace: cfg_claim_limit.into(),
            release_pace: cfg_release_limit.into(),
            presence_free_at: Mutex::new(None),
            seen: Mutex::new(BTreeMap::new()),
            seen_kept: false.into(),
        }))
    }

    pub fn host(&self) -> &SeatHost {
        &self.host
    }

    pub fn watchdog(&self) -> &Watchdog {
        &self.watchdog
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn queue(&self) -> &Arc<dyn Queue> {
        &self.queue
    }

    pub fn events(&self) -> &EventBus {
        &self.events
    }

    /// The applied revision, as it changes.
    pub fn company_watch(&self) -> watch::Receiver<Company> {
        self.company.clone()
    }

    pub fn company(&self) -> Company {
        self.company.borrow().clone()
    }

    /// `f` of the company as it is now, without a copy of it: what a
    /// sweep or a heartbeat reads of it (a copy of a 1,000-role company
    /// each time was most of an idle node's allocations). `f` must not
    /// wait on anything.
    pub(super) fn with_company<R>(&self, f: impl FnOnce(&Company) -> R) -> R {
        f(&self.company.borrow())
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The seats no live node may run, as this node's last pass found them.
    pub fn unplaceable(&self) -> Vec<String> {
        self.last_unplaceable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The protocol floor that refused this node's last claim (none once a
    /// pass claims, or wants nothing).
    pub fn claims_blocked_by(&self) -> Option<u32> {
        *self
            .claims_blocked_by
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Mark this node behind (it keeps its seats and claims none) or level.
    pub fn set_behind(&self, behind: bool) {
        self.behind
            .store(behind, std::sync::atomic::Ordering::SeqCst);
    }

    /// Mark this node unable to serve its seats (gives them back, withdrawn
    /// from placement) or able again.
    pub fn set_withdrawn(&self, withdrawn: bool) {
        self.withdrawn
            .store(withdrawn, std::sync::atomic::Ordering::SeqCst);
    }

    /// Start the heartbeat, the sweep and the company follower.
    pub fn start(self: &Arc<Self>) {
        let me = self.clone();
        self.tasks
            .spawn("heartbeat", async move { me.heartbeat_loop().await });
        let me = self.clone();
        self.tasks
            .spawn("sweep", async move { me.sweep_loop().await });
        let me = self.clone();
        self.tasks
            .spawn("company-changes", async move { me.company_loop().await });
        let me = self.clone();
        self.tasks
            .spawn("handoff-offers", async move { me.offers_loop().await });
        let me = self.clone();
        self.tasks
            .spawn("move-requests", async move { me.moves_loop().await });
    }

    /// Run the watchdog over the loops (a process, not a test, does this).
    pub fn arm_watchdog(&self) -> std::io::Result<()> {
        self.watchdog.spawn()
    }

    /// Stop without releasing anything, as a crash would (tests).
    pub async fn crash(&self) {
        self.watchdog.disarm();
        self.watchdog.stop();
        self.tasks.shutdown().await;
        self.host.abandon().await;
    }
}
