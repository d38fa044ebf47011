//! The removed seat (spec § The removed seat): over the mailbox registry
//! (`crewlet_mailboxes`, kept by `queue::registry`), the sweep that judges
//! each record one tick at a time, and the retirement that deletes a removed seat's mailbox — and
//! the mail in it — after the grace period. The seat's memory is kept.
//!
//! Every node records each seat before it creates the seat's
//! subscriptions (`queue::registry::register`); the broker's subscription listing is the
//! backstop for a registration that failed. Unknown is never absent: an
//! unreadable pointer, a node behind the active revision, an unreadable
//! registry or lease — each makes the tick stamp nothing and retire
//! nothing. Every write is a compare-and-set, and a retirement is marked
//! before it deletes; it claims the seat's lease under an owner of its own,
//! so a node adding the seat back cannot attach while it deletes, and acts
//! for at most half the lease TTL. [`verdict`] is the pure part.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;

use tokio::sync::watch;

use crate::company::{self, Company};
use crate::coord::{Claim, ClaimRequest, KvError, Revision, StateBucket, Store};
use crate::events::{Event, EventBus};
pub use crate::queue::registry::{
    MailboxRecord, RETIREMENT_BUDGET, RetirementMark, register, wait_out_retirement,
};
use crate::queue::registry::{encode, now_ms, register_one};
use crate::queue::{
    Queue, QueueSettings, control_group, ensure_seat_mailboxes, inbox_group, reflect_group,
    seat_mailbox_of,
};

/// A mark this old was left by a sweep that died: it is resumed.
pub const RESUME_AFTER: Duration = Duration::from_secs(15 * 60);

/// What a tick does with one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Nothing,
    /// In the company again: clear the absence.
    Returned,
    /// Missing and not yet stamped: stamp the absence.
    StampAbsent,
    /// Missing for longer than the grace: retire.
    Retire,
    /// A mark a dead sweep left: resume the retirement.
    Resume,
}

/// Pure: the sweep's judgement of one record, on the store's clock.
pub fn verdict(rec: &MailboxRecord, in_company: bool, now_ms: i64, grace: Duration) -> Verdict {
    if let Some(mark) = &rec.retiring {
        return if now_ms - mark.at_ms >= RESUME_AFTER.as_millis() as i64 {
            Verdict::Resume
        } else {
            Verdict::Nothing
        };
    }
    match (in_company, rec.absent_since_ms) {
        (true, Some(_)) => Verdict::Returned,
        (true, None) => Verdict::Nothing,
        (false, None) => Verdict::StampAbsent,
        (false, Some(t)) if now_ms - t >= grace.as_millis() as i64 => Verdict::Retire,
        (false, Some(_)) => Verdict::Nothing,
    }
}

fn rfc3339_ms(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .ok()
        .and_then(|t| t.replace_nanosecond(0).ok())
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// The sweep of the maintenance duty.
pub struct MailboxSweep {
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn Queue>,
    pub events: EventBus,
    /// The revision this node has applied.
    pub company: watch::Receiver<Company>,
    pub node_id: String,
    pub protocol: u32,
    pub grace: Duration,
    pub queue_settings: QueueSettings,
}

/// What one tick did (tests and the log).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub registered: Vec<String>,
    pub discovered: Vec<String>,
    pub returned: Vec<String>,
    pub absent: Vec<String>,
    pub retired: Vec<String>,
    pub held: Vec<String>,
    /// Why the tick judged nothing, when it did not.
    pub unknown: Option<String>,
}

impl MailboxSweep {
    /// One tick.
    pub async fn tick(&self) -> SweepReport {
        let mut report = SweepReport::default();
        let active = match company::active(&*self.store).await {
            Ok(Some(c)) => c,
            Ok(None) => {
                report.unknown = Some("the fleet has no active revision".into());
                return report;
            }
            Err(e) => {
                report.unknown = Some(format!("the activation pointer cannot be read: {e}"));
                tracing::warn!(
                    reason = report.unknown.as_deref(),
                    "mailbox sweep: stamping nothing"
                );
                return report;
            }
        };
        super::turned();
        let applied = self.company.borrow().revision;
        if applied < active.revision {
            report.unknown = Some(format!(
                "this node has applied revision {applied}, the fleet is at {}",
                active.revision
            ));
            tracing::info!(
                reason = report.unknown.as_deref(),
                "mailbox sweep: stamping nothing"
            );
            return report;
        }
        let entries = match self.store.entries(StateBucket::Mailboxes, "").await {
            Ok(e) => e,
            Err(e) => {
                report.unknown = Some(format!("the mailbox registry cannot be read: {e}"));
                tracing::warn!(
                    reason = report.unknown.as_deref(),
                    "mailbox sweep: stamping nothing"
                );
                return report;
            }
        };
        super::turned();
        let now = match now_ms(&*self.store).await {
            Ok(n) => n,
            Err(e) => {
                report.unknown = Some(format!("the store's clock cannot be read: {e}"));
                return report;
            }
        };
        super::turned();
        let in_company: BTreeSet<&str> = active.handles().collect();
        let mut records: BTreeMap<String, (MailboxRecord, Revision)> = BTreeMap::new();
        for e in entries {
            match serde_json::from_slice::<MailboxRecord>(&e.value) {
                Ok(r) => {
                    records.insert(e.key, (r, e.revision));
                }
                Err(err) => {
                    tracing::warn!(key = %e.key, error = %err, "an unreadable mailbox record; left alone")
                }
            }
        }
        // A seat lease that cannot be read is unknown, and unknown is never
        // absent: the lease of every seat due for retirement is read before
        // the tick writes anything, and one that cannot be read makes the
        // tick stamp nothing and retire nothing. (The retirement reads it
        // again, fresh, before it claims the seat.)
        for (h, (rec, _)) in &records {
            let due = verdict(rec, in_company.contains(h.as_str()), now, self.grace);
            if !matches!(due, Verdict::Retire | Verdict::Resume) {
                continue;
            }
            super::turned();
            if let Err(e) = self.store.lease(&format!("seat:{h}")).await {
                report.unknown = Some(format!("the lease of seat {h} cannot be read: {e}"));
                tracing::warn!(
                    reason = report.unknown.as_deref(),
                    "mailbox sweep: stamping nothing"
                );
                return report;
            }
        }
        // Seats of the company with no record (a registration failed).
        for h in &in_company {
            if !records.contains_key(*h) {
                super::turned();
                register_one(&*self.store, h, &self.events).await;
                report.registered.push(h.to_string());
            }
        }
        super::turned();
        self.discover(&in_company, &records, now, &mut report).await;
        super::turned();
        self.judge(records, &in_company, now, &mut report).await;
        report
    }

    /// The broker's listing: mailboxes of seats nobody recorded are
    /// registered as absent from now (their grace starts).
    async fn discover(
        &self,
        in_company: &BTreeSet<&str>,
        records: &BTreeMap<String, (MailboxRecord, Revision)>,
        now: i64,
        report: &mut SweepReport,
    ) {
        match self.queue.list_subscriptions().await {
            Ok(list) => {
                let found: BTreeSet<String> = list
                    .iter()
                    .filter_map(seat_mailbox_of)
                    .map(|(h, _)| h)
                    .collect();
                for h in found {
                    if in_company.contains(h.as_str()) || records.contains_key(&h) {
                        continue;
                    }
                    super::turned();
                    let rec = MailboxRecord {
                        handle: h.clone(),
                        registered_at_ms: now,
                        absent_since_ms: Some(now),
                        retiring: None,
                    };
                    match self
                        .store
                        .create(StateBucket::Mailboxes, &h, encode(&rec))
                        .await
                    {
                        Ok(_) => {
                            self.events
                                .emit(Event::SeatMailboxDiscovered { seat: h.clone() });
                            self.events.emit(Event::SeatMailboxAbsent {
                                seat: h.clone(),
                                retire_at: rfc3339_ms(now + self.grace.as_millis() as i64),
                            });
                            report.discovered.push(h);
                        }
                        Err(KvError::AlreadyExists) => {}
                        Err(e) => {
                            tracing::warn!(seat = %h, error = %e, "cannot register a discovered mailbox")
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "the broker's subscription listing failed; discovery waits for the next tick")
            }
        }
    }

    /// Each record's verdict, carried out: returned, stamped absent, or
    /// retired (resumed when a retirement was cut short).
    async fn judge(
        &self,
        records: BTreeMap<String, (MailboxRecord, Revision)>,
        in_company: &BTreeSet<&str>,
        now: i64,
        report: &mut SweepReport,
    ) {
        for (h, (rec, rev)) in records {
            super::turned();
            match verdict(&rec, in_company.contains(h.as_str()), now, self.grace) {
                Verdict::Nothing => {}
                Verdict::Returned => {
                    let r = MailboxRecord {
                        absent_since_ms: None,
                        ..rec
                    };
                    if self
                        .store
                        .update(StateBucket::Mailboxes, &h, encode(&r), rev)
                        .await
                        .is_ok()
                    {
                        self.events
                            .emit(Event::SeatMailboxReturned { seat: h.clone() });
                        report.returned.push(h);
                    }
                }
                Verdict::StampAbsent => {
                    let r = MailboxRecord {
                        absent_since_ms: Some(now),
                        ..rec
                    };
                    if self
                        .store
                        .update(StateBucket::Mailboxes, &h, encode(&r), rev)
                        .await
                        .is_ok()
                    {
                        self.events.emit(Event::SeatMailboxAbsent {
                            seat: h.clone(),
                            retire_at: rfc3339_ms(now + self.grace.as_millis() as i64),
                        });
                        report.absent.push(h);
                    }
                }
                v @ (Verdict::Retire | Verdict::Resume) => {
                    if v == Verdict::Resume {
                        self.events
                            .emit(Event::SeatMailboxRetirementResumed { seat: h.clone() });
                    }
                    match self.retire(&h, rec, rev, now).await {
                        Retirement::Done => report.retired.push(h),
                        Retirement::Held => report.held.push(h),
                        Retirement::NotNow => {}
                    }
                }
            }
        }
    }

    async fn retire(&self, h: &str, rec: MailboxRecord, rev: Revision, now: i64) -> Retirement {
        // A seat still held is kept; a lower-protocol node blocks claims.
        match self.store.lease(&format!("seat:{h}")).await {
            Ok(Some(l)) => {
                self.events.emit(Event::SeatMailboxRetirementHeld {
                    seat: h.to_string(),
                    refused: "held".into(),
                    holder: Some(l.preferred.clone()),
                });
                return Retirement::Held;
            }
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
            Ok(Claim::HeldBy(l)) => {
                self.events.emit(Event::SeatMailboxRetirementHeld {
                    seat: h.to_string(),
                    refused: "held".into(),
                    holder: Some(l.preferred),
                });
                return Retirement::Held;
            }
            Ok(Claim::Gated { .. }) => {
                self.events.emit(Event::SeatMailboxRetirementHeld {
                    seat: h.to_string(),
                    refused: "protocol".into(),
                    holder: None,
                });
                return Retirement::Held;
            }
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

enum Retirement {
    Done,
    Held,
    NotNow,
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(100);

    fn rec(absent: Option<i64>, mark: Option<i64>) -> MailboxRecord {
        MailboxRecord {
            handle: "h".into(),
            registered_at_ms: 0,
            absent_since_ms: absent,
            retiring: mark.map(|at_ms| RetirementMark {
                by: "n:maintenance:1".into(),
                at_ms,
            }),
        }
    }

    #[test]
    fn a_seat_in_the_company_is_never_retired_and_its_absence_clears() {
        assert_eq!(
            verdict(&rec(None, None), true, 10_000_000, GRACE),
            Verdict::Nothing
        );
        assert_eq!(
            verdict(&rec(Some(0), None), true, 10_000_000, GRACE),
            Verdict::Returned
        );
    }

    #[test]
    fn a_missing_seat_is_stamped_then_retired_after_the_grace_not_before() {
        assert_eq!(
            verdict(&rec(None, None), false, 5, GRACE),
            Verdict::StampAbsent
        );
        assert_eq!(
            verdict(&rec(Some(0), None), false, 99_999, GRACE),
            Verdict::Nothing
        );
        assert_eq!(
            verdict(&rec(Some(0), None), false, 100_000, GRACE),
            Verdict::Retire
        );
    }

    #[test]
    fn a_mark_is_left_alone_until_it_is_fifteen_minutes_old_then_resumed() {
        let m = RESUME_AFTER.as_millis() as i64;
        assert_eq!(
            verdict(&rec(Some(0), Some(10)), false, 10 + m - 1, GRACE),
            Verdict::Nothing
        );
        assert_eq!(
            verdict(&rec(Some(0), Some(10)), false, 10 + m, GRACE),
            Verdict::Resume
        );
        assert_eq!(
            verdict(&rec(None, Some(10)), true, 20, GRACE),
            Verdict::Nothing
        );
    }
}
