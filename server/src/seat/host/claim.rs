//! Taking a seat on the seat host: claim `seat:{handle}`, prepare it (the
//! acquire hooks, bounded), establish it (reflect, control, then the inbox
//! attached) and keep the dispatch loops watched.

use std::sync::Arc;

use tokio::time::Instant;

use super::*;

/// The hold an inbox is attached under while its seat is established:
/// dropped once the lease is seen still provably held after the attach.
const ESTABLISHING_HOLD: &str = "establishing";

/// The acquire hook's last step: the lease still provably held when the
/// inbox is attached. A seat whose lease lapsed while it was established
/// (a store too slow to renew it within the TTL) is let go as
/// `grace_expired`: a peer may hold it by then, and two attachments to one
/// mailbox split its mail (spec § The problem).
const LEASE_STEP: &str = "lease";

impl SeatHost {
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
                let reason = match e.step {
                    "run recovery" => DetachReason::Unprepared,
                    LEASE_STEP => DetachReason::GraceExpired,
                    _ => DetachReason::HookFailed,
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
    pub(super) async fn prepare(
        &self,
        ctx: &SeatContext,
        progress: &Progress<'_>,
    ) -> Result<(), HookError> {
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

    pub(super) async fn establish(
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
            // Attached under a hold of its own: nothing is fetched until the
            // lease is seen still provably held once the attach is made.
            let holds: Vec<&str> = holds
                .iter()
                .map(String::as_str)
                .chain([ESTABLISHING_HOLD])
                .collect();
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
            let held = self.provably_held(&ctx.handle, ctx.epoch);
            self.put_attachment(&ctx.handle, |e| {
                if held {
                    e.phase = Phase::Attached;
                    inbox.unhold(ESTABLISHING_HOLD);
                }
                e.inbox = Some(inbox);
            });
            if held {
                Ok(())
            } else {
                Err(HookError::new(
                    LEASE_STEP,
                    "the lease lapsed while the seat was being established (no renewal within its TTL): its inbox is not attached",
                ))
            }
        };
        match AssertUnwindSafe(guarded).catch_unwind().await {
            Ok(r) => r,
            Err(_) => Err(HookError::new("acquire hook", "panicked")),
        }
    }

    /// Whether this node provably holds `handle` at `epoch`: the claim or
    /// its last successful renewal was sent within the lease's TTL, so no
    /// peer can have claimed it since (the fence's rule, [`Fence::holds`],
    /// before the seat is attached).
    fn provably_held(&self, handle: &str, epoch: u64) -> bool {
        let ttl = self.inner.store.lease_ttl();
        lock(&self.inner.seats)
            .get(handle)
            .is_some_and(|e| e.lease.epoch == epoch && e.last_renewed.elapsed() < ttl)
    }

    /// Have the watchdog follow an attachment's dispatch loop
    /// (`{kind}:{handle}`: the inbox's `dispatch`, `control`, `reflect`):
    /// every loop that can hold a seat's mail is watched.
    pub(super) fn watch_loop(&self, kind: &str, handle: &str, attachment: Option<&Attachment>) {
        if let (Some(w), Some(a)) = (lock(&self.inner.watchdog).as_ref(), attachment) {
            w.follow(&format!("{kind}:{handle}"), a.pulse());
        }
    }

    pub(super) fn put_attachment(&self, handle: &str, f: impl FnOnce(&mut SeatEntry)) {
        if let Some(e) = lock(&self.inner.seats).get_mut(handle) {
            f(e);
        }
    }
}
