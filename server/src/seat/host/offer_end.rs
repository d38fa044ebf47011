//! How a standing offer ends on the giver's side (handoff § 6): not
//! taken within its bound, it is withdrawn by compare-and-set and the seat
//! resumes here (quiesce is reversible); taken, the seat is detached and
//! forgotten here (phase 2) — the successor's epoch is the assertion.

use crate::watchdog::Progress;
use std::time::Duration;

use super::handoff::HandOff;
use super::*;
use crate::coord::Offer;

impl SeatHost {
    /// The offer was not taken in time: withdraw it and resume. A
    /// withdrawal that finds the lease taken completes the handoff instead.
    pub(super) async fn withdraw(
        &self,
        handle: &str,
        offer: &Offer,
        reason: DetachReason,
        progress: &Progress<'_>,
    ) -> HandOff {
        let seat_lock = self.seat_lock(handle);
        let Some(_g) = watched(progress, None, seat_lock.lock()).await else {
            return HandOff::Lost;
        };
        self.clear_notice(&offer.to, handle, progress).await;
        let Some((lease, last_renewed)) = lock(&self.inner.seats)
            .get(handle)
            .map(|e| (e.lease.clone(), e.last_renewed))
        else {
            return HandOff::Lost;
        };
        // Unknown is not ownership either way: the offer may still stand,
        // so the seat stays quiesced while the withdrawal is tried again —
        // until a TTL after the seat was last proven held, then it is
        // fenced as the heartbeat would have (it cannot while this holds
        // the seat's lock). Counted from the withdrawal's start instead, a
        // giver cut off from the store stayed attached 7.4 s after its
        // successor attached (soak seed 13637, a blackhole: bound 6 s).
        let give_up = last_renewed + self.inner.store.lease_ttl();
        loop {
            if Instant::now() >= give_up {
                tracing::warn!(
                    seat = handle,
                    "the offer could not be withdrawn within a TTL of the seat's last renewal; fencing the seat"
                );
                self.release_locked(handle, DetachReason::GraceExpired, progress)
                    .await;
                return HandOff::Lost;
            }
            // The withdrawal renews the tenure from when it was sent, as a
            // heartbeat's renewal does: its write may have landed long
            // before its answer came, and the store counts the tenure from
            // the write.
            let sent = Instant::now();
            let withdrawal = watched(
                progress,
                None,
                self.inner.store.offer(&lease, &self.inner.cfg.owner, None),
            )
            .await;
            let Some(withdrawal) = withdrawal else {
                continue;
            };
            match withdrawal {
                Renewal::Renewed(l) => {
                    self.resume_withdrawn(handle, &l, sent, &offer.to, progress)
                        .await;
                    return HandOff::Withdrawn;
                }
                Renewal::Lost => return self.withdrawal_lost(handle, reason, progress).await,
                Renewal::Unknown(e) => {
                    progress();
                    tracing::debug!(seat = handle, error = %e, "the offer's withdrawal was not answered; trying again");
                    let retry = Instant::now() + Duration::from_millis(200);
                    tokio::time::sleep_until(retry.min(give_up)).await;
                }
            }
        }
    }

    /// The withdrawal sent at `sent` renewed the tenure as `l`: the seat
    /// consumes here again.
    async fn resume_withdrawn(
        &self,
        handle: &str,
        l: &Lease,
        sent: Instant,
        to: &str,
        progress: &Progress<'_>,
    ) {
        let inbox = lock(&self.inner.seats).get_mut(handle).and_then(|e| {
            e.lease = l.clone();
            e.last_renewed = sent;
            e.inbox.take()
        });
        let ctx = SeatContext::of(handle, l);
        self.resume_here(handle, inbox, &ctx, progress).await;
        self.inner.events.emit(Event::SeatOfferWithdrawn {
            seat: handle.to_string(),
            epoch: l.epoch,
            to: to.to_string(),
            why: "timeout".into(),
        });
    }

    /// The withdrawal found the tenure gone: taken by the successor (the
    /// handoff completes) or lost.
    async fn withdrawal_lost(
        &self,
        handle: &str,
        reason: DetachReason,
        progress: &Progress<'_>,
    ) -> HandOff {
        let resource = format!("seat:{handle}");
        match watched(progress, None, self.inner.store.lease(&resource)).await {
            Some(Ok(Some(l))) if l.owner != self.inner.cfg.owner => {
                self.detach_taken_locked(handle, reason, progress).await;
                HandOff::Taken { epoch: l.epoch }
            }
            _ => {
                self.release_locked(handle, DetachReason::Lost, progress)
                    .await;
                HandOff::Lost
            }
        }
    }

    /// Phase 2: the successor holds the seat; detach and forget it here.
    pub(super) async fn detach_taken(
        &self,
        handle: &str,
        reason: DetachReason,
        progress: &Progress<'_>,
    ) {
        let seat_lock = self.seat_lock(handle);
        let Some(_g) = watched(progress, None, seat_lock.lock()).await else {
            return;
        };
        self.detach_taken_locked(handle, reason, progress).await;
    }

    async fn detach_taken_locked(
        &self,
        handle: &str,
        reason: DetachReason,
        progress: &Progress<'_>,
    ) {
        let Some((lease, attachments)) = lock(&self.inner.seats).get_mut(handle).map(|e| {
            (
                e.lease.clone(),
                [e.inbox.take(), e.control.take(), e.reflect.take()],
            )
        }) else {
            return;
        };
        for a in attachments.into_iter().flatten() {
            a.detach().await;
        }
        self.inner.events.emit(Event::SeatDetached {
            seat: handle.to_string(),
            epoch: lease.epoch,
            reason,
        });
        progress();
        let ctx = SeatContext::of(handle, &lease);
        if let Err(e) = self.teardown(&ctx, progress).await {
            // Not this node's lease any more: nothing to keep renewing.
            tracing::error!(seat = handle, error = %e, "teardown failed after a handoff");
        }
        lock(&self.inner.seats).remove(handle);
    }
}
