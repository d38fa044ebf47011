//! Letting a seat go on the seat host: detach its subscriptions (a fenced
//! release at once, any other after the turn in flight, bounded), run the
//! release hook, and give the lease back only after a proven teardown; an
//! unproven one keeps the lease and leaves the seat undead.

use tokio::time::Instant;

use super::*;

impl SeatHost {
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

    pub(super) async fn release_locked(
        &self,
        handle: &str,
        reason: DetachReason,
        progress: &Progress<'_>,
    ) {
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
            Err(e) => self.teardown_failed(handle, &lease, reason, &e),
        }
    }

    /// A teardown that failed: a lost seat is forgotten (nothing is left to
    /// renew, the tenure is over); any other keeps its lease and is undead
    /// until a retry proves the teardown.
    fn teardown_failed(&self, handle: &str, lease: &Lease, reason: DetachReason, e: &HookError) {
        if reason == DetachReason::Lost {
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

    pub(super) async fn teardown(
        &self,
        ctx: &SeatContext,
        progress: &Progress<'_>,
    ) -> Result<(), HookError> {
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

    pub(super) async fn give_back(&self, lease: &Lease) {
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
}
