//! The maintenance duty (every `maintenance.every_seconds`, 15 minutes by
//! default): retention of this node's short-horizon tables (diary expiry
//! and cap; audit rows older than `maintenance.audit_days`), the mailbox
//! sweep of removed seats ([`super::mailboxes`]), and the purge of
//! coordination-store removal markers older than three hours — each
//! through its own revision, so a key written again since is untouched.
//!
//! Retention runs on whichever node holds the duty, over that node's own
//! database; the other nodes' tables are swept when they hold it (a
//! node's database is its own).

use std::time::Duration;

use sqlx::SqlitePool;

use super::Duty;
use super::mailboxes::{MailboxSweep, SweepReport};
use crate::coord::StateBucket;
use crate::memory::MemoryStore;

/// Removal markers older than this are purged.
pub const MARKER_AGE: Duration = Duration::from_secs(3 * 3600);

/// Pure: the shared-state buckets with no age limit — every one whose
/// removal markers nothing but this purge ever removes (spec: every
/// shared-state bucket with no age), `crewlet_runs` among them.
pub fn unaged_buckets() -> Vec<StateBucket> {
    StateBucket::ALL
        .into_iter()
        .filter(|b| b.bucket().max_age(Duration::from_secs(1)).is_none())
        .collect()
}

pub struct Maintenance {
    pub every: Duration,
    pub memory: MemoryStore,
    pub pool: SqlitePool,
    pub diary_cap: u64,
    pub audit_days: u64,
    /// Removal markers older than this are purged ([`MARKER_AGE`]).
    pub marker_age: Duration,
    pub sweep: MailboxSweep,
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MaintenanceReport {
    pub diary_expired: u64,
    pub diary_over_cap: u64,
    pub audit_deleted: u64,
    pub markers_purged: usize,
    pub mailboxes: SweepReport,
}

fn rfc3339(t: time::OffsetDateTime) -> String {
    t.replace_nanosecond(0)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

impl Maintenance {
    /// One pass; each part goes on when another fails.
    pub async fn pass(&self) -> MaintenanceReport {
        let mut r = MaintenanceReport::default();
        let now = time::OffsetDateTime::now_utc();
        match self.memory.sweep_diary(&rfc3339(now), self.diary_cap).await {
            Ok((e, o)) => (r.diary_expired, r.diary_over_cap) = (e, o),
            Err(e) => tracing::warn!(error = %e, "diary retention failed"),
        }
        super::turned();
        if self.audit_days > 0 {
            let cutoff = rfc3339(now - time::Duration::days(self.audit_days.min(36_500) as i64));
            match self.delete_audit_before(&cutoff).await {
                Ok(n) => r.audit_deleted = n,
                Err(e) => tracing::warn!(error = %e, "audit retention failed"),
            }
            super::turned();
        }
        r.mailboxes = self.sweep.tick().await;
        super::turned();
        r.markers_purged = self.purge_markers().await;
        tracing::info!(
            diary_expired = r.diary_expired,
            diary_over_cap = r.diary_over_cap,
            audit_deleted = r.audit_deleted,
            markers_purged = r.markers_purged,
            retired = r.mailboxes.retired.len(),
            absent = r.mailboxes.absent.len(),
            "maintenance pass"
        );
        r
    }

    /// Audit entries older than `cutoff`, deleted in the memory writes'
    /// lane (`db::WriteLane`): retention queues behind a seat's write
    /// instead of spinning against it.
    async fn delete_audit_before(&self, cutoff: &str) -> Result<u64, sqlx::Error> {
        let mut tx = self.memory.lane().begin(&self.pool).await?;
        let d = sqlx::query("DELETE FROM audit WHERE at < ?")
            .bind(cutoff)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(d.rows_affected())
    }

    async fn purge_markers(&self) -> usize {
        let store = &self.sweep.store;
        let now = match store.now().await {
            Ok(t) => t.unix_nanos(),
            Err(e) => {
                tracing::warn!(error = %e, "the store's clock cannot be read; no marker purged");
                return 0;
            }
        };
        let mut n = 0;
        for bucket in unaged_buckets() {
            super::turned();
            let markers = match store.markers(bucket, "").await {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list removal markers");
                    continue;
                }
            };
            for m in markers {
                super::turned();
                if now - m.written_at.unix_nanos() < self.marker_age.as_nanos() as i64 {
                    continue;
                }
                match store.purge_marker(bucket, &m.key, m.revision).await {
                    Ok(()) => n += 1,
                    Err(e) => {
                        tracing::warn!(key = %m.key, error = %e, "cannot purge a removal marker")
                    }
                }
            }
        }
        n
    }
}

#[async_trait::async_trait]
impl Duty for Maintenance {
    fn name(&self) -> &'static str {
        "maintenance"
    }

    fn every(&self) -> Duration {
        self.every
    }

    async fn tick(&self) {
        self.pass().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shared_state_bucket_with_no_age_has_its_removal_markers_purged() {
        assert_eq!(
            unaged_buckets(),
            vec![
                StateBucket::Mailboxes,
                StateBucket::Pauses,
                StateBucket::Config,
                StateBucket::Runs,
            ],
            "the run and approval records' bucket among them; the aged ones expire by themselves"
        );
    }
}
