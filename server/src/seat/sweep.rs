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

use crate::watchdog::Progress;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use futures::StreamExt;

use super::host::{Acquired, HandOff, OfferNotice, SeatHooks, SeatHost, notice_prefix};
use super::placement::{self, Presence, SeatSpec, Snapshot, Withheld};
use super::{moves, pass, ranking};
use crate::company::{Company, wants_early_sweep};
use crate::coord::{Claim, ClaimRequest, Lease, Metadata, Renewal, StateBucket, Store};
use crate::events::{DetachReason, Event, EventBus};
use crate::queue::{Queue, QueueSettings, boot_walk};
use crate::seat::host::watched;
use crate::seat::placement::matches_placement;
use crate::tasks::Tasks;
use crate::watchdog::{Watchdog, stamp_interval};

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

    /// The seats this node could not establish and still leaves to its
    /// peers, spending one pass of each one's wait (a seat leaves the set
    /// once its passes are spent).
    fn spend_handed_back_pass(&self) -> BTreeSet<String> {
        let mut h = self.handed_back.lock().unwrap_or_else(|e| e.into_inner());
        let left: BTreeSet<String> = h.keys().cloned().collect();
        h.retain(|_, n| {
            *n -= 1;
            *n > 0
        });
        left
    }

    fn set_claims_blocked_by(&self, floor: Option<u32>) {
        *self
            .claims_blocked_by
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = floor;
    }

    /// The nodes holding a live presence or seat lease below this node's
    /// protocol, read from the live view the refusal was just judged from:
    /// the refusal names them (an unreadable view names none, and says so).
    async fn nodes_below_protocol(&self) -> Vec<String> {
        let read = async {
            let now = self.store.now().await?;
            let leases = self.store.view("").await?;
            Ok::<_, crate::coord::StoreError>(crate::coord::lease::nodes_below(
                &leases,
                now,
                self.cfg.protocol,
            ))
        };
        match read.await {
            Ok(nodes) => nodes,
            Err(e) => {
                tracing::warn!(error = %e, "the nodes below this node's protocol cannot be read; the refusal names none");
                Vec::new()
            }
        }
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

    /// Offers made to this node, as their notices arrive: each is
    /// considered (and taken) in its own task.
    async fn offers_loop(self: Arc<Self>) {
        let prefix = notice_prefix(&self.cfg.node_id);
        loop {
            match self.store.watch(StateBucket::Handoffs, &prefix).await {
                Ok(mut stream) => {
                    while let Some(ev) = stream.next().await {
                        match ev {
                            Ok(crate::coord::Event::Put(e)) => {
                                match serde_json::from_slice::<OfferNotice>(&e.value) {
                                    Ok(n) => {
                                        // Watched until it ends: a take
                                        // holds the seat's lock and, won,
                                        // its lease.
                                        let pulse = crate::watchdog::Pulse::new();
                                        self.watchdog.follow(
                                            &format!("take-offer:{}", n.seat),
                                            pulse.clone(),
                                        );
                                        let me = self.clone();
                                        self.tasks.spawn("take-offer", async move {
                                            let _end = pulse.end_on_drop();
                                            me.consider_offer(n, &|| pulse.beat()).await
                                        });
                                    }
                                    Err(err) => {
                                        tracing::warn!(key = %e.key, error = %err, "an unreadable offer notice; ignored")
                                    }
                                }
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!(error = %e, "the offers watch failed; opening it again");
                                break;
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch for offers made to this node; trying again")
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The protocol gate refused a claim at `floor`: say so once for the
    /// pass it ends (`seat_claims_blocked_by_older_protocol`, naming the
    /// nodes below this node's protocol) and show it on the node's page.
    async fn report_gate(&self, floor: u32) {
        self.set_claims_blocked_by(Some(floor));
        let nodes = self.nodes_below_protocol().await;
        self.events.emit(Event::SeatClaimsBlockedByOlderProtocol {
            floor,
            protocol: self.cfg.protocol,
            nodes,
        });
    }

    /// The protocol gate before taking an offer, judged from the live view
    /// of the lease bucket: `false` while a live presence or seat lease is
    /// held at a lower protocol (reported as by [`Self::report_gate`]) or
    /// the floor cannot be read. A claim judges the gate itself, and only
    /// once its seat reads free (spec § Mixed-version fleets: a claim on a
    /// seat a peer holds judges no gate); an offered seat is held by its
    /// giver, so a take asks first.
    async fn protocol_gate_open(&self, progress: &Progress<'_>) -> bool {
        let floor = self.store.protocol_floor(self.cfg.protocol).await;
        progress();
        match floor {
            Ok(Some(floor)) => {
                self.report_gate(floor).await;
                false
            }
            Ok(None) => {
                self.set_claims_blocked_by(None);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "the protocol floor cannot be read; claiming nothing now");
                false
            }
        }
    }

    /// Take an offered seat if this node may run it now, calling
    /// `progress` as each step settles (the take's watchdog beat).
    async fn consider_offer(&self, n: OfferNotice, progress: &Progress<'_>) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.host.is_draining() || self.withdrawn.load(SeqCst) || self.behind.load(SeqCst) {
            return;
        }
        let company = self.company();
        let Some(role) = company.roles.iter().find(|r| r.handle == n.seat) else {
            return;
        };
        if !matches_placement(&self.cfg.node_id, &self.cfg.labels, &role.placement) {
            return;
        }
        // Taking an offer makes this node the seat's holder: the gate holds
        // here as for a claim (the offer lapses, the giver runs the seat on).
        if !self.protocol_gate_open(progress).await {
            return;
        }
        match self.host.take_offer(&n.seat, &n.offer_id, progress).await {
            Ok(Acquired::Won {
                established: true, ..
            }) => {
                watched(progress, None, self.refresh_presence()).await;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(seat = %n.seat, error = %e, "an offered seat was not taken")
            }
        }
    }

    /// A person's move request wakes a pass at once on every node (the
    /// holder hands off, or the target claims a free seat).
    async fn moves_loop(self: Arc<Self>) {
        let mut rx = self.events.subscribe();
        loop {
            match rx.recv().await {
                Ok(f) => {
                    if matches!(f.event, Event::SeatMoveRequested { .. }) {
                        self.early.notify_one();
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return,
            }
        }
    }

    fn refused_for(&self, seat: &str) -> BTreeSet<String> {
        let mut r = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        r.retain(|_, (_, until)| *until > now);
        r.get(seat).map(|(n, _)| n.clone()).into_iter().collect()
    }

    fn refuse(&self, seat: &str, node: &str) {
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                seat.to_string(),
                (node.to_string(), Instant::now() + REFUSED_FOR),
            );
    }

    /// Give `handle` back for `reason`: offered to a successor first when
    /// one is eligible (the two-phase handoff), released otherwise. Returns
    /// whether the seat left this node.
    async fn give_back(
        &self,
        snap: &Snapshot,
        handle: &str,
        reason: DetachReason,
        offered: &Mutex<BTreeMap<String, usize>>,
        progress: &Progress<'_>,
    ) -> bool {
        let handoff = self.cfg.handoff;
        let voluntary = matches!(
            reason,
            DetachReason::Rebalance
                | DetachReason::PlacementMoved
                | DetachReason::Unserviceable
                | DetachReason::Drain
        );
        if handoff.two_phase
            && voluntary
            && let Some(spec) = snap.seats.iter().find(|s| s.handle == handle)
        {
            let to = {
                let o = offered.lock().unwrap_or_else(|e| e.into_inner());
                placement::successor(snap, spec, &self.refused_for(handle), &o)
            };
            if let Some(to) = to {
                *offered
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(to.clone())
                    .or_default() += 1;
                match self
                    .host
                    .hand_off(handle, &to, reason, handoff.timeout, progress)
                    .await
                {
                    HandOff::Taken { .. } | HandOff::Lost => return true,
                    HandOff::Withdrawn => {
                        self.refuse(handle, &to);
                        // A drain cannot wait for another pass.
                        if reason != DetachReason::Drain {
                            return false;
                        }
                    }
                    HandOff::NotOffered(why) => {
                        if self.host.is_offered(handle) {
                            // Another handoff of it (the sweep's, during a
                            // drain) is under way: it settles the seat.
                            return true;
                        }
                        tracing::info!(seat = handle, to = %to, why = %why, "no handoff; releasing the seat instead");
                    }
                }
            }
        }
        self.host.release_with(handle, reason, progress).await;
        true
    }

    /// Run the watchdog over the loops (a process, not a test, does this).
    pub fn arm_watchdog(&self) -> std::io::Result<()> {
        self.watchdog.spawn()
    }

    fn roles_i_may_run(&self, company: &Company) -> Vec<String> {
        company
            .roles
            .iter()
            .filter(|r| matches_placement(&self.cfg.node_id, &self.cfg.labels, &r.placement))
            .map(|r| r.handle.clone())
            .collect()
    }

    /// Seat leases held here (run or undead), counting only seats of the
    /// active revision: a lease on a seat whose role is gone stands in for
    /// no free one, or every node would read the fleet as full.
    fn seats_held_count(&self, company: &Company) -> usize {
        let seats: BTreeSet<&str> = company.handles().collect();
        self.host
            .held()
            .into_iter()
            .chain(self.host.undead())
            .filter(|h| seats.contains(h.as_str()))
            .count()
    }

    fn presence_metadata(&self) -> Metadata {
        let company = self.company();
        let held = self.seats_held_count(&company);
        let mut m = Metadata::new();
        m.insert("labels".into(), json!(self.cfg.labels));
        m.insert("version".into(), json!(crate::VERSION));
        m.insert("roles".into(), json!(self.roles_i_may_run(&company)));
        m.insert("seats_held".into(), json!(held));
        m.insert(
            "seats_withdrawn".into(),
            json!(self.withdrawn.load(std::sync::atomic::Ordering::SeqCst)),
        );
        m.insert("draining".into(), json!(self.host.is_draining()));
        m.insert(
            "behind".into(),
            json!(self.behind.load(std::sync::atomic::Ordering::SeqCst)),
        );
        m
    }

    /// The live nodes with when each was first seen: its kept record (read
    /// again only when a live node is one the last read did not name), else
    /// its presence lease's `acquired_at` — the same on every node.
    async fn first_seen_kept(&self, presence: &[Lease]) -> Vec<(String, crate::coord::StoreTime)> {
        let live = first_seen(presence);
        let missing = {
            let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            live.iter().any(|(id, _)| !seen.contains_key(id))
        };
        if missing {
            match ranking::seen(&*self.store).await {
                Ok(kept) => *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = kept,
                Err(e) => tracing::debug!(error = %e, "cannot read when the nodes were first seen"),
            }
        }
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        ranking::first_seen_kept(live, &seen)
    }

    /// Keep this node's first-seen time (its presence lease's
    /// `acquired_at`) once: create-only, so an earlier incarnation's stands.
    async fn keep_first_seen(&self, lease: &Lease) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.seen_kept.load(SeqCst) {
            return;
        }
        match ranking::remember(&*self.store, &self.cfg.node_id, lease.acquired_at).await {
            Ok(()) => self.seen_kept.store(true, SeqCst),
            Err(e) => {
                tracing::debug!(error = %e, "cannot keep when this node was first seen; next heartbeat")
            }
        }
    }

    /// Claim or renew the presence lease (with fresh metadata).
    pub async fn refresh_presence(&self) {
        if self.host.is_draining() {
            return;
        }
        let mut presence = self.presence.lock().await;
        let meta = self.presence_metadata();
        if let Some(lease) = presence.as_ref() {
            match self
                .store
                .renew(lease, &self.cfg.owner, Some(meta.clone()))
                .await
            {
                Renewal::Renewed(l) => {
                    self.keep_first_seen(&l).await;
                    *presence = Some(l);
                    self.presence_recorded.send_replace(true);
                    return;
                }
                Renewal::Lost => *presence = None,
                Renewal::Unknown(e) => {
                    tracing::warn!(error = %e, "cannot renew this node's presence");
                    return;
                }
            }
        }
        let req = ClaimRequest::new(
            format!("node:{}", self.cfg.node_id),
            self.cfg.owner.clone(),
            self.cfg.node_id.clone(),
        )
        .with_protocol(self.cfg.protocol)
        .with_metadata(meta);
        match self.store.claim(req).await {
            Ok(Claim::Won(l)) => {
                self.keep_first_seen(&l).await;
                *presence = Some(l);
                let first = !self.presence_recorded.send_replace(true);
                if first
                    && self
                        .presence_free_at
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .take()
                        .is_some()
                {
                    // A restarted node: its earlier incarnation's seats came
                    // free with that row, and this node takes them first.
                    self.early.notify_one();
                }
            }
            Ok(Claim::HeldBy(l)) => {
                tracing::info!(
                    owner = %l.owner,
                    "this node id's presence is still held by an earlier incarnation; waiting for it to lapse"
                );
                if let Ok(now) = self.store.now().await {
                    let left = l.expires_at.since(now);
                    *self
                        .presence_free_at
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) =
                        Some(Instant::now() + left + PRESENCE_LAPSE_MARGIN);
                }
            }
            // A presence claim judges no gate.
            Ok(Claim::Gated { .. }) => {}
            Err(e) => tracing::warn!(error = %e, "cannot claim this node's presence"),
        }
    }

    async fn heartbeat_loop(self: Arc<Self>) {
        let stamp = stamp_interval(self.watchdog.threshold()).min(self.cfg.heartbeat);
        let beat = self.watchdog.watch("heartbeat");
        let mut next = Instant::now();
        loop {
            beat.beat();
            if Instant::now() >= next {
                next = Instant::now() + self.cfg.heartbeat;
                // Presence and seats side by side, beating as each store
                // call settles: a slow store is not a wedged loop.
                let progress = || beat.beat();
                tokio::join!(
                    async {
                        watched(&progress, None, self.refresh_presence()).await;
                        beat.beat();
                    },
                    self.host.heartbeat_with(self.store.lease_ttl(), &progress)
                );
                beat.beat();
                // An earlier incarnation's row is claimed as it lapses.
                if !*self.presence_recorded.borrow()
                    && let Some(at) = *self
                        .presence_free_at
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                {
                    next = next.min(at.max(Instant::now()));
                }
            }
            tokio::time::sleep(stamp.min(next.saturating_duration_since(Instant::now()))).await;
        }
    }

    async fn sweep_loop(self: Arc<Self>) {
        let stamp = stamp_interval(self.watchdog.threshold()).min(self.cfg.sweep);
        let beat = self.watchdog.watch("sweep");
        // The first pass waits (up to one heartbeat interval) for this
        // node's presence to be recorded, without taking the presence lock:
        // seats held by a node the roster does not list yet showed on
        // Settings › Nodes as a draining node of protocol 0.
        let mut recorded = self.presence_recorded.subscribe();
        let until = Instant::now() + self.cfg.heartbeat;
        while !*recorded.borrow_and_update() && Instant::now() < until {
            beat.beat();
            let _ = tokio::time::timeout(
                stamp.min(until.saturating_duration_since(Instant::now())),
                recorded.changed(),
            )
            .await;
        }
        let mut next = Instant::now();
        let mut last_early: Option<Instant> = None;
        loop {
            beat.beat();
            if Instant::now() >= next {
                next = Instant::now() + self.cfg.sweep;
                if std::env::var_os("CREWLET_FAULT_WEDGE_SWEEP").is_some() {
                    // Fault injection for the watchdog's process test: the
                    // sweep blocks forever while the process stays alive.
                    tracing::warn!(
                        "CREWLET_FAULT_WEDGE_SWEEP is set: the sweep loop now blocks forever"
                    );
                    std::thread::sleep(Duration::from_secs(u64::MAX / 4));
                }
                if self.sweep_pass(&|| beat.beat()).await {
                    // Seats left for a recheck: one more pass shortly.
                    next =
                        next.min(Instant::now() + placement::RECHECK_AFTER.min(self.cfg.heartbeat));
                }
                beat.beat();
            }
            let wait = stamp.min(next.saturating_duration_since(Instant::now()));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.early.notified() => {
                    // At most one early pass per interval.
                    let now = Instant::now();
                    if last_early.is_none_or(|t| now.duration_since(t) >= self.cfg.sweep) {
                        last_early = Some(now);
                        next = now;
                    }
                }
            }
        }
    }

    async fn company_loop(self: Arc<Self>) {
        let mut rx = self.company.clone();
        let mut seen = Some(rx.borrow_and_update().clone());
        while rx.changed().await.is_ok() {
            let new = rx.borrow_and_update().clone();
            // A role added: recorded, and its mailboxes exist before
            // anything claims it (after any retirement of its old mailbox).
            let handles: Vec<String> = new.handles().map(str::to_string).collect();
            crate::queue::registry::register(
                &*self.store,
                &handles,
                &self.events,
                crate::queue::registry::RETIREMENT_BUDGET,
            )
            .await;
            if let Err((seat, e)) = boot_walk(&*self.queue, new.handles(), self.cfg.queue).await {
                tracing::error!(seat, error = %e, "cannot create a new seat's mailboxes");
            }
            self.events.emit(Event::CompanyApplied {
                revision: new.revision,
                seats: new.roles.len(),
            });
            if wants_early_sweep(seen.as_ref(), &new) {
                self.early.notify_one();
            }
            seen = Some(new);
        }
    }

    /// Ask for a pass now (still at most one early pass per interval).
    pub fn sweep_soon(&self) {
        self.early.notify_one();
    }

    /// One placement pass.
    pub async fn sweep_once(&self) {
        self.sweep_pass(&|| {}).await;
    }

    /// One placement pass, calling `progress` as each store call and each
    /// release or claim settles (the sweep loop's watchdog beat: a pass
    /// that gives back and claims several seats can outlast the TTL while
    /// every step of it returns).
    ///
    /// True when the pass left seats for a recheck [`placement::RECHECK_AFTER`] later.
    async fn sweep_pass(&self, progress: &Progress<'_>) -> bool {
        let began = std::time::Instant::now();
        let Some((snap, plan, standing)) = self.plan_pass(progress).await else {
            return false;
        };
        self.note_plan(&plan);
        let refused: BTreeMap<String, String> = standing
            .iter()
            .filter_map(|(m, _)| {
                let r = self.refused_for(&m.seat);
                r.into_iter().next().map(|n| (m.seat.clone(), n))
            })
            .collect();
        let steps = pass::steps(&snap, &plan, &standing, &refused);
        let (mut claimed, mut released, mut advertised_releases) = (0, 0, false);
        let mut gated = None;
        let offered = Mutex::new(BTreeMap::new());
        if !steps.iter().any(|s| matches!(s, pass::Step::Claim { .. })) {
            self.set_claims_blocked_by(None);
        }
        let mut next = 0;
        while let Some(step) = steps.get(next) {
            if matches!(step, pass::Step::AnnounceBehind | pass::Step::Claim { .. })
                && released > 0
                && !advertised_releases
            {
                // A seat given back is advertised in the release itself. The
                // presence write (bounded store calls, maybe behind the
                // heartbeat's on the presence lock) is waited on beating: a
                // sweep waiting out a NATS election here was shot as wedged.
                watched(progress, None, self.refresh_presence()).await;
                progress();
                advertised_releases = true;
            }
            // Claims side by side, a few at a time: a restarted node's
            // seats are established together, not one after another.
            let run: Vec<&pass::Step> = steps[next..]
                .iter()
                .take_while(|s| matches!(s, pass::Step::Claim { .. }))
                .take(CLAIMS_AT_ONCE)
                .collect();
            let done = if run.is_empty() {
                next += 1;
                vec![self.execute(&snap, step, &offered, progress).await]
            } else {
                next += run.len();
                futures::future::join_all(
                    run.iter()
                        .map(|s| self.execute(&snap, s, &offered, progress)),
                )
                .await
            };
            progress();
            let mut stop = false;
            for d in done {
                match d {
                    Done::Released => released += 1,
                    Done::Claimed => claimed += 1,
                    Done::Nothing => {}
                    Done::StopClaims => stop = true,
                    Done::Gated(floor) => {
                        gated = Some(floor);
                        stop = true;
                    }
                }
            }
            if stop {
                break;
            }
        }
        match gated {
            // Once per pass, however many of its claims the gate refused.
            Some(floor) => self.report_gate(floor).await,
            // A claim won: the gate was open.
            None if claimed > 0 => self.set_claims_blocked_by(None),
            None => {}
        }
        if released > 0 && !advertised_releases {
            watched(progress, None, self.refresh_presence()).await;
            progress();
        }
        if claimed > 0 {
            // Advertise the new count at the end of the pass (beating
            // while the presence write waits, as above).
            watched(progress, None, self.refresh_presence()).await;
            progress();
        }
        self.events.emit(Event::SeatSweep {
            held: self.host.held().len(),
            undead: self.host.undead().len(),
            capacity: plan.capacity,
            claimed,
            released,
            fleet_full: plan.withheld == Some(Withheld::FleetFull),
            duration_ms: began.elapsed().as_millis() as u64,
        });
        !plan.rechecks.is_empty()
    }

    /// Read what a pass decides on and plan it: the roster, this node as it
    /// is now, the fleet's priority order, the standing moves, and — only
    /// when the pass would claim — the seat leases and last holders. `None`
    /// when the roster cannot be read (a pass concludes nothing then).
    async fn plan_pass(
        &self,
        progress: &Progress<'_>,
    ) -> Option<(Snapshot, placement::Plan, Vec<(moves::MoveRequest, u64)>)> {
        let presence_leases = match self.store.list("node:").await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "the roster cannot be read; this pass concludes nothing");
                return None;
            }
        };
        progress();
        let mut snap = self.snapshot(&presence_leases, progress).await;
        let standing = match moves::standing(&*self.store).await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "move requests cannot be read; this pass acts on none");
                Vec::new()
            }
        };
        progress();
        snap.moves = standing
            .iter()
            .map(|(m, _)| (m.seat.clone(), m.to.clone()))
            .collect();
        let mut plan = placement::plan(&snap);
        // Only a pass that would claim reads the seat leases: a full node,
        // or a fleet whose presence counts say it is full, reads the
        // presence rows and nothing else (spec § Mixed-version fleets).
        if !plan.claims.is_empty() {
            let leases = self.store.list("seat:").await;
            progress();
            // The hint outlives the lease: a free seat's is its last
            // holder's, kept beside its epoch. Unread, there is no hint
            // this pass (stickiness, never a rule).
            let holders = match self.store.holders("seat:").await {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(error = %e, "the seats' last holders cannot be read; no stickiness this pass");
                    BTreeMap::new()
                }
            };
            progress();
            match leases {
                Ok(leases) => {
                    pass::with_seat_leases(&mut snap, &leases, &holders, &self.cfg.owner);
                    plan = placement::plan(&snap);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the seat leases cannot be read; claiming nothing this pass");
                    plan.claims.clear();
                }
            }
        }
        Some((snap, plan, standing))
    }

    /// This pass's snapshot from the presence rows it read: this node as
    /// it is now, what it holds, the counts and hints it keeps between
    /// passes, and the fleet's priority order over the nodes present.
    async fn snapshot(&self, presence_leases: &[Lease], progress: &Progress<'_>) -> Snapshot {
        let company = self.company();
        let fading = self.fading(presence_leases).await;
        progress();
        let mut presence: Vec<Presence> = presence_leases.iter().filter_map(presence_of).collect();
        // This node as it is now, whatever its row said a heartbeat ago.
        presence.retain(|p| p.node_id != self.cfg.node_id);
        let withdrawn = self.withdrawn.load(std::sync::atomic::Ordering::SeqCst);
        if !self.host.is_draining() {
            presence.push(Presence {
                node_id: self.cfg.node_id.clone(),
                labels: self.cfg.labels.clone(),
                withdrawn,
                seats_held: Some(self.seats_held_count(&company) as u32),
            });
        }
        let mut snap = Snapshot {
            node_id: self.cfg.node_id.clone(),
            labels: self.cfg.labels.clone(),
            seats: seat_specs(&company),
            presence,
            held: self.host.held().into_iter().collect(),
            undead: self.host.undead().into_iter().collect(),
            held_elsewhere: BTreeSet::new(),
            draining: self.host.is_draining(),
            behind: self.behind.load(std::sync::atomic::Ordering::SeqCst),
            unserviceable: withdrawn,
            claim_limit: self.cfg.claim_limit,
            release_limit: self.cfg.release_limit,
            ranking: Vec::new(),
            deferred: self
                .deferred
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            moves: BTreeMap::new(),
            handed_back: self.spend_handed_back_pass(),
            leased_to: BTreeMap::new(),
            fading,
            rechecked: self
                .rechecked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        };
        // The fleet's one priority order (never a private one), applied to
        // the nodes present; an unreadable order ranks nobody.
        let mut present = self.first_seen_kept(presence_leases).await;
        if !present.iter().any(|(id, _)| *id == self.cfg.node_id) && !self.host.is_draining() {
            present.push((
                self.cfg.node_id.clone(),
                crate::coord::StoreTime::from_unix_nanos(i64::MAX),
            ));
        }
        match ranking::read(&*self.store).await {
            Ok(order) => {
                let saved = order.map(|(o, _)| o.nodes).unwrap_or_default();
                snap.ranking = ranking::effective_order(&saved, &present);
            }
            Err(e) => {
                tracing::warn!(error = %e, "the node order cannot be read; ranking nobody this pass")
            }
        }
        progress();
        snap
    }

    /// Keep what the plan says for the next passes: the unplaceable seats
    /// (announced when they change), each deferred seat's count, and the
    /// seats left for a recheck.
    fn note_plan(&self, plan: &placement::Plan) {
        {
            let mut last = self
                .last_unplaceable
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if *last != plan.unplaceable {
                if !plan.unplaceable.is_empty() {
                    self.events.emit(Event::SeatsUnplaceable {
                        seats: plan.unplaceable.clone(),
                    });
                }
                *last = plan.unplaceable.clone();
            }
        }
        {
            let mut d = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
            let before = std::mem::take(&mut *d);
            for h in &plan.deferred {
                d.insert(h.clone(), before.get(h).copied().unwrap_or(0) + 1);
            }
        }
        *self.rechecked.lock().unwrap_or_else(|e| e.into_inner()) =
            plan.rechecks.iter().cloned().collect();
    }

    /// Carry out one step of a pass.
    async fn execute(
        &self,
        snap: &Snapshot,
        step: &pass::Step,
        offered: &Mutex<BTreeMap<String, usize>>,
        progress: &Progress<'_>,
    ) -> Done {
        use pass::Step;
        match step {
            Step::Release { seat, reason } => {
                if self.give_back(snap, seat, *reason, offered, progress).await {
                    return Done::Released;
                }
            }
            Step::FinishMove { seat, revision } => {
                moves::finish(&*self.store, seat, *revision).await;
            }
            Step::HandOff {
                seat,
                to,
                revision: _,
            } => {
                if !self.host.held().contains(seat) {
                    return Done::Nothing;
                }
                match self
                    .host
                    .hand_off(
                        seat,
                        to,
                        DetachReason::Moved,
                        self.cfg.handoff.timeout,
                        progress,
                    )
                    .await
                {
                    HandOff::Taken { .. } | HandOff::Lost => return Done::Released,
                    HandOff::Withdrawn => self.refuse(seat, to),
                    HandOff::NotOffered(why) => {
                        tracing::warn!(seat = %seat, to = %to, why = %why, "cannot hand the seat to its requested node")
                    }
                }
            }
            Step::ClaimMoved { seat, revision } => {
                let free = matches!(self.store.lease(&format!("seat:{seat}")).await, Ok(None));
                progress();
                if free {
                    match self.host.claim_with(seat, progress).await {
                        Ok(Acquired::Won {
                            established: true, ..
                        }) => moves::finish(&*self.store, seat, *revision).await,
                        Ok(Acquired::Gated { floor }) => return Done::Gated(floor),
                        _ => {}
                    }
                }
            }
            Step::AnnounceBehind => self.events.emit(Event::SeatClaimsWithheld {
                reason: "behind".into(),
            }),
            Step::Claim { seat } => {
                // The claim judges the protocol gate once the seat reads
                // free; a refusal ends the pass.
                let claim = self.host.claim_with(seat, progress).await;
                progress();
                match claim {
                    Ok(Acquired::Won {
                        established: true, ..
                    }) => return Done::Claimed,
                    Ok(Acquired::Won {
                        established: false, ..
                    }) => {
                        // Handed back by its acquire hook: a peer gets the
                        // next passes at it.
                        self.handed_back
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(seat.clone(), placement::HANDED_BACK_PASSES);
                    }
                    Ok(Acquired::HeldBy(_)) => {}
                    Ok(Acquired::Gated { floor }) => return Done::Gated(floor),
                    Ok(Acquired::Draining) => return Done::StopClaims,
                    Err(e) => {
                        tracing::warn!(seat = %seat, error = %e, "claim failed; unknown ownership is not ownership")
                    }
                }
            }
        }
        Done::Nothing
    }

    /// The nodes whose presence is fading (see [`Snapshot::fading`]): rows
    /// not renewed for two heartbeats, and rows the last pass read that
    /// are gone now. Remembers this roster for the next pass.
    async fn fading(&self, presence: &[Lease]) -> BTreeSet<String> {
        let roster: BTreeSet<String> = presence
            .iter()
            .filter_map(|l| l.resource.strip_prefix("node:").map(str::to_string))
            .filter(|id| *id != self.cfg.node_id)
            .collect();
        let mut fading: BTreeSet<String> = {
            let mut seen = self.roster_seen.lock().unwrap_or_else(|e| e.into_inner());
            let gone = seen.difference(&roster).cloned().collect();
            *seen = roster;
            gone
        };
        if let Ok(now) = self.store.now().await {
            let stale = self.cfg.heartbeat * 2;
            for l in presence {
                let left = l.expires_at.since(now);
                let Some(id) = l.resource.strip_prefix("node:") else {
                    continue;
                };
                if id != self.cfg.node_id && l.ttl.saturating_sub(left) > stale {
                    fading.insert(id.to_string());
                }
            }
        }
        fading
    }

    /// Graceful shutdown is a drain: presence given up first, every seat
    /// released voluntarily, then the loops stop. No peer waits a TTL.
    pub async fn drain(&self) {
        self.watchdog.disarm();
        self.host.begin_drain();
        self.events.emit(Event::NodeDraining {});
        // One renewal of every seat first, carrying the draining mark, so
        // the seats read as a draining node's once the presence is gone.
        self.host.heartbeat(self.store.lease_ttl()).await;
        if let Some(p) = self.presence.lock().await.take() {
            let _ = self.store.release(&p, &self.cfg.owner).await;
        }
        // Every seat is offered to a successor first (a drain is a
        // voluntary move), a few at a time; released when none is eligible.
        let snap = self.drain_snapshot().await;
        let offered = Mutex::new(BTreeMap::new());
        let snap = &snap;
        let offered = &offered;
        futures::stream::iter(self.host.held())
            .for_each_concurrent(DRAIN_HANDOFFS, |handle| async move {
                match snap {
                    Some(snap) => {
                        self.give_back(snap, &handle, DetachReason::Drain, offered, &|| {})
                            .await;
                    }
                    None => self.host.release(&handle, DetachReason::Drain).await,
                }
            })
            .await;
        self.tasks.shutdown().await;
    }

    /// What a draining node knows for choosing successors: the live
    /// presence rows (this node's given up), the seats, the order.
    async fn drain_snapshot(&self) -> Option<Snapshot> {
        if !self.cfg.handoff.two_phase {
            return None;
        }
        let leases = self.store.list("node:").await.ok()?;
        let presence: Vec<Presence> = leases
            .iter()
            .filter_map(presence_of)
            .filter(|p| p.node_id != self.cfg.node_id)
            .collect();
        let present = self.first_seen_kept(&leases).await;
        let saved = ranking::read(&*self.store)
            .await
            .ok()
            .flatten()
            .map(|(o, _)| o.nodes)
            .unwrap_or_default();
        let company = self.company();
        Some(Snapshot {
            node_id: self.cfg.node_id.clone(),
            labels: self.cfg.labels.clone(),
            seats: seat_specs(&company),
            presence,
            draining: true,
            ranking: ranking::effective_order(&saved, &present),
            ..Snapshot::default()
        })
    }

    /// Stop without releasing anything, as a crash would (tests).
    pub async fn crash(&self) {
        self.watchdog.disarm();
        self.watchdog.stop();
        self.tasks.shutdown().await;
        self.host.abandon().await;
    }
}
