//! The two-phase handoff on the seat host (handoff § 4–6 in the lease
//! world of the spec): how a voluntary move happens without a moment in
//! which nobody holds the seat.
//!
//! Giver, phase 1 ([`SeatHost::hand_off`]): quiesce — the inbox admits no
//! new turn and the one in flight finishes; the reflect subscription goes
//! and memory is flushed — while the lease is kept and renewed; then the
//! lease is offered to a named successor (a compare-and-set on the lease
//! record) and a notice is left for it in `crewlet_handoffs`. Successor
//! ([`SeatHost::take_offer`]): prepares the seat while the giver still
//! holds it (children started, memory hydrated), takes the lease by
//! compare-and-set from the offered record — the next epoch, its assertion
//! — and only then attaches reflect, control and the inbox. Giver, phase 2:
//! seeing the new owner, it detaches and forgets the seat. If the offer is
//! not taken within the bound, the giver withdraws it and resumes: quiesce
//! is reversible. The epoch and the fence still guarantee no two turns run.

use crate::watchdog::Progress;
use std::time::Duration;

use super::*;
use crate::coord::{Offer, StateBucket};

/// How often the giver reads the lease while its offer stands.
const OFFER_POLL: Duration = Duration::from_millis(20);

/// How a handoff ended, as the giver saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandOff {
    /// The successor took the lease at `epoch`; the seat is detached here.
    Taken { epoch: u64 },
    /// Not taken within the bound: the offer was withdrawn, the seat runs
    /// on here.
    Withdrawn,
    /// Nothing was offered (the seat is not attached here, a quiesce step
    /// failed, the store could not say); the seat runs on here.
    NotOffered(String),
    /// The lease was lost while offered; the seat was detached fenced.
    Lost,
}

/// Why phase 0 did not stop admitting (nothing was offered).
#[derive(Debug, thiserror::Error)]
enum NotStopped {
    #[error("the seat's lock was not had")]
    LockNotHad,
    #[error("this node is draining")]
    Draining,
    #[error("the seat is not attached here")]
    NotAttached,
    #[error("the seat is not held here")]
    NotHeld,
}

/// Why phase 1 offered nothing.
enum Unoffered {
    /// The seat was resumed here.
    Resumed(String),
    /// The offer's write was not answered: it may stand.
    Unknown(Offer),
}

/// The notice a giver leaves for its successor: `offer:{to}:{handle}` in
/// the handoffs bucket. The lease record is the authority; the notice only
/// wakes the successor.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OfferNotice {
    pub seat: String,
    pub epoch: u64,
    /// The giver's node id.
    pub from: String,
    pub offer_id: String,
    pub reason: DetachReason,
}

/// The notice key for an offer of `seat` to node `to`.
pub fn notice_key(to: &str, seat: &str) -> String {
    format!("offer:{to}:{seat}")
}

/// The prefix a node watches for offers made to it.
pub fn notice_prefix(node: &str) -> String {
    format!("offer:{node}:")
}

impl SeatHost {
    /// Whether `handle` is offered to a successor right now (a handoff of
    /// it is under way here).
    pub fn is_offered(&self, handle: &str) -> bool {
        lock(&self.inner.seats)
            .get(handle)
            .is_some_and(|e| e.offered)
    }

    /// Hand `handle` to node `to` through the two-phase handoff, waiting at
    /// most `bound` for the take. `reason` is what the move stands for.
    pub async fn hand_off(
        &self,
        handle: &str,
        to: &str,
        reason: DetachReason,
        bound: Duration,
        progress: &Progress<'_>,
    ) -> HandOff {
        // Phase 0: stop admitting, and let the turn in flight finish — for
        // up to the hand-off's bound, without the seat's lock, so the
        // heartbeat renews the lease (and the turn's delivery) meanwhile.
        match self.stop_admitting(handle, reason, progress).await {
            Ok(Some(idle)) => {
                if !watched(progress, None, idle.within(bound))
                    .await
                    .unwrap_or(false)
                {
                    tracing::warn!(
                        seat = handle,
                        bound_ms = bound.as_millis() as u64,
                        "the in-flight turn did not finish within the hand-off's bound; its fence closes at the flush and the successor runs it"
                    );
                }
                progress();
            }
            Ok(None) => {}
            Err(why) => return HandOff::NotOffered(why.to_string()),
        }
        let offer = match self.offer_seat(handle, to, reason, progress).await {
            Ok(o) => o,
            Err(Unoffered::Resumed(why)) => return HandOff::NotOffered(why),
            // Whether the offer landed is unknown: withdraw it first.
            Err(Unoffered::Unknown(o)) => return self.withdraw(handle, &o, reason, progress).await,
        };
        let resource = format!("seat:{handle}");
        let until = Instant::now() + bound;
        // Wait without the seat's lock: the heartbeat renews the offered
        // lease meanwhile (a renewal keeps the offer), and a renewal that
        // finds the lease taken detaches the seat as lost.
        let taken = loop {
            progress();
            if !lock(&self.inner.seats).contains_key(handle) {
                // The heartbeat found the tenure over and detached it.
                break None;
            }
            match watched(progress, None, self.inner.store.lease(&resource)).await {
                Some(Ok(Some(l))) if l.owner != self.inner.cfg.owner => break Some(l.epoch),
                _ => {}
            }
            if Instant::now() >= until {
                return self.withdraw(handle, &offer, reason, progress).await;
            }
            tokio::time::sleep(OFFER_POLL).await;
        };
        self.clear_notice(to, handle, progress).await;
        match taken {
            Some(epoch) => {
                self.detach_taken(handle, reason, progress).await;
                HandOff::Taken { epoch }
            }
            None => match watched(progress, None, self.inner.store.lease(&resource)).await {
                Some(Ok(Some(l))) if l.owner != self.inner.cfg.owner => {
                    HandOff::Taken { epoch: l.epoch }
                }
                _ => HandOff::Lost,
            },
        }
    }

    /// Phase 0 under the seat's lock: mark the seat as being offered (no
    /// other handoff of it starts, nothing new is admitted, a renewal does
    /// not resume it) and quiesce its inbox. The wait for the turn in
    /// flight, if one runs, is returned to be waited on without the lock.
    async fn stop_admitting(
        &self,
        handle: &str,
        reason: DetachReason,
        progress: &Progress<'_>,
    ) -> Result<Option<crate::queue::attach::Idle>, NotStopped> {
        let seat_lock = self.seat_lock(handle);
        let Some(_g) = watched(progress, None, seat_lock.lock()).await else {
            return Err(NotStopped::LockNotHad);
        };
        if self.is_draining() && reason != DetachReason::Drain {
            return Err(NotStopped::Draining);
        }
        let mut seats = lock(&self.inner.seats);
        match seats.get_mut(handle) {
            Some(e) if e.phase == Phase::Attached && !e.fenced && !e.offered => {
                e.offered = true;
                Ok(e.inbox.as_ref().map(|a| {
                    a.quiesce();
                    a.idle()
                }))
            }
            Some(_) => Err(NotStopped::NotAttached),
            None => Err(NotStopped::NotHeld),
        }
    }

    /// Phase 1 under the seat's lock: close the turn's fence, flush, offer,
    /// leave the notice. On any failure the seat is resumed and nothing is
    /// offered.
    async fn offer_seat(
        &self,
        handle: &str,
        to: &str,
        reason: DetachReason,
        progress: &Progress<'_>,
    ) -> Result<Offer, Unoffered> {
        let seat_lock = self.seat_lock(handle);
        let Some(_g) = watched(progress, None, seat_lock.lock()).await else {
            return Err(Unoffered::Resumed("the seat's lock was not had".into()));
        };
        if self.is_draining() && reason != DetachReason::Drain {
            self.admit_again(handle);
            return Err(Unoffered::Resumed("this node is draining".into()));
        }
        let (lease, inbox, reflect) = self.take_for_offer(handle)?;
        let ctx = SeatContext::of(handle, &lease);
        let quiesced_at = self.inner.store.now().await.ok();
        if let Some(a) = reflect {
            a.detach().await;
        }
        if let Err(e) = hook_step(progress, "quiesce", self.inner.hooks.quiesce(&ctx)).await {
            self.resume_here(handle, inbox, &ctx, progress).await;
            return Err(Unoffered::Resumed(format!("the quiesce hook failed: {e}")));
        }
        progress();
        let Some(quiesced_at) = quiesced_at else {
            self.resume_here(handle, inbox, &ctx, progress).await;
            return Err(Unoffered::Resumed(
                "the store's clock could not be read".into(),
            ));
        };
        let offer = Offer {
            to: to.to_string(),
            id: uuid::Uuid::new_v4().to_string(),
            quiesced_at,
        };
        self.write_offer(handle, &lease, &offer, inbox, progress)
            .await?;
        let notice = OfferNotice {
            seat: handle.to_string(),
            epoch: lease.epoch,
            from: self.inner.cfg.node_id.clone(),
            offer_id: offer.id.clone(),
            reason,
        };
        self.put_notice(to, &notice).await;
        progress();
        self.inner.events.emit(Event::SeatOffered {
            seat: handle.to_string(),
            epoch: lease.epoch,
            to: to.to_string(),
            reason,
        });
        Ok(offer)
    }

    /// Write the offer on the seat's lease, putting the quiesced inbox
    /// back: `Ok` when it stands (a lost lease detaches the seat fenced; an
    /// unknown answer is for the caller to withdraw).
    async fn write_offer(
        &self,
        handle: &str,
        lease: &Lease,
        offer: &Offer,
        inbox: Option<Attachment>,
        progress: &Progress<'_>,
    ) -> Result<(), Unoffered> {
        let sent = Instant::now();
        let written = self
            .inner
            .store
            .offer(lease, &self.inner.cfg.owner, Some(offer.clone()))
            .await;
        progress();
        match written {
            // The offer renews the tenure from when it was sent, as any
            // renewal does (the store counts it from the write).
            Renewal::Renewed(l) => {
                if let Some(e) = lock(&self.inner.seats).get_mut(handle) {
                    e.lease = l;
                    e.inbox = inbox;
                    e.last_renewed = e.last_renewed.max(sent);
                }
            }
            Renewal::Lost => {
                // The tenure is over: what was quiesced is detached fenced.
                if let Some(e) = lock(&self.inner.seats).get_mut(handle) {
                    e.inbox = inbox;
                }
                self.release_locked(handle, DetachReason::Lost, progress)
                    .await;
                return Err(Unoffered::Resumed(
                    "the lease was lost before the offer".into(),
                ));
            }
            Renewal::Unknown(e) => {
                // Whether the offer landed is unknown: withdraw it (tried
                // again until a TTL after the seat's last renewal) before
                // resuming.
                if let Some(e) = lock(&self.inner.seats).get_mut(handle) {
                    e.inbox = inbox;
                }
                tracing::warn!(seat = handle, error = %e, "the store could not answer the offer; withdrawing it");
                return Err(Unoffered::Unknown(offer.clone()));
            }
        }
        Ok(())
    }

    /// A drain began while an offer waited for the seat's lock: the drain
    /// hands the seat on; until then it admits again.
    fn admit_again(&self, handle: &str) {
        if let Some(e) = lock(&self.inner.seats).get_mut(handle)
            && e.phase == Phase::Attached
            && e.offered
        {
            e.offered = false;
            if let Some(a) = &e.inbox {
                a.resume();
            }
        }
    }

    /// The seat as phase 0 left it (attached, and offered by it): its
    /// lease, and its inbox and reflect subscriptions taken out for the
    /// offer; its last flush is marked.
    fn take_for_offer(
        &self,
        handle: &str,
    ) -> Result<(Lease, Option<Attachment>, Option<Attachment>), Unoffered> {
        let mut seats = lock(&self.inner.seats);
        match seats.get_mut(handle) {
            Some(e) if e.phase == Phase::Attached && !e.fenced && e.offered => {
                e.last_flush = true;
                Ok((e.lease.clone(), e.inbox.take(), e.reflect.take()))
            }
            Some(_) => Err(Unoffered::Resumed("the seat is not attached here".into())),
            None => Err(Unoffered::Resumed("the seat is not held here".into())),
        }
    }

    /// Put the inbox back, re-attach reflect and admit turns again.
    pub(super) async fn resume_here(
        &self,
        handle: &str,
        inbox: Option<Attachment>,
        ctx: &SeatContext,
        progress: &Progress<'_>,
    ) {
        let reflect = match hook_step(
            progress,
            "reflect attach",
            self.inner.hooks.attach_reflect(ctx),
        )
        .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(seat = handle, error = %e, "cannot re-attach the seat's reflect subscription after a handoff that did not happen");
                None
            }
        };
        if let Some(a) = &inbox {
            a.resume();
        }
        if let Some(e) = lock(&self.inner.seats).get_mut(handle) {
            e.offered = false;
            e.last_flush = false;
            e.inbox = inbox;
            e.reflect = reflect;
        }
    }

    async fn put_notice(&self, to: &str, notice: &OfferNotice) {
        let key = notice_key(to, &notice.seat);
        let body = bytes::Bytes::from(serde_json::to_vec(notice).unwrap_or_default());
        let store = &self.inner.store;
        let written = match store.get(StateBucket::Handoffs, &key).await {
            Ok(None) => store
                .create(StateBucket::Handoffs, &key, body)
                .await
                .map(|_| ()),
            Ok(Some(e)) => store
                .update(StateBucket::Handoffs, &key, body, e.revision)
                .await
                .map(|_| ()),
            Err(e) => Err(e.into()),
        };
        if let Err(e) = written {
            tracing::warn!(seat = %notice.seat, to, error = %e, "cannot leave the offer's notice; the successor may not see it before the offer is withdrawn");
        }
    }

    /// Each store call is bounded, and waited on beating: a sweep that
    /// cleared a notice against a silent store (read, then delete, then a
    /// lease read — three bounds in a row) was shot as wedged.
    pub(super) async fn clear_notice(&self, to: &str, seat: &str, progress: &Progress<'_>) {
        let key = notice_key(to, seat);
        let read = watched(
            progress,
            None,
            self.inner.store.get(StateBucket::Handoffs, &key),
        )
        .await;
        if let Some(Ok(Some(e))) = read {
            let _ = watched(
                progress,
                None,
                self.inner
                    .store
                    .delete(StateBucket::Handoffs, &key, e.revision),
            )
            .await;
        }
    }
}
