//! A seat's memory in this node's own database: what the engine and agents
//! write through, what the dashboard reads, and the row-level edges the
//! changelog needs (rows past a change sequence; a carried row applied by
//! the spec's rules).
//!
//! Every write that the changelog must carry — an inserted diary note,
//! episode, skill version or conversation entry, an update of a small
//! mutable row, a vector set on a note or an episode — is stamped from the
//! node's one change-sequence counter, in the same transaction. Never the
//! rowid: SQLite hands a rowid out again once the newest row is deleted.
//!
//! An episode is keyed on the work, not fenced on the writer (spec § Keying
//! a write on the work): a unique index on (agent_handle, work_key) and one
//! `INSERT … ON CONFLICT DO NOTHING`, so a re-run of the same work collapses
//! into one row, while an unkeyed turn (SQL NULL) is never deduplicated. A
//! diary note collapses only when its content is byte-identical.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use sqlx::{Row, SqlitePool, sqlite::SqliteRow};

mod carried;
mod read;

/// The tables a seat's memory lives in, as the changelog names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Table {
    AgentDiary,
    Episodes,
    CounterpartyProfiles,
    Skills,
    SkillVersions,
    AgentOnboardingMarkers,
    Conversations,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Col {
    Text,
    OptText,
    Int,
    OptInt,
    OptBlob,
}

impl Table {
    pub const ALL: [Table; 7] = [
        Table::AgentDiary,
        Table::Episodes,
        Table::CounterpartyProfiles,
        Table::Skills,
        Table::SkillVersions,
        Table::AgentOnboardingMarkers,
        Table::Conversations,
    ];

    /// The SQL table, which is also its subject token in the changelog.
    pub fn name(self) -> &'static str {
        match self {
            Table::AgentDiary => "agent_diary",
            Table::Episodes => "episodes",
            Table::CounterpartyProfiles => "counterparty_profiles",
            Table::Skills => "skills",
            Table::SkillVersions => "skill_versions",
            Table::AgentOnboardingMarkers => "agent_onboarding_markers",
            Table::Conversations => "conversations",
        }
    }

    pub fn from_name(s: &str) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.name() == s)
    }

    /// A small mutable row (its update is the content: the carried copy
    /// wins) rather than an append-only one (the local row stands).
    pub fn is_mutable(self) -> bool {
        matches!(
            self,
            Table::CounterpartyProfiles | Table::Skills | Table::AgentOnboardingMarkers
        )
    }

    /// Rows that carry a vector.
    pub fn has_vector(self) -> bool {
        matches!(self, Table::AgentDiary | Table::Episodes)
    }

    /// Every column but `change_seq`, `id` and `agent_handle` first.
    fn columns(self) -> &'static [(&'static str, Col)] {
        use Col::*;
        match self {
            Table::AgentDiary => &[
                ("id", Text),
                ("agent_handle", Text),
                ("content", Text),
                ("content_hash", Text),
                ("work_key", OptText),
                ("created_at", Text),
                ("expires_at", OptText),
                ("vector", OptBlob),
                ("vector_model", OptText),
                ("vector_dims", OptInt),
            ],
            Table::Episodes => &[
                ("id", Text),
                ("agent_handle", Text),
                ("work_key", OptText),
                ("summary", Text),
                ("turn_id", Text),
                ("created_at", Text),
                ("vector", OptBlob),
                ("vector_model", OptText),
                ("vector_dims", OptInt),
            ],
            Table::CounterpartyProfiles => &[
                ("id", Text),
                ("agent_handle", Text),
                ("counterparty", Text),
                ("interaction_count", Int),
                ("last_work_key", OptText),
                ("updated_at", Text),
            ],
            Table::Skills => &[
                ("id", Text),
                ("agent_handle", Text),
                ("name", Text),
                ("state", Text),
                ("use_count", Int),
                ("updated_at", Text),
            ],
            Table::SkillVersions => &[
                ("id", Text),
                ("agent_handle", Text),
                ("skill_name", Text),
                ("version", Int),
                ("body", Text),
                ("created_at", Text),
            ],
            Table::AgentOnboardingMarkers => &[
                ("id", Text),
                ("agent_handle", Text),
                ("marker", Text),
                ("value", Text),
                ("updated_at", Text),
            ],
            Table::Conversations => &[
                ("id", Text),
                ("agent_handle", Text),
                ("thread", Text),
                ("message_id", OptText),
                ("author", Text),
                ("text", Text),
                ("at", Text),
            ],
        }
    }
}

/// How many carried rows one hydration write transaction applies.
pub const CARRIED_PER_WRITE: usize = 256;

/// One row as the changelog carries it: its table, its id, the change
/// sequence it was published under, and its columns as JSON (a vector as
/// hex).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CarriedRow {
    pub table: Table,
    pub id: String,
    pub seq: i64,
    pub row: Map<String, Value>,
}

/// What applying a carried row did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// New here: inserted.
    Inserted,
    /// An append-only row this node already has: the local row stands.
    KeptLocal,
    /// The local row stands, but the carried vector replaced its vector.
    VectorTaken,
    /// A small mutable row: the carried copy won.
    Replaced,
    /// It collides with a row this node has under another id (two
    /// episodes for one work key): skipped, not an error.
    Collided,
}

/// A vector's identity: the model that made it and its width.
pub type VectorId = (String, u32);

/// A row's vector columns as stored: model, width, bytes.
type StoredVector = (Option<String>, Option<i64>, Option<Vec<u8>>);

/// Pure (spec § A seat's memory follows it): does a carried vector replace
/// the stored one? Only a carried vector of the company's current model
/// and width, and only over a stored one of no model, another model or
/// another width. Never the reverse: a carried row with no vector, or with
/// a stale one, never erases or replaces a filled vector. With no current
/// model configured, a carried vector fills only an empty one.
pub fn take_carried_vector(
    stored: Option<&VectorId>,
    carried: Option<&VectorId>,
    current: Option<&VectorId>,
) -> bool {
    let Some(carried) = carried else {
        return false;
    };
    match (stored, current) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(s), Some(cur)) => carried == cur && s != cur,
    }
}

/// One diary note.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiaryNote {
    pub id: String,
    pub content: String,
    pub work_key: Option<String>,
    pub created_at: String,
    pub change_seq: i64,
}

/// One episode: what one unit of work was.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Episode {
    pub id: String,
    pub work_key: Option<String>,
    pub summary: String,
    pub turn_id: String,
    pub created_at: String,
    pub change_seq: i64,
}

/// Everything a seat remembers, as a screen shows it: each table's rows
/// as JSON objects (vectors left out), newest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SeatMemory {
    pub diary: Vec<Map<String, Value>>,
    pub episodes: Vec<Map<String, Value>>,
    pub counterparty_profiles: Vec<Map<String, Value>>,
    pub skills: Vec<Map<String, Value>>,
    pub skill_versions: Vec<Map<String, Value>>,
    pub onboarding_markers: Vec<Map<String, Value>>,
    pub conversations: Vec<Map<String, Value>>,
}

impl SeatMemory {
    /// Rows per table, in the order the tables are listed.
    pub fn counts(&self) -> [usize; 7] {
        [
            self.diary.len(),
            self.episodes.len(),
            self.counterparty_profiles.len(),
            self.skills.len(),
            self.skill_versions.len(),
            self.onboarding_markers.len(),
            self.conversations.len(),
        ]
    }
}

/// The node's memory store.
#[derive(Clone)]
pub struct MemoryStore {
    pool: SqlitePool,
    /// Every memory write, one at a time (`db::WriteLane`).
    lane: crate::db::WriteLane,
    diary_days: u64,
    current_vector: Option<VectorId>,
}

fn key_or_null(work_key: Option<&str>) -> Option<&str> {
    work_key.filter(|k| !k.is_empty())
}

/// The id of a small mutable row: fixed by its natural key, so the same
/// row written on two nodes is one row.
fn natural_id(handle: &str, key: &str) -> String {
    let mut h = Sha256::new();
    h.update(handle.as_bytes());
    h.update([0u8]);
    h.update(key.as_bytes());
    hex::encode(&h.finalize()[..16])
}

fn now() -> String {
    crate::clock::now_rfc3339()
}

async fn next_seq(tx: &mut sqlx::SqliteConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("UPDATE memory_change_seq SET value = value + 1 RETURNING value")
        .fetch_one(tx)
        .await
}

fn row_json(
    table: Table,
    r: &SqliteRow,
    with_vector: bool,
) -> Result<Map<String, Value>, sqlx::Error> {
    let mut m = Map::new();
    for (name, col) in table.columns() {
        let v = match col {
            Col::Text => Value::String(r.try_get::<String, _>(*name)?),
            Col::OptText => r
                .try_get::<Option<String>, _>(*name)?
                .map_or(Value::Null, Value::String),
            Col::Int => Value::from(r.try_get::<i64, _>(*name)?),
            Col::OptInt => r
                .try_get::<Option<i64>, _>(*name)?
                .map_or(Value::Null, Value::from),
            Col::OptBlob => {
                if !with_vector {
                    continue;
                }
                r.try_get::<Option<Vec<u8>>, _>(*name)?
                    .map_or(Value::Null, |b| Value::String(hex::encode(b)))
            }
        };
        m.insert(name.to_string(), v);
    }
    Ok(m)
}

/// Why a carried row cannot be applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("a carried {table} row is missing `{column}` or has the wrong type")]
    Field {
        table: &'static str,
        column: &'static str,
    },
    #[error("a carried row names seat {found:?}, not {expected:?}")]
    WrongSeat { expected: String, found: String },
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

impl MemoryStore {
    pub fn new(pool: SqlitePool) -> MemoryStore {
        MemoryStore {
            pool,
            lane: crate::db::WriteLane::default(),
            diary_days: 0,
            current_vector: None,
        }
    }

    /// Diary notes expire this many days after they are written (0: never).
    pub fn with_diary_days(mut self, days: u64) -> MemoryStore {
        self.diary_days = days;
        self
    }

    /// The company's embedding model and width (the vector rule's
    /// "current").
    pub fn with_current_vector(mut self, v: Option<VectorId>) -> MemoryStore {
        self.current_vector = v;
        self
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The lane every memory write waits in; other writers to the node's
    /// database (the event history, retention) share it.
    pub fn lane(&self) -> &crate::db::WriteLane {
        &self.lane
    }

    /// A memory write transaction, begun in its turn with its write lock
    /// taken first (a transaction that reads and then writes cannot upgrade
    /// once another writer committed, WAL).
    pub(super) async fn write(&self) -> Result<crate::db::Write, sqlx::Error> {
        self.lane.begin(&self.pool).await
    }

    /// Write a diary note. `false` when a byte-identical note was there.
    pub async fn diary_write(
        &self,
        handle: &str,
        content: &str,
        work_key: Option<&str>,
    ) -> Result<bool, sqlx::Error> {
        let expires = (self.diary_days > 0).then(|| {
            let t = time::OffsetDateTime::now_utc()
                + time::Duration::days(self.diary_days.min(36_500) as i64);
            t.replace_nanosecond(0)
                .ok()
                .and_then(|t| {
                    t.format(&time::format_description::well_known::Rfc3339)
                        .ok()
                })
                .unwrap_or_default()
        });
        let mut tx = self.write().await?;
        let seq = next_seq(&mut tx).await?;
        let done = sqlx::query(
            "INSERT INTO agent_diary (id, agent_handle, content, content_hash, work_key, created_at, expires_at, change_seq) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        )
        .bind(uuid::Uuid::new_v4().to_string())
        .bind(handle)
        .bind(content)
        .bind(hex::encode(Sha256::digest(content.as_bytes())))
        .bind(key_or_null(work_key))
        .bind(now())
        .bind(expires)
        .bind(seq)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    /// Write the episode of one unit of work. `false` when this seat
    /// already has the episode of `work_key` (a re-run of the same work).
    pub async fn episode_write(
        &self,
        handle: &str,
        work_key: Option<&str>,
        summary: &str,
        turn_id: &str,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.write().await?;
        let seq = next_seq(&mut tx).await?;
        let done = sqlx::query(
            "INSERT INTO episodes (id, agent_handle, work_key, summary, turn_id, created_at, change_seq) \
             VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        )
        .bind(uuid::Uuid::new_v4().to_string())
        .bind(handle)
        .bind(key_or_null(work_key))
        .bind(summary)
        .bind(turn_id)
        .bind(now())
        .bind(seq)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    /// Set the vector of a diary note or an episode; stamps the row with a
    /// fresh change sequence so the changelog carries it again. `false`
    /// when there is no such row.
    pub async fn set_vector(
        &self,
        table: Table,
        id: &str,
        model: &str,
        vector: &[u8],
        dims: u32,
    ) -> Result<bool, sqlx::Error> {
        if !table.has_vector() {
            return Ok(false);
        }
        let mut tx = self.write().await?;
        let seq = next_seq(&mut tx).await?;
        let done = sqlx::query(&format!(
            "UPDATE {} SET vector = ?, vector_model = ?, vector_dims = ?, change_seq = ? WHERE id = ?",
            table.name()
        ))
        .bind(vector)
        .bind(model)
        .bind(dims as i64)
        .bind(seq)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    /// Count an interaction with `counterparty`, unless the last counted
    /// one was the same unit of work (a re-run). Returns the count.
    pub async fn counterparty_seen(
        &self,
        handle: &str,
        counterparty: &str,
        work_key: Option<&str>,
    ) -> Result<i64, sqlx::Error> {
        let mut tx = self.write().await?;
        let seq = next_seq(&mut tx).await?;
        sqlx::query(
            "INSERT INTO counterparty_profiles (id, agent_handle, counterparty, interaction_count, last_work_key, updated_at, change_seq) \
             VALUES (?, ?, ?, 1, ?, ?, ?) \
             ON CONFLICT(id) DO UPDATE SET interaction_count = interaction_count + 1, \
               last_work_key = excluded.last_work_key, updated_at = excluded.updated_at, change_seq = excluded.change_seq \
             WHERE excluded.last_work_key IS NULL OR counterparty_profiles.last_work_key IS NOT excluded.last_work_key",
        )
        .bind(natural_id(handle, counterparty))
        .bind(handle)
        .bind(counterparty)
        .bind(key_or_null(work_key))
        .bind(now())
        .bind(seq)
        .execute(&mut *tx)
        .await?;
        let n: i64 =
            sqlx::query_scalar("SELECT interaction_count FROM counterparty_profiles WHERE id = ?")
                .bind(natural_id(handle, counterparty))
                .fetch_one(&mut *tx)
                .await?;
        tx.commit().await?;
        Ok(n)
    }

    /// Create or update a skill's state.
    pub async fn skill_set(
        &self,
        handle: &str,
        name: &str,
        state: &str,
    ) -> Result<(), sqlx::Error> {
        let mut tx = self.write().await?;
        let seq = next_seq(&mut tx).await?;
        sqlx::query(
            "INSERT INTO skills (id, agent_handle, name, state, use_count, updated_at, change_seq) VALUES (?, ?, ?, ?, 0, ?, ?) \
             ON CONFLICT(id) DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at, change_seq = excluded.change_seq",
        )
        .bind(natural_id(handle, name))
        .bind(handle)
        .bind(name)
        .bind(state)
        .bind(now())
        .bind(seq)
        .execute(&mut *tx)
        .await?;
        tx.commit().await
    }

    /// Add a version of a skill (append-only). `false` when that version
    /// exists.
    pub async fn skill_version_add(
        &self,
        handle: &str,
        name: &str,
        version: i64,
        body: &str,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.write().await?;
        let seq = next_seq(&mut tx).await?;
        let done = sqlx::query(
            "INSERT INTO skill_versions (id, agent_handle, skill_name, version, body, created_at, change_seq) \
             VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        )
        .bind(uuid::Uuid::new_v4().to_string())
        .bind(handle)
        .bind(name)
        .bind(version)
        .bind(body)
        .bind(now())
        .bind(seq)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    /// Set an onboarding marker.
    pub async fn marker_set(
        &self,
        handle: &str,
        marker: &str,
        value: &str,
    ) -> Result<(), sqlx::Error> {
        let mut tx = self.write().await?;
        let seq = next_seq(&mut tx).await?;
        sqlx::query(
            "INSERT INTO agent_onboarding_markers (id, agent_handle, marker, value, updated_at, change_seq) VALUES (?, ?, ?, ?, ?, ?) \
             ON CONFLICT(id) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at, change_seq = excluded.change_seq",
        )
        .bind(natural_id(handle, marker))
        .bind(handle)
        .bind(marker)
        .bind(value)
        .bind(now())
        .bind(seq)
        .execute(&mut *tx)
        .await?;
        tx.commit().await
    }

    /// Add an entry to the seat's conversation ledger. `false` when the
    /// message id is there already (an entry with no message id is never
    /// deduplicated).
    pub async fn conversation_add(
        &self,
        handle: &str,
        thread: &str,
        message_id: Option<&str>,
        author: &str,
        text: &str,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.write().await?;
        let seq = next_seq(&mut tx).await?;
        let done = sqlx::query(
            "INSERT INTO conversations (id, agent_handle, thread, message_id, author, text, at, change_seq) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        )
        .bind(uuid::Uuid::new_v4().to_string())
        .bind(handle)
        .bind(thread)
        .bind(key_or_null(message_id))
        .bind(author)
        .bind(text)
        .bind(now())
        .bind(seq)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    /// Retention (the maintenance duty): delete diary notes past their
    /// expiry, then every seat's notes beyond the newest `cap` (0: no cap).
    /// Returns (expired, over the cap). Deletes are not replicated: a
    /// hydrated node may bring a swept note back, and the next pass drops
    /// it again by the same rules.
    pub async fn sweep_diary(
        &self,
        now_rfc3339: &str,
        cap: u64,
    ) -> Result<(u64, u64), sqlx::Error> {
        let mut tx = self.write().await?;
        let expired =
            sqlx::query("DELETE FROM agent_diary WHERE expires_at IS NOT NULL AND expires_at <= ?")
                .bind(now_rfc3339)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        let over = if cap == 0 {
            0
        } else {
            sqlx::query(
                "DELETE FROM agent_diary WHERE id IN (SELECT id FROM (SELECT id, ROW_NUMBER() OVER \
                 (PARTITION BY agent_handle ORDER BY created_at DESC, rowid DESC) AS n FROM agent_diary) WHERE n > ?)",
            )
            .bind(cap as i64)
            .execute(&mut *tx)
            .await?
            .rows_affected()
        };
        tx.commit().await?;
        Ok((expired, over))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(m: &str, d: u32) -> VectorId {
        (m.to_string(), d)
    }

    #[test]
    fn a_carried_vector_fills_an_empty_one_and_never_erases_a_filled_one() {
        let cur = v("m2", 768);
        assert!(take_carried_vector(None, Some(&cur), Some(&cur)));
        assert!(take_carried_vector(None, Some(&v("m1", 512)), None));
        assert!(!take_carried_vector(Some(&cur), None, Some(&cur)));
        assert!(!take_carried_vector(Some(&v("m1", 512)), None, None));
    }

    #[test]
    fn a_carried_vector_of_the_current_model_replaces_another_model_or_width_never_the_reverse() {
        let cur = v("m2", 768);
        assert!(take_carried_vector(
            Some(&v("m1", 768)),
            Some(&cur),
            Some(&cur)
        ));
        assert!(take_carried_vector(
            Some(&v("m2", 512)),
            Some(&cur),
            Some(&cur)
        ));
        // The reverse: a stale copy replayed later.
        assert!(!take_carried_vector(
            Some(&cur),
            Some(&v("m1", 768)),
            Some(&cur)
        ));
        assert!(!take_carried_vector(Some(&cur), Some(&cur), Some(&cur)));
        // No current model: a filled vector is kept.
        assert!(!take_carried_vector(Some(&v("m1", 768)), Some(&cur), None));
    }

    #[test]
    fn tables_name_their_subjects_and_kinds() {
        for t in Table::ALL {
            assert_eq!(Table::from_name(t.name()), Some(t));
            assert_eq!(t.columns()[0].0, "id");
            assert_eq!(t.columns()[1].0, "agent_handle");
        }
        assert!(Table::Skills.is_mutable() && !Table::SkillVersions.is_mutable());
        assert!(Table::Episodes.has_vector() && !Table::Conversations.has_vector());
    }
}
