//! The successor's side of the two-phase handoff (handoff § 5 in the
//! lease world of the spec): prepare the seat while its giver still holds
//! it, take the offered lease by compare-and-set (the next epoch), and
//! only then attach; anything short of a take undoes the preparation.

use crate::watchdog::Progress;

use super::*;

impl SeatHost {
    /// Take the lease offered under `offer_id` (counted as a claim): the
    /// lease, or what stands instead, the preparation undone.
    pub(super) async fn take_offered(
        &self,
        resource: &str,
        offer_id: &str,
        provisional: &SeatContext,
        progress: &Progress<'_>,
    ) -> Result<Result<Lease, Acquired>, crate::coord::StoreError> {
        let taken = self
            .inner
            .store
            .take(
                resource,
                offer_id,
                &self.inner.cfg.owner,
                &self.inner.cfg.node_id,
                crate::config::protocol(),
            )
            .await;
        progress();
        // A take is a claim (of an offered seat): counted the same way.
        if let Some(outcome) = crate::coord::claim_outcome(&taken) {
            crate::metrics::apply(&crate::metrics::Update::count(
                crate::metrics::CLAIMS,
                "outcome",
                outcome,
            ));
        }
        match taken {
            Ok(Claim::Won(l)) => Ok(Ok(l)),
            Ok(Claim::HeldBy(l)) => {
                let _ = self.inner.hooks.unprepare(provisional).await;
                Ok(Err(Acquired::HeldBy(Box::new(l))))
            }
            Ok(Claim::Gated { floor }) => {
                let _ = self.inner.hooks.unprepare(provisional).await;
                Ok(Err(Acquired::Gated { floor }))
            }
            Err(e) => {
                let _ = self.inner.hooks.unprepare(provisional).await;
                Err(e)
            }
        }
    }

    /// The successor's side: prepare `handle` while its giver still holds
    /// it, take the lease offered under `offer_id`, then attach. Anything
    /// short of a take undoes the preparation; the giver withdraws at its
    /// bound.
    pub async fn take_offer(
        &self,
        handle: &str,
        offer_id: &str,
        progress: &Progress<'_>,
    ) -> Result<Acquired, crate::coord::StoreError> {
        let seat_lock = self.seat_lock(handle);
        let Some(_g) = watched(progress, None, seat_lock.lock()).await else {
            return Ok(Acquired::Draining);
        };
        if self.is_draining() {
            return Ok(Acquired::Draining);
        }
        let resource = format!("seat:{handle}");
        let Some(current) = self.inner.store.lease(&resource).await? else {
            return Err(crate::coord::StoreError::ClaimFailed {
                key: resource,
                reason: "the offered lease is gone".into(),
            });
        };
        if lock(&self.inner.seats).contains_key(handle) {
            return Ok(Acquired::HeldBy(Box::new(current)));
        }
        let Some(offer) = current
            .offer
            .clone()
            .filter(|o| o.id == offer_id && o.to == self.inner.cfg.node_id)
        else {
            return Ok(Acquired::HeldBy(Box::new(current)));
        };
        // Prepare under the giver's lease: these steps need no epoch.
        let provisional = SeatContext::of(handle, &current);
        if let Err(e) = self.prepare(&provisional, progress).await {
            tracing::warn!(seat = handle, error = %e, "cannot prepare an offered seat; the giver keeps it");
            let _ = self.inner.hooks.unprepare(&provisional).await;
            return Ok(Acquired::HeldBy(Box::new(current)));
        }
        let sent = Instant::now();
        let lease = match self
            .take_offered(&resource, offer_id, &provisional, progress)
            .await?
        {
            Ok(l) => l,
            Err(not) => return Ok(not),
        };
        let epoch = lease.epoch;
        self.inner.events.emit(Event::SeatClaimed {
            seat: handle.to_string(),
            epoch,
            claim_ms: sent.elapsed().as_millis() as u64,
        });
        lock(&self.inner.seats).insert(
            handle.to_string(),
            SeatEntry::establishing(lease.clone(), sent),
        );
        let ctx = SeatContext::of(handle, &lease);
        match self.establish(&ctx, progress, true).await {
            Ok(()) => {
                self.inner.events.emit(Event::SeatAttached {
                    seat: handle.to_string(),
                    epoch,
                });
                let dark_ms = match self.inner.store.now().await {
                    Ok(now) => now.since(offer.quiesced_at).as_millis() as u64,
                    Err(_) => 0,
                };
                self.inner.events.emit(Event::SeatOfferTaken {
                    seat: handle.to_string(),
                    epoch,
                    from_epoch: current.epoch,
                    from: current.preferred.clone(),
                    dark_ms,
                });
                self.inner.hooks.established(&ctx).await;
                Ok(Acquired::Won {
                    epoch,
                    established: true,
                })
            }
            Err(e) => {
                tracing::warn!(seat = handle, epoch, error = %e, "the acquire hook failed after a take; handing the seat back");
                self.release_locked(handle, DetachReason::HookFailed, progress)
                    .await;
                Ok(Acquired::Won {
                    epoch,
                    established: false,
                })
            }
        }
    }
}
