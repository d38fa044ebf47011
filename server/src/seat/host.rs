//! The seat host: the seats this process holds, how one is established and
//! given back, and the answer to "may a turn start here?".
//!
//! It owns the held set, the undead set, one lock per seat (an acquisition,
//! a release and a renewal of one seat never interleave), the seat's queue
//! attachments, and the admission clock. It does not decide which seats to
//! hold — that is placement's — and it never releases a lease whose
//! teardown it could not prove (the seat goes undead instead, keeps being
//! renewed, and the teardown is retried every heartbeat).
//!
//! The acquire hook runs the spec's steps in order — children, memory
//! hydration, reflection subscription, control subscription and run
//! recovery, pause holds, inbox attach — and no turn is admitted until it
//! returns. Releasing is voluntary (quiesce, bounded wait for the in-flight
//! handler, detach, release) or fenced (detach first, abandon).

use crate::watchdog::Progress;
use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use tokio::time::Instant;

use crate::coord::{Claim, ClaimRequest, Lease, Release, Renewal, Store};
use crate::events::{DetachReason, Event, EventBus};
use crate::metrics::{self, Update};
use crate::queue::{Attachment, Handler, Queue, inbox_group};

mod handoff;
pub use handoff::{HandOff, OfferNotice, notice_key, notice_prefix};

/// The hold a store blip takes on a seat's inbox.
pub const BLIP_HOLD: &str = "store-blip";
/// Re-raise an undead seat's alarm every this many heartbeats.
pub const STILL_UNPROVEN_EVERY: u32 = 20;
/// Seat renewals one heartbeat keeps in flight at once.
pub const RENEW_CONCURRENCY: usize = 32;
/// While a renewal waits for a seat's lock (a claim or a hand-back of the
/// seat holds it), the heartbeat beats this often.
const LOCK_WAIT_BEAT: Duration = Duration::from_millis(250);
/// The bound on one step of an acquire or release hook: a step still
/// running then has failed (the seat is handed back, or undead).
pub const HOOK_BOUND: Duration = Duration::from_secs(30);

/// What a hook knows about the seat it works on.
#[derive(Clone, Debug)]
pub struct SeatContext {
    pub handle: String,
    pub epoch: u64,
    pub lease: Lease,
}

impl SeatContext {
    pub fn of(handle: &str, lease: &Lease) -> SeatContext {
        SeatContext {
            handle: handle.to_string(),
            epoch: lease.epoch,
            lease: lease.clone(),
        }
    }
}

/// A hook step that failed, in words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{step}: {message}")]
pub struct HookError {
    pub step: &'static str,
    pub message: String,
}

impl HookError {
    pub fn new(step: &'static str, message: impl Into<String>) -> HookError {
        HookError {
            step,
            message: message.into(),
        }
    }
}

/// The steps later parts of the node fill in. Every step has a default
/// that does nothing, so the order is fixed here even where a step is empty.
#[async_trait::async_trait]
pub trait SeatHooks: Send + Sync + 'static {
    /// Step 1: the seat's children (its command agent).
    async fn start_children(&self, _seat: &SeatContext) -> Result<(), HookError> {
        Ok(())
    }
    /// Step 2: replay the seat's memory into this node's store.
    async fn hydrate_memory(&self, _seat: &SeatContext) -> Result<(), HookError> {
        Ok(())
    }
    /// Step 3: the reflection subscription (after hydration).
    async fn attach_reflect(&self, _seat: &SeatContext) -> Result<Option<Attachment>, HookError> {
        Ok(None)
    }
    /// Step 4: the control subscription and interrupted-run recovery.
    async fn attach_control(&self, _seat: &SeatContext) -> Result<Option<Attachment>, HookError> {
        Ok(None)
    }
    /// Step 5: the holds the inbox must be attached with (a paused seat is
    /// attached already held).
    async fn pause_holds(&self, _seat: &SeatContext) -> Result<Vec<String>, HookError> {
        Ok(Vec::new())
    }
    /// Step 6: what consumes the inbox once attached.
    fn inbox_handler(&self, seat: &SeatContext, fence: Fence) -> Arc<dyn Handler>;
    /// The hook returned: the seat admits turns from now on.
    async fn established(&self, _seat: &SeatContext) {}
    /// Phase 1 of a handoff, after the inbox is quiesced and the reflect
    /// subscription detached: make what the successor reads complete (the
    /// memory flush). A failure offers nothing; the seat resumes here.
    async fn quiesce(&self, _seat: &SeatContext) -> Result<(), HookError> {
        Ok(())
    }
    /// A successor prepared the seat (children, memory) and did not take
    /// it: undo the preparation without touching what the holder owns.
    async fn unprepare(&self, _seat: &SeatContext) -> Result<(), HookError> {
        Ok(())
    }
    /// The mirror of the acquire hook: children die, memory is flushed. An
    /// error (or a panic) makes the seat undead.
    async fn release(&self, _seat: &SeatContext) -> Result<(), HookError> {
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The acquire hook is running: no turn is admitted.
    Establishing,
    Attached,
    /// The teardown failed: out of the held set, lease still renewed.
    Undead,
}

struct SeatEntry {
    lease: Lease,
    phase: Phase,
    inbox: Option<Attachment>,
    control: Option<Attachment>,
    reflect: Option<Attachment>,
    /// When the last successful renew (or the claim) was sent.
    last_renewed: Instant,
    blip: bool,
    undead_since: Option<Instant>,
    attempts: u32,
    last_error: String,
    /// A fenced release has begun: the turn's fence is closed from here.
    fenced: bool,
    /// Being offered to a successor (a handoff from its quiesce on): the
    /// inbox stays quiesced whatever a renewal proves.
    offered: bool,
    /// The seat's last memory flush for its next holder has begun (a
    /// handoff's flush before its offer, or a voluntary release's teardown):
    /// the turn's fence is closed from here (a turn still in flight is
    /// deferred to the next holder, so nothing it writes after the flush is
    /// a finished turn's memory the next holder never hydrated).
    last_flush: bool,
}

impl SeatEntry {
    /// A tenure just won (claimed or taken) whose acquire hook is to run;
    /// `sent` is when the winning request was sent.
    fn establishing(lease: Lease, sent: Instant) -> SeatEntry {
        SeatEntry {
            lease,
            phase: Phase::Establishing,
            inbox: None,
            control: None,
            reflect: None,
            last_renewed: sent,
            blip: false,
            undead_since: None,
            attempts: 0,
            last_error: String::new(),
            fenced: false,
            offered: false,
            last_flush: false,
        }
    }
}

/// A seat as the host reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct SeatStatus {
    pub handle: String,
    pub epoch: u64,
    pub phase: Phase,
    pub lease: Lease,
    /// How long its teardown has been failing (undead only).
    pub unproven_for: Option<Duration>,
    pub attempts: u32,
}

/// How the host runs.
#[derive(Clone, Debug)]
pub struct HostConfig {
    pub node_id: String,
    /// The process incarnation: the owner of every lease taken here.
    pub owner: String,
    pub heartbeat: Duration,
    /// The bound on waiting for an in-flight handler on a voluntary release.
    pub release_wait: Duration,
}

/// The answer to a claim-and-acquire.
#[derive(Clone, Debug, PartialEq)]
pub enum Acquired {
    /// Claimed and established (or refused by its hook and handed back).
    Won {
        epoch: u64,
        established: bool,
    },
    HeldBy(Box<Lease>),
    /// The seat read free and the protocol gate refused the claim: a live
    /// presence or seat lease is held at `floor`, below this node's
    /// protocol. Nothing is claimed.
    Gated {
        floor: u32,
    },
    /// A drain began: nothing is claimed (or it was handed straight back).
    Draining,
}

struct HostInner {
    cfg: HostConfig,
    store: Arc<dyn Store>,
    queue: Arc<dyn Queue>,
    hooks: Arc<dyn SeatHooks>,
    events: EventBus,
    seats: Mutex<BTreeMap<String, SeatEntry>>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    draining: AtomicBool,
    /// Follows each inbox's turn dispatch once set (a node's engine sets
    /// it; a bare host in a test has none).
    watchdog: Mutex<Option<crate::watchdog::Watchdog>>,
}

/// The seat host. Cheap to clone.
#[derive(Clone)]
pub struct SeatHost {
    inner: Arc<HostInner>,
}

/// A turn's view of its seat: the epoch it was admitted under, checked at
/// the top of every round and before each tool call.
#[derive(Clone)]
pub struct Fence {
    host: Weak<HostInner>,
    handle: String,
    epoch: u64,
}

impl Fence {
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn handle(&self) -> &str {
        &self.handle
    }

    /// Does this node still hold the seat at the epoch the turn began under?
    /// And provably so: a renewal sent at t bought the seat through t + TTL,
    /// so past that, with no renewal since, a peer may hold it — whether or
    /// not the heartbeat has run to notice. A process that was stopped (or
    /// whose heartbeat was held up) resumes with the fence closed, before
    /// its turn's next round or call, rather than posting for a seat that
    /// moved while it slept. Within the TTL a store that cannot answer
    /// closes nothing. Nor does a teardown that could not be proven (spec
    /// § Fencing): an undead seat's lease is kept and renewed so no peer can
    /// take it, so its in-flight turn races nobody and finishes — while
    /// admission ([`Fence::may_start`]) starts nothing new there. A handoff
    /// closes it when it flushes the seat's memory for the successor: a
    /// turn still running past the handoff's wait is deferred to the
    /// successor rather than finishing after the flush.
    pub fn holds(&self) -> bool {
        self.host.upgrade().is_some_and(|h| {
            let ttl = h.store.lease_ttl();
            lock(&h.seats).get(&self.handle).is_some_and(|e| {
                matches!(e.phase, Phase::Attached | Phase::Undead)
                    && !e.fenced
                    && !e.last_flush
                    && e.lease.epoch == self.epoch
                    && e.last_renewed.elapsed() < ttl
            })
        })
    }

    /// Take or drop a named hold on the seat's inbox, if this node still
    /// holds it at this epoch.
    pub fn hold(&self, name: &str, on: bool) -> bool {
        self.host.upgrade().is_some_and(|h| {
            let seats = lock(&h.seats);
            match seats.get(&self.handle) {
                Some(e) if e.lease.epoch == self.epoch => match &e.inbox {
                    Some(a) => {
                        if on {
                            a.hold(name)
                        } else {
                            a.unhold(name)
                        }
                        true
                    }
                    None => false,
                },
                _ => false,
            }
        })
    }

    /// Admission: the epoch when the seat may start a turn now.
    pub fn may_start(&self) -> Option<u64> {
        let h = self.host.upgrade()?;
        SeatHost { inner: h }.may_start(&self.handle)
    }
}

/// Pure: how old the last successful renew may be for a turn to start:
/// one heartbeat and a tenth of one more, so a tick a few milliseconds
/// late defers no mail. A turn admitted is still certified owned for at
/// least TTL − 1.1 heartbeats (the TTL is at least three of them).
pub fn admission_window(heartbeat: Duration) -> Duration {
    heartbeat + heartbeat / 10
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Await `fut`, calling `progress` every [`LOCK_WAIT_BEAT`] while it runs,
/// and give up after `bound` (`None`: no bound of its own). Only for waits
/// that end by construction — a hook step under [`HOOK_BOUND`], a seat's
/// lock held by such a step — so the loop waiting is turning, however slow
/// the step (a sweep waiting on a seat lock while the heartbeat retried an
/// undead seat's teardown against a NATS leader election was shot as
/// wedged, and a turn waiting to record its completion died with it).
pub(crate) async fn watched<F: std::future::Future>(
    progress: &Progress<'_>,
    bound: Option<Duration>,
    fut: F,
) -> Option<F::Output> {
    tokio::pin!(fut);
    let deadline = bound.map(|b| tokio::time::Instant::now() + b);
    loop {
        let beat = tokio::time::sleep(LOCK_WAIT_BEAT);
        tokio::select! {
            out = &mut fut => return Some(out),
            _ = beat => {
                progress();
                if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                    return None;
                }
            }
        }
    }
}

/// Run one hook step under [`HOOK_BOUND`], beating while it runs.
async fn hook_step<T>(
    progress: &Progress<'_>,
    step: &'static str,
    fut: impl std::future::Future<Output = Result<T, HookError>>,
) -> Result<T, HookError> {
    match watched(progress, Some(HOOK_BOUND), fut).await {
        Some(r) => r,
        None => Err(HookError::new(
            step,
            format!("did not finish within {HOOK_BOUND:?}"),
        )),
    }
}

impl SeatHost {
    /// What a seat renewal writes into the lease's metadata: the draining
    /// mark once a drain began (how Settings › Nodes tells a draining node,
    /// which gave its presence up first, from one whose presence is late);
    /// otherwise the lease's own.
    fn renewal_metadata(&self, lease: &Lease) -> Option<crate::coord::Metadata> {
        let marked = lease
            .metadata
            .get("draining")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        (self.is_draining() && !marked).then(|| {
            let mut m = lease.metadata.clone();
            m.insert("draining".into(), serde_json::Value::Bool(true));
            m
        })
    }

    /// Have `watchdog` follow every inbox's turn dispatch from now on, as
    /// `dispatch:{seat}` (it stands down for one whose seat was let go).
    pub fn watch_dispatch(&self, watchdog: crate::watchdog::Watchdog) {
        *lock(&self.inner.watchdog) = Some(watchdog);
    }

    pub fn new(
        cfg: HostConfig,
        store: Arc<dyn Store>,
        queue: Arc<dyn Queue>,
        hooks: Arc<dyn SeatHooks>,
        events: EventBus,
    ) -> SeatHost {
        SeatHost {
            inner: Arc::new(HostInner {
                cfg,
                store,
                queue,
                hooks,
                events,
                seats: Mutex::new(BTreeMap::new()),
                locks: Mutex::new(HashMap::new()),
                draining: AtomicBool::new(false),
                watchdog: Mutex::new(None),
            }),
        }
    }

    pub fn config(&self) -> &HostConfig {
        &self.inner.cfg
    }

    fn seat_lock(&self, handle: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.inner.locks)
            .entry(handle.to_string())
            .or_default()
            .clone()
    }

    /// Stop claiming: every claim from now on (including one already in a
    /// pass) claims nothing, or hands back what it just took.
    pub fn begin_drain(&self) {
        self.inner.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::SeqCst)
    }

    /// Seats held and run here (establishing or attached; not undead).
    pub fn held(&self) -> Vec<String> {
        lock(&self.inner.seats)
            .iter()
            .filter(|(_, e)| e.phase != Phase::Undead)
            .map(|(h, _)| h.clone())
            .collect()
    }

    /// Seats whose teardown could not be proven.
    pub fn undead(&self) -> Vec<String> {
        lock(&self.inner.seats)
            .iter()
            .filter(|(_, e)| e.phase == Phase::Undead)
            .map(|(h, _)| h.clone())
            .collect()
    }

    pub fn status(&self) -> Vec<SeatStatus> {
        let now = Instant::now();
        lock(&self.inner.seats)
            .iter()
            .map(|(h, e)| SeatStatus {
                handle: h.clone(),
                epoch: e.lease.epoch,
                phase: e.phase,
                lease: e.lease.clone(),
                unproven_for: e.undead_since.map(|s| now.duration_since(s)),
                attempts: e.attempts,
            })
            .collect()
    }

    /// The inbox attachment's quiesce state (tests and the dashboard).
    pub fn inbox_quiesced(&self, handle: &str) -> Option<bool> {
        lock(&self.inner.seats).get(handle).and_then(|e| {
            e.inbox
                .as_ref()
                .map(|a| a.is_quiesced() || !a.holds().is_empty())
        })
    }

    /// Take or drop a named hold on a held seat's inbox (a person's pause).
    pub fn hold(&self, handle: &str, name: &str, on: bool) -> bool {
        let seats = lock(&self.inner.seats);
        match seats.get(handle).and_then(|e| e.inbox.as_ref()) {
            Some(a) => {
                if on {
                    a.hold(name)
                } else {
                    a.unhold(name)
                }
                true
            }
            None => false,
        }
    }

    /// Resume a seat's inbox after a Defer (the edge a successful renew
    /// also triggers).
    pub fn resume(&self, handle: &str) {
        if let Some(a) = lock(&self.inner.seats)
            .get(handle)
            .and_then(|e| e.inbox.as_ref())
        {
            a.resume();
        }
    }

    /// "Do I hold this seat?", answered by freshness (spec § Admission): the
    /// epoch only when the last successful renew is within one heartbeat.
    pub fn may_start(&self, handle: &str) -> Option<u64> {
        let (epoch, age) = {
            let seats = lock(&self.inner.seats);
            let e = seats.get(handle)?;
            // An offer standing (or being made) stops admission: a
            // delivery queued behind the turn in flight is deferred to the
            // successor, never started here after the quiesce (the chaos
            // soak saw such a turn write memory the successor had already
            // hydrated without).
            if e.phase != Phase::Attached || e.offered {
                return None;
            }
            (e.lease.epoch, e.last_renewed.elapsed())
        };
        if age <= admission_window(self.inner.cfg.heartbeat) {
            Some(epoch)
        } else {
            self.inner.events.emit(Event::SeatAdmissionStale {
                seat: handle.to_string(),
                since_renew_ms: age.as_millis() as u64,
            });
            None
        }
    }

    /// Claim `seat:{handle}` and, when won, establish it.
    pub async fn claim(&self, handle: &str) -> Result<Acquired, crate::coord::StoreError> {
        self.claim_with(handle, &|| {}).await
    }

    /// [`SeatHost::claim`], calling `progress` as each step settles — the
    /// claim, each step of the acquire hook, each step of a hand-back: the
    /// caller's watchdog beat. Every step is bounded, but a claim whose hook
    /// fails and hands the seat back can take several of them in a row.
    pub async fn claim_with(
        &self,
        handle: &str,
        progress: &Progress<'_>,
    ) -> Result<Acquired, crate::coord::StoreError> {
        let seat_lock = self.seat_lock(handle);
        let Some(_g) = watched(progress, None, seat_lock.lock()).await else {
            return Ok(Acquired::Draining);
        };
        if self.is_draining() {
            return Ok(Acquired::Draining);
        }
        if lock(&self.inner.seats).contains_key(handle) {
            // Already ours (held or undead): nothing to claim.
            let lease = lock(&self.inner.seats)[handle].lease.clone();
            return Ok(Acquired::HeldBy(Box::new(lease)));
        }
        let sent = Instant::now();
        let req = ClaimRequest::new(
            format!("seat:{handle}"),
            self.inner.cfg.owner.clone(),
            self.inner.cfg.node_id.clone(),
        )
        .gated();
        let claimed = self.inner.store.claim(req).await;
        progress();
        if let Some(outcome) = crate::coord::claim_outcome(&claimed) {
            metrics::apply(&Update::count(metrics::CLAIMS, "outcome", outcome));
        }
        let lease = match claimed? {
            Claim::HeldBy(l) => return Ok(Acquired::HeldBy(Box::new(l))),
            Claim::Gated { floor } => return Ok(Acquired::Gated { floor }),
            Claim::Won(l) => l,
        };
        let epoch = lease.epoch;
        // A drain that began while the claim was in flight: hand it
        // straight back before anything is attached.
        if self.is_draining() {
            let _ = self
                .inner
                .store
                .release(&lease, &self.inner.cfg.owner)
                .await;
            return Ok(Acquired::Draining);
        }
        self.inner.events.emit(Event::SeatClaimed {
            seat: handle.to_string(),
            epoch,
            claim_ms: sent.elapsed().as_millis() as u64,
        });
        lock(&self.inner.seats).insert(
            handle.to_string(),
            SeatEntry::establishing(lease.clone(), sent),
        );
        let ctx = SeatContext {
            handle: handle.to_string(),
            epoch,
            lease,
        };
        match self.establish(&ctx, progress, false).await {
            Ok(()) => {
                self.inner.events.emit(Event::SeatAttached {
                    seat: handle.to_string(),
                    epoch,
                });
                self.inner.hooks.established(&ctx).await;
                Ok(Acquired::Won {
                    epoch,
                    established: true,
                })
            }
            Err(e) => {
                tracing::warn!(seat = handle, epoch, error = %e, "the acquire hook failed; handing the seat back");
                // A seat whose detached runs cannot be recovered is handed
                // back voluntarily (`unprepared`); any other step is fenced.
                let reason = if e.step == "run recovery" {
                    DetachReason::Unprepared
                } else {
                    DetachReason::HookFailed
                };
                self.release_locked(handle, reason, progress).await;
                Ok(Acquired::Won {
                    epoch,
                    established: false,
                })
            }
        }
    }

    /// The acquire hook, in the spec's order. Attachments land in the entry
    /// as they are made, so a failure part way detaches what was attached.
    /// The acquire hook's first steps, which need no epoch: what a
    /// successor does while the giver still holds the seat.
    async fn prepare(&self, ctx: &SeatContext, progress: &Progress<'_>) -> Result<(), HookError> {
        let hooks = self.inner.hooks.clone();
        let guarded = async {
            hook_step(progress, "children", hooks.start_children(ctx)).await?;
            progress();
            hook_step(progress, "memory hydration", hooks.hydrate_memory(ctx)).await?;
            progress();
            Ok(())
        };
        match AssertUnwindSafe(guarded).catch_unwind().await {
            Ok(r) => r,
            Err(_) => Err(HookError::new("acquire hook", "panicked")),
        }
    }

    async fn establish(
        &self,
        ctx: &SeatContext,
        progress: &Progress<'_>,
        prepared: bool,
    ) -> Result<(), HookError> {
        let hooks = self.inner.hooks.clone();
        let guarded = async {
            if !prepared {
                self.prepare(ctx, progress).await?;
            }
            let reflect = hook_step(progress, "reflect attach", hooks.attach_reflect(ctx)).await?;
            self.watch_loop("reflect", &ctx.handle, reflect.as_ref());
            self.put_attachment(&ctx.handle, |e| e.reflect = reflect);
            progress();
            let control = hook_step(progress, "control attach", hooks.attach_control(ctx)).await?;
            self.watch_loop("control", &ctx.handle, control.as_ref());
            self.put_attachment(&ctx.handle, |e| e.control = control);
            progress();
            let holds = hook_step(progress, "pause holds", hooks.pause_holds(ctx)).await?;
            progress();
            let holds: Vec<&str> = holds.iter().map(String::as_str).collect();
            let fence = Fence {
                host: Arc::downgrade(&self.inner),
                handle: ctx.handle.clone(),
                epoch: ctx.epoch,
            };
            let handler = hooks.inbox_handler(ctx, fence);
            let inbox = self
                .inner
                .queue
                .attach(&inbox_group(&ctx.handle), &holds, handler)
                .await
                .map_err(|e| HookError::new("inbox attach", e.to_string()))?;
            self.watch_loop("dispatch", &ctx.handle, Some(&inbox));
            self.put_attachment(&ctx.handle, |e| {
                e.inbox = Some(inbox);
                e.phase = Phase::Attached;
            });
            Ok(())
        };
        match AssertUnwindSafe(guarded).catch_unwind().await {
            Ok(r) => r,
            Err(_) => Err(HookError::new("acquire hook", "panicked")),
        }
    }

    /// Have the watchdog follow an attachment's dispatch loop
    /// (`{kind}:{handle}`: the inbox's `dispatch`, `control`, `reflect`):
    /// every loop that can hold a seat's mail is watched.
    fn watch_loop(&self, kind: &str, handle: &str, attachment: Option<&Attachment>) {
        if let (Some(w), Some(a)) = (lock(&self.inner.watchdog).as_ref(), attachment) {
            w.follow(&format!("{kind}:{handle}"), a.pulse());
        }
    }

    fn put_attachment(&self, handle: &str, f: impl FnOnce(&mut SeatEntry)) {
        if let Some(e) = lock(&self.inner.seats).get_mut(handle) {
            f(e);
        }
    }

    /// Give a seat back for `reason` (voluntary or fenced by the reason).
    pub async fn release(&self, handle: &str, reason: DetachReason) {
        self.release_with(handle, reason, &|| {}).await
    }

    /// [`SeatHost::release`], calling `progress` as each step settles (the
    /// caller's watchdog beat).
    pub async fn release_with(&self, handle: &str, reason: DetachReason, progress: &Progress<'_>) {
        let seat_lock = self.seat_lock(handle);
        let Some(_g) = watched(progress, None, seat_lock.lock()).await else {
            return;
        };
        self.release_locked(handle, reason, progress).await;
    }

    async fn release_locked(&self, handle: &str, reason: DetachReason, progress: &Progress<'_>) {
        let taken = {
            let mut seats = lock(&self.inner.seats);
            match seats.get_mut(handle) {
                Some(e) if e.phase != Phase::Undead => Some((
                    {
                        // A fenced release closes the fence before anything
                        // else: a running turn stops at its next check.
                        e.fenced = reason.is_fenced();
                        e.lease.clone()
                    },
                    e.inbox.take(),
                    e.control.take(),
                    e.reflect.take(),
                )),
                _ => None,
            }
        };
        let Some((lease, inbox, control, reflect)) = taken else {
            return;
        };
        if reason.is_fenced() {
            // Detach first; abandon what is in flight; republish nothing.
            for a in [inbox, control, reflect].into_iter().flatten() {
                a.detach().await;
            }
        } else {
            if let Some(a) = &inbox {
                a.quiesce();
                if !a.wait_idle(self.inner.cfg.release_wait).await {
                    tracing::warn!(
                        seat = handle,
                        "the in-flight turn did not finish in time; its fence closes at the last flush and the next holder runs it"
                    );
                }
                progress();
            }
            for a in [inbox, control, reflect].into_iter().flatten() {
                a.detach().await;
            }
            // The teardown flushes the seat's memory for its next holder: a
            // turn still running is fenced from here, not finished after it.
            if let Some(e) = lock(&self.inner.seats).get_mut(handle) {
                e.last_flush = true;
            }
        }
        self.inner.events.emit(Event::SeatDetached {
            seat: handle.to_string(),
            epoch: lease.epoch,
            reason,
        });
        if reason == DetachReason::RoleGone {
            self.inner.events.emit(Event::SeatReleasedRoleGone {
                seat: handle.to_string(),
            });
        }
        progress();
        let ctx = SeatContext::of(handle, &lease);
        let torn_down = self.teardown(&ctx, progress).await;
        progress();
        match torn_down {
            Ok(()) => {
                lock(&self.inner.seats).remove(handle);
                if reason != DetachReason::Lost {
                    self.give_back(&lease).await;
                    progress();
                }
            }
            Err(e) => {
                if reason == DetachReason::Lost {
                    // Nothing left to keep renewing: the tenure is over.
                    tracing::error!(seat = handle, error = %e, "teardown failed on a lost seat");
                    lock(&self.inner.seats).remove(handle);
                    return;
                }
                self.inner.events.emit(Event::SeatReleaseUnproven {
                    seat: handle.to_string(),
                    epoch: lease.epoch,
                    error: e.to_string(),
                });
                if let Some(entry) = lock(&self.inner.seats).get_mut(handle) {
                    // Unproven: the lease is kept, so a turn still in flight
                    // races nobody and finishes (spec § Fencing); the
                    // teardown's retry flushes what it wrote.
                    entry.last_flush = false;
                    entry.phase = Phase::Undead;
                    entry.undead_since = Some(Instant::now());
                    entry.attempts = 1;
                    entry.last_error = e.to_string();
                }
            }
        }
    }

    async fn teardown(&self, ctx: &SeatContext, progress: &Progress<'_>) -> Result<(), HookError> {
        let run = async {
            match AssertUnwindSafe(self.inner.hooks.release(ctx))
                .catch_unwind()
                .await
            {
                Ok(r) => r,
                Err(_) => Err(HookError::new("release hook", "panicked")),
            }
        };
        hook_step(progress, "release hook", run).await
    }

    async fn give_back(&self, lease: &Lease) {
        match self.inner.store.release(lease, &self.inner.cfg.owner).await {
            Ok(Release::Released) => {}
            Ok(Release::NotHeld) => {
                tracing::debug!(resource = %lease.resource, "lease already gone at release")
            }
            Err(e) => {
                tracing::warn!(resource = %lease.resource, error = %e, "cannot release the lease; it lapses at its TTL")
            }
        }
    }

    /// One heartbeat: renew every seat lease (held and undead), resume
    /// inboxes a blip had held, fence what was lost, retry undead teardowns.
    pub async fn heartbeat(&self, ttl: Duration) {
        self.heartbeat_with(ttl, &|| {}).await
    }

    /// [`SeatHost::heartbeat`], calling `progress` as each seat's renewal
    /// settles (the heartbeat loop's watchdog beat: a loop whose store
    /// calls keep returning is turning, however slow the store). Seats are
    /// renewed [`RENEW_CONCURRENCY`] at a time, so a pass against a store
    /// that stopped answering lasts about one store timeout, not one per
    /// seat, and every seat is fenced a TTL after its last renewal.
    ///
    /// One seat's work never holds up the others' renewals: a pass ends
    /// when every seat is renewed, so a seat whose lock is busy would
    /// delay every seat's next renewal by as long as it stays busy (an
    /// acquire hook hydrating for longer than the TTL under load fenced
    /// every seat of its node as `grace_expired`, pass after pass). A seat
    /// a claim is establishing is renewed without its lock
    /// ([`SeatHost::renew_establishing`]); any other busy seat (a hand-back
    /// or a release is dealing with its lease) is waited for a quarter TTL
    /// at most, then left to the next pass.
    pub async fn heartbeat_with(&self, ttl: Duration, progress: &Progress<'_>) {
        let handles: Vec<String> = lock(&self.inner.seats).keys().cloned().collect();
        futures::stream::iter(handles)
            .for_each_concurrent(RENEW_CONCURRENCY, |handle| async move {
                let seat_lock = self.seat_lock(&handle);
                let guard = match seat_lock.try_lock() {
                    Ok(g) => Some(g),
                    Err(_) if self.phase(&handle) == Some(Phase::Establishing) => {
                        self.renew_establishing(&handle, ttl).await;
                        progress();
                        return;
                    }
                    // Bounded and beaten: the heartbeat waiting its turn is
                    // not a wedged loop.
                    Err(_) => watched(progress, Some(ttl / 4), seat_lock.lock()).await,
                };
                let Some(_g) = guard else {
                    return;
                };
                self.renew_one(&handle, ttl, progress).await;
                progress();
            })
            .await;
    }

    fn phase(&self, handle: &str) -> Option<Phase> {
        lock(&self.inner.seats).get(handle).map(|e| e.phase)
    }

    /// Renew the lease of a seat a claim is establishing, without the
    /// seat's lock the claim holds: establishing never writes the lease,
    /// and an acquire hook slower than the TTL must not lose the seat it
    /// is establishing. Only a renewal is taken in (the lease it was sent
    /// from still the entry's); any other answer — lost, unknown, a lease
    /// already past its TTL — is left to the next pass that has the lock,
    /// which fences or releases as ever.
    async fn renew_establishing(&self, handle: &str, ttl: Duration) {
        let Some(lease) = lock(&self.inner.seats)
            .get(handle)
            .filter(|e| e.phase == Phase::Establishing && e.last_renewed.elapsed() <= ttl)
            .map(|e| e.lease.clone())
        else {
            return;
        };
        let (sent, renewal) = self.send_renewal(&lease).await;
        if let Renewal::Renewed(l) = renewal
            && let Some(e) = lock(&self.inner.seats).get_mut(handle)
            && e.lease.epoch == lease.epoch
            && e.lease.revision == lease.revision
        {
            e.lease = l;
            e.last_renewed = sent;
        }
    }

    /// Renew `lease` (counted in `crewlet_renewals_total`): when it was
    /// sent, and the store's answer.
    async fn send_renewal(&self, lease: &Lease) -> (Instant, Renewal) {
        let sent = Instant::now();
        let renewal = self
            .inner
            .store
            .renew(lease, &self.inner.cfg.owner, self.renewal_metadata(lease))
            .await;
        metrics::apply(&Update::count(
            metrics::RENEWALS,
            "outcome",
            renewal.outcome(),
        ));
        (sent, renewal)
    }

    async fn renew_one(&self, handle: &str, ttl: Duration, progress: &Progress<'_>) {
        let Some((lease, phase, last)) = lock(&self.inner.seats)
            .get(handle)
            .map(|e| (e.lease.clone(), e.phase, e.last_renewed))
        else {
            return;
        };
        if phase != Phase::Undead && last.elapsed() > ttl {
            // No renewal has proven the seat for a TTL (the store did not
            // answer, or this process did not run): a peer may hold it. A
            // lapsed lease cannot be renewed, only re-acquired, so there is
            // nothing to ask the store.
            self.release_locked(handle, DetachReason::GraceExpired, progress)
                .await;
            return;
        }
        let (sent, renewal) = self.send_renewal(&lease).await;
        match renewal {
            Renewal::Renewed(l) => {
                let mut seats = lock(&self.inner.seats);
                if let Some(e) = seats.get_mut(handle) {
                    e.lease = l;
                    e.last_renewed = sent;
                    // Still this node's: the deliveries its turns hold are
                    // kept another ack window (a fenced or lost seat, and a
                    // node whose heartbeat stopped, extend nothing).
                    if !e.fenced {
                        for a in [&e.inbox, &e.control, &e.reflect].into_iter().flatten() {
                            a.extend();
                        }
                    }
                    if e.blip {
                        e.blip = false;
                        if let Some(a) = &e.inbox {
                            a.unhold(BLIP_HOLD);
                        }
                    }
                    // Ownership proven again: an inbox a deferral quiesced
                    // consumes again (the edge the spec says must not be
                    // missed, or the seat is owned, attached and deaf).
                    if let Some(a) = &e.inbox
                        && a.is_quiesced()
                        && !e.offered
                    {
                        a.resume();
                    }
                }
            }
            Renewal::Lost => {
                if phase == Phase::Undead {
                    self.undead_lost(handle);
                } else {
                    self.release_locked(handle, DetachReason::Lost, progress)
                        .await;
                }
                return;
            }
            Renewal::Unknown(err) => {
                let first = {
                    let mut seats = lock(&self.inner.seats);
                    match seats.get_mut(handle) {
                        Some(e) if !e.blip => {
                            e.blip = true;
                            if let Some(a) = &e.inbox {
                                a.hold(BLIP_HOLD);
                            }
                            true
                        }
                        _ => false,
                    }
                };
                if first {
                    self.inner.events.emit(Event::SeatRenewUnknown {
                        seat: handle.to_string(),
                        error: err.to_string(),
                    });
                }
                if last.elapsed() > ttl && phase != Phase::Undead {
                    self.release_locked(handle, DetachReason::GraceExpired, progress)
                        .await;
                    return;
                }
            }
        }
        if phase == Phase::Undead {
            progress();
            self.retry_teardown(handle, progress).await;
        }
    }

    /// An undead seat's lease is gone: this node keeps it no longer, and
    /// says so (an ERROR and `seat_undead_lost`: what its teardown could
    /// not stop may act beside the next holder).
    fn undead_lost(&self, handle: &str) {
        let Some(e) = lock(&self.inner.seats).remove(handle) else {
            return;
        };
        let elapsed = e.undead_since.map(|s| s.elapsed()).unwrap_or_default();
        tracing::error!(seat = handle, epoch = e.lease.epoch, error = %e.last_error, "an undead seat's lease was lost; its teardown is still unproven");
        self.inner.events.emit(Event::SeatUndeadLost {
            seat: handle.to_string(),
            epoch: e.lease.epoch,
            elapsed_seconds: elapsed.as_secs(),
            attempts: e.attempts,
            error: e.last_error,
        });
    }

    async fn retry_teardown(&self, handle: &str, progress: &Progress<'_>) {
        let Some(lease) = lock(&self.inner.seats).get(handle).map(|e| e.lease.clone()) else {
            return;
        };
        let ctx = SeatContext::of(handle, &lease);
        match self.teardown(&ctx, progress).await {
            Ok(()) => {
                let attempts = lock(&self.inner.seats)
                    .remove(handle)
                    .map(|e| e.attempts + 1)
                    .unwrap_or(0);
                self.give_back(&lease).await;
                self.inner.events.emit(Event::SeatReleaseRecovered {
                    seat: handle.to_string(),
                    epoch: lease.epoch,
                    attempts,
                });
            }
            Err(e) => {
                let alarm = {
                    let mut seats = lock(&self.inner.seats);
                    seats.get_mut(handle).map(|entry| {
                        entry.attempts += 1;
                        entry.last_error = e.to_string();
                        (
                            entry.attempts,
                            entry.undead_since.map(|s| s.elapsed()).unwrap_or_default(),
                        )
                    })
                };
                if let Some((attempts, elapsed)) = alarm
                    && attempts % STILL_UNPROVEN_EVERY == 1
                {
                    self.inner.events.emit(Event::SeatStillUnproven {
                        seat: handle.to_string(),
                        epoch: lease.epoch,
                        elapsed_seconds: elapsed.as_secs(),
                        attempts,
                        error: e.to_string(),
                    });
                }
            }
        }
    }

    /// Drop every seat without releasing anything (what a crash leaves:
    /// leases lapse at their TTL). Tests use it to play a dead node.
    pub async fn abandon(&self) {
        let entries: Vec<SeatEntry> = std::mem::take(&mut *lock(&self.inner.seats))
            .into_values()
            .collect();
        for e in entries {
            for a in [e.inbox, e.control, e.reflect].into_iter().flatten() {
                a.abandon().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_a_few_milliseconds_late_still_admits_and_a_turn_stays_owned_for_most_of_the_ttl()
    {
        let beat = Duration::from_secs(1);
        // The churn seen in the logs: deferrals at 1000–1013 ms since the renew.
        assert!(Duration::from_millis(1013) <= admission_window(beat));
        // Two missed ticks never admit.
        assert!(Duration::from_millis(2000) > admission_window(beat));
        // The defaults (15 s heartbeat, 45 s TTL): certified owned ≥ 28.5 s.
        let (heartbeat, ttl) = (Duration::from_secs(15), Duration::from_secs(45));
        assert_eq!(
            ttl - admission_window(heartbeat),
            Duration::from_millis(28_500)
        );
    }
}
