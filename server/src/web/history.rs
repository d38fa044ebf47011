//! The fleet's events as this node saw them, kept in its database
//! (`fleet_events`), so that a page opened later — the Events page after a
//! reload, a seat's timeline — shows what happened before it was opened.
//!
//! One task owned by the node's [`Tasks`] writes every numbered event of the
//! [`EventLog`] (its id is the event's number on `GET /api/events`, so a
//! page that read a page of history follows the live stream from its newest
//! id with nothing missed or shown twice), in batches of up to
//! [`BATCH`]; the newest [`EVENTS_KEPT`] are kept. Reads are pages, newest
//! first ([`EventHistory::page`]); the query's SQL is built by a pure
//! function ([`page_sql`]).

use std::sync::Arc;

use app::api::{EVENT_PAGE, EVENT_PAGE_MAX, EventPage, EventQuery, KeptEvent, NOISE};
use sqlx::SqlitePool;
use tokio::sync::broadcast;

use super::live::{EventLog, Numbered};
use crate::tasks::Tasks;

/// Events kept; older ones are deleted as new ones come.
pub const EVENTS_KEPT: i64 = 100_000;
/// The most events written in one transaction.
pub const BATCH: usize = 500;
/// Rows written between two prunes of what is past [`EVENTS_KEPT`].
const PRUNE_EVERY: usize = 2_000;

/// The kept events of this node's database.
#[derive(Clone)]
pub struct EventHistory {
    pool: SqlitePool,
    log: Arc<EventLog>,
}

/// One row as written: id, at, name, node, seat, turn id, data.
type Row = (
    i64,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    String,
);

/// Pure: the columns an event's JSON fills (its time, node, seat and turn).
fn row_of(n: &Numbered) -> Row {
    let v: serde_json::Value = serde_json::from_str(&n.data).unwrap_or_default();
    let text = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    (
        n.id as i64,
        text("at").unwrap_or_default(),
        n.name.clone(),
        text("node").unwrap_or_default(),
        text("seat"),
        text("turn_id"),
        n.data.to_string(),
    )
}

/// Pure: the `WHERE` clause and its bound values for `q`, and the limit
/// (one more than the page, to tell whether older ones are kept).
pub fn page_sql(q: &EventQuery) -> (String, Vec<String>, u32) {
    let mut clauses = Vec::new();
    let mut binds = Vec::new();
    if let Some(before) = q.before {
        clauses.push("id < CAST(? AS INTEGER)".to_string());
        binds.push(before.to_string());
    }
    for (column, value) in [
        ("seat", &q.seat),
        ("node", &q.node),
        ("turn_id", &q.turn),
        ("name", &q.kind),
    ] {
        let value = value.trim();
        if !value.is_empty() {
            clauses.push(format!("{column} = ?"));
            binds.push(value.to_string());
        }
    }
    if !q.noise && q.kind.trim().is_empty() {
        let marks = vec!["?"; NOISE.len()].join(", ");
        clauses.push(format!("name NOT IN ({marks})"));
        binds.extend(NOISE.iter().map(|n| n.to_string()));
    }
    let limit = match q.limit {
        0 => EVENT_PAGE,
        n => n.min(EVENT_PAGE_MAX),
    };
    let filter = if clauses.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", clauses.join(" AND "))
    };
    (filter, binds, limit)
}

impl EventHistory {
    pub fn new(pool: SqlitePool, log: Arc<EventLog>) -> EventHistory {
        EventHistory { pool, log }
    }

    /// Write every event the log numbers from now on, in a task owned by
    /// `tasks`.
    pub fn keep(&self, tasks: &Tasks) {
        let mut rx = self.log.listen();
        let pool = self.pool.clone();
        tasks.spawn("event-history", async move {
            let mut since_prune = 0usize;
            loop {
                let first = match rx.recv().await {
                    Ok(n) => n,
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(
                            missed,
                            "the event history fell behind the event log; those events are not kept"
                        );
                        continue;
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                };
                let mut batch = vec![row_of(&first)];
                while batch.len() < BATCH {
                    match rx.try_recv() {
                        Ok(n) => batch.push(row_of(&n)),
                        Err(_) => break,
                    }
                }
                since_prune += batch.len();
                if let Err(e) = write(&pool, &batch).await {
                    tracing::warn!(events = batch.len(), error = %e, "cannot keep events in the database; they stay visible live only");
                }
                if since_prune >= PRUNE_EVERY {
                    since_prune = 0;
                    if let Err(e) = prune(&pool).await {
                        tracing::warn!(error = %e, "cannot prune the kept events");
                    }
                }
            }
        });
    }

    /// One page of kept events matching `q`, newest first.
    pub async fn page(&self, q: &EventQuery) -> Result<EventPage, sqlx::Error> {
        let newest = self.log.last_id();
        let (filter, binds, limit) = page_sql(q);
        let sql =
            format!("SELECT id, name, data FROM fleet_events{filter} ORDER BY id DESC LIMIT ?");
        let mut query = sqlx::query_as::<_, (i64, String, String)>(&sql);
        for b in &binds {
            query = query.bind(b);
        }
        let mut rows = query.bind(limit + 1).fetch_all(&self.pool).await?;
        let more = rows.len() > limit as usize;
        rows.truncate(limit as usize);
        Ok(EventPage {
            events: rows
                .into_iter()
                .map(|(id, name, data)| KeptEvent {
                    id: id as u64,
                    name,
                    data,
                })
                .collect(),
            more,
            newest,
        })
    }
}

impl EventHistory {
    /// `seat`'s finished turns per minute since `since` (RFC 3339): each
    /// minute (`YYYY-MM-DDTHH:MM`) with turns, how many, and their mean
    /// duration in ms, oldest first.
    pub async fn activity(
        &self,
        seat: &str,
        since: &str,
    ) -> Result<Vec<app::api::ActivityMinute>, sqlx::Error> {
        let rows: Vec<(String, i64, f64)> = sqlx::query_as(
            "SELECT substr(at, 1, 16) AS minute, COUNT(*), \
             AVG(COALESCE(json_extract(data, '$.duration_ms'), 0)) \
             FROM fleet_events WHERE seat = ? AND name = 'turn_completed' AND at >= ? \
             GROUP BY minute ORDER BY minute",
        )
        .bind(seat)
        .bind(since)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(minute, turns, mean_ms)| app::api::ActivityMinute {
                minute,
                turns: turns.max(0) as u64,
                mean_ms: mean_ms.max(0.0).round() as u64,
            })
            .collect())
    }
}

/// Pure: one entry per minute of `minutes` (oldest first), the counted
/// minutes of `rows` in place and the others empty.
pub fn fill_minutes(
    minutes: &[String],
    rows: Vec<app::api::ActivityMinute>,
) -> Vec<app::api::ActivityMinute> {
    let mut counted: std::collections::HashMap<String, app::api::ActivityMinute> =
        rows.into_iter().map(|r| (r.minute.clone(), r)).collect();
    minutes
        .iter()
        .map(|m| {
            counted.remove(m).unwrap_or(app::api::ActivityMinute {
                minute: m.clone(),
                turns: 0,
                mean_ms: 0,
            })
        })
        .collect()
}

async fn write(pool: &SqlitePool, batch: &[Row]) -> Result<(), sqlx::Error> {
    // The write lock is taken at the start (`db::WriteLane`).
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    for (id, at, name, node, seat, turn, data) in batch {
        sqlx::query(
            "INSERT OR IGNORE INTO fleet_events (id, at, name, node, seat, turn_id, data) VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(id)
        .bind(at)
        .bind(name)
        .bind(node)
        .bind(seat)
        .bind(turn)
        .bind(data)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await
}

async fn prune(pool: &SqlitePool) -> Result<(), sqlx::Error> {
    sqlx::query(
        "DELETE FROM fleet_events WHERE id <= (SELECT id FROM fleet_events ORDER BY id DESC LIMIT 1 OFFSET ?)",
    )
    .bind(EVENTS_KEPT)
    .execute(pool)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_hour_has_every_minute_the_counted_ones_in_place_and_the_rest_empty() {
        let minutes: Vec<String> = ["10:00", "10:01", "10:02"]
            .iter()
            .map(|m| format!("2026-12-02T{m}"))
            .collect();
        let rows = vec![app::api::ActivityMinute {
            minute: "2026-12-02T10:01".into(),
            turns: 3,
            mean_ms: 40,
        }];
        let filled = fill_minutes(&minutes, rows);
        assert_eq!(
            filled
                .iter()
                .map(|m| (m.minute.as_str(), m.turns, m.mean_ms))
                .collect::<Vec<_>>(),
            vec![
                ("2026-12-02T10:00", 0, 0),
                ("2026-12-02T10:01", 3, 40),
                ("2026-12-02T10:02", 0, 0),
            ]
        );
    }

    use super::*;

    #[test]
    fn a_page_query_filters_by_what_is_given_and_leaves_the_per_pass_noise_out() {
        let (w, b, limit) = page_sql(&EventQuery::default());
        assert_eq!(w, " WHERE name NOT IN (?, ?)");
        assert_eq!(b, ["seat_sweep", "seat_claims_withheld"]);
        assert_eq!(limit, EVENT_PAGE);
        let q = EventQuery {
            before: Some(42),
            seat: " alpha ".into(),
            kind: "seat_sweep".into(),
            limit: 10_000,
            ..Default::default()
        };
        let (w, b, limit) = page_sql(&q);
        assert_eq!(
            w,
            " WHERE id < CAST(? AS INTEGER) AND seat = ? AND name = ?"
        );
        assert_eq!(
            b,
            ["42", "alpha", "seat_sweep"],
            "a type asked for is shown"
        );
        assert_eq!(limit, EVENT_PAGE_MAX);
        let noisy = EventQuery {
            noise: true,
            ..Default::default()
        };
        assert_eq!(page_sql(&noisy).0, "");
    }

    #[test]
    fn a_kept_row_takes_its_time_node_seat_and_turn_from_the_event() {
        let n = Numbered {
            id: 7,
            name: "turn_started".into(),
            data: Arc::from(
                r#"{"node":"n1","incarnation":"n1:1","at":"2026-12-01T10:00:00Z","event":"turn_started","seat":"alpha","turn_id":"t9"}"#,
            ),
        };
        let (id, at, name, node, seat, turn, _) = row_of(&n);
        assert_eq!(
            (id, at.as_str(), name.as_str(), node.as_str()),
            (7, "2026-12-01T10:00:00Z", "turn_started", "n1")
        );
        assert_eq!(
            (seat.as_deref(), turn.as_deref()),
            (Some("alpha"), Some("t9"))
        );
    }
}
