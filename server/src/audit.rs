//! The audit log: every person's action, who, what, seat, when, reason and
//! result. Written to the node's own database; never carries a secret.

use sqlx::SqlitePool;

use app::api::AuditEntry;

/// Record one action. A failure to write the audit row is returned: an
/// action that cannot be audited is reported, not silently done.
pub async fn record(
    pool: &SqlitePool,
    person: &str,
    action: &str,
    seat: Option<&str>,
    reason: Option<&str>,
    result: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO audit (at, person, action, seat, reason, result) VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(now_rfc3339())
    .bind(person)
    .bind(action)
    .bind(seat)
    .bind(reason)
    .bind(result)
    .execute(pool)
    .await?;
    Ok(())
}

/// at, person, action, seat, reason, result.
type AuditRow = (
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    String,
);

/// The newest `limit` entries, newest first.
pub async fn newest(pool: &SqlitePool, limit: u32) -> Result<Vec<AuditEntry>, sqlx::Error> {
    let rows: Vec<AuditRow> = sqlx::query_as(
        "SELECT at, person, action, seat, reason, result FROM audit ORDER BY id DESC LIMIT ?",
    )
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(at, person, action, seat, reason, result)| AuditEntry {
            at,
            person,
            action,
            seat,
            reason,
            result,
        })
        .collect())
}

/// The wall clock as RFC 3339 (UTC, seconds).
pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}
