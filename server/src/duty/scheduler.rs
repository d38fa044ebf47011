//! The scheduler duty: every schedule of the active revision (a cron
//! expression in UTC, a seat, a trigger) fires at most once fleet-wide per
//! due time. Only the duty's holder evaluates; each fire is claimed in the
//! coordination store (`fire:{schedule}:{due}` in `crewlet_ledger`, kept
//! seven days) before it is published, so a holder that changes mid-tick
//! cannot fire one due time twice. The trigger's event id is
//! `schedule:{name}:{due unix seconds}`.
//!
//! A new holder looks back two ticks: due times older than that, missed
//! while no node held the duty, are not fired late (logged).

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, TimeZone, Utc};
use tokio::sync::watch;

use super::Duty;
use crate::company::Company;
use crate::coord::{KvError, StateBucket, Store};
use crate::engine::envelope::Envelope;
use crate::events::{Event, EventBus};
use crate::queue::{Queue, inbox_subject};
use std::sync::Arc;

pub struct Scheduler {
    pub every: Duration,
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn Queue>,
    pub events: EventBus,
    pub company: watch::Receiver<Company>,
    /// The end of the window the last tick evaluated.
    last: Mutex<Option<DateTime<Utc>>>,
}

impl Scheduler {
    pub fn new(
        every: Duration,
        store: Arc<dyn Store>,
        queue: Arc<dyn Queue>,
        events: EventBus,
        company: watch::Receiver<Company>,
    ) -> Scheduler {
        Scheduler {
            every,
            store,
            queue,
            events,
            company,
            last: Mutex::new(None),
        }
    }
}

/// Pure: the due times of `cron` in `(after, until]`, at most `limit`.
pub fn due_times(
    cron: &str,
    after: DateTime<Utc>,
    until: DateTime<Utc>,
    limit: usize,
) -> Result<Vec<DateTime<Utc>>, croner::errors::CronError> {
    let c = croner::Cron::new(cron).with_seconds_optional().parse()?;
    Ok(c.iter_after(after)
        .take_while(|t| *t <= until)
        .take(limit)
        .collect())
}

impl Scheduler {
    /// One evaluation: fire what fell due since the last one.
    pub async fn evaluate(&self, now: DateTime<Utc>) -> Vec<String> {
        let lookback = chrono::Duration::from_std(self.every * 2).unwrap_or_default();
        let after = {
            let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            match *last {
                Some(t) if t > now - lookback => t,
                _ => now - lookback,
            }
        };
        let company = self.company.borrow().clone();
        let mut fired = Vec::new();
        for s in &company.schedules {
            let due = match due_times(&s.cron, after, now, 1000) {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(schedule = %s.name, cron = %s.cron, error = %e, "an unreadable schedule; skipped");
                    continue;
                }
            };
            for t in due {
                super::turned();
                let key = format!("fire:{}:{}", s.name, t.timestamp());
                let claim = Bytes::from(
                    serde_json::to_vec(&serde_json::json!({"due": t.to_rfc3339()}))
                        .unwrap_or_default(),
                );
                let rev = match self.store.create(StateBucket::Ledger, &key, claim).await {
                    Ok(r) => r,
                    Err(KvError::AlreadyExists) => continue,
                    Err(e) => {
                        // Unknown: this due time is tried again next tick.
                        tracing::warn!(schedule = %s.name, error = %e, "cannot claim a fire; trying again next tick");
                        return fired;
                    }
                };
                let id = format!("schedule:{}:{}", s.name, t.timestamp());
                let env = Envelope {
                    id: id.clone(),
                    kind: s.kind.clone(),
                    body: s.body.clone(),
                    thread: None,
                    message_id: None,
                    from: Some(format!("schedule:{}", s.name)),
                    sent_at: Some(t.to_rfc3339()),
                };
                match self
                    .queue
                    .publish(
                        &inbox_subject(&s.seat),
                        Some(&id),
                        Bytes::from(env.encode()),
                    )
                    .await
                {
                    Ok(_) => {
                        self.events.emit(Event::ScheduleFired {
                            schedule: s.name.clone(),
                            seat: s.seat.clone(),
                            due: t.to_rfc3339(),
                            trigger_id: id.clone(),
                        });
                        fired.push(id);
                    }
                    Err(e) => {
                        // Give the claim back so the next tick fires it.
                        tracing::warn!(schedule = %s.name, error = %e, "cannot publish a fire; trying again next tick");
                        let _ = self.store.delete(StateBucket::Ledger, &key, rev).await;
                        return fired;
                    }
                }
            }
        }
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
        fired
    }
}

#[async_trait::async_trait]
impl Duty for Scheduler {
    fn name(&self) -> &'static str {
        "scheduler"
    }

    fn every(&self) -> Duration {
        self.every
    }

    async fn tick(&self) {
        self.evaluate(Utc::now()).await;
    }
}

/// `t` as a UTC date-time (tests).
pub fn utc(secs: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(secs, 0).single().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_times_are_the_cron_times_in_the_window_and_nothing_else() {
        // Every 15 minutes, over one hour starting on the hour (exclusive).
        let d = due_times("*/15 * * * *", utc(0), utc(3600), 100).unwrap();
        assert_eq!(
            d.iter().map(|t| t.timestamp()).collect::<Vec<_>>(),
            [900, 1800, 2700, 3600]
        );
        // Six fields: seconds first.
        let d = due_times("*/20 * * * * *", utc(0), utc(60), 100).unwrap();
        assert_eq!(d.len(), 3);
        assert!(due_times("not a cron", utc(0), utc(60), 10).is_err());
    }
}
