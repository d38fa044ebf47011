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
        let reason = self.reason_now(handle, reason);
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

    /// [`release_reason`] for `handle` now, said at WARN when a voluntary
    /// release is fenced instead.
    fn reason_now(&self, handle: &str, asked: DetachReason) -> DetachReason {
        let ttl = self.inner.store.lease_ttl();
        let since_renewal = lock(&self.inner.seats)
            .get(handle)
            .filter(|e| e.phase != Phase::Undead)
            .map(|e| e.last_renewed.elapsed());
        let reason = release_reason(asked, since_renewal, ttl);
        if reason != asked {
            tracing::warn!(
                seat = handle,
                asked = asked.as_str(),
                since_renewal_ms = since_renewal.map_or(0, |d| d.as_millis() as u64),
                "no renewal has proven the seat for a TTL: released as grace_expired, nothing handed over"
            );
        }
        reason
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

/// Pure: the reason a release of a seat goes out under, from the reason
/// asked for and how long ago its last renewal was sent (`None`: an undead
/// seat, whose lease is kept, or one not held). A voluntary release of a
/// seat no renewal has proven for a TTL — its process was stopped, or its
/// store did not answer — is fenced as `grace_expired`: a peer may hold
/// the seat, so nothing is flushed for a successor and nothing in flight
/// is waited for, as the heartbeat would have fenced it (chaos soak seed
/// 13536: a node resumed after 31 s stopped let a seat go for rebalance,
/// flushing its memory, 28 s after a peer had claimed it).
pub fn release_reason(
    asked: DetachReason,
    since_renewal: Option<std::time::Duration>,
    ttl: std::time::Duration,
) -> DetachReason {
    match since_renewal {
        Some(age) if !asked.is_fenced() && age >= ttl => DetachReason::GraceExpired,
        _ => asked,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_voluntary_release_of_a_seat_no_renewal_proved_for_a_ttl_is_fenced_as_grace_expired() {
        let ttl = Duration::from_secs(3);
        for asked in [
            DetachReason::Rebalance,
            DetachReason::Drain,
            DetachReason::RoleGone,
        ] {
            assert_eq!(
                release_reason(asked, Some(Duration::from_secs(31)), ttl),
                DetachReason::GraceExpired,
                "{asked:?}"
            );
            assert_eq!(
                release_reason(asked, Some(ttl), ttl),
                DetachReason::GraceExpired
            );
            assert_eq!(
                release_reason(asked, Some(ttl - Duration::from_millis(1)), ttl),
                asked,
                "proven within the TTL: {asked:?} as asked"
            );
            assert_eq!(release_reason(asked, None, ttl), asked, "undead: as asked");
        }
        assert_eq!(
            release_reason(DetachReason::Lost, Some(Duration::from_secs(31)), ttl),
            DetachReason::Lost,
            "a fenced reason stays"
        );
    }
}
