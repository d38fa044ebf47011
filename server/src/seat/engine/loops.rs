//! The seat engine's two long-lived loops: the sweep, one pass every
//! `sweep` interval (sooner after a company change, at most one early
//! pass per interval), watched as `sweep`; and the company watch, which
//! makes a new seat's mailboxes before anything claims it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::SeatEngine;
use crate::company::wants_early_sweep;
use crate::events::Event;
use crate::queue::boot_walk;
use crate::seat::placement;
use crate::watchdog::stamp_interval;

impl SeatEngine {
    pub(super) async fn sweep_loop(self: Arc<Self>) {
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
                    // Seats left for a recheck, or free seats past the
                    // claim pace: one more pass shortly.
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

    pub(super) async fn company_loop(self: Arc<Self>) {
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
}
