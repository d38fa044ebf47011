//! The audit log: every person's action, who, what, seat, when, reason and
//! result. Written to the node's own database; never carries a secret.
//!
//! Each node keeps the actions taken through it. [`FleetAudit`] gathers
//! the fleet's: every node answers audit reads on
//! `crewlet.auditread.{incarnation}` (the memory reads' request/reply
//! transport, [`Scatter`]), and a read asks every live peer named in the
//! presence roster within the scatter budget, naming those that did not
//! answer rather than leaving their actions silently out.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sqlx::SqlitePool;

use app::api::{AUDIT_PAGE, AuditEntry, AuditFilter, AuditView, SilentNode};

use crate::coord::Store;
use crate::scatter::{Scatter, ScatterError};
use crate::tasks::Tasks;

/// The most characters an audit field keeps; a longer value is cut and
/// says so.
pub const FIELD_CHARS: usize = 600;

/// Pure: `s` as an audit row keeps it: control characters shown as `?`,
/// at most [`FIELD_CHARS`] characters (a cut value ends in `…`).
pub fn bounded(s: &str) -> std::borrow::Cow<'_, str> {
    let clean = s.chars().all(|c| !c.is_control());
    if clean && s.len() <= FIELD_CHARS {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out: String = s
        .chars()
        .take(FIELD_CHARS)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if s.chars().count() > FIELD_CHARS {
        out.push('…');
    }
    std::borrow::Cow::Owned(out)
}

/// Record one action. A failure to write the audit row is returned: an
/// action that cannot be audited is reported, not silently done. Every
/// field is [`bounded`] first: what a caller typed never makes a row
/// larger than a few kilobytes.
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
    .bind(crate::clock::now_rfc3339())
    .bind(bounded(person).as_ref())
    .bind(bounded(action).as_ref())
    .bind(seat.map(bounded).as_deref())
    .bind(reason.map(bounded).as_deref())
    .bind(bounded(result).as_ref())
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
    newest_of(pool, limit, &AuditFilter::default()).await
}

/// The newest `limit` entries `filter` admits, newest first.
pub async fn newest_of(
    pool: &SqlitePool,
    limit: u32,
    filter: &AuditFilter,
) -> Result<Vec<AuditEntry>, sqlx::Error> {
    let rows: Vec<AuditRow> = sqlx::query_as(
        "SELECT at, person, action, seat, reason, result FROM audit \
         WHERE (?1 IS NULL OR seat = ?1) AND (?2 IS NULL OR person = ?2) \
         AND (?3 IS NULL OR action = ?3) AND (?4 = 0 OR result LIKE 'refused%') \
         ORDER BY id DESC LIMIT ?5",
    )
    .bind(filter.seat.as_deref())
    .bind(filter.person.as_deref())
    .bind(filter.action.as_deref())
    .bind(filter.refused)
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
            node: None,
        })
        .collect())
}

/// `crewlet.auditread`: the audit-read subjects' prefix.
pub const AUDIT_SUBJECT_PREFIX: &str = "crewlet.auditread";

/// `crewlet.auditread.{incarnation}`: where an incarnation answers audit
/// reads.
pub fn audit_subject(incarnation: &str) -> String {
    format!("{AUDIT_SUBJECT_PREFIX}.{incarnation}")
}

/// The most entries one audit read returns.
pub const MAX_AUDIT_READ: u32 = 1000;

/// An audit read (JSON): `{"limit": 200}`, or `{"limit": 50, "seat":
/// "alpha"}` for the actions about one seat (a node that predates `seat`
/// answers every action; the asker filters again).
#[derive(Debug, Serialize, Deserialize)]
struct AuditRequest {
    limit: u32,
    #[serde(flatten)]
    filter: AuditFilter,
}

/// Its answer (JSON): the node's newest entries, or why it cannot say.
#[derive(Debug, Serialize, Deserialize)]
struct AuditReply {
    node_id: String,
    #[serde(default)]
    entries: Vec<AuditEntry>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum FleetAuditError {
    #[error("cannot listen for audit reads on {subject}: {source}")]
    Listen {
        subject: String,
        source: ScatterError,
    },
    #[error("cannot read the audit log: {0}")]
    Db(#[from] sqlx::Error),
}

/// The fleet's audit log, as one node gathers it.
pub struct FleetAudit {
    pool: SqlitePool,
    store: Arc<dyn Store>,
    scatter: Arc<dyn Scatter>,
    node_id: String,
    incarnation: String,
    budget: Duration,
}

impl FleetAudit {
    pub fn new(
        pool: SqlitePool,
        store: Arc<dyn Store>,
        scatter: Arc<dyn Scatter>,
        node_id: String,
        incarnation: String,
        budget: Duration,
    ) -> FleetAudit {
        FleetAudit {
            pool,
            store,
            scatter,
            node_id,
            incarnation,
            budget,
        }
    }

    /// Answer audit reads on `crewlet.auditread.{incarnation}` until
    /// `tasks` stops. Returns once the node is listening.
    pub async fn serve(self: &Arc<Self>, tasks: &Tasks) -> Result<(), FleetAuditError> {
        let subject = audit_subject(&self.incarnation);
        let me = self.clone();
        crate::scatter::respond(
            &*self.scatter,
            &subject,
            tasks,
            "auditread-responder",
            4,
            move |payload| {
                let me = me.clone();
                async move { me.answer(&payload).await }
            },
        )
        .await
        .map_err(|source| FleetAuditError::Listen { subject, source })
    }

    async fn answer(&self, payload: &[u8]) -> AuditReply {
        let (entries, error) = match serde_json::from_slice::<AuditRequest>(payload) {
            Err(e) => (Vec::new(), Some(format!("not an audit read request: {e}"))),
            Ok(r) => match newest_of(&self.pool, r.limit.min(MAX_AUDIT_READ), &r.filter).await {
                Ok(v) => (v, None),
                Err(e) => (
                    Vec::new(),
                    Some(format!("its audit log cannot be read: {e}")),
                ),
            },
        };
        AuditReply {
            node_id: self.node_id.clone(),
            entries,
            error,
        }
    }

    /// The newest `limit` actions of the fleet: this node's, and those of
    /// every live peer that answers within the budget, newest first, each
    /// naming its node. A peer that does not answer is named in `silent`;
    /// a roster that cannot be read leaves this node's alone, said so.
    pub async fn read(&self, limit: u32) -> Result<AuditView, FleetAuditError> {
        self.read_matching(limit, &AuditFilter::default()).await
    }

    /// [`FleetAudit::read`], of the actions about `seat` only when given.
    pub async fn read_about(
        &self,
        limit: u32,
        seat: Option<&str>,
    ) -> Result<AuditView, FleetAuditError> {
        let filter = seat.map(AuditFilter::seat).unwrap_or_default();
        self.read_matching(limit, &filter).await
    }

    /// Page `page` (1: the newest, [`AUDIT_PAGE`] actions a page) of the
    /// fleet's actions `filter` admits, saying whether older ones are kept.
    /// The newest [`MAX_AUDIT_READ`] matching actions of each node are
    /// reachable.
    pub async fn read_page(
        &self,
        filter: &AuditFilter,
        page: u32,
    ) -> Result<AuditView, FleetAuditError> {
        let (skip, upto) = page_window(page);
        let mut log = self.read_matching(upto + 1, filter).await?;
        log.more = log.entries.len() > upto as usize;
        log.entries = log
            .entries
            .into_iter()
            .skip(skip as usize)
            .take(AUDIT_PAGE as usize)
            .collect();
        log.page = page.max(1);
        Ok(log)
    }

    /// The newest `limit` actions `filter` admits, gathered from the fleet.
    pub async fn read_matching(
        &self,
        limit: u32,
        filter: &AuditFilter,
    ) -> Result<AuditView, FleetAuditError> {
        let limit = limit.clamp(1, MAX_AUDIT_READ);
        let mine = newest_of(&self.pool, limit, filter).await?;
        let mut log = AuditView {
            answered: vec![self.node_id.clone()],
            ..AuditView::default()
        };
        let mut gathered = vec![(self.node_id.clone(), mine)];
        let peers = match crate::scatter::peers(&*self.store, &self.incarnation).await {
            Ok(p) => p,
            Err(e) => {
                log.roster_error = Some(format!(
                    "the fleet's roster cannot be read ({e}), so no other node was asked."
                ));
                Vec::new()
            }
        };
        let request = Bytes::from(
            serde_json::to_vec(&AuditRequest {
                limit,
                filter: filter.clone(),
            })
            .unwrap_or_default(),
        );
        let asked =
            crate::scatter::ask_each(&*self.scatter, peers, audit_subject, request, self.budget)
                .await;
        for (node_id, got) in asked {
            let why = match got {
                Err(e) => crate::scatter::silence(&e),
                Ok(body) => match serde_json::from_slice::<AuditReply>(&body) {
                    Ok(AuditReply { error: Some(e), .. }) => e,
                    Ok(r) => {
                        log.answered.push(node_id.clone());
                        let entries = r
                            .entries
                            .into_iter()
                            // A node that predates a filter answers every action.
                            .filter(|e| filter.admits(e))
                            .collect();
                        gathered.push((node_id, entries));
                        continue;
                    }
                    Err(e) => format!("its answer cannot be read: {e}"),
                },
            };
            log.silent.push(SilentNode { node_id, why });
        }
        log.entries = merge_newest(gathered, limit);
        Ok(log)
    }
}

/// Pure: page `page`'s window of the merged newest entries: how many to
/// skip, and how many to read (at most [`MAX_AUDIT_READ`]).
pub fn page_window(page: u32) -> (u32, u32) {
    let page = page.max(1);
    let upto = page.saturating_mul(AUDIT_PAGE).min(MAX_AUDIT_READ);
    ((page - 1).saturating_mul(AUDIT_PAGE).min(upto), upto)
}

/// Pure: the newest `limit` of several nodes' entries (each newest first),
/// newest first, each tagged with its node. Entries of one second keep
/// each node's own order.
pub fn merge_newest(gathered: Vec<(String, Vec<AuditEntry>)>, limit: u32) -> Vec<AuditEntry> {
    let mut all: Vec<(usize, AuditEntry)> = gathered
        .into_iter()
        .flat_map(|(node, entries)| {
            entries.into_iter().enumerate().map(move |(i, mut e)| {
                e.node = Some(node.clone());
                (i, e)
            })
        })
        .collect();
    all.sort_by(|(ia, a), (ib, b)| b.at.cmp(&a.at).then(ia.cmp(ib)));
    all.into_iter()
        .take(limit as usize)
        .map(|(_, e)| e)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_audit_page_is_a_window_of_the_merged_newest_bounded_by_the_read_limit() {
        assert_eq!(page_window(0), (0, 200));
        assert_eq!(page_window(1), (0, 200));
        assert_eq!(page_window(2), (200, 400));
        assert_eq!(page_window(5), (800, 1000));
        assert_eq!(page_window(6), (1000, 1000));
        assert_eq!(page_window(u32::MAX), (1000, 1000));
    }

    #[test]
    fn an_audit_filter_admits_only_what_matches_every_field_given() {
        let e = AuditEntry {
            at: "2026-12-01T10:00:00Z".into(),
            person: "olivia".into(),
            action: "seat.pause".into(),
            seat: Some("alpha".into()),
            reason: None,
            result: "refused: not an operator".into(),
            node: None,
        };
        assert!(AuditFilter::default().admits(&e));
        assert!(AuditFilter::seat("alpha").admits(&e));
        assert!(!AuditFilter::seat("beta").admits(&e));
        let f = AuditFilter {
            person: Some("olivia".into()),
            action: Some("seat.pause".into()),
            refused: true,
            ..AuditFilter::default()
        };
        assert!(f.admits(&e));
        let ok = AuditEntry {
            result: "ok".into(),
            ..e.clone()
        };
        assert!(!f.admits(&ok));
        assert!(
            !AuditFilter {
                person: Some("ada".into()),
                ..AuditFilter::default()
            }
            .admits(&e)
        );
    }

    fn entry(at: &str, action: &str) -> AuditEntry {
        AuditEntry {
            at: at.into(),
            person: "olivia".into(),
            action: action.into(),
            seat: None,
            reason: None,
            result: "ok".into(),
            node: None,
        }
    }

    #[test]
    fn merged_entries_are_newest_first_across_nodes_tagged_and_cut_at_the_limit() {
        let a = vec![
            entry("2026-11-30T10:00:05Z", "a3"),
            entry("2026-11-30T10:00:02Z", "a2"),
            entry("2026-11-30T10:00:01Z", "a1"),
        ];
        let b = vec![
            entry("2026-11-30T10:00:04Z", "b2"),
            entry("2026-11-30T10:00:02Z", "b1"),
        ];
        let merged = merge_newest(vec![("a".into(), a), ("b".into(), b)], 4);
        let got: Vec<_> = merged
            .iter()
            .map(|e| (e.action.as_str(), e.node.as_deref().unwrap()))
            .collect();
        assert_eq!(got, [("a3", "a"), ("b2", "b"), ("a2", "a"), ("b1", "b")]);
    }
}
