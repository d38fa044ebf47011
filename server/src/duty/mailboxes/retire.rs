//! A removed seat's retirement (spec § The removed seat): the seat's
//! lease claimed under the retirement's own owner, the mark written before
//! anything is deleted, the seat's detached runs ended, then its three
//! subscriptions — and the mail in them — deleted within half the lease
//! TTL. What could not be done is unmarked and retried on the next tick.

use super::*;

impl MailboxSweep {
    /// Retire `h`'s mailbox if no node holds the seat: claimed under an
    /// owner of this retirement's own, worked for half a TTL, released.
    pub(super) async fn retire(
        &self,
        h: &str,
        rec: MailboxRecord,
        rev: Revision,
        now: i64,
    ) -> Retirement {
        // A seat still held is kept; a lower-protocol node blocks claims.
        match self.store.lease(&format!("seat:{h}")).await {
            Ok(Some(l)) => return self.held(h, "held", Some(l.preferred)),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(seat = h, error = %e, "the seat's lease cannot be read; not retiring this tick");
                return Retirement::NotNow;
            }
        }
        let owner = format!(
            "{}:maintenance:{:08x}",
            self.node_id,
            rand::thread_rng().r#gen::<u32>()
        );
        // The claim judges the protocol gate once it finds the seat free.
        let req = ClaimRequest::new(format!("seat:{h}"), &owner, &self.node_id)
            .with_protocol(self.protocol)
            .gated();
        // The retirement acts for at most half the lease TTL, counted from
        // before the claim (the lease runs from the claim's own write, which
        // is later): its last act lands while the claim still excludes every
        // node.
        let budget = self.store.lease_ttl() / 2;
        let deadline = tokio::time::Instant::now() + budget;
        let lease = match self.store.claim(req).await {
            Ok(Claim::Won(l)) => l,
            Ok(Claim::HeldBy(l)) => return self.held(h, "held", Some(l.preferred)),
            Ok(Claim::Gated { .. }) => return self.held(h, "protocol", None),
            Err(e) => {
                tracing::warn!(seat = h, error = %e, "cannot claim the seat to retire it; next tick");
                return Retirement::NotNow;
            }
        };
        let outcome = self
            .retire_under(
                h,
                rec,
                rev,
                now,
                Tenure {
                    owner: &owner,
                    epoch: lease.epoch,
                    deadline,
                    budget,
                },
            )
            .await;
        if let Err(e) = self.store.release(&lease, &owner).await {
            tracing::warn!(seat = h, error = %e, "cannot release the retirement's claim; it lapses at its TTL");
        }
        outcome
    }

    /// The retirement is refused for now (`refused`: the seat is held, or
    /// a lower-protocol node blocks claims), and said so.
    fn held(&self, h: &str, refused: &str, holder: Option<String>) -> Retirement {
        self.events.emit(Event::SeatMailboxRetirementHeld {
            seat: h.to_string(),
            refused: refused.into(),
            holder,
        });
        Retirement::Held
    }

    async fn retire_under(
        &self,
        h: &str,
        rec: MailboxRecord,
        rev: Revision,
        now: i64,
        tenure: Tenure<'_>,
    ) -> Retirement {
        let Tenure {
            owner,
            epoch,
            deadline,
            budget,
        } = tenure;
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                seat = h,
                "the claim took the retirement's whole budget; next tick retries"
            );
            return Retirement::NotNow;
        }
        // Mark first: exactly one of two overlapping sweeps wins this.
        let marked = MailboxRecord {
            retiring: Some(RetirementMark {
                by: owner.to_string(),
                at_ms: now,
            }),
            ..rec.clone()
        };
        // Unmarking writes the record back with no mark at all: a resumed
        // retirement's record came with a dead sweep's mark, which must not
        // come back with it (a node adding the seat back would wait on it).
        let unmarked = MailboxRecord {
            retiring: None,
            ..rec
        };
        let mark_rev = match self
            .store
            .update(StateBucket::Mailboxes, h, encode(&marked), rev)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::info!(seat = h, error = %e, "the mailbox record changed under the sweep; not retiring");
                return Retirement::NotNow;
            }
        };
        if let Err((step, e)) = self.clear_out(h, epoch, deadline, budget).await {
            tracing::warn!(seat = h, error = %e, "a retirement could not {step}; unmarking, next tick retries");
            let _ = self
                .store
                .update(StateBucket::Mailboxes, h, encode(&unmarked), mark_rev)
                .await;
            return Retirement::NotNow;
        }
        match self.store.delete(StateBucket::Mailboxes, h, mark_rev).await {
            Ok(()) => {
                self.events.emit(Event::SeatMailboxRetired {
                    seat: h.to_string(),
                });
                Retirement::Done
            }
            Err(e) => {
                // A node that added the seat back took the record over:
                // its inbox may have been created before our delete landed.
                tracing::warn!(seat = h, error = %e, "the mailbox record was taken over during the retirement; restoring the seat's mailbox");
                if let Err(e) = ensure_seat_mailboxes(&*self.queue, h, self.queue_settings).await {
                    tracing::error!(seat = h, error = %e, "cannot restore the seat's mailbox");
                }
                Retirement::NotNow
            }
        }
    }

    /// A marked retirement's work, within its deadline: the seat's
    /// detached runs end first, under the seat lease this retirement holds
    /// (once the control subscription is gone nothing could ever reach them
    /// again), then its three subscriptions are deleted. What could not be
    /// done, and the step, otherwise: the caller unmarks and the next tick
    /// retries, with the runs already ended gone.
    async fn clear_out(
        &self,
        h: &str,
        epoch: u64,
        deadline: tokio::time::Instant,
        budget: Duration,
    ) -> Result<(), (&'static str, String)> {
        match tokio::time::timeout_at(deadline, self.end_runs(h, epoch)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(("end the seat's runs", e.to_string())),
            Err(_) => {
                let e = format!("the seat's runs were not ended within {budget:?}");
                return Err(("end the seat's runs", e));
            }
        }
        let deletes = async {
            for name in [inbox_group(h), control_group(h), reflect_group(h)] {
                self.queue
                    .delete_subscription(&name)
                    .await
                    .map_err(|e| format!("{name}: {e}"))?;
            }
            Ok::<(), String>(())
        };
        match tokio::time::timeout_at(deadline, deletes).await {
            Ok(r) => r.map_err(|e| ("delete the mailbox", e)),
            Err(_) => Err((
                "delete the mailbox",
                format!("the deletes took longer than {budget:?}"),
            )),
        }
    }
}

impl MailboxSweep {
    /// End every run of a removed seat (announced as `sandbox_run_failed`,
    /// reason `seat_removed`) and delete its records. The launcher's
    /// supervisor kills a child whose record was ended.
    async fn end_runs(&self, h: &str, epoch: u64) -> Result<(), crate::engine::runs::RunError> {
        let runs = crate::engine::runs::Runs::new(self.store.clone());
        for (r, _) in runs.list(h).await? {
            if r.state.is_live() {
                runs.mutate(h, &r.run_id, epoch, |x| {
                    x.state = crate::engine::runs::RunState::Ended;
                    x.owner_epoch = epoch;
                    true
                })
                .await?;
                self.events.emit(Event::SandboxRunFailed {
                    seat: h.to_string(),
                    run_id: r.run_id.clone(),
                    reason: "seat_removed".into(),
                });
            }
            runs.delete(h, &r.run_id, epoch).await?;
        }
        Ok(())
    }
}

/// The seat lease a retirement claimed, and how long it may act under it.
struct Tenure<'a> {
    owner: &'a str,
    epoch: u64,
    /// Half the lease TTL from before the claim.
    deadline: tokio::time::Instant,
    budget: Duration,
}

pub(super) enum Retirement {
    Done,
    Held,
    NotNow,
}
