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
        let mut tx = self.pool.begin().await?;
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
        let mut tx = self.pool.begin().await?;
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
        let mut tx = self.pool.begin().await?;
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
        let mut tx = self.pool.begin().await?;
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
        let mut tx = self.pool.begin().await?;
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
        let mut tx = self.pool.begin().await?;
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
        let mut tx = self.pool.begin().await?;
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
        let mut tx = self.pool.begin().await?;
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

    /// The newest `limit` entries of one of the seat's conversation
    /// threads, oldest first: (author, text, at).
    pub async fn thread(
        &self,
        handle: &str,
        thread: &str,
        limit: u32,
    ) -> Result<Vec<(String, String, String)>, sqlx::Error> {
        let mut rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT author, text, at FROM conversations \
             WHERE agent_handle = ? AND thread = ? ORDER BY at DESC, rowid DESC LIMIT ?",
        )
        .bind(handle)
        .bind(thread)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.reverse();
        Ok(rows)
    }

    /// The seat's newest diary notes, newest first.
    pub async fn diary(&self, handle: &str, limit: u32) -> Result<Vec<DiaryNote>, sqlx::Error> {
        let rows: Vec<(String, String, Option<String>, String, i64)> = sqlx::query_as(
            "SELECT id, content, work_key, created_at, change_seq FROM agent_diary \
             WHERE agent_handle = ? ORDER BY created_at DESC, rowid DESC LIMIT ?",
        )
        .bind(handle)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, content, work_key, created_at, change_seq)| DiaryNote {
                    id,
                    content,
                    work_key,
                    created_at,
                    change_seq,
                },
            )
            .collect())
    }

    /// The seat's newest episodes, newest first.
    pub async fn episodes(&self, handle: &str, limit: u32) -> Result<Vec<Episode>, sqlx::Error> {
        let rows: Vec<(String, Option<String>, String, String, String, i64)> = sqlx::query_as(
            "SELECT id, work_key, summary, turn_id, created_at, change_seq FROM episodes \
             WHERE agent_handle = ? ORDER BY created_at DESC, rowid DESC LIMIT ?",
        )
        .bind(handle)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, work_key, summary, turn_id, created_at, change_seq)| Episode {
                    id,
                    work_key,
                    summary,
                    turn_id,
                    created_at,
                    change_seq,
                },
            )
            .collect())
    }

    async fn table_rows(
        &self,
        table: Table,
        handle: &str,
        limit: u32,
    ) -> Result<Vec<Map<String, Value>>, sqlx::Error> {
        let rows = sqlx::query(&format!(
            "SELECT * FROM {} WHERE agent_handle = ? ORDER BY rowid DESC LIMIT ?",
            table.name()
        ))
        .bind(handle)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| row_json(table, r, false)).collect()
    }

    /// Everything the seat remembers here (the newest `limit` rows of each
    /// table), for a screen.
    pub async fn seat_memory(&self, handle: &str, limit: u32) -> Result<SeatMemory, sqlx::Error> {
        Ok(SeatMemory {
            diary: self.table_rows(Table::AgentDiary, handle, limit).await?,
            episodes: self.table_rows(Table::Episodes, handle, limit).await?,
            counterparty_profiles: self
                .table_rows(Table::CounterpartyProfiles, handle, limit)
                .await?,
            skills: self.table_rows(Table::Skills, handle, limit).await?,
            skill_versions: self.table_rows(Table::SkillVersions, handle, limit).await?,
            onboarding_markers: self
                .table_rows(Table::AgentOnboardingMarkers, handle, limit)
                .await?,
            conversations: self.table_rows(Table::Conversations, handle, limit).await?,
        })
    }

    /// The seat's rows stamped past `after`, oldest first: what a
    /// changelog cycle publishes.
    pub async fn rows_since(
        &self,
        handle: &str,
        after: i64,
    ) -> Result<Vec<CarriedRow>, sqlx::Error> {
        let mut out = Vec::new();
        // Every table from one snapshot: read one by one, a turn's row
        // committed between two reads was missed while a later row of the
        // same turn was seen, and the flush marked past both (the chaos
        // soak handed a seat over without one of its episodes). Writes
        // commit in change-sequence order (one writer at a time), so one
        // snapshot holds every row up to its highest sequence.
        let mut snapshot = self.pool.begin().await?;
        for table in Table::ALL {
            let rows = sqlx::query(&format!(
                "SELECT * FROM {} WHERE agent_handle = ? AND change_seq > ? ORDER BY change_seq",
                table.name()
            ))
            .bind(handle)
            .bind(after)
            .fetch_all(&mut *snapshot)
            .await?;
            for r in &rows {
                let row = row_json(table, r, true)?;
                out.push(CarriedRow {
                    table,
                    id: r.try_get("id")?,
                    seq: r.try_get("change_seq")?,
                    row,
                });
            }
        }
        snapshot.commit().await?;
        out.sort_by_key(|r| r.seq);
        Ok(out)
    }

    /// The node's change sequence now (it moves on every memory write).
    pub async fn change_seq(&self) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT value FROM memory_change_seq WHERE id = 1")
            .fetch_one(&self.pool)
            .await
    }

    /// Every seat with a row stamped past what this node published of it,
    /// in one query (a changelog cycle flushes only these: a node that just
    /// took a thousand seats does not read each one's seven tables to find
    /// nothing). Hydrated rows are stamped 0 and never count.
    pub async fn seats_with_unpublished(
        &self,
    ) -> Result<std::collections::BTreeSet<String>, sqlx::Error> {
        let tops: Vec<String> = Table::ALL
            .iter()
            .map(|t| {
                format!(
                    "SELECT agent_handle AS h, MAX(change_seq) AS top FROM {} GROUP BY agent_handle",
                    t.name()
                )
            })
            .collect();
        let sql = format!(
            "SELECT x.h FROM ({}) AS x LEFT JOIN memory_published p ON p.agent_handle = x.h \
             GROUP BY x.h HAVING MAX(x.top) > COALESCE(MAX(p.last_seq), 0)",
            tops.join(" UNION ALL ")
        );
        Ok(sqlx::query_scalar(&sql)
            .fetch_all(&self.pool)
            .await?
            .into_iter()
            .collect())
    }

    /// The highest change sequence of the seat this node has published.
    pub async fn last_published(&self, handle: &str) -> Result<i64, sqlx::Error> {
        Ok(
            sqlx::query_scalar("SELECT last_seq FROM memory_published WHERE agent_handle = ?")
                .bind(handle)
                .fetch_optional(&self.pool)
                .await?
                .unwrap_or(0),
        )
    }

    /// Record that the seat's rows through `seq` are published.
    pub async fn mark_published(&self, handle: &str, seq: i64) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO memory_published (agent_handle, last_seq) VALUES (?, ?) \
             ON CONFLICT(agent_handle) DO UPDATE SET last_seq = MAX(last_seq, excluded.last_seq)",
        )
        .bind(handle)
        .bind(seq)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Apply one row carried by the changelog (hydration), by the spec's
    /// rules. A hydrated row is stamped 0: it is already on the changelog,
    /// so this node does not publish it again.
    pub async fn apply_carried(&self, handle: &str, c: &CarriedRow) -> Result<Applied, ApplyError> {
        let mut tx = self.begin_carried().await?;
        let applied = Self::apply_one(&mut tx, handle, c, self.current_vector.as_ref()).await?;
        tx.commit().await?;
        Ok(applied)
    }

    /// Apply a seat's carried rows (a hydration), [`CARRIED_PER_WRITE`] to
    /// a write transaction rather than one each: each row's answer, in
    /// order (a row that cannot be read is its own error; the others
    /// apply). A database failure ends it: what was committed stays (every
    /// row applies idempotently, so the next hydration finishes the rest).
    pub async fn apply_carried_all(
        &self,
        handle: &str,
        rows: &[CarriedRow],
    ) -> Result<Vec<Result<Applied, ApplyError>>, sqlx::Error> {
        let mut out = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(CARRIED_PER_WRITE) {
            let mut tx = self.begin_carried().await?;
            for c in chunk {
                match Self::apply_one(&mut tx, handle, c, self.current_vector.as_ref()).await {
                    Err(ApplyError::Db(e)) => return Err(e),
                    answer => out.push(answer),
                }
            }
            tx.commit().await?;
        }
        Ok(out)
    }

    /// A write transaction for carried rows, its write lock taken first: a
    /// transaction that reads and then writes cannot upgrade once another
    /// writer committed (WAL).
    async fn begin_carried(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("UPDATE memory_change_seq SET value = value WHERE id = 1")
            .execute(&mut *tx)
            .await?;
        Ok(tx)
    }

    /// One carried row, inside the caller's write transaction.
    async fn apply_one(
        conn: &mut sqlx::SqliteConnection,
        handle: &str,
        c: &CarriedRow,
        current_vector: Option<&VectorId>,
    ) -> Result<Applied, ApplyError> {
        let table = c.table;
        let seat = c
            .row
            .get("agent_handle")
            .and_then(Value::as_str)
            .unwrap_or("");
        if seat != handle {
            return Err(ApplyError::WrongSeat {
                expected: handle.to_string(),
                found: seat.to_string(),
            });
        }
        let existed: bool = sqlx::query_scalar::<_, i64>(&format!(
            "SELECT COUNT(*) FROM {} WHERE id = ?",
            table.name()
        ))
        .bind(&c.id)
        .fetch_one(&mut *conn)
        .await?
            > 0;
        let sql = carried_upsert_sql(table);
        let r = match bind_carried(sqlx::query(&sql), c)?
            .execute(&mut *conn)
            .await
        {
            Ok(r) => r,
            // A mutable row colliding on its natural key under another id.
            // The failed statement changed nothing, and the transaction
            // goes on (SQLite aborts the statement, not the transaction).
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                return Ok(Applied::Collided);
            }
            Err(e) => return Err(e.into()),
        };
        let applied = if table.is_mutable() {
            if existed {
                Applied::Replaced
            } else {
                Applied::Inserted
            }
        } else if r.rows_affected() == 1 {
            Applied::Inserted
        } else if !existed {
            Applied::Collided
        } else {
            Applied::KeptLocal
        };
        if applied == Applied::KeptLocal && table.has_vector() {
            return Self::take_carried_vector_row(conn, c, current_vector).await;
        }
        Ok(applied)
    }

    /// A kept-local row whose carried copy holds a vector: the carried
    /// vector replaces the local one when [`take_carried_vector`] says so
    /// (`VectorTaken`), else the local row stands whole (`KeptLocal`).
    async fn take_carried_vector_row(
        conn: &mut sqlx::SqliteConnection,
        c: &CarriedRow,
        current_vector: Option<&VectorId>,
    ) -> Result<Applied, ApplyError> {
        let table = c.table;
        let stored: StoredVector = sqlx::query_as(&format!(
            "SELECT vector_model, vector_dims, vector FROM {} WHERE id = ?",
            table.name()
        ))
        .bind(&c.id)
        .fetch_one(&mut *conn)
        .await?;
        let stored_id = match stored {
            (Some(m), Some(d), Some(_)) => Some((m, d as u32)),
            _ => None,
        };
        let carried_vec = c.row.get("vector").and_then(Value::as_str);
        let carried_id = match (
            c.row.get("vector_model").and_then(Value::as_str),
            c.row.get("vector_dims").and_then(Value::as_i64),
            carried_vec,
        ) {
            (Some(m), Some(d), Some(_)) => Some((m.to_string(), d as u32)),
            _ => None,
        };
        if !take_carried_vector(stored_id.as_ref(), carried_id.as_ref(), current_vector) {
            return Ok(Applied::KeptLocal);
        }
        let (model, dims) = carried_id.unwrap_or_default();
        let bytes =
            hex::decode(carried_vec.unwrap_or_default()).map_err(|_| ApplyError::Field {
                table: table.name(),
                column: "vector",
            })?;
        sqlx::query(&format!(
            "UPDATE {} SET vector = ?, vector_model = ?, vector_dims = ? WHERE id = ?",
            table.name()
        ))
        .bind(bytes)
        .bind(model)
        .bind(dims as i64)
        .bind(&c.id)
        .execute(&mut *conn)
        .await?;
        Ok(Applied::VectorTaken)
    }

    /// The vector a diary note or episode holds here: (model, dims, bytes).
    pub async fn vector_of(
        &self,
        table: Table,
        id: &str,
    ) -> Result<Option<(String, u32, Vec<u8>)>, sqlx::Error> {
        let row: Option<StoredVector> = sqlx::query_as(&format!(
            "SELECT vector_model, vector_dims, vector FROM {} WHERE id = ?",
            table.name()
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(match row {
            Some((Some(m), Some(d), Some(v))) => Some((m, d as u32, v)),
            _ => None,
        })
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
        let expired =
            sqlx::query("DELETE FROM agent_diary WHERE expires_at IS NOT NULL AND expires_at <= ?")
                .bind(now_rfc3339)
                .execute(&self.pool)
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
            .execute(&self.pool)
            .await?
            .rows_affected()
        };
        Ok((expired, over))
    }
}

/// A statement with its arguments, as sqlx builds it for SQLite.
type SqliteQuery<'q> = sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>;

/// The statement that writes one carried row of `table`: a mutable row
/// (profile, counter) replaces the local one by id, an append-only one
/// (diary note, episode) is inserted unless its id is already here.
fn carried_upsert_sql(table: Table) -> String {
    let names: Vec<&str> = table.columns().iter().map(|(n, _)| *n).collect();
    let placeholders = vec!["?"; names.len() + 1].join(", ");
    let conflict = if table.is_mutable() {
        let sets: Vec<String> = names
            .iter()
            .filter(|n| **n != "id")
            .map(|n| format!("{n} = excluded.{n}"))
            .collect();
        format!(
            "ON CONFLICT(id) DO UPDATE SET {}, change_seq = 0",
            sets.join(", ")
        )
    } else {
        "ON CONFLICT DO NOTHING".to_string()
    };
    format!(
        "INSERT INTO {} ({}, change_seq) VALUES ({}) {}",
        table.name(),
        names.join(", "),
        placeholders,
        conflict
    )
}

/// A carried row's values bound to [`carried_upsert_sql`]'s statement, in
/// its columns' order, then `change_seq` 0; a value of the wrong type is
/// refused naming its column.
fn bind_carried<'q>(mut q: SqliteQuery<'q>, c: &CarriedRow) -> Result<SqliteQuery<'q>, ApplyError> {
    let table = c.table;
    for (name, col) in table.columns() {
        let v = c.row.get(*name).unwrap_or(&Value::Null);
        let bad = || ApplyError::Field {
            table: table.name(),
            column: name,
        };
        q = match col {
            Col::Text => q.bind(v.as_str().ok_or_else(bad)?.to_string()),
            Col::OptText => q.bind(v.as_str().map(str::to_string)),
            Col::Int => q.bind(v.as_i64().ok_or_else(bad)?),
            Col::OptInt => q.bind(v.as_i64()),
            Col::OptBlob => q.bind(match v.as_str() {
                Some(h) => Some(hex::decode(h).map_err(|_| bad())?),
                None => None,
            }),
        };
    }
    Ok(q.bind(0i64))
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
