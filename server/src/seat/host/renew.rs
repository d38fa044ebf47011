//! The seat host's heartbeat: every held seat's lease renewed (bounded
//! concurrency, the seat's lock respected), a lost lease fenced at once, an
//! undead seat's teardown tried again, and the draining mark carried.

use std::time::Duration;

use tokio::time::Instant;

use super::*;

impl SeatHost {
    /// What a seat renewal writes into the lease's metadata: the draining
    /// mark once a drain began (how Settings › Nodes tells a draining node,
    /// which gave its presence up first, from one whose presence is late);
    /// otherwise the lease's own.
    pub(super) fn renewal_metadata(&self, lease: &Lease) -> Option<crate::coord::Metadata> {
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

    pub(super) fn phase(&self, handle: &str) -> Option<Phase> {
        lock(&self.inner.seats).get(handle).map(|e| e.phase)
    }

    /// Renew the lease of a seat a claim is establishing, without the
    /// seat's lock the claim holds: establishing never writes the lease,
    /// and an acquire hook slower than the TTL must not lose the seat it
    /// is establishing. Only a renewal is taken in (the lease it was sent
    /// from still the entry's); any other answer — lost, unknown, a lease
    /// already past its TTL — is left to the next pass that has the lock,
    /// which fences or releases as ever.
    pub(super) async fn renew_establishing(&self, handle: &str, ttl: Duration) {
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
    pub(super) async fn send_renewal(&self, lease: &Lease) -> (Instant, Renewal) {
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

    pub(super) async fn renew_one(&self, handle: &str, ttl: Duration, progress: &Progress<'_>) {
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
    pub(super) fn undead_lost(&self, handle: &str) {
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

    pub(super) async fn retry_teardown(&self, handle: &str, progress: &Progress<'_>) {
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
}
