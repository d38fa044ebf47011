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
}

mod retire;
use retire::Retirement;

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
