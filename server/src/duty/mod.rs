//! Singleton duties (spec § Singleton duties): work that belongs to the
//! company rather than to a seat, run by one node of the fleet at a time.
//!
//! Each duty sits behind a `worker:{duty}` lease in `crewlet_duties`,
//! claimed per tick rather than held: a tick first renews the lease it took
//! last time or claims it afresh, and runs only when that answer is yes. A
//! claim or renew that errors skips the tick — unknown ownership is not
//! ownership. A duty's TTL is three of its own ticks, so one slow claim
//! never moves it. There is no handoff protocol: a node that stops
//! gracefully gives every duty back once its loop has finished its last
//! tick (`duty_released`), and a peer takes it on its next tick; a node
//! that dies lets it lapse. On a single node the store always says yes.
//!
//! The watchdog follows each duty loop (`duty:{name}`). Its claim or
//! renewal before a tick is a store call bounded by the store's timeout,
//! beaten while it waits. While a tick runs
//! the loop beats on its behalf only while the tick is turning: a duty
//! calls [`turned`] after each step of its work (a store call, a seat
//! judged, a fire published), and a tick whose last step is older than
//! [`step_bound`] — or that has outlived its own lease, three ticks — is
//! left unbeaten, so one blocked on something that never returns is named
//! wedged within a step bound of its last step, however rarely its duty
//! ticks.

pub mod mailboxes;
pub mod maintenance;
pub mod scheduler;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::coord::{Claim, ClaimRequest, Lease, Release, Renewal, Store};
use crate::events::{Event, EventBus};
use crate::tasks::Tasks;
use crate::watchdog::{BeatGuard, Watchdog, beat_while, stamp_interval};

/// One duty.
#[async_trait::async_trait]
pub trait Duty: Send + Sync + 'static {
    /// Its name: the lease is `worker:{name}`.
    fn name(&self) -> &'static str;
    /// How often it ticks.
    fn every(&self) -> Duration;
    /// One tick, run only by the duty's holder. It logs what failed (and
    /// emits what a person must see); the next tick tries again.
    async fn tick(&self);
}

/// What every duty loop of a node shares.
#[derive(Clone)]
pub struct DutyContext {
    pub store: Arc<dyn Store>,
    pub node_id: String,
    /// The process incarnation: the owner of the duty leases.
    pub owner: String,
    pub protocol: u32,
    pub events: EventBus,
    /// Watches each duty loop as `duty:{name}` (spec § The wedged node:
    /// each duty stamps a beat as it turns). `None`: unwatched.
    pub watchdog: Option<Watchdog>,
}

/// The node's duty loops: stopping them gracefully gives every duty back;
/// abandoning them (what a crash does) gives nothing back.
#[derive(Clone, Default)]
pub struct Duties {
    abandon: Arc<AtomicBool>,
    stop: CancellationToken,
}

impl Duties {
    pub fn new() -> Duties {
        Duties::default()
    }

    /// Start `duty`'s loop, owned by `tasks`.
    pub fn start(&self, tasks: &Tasks, ctx: DutyContext, duty: Arc<dyn Duty>) {
        let abandon = self.abandon.clone();
        let stop = self.stop.clone();
        tasks.spawn_owned("duty", move |token| run(ctx, duty, token, stop, abandon));
    }

    /// Stop every loop after its current tick and give the duties back.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Stop every loop and give nothing back (the leases lapse).
    pub fn abandon(&self) {
        self.abandon.store(true, Ordering::SeqCst);
        self.stop.cancel();
    }
}

/// Await `fut` beating the duty's loop (if watched).
async fn beating<F: std::future::Future>(beat: Option<&Beat>, fut: F) -> F::Output {
    match beat {
        Some((guard, stamp, _)) => beat_while(&|| guard.beat(), *stamp, None, fut).await,
        None => fut.await,
    }
}

/// The TTL of a duty ticking every `every`: three ticks.
pub fn duty_ttl(every: Duration) -> Duration {
    every * 3
}

/// How long one step of a tick may take before the tick counts as not
/// turning: four watchdog thresholds (the lease TTL). Every step is a
/// bounded call (a store call within the store timeout, a broker call
/// within its own), so a step past this is blocked, not slow.
pub fn step_bound(threshold: Duration) -> Duration {
    threshold * 4
}

/// When the tick running on a task last finished a step.
#[derive(Clone)]
struct Turning(Arc<std::sync::Mutex<std::time::Instant>>);

impl Turning {
    fn new() -> Turning {
        Turning(Arc::new(std::sync::Mutex::new(std::time::Instant::now())))
    }

    fn mark(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = std::time::Instant::now();
    }

    fn since(&self) -> Duration {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).elapsed()
    }
}

tokio::task_local! {
    /// The tick running on this task: what [`turned`] marks.
    static TURNING: Turning;
}

/// The duty tick running on this task finished a step of its work (a
/// no-op outside a watched tick, and on a task the tick spawned).
pub fn turned() {
    let _ = TURNING.try_with(Turning::mark);
}

/// Run one tick of `duty`, beating its loop (if watched) while the tick is
/// turning ([`turned`] within [`step_bound`]) and within its lease.
async fn tick_turning(duty: &dyn Duty, every: Duration, beat: Option<&Beat>) {
    let Some((guard, stamp, threshold)) = beat else {
        return duty.tick().await;
    };
    let turning = Turning::new();
    let began = std::time::Instant::now();
    let (bound, lease) = (step_bound(*threshold), duty_ttl(every));
    let seen = turning.clone();
    let turning_now = || {
        if began.elapsed() < lease && seen.since() < bound {
            guard.beat();
        }
    };
    beat_while(
        &turning_now,
        *stamp,
        None,
        TURNING.scope(turning, duty.tick()),
    )
    .await
}

/// A watched loop's beat: its guard, how often it stamps, and the
/// watchdog's threshold.
type Beat = (BeatGuard, Duration, Duration);

/// Renew what this node took last tick, or claim afresh. `None`: not ours
/// (or unknown) this tick.
async fn ours(ctx: &DutyContext, name: &str, every: Duration, held: &mut Option<Lease>) -> bool {
    if let Some(l) = held.take() {
        match ctx.store.renew(&l, &ctx.owner, None).await {
            Renewal::Renewed(l) => {
                *held = Some(l);
                return true;
            }
            Renewal::Lost => {}
            Renewal::Unknown(e) => {
                tracing::warn!(duty = name, error = %e, "cannot renew the duty; skipping this tick");
                *held = Some(l);
                return false;
            }
        }
    }
    let mut req = ClaimRequest::new(format!("worker:{name}"), &ctx.owner, &ctx.node_id);
    req.protocol = ctx.protocol;
    req.ttl = Some(duty_ttl(every));
    match ctx.store.claim(req).await {
        Ok(Claim::Won(l)) => {
            tracing::info!(duty = name, epoch = l.epoch, "duty taken");
            *held = Some(l);
            true
        }
        Ok(Claim::HeldBy(_) | Claim::Gated { .. }) => false,
        Err(e) => {
            tracing::warn!(duty = name, error = %e, "cannot claim the duty; skipping this tick");
            false
        }
    }
}

async fn run(
    ctx: DutyContext,
    duty: Arc<dyn Duty>,
    token: CancellationToken,
    stop: CancellationToken,
    abandon: Arc<AtomicBool>,
) {
    let name = duty.name();
    let every = duty.every();
    let mut held: Option<Lease> = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Retired when the loop ends: a duty that is gone is not wedged.
    let beat: Option<Beat> = ctx.watchdog.as_ref().map(|w| {
        (
            w.watch(&format!("duty:{name}")),
            stamp_interval(w.threshold()),
            w.threshold(),
        )
    });
    loop {
        tokio::select! {
            _ = token.cancelled() => break,
            _ = stop.cancelled() => break,
            _ = beating(beat.as_ref(), tick.tick()) => {}
        }
        // A store call, bounded by the store's timeout: a wait, not a wedge.
        if beating(beat.as_ref(), ours(&ctx, name, every, &mut held)).await {
            // The tick runs to its end even if a stop arrives meanwhile:
            // the duty is given back after its last tick, not during it.
            // It is turning while its steps are (within a step bound of
            // the last) and its lease holds (three ticks); past either the
            // beat stops, so a tick blocked on something that never
            // returns is seen.
            tick_turning(&*duty, every, beat.as_ref()).await;
        }
        if let Some((b, _, _)) = &beat {
            b.beat();
        }
    }
    if abandon.load(Ordering::SeqCst) {
        return;
    }
    if let Some(l) = held {
        match ctx.store.release(&l, &ctx.owner).await {
            Ok(Release::Released) => ctx.events.emit(Event::DutyReleased {
                duty: name.to_string(),
            }),
            Ok(Release::NotHeld) => {}
            Err(e) => {
                tracing::warn!(duty = name, error = %e, "cannot give the duty back; it lapses at its TTL")
            }
        }
    }
}
