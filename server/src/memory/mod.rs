//! A seat's memory in this node's own database: the diary and the episodes
//! its turns write, each stamped from the node's change sequence.
//!
//! An episode is keyed on the work, not fenced on the writer (seed § Keying
//! a write on the work): a unique index on (agent_handle, work_key) and one
//! `INSERT … ON CONFLICT DO NOTHING`, so a re-run of the same work collapses
//! into one row, while an unkeyed turn (SQL NULL) is never deduplicated. A
//! diary note collapses only when its content is byte-identical. Every
//! function here is one transaction; nothing is read-then-written.

use sha2::{Digest, Sha256};
use sqlx::SqlitePool;

/// One diary note.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DiaryNote {
    pub id: String,
    pub content: String,
    pub work_key: Option<String>,
    pub created_at: String,
    pub change_seq: i64,
}

/// One episode: what one unit of work was.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Episode {
    pub id: String,
    pub work_key: Option<String>,
    pub summary: String,
    pub turn_id: String,
    pub created_at: String,
    pub change_seq: i64,
}

/// The node's memory store.
#[derive(Clone)]
pub struct MemoryStore {
    pool: SqlitePool,
}

fn key_or_null(work_key: Option<&str>) -> Option<&str> {
    work_key.filter(|k| !k.is_empty())
}

impl MemoryStore {
    pub fn new(pool: SqlitePool) -> MemoryStore {
        MemoryStore { pool }
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
        let mut tx = self.pool.begin().await?;
        let seq: i64 =
            sqlx::query_scalar("UPDATE memory_change_seq SET value = value + 1 RETURNING value")
                .fetch_one(&mut *tx)
                .await?;
        let done = sqlx::query(
            "INSERT INTO agent_diary (id, agent_handle, content, content_hash, work_key, created_at, change_seq) \
             VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        )
        .bind(uuid::Uuid::new_v4().to_string())
        .bind(handle)
        .bind(content)
        .bind(hex::encode(Sha256::digest(content.as_bytes())))
        .bind(key_or_null(work_key))
        .bind(crate::audit::now_rfc3339())
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
        let seq: i64 =
            sqlx::query_scalar("UPDATE memory_change_seq SET value = value + 1 RETURNING value")
                .fetch_one(&mut *tx)
                .await?;
        let done = sqlx::query(
            "INSERT INTO episodes (id, agent_handle, work_key, summary, turn_id, created_at, change_seq) \
             VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        )
        .bind(uuid::Uuid::new_v4().to_string())
        .bind(handle)
        .bind(key_or_null(work_key))
        .bind(summary)
        .bind(turn_id)
        .bind(crate::audit::now_rfc3339())
        .bind(seq)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected() == 1)
    }

    /// The seat's newest diary notes, newest first.
    pub async fn diary(&self, handle: &str, limit: u32) -> Result<Vec<DiaryNote>, sqlx::Error> {
        let rows: Vec<(String, String, Option<String>, String, i64)> = sqlx::query_as(
            "SELECT id, content, work_key, created_at, change_seq FROM agent_diary \
             WHERE agent_handle = ? ORDER BY change_seq DESC LIMIT ?",
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
             WHERE agent_handle = ? ORDER BY change_seq DESC LIMIT ?",
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
}
